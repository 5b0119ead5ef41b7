"""Agent overhead benchmark: fio write bandwidth traced by ``pharos run`` vs untraced, paired.

Starts a private embedded stack (broker, agent, pipeline + API on chDB) on free loopback
ports, then per block size (4 KiB and 1 MiB) runs PAIRS pairs of the same fio job: sequential
psync writes of a new file on tmpfs (/dev/shm). In each pair

  * traced: the agent runs and fio runs as a user runs a job under Pharos,
    ``pharos run --job ID -- fio ...`` (the CLI in a process of its own, on this stack);
  * untraced: the agent process is stopped (its programs detached, so no system call pays for
    tracing, not merely filtered) and fio runs directly, in no job cgroup;
  * and, unless --no-outside, outside: the agent runs but fio runs directly, outside any job (what
    a user comparing `fio` with `pharos run -- fio` on a running stack sees; the difference to
    untraced is what the agent costs every process of the node).

The order alternates (traced first in even rounds, untraced first in odd ones, outside between
them) so drift on this shared, noisy machine hits both sides alike. fio's own write bandwidth (bytes/s of its job,
from its JSON output) is the figure, so neither the CLI's start-up nor the agent's restart is
timed.

Prints per block size: the median over the pairs of untraced/traced bandwidth (targets: ≤ 1.05
for 4 KiB, ≤ 1.01 for 1 MiB), the range of the pairs' ratios, the same for outside/traced, the
median bandwidths (MiB/s),
and the records per request over the traced jobs (all their requests, from the pipeline's store
via the API: what the in-kernel merging of contiguous requests leaves). No pass/fail: the figures are what to compare.

Usage: uv run --frozen python bench/agent_overhead.py [--pairs 6] [--size 1g] [--bs 4k,1m] [--agent BIN]
       [--no-outside]   (root)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import httpx
from pharos_testkit import pharos_run, stack_settings

from pharos_api import stack
from pharos_core import api_client

TARGET = {"4k": 1.05, "1m": 1.01}
TMPFS = Path("/dev/shm")


def fio_argv(bs: str, size: str, data: Path, out: Path) -> list[str]:
    """fio: one job of sequential psync writes of ``size`` bytes in ``bs`` blocks to ``data``
    (a new file), its JSON report written to ``out``."""
    return [
        "fio",
        "--name=bench",
        "--ioengine=psync",
        "--rw=write",
        f"--bs={bs}",
        f"--size={size}",
        f"--filename={data}",
        "--disk_util=0",
        "--output-format=json",
        f"--output={out}",
    ]


def write_bw(report: Path) -> tuple[float, int]:
    """(write bandwidth in bytes/s, write requests) of the single job of a fio JSON report."""
    w = json.loads(report.read_text())["jobs"][0]["write"]
    return float(w["bw_bytes"]), int(w["total_ios"])


def stack_cpu_s(settings) -> dict[str, float]:
    """CPU time (user + system, s) so far of each running process of the stack, by component."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for c in stack.components(settings):
        pid = stack.pid_of(settings, c.name)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() if pid else None
        except OSError:
            fields = None
        if fields:
            out[c.name] = (int(fields[11]) + int(fields[12])) / tick
    return out


def run_fio(settings, bs: str, size: str, work: Path, job_id: str | None) -> tuple[float, int, dict[str, float]]:
    """One fio run on tmpfs; traced as job ``job_id`` through ``pharos run`` (None: untraced,
    run directly). Returns fio's (write bandwidth in bytes/s, write requests) and the CPU time
    (s) each process of the stack used meanwhile (from the start of fio, or of ``pharos run``,
    to its end)."""
    data, out = work / "f", work / "fio.json"
    argv = fio_argv(bs, size, data, out)
    env = None
    if job_id is not None:
        argv, env = pharos_run(settings, job_id, argv)
    cpu0 = stack_cpu_s(settings)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    cpu = {k: v - cpu0[k] for k, v in stack_cpu_s(settings).items() if k in cpu0}
    bw, ios = write_bw(out)
    data.unlink(missing_ok=True)
    out.unlink(missing_ok=True)
    settle()
    return bw, ios, cpu


def job_records(settings, job_id: str, writes: int, timeout_s: float = 30.0) -> tuple[int, int]:
    """(records, requests of every op) of traced job ``job_id`` as the API gives them, once it is
    finished with at least ``writes`` pwrite requests stored (else what is there at the timeout)."""
    deadline, s = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            r = api_client.request(settings.api_url, "GET", f"/v1/jobs/{job_id}", params={"layer": "client"}, timeout=5)
            s = r.json() if r.status_code == 200 else s
        except httpx.HTTPError:
            pass
        if s and s.get("state") == "finished" and s.get("ops", {}).get("pwrite", 0) >= writes:
            break
        time.sleep(0.5)
    return (s.get("records", 0), sum(s.get("ops", {}).values())) if s else (0, 0)


