"""Placement over heterogeneous OSTs (Sunway lessons §5).

8 targets with token-bucket limits 50, 30, 50, 20, 30, 10, 50, 20 MB/s (260 MB/s in all),
32 fio ranks each writing one 16 MiB file (N-N). Round-robin puts 4 files on every
target, so the 10 MB/s target sets the finish time. The performance-aware pool places
each new file on the target maximising max_perf / (open_count + 1).

With 32 equal files and whole-file placement, the best possible makespan is that of the
D'Hondt allocation (7 files on one 50 MB/s target), i.e. 0.879 of the summed bandwidth;
the test prints both ratios and the achievable optimum and checks the pool gets ≥ 0.95 of
that optimum while round-robin stays near its bottleneck (32/(4·8·10/260) ≈ 0.31).
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
    alloc = [0] * len(limits)
    for _ in range(files):
        i = max(range(len(limits)), key=lambda i: limits[i] / (alloc[i] + 1))
        alloc[i] += 1
    makespan = max(a / p for a, p in zip(alloc, limits))
    return files / makespan / sum(limits)


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


@pytest.mark.timeout(120)
def test_performance_aware_pool_reaches_summed_bandwidth(cluster):
    best = optimum_ratio(LIMITS, RANKS)
    ratio, per_target = run_case(cluster, pool=True)
    print(f"performance-aware: {ratio:.3f} of summed bandwidth; whole-file optimum {best:.3f}; "
          f"{ratio / best:.3f} of the optimum")
    # More files on faster targets.
    assert per_target["ost0"] > per_target["ost3"] > per_target["ost5"] >= 1
    assert ratio >= 0.95 * best
