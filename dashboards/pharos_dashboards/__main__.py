"""``python -m pharos_dashboards [--check]`` (run from dashboards/; ``make dashboards``)."""

from __future__ import annotations

import argparse
import sys

from . import ROOT, stale, write


def main() -> int:
    ap = argparse.ArgumentParser(prog="pharos_dashboards", description=__doc__)
    ap.add_argument("--check", action="store_true", help="fail if a committed file differs from the generator's output")
    args = ap.parse_args()
    if args.check:
        bad = stale()
        for rel in bad:
            print(f"stale: dashboards/{rel} (run `make dashboards`)", file=sys.stderr)
        return 1 if bad else 0
    for rel in write():
        print(f"wrote {ROOT.name}/{rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
