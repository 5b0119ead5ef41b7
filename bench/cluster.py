"""Pharos on a cluster in one box (issue 25): the rig at full size with a mixed multi-node workload.

    sudo uv run python bench/cluster.py [--nodes 4] [--fwd 4] [--brokers 3] [--jobs 4] [--seed 1] [--faults]

Builds the rig of tests/cluster_testkit.py (every node in its own network namespace on one bridge:
``--brokers`` KRaft Kafka nodes, the server, ``--fwd`` forwarding nodes, ``--nodes`` compute nodes,
each with its own eBPF agent and FUSE mount), then runs ``--jobs`` multi-node jobs at once, as users
start them: ``pharos run`` on the job's first node of ``mpiexec -hosts <its nodes>`` (MPICH's Hydra,
the rig's ssh) of fio, one rank per node, writing with ``--verify=crc32c`` (fio reads every block
back and checks it). Jobs alternate N-N (a file per rank) and N-1 (one shared file, a region per
rank); their nodes (2 up to all) and sizes are drawn from ``--seed``. fio's JSON reports go to the
rig's folder under /run (a system folder: not the jobs' data I/O).

Checked per job, against fio's own report: the bytes written and read on the client layer (the
nodes' agents) and on the forwarder layer (the mounts and daemons) are exact, every rank's fio
verified its data (no error), and the job shows its compute nodes and its pattern (N-N or N-1) on both layers. Then the server is stopped and
its store read directly: records lost (the producers' ringbuf, delivery and overflow drop counters,
plus one per missing batch in a producer's sequence) and duplicates (rows sharing a (producer,
seq, record index)). Also measured: the memory (PSS) and CPU time of every rig process (brokers'
JVMs, server, daemons, agents, mounts), sampled every 2 s.

Prints one table, the resources, and ends with the line
``cluster: J jobs on N nodes, records lost L, duplicates D, bytes exact E/J, data verified V/J``.
Exit status 1 when any figure is short (L or D > 0, E or V < J). Needs root, MPICH and fio.
``--faults`` then runs the fault schedule of bench/cluster_faults.py and prints its table
(fault, records lost, duplicates, bytes exact, verified, detect s, recover s); its jobs count in the
last line too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchkit import REPO

sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from cluster_faults import FAULTS, MOUNT_ARGS, run_schedule, table
from cluster_testkit import FioJob, fio_results, rig_available, running_rig, start_fio_job, wait_summary

from pharos_core.settings import Settings
from pharos_core.store import open_store
from pharos_pipeline.stored import pipeline_stats

MiB = 1 << 20


def plan(n_jobs: int, nodes: list[str], seed: int, size_mib: int) -> list[FioJob]:
    """``n_jobs`` jobs alternating N-N and N-1, each on 2 up to all ``nodes`` and 1 or 2 times
    ``size_mib`` MiB per rank, drawn from ``seed``."""
    rng = random.Random(seed)
    jobs = []
    for j in range(n_jobs):
        k = rng.randint(2, len(nodes))
        kind = "N-N" if j % 2 == 0 else "N-1"
        jobs.append(FioJob(f"c{seed}-{j}", kind, sorted(rng.sample(nodes, k)), rng.choice([1, 2]) * size_mib))
    return jobs


class Resources:
    """PSS (MiB, summed) and CPU time (s) of every rig process, sampled every ``period_s``."""

    def __init__(self, rig_id: str, period_s: float = 2.0) -> None:
        self.tag = f"PHAROS_RIG={rig_id}".encode()
        self.period_s = period_s
        self.peak_pss_mib = 0.0
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        pss = 0
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if self.tag not in (d / "environ").read_bytes().split(b"\0"):
                    continue
                for line in (d / "smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
                f = (d / "stat").read_text().rpartition(")")[2].split()
                self.cpu[int(d.name)] = (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / tick
        self.peak_pss_mib = max(self.peak_pss_mib, pss / 1024)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> Resources:
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=4, help="compute nodes (default 4)")
    ap.add_argument("--fwd", type=int, default=4, help="forwarding nodes (default 4: fwd0, fwd1 + reserved fwd2, fwd3)")
    ap.add_argument("--brokers", type=int, default=3, help="Kafka nodes, one KRaft quorum (default 3)")
    ap.add_argument("--jobs", type=int, default=4, help="multi-node jobs, run at once (default 4)")
    ap.add_argument("--size-mib", type=int, default=16, help="MiB per rank, times 1 or 2 per job (default 16)")
    ap.add_argument("--seed", type=int, default=1, help="draws the jobs' nodes and sizes (default 1)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the workload (default 600)")
    ap.add_argument(
        "--faults",
        action="store_true",
        help="then run the fault schedule (bench/cluster_faults.py: a forwarding node cut off, brokers killed "
        "and partitioned, a lossy capped compute node link, the server killed, a daemon stopped), each over "
        "its own multi-node fio job, and print its table",
    )
    ap.add_argument(
        "--only",
        default="",
        metavar="NAME[,NAME]",
        help="run only these faults of the schedule (implies --faults): " + ", ".join(f.name for f in FAULTS),
    )
    ap.add_argument("--keep", action="store_true", help="keep the rig's folder (every node's log) and print where")
    args = ap.parse_args(argv)
    chosen = [f for f in FAULTS if f.name in args.only.split(",")] if args.only else FAULTS
    if args.only and len(chosen) != len(args.only.split(",")):
        ap.error(f"--only {args.only}: the faults are {', '.join(f.name for f in FAULTS)}")
    why = rig_available() or (None if shutil.which("fio") else "fio not found")
    if why:
        print(f"cluster: cannot run: {why}")
        return 2
    root = Path(tempfile.mkdtemp(prefix="pharos-cluster-"))  # not under /run: a system folder
    t0 = time.monotonic()
    mount_args = MOUNT_ARGS if args.faults else []  # fwd-link-cut then outlasts the mounts' request timeout
    with (
        running_rig(root, compute=args.nodes, fwd=args.fwd, brokers=args.brokers, mount_args=mount_args) as rig,
        Resources(rig.id) as res,
    ):
        up_s = time.monotonic() - t0
        jobs = plan(args.jobs, [n.name for n in rig.compute], args.seed, args.size_mib)
        t1 = time.monotonic()
        for job in jobs:
            start_fio_job(rig, job)
        deadline = t1 + args.timeout
        for job in jobs:
            try:
                job.exit_code = job.proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.exit_code = job.proc.wait()
        run_s = time.monotonic() - t1
        layers: dict[str, dict[str, dict]] = {}
        fio: dict[str, tuple[dict, bool]] = {}
        for job in jobs:
            fio[job.job_id] = fio_results(job)
            layers[job.job_id] = {}
            for layer in ("client", "forwarder"):
                written = fio[job.job_id][0].get("bytes_written", 1)
                layers[job.job_id][layer] = wait_summary(rig, job.job_id, layer, written, 120)
        drain_s = time.monotonic() - t1
        faults = run_schedule(rig, chosen) if args.faults or args.only else []
        rig.stop("server")  # the store is read directly below
        store = open_store(Settings(state_dir=rig.root / "server"))
        try:
            dup = store.query("SELECT count() AS n, uniqExact(producer_id, seq, record_index) AS u FROM io_requests")[0]
            stats = pipeline_stats(store)
        finally:
            store.close()
    if args.keep:
        print(f"rig folder kept: {root} (logs/)")
    else:
        shutil.rmtree(root, ignore_errors=True)
    lost = stats["ringbuf_drops"] + stats["delivery_failures"] + stats["overflow_drops"] + stats["missing_batches"]
    duplicates = int(dup["n"]) - int(dup["u"])
    print(f"\nrig: {args.brokers} brokers, {args.fwd} forwarding nodes, {args.nodes} compute nodes; up in {up_s:.1f} s")
    print(
        f"{'job':10s} {'kind':4s} {'nodes':24s} {'fio W/R MiB':>12s}  {'client W/R MiB':>15s}  {'fwd W/R MiB':>12s}  exact verified"
    )
    exact = 0
    for job in jobs:
        totals, job_verified = fio[job.job_id]
        fw, fr = totals.get("bytes_written", -1), totals.get("bytes_read", -1)
        c, f = layers[job.job_id]["client"], layers[job.job_id]["forwarder"]
        ok = all(x.get("bytes_written") == fw and x.get("bytes_read") == fr for x in (c, f))
        ok = ok and c.get("compute_nodes") == job.nodes and f.get("compute_nodes") == job.nodes
        ok = ok and c.get("pattern") == f.get("pattern") == job.kind
        exact += ok
        if not ok:  # say which figure is off
            for name, x in (("client", c), ("forwarder", f)):
                print(
                    f"  {job.job_id} {name}: written {x.get('bytes_written')} read {x.get('bytes_read')} "
                    f"nodes {x.get('compute_nodes')} pattern {x.get('pattern')}; fio written {fw} read {fr}, nodes "
                    f"{job.nodes}; "
                    f"files {[(y['path'], y['bytes_written']) for y in x.get('files', []) if y['bytes_written'] < MiB]}"
                )
        print(
            f"{job.job_id:10s} {job.kind:4s} {','.join(job.nodes):24s} {fw / MiB:5.0f}/{fr / MiB:<6.0f}  "
            f"{c.get('bytes_written', 0) / MiB:7.0f}/{c.get('bytes_read', 0) / MiB:<7.0f}  "
            f"{f.get('bytes_written', 0) / MiB:5.0f}/{f.get('bytes_read', 0) / MiB:<6.0f}  {'yes' if ok else 'NO':5s} "
            f"{'yes' if job_verified else 'NO'}"
        )
    verified = sum(v for _, v in fio.values()) + sum(r.verified for r in faults)
    exact += sum(r.exact for r in faults)
    n_jobs = len(jobs) + len(faults)
    if faults:
        print("\nfault schedule (records lost and duplicates: the whole store, after every fault)")
        print(table(faults, lost, duplicates))
    print(
        f"workload {run_s:.1f} s, all summaries in {drain_s:.1f} s; stored {stats['records']} records in "
        f"{stats['batches']} batches from {stats['producers']} producers; missing batches {stats['missing_batches']}, "
        f"drops ringbuf {stats['ringbuf_drops']} delivery {stats['delivery_failures']} overflow {stats['overflow_drops']}"
    )
    print(
        f"resources of the rig's processes: peak PSS {res.peak_pss_mib:.0f} MiB, CPU {res.cpu_s:.1f} s "
        f"over {time.monotonic() - t0:.0f} s ({args.nodes} compute nodes)"
    )
    print(
        f"cluster: {n_jobs} jobs on {args.nodes} nodes, records lost {lost}, duplicates {duplicates}, "
        f"bytes exact {exact}/{n_jobs}, data verified {verified}/{n_jobs}"
    )
    return 0 if lost == 0 and duplicates == 0 and exact == n_jobs and verified == n_jobs else 1


if __name__ == "__main__":
    raise SystemExit(main())
