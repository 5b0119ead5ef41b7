"""DFRA at job start (Ji et al. FAST'19; Beacon NSDI'19 classifier): pure decisions, then the
history lookup and reserved-node hand-out / return on a real chDB store."""

from __future__ import annotations

import math

import control_rows as cr
import pytest

from pharos_analytics.control.config import GB, ControlConfig
from pharos_analytics.control.dfra import (
    JobHistory,
    LearnedClass,
    NodeState,
    classify,
    decide,
    job_history,
    node_local_suggestion,
)

CAP = 100e6  # one forwarding node: 100 MB/s


def hist(**kw) -> JobHistory:
    base = dict(
        runs=2,
        jobs=["a1", "a0"],
        pattern="N-N",
        bytes=40 * GB,
        data_requests=40_000,
        metadata_ops=100,
        metadata_ops_s=10.0,
        io_ranks=64,
        bandwidth_b_s=250e6,
        forwarding_nodes=1,
        span_s=160.0,
    )
    return JobHistory(**(base | kw))


def nodes(**kw) -> list[NodeState]:
    out = [
        NodeState("fwd0", load_b_s=50e6),
        NodeState("fwd1", load_b_s=10e6),
        NodeState("fwd2", reserved=True),
        NodeState("fwd3", reserved=True, load_b_s=1e6),
    ]
    for n in out:
        for k, v in kw.get(n.name, {}).items():
            setattr(n, k, v)
    return out


def cfg(**kw) -> ControlConfig:
    return ControlConfig(reserved_nodes=["fwd2", "fwd3"], **kw)


def test_no_history_gets_the_default_node():
    d = decide("j1", None, nodes(), "fwd0", CAP, cfg())
    assert (d.klass, d.nodes, d.reserved) == ("default", ["fwd0"], [])
    assert "no earlier run" in d.reason


def test_beacon_rule_each_criterion_can_fail():
    c = cfg()
    assert classify(hist(), c)[0] == "more_nodes"
    for bad in (dict(pattern="1-1"), dict(bytes=19 * GB), dict(metadata_ops=40_000 * 1001), dict(io_ranks=31)):
        klass, reason, ev = classify(hist(**bad), c)
        assert klass == "default", bad
        failed = [k for k, v in ev["criteria"].items() if not v["ok"]]
        assert len(failed) == 1 and failed[0] in reason


def test_benefiting_job_gets_more_shared_nodes_sized_by_capacity():
    d = decide("j2", hist(), nodes(), "fwd0", CAP, cfg())
    # 250 MB/s over 100 MB/s -> 3 wanted, only 2 shared healthy nodes exist: capped, default stays primary
    assert d.klass == "more_nodes" and d.nodes == ["fwd0", "fwd1"] and d.reserved == []
    assert d.evidence["sizing"]["wanted"] == math.ceil(250e6 / CAP) and "wanted 3, 2 exist" in d.reason


def test_very_high_volume_gets_dedicated_reserved_nodes():
    d = decide("j3", hist(bytes=2000 * GB), nodes(), "fwd0", CAP, cfg())
    assert d.klass == "dedicated" and d.nodes == d.reserved == ["fwd2", "fwd3"]  # least loaded first


def test_metadata_heavy_is_isolated_on_one_dedicated_node():
    d = decide("j4", hist(metadata_ops_s=5000.0, pattern="1-1"), nodes(), "fwd0", CAP, cfg())
    assert d.klass == "dedicated" and d.nodes == ["fwd2"] and "metadata-heavy" in d.reason


def test_a_short_burst_of_metadata_is_not_metadata_heavy():
    """5,000 ops/s over half a second (a launcher's opens around a short job) is no sustained rate."""
    d = decide("j5", hist(metadata_ops_s=5000.0, span_s=0.5), nodes(), "fwd0", CAP, cfg())
    assert d.klass == "more_nodes", d.reason


def test_fail_slow_and_down_nodes_are_never_chosen():
    c = cfg()
    d = decide("j5", hist(bytes=2000 * GB), nodes(fwd2={"fail_slow": True}), "fwd0", CAP, c)
    assert d.nodes == ["fwd3"]
    d = decide("j6", None, nodes(fwd0={"fail_slow": True}), "fwd0", CAP, c)
    assert d.nodes == ["fwd1"] and "fail-slow" in d.reason
    d = decide("j7", hist(), nodes(fwd1={"down": True}), "fwd0", CAP, c)
    assert "fwd1" not in d.nodes and d.klass == "default"  # one usable shared node cannot be 'more'


