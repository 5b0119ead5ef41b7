"""bench/simulate.py and bench/simkit.py (issue 28, item 1): the simulated machine's record mix,
its rates and determinism, the Darshan shapes against the real logs, and one bounded run on the
real Kafka broker and pipeline into chDB where every produced record is stored exactly once."""

from __future__ import annotations

import itertools
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import simkit  # noqa: E402
import simulate  # noqa: E402
from pharos_testkit import DARSHAN_LOGS, kafka_jars, need_darshan  # noqa: E402

from pharos_pipeline.wire import IoBatch  # noqa: E402
from pharos_pipeline.wire.pharos.v1 import io_pb2  # noqa: E402


def _machine(nodes=256, forwarders=4, targets=16, jobs=12, seed=3, variants=2):
    placed = simkit.place_jobs(nodes, jobs, 4, random.Random(seed))
    return simkit.Machine(nodes, forwarders, targets, placed, seed, variants)


def _decode(msgs):
    out = []
    for key, value in msgs:
        b = IoBatch()
        b.ParseFromString(value)
        assert key.decode() == b.producer_id
        out.append(b)
    return out


def test_jobs_fill_the_machine_without_overlap():
    jobs = simkit.place_jobs(1024, 50, 4, random.Random(1))
    assert len(jobs) == 50
    spans = sorted((j.first, j.first + j.nodes) for j in jobs)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    used = sum(j.nodes for j in jobs)
    assert 0.8 * 1024 <= used <= 1024
    assert len({j.nodes for j in jobs}) > 5  # varied sizes
    assert len({j.shape.name for j in jobs}) >= 5  # varied kinds


def test_a_tick_is_the_real_mix_on_both_layers():
    m = _machine()
    now = time.time_ns()
    batches = _decode(m.tick(now)[0])
    recs = [r for b in batches for r in b.records]
    layers = Counter(r.layer for r in recs)
    assert layers[io_pb2.LAYER_CLIENT] and layers[io_pb2.LAYER_FORWARDER]
    ops = Counter(io_pb2.Op.Name(r.op) for r in recs)
    assert {"OP_OPEN", "OP_CLOSE"} <= set(ops) and ({"OP_READ", "OP_WRITE"} & set(ops))
    sizes = {r.size for r in recs if r.op in (io_pb2.OP_READ, io_pb2.OP_WRITE)}
    assert len(sizes) >= 3  # not one uniform record
    for r in recs:  # re-stamped into this tick, end after start
        assert now <= r.start_ns < now + simkit.TICK_NS
        assert r.end_ns >= r.start_ns
    for r in recs:
        if r.layer == io_pb2.LAYER_FORWARDER:
            assert r.forwarding_node.startswith("fwd") and r.target.startswith("ost") and r.compute_node
            assert 0 < r.size <= simkit.FUSE_MAX or r.op not in (io_pb2.OP_PREAD, io_pb2.OP_PWRITE)
        else:
            assert r.job_id.startswith("sim") and r.rank >= 0 and r.host.startswith("cn")
    # one batch per producer per tick within the sink's limits, seq from 0
    assert all(len(b.records) <= simkit.BATCH_MAX_RECORDS for b in batches)
    assert {b.seq for b in batches} == {0}


def test_the_records_counted_are_the_records_sent():
    # One forwarding node for 1,024 compute nodes: its batches overflow the sink's limits and split;
    # every split batch's records are counted (the bench's produced/s and real-time rate).
    m = _machine(nodes=1024, forwarders=1, jobs=50)
    msgs, n = m.tick(time.time_ns())
    batches = _decode(msgs)
    assert len(batches) > len({b.producer_id for b in batches})  # some producer sent several
    assert n == sum(len(b.records) for b in batches)
    assert m.records_per_tick() * len(m.plans) == sum(p.records for p in m.plans)


def test_seq_rises_and_idle_producers_send_heartbeats():
    m = _machine(nodes=64, jobs=2)
    seen: dict[str, list[int]] = {}
    hb = 0
    for _ in range(simkit.HEARTBEAT_TICKS + 1):
        for b in _decode(m.tick(time.time_ns())[0]):
            seen.setdefault(b.producer_id, []).append(b.seq)
            hb += not b.records
    assert hb > 0
    for seqs in seen.values():
        assert seqs == list(range(len(seqs)))
    # every agent and daemon was heard within the heartbeat interval
    assert len(seen) == len(m.producer_ids)


def test_rates_follow_the_shapes():
    m = _machine(nodes=512, jobs=20, variants=4)
    expected = 0.0
    for j in m.jobs:
        client = j.shape.per_rank_rate() * j.ranks * simkit.TICK_NS / 1e9
        expected += client
    client_per_tick = 0
    for _ in range(4):
        msgs, _n = m.tick(time.time_ns())
        client_per_tick += sum(1 for b in _decode(msgs) for r in b.records if r.layer == io_pb2.LAYER_CLIENT)
    assert client_per_tick / 4 == pytest.approx(expected, rel=0.15)


def test_deterministic_with_a_seed():
    def recs(seed):
        m = _machine(seed=seed)
        return [(r.job_id, r.rank, r.op, r.size, r.path) for b in _decode(m.tick(1 << 61)[0]) for r in b.records]

    assert recs(5) == recs(5)
    assert recs(5) != recs(6)


def test_darshan_shapes_come_from_the_real_logs():
    logs = need_darshan(DARSHAN_LOGS)
    for name, rel in simkit.DARSHAN_SOURCES.items():
        assert simkit.shape_from_darshan(logs / rel, name) == simkit.SHAPES[name], name


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        simulate.parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--nodes", "--forwarders", "--targets", "--jobs", "--minutes", "--rate-fraction", "--brokers",
                 "--pipelines", "--seed", "--keep"):  # fmt: skip
        assert flag in out


@pytest.mark.e2e
@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_simulated_machine_on_the_real_broker_and_pipeline(capsys):
    """64 nodes for 20 s at real time: every record produced is stored exactly once."""
    kafka_jars()
    t = time.monotonic()
    rc = simulate.main(
        [
            "--nodes",
            "64",
            "--forwarders",
            "2",
            "--targets",
            "8",
            "--jobs",
            "4",
            "--minutes",
            "0.34",
            "--rate-fraction",
            "1",
            "--drain-s",
            "20",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    produced = int(re.search(r"produced in all: ([\d,]+) records", out).group(1).replace(",", ""))
    store = re.search(
        r"store 0: ([\d,]+) records \(([\d,]+) distinct, ([\d,]+) forwarder\).*?(\d+) job events, (\d+) gaps", out
    )
    assert store, out
    n, distinct, fwd, events, gaps = (int(x.replace(",", "")) for x in store.groups())
    assert produced > 1000
    assert n == distinct == produced, out
    assert 0 < fwd < n and gaps == 0
    assert events == 8  # 4 jobs, start and end
    assert "delivery failures 0" in out
    line = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"simulate: nodes 64, records/s \d+, lag start/end \d+/\d+, detection cycle (\d+\.\d\d|n/a) s "
        r"\(period [\d.]+ s\), control cycle (\d+\.\d\d|n/a) s",
        line,
    ), line
    assert time.monotonic() - t < 60
