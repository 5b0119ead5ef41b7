"""Node-local mode (issue 27, item 2): an mdtest-like N-N create-heavy job and an N-N write job
in node-local rank directories (``<mount>/.nodelocal/<job>/<rank>/``, forwarder/README.md
"Node-local mode") against the same jobs in the shared namespace (a directory per rank, as
``mdtest -u``), through one real pharos-fwd (8 targets, --no-kafka) and pharos-mount; then the
global read-only view from a second compute node's mount, and a rank restarted on a node that
replaces the first one. As root (FUSE):

    uv run python bench/nodelocal.py [--ranks 8] [--files 2000] [--write-mb 256] [--rounds 5]
                                     [--write-rounds 9] [--nodes 2] [--backing ext4|workdir]
                                     [--bin DIR] [--workdir DIR] [--keep] [--timeout 300]

Each rank is a process of its own (``PHAROS_RANK`` in its environment, so the daemon's records
carry it); all ranks start at once (a line on their stdin) and the figure is the job's
aggregate: creates (``O_CREAT|O_EXCL`` + close) per second, and written MiB/s (1 MiB writes;
the fsync that follows is not timed: the figure is the forwarding path's, not the loop device's
writeback, which varied ±40 % from run to run), from the start to the last rank's end, each
run after ``sync`` and a drop of the page cache. Node-local creates are write-back (the mount
answers them, the daemon's creates follow: forwarder/README.md, "Write-back creates"): each
round also says when the daemon had every create (the mounts' ``pending_creates`` back to 0),
and a second creates ratio counts that time (the daemon's view, not the application's). Ranks
are spread over --nodes compute nodes (mounts ``cn0``, ``cn1``, ..., rank r on
``cn{r mod nodes}``); the MDT and the targets are each on a fresh journaled ext4 (--backing). Rounds alternate the order of the two modes; the ratios
are the medians of the per-round ratios (node-local / shared; a round's ratio varies by ±30 %
on this shared 2-core machine, hence 5 and 9 rounds by default). Then, with one more compute
node (the spare, ``cn{nodes}``):

* *global view*: the spare's mount lists ``.nodelocal/<job>/`` of the create job and of the
  write job and checks every rank, every file and its size, and reads every written byte back
  (a pattern of rank and block);
* *replaced node*: ``cn0``'s mount stops (the node "failed"); the spare gets ``EROFS`` writing a
  rank of ``cn0`` until the daemon's ``POST /nodelocal/attach`` makes it the replacement (of
  ``cn0``'s ranks only), then the restarted rank 0 on the spare finds its data (read back whole)
  and writes again.

Ends with ``node-local: creates/s ratio C, write bandwidth ratio W, global view ok|missing``
(exit status 1 when the view or the replacement fails). Everything is bounded by --timeout,
stopped and removed at the end (unless --keep).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchkit import REPO, drop_caches, fresh_ext4, kit, rounds, scratch_dir, use_binaries

#: One rank: waits for a line on stdin, then creates its files or writes its data file in the
#: directory argv[2]; prints its end time (time.time()).
RANK = r"""
import os, sys, time
mode, d, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank = int(os.environ["PHAROS_RANK"])
sys.stdin.readline()
if mode == "create":
    for i in range(n):
        os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
else:
    fd = os.open(f"{d}/data", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    for b in range(n):
        os.pwrite(fd, bytes([(rank * 7 + b) % 251]) * (1 << 20), b << 20)
    end = time.time()
    os.fsync(fd)
    os.close(fd)
print(end if mode == "write" else time.time(), flush=True)
"""


def run_job(mode: str, dirs: list[Path], n: int, timeout: float) -> float:
    """Ranks 0..len(dirs)-1, rank r in dirs[r] (made first); returns the job's seconds."""
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, mode, str(d), str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PHAROS_RANK": str(r)},
        )
        for r, d in enumerate(dirs)
    ]
    time.sleep(0.3)  # interpreters up
    t0 = time.time()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    ends = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        if p.returncode:
            sys.exit(f"a rank of the {mode} job failed ({p.returncode}) in {dirs[0].parent}")
        ends.append(float(out.strip()))
    return max(ends) - t0


