"""Issue 12's forwarding benches on the cluster rig (issue 25, item 6): GAS on/off and 1 vs 2
masters where they matter, with the forwarding daemons on nodes of their own and targets as far
away as a remote OST.

    sudo uv run python bench/cluster_forwarding.py [--part gas|masters|all] [--rounds 6]
        [--target-latency-ms 1] [--compute 2] [--fwd 1] [--keep]

The rig of tests/cluster_testkit.py: every node in its own network namespace on one bridge (one
Kafka broker, the server, ``--fwd`` forwarding nodes, ``--compute`` compute nodes each with its
eBPF agent and FUSE mount). The compute nodes' mounts reach the daemons over the emulated network
(veth, bridge, TCP) and their data goes on the socket: ``pharos-mount --shm-slots 0``, since the
rig's nodes share one kernel and PID namespace and a mount would otherwise hand its shared-memory
region to a daemon through /proc, which no two hosts can do (the bench checks that no daemon
attached one). Every target (ost0..ost3) gets ``--latency-ms`` (``--target-latency-ms``, default
1 ms: a remote OST's round trip and service; issue 12's single-host figures had none or 0.1 ms).

Side by side in one run: each configuration is a restart of the forwarding layer with its flags
(the mounts stopped, every daemon restarted, the mounts started again: ``Rig.restart_forwarding``;
fresh mounts, so no request meets a connection the old daemon closed), once per configuration and
round, the order rotating and reversed every other round (benchkit.rounds), so that every round
gives a paired ratio. Printed per part: medians, ratio of the medians, the per-round paired
ratios' median and range.

Part ``gas``: issue 12's GAS workload (bench/forwarder_gas.py: 8 ranks, interleaved 64 KiB blocks
of ONE file, rank r writing blocks r, r + 8, ..., 8 MiB each, then crc32c verify of every block)
as an MPI job across the compute nodes: ``pharos run`` of ``mpiexec -hosts cn0:4,cn1:4`` (the
rig's ssh), one fio per rank. MPI rather than one fio per node, because that is how a job's ranks
reach the forwarding layer: separate processes on separate nodes, each node's mount seeing only
its own ranks' writes; the ranks are placed in blocks (Slurm's default distribution), so a node's
ranks hold adjacent blocks and its gather buffer can merge up to ranks-per-node blocks into one
target write. The file is created at its final size (as an MPI collective open would), fio ends
its write phase with an fsync (a gathered write counts once it reached the targets) and the job
must verify every byte. ``--gas on`` vs ``--gas off``: write MB/s (all ranks' bytes over the
longest rank's write phase) and the write requests issued to the targets per client write (the
daemons' GET /metrics).

Part ``masters``: issue 12's masters workload (bench/forwarder_threads.py, MASTERS_CASES): 16
fio jobs (psync) split over the compute nodes, all at once: 4 KiB random read and write (IOPS)
and 1 MiB sequential write and read (MB/s; 32 MiB files per job), every case 5 s time based (issue
12's sized 1 MiB runs take under a second here, too short on a shared box); baseline ``--masters 1 --queue
mutex`` (issue 12's baseline: one epoll master, one mutex queue set) against ``--masters 2
--queue lockfree`` and the daemon's default ``--masters 0 --queue lockfree`` (a decoder thread
per connection that serves a request itself in a sleeping worker's place), plus the daemons' CPU
time per request served (/proc and GET /status).

Every fio run is bounded (time-based or sized, fio and job timeouts); with the defaults the whole
bench takes about 12 minutes on this 2-core box. Needs root, MPICH and fio. The measured table and
why it differs from issue 12's single-host figures: docs/papers.md, "The forwarding optimisations
on the cluster rig".
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchkit import REPO, cpu_s, fio, metric_samples, rounds, scratch_dir
from forwarder_gas import BLOCK, COUNTERS, PER_RANK_MB, RANKS
from forwarder_threads import MASTERS_CASES, served, summary

sys.path.insert(0, str(REPO / "tests"))
from cluster_testkit import FWD_TARGETS, FioJob, Rig, fio_results, rig_available, running_rig, start_fio_job

MiB = 1 << 20
JOBS = 16  # part masters: fio jobs in all, as forwarder_threads.py
MASTERS_BASELINE = "--masters 1 --queue mutex"
MASTERS_VARIANTS = ["--masters 2 --queue lockfree", "--masters 0 --queue lockfree"]
TIME_BASED = ["--time_based", "--runtime=5"]
MOUNT_ARGS = ["--shm-slots", "0"]  # data on the socket, as between hosts


class Layer:
    """The rig's forwarding layer under test: restarts with a configuration's flags, and reads
    its daemons' counters (from the server node's network)."""

    def __init__(self, rig: Rig, common: list[str]) -> None:
        self.rig, self.common = rig, common
        self.http = rig.client("server")
        self.token = (rig.root / "site" / "fwd-admin.token").read_text().strip()
        self.fwd = [f.name for f in rig.of_kind("fwd")]
        self.attached = 0  # shared-memory regions the daemons attached, over every configuration

    def restart(self, flags: list[str]) -> None:
        self.attached += self.shm_attaches()
        self.rig.restart_forwarding([*self.common, *flags], MOUNT_ARGS)

    def _get(self, name: str, path: str) -> str:
        r = self.http.get(
            f"http://{self.rig.fwd_addr(name, admin=True)}{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        r.raise_for_status()
        return r.text

    def status(self, name: str) -> dict:
        return json.loads(self._get(name, "/status"))

    def writes(self) -> tuple[float, float]:
        """(client writes received, write requests issued to the targets), summed over the daemons."""
        tot = [0.0, 0.0]
        for name in self.fwd:
            vals = metric_samples(self._get(name, "/metrics"), tuple(f"{c} " for c in COUNTERS))
            tot[0] += vals[COUNTERS[0]]
            tot[1] += vals[COUNTERS[1]]
        return tot[0], tot[1]

    def cpu_served(self) -> tuple[float, int]:
        """(CPU seconds, requests served), summed over the daemons."""
        return (
            sum(cpu_s(self.pid(n)) for n in self.fwd),
            sum(served(self.status(n)) for n in self.fwd),
        )

    def pid(self, name: str) -> int:
        pid = self.rig.procs[name].pid  # nsenter and `pharos fwd` exec: pharos-fwd itself
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if comm != "pharos-fwd":
            raise RuntimeError(f"{name}: pid {pid} is {comm}, not pharos-fwd")
        return pid

    def shm_attaches(self) -> int:
        return sum(self.status(n)["counters"]["shm_attaches"] for n in self.fwd)


def fio_on_nodes(rig: Rig, dirs: dict[str, Path], jobs: int, *args: str) -> list[dict]:
    """fio with ``jobs`` jobs of ``args`` on every node of ``dirs`` at once, in its directory there
    (through that node's mount); each node's group-reported summary."""

    def one(node: str) -> dict:
        return fio(dirs[node], "--name=j", f"--numjobs={jobs}", *args, enter=rig.nodes[node].enter())

    with ThreadPoolExecutor(len(dirs)) as ex:
        return list(ex.map(one, dirs))


def mkdirs(rig: Rig, dirs: dict[str, Path]) -> None:
    """Make each node's directory of ``dirs`` on the mount, through that node's mount."""
    for node, d in dirs.items():
        r = rig.run(node, ["mkdir", "-p", str(d)])
        if r.returncode:
            raise RuntimeError(f"mkdir {d} on {node}: {r.stderr}")


def remove(rig: Rig, node: str, path: Path) -> None:
    """Remove ``path`` on the mount (through ``node``'s mount: the daemon removes the objects)."""
    r = rig.run(node, ["rm", "-rf", str(path)], timeout=300)
    if r.returncode:
        raise RuntimeError(f"rm -rf {path} on {node}: {r.stderr}")


def part_gas(a, rig: Rig, layer: Layer) -> None:
    nodes = [n.name for n in rig.compute]
    rpn = max(1, a.ranks // len(nodes))
    ranks = rpn * len(nodes)
    print(
        f"\n## GAS on/off: {ranks} ranks (MPI, {rpn} per node on {','.join(nodes)}, block placement), each "
        f"{a.mib_per_rank} MiB in interleaved {BLOCK >> 10} KiB blocks of one file, end fsync, crc32c verify; "
        f"{len(layer.fwd)} forwarding node(s), target latency {a.target_latency_ms} ms; {a.rounds} rounds",
        flush=True,
    )
    sides = ["on", "off"]
    bw: dict[str, list[float]] = {s: [] for s in sides}
    per: dict[str, list[float]] = {s: [] for s in sides}
    for r, side in rounds(a.rounds, sides):
        layer.restart(["--gas", side, *(a.gas_args.split() if side == "on" else [])])
        subprocess.run(["sync"], check=False)  # the last run's writeback is not this run's
        w0, b0 = layer.writes()
        job = FioJob(f"gas{r}{side}", "N-1", nodes, a.mib_per_rank, ranks_per_node=rpn, block_kib=BLOCK >> 10)
        start_fio_job(rig, job)
        try:
            job.exit_code = job.proc.wait(a.job_timeout)
        except subprocess.TimeoutExpired:
            job.proc.kill()
            job.exit_code = job.proc.wait()
        w1, b1 = layer.writes()
        gas = [layer.status(n)["gas"] for n in layer.fwd]  # this configuration's daemons: since their start
        totals, verified = fio_results(job)
        want = ranks * a.mib_per_rank * MiB
        if not verified or totals["bytes_written"] != want:
            raise SystemExit(
                f"gas {side} round {r}: not verified (exit {job.exit_code}, {totals}, want {want} bytes)\n"
                f"{rig.log_tail('fwd0')}"
            )
        runtime_ms = max(j["write"]["runtime"] for p in job.out.glob("fio.*.json") for j in _jobs(p))
        bw[side].append(totals["bytes_written"] / runtime_ms / 1e3)
        per[side].append((b1 - b0) / (w1 - w0))
        print(
            f"round {r} gas {side:3}: {bw[side][-1]:7.1f} MB/s, {w1 - w0:.0f} client writes -> {b1 - b0:.0f} "
            f"backend write requests ({per[side][-1]:.3f} per write), verify ok"
            + (f"; merged {sum(g['merged'] for g in gas)}, flushes {_flushes(gas)}" if side == "on" else ""),
            flush=True,
        )
        remove(rig, nodes[0], rig.mount_dir / job.job_id)
    print(_header("gas off", "gas on"))
    print(summary("write (fsync incl.)", "MB/s", bw, "off", "on"))
    print(summary("backend writes/write", "req", per, "off", "on", higher_better=False, fmt="10.3f"))


def _flushes(gas: list[dict]) -> str:
    """The daemons' GAS flushes by reason (GET /status), summed: ``reason n, ...``."""
    total: dict[str, int] = {}
    for g in gas:
        for why, n in g["flushes"].items():
            total[why] = total.get(why, 0) + n
    return ", ".join(f"{why} {n}" for why, n in total.items() if n)


def _jobs(path: Path) -> list[dict]:
    text = path.read_text()
    return json.loads(text[text.index("{") :])["jobs"]


def _header(base: str, opt: str) -> str:
    return (
        f"{'figure':26} {'unit':6} {base:>10} {opt:>10} {'ratio':>7} {'paired':>7} {'range':>11} {'gain':>7}"
        "   (ratio, paired: second/first)"
    )


def part_masters(a, rig: Rig, layer: Layer) -> None:
    nodes = [n.name for n in rig.compute]
    per_node = max(1, a.jobs // len(nodes))
    configs = [a.baseline_args, *(a.variant_args or MASTERS_VARIANTS)]
    print(
        f"\n## masters: {per_node * len(nodes)} fio jobs (psync, {per_node} per compute node, all at once, 5 s each), "
        f"baseline `{a.baseline_args}` against {', '.join(f'`{c}`' for c in configs[1:])}; {len(layer.fwd)} "
        f"forwarding node(s), target latency {a.target_latency_ms} ms; {a.rounds} rounds",
        flush=True,
    )
    files = {n: rig.mount_dir / f"files-{n}" for n in nodes}
    cases = [c for c in MASTERS_CASES if not a.cases or any(c[0].startswith(p) for p in a.cases.split(","))]
    # issue 12's sized 1 MiB cases take under a second here: time-based as the 4 KiB ones (steadier)
    cases = [(n, u, args if "--time_based" in args else [*args, *TIME_BASED], *rest) for n, u, args, *rest in cases]
    # the files the reads and random writes use, laid out once (they outlive the daemons' restarts)
    layer.restart(configs[0].split())
    mkdirs(rig, files)
    fio_on_nodes(rig, files, per_node, "--rw=write", "--bs=1M", "--size=32M")
    res = {name: {c: [] for c in configs} for name, *_ in cases}
    cpu = {name: {c: [] for c in configs} for name, *_ in cases}
    for r, c in rounds(a.rounds, configs):
        layer.restart(c.split())
        for name, _unit, args, (side, what), fresh in cases:
            subprocess.run(["sync"], check=False)
            dirs = {n: rig.mount_dir / f"w{r}-{n}" if fresh else files[n] for n in nodes}
            mkdirs(rig, dirs)
            c0, s0 = layer.cpu_served()
            jobs = fio_on_nodes(rig, dirs, per_node, *args)
            c1, s1 = layer.cpu_served()
            res[name][c].append(sum(j[side]["iops"] if what == "iops" else j[side]["bw_bytes"] / 1e6 for j in jobs))
            cpu[name][c].append((c1 - c0) / max(1, s1 - s0) * 1e6)
            if fresh:
                for n in nodes:
                    remove(rig, n, dirs[n])
        print(f"round {r} `{c}`: " + ", ".join(f"{res[n][c][-1]:.0f}" for n, *_ in cases), flush=True)
    print(_header("baseline", "variant"))
    for name, unit, *_ in cases:
        for v in configs[1:]:
            print(summary(name, unit, res[name], configs[0], v) + f"  {v}")
        for v in configs[1:]:
            print(summary("  daemon CPU/request", "µs", cpu[name], configs[0], v, higher_better=False) + f"  {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["gas", "masters", "all"], default="all")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of every configuration (default 6)")
    ap.add_argument(
        "--target-latency-ms",
        type=float,
        default=1.0,
        help="latency added to every request of every target (pharos-fwd --latency-ms), default 1 ms (a remote OST)",
    )
    ap.add_argument("--compute", type=int, default=2, help="compute nodes (default 2)")
    ap.add_argument("--fwd", type=int, default=1, help="forwarding nodes (default 1: every compute node's mount on it)")
    ap.add_argument("--ranks", type=int, default=RANKS, help=f"part gas: MPI ranks in all (default {RANKS})")
    ap.add_argument(
        "--mib-per-rank", type=int, default=PER_RANK_MB, help=f"part gas: MiB per rank (default {PER_RANK_MB})"
    )
    ap.add_argument(
        "--gas-args", default="", help="part gas: more pharos-fwd flags of the gas-on side, e.g. '--gas-flush-ms 50'"
    )
    ap.add_argument(
        "--stripe-count",
        type=int,
        default=1,
        help="targets per new file, both sides and parts (pharos-fwd --placement; default 1, as Lustre's default)",
    )
    ap.add_argument("--jobs", type=int, default=JOBS, help=f"part masters: fio jobs in all (default {JOBS})")
    ap.add_argument(
        "--baseline-args", default=MASTERS_BASELINE, help=f"part masters: baseline flags ({MASTERS_BASELINE})"
    )
    ap.add_argument(
        "--variant-args", action="append", help=f"part masters: variant flags, repeatable (default {MASTERS_VARIANTS})"
    )
    ap.add_argument("--cases", default="", help="part masters: comma list of case-name prefixes (default all)")
    ap.add_argument("--job-timeout", type=float, default=300, help="part gas: seconds per MPI job (default 300)")
    ap.add_argument("--workdir", default="/var/tmp", help="where the rig's folder goes (default /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the rig's folder (logs, storage) at the end")
    a = ap.parse_args(argv)
    why = rig_available() or (None if shutil.which("fio") else "fio not found")
    if why:
        print(f"cluster_forwarding: cannot run: {why}")
        return 2
    t0 = time.monotonic()
    with scratch_dir("pharos-cluster-fwd-", a.workdir, a.keep) as root:
        common = [f"--latency-ms=ost{i}={a.target_latency_ms:g}" for i in range(FWD_TARGETS) if a.target_latency_ms > 0]
        if a.stripe_count > 1:
            common += ["--placement", json.dumps({"stripe_count": a.stripe_count})]
        with running_rig(
            root / "rig", compute=a.compute, fwd=a.fwd, brokers=1, fwd_args=common, mount_args=MOUNT_ARGS
        ) as rig:
            layer = Layer(rig, common)
            print(f"# forwarding benches on the rig {rig.id}: {a.compute} compute, {a.fwd} forwarding node(s); {root}")
            if a.part in ("gas", "all"):
                part_gas(a, rig, layer)
            if a.part in ("masters", "all"):
                part_masters(a, rig, layer)
            attached = layer.attached + layer.shm_attaches()
            print(f"shared-memory regions the daemons attached, every configuration: {attached} (must be 0)")
        print(f"# {time.monotonic() - t0:.0f} s")
    return 0 if attached == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