def test_reserved_node_held_by_another_job_is_not_handed_out():
    d = decide(
        "j8", hist(bytes=2000 * GB), nodes(fwd2={"holder": "other"}, fwd3={"holder": "other"}), "fwd0", CAP, cfg()
    )
    assert d.klass == "more_nodes" and set(d.nodes) == {"fwd0", "fwd1"} and "no free reserved" in d.reason
    # the holder itself gets its node again (idempotent)
    d = decide("other", hist(bytes=2000 * GB), nodes(fwd2={"holder": "other"}), "fwd0", CAP, cfg())
    assert "fwd2" in d.nodes


def test_saturated_history_asks_one_node_more_than_it_had():
    d = decide("j9", hist(bandwidth_b_s=0.9 * CAP, forwarding_nodes=1), nodes(), "fwd0", CAP, cfg())
    assert d.evidence["sizing"]["saturated"] and d.evidence["sizing"]["wanted"] == 2


# -- node-local mode suggested (Sunway storage paper §6; Beacon's metadata-heavy rule) ----------


def test_n_n_metadata_heavy_job_is_suggested_node_local():
    """N-N at 1,500 metadata ops/s over 160 s (Beacon: >= 1,000): suggested, in the decision, its
    dict and its evidence, whatever the forwarding nodes."""
    h = hist(metadata_ops=240_000, metadata_ops_s=1500.0)
    d = decide("j10", h, nodes(), "fwd0", CAP, cfg())
    assert d.klass == "dedicated" and d.nodes == ["fwd2"]  # metadata-heavy: isolated as before
    assert d.node_local is True and d.to_dict()["node_local"] is True
    nl = d.evidence["node_local"]
    assert nl["suggested"] is True and nl["reason"] == "N-N, 1500 metadata ops/s >= 1000 (metadata-heavy)"
    assert nl["criteria"]["pattern"] == {"value": "N-N", "need": ["N-N"], "ok": True}
    assert nl["criteria"]["metadata_ops_s"]["value"] == 1500.0 and nl["criteria"]["metadata_ops_s"]["ok"]
    # metadata-dominated without Beacon's rate: 2 metadata ops per data op, 20,000 per run
    d = decide(
        "j11", hist(data_requests=10_000, metadata_ops=20_000, metadata_ops_s=125.0), nodes(), "fwd0", CAP, cfg()
    )
    assert d.node_local and d.evidence["node_local"]["reason"] == "N-N, 2 metadata ops per data op >= 1 (20000 per run)"
    assert not d.evidence["node_local"]["criteria"]["metadata_ops_s"]["ok"]


def test_node_local_is_not_suggested_for_n_1_data_heavy_or_unknown_jobs():
    c = cfg()
    n1 = node_local_suggestion(hist(pattern="N-1", metadata_ops=240_000, metadata_ops_s=1500.0), c)
    assert not n1["suggested"] and n1["reason"].startswith("pattern N-1, not N-N")
    assert n1["criteria"]["pattern"]["ok"] is False and n1["criteria"]["metadata_ops_s"]["ok"] is True
    data = decide("j12", hist(), nodes(), "fwd0", CAP, c)  # N-N, 10 metadata ops/s, 0.0025 per data op
    assert data.klass == "more_nodes" and data.node_local is False
    assert data.evidence["node_local"]["criteria"]["metadata_per_data_op"] == {
        "value": 0.003,
        "need": ">= 1",
        "ok": False,
    }
    assert "neither metadata-heavy (10 metadata ops/s)" in data.evidence["node_local"]["reason"]
    # many metadata ops per data op, but a small job: 200 metadata ops per run
    small = node_local_suggestion(hist(data_requests=100, metadata_ops=200, metadata_ops_s=1.25), c)
    assert not small["suggested"] and small["criteria"]["metadata_ops"] == {
        "value": 200,
        "need": ">= 10000",
        "ok": False,
    }
    # a short burst is not metadata-heavy (Beacon's sustained rate), and the ratio is low
    assert not node_local_suggestion(hist(metadata_ops_s=5000.0, span_s=0.5), c)["suggested"]
    none = decide("j13", None, nodes(), "fwd0", CAP, c)
    assert none.node_local is False and none.evidence["node_local"] == {
        "suggested": False,
        "reason": "no earlier run with this name, user and command",
        "criteria": {},
    }
    # a learned class only (no exact history): its estimated profile is N-N and metadata-heavy, not the job's
    guess = hist(jobs=["x1"], metadata_ops=240_000, metadata_ops_s=1500.0)
    learned = LearnedClass("dedicated", "dedicated", 0.9, True, {"dedicated": 0.9}, guess, "learned: dedicated")
    d = decide("j14", None, nodes(), "fwd0", CAP, c, learned=learned)
    assert d.klass == "dedicated" and d.node_local is False and not d.evidence["node_local"]["suggested"]
    off = node_local_suggestion(hist(metadata_ops=240_000, metadata_ops_s=1500.0), cfg(dfra_node_local_enabled=False))
    assert not off["suggested"] and off["reason"] == "off ([control] dfra_node_local_enabled)"


