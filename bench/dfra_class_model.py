"""Learned DFRA job classes vs the exact-match rule on a time-ordered split of a real history.

The history is made by real runs (needs root: eBPF agent, job cgroups, FUSE): one embedded stack
(``pharos up`` in a temporary state dir: Kafka, agent, 4 forwarding daemons, the mount, the
pipeline on chDB), the public Darshan corpus imported into it (``pharos import darshan``: the logs
with DXT give jobs with I/O from ALCF/NERSC machines, years before the runs), then ``--rounds``
rounds of 7 job families run through ``pharos run`` on the mount, with ``PHAROS_RUN_HINT=false``
so every run keeps the default mapping (the history is what the jobs did, not what DFRA gave):

=========  ===================================================================  ===============
family     command                                                               class
=========  ===================================================================  ===============
ckpt       fio N-N, 4 ranks x 48-56 MiB                                          dedicated
ckpt2      the same fio on 2 ranks                                               default (ranks)
mid        fio N-N, 4 ranks x 16-20 MiB                                          more_nodes
shared     fio N-1 (one file, each rank its own 16 MiB extent), 4 ranks          more_nodes
tiny       fio N-N, 4 ranks x 2 MiB                                              default (bytes)
dd         dd of 16 MiB, 1 rank                                                  default (ranks)
mpi        mpiexec -n 4 of fio (one file per MPI rank), 48 MiB each              dedicated
=========  ===================================================================  ===============

The classifier's thresholds are scaled to this machine like the live DFRA tests
(``PHAROS_CONTROL_*``: N-N or N-1, >= 48 MiB, >= 4 I/O ranks benefit; >= 160 MiB is very high
volume: dedicated). Names and arguments change from round to round (a family keeps its name in
every other round, sizes cycle), so some later jobs have exact history and others do not.

The store is then read (the stack stopped: chDB allows one process): every finished job with I/O,
labelled with the class of its own numbers (``class_model.training_samples``), ordered by start,
the first ``--train-share`` trains the model, each later job is predicted by the exact-match rule
(every earlier job visible), the model, and both (exact match when there is history, else the
model: what the control loop does). Printed: accuracy (all test jobs, those without exact
history), the confusion matrices, the model's fall-backs to default and the median bandwidth
error (|log10 predicted/true|). Before stopping, one job whose name and command never ran is run
WITH its hint: the line ``pharos run`` prints (class, nodes, applied before its ranks start) and
the forwarding nodes in the daemons' records of its requests.

Run: ``sudo uv run python bench/dfra_class_model.py`` (about 6 minutes on 2 cores: 1 to start the
stack, 1 to import the corpus, 9 s per job).
Nothing is written in the repository: the state dir is a temporary directory, removed at the end
(``--keep`` keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from pharos_testkit import DARSHAN_LOGS, dfra_live_env, forwarder_nodes, pharos_run, stack_settings  # noqa: E402

from pharos_analytics.control.class_model import CLASSES, evaluate, training_samples  # noqa: E402
from pharos_analytics.control.config import ControlConfig  # noqa: E402
from pharos_api import stack  # noqa: E402
from pharos_api.demo import wait_for_summary  # noqa: E402
from pharos_core.settings import Settings  # noqa: E402
from pharos_core.store import open_store  # noqa: E402

MiB = 1 << 20
THRESHOLDS = dfra_live_env(4) | {
    "PHAROS_CONTROL_DFRA_MIN_BYTES": str(48 * MiB),
    "PHAROS_CONTROL_DFRA_DEDICATED_MIN_BYTES": str(160 * MiB),
    "PHAROS_CONTROL_DFRA_MODEL_MIN_JOBS": "10",
    "PHAROS_CONTROL_DFRA_MODEL_RETRAIN_S": "0",
}


def fio(size: str, extra: str = "", file: str = "$PHAROS_JOB_ID.$PHAROS_RANK", tag: str = "w") -> str:
    return (
        f"exec fio --name={tag} --ioengine=psync --rw=write --bs=1m --size={size} --end_fsync=1 "
        f"--output-format=terse --disk_util=0 {extra}--filename=$PHAROS_DATA/{file}"
    )


#: family -> (ranks given to pharos run, sizes cycled by round, the command for a size)
FAMILIES: dict[str, tuple[int, list[str], object]] = {
    "ckpt": (4, ["48m", "56m"], lambda s: ["sh", "-c", fio(s, tag="ckpt")]),
    "ckpt2": (2, ["48m", "56m"], lambda s: ["sh", "-c", fio(s, tag="ckpt")]),
    "mid": (4, ["16m", "20m"], lambda s: ["sh", "-c", fio(s, tag="mid")]),
    "shared": (
        4,
        ["16m"],
        lambda s: ["sh", "-c", fio(s, f"--offset=$((PHAROS_RANK * {s[:-1]}))m ", "$PHAROS_JOB_ID.shared", "shared")],
    ),
    "tiny": (4, ["2m"], lambda s: ["sh", "-c", fio(s, tag="tiny")]),
    "dd": (
        1,
        ["16"],
        lambda s: [
            "sh",
            "-c",
            f"exec dd if=/dev/zero of=$PHAROS_DATA/$PHAROS_JOB_ID bs=1M count={s} conv=fsync status=none",
        ],
    ),
    "mpi": (
        1,
        ["48m"],
        lambda s: ["mpiexec", "-n", "4", "sh", "-c", fio(s, file="$PHAROS_JOB_ID.$PMI_RANK", tag="mpi")],
    ),
}


def plan(rounds: int) -> list[tuple[str, str, int, list[str]]]:
    """(job id, name, ranks, command) of every history run, in order: round r runs each family
    once; family i keeps its plain name when (r + i) is even, else gets a new one; sizes cycle."""
    out = []
    for r in range(rounds):
        for i, (fam, (ranks, sizes, cmd)) in enumerate(FAMILIES.items()):
            name = fam if (r + i) % 2 == 0 else f"{fam}-r{r}"
            out.append((f"h{r}-{fam}", name, ranks, cmd(sizes[r % len(sizes)])))  # type: ignore[operator]
    return out


def run_job(settings: Settings, job: str, name: str, ranks: int, command: list[str], data: Path, hint: bool) -> str:
    """One ``pharos run``; returns its ``pharos run:`` lines. A job whose ranks fail is still a
    job of the history (its events and records are stored): said, not fatal."""
    argv, env = pharos_run(settings, job, command, ranks, name)
    env |= {"PHAROS_DATA": str(data), "PHAROS_RUN_HINT": "true" if hint else "false"}
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode:
        print(f"  {job}: exit {p.returncode}: {(p.stdout + p.stderr)[-1500:]}", flush=True)
    for f in data.iterdir():  # bound the disk: the records are what the history keeps
        f.unlink()
    return "; ".join(ln for ln in p.stderr.splitlines() if ln.startswith("pharos run:"))


def import_darshan(settings: Settings, folder: Path) -> str:
    logs = sorted(str(p) for p in folder.rglob("*.darshan"))
    if not logs:
        return "no Darshan logs"
    env = dict(os.environ, **stack.settings_env(settings))
    cmd = [sys.executable, "-m", "pharos_api.cli", "import", "darshan", *logs]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return f"{len(logs)} Darshan logs imported (exit {p.returncode})"


def matrix(conf: list[list[int]]) -> str:
    w = max(len(c) for c in CLASSES) + 2
    lines = [" " * (w + 6) + "".join(f"{c:>{w}}" for c in CLASSES)]
    for c, row in zip(CLASSES, conf, strict=True):
        lines.append(f"  true {c:<{w}}" + "".join(f"{v:>{w}}" for v in row))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="rounds of the 7 job families (default 4)")
    ap.add_argument("--train-share", type=float, default=0.6, help="oldest share of the jobs that trains")
    ap.add_argument("--min-confidence", type=float, default=None, help="[control] dfra_model_min_confidence")
    ap.add_argument("--darshan", type=Path, default=DARSHAN_LOGS, help="Darshan logs (default: the corpus)")
    ap.add_argument("--no-darshan", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the state dir")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: the eBPF agent, job cgroups and FUSE")
    os.environ.update(THRESHOLDS)
    if a.min_confidence is not None:
        os.environ["PHAROS_CONTROL_DFRA_MODEL_MIN_CONFIDENCE"] = str(a.min_confidence)
    state = Path(tempfile.mkdtemp(prefix="pharos-classes-"))
    try:
        report(a, state)
    finally:
        if not a.keep:
            shutil.rmtree(state, ignore_errors=True)


def report(a: argparse.Namespace, state: Path) -> None:
    """Make the history in ``state``, evaluate, print (module doc)."""
    settings = stack_settings(state, "pharos-bench-classes")
    t0 = time.monotonic()
    demo: dict = {}
    try:
        stack.start(settings)
        print(f"stack ready in {time.monotonic() - t0:.0f} s ({state})", flush=True)
        if not a.no_darshan and a.darshan.is_dir():
            print(import_darshan(settings, a.darshan), flush=True)
        data = settings.mount_point / "classes"
        data.mkdir(exist_ok=True)
        jobs = plan(a.rounds)
        for k, (job, name, ranks, command) in enumerate(jobs):
            t = time.monotonic()
            run_job(settings, job, name, ranks, command, data, hint=False)
            print(f"[{k + 1}/{len(jobs)}] {job} ({name}, {ranks} rank(s)) {time.monotonic() - t:.1f} s", flush=True)
        # the last run's records stored: the model's history is complete
        wait_for_summary(settings.api_url, jobs[-1][0], 1, timeout_s=90, layer="forwarder")
        time.sleep(3)
        # one unseen job (a name and command never run), WITH its hint: the learned class before its first I/O
        job, name = "unseen-ckpt", "restart-from-checkpoint"
        command = ["sh", "-c", fio("52m", tag="restart")]
        line = run_job(settings, job, name, 4, command, data, hint=True)
        wait_for_summary(settings.api_url, job, 1, timeout_s=90, layer="forwarder")
        time.sleep(2)
        demo = {"job": job, "name": name, "hint": line, "forwarder_bytes": forwarder_nodes(settings.api_url, job)}
    finally:
        stack.stop(settings)
    print(f"history made in {time.monotonic() - t0:.0f} s", flush=True)

    store = open_store(settings)
    try:
        cfg = ControlConfig()
        samples = [s for s in training_samples(store, cfg) if s.job_id != demo.get("job")]
        decision = store.query(
            "SELECT kind, to_state, reason, evidence, toUnixTimestamp64Nano(time) AS t FROM control_actions "
            "WHERE job_id = {j:String} AND startsWith(kind, 'dfra_')",
            {"j": demo.get("job", "")},
        )
        first_io = store.query(
            "SELECT toUnixTimestamp64Nano(min(start)) AS t FROM io_requests WHERE job_id = {j:String} "
            "AND layer = 'forwarder'",
            {"j": demo.get("job", "")},
        )
    finally:
        store.close()
    print(f"\nhistory: {len(samples)} finished jobs with I/O", end=" ")
    print(f"({sum(s.job_id.startswith('h') for s in samples)} real runs, the rest imported Darshan logs)")
    print("labels (class of each job's own numbers):", {c: sum(s.label == c for s in samples) for c in CLASSES})
    out: dict = {"samples": len(samples), "classifiers": {}}
    for kind in ("logistic", "forest"):
        c = cfg.model_copy(update={"dfra_model_classifier": kind})
        ev = evaluate(samples, c, train_share=a.train_share)
        print(
            f"\n== classifier {kind}, min confidence {c.dfra_model_min_confidence:g}: train {ev.train}, "
            f"test {ev.test} (of which {ev.unseen} without exact history), time-ordered"
        )
        for pol, p in ev.policies.items():
            print(f"{pol:>12}: accuracy {p['accuracy']:.3f}, on jobs without exact history {p['accuracy_unseen']:.3f}")
            print(matrix(p["confusion"]))
        print(f"model fell back to default (unsure) for {ev.fallbacks} of {ev.test} test jobs")
        print(
            "median bandwidth error |log10(pred/true)|: model "
            f"{ev.bandwidth_log_error['model']:.3f}, exact match (jobs with history) {ev.bandwidth_log_error['exact']:.3f}"
        )
        out["classifiers"][kind] = {
            "train": ev.train,
            "test": ev.test,
            "unseen": ev.unseen,
            "policies": ev.policies,
            "fallbacks": ev.fallbacks,
            "bandwidth_log_error": ev.bandwidth_log_error,
            "rows": ev.rows,
        }
    if demo:
        print(f"\n== unseen job {demo['job']} ({demo['name']}), run with its hint")
        print(f"  {demo['hint']}")
        if decision:
            d = decision[0]
            ev_l = json.loads(d["evidence"] or "{}").get("learned", {})
            gap = (int(first_io[0]["t"]) - int(d["t"])) / 1e9 if first_io and int(first_io[0]["t"]) else float("nan")
            print(f"  decision {d['kind']} -> {d['to_state']}, {gap:.2f} s before its first forwarder record")
            print(f"  reason: {d['reason']}")
            print(f"  probabilities {ev_l.get('probabilities')}, similar jobs {ev_l.get('similar_jobs')}")
            demo |= {"decision": d["kind"], "nodes": d["to_state"], "decided_before_first_io_s": gap}
        print(f"  forwarder records' bytes per forwarding node: {demo['forwarder_bytes']}")
        out["unseen_job"] = demo
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
