"""Agent overhead benchmark: the same fio job with and without the eBPF agent, alternating.

Starts a private embedded stack (broker, agent, pipeline + API on chDB) on free loopback
ports, then for each case runs ROUNDS pairs of fio jobs in a job cgroup, alternating the
order (ABBA) so drift on this shared, noisy machine hits both sides alike. "Without" means
the agent process is stopped (its tracepoints detached), not merely filtering.

Prints per case: median wall time with and without the agent, their ratio (targets: ≤ 1.10
for 4 KiB sequential page-cache writes, ≤ 1.02 for 1 MiB), and the records-per-request ratio
that the in-kernel merging achieved (from the pipeline's store, via the API).

Usage: uv run python bench/agent_overhead.py [--rounds 5] [--size 1g]   (root)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from pharos_testkit import stack_settings

from pharos_agents.cgroups import job_cgroup, join_cgroup, remove_cgroup
from pharos_agents.runner import JobEventProducer
from pharos_api import stack
from pharos_api.demo import wait_for_summary
from pharos_core.settings import Settings
from pharos_pipeline.wire import JobEvent, io_pb2

CASES = [("4KiB sequential write", "4k"), ("1MiB sequential write", "1m")]


def job_event(job_id: str, kind: int, name: str, **fields) -> JobEvent:
    """A one-rank JobEvent of this host, now (``fields``: more JobEvent fields)."""
    return JobEvent(
        schema_version=1,
        job_id=job_id,
        kind=kind,
        time_ns=time.time_ns(),
        name=name,
        ranks=1,
        host=socket.gethostname(),
        **fields,
    )


def timed_fio(settings: Settings, job_id: str, bs: str, size: str, data: Path, events: JobEventProducer) -> float:
    """Run one fio job in its job cgroup; returns the fio process's wall time in seconds."""
    cg = job_cgroup(job_id, settings.cgroup_parent)
    events.send(job_event(job_id, io_pb2.JobEvent.KIND_START, f"bench-{bs}", command=["fio"]))
    cmd = [
        "fio",
        "--name=bench",
        "--ioengine=psync",
        "--rw=write",
        f"--bs={bs}",
        f"--size={size}",
        f"--filename={data}",
        "--disk_util=0",
        "--output-format=terse",
    ]
    env = dict(os.environ, PHAROS_RANK="0", PHAROS_JOB_ID=job_id, PHAROS_NRANKS="1")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, preexec_fn=lambda: join_cgroup(cg))
    wall = time.perf_counter() - t0
    events.send(job_event(job_id, io_pb2.JobEvent.KIND_END, f"bench-{bs}"))
    data.unlink(missing_ok=True)
    settle()
    remove_cgroup(cg)
    return wall


def settle() -> None:
    """Give every run the same start: write back dirty pages, drop clean caches, pause.

    Without it the second run of a back-to-back pair pays for the first one's writeback.
    """
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    time.sleep(1.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="pairs of runs per case (default 5)")
    ap.add_argument("--size", default="1g", help="bytes written per fio run (fio units, default 1g)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("agent_overhead: needs root (eBPF agent, cgroups)", file=sys.stderr)
        return 2

    state = Path(tempfile.mkdtemp(prefix="pharos-bench-"))
    settings = stack_settings(state, "pharos-bench")
    data_dir = Path(tempfile.mkdtemp(prefix="pharos-bench-data-", dir="/var/tmp"))
    print(f"starting a private stack in {state} ...", flush=True)
    stack.start(settings)
    events = JobEventProducer(settings)
    agent = next(c for c in stack.components(settings) if c.name == "agent")
    rows = []
    try:
        for label, bs in CASES:
            walls = {"with": [], "without": []}
            traced_jobs = []
            stack.start(settings)  # warm-up run (page cache, fio binary), not counted
            timed_fio(settings, f"bench-{bs}-warmup-{os.getpid()}", bs, args.size, data_dir / "f", events)
            for r in range(args.rounds):
                order = ["with", "without"] if r % 2 == 0 else ["without", "with"]
                for mode in order:
                    if mode == "with":
                        stack.start(settings)  # restarts the agent if stopped
                    else:
                        stack.stop_component(settings, agent.name)
                    job_id = f"bench-{bs}-{mode}-{r}-{os.getpid()}"
                    w = timed_fio(settings, job_id, bs, args.size, data_dir / "f", events)
                    walls[mode].append(w)
                    if mode == "with":
                        traced_jobs.append(job_id)
                    print(f"  {label:22s} round {r} {mode:7s} agent: {w:7.3f} s", flush=True)
            stack.start(settings)
            records = requests = 0
            for job_id in traced_jobs:
                s = wait_for_summary(settings.api_url, job_id, 0, timeout_s=60)
                records += s["data_records"] if s else 0
                requests += s["data_requests"] if s else 0
            w_with, w_without = statistics.median(walls["with"]), statistics.median(walls["without"])
            rows.append(
                (
                    label,
                    w_without,
                    w_with,
                    w_with / w_without,
                    records / requests if requests else float("nan"),
                    requests,
                )
            )
    finally:
        events.close()
        del events  # destroy the Kafka client before its broker goes away
        stack.stop(settings)

    target = {"4KiB sequential write": 1.10, "1MiB sequential write": 1.02}
    print()
    print(
        f"{'case':24s} {'without (s)':>12s} {'with (s)':>10s} {'ratio':>7s} {'target':>7s} "
        f"{'records/request':>16s} {'requests':>10s}"
    )
    print(
        "(median fio wall time over the rounds; records/request: data records per data request "
        "after in-kernel merging, over the traced runs)"
    )
    for label, wo, wi, ratio, rpr, req in rows:
        print(f"{label:24s} {wo:12.3f} {wi:10.3f} {ratio:7.3f} {'≤' + str(target[label]):>7s} {rpr:16.5f} {req:10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