def rank_dirs(mnts: list[Path], mode: str, job: str, ranks: int) -> list[Path]:
    """The ranks' directories of `job`, rank r on compute node r mod len(mnts): node-local, or
    one per rank in the shared namespace."""
    if mode == "node-local":
        return [mnts[r % len(mnts)] / ".nodelocal" / job / str(r) for r in range(ranks)]
    return [mnts[r % len(mnts)] / job / f"rank.{r}" for r in range(ranks)]


def wait_drained(mounts: list[kit.Mount], timeout: float) -> float:
    """Waits until no mount has a write-back create pending (``pending_creates`` 0: the daemon
    made every create the mounts answered); the seconds waited (0 when none was pending; counted
    from the ranks' reaping, so slightly more than the drain itself)."""
    t0 = time.monotonic()
    end = t0 + timeout
    if not any(m.status().get("pending_creates", 0) for m in mounts):
        return 0.0
    while time.monotonic() < end and any(m.status().get("pending_creates", 0) for m in mounts):
        time.sleep(0.005)
    return time.monotonic() - t0


def check_view(view: Path, ranks: int, files: int, write_mb: int, cjob: str, wjob: str) -> list[str]:
    """What the global view at `view` (`<mount>/.nodelocal`) misses; empty when complete."""
    bad = []
    jobs = set(os.listdir(view))
    if not {cjob, wjob} <= jobs:
        return [f"jobs listed: {sorted(jobs)}"]
    for r in range(ranks):
        names = {e.name: e.stat().st_size for e in os.scandir(view / cjob / str(r))}
        want = {f"f{i}" for i in range(files)}
        if set(names) != want or any(names.values()):
            bad.append(f"create job rank {r}: {len(names)} files, {len(want - set(names))} missing")
        data = view / wjob / str(r) / "data"
        size = data.stat().st_size if data.exists() else -1
        if size != write_mb << 20:
            bad.append(f"write job rank {r}: size {size}")
        elif not same_data(data, r, write_mb):
            bad.append(f"write job rank {r}: data differs")
    return bad


def same_data(path: Path, rank: int, blocks: int) -> bool:
    with path.open("rb") as f:
        return all(f.read(1 << 20) == bytes([(rank * 7 + b) % 251]) * (1 << 20) for b in range(blocks))


