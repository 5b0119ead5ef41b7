"""Placement benchmark (issue #3): performance-aware pool vs round-robin on heterogeneous OSTs.

8 targets limited to 50, 30, 50, 20, 30, 10, 50, 20 MB/s (the Sunway lessons paper's Table 2
scaled by 1/10), 32 fio ranks writing one 16 MiB file each (N-N) through pharos-mount and
one pharos-fwd. Prints, for each policy in the same run, fio's aggregate bandwidth as a
fraction of the targets' summed bandwidth (target: pool ≥ 0.90), round-robin's bound set
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

from forwarder_testkit import Cluster, build_binaries  # noqa: E402
from test_placement import LIMITS, RANKS, optimum_ratio, run_case  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    build_binaries()
    ratios: dict[str, list[float]] = {"round-robin": [], "performance-aware": []}
    for r in range(args.rounds):
        for pool in ((False, True) if r % 2 == 0 else (True, False)):
            with tempfile.TemporaryDirectory(prefix="pharos-placement-") as tmp:
                c = Cluster(Path(tmp))
                try:
                    ratio, _ = run_case(c, pool=pool)
                finally:
                    c.close()
            ratios["performance-aware" if pool else "round-robin"].append(ratio)
    rr_bound = RANKS / (4 / min(LIMITS)) / sum(LIMITS)
    print()
    print(f"{'policy':20s} {'median':>7s} {'min':>7s} {'max':>7s}   of {sum(LIMITS)} MB/s summed bandwidth")
    for name, rs in ratios.items():
        print(f"{name:20s} {statistics.median(rs):7.3f} {min(rs):7.3f} {max(rs):7.3f}")
    print(f"round-robin bound (4 files on the {min(LIMITS)} MB/s target): {rr_bound:.3f}; "
          f"best whole-file allocation of {RANKS} equal files: {optimum_ratio(LIMITS, RANKS):.3f}; target pool ≥ 0.90")
    return 0


if __name__ == "__main__":
    sys.exit(main())
