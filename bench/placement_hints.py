"""Placement-hints benchmark (issue 9; Sunway storage lessons §5): the control loop learns each
target's max_perf from measured load, a 32-process N-N job runs on that pool, one target is
slowed 4x, the loop updates the pool, and the next job runs on the loop's pool (B) and on the
unchanged pool pinned by an admin (C), in the same run.

The sequence of ``tests/control/test_control_placement_live.py`` (see its docstring) on one real
stack with the 8 targets limited to 50, 30, 50, 20, 30, 10, 50, 20 MB/s. Each round prints the
learned max_perf, job A's bandwidth over the summed 260 MB/s (target >= 0.90), the time from the
fault to the loop's new pool (target: within one control period), and jobs B and C over the
remaining 222.5 MB/s (target for B >= 0.90); B and C alternate their order between rounds. The
end prints the medians over the rounds.

Usage: uv run python bench/placement_hints.py [--rounds 2]   (root, /dev/fuse, fio; ~2 min a round)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "control"))

from pharos_testkit import running_stack
from test_control_placement_live import CONTROL_PERIOD_S, LIMITS, STACK_ENV, Stack, describe, run_sequence


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rs = []
    # each round on a fresh stack: a second round on the same one would find its pool already
    # learned (an unchanged measurement is not pushed again)
    for r in range(args.rounds):
        with (
            tempfile.TemporaryDirectory(prefix="pharos-plc-") as tmp,
            running_stack(
                Path(tmp) / "state", f"pharos-plc-bench-{os.getpid()}-{r}", STACK_ENV, fwd_target_limits_mb_s=LIMITS
            ) as settings,
        ):
            order = ("B", "C") if r % 2 == 0 else ("C", "B")
            res = run_sequence(Stack(settings), Path(tmp) / f"round{r}", f"r{r}", order)
            rs.append(res)
            print(f"\nround {r + 1} (B/C order {', '.join(order)}):\n{describe(res)}", flush=True)
    med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
    print(f"\nover {len(rs)} round(s), medians:")
    print(f"  job A (learned pool): {med('A_ratio'):.3f} of {sum(LIMITS)} MB/s (target >= 0.90)")
    print(f"  fault -> pool updated: {med('drop_latency_s'):.1f} s (control period {CONTROL_PERIOD_S:g} s)")
    print(
        f"  after the fault, of the remaining {rs[0]['remaining']:g} MB/s: job B (loop's pool) {med('B_ratio'):.3f} "
        f"(target >= 0.90), job C (unchanged pool) {med('C_ratio'):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