def replaced_node(c: kit.Cluster, d: kit.Daemon, spare: kit.Mount, wjob: str, write_mb: int, nodes: int) -> str | None:
    """cn0 failed; the spare node cn<nodes> replaces it and restarts rank 0: None when that
    works, else what failed."""
    c._stop(c.mounts[0].proc)
    rank0, name = spare.path / ".nodelocal" / wjob / "0", f"cn{nodes}"
    try:
        (rank0 / "restart").write_bytes(b"x")
        return f"{name} wrote into a rank of cn0 before replacing it"
    except OSError as e:
        if e.errno != errno.EROFS:
            return f"{name}'s write before replacing: {e}"
    moved = kit.http("POST", d.admin + "/nodelocal/attach", {"job": wjob, "node": name, "replaces": "cn0"})["ranks"]
    ranks = sorted(int(r) for r in moved)
    if not ranks or any(r % nodes for r in ranks):
        return f"ranks taken over: {moved} (cn0's: the multiples of {nodes})"
    time.sleep(1.1)  # the daemon's cached attachment (OWNER_TTL)
    if not same_data(rank0 / "data", 0, write_mb):
        return "the restarted rank does not find its data"
    (rank0 / "restart").write_bytes(b"restarted on cn1")
    if (rank0 / "restart").read_bytes() != b"restarted on cn1":
        return "the restarted rank's write is not read back"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--files", type=int, default=2000, help="files per rank (create job)")
    ap.add_argument("--write-mb", type=int, default=256, help="MiB per rank (write job)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the create job")
    ap.add_argument("--write-rounds", type=int, default=9, help="rounds of the write job")
    ap.add_argument("--nodes", type=int, default=2, help="compute nodes (mounts) of the job; one more is the spare")
    ap.add_argument(
        "--backing",
        choices=("ext4", "workdir"),
        default="ext4",
        help="ext4: the MDT and the targets each on a fresh journaled ext4 (as an MDS and OSS have "
        "devices of their own); workdir: all in the tmp dir",
    )
    ap.add_argument("--bin", type=Path, help="binaries (default: cargo build --release here)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    use_binaries(a.bin)
    print(
        f"# {a.ranks} ranks on {a.nodes} compute nodes: x {a.files} creates ({a.rounds} rounds), "
        f"x {a.write_mb} MiB writes ({a.write_rounds} rounds)"
    )
    with scratch_dir("pharos-nodelocal-", a.workdir, a.keep) as root, contextlib.ExitStack() as fs:
        c = kit.Cluster(root)
        if a.backing == "ext4":
            fs.enter_context(fresh_ext4(c.backend, 8, 1 << 20))
            fs.enter_context(fresh_ext4(c.backend / "mdt", 2, 1 << 20))
        try:
            d = c.start_daemon("fwd0")
            mnts = [c.start_mount([d], i).path for i in range(a.nodes)]
            ratios: dict[str, list[float]] = {"create": [], "write": [], "drained": []}
            last = {}
            for what in ("create", "write"):
                n = a.files if what == "create" else a.write_mb
                got: dict[int, dict[str, float]] = {}
                for r, mode in rounds(a.rounds if what == "create" else a.write_rounds, ["shared", "node-local"]):
                    job = f"create{r}" if what == "create" else "write"  # a write round rewrites the files
                    drop_caches()  # sync, then the page cache: the round before is on disk
                    took = run_job(what, rank_dirs(mnts, mode, job, a.ranks), n, a.timeout)
                    # Write-back creates (node-local): the time until the daemon has every one.
                    extra = wait_drained(c.mounts[: a.nodes], a.timeout) if what == "create" else 0.0
                    rate = a.ranks * n / took
                    got.setdefault(r, {})[mode] = rate
                    got[r][mode + "+drain"] = a.ranks * n / (took + extra)
                    last[(what, mode)] = job
                    unit = "creates/s" if what == "create" else "MiB/s"
                    tail = f", {took + extra:.2f} s until the daemon had every create" if extra else ""
                    print(f"round {r} {what:6} {mode:10} {rate:10.0f} {unit} ({took:.2f} s{tail})", flush=True)
                for _, g in sorted(got.items()):
                    ratios[what].append(g["node-local"] / g["shared"])
                    if what == "create":
                        ratios["drained"].append(g["node-local+drain"] / g["shared+drain"])
            c_ratio, w_ratio = (statistics.median(ratios[k]) for k in ("create", "write"))
            print(f"creates/s node-local / shared per round: {', '.join(f'{x:.2f}' for x in ratios['create'])}")
            print(
                "creates/s node-local / shared per round, until the daemon had every create: "
                f"{', '.join(f'{x:.2f}' for x in ratios['drained'])} (median {statistics.median(ratios['drained']):.2f})"
            )
            print(f"write MiB/s node-local / shared per round: {', '.join(f'{x:.3f}' for x in ratios['write'])}")
            spare = c.start_mount([d], a.nodes)
            cjob, wjob = last[("create", "node-local")], last[("write", "node-local")]
            bad = check_view(spare.path / ".nodelocal", a.ranks, a.files, a.write_mb, cjob, wjob)
            for b in bad[:10]:
                print(f"global view: {b}")
            print(f"global view from cn{a.nodes}: {'every rank, file and size' if not bad else 'incomplete'}")
            failed = replaced_node(c, d, spare, wjob, a.write_mb, a.nodes)
            ok = f"ok: cn{a.nodes} took over the ranks of cn0 and found their data"
            print(f"replaced node: {ok if failed is None else failed}")
            print(
                f"node-local: creates/s ratio {c_ratio:.2f}, write bandwidth ratio {w_ratio:.3f}, "
                f"global view {'missing' if bad else 'ok'}",
                flush=True,
            )
            return 1 if bad or failed else 0
        finally:
            c.close()


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
