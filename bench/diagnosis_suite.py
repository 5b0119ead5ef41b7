"""The labelled fault-injection suite (issue 24): how often Pharos's diagnosis is right, on the
real stack, in figures anyone can rerun.

    uv run --frozen python bench/diagnosis_suite.py --cases 100 --seed 1 --json suite.json

One embedded stack for the run (``pharos_api.stack``: Kafka broker, the eBPF agent, pharos-fwd
fwd0..fwd3 on 8 storage targets, the pharos-mount FUSE client, pipeline + detection loop + API
on chDB; the control loop off, so the mappings and faults are the suite's). Then ``--cases``
cases, one after another, each a real job started with ``pharos run`` on the mount, its class
drawn round-robin from a seeded shuffle of the 12 classes (:data:`diagnosis_scoring.CLASSES`)
and its sizes, rank counts and timing drawn from ranges (seeded: the same ``--seed`` gives the same
cases):

* client-side (the workload is the fault): ``small_writes`` (1-8 KiB writes), ``small_reads_shared``
  (ranks reading one shared file in 4-64 KiB requests), ``misaligned`` (writes at offsets that are
  not 4 KiB multiples), ``random_reads`` (4-16 KiB random reads), ``rank_imbalance`` (rank 0 writes
  4-8x the others), ``fsync_per_write`` (an fsync after every 1 MiB write), ``metadata_storm``
  (rounds of create, stat and unlink of ~1,000 empty files a rank, for 5-8 s), ``clean`` (1-4 MiB
  sequential writes, N-N or N-1: no fault);
* system-side (the fault is injected under a well-behaved job): ``slow_target`` (one target slowed
  4-8x through the daemons' fault interface, ``PUT /targets/ostK {"slowdown"}``, under an 8-rank
  job writing on every target), ``slow_forwarding_node`` (one daemon's CPU capped at 35-65% of what it
  needs to serve its share of the job, measured uncapped in the job's first seconds: the cgroup
  CPU controller's quota, a forwarding node starved of CPU), under an 8-rank job mapped
  to all four), ``interference_forwarding_node`` (a heavy job mapped to the light job's forwarding
  node), ``interference_target`` (a heavy job on another forwarding node writing to the light job's
  target).

Each case's label is (class, resource, job); what Pharos named (insights of severity high, the
job's interference events, stored anomalies with their onset in the case) is scored by
:mod:`diagnosis_scoring` (precision, recall, per class, seconds from fault to detection). Prints
one table; ``--json`` writes ``{cases, precision, recall, per_class, ...}`` with every case.
Bounded: each job runs at most ~20 s and is stopped if it does not end; a failing case is
recorded with its error and counted as missed. Needs root (eBPF, cgroups, FUSE), fio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnosis_cases import CASES, DIAG_ENV, FWD_NODES, N_TARGETS, Suite, _job
from diagnosis_scoring import CLASSES, CaseResult, score
from pharos_testkit import stack_settings


def plan(n: int, seed: int, classes: list[str] | None = None) -> list[str]:
    """The class of each of ``n`` cases: round-robin over a seeded shuffle of ``classes``."""
    order = list(classes or CLASSES)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(n)]


def run_suite(
    settings,
    n: int,
    seed: int,
    classes: list[str] | None = None,
    log=print,
    progress=None,
    darshan_lib: Path | None = None,
) -> list[CaseResult]:
    """Run the cases on the running stack of ``settings``; ``progress(i, result)`` after each.
    With ``darshan_lib``, every client-side case also runs under Darshan and is scored on its log."""
    s = Suite(settings, seed, log, darshan_lib)
    rng = random.Random(seed)
    out = []
    try:
        for i, cls in enumerate(plan(n, seed, classes)):
            t = time.monotonic()
            try:
                r = CASES[cls](s, i, rng)
            except Exception as exc:  # a failed case is recorded and counted as missed
                r = CaseResult(i, cls, "", _job(s, i, cls), {}, error=f"{type(exc).__name__}: {exc}")
            r.wall_s = time.monotonic() - t
            out.append(r)
            if progress:
                progress(i, r)
    finally:
        shutil.rmtree(s.out, ignore_errors=True)
        shutil.rmtree(s.root, ignore_errors=True)
    return out


@contextlib.contextmanager
def running_suite_stack(state: Path) -> Iterator[Any]:
    """The embedded stack of the suite (4 forwarding nodes, 8 targets), stopped after."""
    from pharos_api import stack

    settings = stack_settings(
        state, "pharos-suite", fwd_nodes=FWD_NODES, fwd_targets=N_TARGETS, fwd_target_limits_mb_s=[], run_hint=False
    )
    old = {k: os.environ.get(k) for k in DIAG_ENV}
    os.environ.update(DIAG_ENV)
    try:
        stack.start(settings)
        yield settings
    finally:
        try:
            stack.stop(settings)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def table(summary: dict, results: list[CaseResult], what: str = "diagnosis suite") -> Any:
    from rich.table import Table

    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    tb = Table(
        title=f"{what}: {len(results)} cases, precision {f(summary['precision'])}, recall {f(summary['recall'])}, "
        f"median detect {f(summary['median_detect_s'], '{:.1f} s')}"
    )
    for c in ("class", "cases", "TP", "FP", "FN", "precision", "recall", "median detect s"):
        tb.add_column(c, justify="left" if c == "class" else "right")
    for cls, p in summary["per_class"].items():
        tb.add_row(
            cls,
            str(p["cases"]),
            str(p["tp"]),
            str(p["fp"]),
            str(p["fn"]),
            f(p["precision"]),
            f(p["recall"]),
            f(p["median_detect_s"], "{:.1f}"),
        )
    return tb


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    ap.add_argument("--cases", type=int, default=100, help="number of cases (default 100)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the classes' order and the cases' parameters")
    ap.add_argument("--json", type=Path, help="write the results here (cases, precision, recall, per_class)")
    ap.add_argument("--classes", help="comma-separated subset of: " + ",".join(CLASSES))
    ap.add_argument("--state-dir", type=Path, help="the stack's state dir (default: a new temporary one, removed)")
    ap.add_argument(
        "--darshan-lib",
        type=Path,
        help="Darshan's runtime library (libdarshan.so of a darshan-runtime built without MPI, see Darshan's own "
        "docs: darshan-runtime/README): the client-side cases run again under it and are scored on their logs too",
    )
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("the suite needs root: the eBPF agent, job cgroups and the FUSE mount")
    if shutil.which("fio") is None:
        sys.exit("fio missing: apt-get install fio (make setup installs it)")
    if a.darshan_lib and not a.darshan_lib.is_file():
        sys.exit(f"--darshan-lib {a.darshan_lib}: no such file")
    classes = a.classes.split(",") if a.classes else None
    if classes and (bad := set(classes) - set(CLASSES)):
        sys.exit(f"unknown classes {sorted(bad)}; known: {', '.join(CLASSES)}")
    from rich.console import Console
    from rich.progress import Progress

    con = Console()
    state = a.state_dir or Path(tempfile.mkdtemp(prefix="pharos-suite-"))
    t0 = time.monotonic()
    with running_suite_stack(state) as settings, Progress(console=con) as bar:
        task = bar.add_task("cases", total=a.cases)

        def progress(i: int, r: CaseResult) -> None:
            fp = ", ".join(f"{f.cls} {f.resource}".strip() for f in r.false_positives())
            mark = (
                "ok"
                if (r.detected or (r.label == "clean" and not fp)) and not fp
                else "MISS"
                if not r.detected and r.label != "clean"
                else "FP"
            )
            bar.console.print(
                f"[{i:3d}] {r.label:29s} {r.resource:5s} {mark:4s} {r.wall_s:5.1f} s"
                + (f"  false: {fp}" if fp else "")
                + (f"  error: {r.error}" if r.error else "")
            )
            bar.advance(task)

        results = run_suite(
            settings, a.cases, a.seed, classes, log=con.print, progress=progress, darshan_lib=a.darshan_lib
        )
    if not a.state_dir:
        shutil.rmtree(state, ignore_errors=True)
    summary = score(results)
    con.print(table(summary, results))
    logs = [x for r in results if (x := r.as_log()) is not None]
    if logs:  # the client-side cases scored on the trace and on Darshan logs of the same workloads
        traced = [r for r in results if r.log_findings is not None]
        summary["trace_vs_log"] = {"trace": score(traced), "log": score(logs)}
        for side, sm in summary["trace_vs_log"].items():
            con.print(table(sm, logs, f"client-side cases from the {side}"))
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "seed": a.seed,
                    "cases": [r.to_dict() for r in results],
                    **summary,
                    "wall_s": round(time.monotonic() - t0, 1),
                },
                indent=2,
            )
        )
    print(
        f"diagnosis suite: cases {len(results)}, precision {summary['precision']}, recall {summary['recall']}, "
        f"median detect {summary['median_detect_s']} s"
    )


if __name__ == "__main__":
    main()
