"""Ranks of MPI jobs (issue 13), live: a real MPICH job under ``pharos run`` has its MPI ranks.

``pharos run --job J -- mpiexec -n 4 mpi_write_at FILE ... RESULTS`` puts ``mpiexec`` (hydra) in the job's
``rank_0`` cgroup with ``PHAROS_RANK=0``; hydra spawns the 4 MPI processes below it, each with its
own ``PMI_RANK``. Job and rank follow the one rule of ``pharos-attribution`` (proto/attribution):
the job from the cgroup, the rank from the innermost launcher's variable (``PMI_RANK`` before the
inherited ``PHAROS_RANK``). The writer (tests/data/mpi_write_at.c, built with ``mpicc`` here) has
every rank write 4 MiB at its own offset of ONE shared file in 1 MiB ``MPI_File_write_at_all``
calls, then exit: ranks that live well under a second, the case where the agent once read
``/proc/<pid>/environ`` too late. Rank 0 then writes a 4 KiB results file beside it, as IOR does
(issue 24): a side file that must not turn the job's N-1 into N-M.

Real embedded stack (Kafka, eBPF agent, fwd0/fwd1 on 4 targets, the FUSE mount, pipeline + API on
chDB). Two runs: the file on the Pharos mount (client layer from the agent AND forwarder layer from
the mount and daemons) and in a local directory (client layer only). Checked per layer: the API's
summary says 4 ranks (the MPI world size, issue 24) of which 4 did I/O, pattern N-1 (writes N-1 by
volume, the fan-in over both files N-M), the two files and exactly the bytes the program reports; the
records themselves (read back from the stack's Kafka topic) carry ranks 0..3, each with its
4 MiB, and the rank of every record is the one the program's process with that pid printed.
Needs root (eBPF, cgroups, FUSE) and MPICH (``mpich libmpich-dev``, Makefile APT_PACKAGES).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from mpi_testkit import MPIEXEC, build_mpi_writer
from pharos_testkit import LIVE_STACK_MARKS, assert_one_pattern, pharos_run, running_stack

from pharos_api.demo import wait_for_summary
from pharos_core.settings import Settings
from pharos_pipeline.wire import IoBatch, io_pb2

pytestmark = LIVE_STACK_MARKS

RANKS = 4
MiB = 1 << 20
PER_RANK = 4 * MiB
REQUEST = 1 * MiB
WRITE_OPS = {io_pb2.OP_WRITE, io_pb2.OP_PWRITE, io_pb2.OP_WRITEV}
LAYERS = {"client": io_pb2.LAYER_CLIENT, "forwarder": io_pb2.LAYER_FORWARDER}


@pytest.fixture(scope="module")
def writer(tmp_path_factory) -> Path:
    return build_mpi_writer(tmp_path_factory.mktemp("mpi"))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    t0 = time.monotonic()
    with running_stack(
        tmp_path_factory.mktemp("live-mpi"),
        "pharos-mpi",
        {"PHAROS_CONTROL_PERIOD_S": "0"},  # no remapping or re-placement under the job
        fwd_nodes=2,
        fwd_targets=4,
        fwd_target_limits_mb_s=[],
    ) as settings:
        print(f"\n[mpi] stack ready in {time.monotonic() - t0:.1f} s")
        yield settings


def pharos_run_mpiexec(settings: Settings, job_id: str, exe: Path, data: Path, results: Path, out: Path) -> list[dict]:
    """``pharos run --job J -- mpiexec -n 4 exe data ... results`` as a user types it (the CLI in
    a subprocess, bounded); returns the JSON lines the MPI ranks printed."""
    mpiexec = [MPIEXEC, "-launcher", "fork", "-n", str(RANKS), str(exe), str(data), str(PER_RANK), str(REQUEST)]
    mpiexec.append(str(results))
    argv, env = pharos_run(settings, job_id, mpiexec, name="mpi-write-at", output_dir=out)
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    printed = (out / "rank_0.out").read_text() if (out / "rank_0.out").exists() else ""
    assert r.returncode == 0, f"pharos run exit {r.returncode}\nstdout: {printed}\nstderr: {r.stderr[-3000:]}"
    lines = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    assert sorted(x["rank"] for x in lines) == list(range(RANKS)), printed
    return lines


def is_write_on(rec, layer: str, path: str) -> bool:
    """A successful data write of ``layer`` on ``path``."""
    return rec.layer == LAYERS[layer] and rec.op in WRITE_OPS and rec.result > 0 and rec.path == path


def job_records(settings: Settings, job_id: str, want: dict[str, tuple[str, int]], timeout_s: float = 60) -> list:
    """The IoRecords of ``job_id`` on the stack's requests topic, read from the beginning until,
    for each layer of ``want``, the bytes written on its path reach the count given (or the timeout)."""
    c = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"mpi-ranks-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([settings.topic_requests])
    recs: list = []
    got = dict.fromkeys(want, 0)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and any(got[k] < n for k, (_, n) in want.items()):
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            for rec in IoBatch.FromString(msg.value()).records:
                if rec.job_id != job_id:
                    continue
                recs.append(rec)
                for layer, (path, _) in want.items():
                    if is_write_on(rec, layer, path):
                        got[layer] += rec.result * max(rec.count, 1)
    finally:
        c.close()
    return recs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["mount", "local"])
def test_mpiexec_ranks_inside_pharos_run(live: Settings, writer: Path, where: str, tmp_path: Path):
    t0 = time.monotonic()
    job_id = f"mpi-{where}-{os.getpid()}"
    base = live.mount_point if where == "mount" else tmp_path
    d = base / job_id
    d.mkdir()
    data, results = d / "shared.dat", d / "results.txt"
    printed = pharos_run_mpiexec(live, job_id, writer, data, results, tmp_path / "out")
    t_run = time.monotonic() - t0
    total = sum(x["bytes_written"] for x in printed)
    assert total == RANKS * PER_RANK and all(x["bytes_written"] == PER_RANK for x in printed), printed
    assert data.stat().st_size == RANKS * PER_RANK
    side = sum(x["results_bytes"] for x in printed)
    assert side == results.stat().st_size == 4096, printed
    pid_rank = {x["pid"]: x["rank"] for x in printed}

    layers = ["client", "forwarder"] if where == "mount" else ["client"]
    summaries = {}
    for layer in layers:
        s = wait_for_summary(live.api_url, job_id, total + side, timeout_s=60, layer=layer)
        assert s is not None, f"{layer} layer: job {job_id} never reached the API"
        summaries[layer] = s
    # the file as each layer names it: the path opened on the compute node, the namespace path
    paths = {"client": str(data)}
    if where == "mount":
        paths["forwarder"] = "/" + str(data.relative_to(live.mount_point))
    records = job_records(live, job_id, {layer: (paths[layer], total) for layer in layers})

    lines = []
    for layer in layers:
        s = summaries[layer]
        by_rank: dict[int, int] = defaultdict(int)
        wrong_pid = []
        for rec in records:
            if not is_write_on(rec, layer, paths[layer]):
                continue
            by_rank[rec.rank] += rec.result * max(rec.count, 1)
            if pid_rank.get(rec.pid, rec.rank) != rec.rank:
                wrong_pid.append((rec.pid, rec.rank))
        lines.append(
            f"{layer}: pattern {s['pattern']} (writes {s['patterns']['write']}, fan-in {s['fan_in_pattern']}), "
            f"ranks {s['ranks']}, {s['io_ranks']} I/O ranks, {s['n_files']} file(s), "
            f"{s['bytes_written']} B written; records' ranks {dict(sorted(by_rank.items()))}"
        )
        assert s["pattern"] == "N-1", f"{layer} layer: pattern {s['pattern']} ({lines[-1]})"
        assert (s["patterns"]["write"], s["fan_in_pattern"]) == ("N-1", "N-M"), f"{layer} layer: {lines[-1]}"
        assert s["ranks"] == RANKS, f"{layer} layer: the MPI world size is the job's ranks: {lines[-1]}"
        assert s["io_ranks"] == RANKS, f"{layer} layer: {lines[-1]}"
        files = {Path(f["path"]).name: (f["ranks"], f["bytes_written"]) for f in s["files"]}
        assert files == {data.name: (RANKS, total), results.name: (1, side)}, f"{layer} layer: {s['files']}"
        assert s["bytes_written"] == total + side, f"{layer} layer: {lines[-1]}"
        assert dict(by_rank) == dict.fromkeys(range(RANKS), PER_RANK), f"{layer} layer: {lines[-1]}"
        assert not wrong_pid, f"{layer} layer: records whose rank is not their process's: {wrong_pid[:10]}"
        assert_one_pattern(live.api_url, [job_id], layer=layer)  # every view says N-1 (issue 10)
    print(
        f"\n[mpi] {where}: {RANKS} MPI ranks x {PER_RANK // MiB} MiB ({total} B by the program), "
        f"pharos run {t_run:.1f} s, checked after {time.monotonic() - t0:.1f} s\n  " + "\n  ".join(lines)
    )
