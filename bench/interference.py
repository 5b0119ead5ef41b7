"""Interference-cure benchmark (issue 9): a latency-sensitive job beside a heavy N-N writer on one
forwarding node, solo / control loop off / control loop on, in one real stack.

The scenarios of ``tests/control/test_control_interference_live.py`` (see its docstring for the
jobs, the fault-interface latencies and what is measured): light's I/O time is the mean per-phase
I/O time (16 x 64 KiB writes, the sum of their fio latencies, ms) over the phases that start two
detection periods after the interference starts (heavy's first forwarder record) and end before
heavy's last one. Each round runs the three scenarios (rotating their order) and prints them; the
end prints, over the rounds, the median of solo, loop-off and loop-on times, of X = off / solo,
of the paired loop-on / solo ratio (target <= 1.2) and of the decision latency (interference
start -> remap applied; bound: 2 detection periods). Live remapping goes beyond DFRA (Ji et al.,
FAST'19), whose allocation is fixed once a job runs.

Usage: uv run python bench/interference.py [--rounds 2]   (root, /dev/fuse, fio; ~2.5 min a round)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "control"))

from test_control_interference_live import DETECT_PERIOD_S, describe, interference_stack, run_all, summary

MODES = ("solo", "off", "on")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    figs = []
    with tempfile.TemporaryDirectory(prefix="pharos-intf-") as tmp, interference_stack(Path(tmp) / "state") as s:
        for r in range(args.rounds):
            order = MODES[r % 3 :] + MODES[: r % 3]
            res = run_all(s, Path(tmp) / f"round{r}", order, tag=f"r{r}")
            f = summary(res)
            figs.append(f)
            print(f"\nround {r + 1} (order {', '.join(order)}):\n{describe(res, f)}", flush=True)
    med = lambda k: statistics.median(f[k] for f in figs if f[k] is not None)  # noqa: E731
    lat = [f["decision_latency_s"] for f in figs if f["decision_latency_s"] is not None]
    print(f"\nover {len(figs)} round(s), medians:")
    print(
        f"  light I/O time per phase: solo {med('solo_ms'):.1f} ms, loop off {med('off_ms'):.1f} ms, "
        f"loop on {med('on_ms'):.1f} ms"
    )
    print(
        f"  X = loop off / solo: {med('x'):.2f}; loop on / solo: {med('on_ratio'):.2f} (target <= 1.2); "
        f"range {min(f['on_ratio'] for f in figs):.2f}-{max(f['on_ratio'] for f in figs):.2f}"
    )
    print(
        "  decision latency: "
        + (f"{statistics.median(lat):.1f} s (range {min(lat):.1f}-{max(lat):.1f})" if lat else "no remap applied")
        + f"; rounds with a remap {len(lat)}/{len(figs)}; bound 2 detection periods = {2 * DETECT_PERIOD_S:g} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
