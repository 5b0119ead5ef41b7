"""Forwarding daemon threading benchmark (issue 12, items 2 and 5), baseline and optimised
daemons side by side in one run, each with its own real pharos-mount, fio through the mounts.

Part ``masters`` (item 2, the LWFS master/slave paper): baseline ``--masters 1 --queue mutex``
(one master thread decodes every connection's requests into one mutex-protected queue set)
against each optimised variant (throughput, and the daemon's CPU time per request served, read
from /proc: the steadier figure on a shared box), by default ``--masters 0 --queue lockfree`` (a decoder thread
per connection that serves a request itself in a sleeping worker's place: the daemon's default), the same with
``--serve-inline false`` (the paper's split alone: decoders only decode) and ``--masters 2 --queue lockfree``
(two epoll masters),
all with crossbeam lock-free queues. 16 concurrent fio jobs (psync, so 16 connections busy at
once): 4 KiB random read and write (IOPS, 5 s time based) and 1 MiB sequential write and read
(MB/s, 16 × 32 MiB).

Part ``raas`` (item 5, GVDS RAAS): ``--scheduler weights`` (fixed weights 4,2,1) against
``--scheduler raas``, both ``--workers W``: a 1 MiB streaming writer (fio, J jobs, time based,
more requests in flight than workers) and beside it, on the same mount, a file-create loop
(open O_CREAT|O_EXCL + close, one thread, each op timed). Prints the create p50/p99 latency and
the writer's MB/s of both, the ratios raas/weights.

Both parts alternate the stacks every round (order flips each round; the box is shared and
noisy), report medians, the ratio of medians, the per-round paired ratios' median and range.

Usage: uv run python bench/forwarder_threads.py [--part masters|raas|all] [--rounds 3]
       [--baseline-args FLAGS] [--optimised-args FLAGS ...] [--cases PREFIX,..]
       [--workers 16] [--writer-jobs 24] [--target-mbs 40] [--bin DIR] [--keep]   (root, /dev/fuse, fio)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

from benchkit import REPO, auth_flags, cpu_s, fio, rounds, scratch_dir, start_ready, stop_all
from forwarder_testkit import port_of


class Stack:
    """One pharos-fwd (8 unlimited targets, no Kafka) with `fwd_args` and one pharos-mount."""

    def __init__(self, bin_dir: Path, root: Path, tag: str, fwd_args: list[str], mount_threads: int = 16):
        self.tag, self.procs = tag, []
        auth = auth_flags(root)
        self.mnt = root / f"mnt-{tag}"
        self.mnt.mkdir()
        be = root / f"be-{tag}"
        fwd_argv = [
            str(bin_dir / "pharos-fwd"),
            *("--node-name", "fwd0", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"),
            *("--mdt", str(be / "mdt"), "--targets-root", str(be), "--target-count", "8", "--no-kafka"),
            *auth,
            *fwd_args,
        ]
        bound = start_ready(fwd_argv, root, f"fwd-{tag}", self.procs)
        port, self.admin = port_of(bound["listen"]), f"http://{bound['admin']}"
        mount_argv = [
            str(bin_dir / "pharos-mount"),
            *("--mountpoint", str(self.mnt), "--fwd", f"fwd0=127.0.0.1:{port}"),
            *("--admin", "127.0.0.1:0", "--threads", str(mount_threads)),
            *auth,
        ]
        start_ready(mount_argv, root, f"mnt-{tag}", self.procs)

    def cpu_s(self) -> float:
        """CPU time the daemon used so far (user + system), seconds."""
        return cpu_s(self.procs[0].pid)

    def served(self) -> int:
        return served(self.status())

    def status(self) -> dict:
        import urllib.request

        with urllib.request.urlopen(self.admin + "/status", timeout=10) as r:
            return json.loads(r.read())

    def close(self) -> None:
        stop_all(self.procs, [self.mnt])


def served(status: dict) -> int:
    """Requests a daemon served, from its GET /status."""
    c = status["counters"]
    return c["served_metadata"] + c["served_small"] + c["served_large"]


def summary(
    name: str,
    unit: str,
    res: dict[str, list[float]],
    base: str,
    opt: str,
    higher_better: bool = True,
    fmt: str = "10.1f",
) -> str:
    """One table row: the medians of ``base`` and ``opt`` (in ``fmt``), the ratio of the medians,
    the median and range of the per-round paired ratios opt/base, and the gain."""
    mb, mo = statistics.median(res[base]), statistics.median(res[opt])
    paired = [o / b for o, b in zip(res[opt], res[base], strict=True) if b > 0]
    ratio = mo / mb if mb else float("nan")
    gain = (ratio - 1) * 100 if higher_better else (1 - ratio) * 100
    return (
        f"{name:26} {unit:6} {mb:{fmt}} {mo:{fmt}} {ratio:7.3f} {statistics.median(paired):7.3f} "
        f"{min(paired):5.3f}-{max(paired):<5.3f} {gain:+6.1f}%"
    )


# Optimised variants of part masters: one decoder thread per connection (each connection its
# own master, the daemon's default) and two epoll masters, both with the lock-free queues.
DEFAULT_OPTIMISED = [
    "--masters 0 --queue lockfree",
    "--masters 0 --queue lockfree --serve-inline false",
    "--masters 2 --queue lockfree",
]

MASTERS_CASES = [
    # name, unit, fio args, figure, fresh dir per run
    (
        "4KiB randread 16 jobs",
        "IOPS",
        ["--rw=randread", "--bs=4k", "--size=16M", "--time_based", "--runtime=5"],
        ("read", "iops"),
        False,
    ),
    (
        "4KiB randwrite 16 jobs",
        "IOPS",
        ["--rw=randwrite", "--bs=4k", "--size=16M", "--time_based", "--runtime=5"],
        ("write", "iops"),
        False,
    ),
    ("1MiB write 16 jobs", "MB/s", ["--rw=write", "--bs=1M", "--size=32M"], ("write", "bw"), True),
    ("1MiB read 16 jobs", "MB/s", ["--rw=read", "--bs=1M", "--size=32M"], ("read", "bw"), False),
]


def part_masters(a, root: Path) -> None:
    variants = a.optimised_args or DEFAULT_OPTIMISED
    stacks: dict[str, Stack] = {}
    try:
        stacks["baseline"] = Stack(a.bin, root, "m-base", a.baseline_args.split())
        for i, v in enumerate(variants):
            stacks[v] = Stack(a.bin, root, f"m-opt{i}", v.split())
        print(
            f"\n## masters/queues: baseline `{a.baseline_args}` against each optimised variant; 16 fio jobs "
            f"(psync) through each daemon's own mount; {a.rounds} rounds (order rotates), medians; ratio = "
            "optimised/baseline of the medians, paired = median (range) of the per-round ratios"
        )
        print(
            f"{'case':26} {'unit':6} {'baseline':>10} {'optimised':>10} {'ratio':>7} {'paired':>7} {'range':>11} "
            f"{'gain':>7}  variant"
        )
        # the files the reads and random writes use, laid out once per stack
        for s in stacks.values():
            d = s.mnt / "files"
            d.mkdir()
            fio(d, "--name=j", "--numjobs=16", "--rw=write", "--bs=1M", "--size=32M")
        sides = list(stacks)
        for name, unit, args, (side, what), fresh in MASTERS_CASES:
            if a.cases and not any(name.startswith(c) for c in a.cases.split(",")):
                continue
            res: dict[str, list[float]] = {k: [] for k in stacks}
            cpu: dict[str, list[float]] = {k: [] for k in stacks}
            for r, k in rounds(a.rounds, sides):
                s = stacks[k]
                subprocess.run(["sync"], check=False)
                d = s.mnt / f"w{r}" if fresh else s.mnt / "files"
                d.mkdir(exist_ok=True)
                c0, n0 = s.cpu_s(), s.served()
                job = fio(d, "--name=j", "--numjobs=16", *args)
                res[k].append(job[side]["iops"] if what == "iops" else job[side]["bw_bytes"] / 1e6)
                cpu[k].append((s.cpu_s() - c0) / max(1, s.served() - n0) * 1e6)
                if fresh:
                    shutil.rmtree(d)
            for v in variants:
                print(summary(name, unit, res, "baseline", v) + f"  {v}", flush=True)
            # The daemon's own CPU per request: steadier than throughput on a shared box.
            for v in variants:
                line = summary("  daemon CPU/request", "µs", cpu, "baseline", v, higher_better=False)
                print(line + f"  {v}", flush=True)
    finally:
        for s in stacks.values():
            s.close()


def create_loop(d: Path, stop: threading.Event, lat: list[float]) -> None:
    i = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        os.close(os.open(d / f"f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        lat.append(time.perf_counter() - t0)
        i += 1


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p * len(s)) - 1))]


def part_raas(a, root: Path) -> None:
    # Storage-bound targets (a token bucket each, like HDD OSTs): a write holds its worker for
    # tens of ms, so the workers, not the CPU, are the resource the classes share.
    common = ["--workers", str(a.workers)] + [f"--limit=ost{i}={a.target_mbs}" for i in range(8)]
    raas = ["--scheduler", "raas", "--raas-min", a.raas_min, "--raas-delay-ms", a.raas_delay_ms]
    stacks: dict[str, Stack] = {}
    try:
        threads = a.writer_jobs + 4
        stacks["weights"] = Stack(a.bin, root, "r-w", [*common, "--scheduler", "weights"], mount_threads=threads)
        stacks["raas"] = Stack(a.bin, root, "r-raas", [*common, *raas], mount_threads=threads)
        print(
            f"\n## thread allocation: --scheduler weights (4,2,1) vs raas (min {a.raas_min}, acceptable "
            f"{a.raas_delay_ms} ms), --workers {a.workers}, 8 targets limited to {a.target_mbs} MB/s each; a 1 MiB "
            f"writer ({a.writer_jobs} fio jobs, {a.runtime} s) beside a create loop on the same mount; {a.rounds} "
            "rounds, medians"
        )
        res: dict[str, dict[str, list[float]]] = {m: {k: [] for k in stacks} for m in ("p99", "p50", "mbs", "n")}
        for r in range(a.rounds):
            order = list(stacks) if r % 2 == 0 else list(reversed(stacks))
            mid: dict[str, dict] = {}
            for k in order:
                s = stacks[k]
                subprocess.run(["sync"], check=False)
                wd, cd = s.mnt / f"w{r}", s.mnt / f"c{r}"
                wd.mkdir()
                cd.mkdir()
                stop, lat = threading.Event(), []
                out: dict = {}
                writer = threading.Thread(
                    target=lambda wd=wd, out=out: out.update(
                        fio(
                            wd,
                            "--name=w",
                            f"--numjobs={a.writer_jobs}",
                            "--rw=write",
                            "--bs=1M",
                            "--size=64M",
                            "--time_based",
                            f"--runtime={a.runtime}",
                        )
                    )
                )
                writer.start()
                time.sleep(1.0)  # the writer runs at full speed
                creator = threading.Thread(target=create_loop, args=(cd, stop, lat))
                creator.start()
                time.sleep((a.runtime - 2.0) / 2)
                mid[k] = s.status()["threads"]  # the classes' delays and workers under load
                time.sleep((a.runtime - 2.0) / 2)
                stop.set()
                creator.join()
                writer.join()
                res["p99"][k].append(pct(lat, 0.99) * 1e3)
                res["p50"][k].append(pct(lat, 0.50) * 1e3)
                res["n"][k].append(len(lat))
                res["mbs"][k].append(out["write"]["bw_bytes"] / 1e6)
                shutil.rmtree(wd)
                shutil.rmtree(cd)
            for k, st in mid.items():
                print(
                    f"  round {r}, mid-run, {k:7}: workers (metadata, small, large, shared) {st['class_workers']}, "
                    f"queue delay ms (last cycle) {[round(x, 2) for x in st['class_delay_ms']]}",
                    flush=True,
                )
        print(
            f"{'figure':26} {'unit':6} {'weights':>10} {'raas':>10} {'ratio':>7} {'paired':>7} {'range':>11} "
            f"{'gain':>7}"
        )
        print(summary("create latency p99", "ms", res["p99"], "weights", "raas", higher_better=False))
        print(summary("create latency p50", "ms", res["p50"], "weights", "raas", higher_better=False))
        print(summary("creates timed", "ops", res["n"], "weights", "raas"))
        print(summary("1MiB writer", "MB/s", res["mbs"], "weights", "raas"))
        p99 = statistics.median(res["p99"]["raas"]) / statistics.median(res["p99"]["weights"])
        keep = statistics.median(res["mbs"]["raas"]) / statistics.median(res["mbs"]["weights"])
        print(
            f"create p99 raas/weights {p99:.3f} (must be < 1); writer throughput raas/weights {keep:.3f} "
            f"(must be >= 0.90): {'met' if p99 < 1 and keep >= 0.9 else 'NOT met'}"
        )
    finally:
        for s in stacks.values():
            s.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["masters", "raas", "all"], default="all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-args", default="--masters 1 --queue mutex", help="baseline daemon flags (masters)")
    ap.add_argument(
        "--optimised-args",
        action="append",
        help=f"optimised daemon flags, repeatable (part masters; default {DEFAULT_OPTIMISED})",
    )
    ap.add_argument("--cases", default="", help="comma list of case-name prefixes (part masters; default all)")
    ap.add_argument("--workers", type=int, default=16, help="workers of both daemons (part raas)")
    ap.add_argument("--writer-jobs", type=int, default=24, help="fio jobs of the 1 MiB writer (part raas)")
    ap.add_argument("--target-mbs", type=float, default=40, help="token-bucket limit of each target (part raas)")
    ap.add_argument("--runtime", type=int, default=8, help="writer seconds per run (part raas)")
    ap.add_argument("--raas-min", default="1,1,1")
    ap.add_argument("--raas-delay-ms", default="1,5,50")
    ap.add_argument("--keep", action="store_true", help="keep the tmp dir")
    ap.add_argument("--workdir", default="/var/tmp")
    ap.add_argument("--bin", type=Path, default=None, help="pharos-fwd/pharos-mount from this dir (no build)")
    a = ap.parse_args()
    if a.bin is None:
        subprocess.run(["cargo", "build", "--release", "-p", "pharos-fwd", "-p", "pharos-mount"], cwd=REPO, check=True)
        a.bin = REPO / "target" / "release"
    a.bin = a.bin.resolve()
    with scratch_dir("pharos-fwd-threads-", a.workdir, a.keep) as root:
        print(f"# pharos-fwd threading bench; tmp {root}")
        if a.part in ("masters", "all"):
            part_masters(a, root)
        if a.part in ("raas", "all"):
            part_raas(a, root)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
