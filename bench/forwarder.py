"""Forwarding-layer benchmark: the same fio job through pharos-mount, through a plain FUSE
passthrough and on the backend directory directly, side by side in one run.

Starts one pharos-fwd (8 unlimited targets, --no-kafka: records are produced and counted
but not shipped) and one pharos-mount on free loopback ports in a tmp dir on the same file
system as the direct case, and the FUSE passthrough: Debian's bindfs with `-o direct_io`
(like the mount, no page cache on the FUSE layer; no network hop; without direct_io bindfs,
a libfuse2 program, sends 4 KiB requests) over a directory of that file system, the floor a
FUSE client can reach (issue 12, item 1). Cases (each ≤ 1 GiB of data):

* 1 MiB sequential write, 4 jobs × 256 MiB (psync), with and without end_fsync;
* 64 KiB N-1 write: 8 jobs writing interleaved blocks of one shared file, 32 MiB each (psync);
* 1 MiB sequential read of those files;
* 4 KiB random read IOPS, 4 jobs, 5 s time-based;
* file creates per second (open O_CREAT|O_EXCL + close, 2 000 files, one thread).

Prints MB/s, IOPS or ops/s of each column and the ratios mount / passthrough (target ≥ 0.90
for the 1 MiB cases) and mount / direct. Each fio case runs ROUNDS times, rotating and
alternating the order, and the median is reported, with the median of the per-round ratios
(each round's runs are adjacent, so a noisy neighbour tends to slow all of them: the paired
ratio is the steadier figure) and their range. Every run starts after `sync` and a drop of
the page cache (`echo 3 > /proc/sys/vm/drop_caches`), so no column reads what another wrote
into the cache and writeback of an earlier run does not land in the next one.
A second table gives the CPU seconds per GiB moved of each FUSE side's own processes
(pharos-fwd + pharos-mount, or bindfs) in the 1 MiB cases: on a shared, loaded machine the
steadier measure of what a data path costs (bindfs has one thread, so its throughput suffers
most when the cores are busy).

Usage: uv run python bench/forwarder.py [--rounds 3] [--keep] [--bin DIR] [--cases PREFIX,...]
                                         [--baseline-bin DIR]
                                         [--baseline-mount-args FLAGS]
(--baseline-bin: a second stack from older binaries in the same rounds, extra columns:
its ratio to the passthrough and the paired ratio mount / baseline with its range;
--baseline-mount-args: that second stack's mount gets these flags, from --baseline-bin or this
build, e.g. "--parallel-writes false" for the N-1 case's baseline.)
(root, /dev/fuse, fio, bindfs)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from benchkit import (
    REPO,
    bindfs_pid,
    drop_caches,
    fio,
    rounds,
    scratch_dir,
    start_passthrough,
    start_stack,
    stop_all,
)

BIN = REPO / "target" / "release"


def creates(directory: Path, n: int = 2000) -> float:
    d = directory / f"creates-{time.monotonic_ns()}"
    d.mkdir()
    t0 = time.perf_counter()
    for i in range(n):
        os.close(os.open(d / f"f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    took = time.perf_counter() - t0
    shutil.rmtree(d)
    return n / took


CASES = [
    # name, unit, fio args (None = creates), how to read the figure
    ("1MiB seq write", "MB/s", ["--name=sw", "--rw=write", "--bs=1M", "--numjobs=4", "--size=256M"], "write_bw"),
    (
        "1MiB seq write+fsync",
        "MB/s",
        ["--name=sw", "--rw=write", "--bs=1M", "--numjobs=4", "--size=256M", "--end_fsync=1"],
        "write_bw",
    ),
    (
        # N-1: 8 ranks write interleaved 64 KiB blocks of one shared file (the GAS bench's pattern),
        # the case --parallel-writes is for (FUSE otherwise passes one write per file at a time).
        "64KiB N-1 write",
        "MB/s",
        [
            "--name=n1",
            "--filename=shared",
            "--rw=write:448k",
            "--bs=64k",
            "--numjobs=8",
            "--offset_increment=64k",
            "--size=256M",
            "--io_size=32M",
        ],
        "write_bw",
    ),
    ("1MiB seq read", "MB/s", ["--name=sw", "--rw=read", "--bs=1M", "--numjobs=4", "--size=256M"], "read_bw"),
    (
        "4KiB rand read",
        "IOPS",
        ["--name=sw", "--rw=randread", "--bs=4k", "--numjobs=4", "--size=256M", "--time_based", "--runtime=5"],
        "read_iops",
    ),
    ("creates", "ops/s", None, "creates"),
]


def figure(job: dict, how: str) -> float:
    if how == "write_bw":
        return job["write"]["bw_bytes"] / 1e6
    if how == "read_bw":
        return job["read"]["bw_bytes"] / 1e6
    return job["read"]["iops"]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of every thread of `pids` so far (/proc/PID/task/*/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        for t in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                f = t.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            total += int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
    return total / tick


def paired(res: dict[str, list[float]], side: str, ref: str) -> list[float]:
    """Per-round ratios side / ref."""
    return [m / d for m, d in zip(res[side], res[ref], strict=True)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the tmp dir")
    ap.add_argument("--workdir", default="/var/tmp", help="parent of the tmp dir (same fs for both columns)")
    ap.add_argument("--bin", type=Path, default=None, help="use pharos-fwd/pharos-mount from this dir (no build)")
    ap.add_argument(
        "--baseline-bin",
        type=Path,
        default=None,
        help="also run a second stack from these binaries (e.g. a copy of an older build) in the same rounds",
    )
    ap.add_argument(
        "--baseline-mount-args",
        default="",
        help="flags of the second stack's mount (with this build unless --baseline-bin), e.g. '--parallel-writes false'",
    )
    ap.add_argument("--cases", default="", help="comma list of case-name prefixes to run (default: all)")
    a = ap.parse_args()
    global BIN
    if a.bin is not None:
        BIN = a.bin.resolve()
    else:
        subprocess.run(["cargo", "build", "--release", "-p", "pharos-fwd", "-p", "pharos-mount"], cwd=REPO, check=True)
    with scratch_dir("pharos-fwd-bench-", a.workdir, a.keep) as root:
        procs: list[subprocess.Popen] = []
        mounts: list[Path] = []
        try:
            direct = root / "direct"
            direct.mkdir()
            bases = {"mount": start_stack(BIN, root, "", procs)}
            mounts.append(bases["mount"])
            # The processes whose CPU time a side costs (the direct side: none but fio's own).
            cpu_pids = {"mount": [p.pid for p in procs[-2:]]}
            if a.baseline_bin is not None or a.baseline_mount_args:
                base_bin = a.baseline_bin.resolve() if a.baseline_bin is not None else BIN
                bases["baseline"] = start_stack(base_bin, root, "-base", procs, a.baseline_mount_args.split())
                mounts.append(bases["baseline"])
                cpu_pids["baseline"] = [p.pid for p in procs[-2:]]
            bases["passthrough"] = start_passthrough(root, mounts)
            pt_pid = bindfs_pid(bases["passthrough"])
            if pt_pid is not None:
                cpu_pids["passthrough"] = [pt_pid]
            cpu_table: list[str] = []
            bases["direct"] = direct
            sides = list(bases)
            print(f"# pharos forwarder bench: {a.rounds} rounds (order rotates), medians; tmp {root}")
            print("# m/pt: mount / passthrough (bindfs -o direct_io), paired = median of per-round ratios")
            if "baseline" in bases:
                print("# baseline: the --baseline-bin stack; m/base: mount / baseline, paired, and its range")
            head = (
                f"{'case':24} {'unit':6} {'mount':>10} {'passthru':>10} {'direct':>10} {'m/pt':>6} {'paired':>7} "
                f"{'range':>11} {'m/direct':>8} {'paired':>7} {'range':>11}"
            )
            if "baseline" in bases:
                head += f" {'baseline':>10} {'b/pt':>6} {'paired':>7} {'m/base':>7} {'range':>11}"
            print(head)
            wanted = [c.strip() for c in a.cases.split(",") if c.strip()]
            for name, unit, args, how in CASES:
                if wanted and not any(name.startswith(w) for w in wanted):
                    continue
                res: dict[str, list[float]] = {s: [] for s in sides}
                cpu: dict[str, list[float]] = {s: [] for s in cpu_pids}
                for r, side in rounds(a.rounds, sides):
                    base = bases[side]
                    drop_caches()
                    if args is None:
                        res[side].append(creates(base))
                        continue
                    # Writes: fresh files every round (allocation, not overwrite, on every side);
                    # reads share one laid-out file set per side.
                    d = base / (f"w{r}" if how == "write_bw" else "reads")
                    d.mkdir(exist_ok=True)
                    c0 = cpu_seconds(cpu_pids.get(side, []))
                    job = fio(d, *args)
                    moved = job["write"]["io_bytes"] + job["read"]["io_bytes"]
                    if side in cpu and how != "read_iops" and moved:
                        cpu[side].append((cpu_seconds(cpu_pids[side]) - c0) / (moved / 2**30))
                    res[side].append(figure(job, how))
                    if how == "write_bw":
                        shutil.rmtree(d)
                med = {s: statistics.median(v) for s, v in res.items()}
                pt, dr = paired(res, "mount", "passthrough"), paired(res, "mount", "direct")
                line = (
                    f"{name:24} {unit:6} {med['mount']:10.1f} {med['passthrough']:10.1f} {med['direct']:10.1f} "
                    f"{med['mount'] / med['passthrough']:6.2f} {statistics.median(pt):7.2f} {min(pt):5.2f}-{max(pt):<5.2f} "
                    f"{med['mount'] / med['direct']:8.2f} {statistics.median(dr):7.2f} {min(dr):5.2f}-{max(dr):<5.2f}"
                )
                if "baseline" in med:
                    bp, mb = paired(res, "baseline", "passthrough"), paired(res, "mount", "baseline")
                    line += (
                        f" {med['baseline']:10.1f} {med['baseline'] / med['passthrough']:6.2f} {statistics.median(bp):7.2f}"
                        f" {statistics.median(mb):7.2f} {min(mb):5.2f}-{max(mb):<5.2f}"
                    )
                print(line, flush=True)
                if all(cpu.get(k) for k in ("mount", "passthrough")):
                    cm = {k: statistics.median(v) for k, v in cpu.items() if v}
                    cp = paired(cpu, "mount", "passthrough")
                    row = f"{name:24} {cm['mount']:8.2f} {cm['passthrough']:8.2f} {statistics.median(cp):7.2f}"
                    row += f" {min(cp):5.2f}-{max(cp):<5.2f}"
                    if "baseline" in cm:
                        row += f" {cm['baseline']:8.2f} {statistics.median(paired(cpu, 'mount', 'baseline')):7.2f}"
                    cpu_table.append(row)
            if cpu_table:
                print(
                    "# CPU seconds per GiB moved of the FUSE side's processes (pharos-fwd + pharos-mount; bindfs), medians"
                )
                print(
                    f"{'case':24} {'mount':>8} {'passthru':>8} {'m/pt':>7} {'range':>11} {'baseline':>8} {'m/base':>7}"
                )
                print("\n".join(cpu_table))
            return 0
        finally:
            stop_all(procs, mounts)


if __name__ == "__main__":
    raise SystemExit(main())
