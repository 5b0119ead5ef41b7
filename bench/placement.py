"""Placement benchmark (issue #3): round-robin vs performance-aware pools on heterogeneous OSTs.

8 targets limited to 50, 30, 50, 20, 30, 10, 50, 20 MB/s (the Sunway lessons paper's Table 2
scaled by 1/10), 32 fio ranks writing one 16 MiB file each (N-N) through pharos-mount and
one pharos-fwd. Three policies, in rotating order within each round: round-robin, the
performance-aware pool placing whole files at create, and the progressive pool placing
each 2 MiB component at its first write. Prints, for each policy, the median/min/max of
fio's aggregate bandwidth as a fraction of the targets' summed bandwidth (target: ≥ 0.90),
the progressive pool's bound from the bytes each target received, round-robin's bound set
by its slowest target, and the best whole-file allocation's fraction.

Usage: uv run python bench/placement.py [--rounds 3]   (root, /dev/fuse, fio)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "forwarder"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from forwarder_testkit import Cluster, build_binaries
from test_placement import LIMITS, POLICIES, RANKS, bytes_bound_ratio, bytes_per_target, optimum_ratio, run_case


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    build_binaries()
    ratios: dict[str, list[float]] = {p: [] for p in POLICIES}
    bounds: list[float] = []
    for r in range(args.rounds):
        for policy in POLICIES[r % 3 :] + POLICIES[: r % 3]:
            with tempfile.TemporaryDirectory(prefix="pharos-placement-") as tmp:
                c = Cluster(Path(tmp))
                try:
                    ratio, _ = run_case(c, policy)
                    if policy == "progressive":
                        bounds.append(bytes_bound_ratio(bytes_per_target(c)))
                finally:
                    c.close()
            ratios[policy].append(ratio)
    rr_bound = RANKS / (4 / min(LIMITS)) / sum(LIMITS)
    print()
    print(f"{'policy':20s} {'median':>7s} {'min':>7s} {'max':>7s}   of {sum(LIMITS)} MB/s summed bandwidth")
    for name, rs in ratios.items():
        print(f"{name:20s} {statistics.median(rs):7.3f} {min(rs):7.3f} {max(rs):7.3f}")
    print(
        f"{'progressive (bytes)':20s} {statistics.median(bounds):7.3f} {min(bounds):7.3f} {max(bounds):7.3f}"
        "   bound from the bytes each target received"
    )
    print(
        f"round-robin bound (4 files on the {min(LIMITS)} MB/s target): {rr_bound:.3f}; "
        f"best whole-file allocation of {RANKS} equal files: {optimum_ratio(LIMITS, RANKS):.3f}; target pool ≥ 0.90"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
