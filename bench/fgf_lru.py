"""FGF-LRU (fine-grained-first LRU, Li & Sun) against a plain two-list LRU of the same size, on
the forwarding node's page cache (issue 12, item 4), through the real daemon and the real mount.

Two stacks side by side, each one pharos-fwd (8 targets, --no-kafka) and one pharos-mount:
``--cache-mb 8 --cache-policy fgf-lru`` and ``--cache-mb 8 --cache-policy lru``. For each
fine-grained probability p in 0.9, 0.7, 0.5, 0.3, 0.1 both stacks are started fresh (cold cache),
FILES files of FILE_MB MiB each (4x the cache) are written through the mount, and then one
seeded access sequence is replayed on both, in alternating chunks: each access is fine-grained
with probability p (a 4 KiB pread), else coarse-grained (a 1 MiB pread). The workload's shape:
fine-grained accesses re-read small records (offsets Zipf-distributed, exponent 1, over every
4 KiB page of the file set, ranks shuffled over the files); coarse-grained accesses stream (the
next 1 MiB of a sequential scan through the file set, wrapping). The mount has no client cache
(direct I/O), so every pread reaches the daemon (a 1 MiB pread as the kernel's FUSE read
request, more than the 64 KiB fine-grained threshold; the read buffers are page-aligned, as
fio's are, so that the kernel does not split off a small tail request).

The first WARMUP accesses fill the cache and are not counted; the hit ratios come from the
daemons' own counters (GET /metrics, ``pharos_fwd_cache_requests_total``,
``pharos_fwd_cache_page_lookups_total``), as deltas over the measured accesses:
* ``req``: read requests served wholly from the cache / read requests reaching the daemon;
* ``fine``: the same over fine-grained requests only;
* ``page``: 4 KiB pages found / pages looked up (byte-weighted: dominated by coarse reads).
The time of the measured accesses is printed too (ratio fgf/lru; < 1 is faster).

Usage: python bench/fgf_lru.py [--accesses 4000] [--warmup 2000] [--bin DIR] [--keep]
(root, /dev/fuse)
"""

from __future__ import annotations

import argparse
import bisect
import mmap
import os
import random
import time
from pathlib import Path

from benchkit import daemon_metrics, kit, scratch_dir, use_binaries

CACHE_MB = 8
FILES = 4
FILE_MB = 8
PAGE = 4096
FINE = 4096
COARSE = 1 << 20
PS = (0.9, 0.7, 0.5, 0.3, 0.1)
POLICIES = ("fgf-lru", "lru")
CHUNK = 500


def metrics(d: kit.Daemon) -> dict[str, float]:
    """The daemon's cache counters from GET /metrics, keyed by name and labels."""
    return daemon_metrics(d, "pharos_fwd_cache_")


def ratio(m0: dict, m1: dict, pol: str, kind: str) -> float:
    def get(m: dict, labels: str) -> float:
        if kind == "page":
            return m.get(f'pharos_fwd_cache_page_lookups_total{{policy="{pol}",result="{labels}"}}', 0.0)
        grains = ("fine",) if kind == "fine" else ("fine", "coarse")
        return sum(
            m.get(f'pharos_fwd_cache_requests_total{{policy="{pol}",grain="{g}",result="{labels}"}}', 0.0)
            for g in grains
        )

    hit = get(m1, "hit") - get(m0, "hit")
    miss = get(m1, "miss") - get(m0, "miss")
    return hit / (hit + miss) if hit + miss else 0.0


