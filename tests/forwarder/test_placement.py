"""Placement over heterogeneous OSTs (Sunway lessons §5).

8 targets with token-bucket limits 50, 30, 50, 20, 30, 10, 50, 20 MB/s (260 MB/s in all),
32 fio ranks each writing one 16 MiB file (N-N). Round-robin puts 4 files on every
target, so the 10 MB/s target sets the finish time. The performance-aware pool places
each new file on the target maximising max_perf / (open_count + 1).

The tests check the placement decisions, which do not depend on the machine's load: the
pool's allocation has the best possible makespan for whole-file placement of equal files
(the D'Hondt allocation), round-robin puts 4 files everywhere and is held back by its
slowest target. The bandwidth each policy reaches is a performance figure: the
benchmark `bench/placement.py` measures and prints both ratios (with 32 equal files the
best whole-file allocation reaches 0.879 of the summed bandwidth).
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from forwarder_testkit import fio

LIMITS = [50, 30, 50, 20, 30, 10, 50, 20]
RANKS = 32
FILE_MIB = 16


def optimum_ratio(limits: list[int], files: int) -> float:
    """Summed-bandwidth fraction of the best whole-file allocation of equal files."""
    return files / optimum_makespan(limits, files) / sum(limits)


def run_case(cluster, pool: bool) -> tuple[float, Counter]:
    args = [a for i, v in enumerate(LIMITS) for a in ("--limit", f"ost{i}={v}")]
    args += ["--workers", "48"]
    if pool:
        placement = {"pools": {"all": {"targets": [f"ost{i}" for i in range(8)]}}, "default_pool": "all"}
        args += ["--placement", json.dumps(placement)]
    d = cluster.start_daemon("fwd0", *args)
    m = cluster.start_mount([d], 0, "--threads", "48")
    t0 = time.monotonic()
    out = fio(
        "--name=nn", f"--directory={m.path}", "--rw=write", "--bs=1M", f"--numjobs={RANKS}",
        f"--filesize={FILE_MIB}M", "--ioengine=psync", "--create_on_open=1", "--fallocate=none",
        "--group_reporting", timeout=100,
    )
    wall = time.monotonic() - t0
    w = out["jobs"][0]["write"]
    assert w["io_bytes"] == RANKS * FILE_MIB << 20
    ratio = w["bw_bytes"] / (sum(LIMITS) * 1e6)
    per_target = Counter(p.parent.name for p in cluster.backend.glob("ost*/*.0"))
    print(f"{'performance-aware' if pool else 'round-robin'}: {w['bw_bytes'] / 1e6:.1f} MB/s = "
          f"{ratio:.3f} of {sum(LIMITS)} MB/s (wall {wall:.1f}s), files per target {dict(sorted(per_target.items()))}")
    return ratio, per_target


@pytest.mark.timeout(120)
def test_round_robin_hits_slowest_target(cluster):
    ratio, per_target = run_case(cluster, pool=False)
    assert set(per_target.values()) == {4}
    # 4 files on the 10 MB/s target: makespan 4/10 per file unit, so 32 / 0.4 / 260.
    expected = RANKS / (4 / 10) / sum(LIMITS)
    print(f"round-robin bound {expected:.3f}")
    assert ratio < expected * 1.15


def makespan(alloc: dict[int, int]) -> float:
    """Finish time, in units of one file's bytes per MB/s, of files per target index."""
    return max(n / LIMITS[i] for i, n in alloc.items() if n)


def optimum_makespan(limits: list[int], files: int) -> float:
    """Makespan of the best whole-file allocation of equal files (D'Hondt)."""
    alloc = [0] * len(limits)
    for _ in range(files):
        i = max(range(len(limits)), key=lambda i: limits[i] / (alloc[i] + 1))
        alloc[i] += 1
    return max(a / p for a, p in zip(alloc, limits))


@pytest.mark.timeout(120)
def test_performance_aware_pool_places_for_the_best_makespan(cluster):
    ratio, per_target = run_case(cluster, pool=True)
    alloc = {int(name[3:]): n for name, n in per_target.items()}
    assert sum(alloc.values()) == RANKS
    # More files on faster targets, and the allocation is as good as whole-file placement gets.
    assert per_target["ost0"] > per_target["ost3"] > per_target["ost5"] >= 1
    assert makespan(alloc) == pytest.approx(optimum_makespan(LIMITS, RANKS))
    print(f"performance-aware: {ratio:.3f} of summed bandwidth (whole-file optimum "
          f"{optimum_ratio(LIMITS, RANKS):.3f}; measured by bench/placement.py)")
