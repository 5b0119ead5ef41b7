"""How Pharos's costs grow with the machine it watches (issue 28, item 2): ``bench/simulate.py`` at
several sizes with TaihuLight's ratios, then a growth fit per cost.

Each size N runs ``simulate.py --nodes N --forwarders N/170.7 --targets N/32 --jobs N/20.5``
(40,960 / 240 / 1,280 / 2,000 at TaihuLight's size; Beacon, NSDI'19 §2) for ``--minutes`` at the
``--fractions`` of real time given (pick them so that every size sends this host about the same
records/s: the costs then differ by nodes, forwarding nodes, targets and jobs, not by load), one
after the other, each writing its figures with ``--json``. ``--from FILE ...`` fits runs made
before instead.

The fit, per cost y (the detection cycle's median and max, the control cycle's, the pipeline
process's RSS, the lag at the end): the exponent k of y ~ N^k (least squares
on log y against log N) and which of y = a + b*g(N), g in 1, log N, N, N log N, N^2, leaves the
smallest relative residual (numpy least squares; with three sizes one degree of freedom is left:
read it as a hint, the exponent as the figure). Printed as a table; ``--at N,...`` prints what the
power law gives at other sizes (an extrapolation, said so).

    python bench/growth.py --sizes 1024,4096,40960 --fractions 1,0.25,0.005 --minutes 5
    python bench/growth.py --from run1.json run2.json run3.json --at 10240,40960

Everything stops by itself (each simulate run does); nothing is kept unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

import numpy as np

HERE = Path(__file__).resolve().parent

#: TaihuLight (Beacon, NSDI'19 §2): 40,960 compute nodes, 240 forwarding nodes; the targets and
#: concurrent jobs of bench/simulate.py's defaults (1,280; 2,000).
RATIOS = {"forwarders": 40_960 / 240, "targets": 40_960 / 1_280, "jobs": 40_960 / 2_000}

MODELS = {
    "constant": lambda n: np.ones_like(n),
    "log N": np.log,
    "N": lambda n: n,
    "N log N": lambda n: n * np.log(n),
    "N^2": lambda n: n * n,
}


def machine(nodes: int) -> dict[str, int]:
    """TaihuLight's ratios at ``nodes`` compute nodes (at least 1 of each)."""
    return {k: max(1, round(nodes / r)) for k, r in RATIOS.items()}


def costs(run: dict) -> dict[str, float | None]:
    """The costs fitted, from one ``simulate.py --json`` result (None: not measured in the run)."""
    det, ctl = run.get("detection_s") or [], run.get("control_s") or []
    warm = det[1:] or det  # the first cycle reads the whole look-back
    return {
        "detection cycle median (s)": median(warm) if warm else None,
        "detection cycle max (s)": max(det) if det else None,
        "control cycle median (s)": median(ctl[1:] or ctl) if ctl else None,
        "control cycle max (s)": max(ctl) if ctl else None,
        "pipeline RSS (MB)": run.get("rss_mb", {}).get("pipeline0"),
        "lag at the end (messages)": run.get("lag_end"),
    }


def fit(ns: list[float], ys: list[float]) -> tuple[float | None, str | None, dict]:
    """(exponent k of y ~ N^k, the best model's name, its coefficients {a, b} and the power
    law's log_c: log y = log_c + k log N) over the points
    with y > 0; (None, None, {}) with fewer than 2 such points."""
    pts = [(n, y) for n, y in zip(ns, ys, strict=True) if y is not None and y > 0]
    if len(pts) < 2:
        return None, None, {}
    n = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    k, c = (float(v) for v in np.polyfit(np.log(n), np.log(y), 1))
    best = None
    for name, g in MODELS.items():
        a_mat = np.column_stack([np.ones_like(n), g(n)]) if name != "constant" else np.ones((len(n), 1))
        coef, *_ = np.linalg.lstsq(a_mat, y, rcond=None)
        err = float(np.sqrt(np.mean(((a_mat @ coef - y) / y) ** 2)))
        if name != "constant" and coef[1] < 0:
            continue  # a cost that falls with size is noise, not a model
        if best is None or err < best[0] - 1e-9:
            best = (err, name, {"a": float(coef[0]), "b": float(coef[1]) if len(coef) > 1 else 0.0})
    return k, best[1], best[2] | {"log_c": c}