# -- on the store -----------------------------------------------------------------------------

T0 = 1_750_000_000 * cr.NS


def _insert(store, *parts):
    for rows in parts:
        tbl = "job_events" if "kind" in rows[0] else "io_requests"
        store.insert_rows(tbl, rows)


@pytest.fixture(scope="module")
def history_store(store):
    # two earlier runs of 'sim' (N-N, 8 ranks x 64 MiB) and one of 'tiny' (1 rank); 'sim' also ran
    # with another command, which must not count when the command is given
    _insert(
        store,
        cr.job_events("s1", T0, T0 + 20 * cr.NS, "sim", command=["sim", "-n", "8"], ranks=8),
        cr.requests("s1", T0, 8, 64),
        cr.job_events("s2", T0 + 100 * cr.NS, T0 + 120 * cr.NS, "sim", command=["sim", "-n", "8"], ranks=8),
        cr.requests("s2", T0 + 100 * cr.NS, 8, 64),
        cr.job_events("s3", T0 + 200 * cr.NS, T0 + 220 * cr.NS, "sim", command=["sim", "other"], ranks=1),
        cr.requests("s3", T0 + 200 * cr.NS, 1, 4),
        cr.job_events("t1", T0, T0 + 20 * cr.NS, "tiny", ranks=1),
        cr.requests("t1", T0, 1, 4),
    )
    return store


def test_launcher_metadata_on_system_paths_is_not_the_jobs(store):
    """An MPI launcher and its shells open and stat thousands of libraries and /proc files in a short
    job: that is not metadata load on the file system, and must not make the job metadata-heavy
    (it made a 2-rank fio job "dedicated" on the cluster rig: 1,482 ops/s). Only metadata ops on
    the job's files count, as in the phases' metadata profile."""
    rows = cr.requests("m1", T0, 2, 8, metadata_per_rank=3)
    for i in range(4000):
        path, ftype = ("/usr/lib/x86_64-linux-gnu/libmpi.so.12", "regular") if i % 2 else ("", "pipe")
        rows.append(dict(rows[-1], op="open" if i % 3 else "stat", path=path, file_type=ftype, seq=10_000 + i))
    _insert(store, cr.job_events("m1", T0, T0 + 20 * cr.NS, "launch", ranks=2), rows)
    h = job_history(store, "launch", "alice", None, ControlConfig())
    assert h.metadata_ops == 2 * 3 and h.metadata_ops_s < 1.0, h
    assert classify(h, cfg(dfra_min_bytes=0, dfra_min_io_ranks=2))[0] == "more_nodes"


def test_history_matches_name_user_and_command(history_store):
    c = ControlConfig()
    h = job_history(history_store, "sim", "alice", ["sim", "-n", "8"], c)
    assert h.runs == 2 and h.jobs == ["s2", "s1"] and h.pattern == "N-N"
    assert h.io_ranks == 8 and h.bytes == 8 * 64 * cr.MiB
    assert job_history(history_store, "sim", "alice", None, c).runs == 3
    assert job_history(history_store, "sim", "bob", None, c) is None
    assert job_history(history_store, "nothing", "alice", None, c) is None