def settle() -> None:
    """Same start for every run: dirty pages written back, the agent and pipeline done with the
    previous run's records (their CPU would otherwise land in the next run)."""
    subprocess.run(["sync"], check=True)
    time.sleep(1.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", "--rounds", type=int, default=6, help="pairs of runs per block size (default 6)")
    ap.add_argument("--size", default="1g", help="bytes written per fio run (fio units, default 1g)")
    ap.add_argument("--bs", default="4k,1m", help="block sizes, comma-separated (default 4k,1m)")
    ap.add_argument("--agent", type=Path, help="agent binary (default: settings agent_binary, target/release)")
    ap.add_argument("--outside", action=argparse.BooleanOptionalAction, default=True, help="also run fio outside a job")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("agent_overhead: needs root (eBPF agent, cgroups)", file=sys.stderr)
        return 2

    state = Path(tempfile.mkdtemp(prefix="pharos-bench-"))
    agent_bin = args.agent
    if agent_bin is not None and agent_bin.name != "pharos-agent":
        # The stack knows its agent by the executable's name: under another name (a saved build,
        # pharos-agent.old) the stopped agent was not recognised, kept running, and the restart
        # failed on its metrics port. A link named pharos-agent runs the same binary.
        (state / "bin").mkdir()
        (state / "bin" / "pharos-agent").symlink_to(agent_bin.resolve())
        agent_bin = state / "bin" / "pharos-agent"
    settings = stack_settings(state, "pharos-bench", **({"agent_binary": agent_bin} if agent_bin else {}))
    work = Path(tempfile.mkdtemp(prefix="pharos-bench-data-", dir=TMPFS))
    print(f"starting a private stack in {state}; fio files in {work} (tmpfs) ...", flush=True)
    stack.start(settings)
    agent = next(c for c in stack.components(settings) if c.name == "agent")
    rows = []
    try:
        for bs in args.bs.split(","):
            bws: dict[str, list[float]] = {"traced": [], "untraced": [], "outside": []}
            traced_jobs: list[tuple[str, int]] = []  # (job id, write requests fio made)
            run_fio(settings, bs, args.size, work, None)  # warm-up (fio binary, tmpfs), not counted
            for p in range(args.pairs):
                order = ["traced", "outside", "untraced"] if args.outside else ["traced", "untraced"]
                for mode in order if p % 2 == 0 else order[::-1]:
                    job_id = None
                    if mode == "untraced":
                        stack.stop_component(settings, agent.name)
                    else:
                        stack.start(settings)  # restarts the agent if stopped
                    if mode == "traced":
                        job_id = f"bench-{bs}-{p}-{os.getpid()}"
                    bw, written, cpu = run_fio(settings, bs, args.size, work, job_id)
                    if job_id is not None:
                        traced_jobs.append((job_id, written))
                    bws[mode].append(bw)
                    busy = " ".join(f"{k} {v * 1000:.0f}" for k, v in cpu.items() if v > 0)
                    print(f"  bs={bs:3s} pair {p} {mode:8s} {bw / 2**20:9.1f} MiB/s   stack CPU ms: {busy}", flush=True)
            stack.start(settings)
            records = requests = 0
            for job_id, written in traced_jobs:
                rec, req = job_records(settings, job_id, written)
                records, requests = records + rec, requests + req
            rows.append((bs, bws, records / requests if requests else float("nan"), requests))
    finally:
        stack.stop(settings)
        for f in work.iterdir():
            f.unlink()
        work.rmdir()

    print()
    print(
        "fio psync sequential writes to tmpfs, write bandwidth: untraced (agent stopped) / traced (`pharos run`), "
        f"outside (agent running, no job) / traced; {args.pairs} pairs, {args.size} per run"
    )
    print(
        f"{'bs':4s} {'ratio':>6s} {'target':>7s} {'range':>13s} {'outside':>8s} {'range':>13s} "
        f"{'untraced':>9s} {'outside':>8s} {'traced':>8s} MiB/s {'records/request':>16s} {'requests':>9s}"
    )
    for bs, bws, rpr, req in rows:
        target = f"≤{TARGET[bs]}" if bs in TARGET else "-"
        ratio = [u / t for u, t in zip(bws["untraced"], bws["traced"], strict=True)]
        out = [o / t for o, t in zip(bws["outside"], bws["traced"], strict=False)] or [float("nan")]
        med = {k: statistics.median(v) / 2**20 if v else float("nan") for k, v in bws.items()}
        print(
            f"{bs:4s} {statistics.median(ratio):6.3f} {target:>7s} {min(ratio):6.3f}-{max(ratio):6.3f} "
            f"{statistics.median(out):8.3f} {min(out):6.3f}-{max(out):6.3f} "
            f"{med['untraced']:9.1f} {med['outside']:8.1f} {med['traced']:8.1f}       {rpr:16.5f} {req:9d}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