def sequence(p: float, n: int, seed: int) -> list[tuple[int, int, int]]:
    """n accesses (file index, offset, size): fine with probability p (Zipf pages), else the next
    1 MiB of the sequential scan."""
    rng = random.Random(seed)
    pages = FILES * FILE_MB * (1 << 20) // PAGE
    cum, s = [], 0.0
    for r in range(1, pages + 1):
        s += 1.0 / r
        cum.append(s)
    perm = list(range(pages))
    rng.shuffle(perm)
    per_file = FILE_MB * (1 << 20)
    scan = 0
    out = []
    for _ in range(n):
        if rng.random() < p:
            page = perm[bisect.bisect_left(cum, rng.random() * s)]
            pos = page * PAGE
            out.append((pos // per_file, pos % per_file, FINE))
        else:
            out.append((scan // per_file, scan % per_file, COARSE))
            scan = (scan + COARSE) % (FILES * per_file)
    return out


# Page-aligned read buffers: an unaligned 1 MiB buffer spans 257 pages, and the kernel then
# splits the read into a 1 MiB - x request and an x-byte one (a fine-grained request that is
# really the tail of a coarse access).
BUFS = {FINE: mmap.mmap(-1, FINE), COARSE: mmap.mmap(-1, COARSE)}


def replay(fds: list[int], accesses: list[tuple[int, int, int]]) -> float:
    t0 = time.perf_counter()
    for f, off, size in accesses:
        if os.preadv(fds[f], [BUFS[size]], off) != size:
            raise SystemExit(f"short read at file {f} offset {off}")
    return time.perf_counter() - t0


def run_p(root: Path, p: float, a: argparse.Namespace) -> dict:
    clusters, stacks = [], {}
    try:
        for pol in POLICIES:
            c = kit.Cluster(root / f"p{p}-{pol}")
            c.root.mkdir(parents=True)
            clusters.append(c)
            d = c.start_daemon("fwd0", "--cache-mb", str(CACHE_MB), "--cache-policy", pol)
            m = c.start_mount([d])
            block = os.urandom(1 << 20)
            fds = []
            for i in range(FILES):
                path = m.path / f"data{i}"
                with open(path, "wb") as fh:
                    for _ in range(FILE_MB):
                        fh.write(block)
                fds.append(os.open(path, os.O_RDONLY))
            stacks[pol] = (d, fds)
        seq = sequence(p, a.warmup + a.accesses, seed=int(p * 100))
        warm, meas = seq[: a.warmup], seq[a.warmup :]
        for pol in POLICIES:
            replay(stacks[pol][1], warm)
        m0 = {pol: metrics(stacks[pol][0]) for pol in POLICIES}
        took = dict.fromkeys(POLICIES, 0.0)
        for i, k in enumerate(range(0, len(meas), CHUNK)):
            order = POLICIES if i % 2 == 0 else POLICIES[::-1]
            for pol in order:
                took[pol] += replay(stacks[pol][1], meas[k : k + CHUNK])
        m1 = {pol: metrics(stacks[pol][0]) for pol in POLICIES}
        res = {"time": took}
        for kind in ("req", "fine", "page"):
            res[kind] = {pol: ratio(m0[pol], m1[pol], pol, kind) for pol in POLICIES}
        for pol in POLICIES:
            for fd in stacks[pol][1]:
                os.close(fd)
        return res
    finally:
        for c in clusters:
            c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--accesses", type=int, default=4000, help="measured accesses per p")
    ap.add_argument("--warmup", type=int, default=2000, help="accesses before measuring, per p")
    ap.add_argument("--bin", type=Path, default=None, help="pharos-fwd/pharos-mount from this dir (no build)")
    ap.add_argument("--workdir", default="/var/tmp")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    use_binaries(a.bin)
    with scratch_dir("pharos-fgf-lru-", a.workdir, a.keep) as root:
        print(
            f"# FGF-LRU vs LRU: {CACHE_MB} MiB page cache (4 KiB pages), {FILES} x {FILE_MB} MiB files, "
            f"fine = {FINE} B Zipf reads, coarse = {COARSE >> 20} MiB sequential scan; "
            f"{a.warmup} warm-up + {a.accesses} measured accesses per p; tmp {root}"
        )
        print(
            f"{'p':>4} {'req fgf':>8} {'req lru':>8} {'gap':>7} {'fine fgf':>9} {'fine lru':>9} "
            f"{'page fgf':>9} {'page lru':>9} {'time fgf/lru':>13}"
        )
        gaps = {}
        for p in PS:
            r = run_p(root, p, a)
            q, f, pg, t = r["req"], r["fine"], r["page"], r["time"]
            gaps[p] = q["fgf-lru"] - q["lru"]
            print(
                f"{p:4.1f} {q['fgf-lru']:8.3f} {q['lru']:8.3f} {gaps[p]:+7.3f} {f['fgf-lru']:9.3f} {f['lru']:9.3f} "
                f"{pg['fgf-lru']:9.3f} {pg['lru']:9.3f} {t['fgf-lru'] / t['lru']:13.2f}",
                flush=True,
            )
        worst = min(gaps.values())
        largest = max(gaps, key=gaps.get)
        print(
            f"# request hit ratio fgf-lru >= lru at every p: {'yes' if worst >= 0 else 'NO'} (smallest gap {worst:+.3f}); "
            f"largest gap at p = {largest} ({gaps[largest]:+.3f})"
        )
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
