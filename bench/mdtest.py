"""Metadata benchmark (issue 29): mdtest's file creation, stat, read (open/close) and removal
rates through pharos-mount against the FUSE passthrough floor, Debian's `bindfs -o direct_io`,
and the local directory for reference, all started in one run; then `ls -l` of a large
directory on each side.

mdtest (part of IOR, https://github.com/hpc/ior) is fetched and built outside the repository,
as IOR's own README says; this bench takes the path of the built `mdtest` binary (--mdtest,
required) and runs it under the mpiexec of the MPI it is linked with (found with ldd: MPICH's
mpiexec.mpich, Debian's default mpicc; Open MPI's mpiexec gets --allow-run-as-root and
--oversubscribe), or under --mpiexec. As root (FUSE, dropping the page cache):

    uv run python bench/mdtest.py --mdtest PATH [--ranks 2,8] [--files-per-rank 500] [--rounds 3]
                                  [--ls-files 200000] [--ls-procs 4] [--ls-rounds 1]
                                  [--mount-args FLAGS] [--no-local] [--bin DIR] [--workdir /var/tmp]
                                  [--backing ext4|workdir]
                                  [--timeout 900] [--keep] [--json FILE]

Sides: one pharos-fwd (8 targets, --no-kafka) and one pharos-mount (with --mount-args, e.g.
"--attr-ttl-ms 1000"), bindfs -o direct_io of a directory, and a plain directory ("local"),
each on a fresh journaled ext4 of its own (--backing ext4, the default: a loop-mounted sparse
image in a tmp dir under --workdir; ext4 without a journal, as some VMs' root file system is,
skips inodes freed in the last minutes when it allocates one, so one side's removals made the
next side's creates up to 4x slower), or all in the tmp dir (--backing workdir). bindfs keeps
libfuse's default 1 s entry and attribute timeouts; the mount caches entries and attributes
for its --attr-ttl-ms (default 10 s), with the daemon's invalidations.

Part 1, for each rank count R of --ranks (0 skips): `mdtest -F -u -n N -d DIR` (files only, a
directory per rank, N = --files-per-rank) with R ranks, --rounds times per side, the order of the sides
rotating and alternating from round to round (benchkit.rounds), each run after `sync` and a drop
of the page cache. The figure of a phase is the Mean of mdtest's "SUMMARY rate" table (ops/s; one
iteration, so the aggregate rate of the R ranks). Prints, per R and phase, the median of each
side, mount / bindfs of the medians, and the paired ratio (median of the per-round ratios, each
round's runs being adjacent) with its range; then one summary line per R (the paired medians;
the target of issue 29 is ≥ 0.5 for creation, stat and removal).

Part 2 (--ls-files N, 0 skips): N empty files made in one directory on each side through that
side (O_CREAT|O_EXCL + close, --ls-procs processes, a progress line per 10 %, cut at --timeout
seconds per side: then the count made is printed and timed), then `ls -l DIR > /dev/null` timed
cold (after a drop of the page cache) and warm (right after), --ls-rounds times (default 1: through
the mount, without attribute caching, ls -l of 200,000 files takes minutes), medians and the
ratios mount / bindfs (a ratio above 1: the mount is slower).

Every mdtest, file making and ls is bounded by --timeout; daemons are stopped, mounts unmounted
and the tmp dir removed at the end (unless --keep), also on Ctrl-C, SIGTERM or a failure.
Note: R ranks, the FUSE side's processes and the kernel share the machine's cores; MPI ranks
spin in barriers while waiting for the slowest rank, so with more ranks than cores the rates are
partly CPU-bound (the paired ratio is the steadier figure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from benchkit import REPO, drop_caches, fresh_ext4, rounds, scratch_dir, start_passthrough, start_stack, stop_all

#: mdtest phases reported (the names of its SUMMARY rate table), short names for the summary.
PHASES = {"File creation": "create", "File stat": "stat", "File read": "read", "File removal": "remove"}
#: A row of mdtest's SUMMARY rate table: operation, Max, Min, Mean, Std Dev.
ROW = re.compile(r"^\s*(\w[\w ]*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
#: Issue 29's target: creation, stat and removal through the mount ≥ this fraction of bindfs.
TARGET = 0.5


def bounded(cmd: list[str], timeout: float, what: str, *, exit_on_timeout: bool = True, **kw) -> str | None:
    """Run ``cmd`` in its own process group with output captured; kill the whole group (mpiexec
    and its ranks) on timeout or interruption; exit on a failure, and on a timeout unless
    ``exit_on_timeout`` is false (then None). Returns stdout + stderr."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)
    try:
        out, _ = p.communicate(timeout=timeout)
    except BaseException as e:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            if not exit_on_timeout:
                return None
            sys.exit(f"{what}: no end after {timeout:.0f} s (--timeout): {' '.join(cmd)}")
        raise
    if p.returncode:
        sys.exit(f"{what} failed ({p.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
    return out


def pick_mpiexec(mdtest: Path, given: str | None) -> list[str]:
    """The mpiexec command prefix: ``given``, else the one of the MPI ``mdtest`` is linked with
    (ldd), else plain ``mpiexec``; Open MPI's gets the flags to run as root on few cores."""
    exe = given
    if exe is None:
        libs = subprocess.run(["ldd", str(mdtest)], capture_output=True, text=True, timeout=30).stdout
        if "libmpich" in libs:
            exe = "mpiexec.mpich"
        elif "libmpi.so" in libs:
            exe = "mpiexec.openmpi"
        if exe is None or shutil.which(exe) is None:
            exe = "mpiexec"
    path = shutil.which(exe)
    if path is None:
        sys.exit(f"{exe} not found: the mpiexec of the MPI mdtest was built with (--mpiexec)")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    if "Open MPI" in version.stdout + version.stderr or "OpenRTE" in version.stdout + version.stderr:
        return [path, "--allow-run-as-root", "--oversubscribe"]
    return [path]


def parse_rates(out: str) -> dict[str, float]:
    """The Mean ops/s of each phase of mdtest's SUMMARY rate table (phases at 0 left out)."""
    rates: dict[str, float] = {}
    inside = False
    for line in out.splitlines():
        if line.startswith("SUMMARY rate"):
            inside = True
        elif inside and line.startswith(("SUMMARY", "--")):
            break
        elif inside and (m := ROW.match(line)) and m[1] in PHASES and float(m[4]) > 0:
            rates[PHASES[m[1]]] = float(m[4])
    return rates


def run_mdtest(mpiexec: list[str], mdtest: Path, ranks: int, n: int, d: Path, timeout: float) -> dict[str, float]:
    cmd = [*mpiexec, "-n", str(ranks), str(mdtest), "-F", "-u", "-n", str(n), "-d", str(d)]
    out = bounded(cmd, timeout, "mdtest", cwd=d.parent)
    rates = parse_rates(out)
    if "create" not in rates:
        sys.exit(f"no SUMMARY rate table in mdtest's output: {' '.join(cmd)}\n{out[-3000:]}")
    shutil.rmtree(d, ignore_errors=True)
    return rates


def touch_range(d: str, lo: int, hi: int, deadline: float) -> int:
    """Make files d/f<lo>..f<hi-1> (O_CREAT|O_EXCL); stops at ``deadline``; how many were made."""
    for i in range(lo, hi):
        if time.monotonic() > deadline:
            return i - lo
        os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    return hi - lo


def make_files(d: Path, n: int, procs: int, timeout: float, side: str) -> tuple[int, float]:
    """``n`` empty files in ``d`` by ``procs`` processes, a line per 10 %; (made, seconds)."""
    d.mkdir()
    chunk = max(100, min(2000, n // (procs * 20) or 1))
    t0 = time.monotonic()
    deadline = t0 + timeout
    ex = ProcessPoolExecutor(procs)
    made, step = 0, max(1, n // 10)
    try:
        futs = [ex.submit(touch_range, str(d), lo, min(lo + chunk, n), deadline) for lo in range(0, n, chunk)]
        for fut in as_completed(futs, timeout=timeout + 120):
            before, made = made, made + fut.result()
            if made // step > before // step or made == n:
                took = time.monotonic() - t0
                print(
                    f"  {side}: {made} of {n} files ({100 * made // n}%) in {took:.1f} s, {made / took:.0f}/s",
                    flush=True,
                )
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
    took = time.monotonic() - t0
    if made < n:
        print(f"  {side}: cut at --timeout {timeout:.0f} s: {made} of {n} files made", flush=True)
    return made, took


def time_ls(d: Path, timeout: float) -> float:
    """Seconds of ``ls -l d > /dev/null``; inf when cut at ``timeout``."""
    t0 = time.perf_counter()
    if bounded(["sh", "-c", 'ls -l "$1" > /dev/null', "ls", str(d)], timeout, "ls -l", exit_on_timeout=False) is None:
        print(f"  ls -l {d}: cut at --timeout {timeout:.0f} s", flush=True)
        return math.inf
    return time.perf_counter() - t0


def spread(xs: list[float]) -> str:
    return f"{min(xs):5.3f}-{max(xs):<5.3f}"


def part_mdtest(a: argparse.Namespace, mpiexec: list[str], bases: dict[str, Path], out: dict) -> list[str]:
    """Part 1; the summary lines."""
    sides = list(bases)
    local = "local" in bases
    print(f"# mdtest -F -u -n {a.files_per_rank} (per rank), {a.rounds} rounds (order rotates), ops/s medians")
    print("# m/b: mount / bindfs of the medians; paired: median of the per-round ratios, and their range")
    print(
        f"{'ranks':>5} {'phase':8} {'mount':>10} {'bindfs':>10} {'local' if local else '':>10} {'m/b':>6} "
        f"{'paired':>7} {'range':>13}",
        flush=True,
    )
    summary = []
    for ranks in a.ranks:
        res: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
        for r, side in rounds(a.rounds, sides):
            drop_caches()
            d = bases[side] / f"mdtest-{ranks}r-{r}"
            res[side].append(run_mdtest(mpiexec, a.mdtest, ranks, a.files_per_rank, d, a.timeout))
        figures = {}
        for phase in PHASES.values():
            if not all(phase in x for runs in res.values() for x in runs):
                continue
            per = {s: [x[phase] for x in runs] for s, runs in res.items()}
            med = {s: statistics.median(v) for s, v in per.items()}
            pr = [m / b for m, b in zip(per["mount"], per["bindfs"], strict=True)]
            figures[phase] = {
                "rounds": per,
                "median": med,
                "ratio": med["mount"] / med["bindfs"],
                "paired": statistics.median(pr),
                "paired_range": [min(pr), max(pr)],
            }
            loc = f"{med['local']:10.0f}" if local else f"{'':10}"
            print(
                f"{ranks:>5} {phase:8} {med['mount']:10.0f} {med['bindfs']:10.0f} {loc} "
                f"{med['mount'] / med['bindfs']:6.3f} {statistics.median(pr):7.3f} {spread(pr)}",
                flush=True,
            )
        out["mdtest"][str(ranks)] = figures
        got = {p: figures[p]["paired"] for p in ("create", "stat", "remove") if p in figures}
        short = all(v >= TARGET for v in got.values())
        summary.append(
            f"mdtest {ranks} ranks: "
            + ", ".join(f"{p} {v:.3f}" for p, v in got.items())
            + f" (mount/bindfs, paired medians; target ≥ {TARGET}: {'met' if short else 'not met'})"
        )
    return summary


def part_ls(a: argparse.Namespace, bases: dict[str, Path], out: dict) -> list[str]:
    """Part 2; the summary line."""
    sides = list(bases)
    print(f"# ls -l of a directory of {a.ls_files} empty files: making them ({a.ls_procs} processes per side)")
    made: dict[str, dict] = {}
    for side in sides:
        drop_caches()
        n, took = make_files(bases[side] / "ls", a.ls_files, a.ls_procs, a.timeout, side)
        made[side] = {"files": n, "make_s": took, "make_per_s": n / took if took else 0.0, "cold_s": [], "warm_s": []}
    for _, side in rounds(a.ls_rounds, sides):
        drop_caches()
        made[side]["cold_s"].append(time_ls(bases[side] / "ls", a.timeout))
        made[side]["warm_s"].append(time_ls(bases[side] / "ls", a.timeout))
    print(f"# {a.ls_rounds} round(s) (order rotates), medians; m/b: mount / bindfs time (above 1: the mount is slower)")
    print(f"{'side':8} {'files':>7} {'make s':>8} {'files/s':>8} {'cold s':>8} {'warm s':>8}")
    for side, m in made.items():
        m["cold_median_s"], m["warm_median_s"] = statistics.median(m["cold_s"]), statistics.median(m["warm_s"])
        print(
            f"{side:8} {m['files']:7d} {m['make_s']:8.1f} {m['make_per_s']:8.0f} {m['cold_median_s']:8.3f} "
            f"{m['warm_median_s']:8.3f}"
        )
    mo, bi = made["mount"], made["bindfs"]
    ratios = {k: mo[f"{k}_median_s"] / bi[f"{k}_median_s"] for k in ("cold", "warm")}
    ratios["make"] = mo["make_s"] / bi["make_s"]
    out["ls"] = {"sides": made, "mount_over_bindfs": ratios}
    line = f"ls -l {a.ls_files} files: mount / bindfs time cold {ratios['cold']:.2f}, warm {ratios['warm']:.2f}"
    if mo["files"] != bi["files"]:
        line += f" (not the same count: mount {mo['files']}, bindfs {bi['files']}: --timeout cut the making)"
    return [line]


def ranks_list(text: str) -> list[int]:
    if text.strip() == "0":
        return []
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of rank counts: {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"not a comma list of rank counts: {text!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mdtest", type=Path, required=True, help="the built mdtest binary (IOR's src/mdtest)")
    ap.add_argument("--mpiexec", default=None, help="mpiexec to run it with (default: that of the MPI it links)")
    ap.add_argument("--ranks", type=ranks_list, default=[2, 8], help="comma list of rank counts (default 2,8; 0 skips)")
    ap.add_argument("--files-per-rank", type=int, default=500, help="mdtest -n (default 500)")
    ap.add_argument("--rounds", type=int, default=3, help="mdtest rounds per rank count (default 3)")
    ap.add_argument("--ls-files", type=int, default=200_000, help="files of the ls -l directory (0 skips; 200000)")
    ap.add_argument("--ls-rounds", type=int, default=1, help="cold + warm ls -l timings per side (default 1)")
    ap.add_argument("--ls-procs", type=int, default=4, help="processes making them, per side (default 4)")
    ap.add_argument("--mount-args", default="", help="extra flags of pharos-mount, e.g. '--attr-ttl-ms 1000'")
    ap.add_argument("--no-local", action="store_true", help="no local-directory column")
    ap.add_argument("--bin", type=Path, default=REPO / "target" / "release", help="pharos-fwd/pharos-mount dir")
    ap.add_argument("--workdir", default="/var/tmp", help="parent of the tmp dir")
    ap.add_argument(
        "--backing",
        choices=("ext4", "workdir"),
        default="ext4",
        help="ext4 (default): each side on a fresh journaled ext4 of its own (a loop-mounted sparse "
        "image in the tmp dir: one side's removals cannot slow another's creates); workdir: all "
        "sides in the tmp dir, on --workdir's file system",
    )
    ap.add_argument("--timeout", type=float, default=900, help="bound of each mdtest run, file making, ls (s)")
    ap.add_argument("--keep", action="store_true", help="keep the tmp dir")
    ap.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    a = ap.parse_args()
    if not (a.mdtest.is_file() and os.access(a.mdtest, os.X_OK)):
        sys.exit(f"--mdtest {a.mdtest}: not an executable file (the mdtest binary of an IOR build, see --help)")
    a.mdtest = a.mdtest.resolve()
    bin_dir = a.bin.resolve()
    for exe in ("pharos-fwd", "pharos-mount"):
        if not os.access(bin_dir / exe, os.X_OK):
            sys.exit(f"--bin {bin_dir}: no {exe} (build with `make build`)")
    if min(a.rounds, a.files_per_rank, a.ls_procs, a.ls_rounds) < 1 or a.ls_files < 0:
        sys.exit("--rounds, --files-per-rank, --ls-procs, --ls-rounds must be ≥ 1 and --ls-files ≥ 0")
    mpiexec = pick_mpiexec(a.mdtest, a.mpiexec)
    # SIGTERM unwinds like Ctrl-C, through the clean-up below.
    signal.signal(signal.SIGTERM, lambda sig, _frame: sys.exit(128 + sig))
    out: dict = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}, "mdtest": {}}
    out["config"]["mpiexec"] = mpiexec
    with scratch_dir("pharos-mdtest-", a.workdir, a.keep) as root, contextlib.ExitStack() as backing:
        procs: list[subprocess.Popen] = []
        mounts: list[Path] = []
        sides = ["mount", "bindfs"] + ([] if a.no_local else ["local"])
        # inodes of the largest directory, twice (the mount's sidecars; a round's leftovers), and room
        inodes = 2 * max(a.ls_files, max(a.ranks, default=0) * a.files_per_rank) + 65536
        fs = {
            s: backing.enter_context(fresh_ext4(root / f"fs-{s}", 16, inodes)) if a.backing == "ext4" else root
            for s in sides
        }
        try:
            bases = {"mount": start_stack(bin_dir, fs["mount"], "", procs, a.mount_args.split())}
            mounts.append(bases["mount"])
            bases["bindfs"] = start_passthrough(fs["bindfs"], mounts)
            if not a.no_local:
                bases["local"] = fs["local"] / "local"
                bases["local"].mkdir()
            where = "each on a fresh journaled ext4 of its own" if a.backing == "ext4" else "in the tmp dir"
            print(
                f"# pharos metadata bench (issue 29): sides {', '.join(bases)} ({where}); mpiexec {mpiexec[0]}; tmp {root}"
            )
            if a.mount_args:
                print(f"# pharos-mount {a.mount_args}")
            summary = part_mdtest(a, mpiexec, bases, out) if a.ranks else []
            if a.ls_files:
                summary += part_ls(a, bases, out)
            print("\n".join(summary))
            out["summary"] = summary
            if a.json is not None:
                a.json.write_text(json.dumps(out, indent=2) + "\n")
            return 0
        finally:
            # A second Ctrl-C or SIGTERM must not cut the clean-up short (it is bounded).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            stop_all(procs, mounts)


if __name__ == "__main__":
    raise SystemExit(main())