def predict(coef: dict, k: float, n: float) -> float:
    """The power law's y at ``n`` (y = e^log_c x N^k): an extrapolation beyond the sizes run."""
    return math.exp(coef["log_c"]) * n**k


def run_sizes(a) -> list[dict]:
    runs = []
    out_dir = Path(tempfile.mkdtemp(prefix="pharos-growth-"))
    for nodes, frac in zip(a.sizes, a.fractions, strict=True):
        m = machine(nodes)
        out = out_dir / f"simulate-{nodes}.json"
        cmd = [
            sys.executable,
            str(HERE / "simulate.py"),
            f"--nodes={nodes}",
            f"--forwarders={m['forwarders']}",
            f"--targets={m['targets']}",
            f"--jobs={m['jobs']}",
            f"--minutes={a.minutes}",
            f"--rate-fraction={frac}",
            f"--json={out}",
        ] + (["--keep"] if a.keep else [])
        print("growth: " + " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True)
        runs.append(json.loads(out.read_text()))
    print(f"growth: results in {out_dir}")
    return runs


def report(runs: list[dict], at: list[int]) -> None:
    runs = sorted(runs, key=lambda r: r["nodes"])
    ns = [float(r["nodes"]) for r in runs]
    table = [costs(r) for r in runs]
    sizes = " / ".join(f"{r['nodes']:,}-{r['forwarders']}-{r['targets']}-{r['jobs']:,}" for r in runs)
    print(f"sizes (nodes-forwarding nodes-targets-jobs): {sizes}")
    print(
        "fractions of real time: "
        + ", ".join(f"{r['rate_fraction']:g}" for r in runs)
        + "; records/s ingested (the load, not fitted): "
        + ", ".join(f"{r['ingested_per_s']:,.0f}" for r in runs)
    )
    head = f"{'cost':<28}" + "".join(f"{r['nodes']:>12,}" for r in runs) + f"{'N^k: k':>8}  {'best fit':<10}"
    head += "".join(f"{'at ' + format(n, ','):>14}" for n in at)
    print(head)
    for name in table[0]:
        ys = [t[name] for t in table]
        k, model, coef = fit(ns, ys)
        row = f"{name:<28}" + "".join(f"{'n/a' if y is None else format(y, ',.2f'):>12}" for y in ys)
        row += f"{'n/a' if k is None else format(k, '.2f'):>8}  {model or 'n/a':<10}"
        row += "".join(f"{format(predict(coef, k, n), ',.2f') if k is not None else 'n/a':>14}" for n in at)
        print(row)
    if at:
        print("(the 'at' columns extrapolate the power law y ~ N^k beyond the sizes measured)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1024,4096,40960", help="compute node counts, comma-separated")
    ap.add_argument("--fractions", default="1,0.25,0.005", help="each size's fraction of real time, comma-separated")
    ap.add_argument("--minutes", type=float, default=5.0, help="each run's load, minutes")
    ap.add_argument("--from", dest="from_", nargs="+", type=Path, help="fit these simulate.py --json files instead")
    ap.add_argument("--at", default="", help="node counts to extrapolate the fits to, comma-separated")
    ap.add_argument("--keep", action="store_true", help="keep each run's tmp dir (simulate.py --keep)")
    a = ap.parse_args(argv)
    a.sizes = [int(x) for x in a.sizes.split(",") if x]
    a.fractions = [float(x) for x in a.fractions.split(",") if x]
    at = [int(x) for x in a.at.split(",") if x]
    if a.from_:
        runs = [json.loads(p.read_text()) for p in a.from_]
    else:
        if len(a.sizes) != len(a.fractions):
            ap.error("--sizes and --fractions need as many values")
        runs = run_sizes(a)
    if len(runs) < 2:
        ap.error("a fit needs two sizes at least")
    report(runs, at)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
