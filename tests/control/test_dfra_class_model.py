"""Learned DFRA job classes (analytics/pharos_analytics/control/class_model.py; DFRA FAST'19 §3-4
history, Beacon NSDI'19 classifier as labels): features of a job at dispatch, training and the
confidence fallback (pure), the history read from a real chDB store and the control loop's
decision for an unseen job, then on the REAL stack: an unseen job name and command gets its
predicted class before its first I/O, checked in the forwarding daemons' records."""

from __future__ import annotations

import os
import time
from pathlib import Path

import control_rows as cr
import httpx
import pytest
from pharos_testkit import dfra_live_env, forwarder_nodes, stack_settings

from pharos_analytics.control.class_model import (
    ClassModel,
    JobIdentity,
    Sample,
    evaluate,
    exact_match_class,
    executable,
    job_features,
    training_samples,
)
from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.dfra import NodeState, decide
from pharos_analytics.profiles import JobMetrics

MiB = 1 << 20
FIO = ("sh", "-c", "exec fio --name=w --rw=write --bs=1m --size={size} --filename=/mnt/$PHAROS_JOB_ID.$PHAROS_RANK")


def cfg(**kw) -> ControlConfig:
    base = dict(
        dfra_min_bytes=64 * MiB,
        dfra_min_io_ranks=4,
        dfra_dedicated_min_bytes=256 * MiB,
        dfra_model_min_jobs=4,
        reserved_nodes=["fwd2", "fwd3"],
    )
    return ControlConfig(**(base | kw))


def metrics(job: str, nbytes: float, io_ranks: int, pattern: str = "N-N", bw: float = 200e6) -> JobMetrics:
    nums = dict.fromkeys(
        (
            "bytes_read",
            "busy_s",
            "mean_request_bytes",
            "metadata_ops",
            "metadata_ops_s",
            "ranks",
            "targets",
        ),
        0.0,
    )
    nums |= {
        "bytes": nbytes,
        "bytes_written": nbytes,
        "span_s": nbytes / bw,
        "bandwidth_b_s": bw,
        "data_requests": nbytes / MiB,
        "io_ranks": float(io_ranks),
        "forwarding_nodes": 1.0,
    }
    return JobMetrics(job, "", "", "forwarder", 0, nums, pattern)


def sample(i: int, name: str, size_mib: int, ranks: int, c: ControlConfig, user: str = "alice") -> Sample:
    from pharos_analytics.control.class_model import label_of

    cmd = tuple(w.format(size=f"{size_mib}m") for w in FIO)
    m = metrics(f"j{i}", size_mib * MiB * ranks, ranks)
    return Sample(f"j{i}", JobIdentity(name, user, cmd, ranks), i * 10**9, m, label_of(m, c))


def history(c: ControlConfig) -> list[Sample]:
    """Checkpoint writers (4 ranks x 80 MiB: dedicated), mid writers (4 x 24 MiB: more_nodes) and
    small or serial jobs (default), each run under several names."""
    out = []
    for k in range(4):
        out.append(sample(len(out), f"ckpt-{k}", 80, 4, c))
        out.append(sample(len(out), f"mid-{k}", 24, 4, c))
        out.append(sample(len(out), f"small-{k}", 2, 4, c))
        out.append(sample(len(out), f"serial-{k}", 80, 1, c))
    return out


# -- features -------------------------------------------------------------------------------------
def test_executable_skips_launchers_wrappers_and_shells():
    assert executable(["mpiexec", "-n", "4", "--host", "a,b", "/opt/ior/bin/ior", "-t", "1m"]) == "ior"
    assert executable(["srun", "--ntasks=8", "env", "OMP_NUM_THREADS=2", "./wave", "-x"]) == "wave"
    assert executable(["sh", "-c", "cd /tmp && exec fio --rw=write"]) == "fio"
    assert executable(["mpiexec", "-n", "4", "sh", "-c", "exec fio --name=x.$PMI_RANK"]) == "fio"
    assert executable(["numactl", "--interleave=all", "time", "dd", "if=/dev/zero"]) == "dd"
    assert executable([]) == ""


def test_features_tokens_ranks_and_sizes():
    f = job_features(
        JobIdentity("ckpt-run-17", "alice", ("mpiexec", "-n", "8", "/bin/ior", "-b", "32m", "-o", "/pfs/x7/out"), 8)
    )
    assert f["exe=ior"] == f["launcher=mpiexec"] == f["user=alice"] == 1.0
    assert f["name=ckpt"] == f["name=run"] == 1.0 and not any(k.startswith("name=17") for k in f)
    assert f["arg=#m"] == 1.0 and f["arg=out"] == 1.0 and f["opt=-b"] == 1.0
    assert f["log2_ranks"] == 3.0 and f["ranks_known"] == 1.0
    assert f["log2_arg_bytes"] == 25.0  # 32 MiB
    unknown = job_features(JobIdentity("x", "bob", ("fio",), 0))
    assert unknown["log2_ranks"] == 0.0 and unknown["ranks_known"] == 0.0 and unknown["log2_arg_bytes"] == 0.0


# -- training, prediction, fallback ---------------------------------------------------------------
def test_fit_needs_enough_jobs_and_two_classes():
    c = cfg()
    h = history(c)
    assert ClassModel.fit(h[:3], c)[0] is None and "needs 4" in ClassModel.fit(h[:3], c)[1]
    same = [s for s in h if s.label == "default"]
    model, why = ClassModel.fit(same, c)
    assert model is None and "nothing to learn" in why
    assert {s.label for s in h} == {"default", "more_nodes", "dedicated"}


@pytest.mark.parametrize("kind", ["logistic", "forest"])
def test_unseen_names_get_the_class_of_the_jobs_they_resemble(kind):
    c = cfg(dfra_model_classifier=kind, dfra_model_min_confidence=0.5)
    model, _ = ClassModel.fit(history(c), c)
    assert model is not None
    cmd = tuple(w.format(size="80m") for w in FIO)
    p = model.predict(JobIdentity("ckpt-new", "alice", cmd, 4))
    assert (p.predicted, p.klass, p.confident) == ("dedicated", "dedicated", True), p.evidence
    assert p.history.runs == 0 and len(p.history.jobs) == 3 and p.history.bandwidth_b_s > 0
    assert "exe=fio" in p.evidence["features"] and p.reason.startswith("learned class dedicated")
    # the same command on one rank resembles the serial jobs: default
    assert model.predict(JobIdentity("serial-new", "alice", cmd, 1)).predicted == "default"


def test_unsure_model_falls_back_to_default():
    c = cfg(dfra_model_min_confidence=0.99)
    model, _ = ClassModel.fit(history(c), c)
    p = model.predict(JobIdentity("other", "carol", ("python3", "train.py"), 2))
    assert p.confidence < 0.99 and not p.confident and p.klass == "default"
    assert "unsure" in p.reason


def test_decide_uses_the_learned_class_only_without_history():
    c = cfg(dfra_model_min_confidence=0.5, node_capacity_b_s=1e10)
    model, _ = ClassModel.fit(history(c), c)
    cmd = tuple(w.format(size="80m") for w in FIO)
    learned = model.predict(JobIdentity("ckpt-new", "alice", cmd, 4))
    nodes = [NodeState("fwd0"), NodeState("fwd1"), NodeState("fwd2", reserved=True), NodeState("fwd3", reserved=True)]
    d = decide("j", None, nodes, "fwd0", 1e10, c, None, learned)
    assert (d.klass, d.nodes, d.reserved) == ("dedicated", ["fwd2"], ["fwd2"])
    assert d.reason.startswith("no earlier run with this name, user and command; learned class dedicated")
    assert d.evidence["learned"]["predicted"] == "dedicated" and d.evidence["sizing"]["wanted"] == 1
    assert decide("j", None, nodes, "fwd0", 1e10, c).klass == "default"  # no model: DFRA's default


def test_exact_match_and_time_ordered_evaluation():
    c = cfg(dfra_model_min_confidence=0.5)
    h = history(c)
    # a repeated job: exact match finds its earlier runs
    again = sample(len(h), "ckpt-0", 80, 4, c)
    klass, hist = exact_match_class(h, again.ident, c)
    assert klass == "dedicated" and hist is not None and hist.jobs == ["j0"]
    assert exact_match_class(h, JobIdentity("never", "alice", ("fio",), 4), c) == ("default", None)
    unseen = [
        sample(len(h) + i, f"{fam}-new", size, ranks, c)
        for i, (fam, size, ranks) in enumerate([("ckpt", 80, 4), ("mid", 24, 4), ("small", 2, 4), ("serial", 80, 1)])
    ]
    ev = evaluate([*h, again, *unseen], c, train_share=len(h) / (len(h) + 5))
    assert (ev.train, ev.test, ev.unseen) == (16, 5, 4)
    # exact match: right for ckpt-0 again and for the two default jobs (small-new, serial-new) only
    assert ev.policies["exact"]["accuracy"] == pytest.approx(3 / 5)
    assert ev.policies["exact+model"]["accuracy"] == 1.0 and ev.policies["model"]["accuracy_unseen"] == 1.0
    conf = ev.policies["exact"]["confusion"]  # rows true, columns predicted: default, more_nodes, dedicated
    assert conf == [[2, 0, 0], [1, 0, 0], [1, 0, 1]]


# -- the store and the control loop -------------------------------------------------------------
T0 = time.time_ns() - 3 * 3600 * cr.NS


def test_history_from_the_store_trains_the_loop_model(store, tmp_path, monkeypatch):
    from pharos_analytics.control.loop import ControlLoop
    from pharos_core.settings import Settings

    rows_ev, rows_io = [], []
    for k in range(3):  # 3 families x 3 names, 20 s apart
        for fam, ranks, per_rank, shared in (("ckpt", 4, 80, False), ("wide", 4, 24, True), ("tiny", 4, 2, False)):
            job = f"cm-{fam}-{k}"
            t = T0 + len(rows_ev) * 10 * cr.NS
            cmd = ["sh", "-c", f"exec fio --name={fam} --size={per_rank}m --filename=/pfs/$PHAROS_JOB_ID"]
            rows_ev += cr.job_events(job, t, t + 15 * cr.NS, f"{fam}-{k}", command=cmd, ranks=ranks)
            rows_io += cr.requests(job, t, ranks, per_rank, shared_file=shared)
    store.insert_rows("job_events", rows_ev)
    store.insert_rows("io_requests", rows_io)
    c = cfg()
    samples = training_samples(store, c)
    got = {s.job_id: s.label for s in samples if s.job_id.startswith("cm-")}
    assert got["cm-ckpt-0"] == "dedicated" and got["cm-wide-1"] == "more_nodes" and got["cm-tiny-2"] == "default"
    assert samples == sorted(samples, key=lambda s: s.start_ns) and samples[0].ident.ranks == 4
    for k, v in dict(
        DFRA_MIN_BYTES=64 * MiB,
        DFRA_MIN_IO_RANKS=4,
        DFRA_DEDICATED_MIN_BYTES=256 * MiB,
        DFRA_MODEL_MIN_JOBS=4,
        DFRA_MODEL_MIN_CONFIDENCE=0.5,
        NODE_CAPACITY_B_S=1e10,
        PLACEMENT_ENABLED="false",
    ).items():
        monkeypatch.setenv(f"PHAROS_CONTROL_{k}", str(v))
    s = Settings(state_dir=tmp_path, fwd_nodes=2, fwd_port_base=9, mount_admin_port=9)
    loop = ControlLoop(store, s, client=httpx.Client(timeout=0.5))
    cmd = ["sh", "-c", "exec fio --name=ckpt --size=80m --filename=/pfs/$PHAROS_JOB_ID"]
    p = loop.preview("ckpt-brand-new", "alice", cmd, ranks=4)
    assert p["evidence"]["learned"]["predicted"] == "dedicated", p
    assert p["reason"].startswith("no earlier run with this name, user and command; learned class dedicated")
    # exact history wins over the model
    exact = loop.preview("ckpt-0", "alice", cmd)
    assert exact["evidence"]["runs"] == 1 and "learned" not in exact["evidence"]
    monkeypatch.setenv("PHAROS_CONTROL_DFRA_MODEL_ENABLED", "false")
    off = loop.preview("ckpt-brand-new", "alice", cmd, ranks=4)
    assert off["class"] == "default" and "learned" not in off["evidence"]


# -- the real stack -------------------------------------------------------------------------------
RANKS = 4


def _fio_rank(size: str, tag: str) -> str:
    return (
        f"exec fio --name={tag} --ioengine=psync --rw=write --bs=1m --size={size} --end_fsync=1 "
        "--output-format=json --disk_util=0 --filename=$PHAROS_DATA/$PHAROS_JOB_ID.$PHAROS_RANK"
    )


DD = "exec dd if=/dev/zero of=$PHAROS_DATA/$PHAROS_JOB_ID.$PHAROS_RANK bs=1M count=4 conv=fsync status=none"


@pytest.mark.e2e
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="the eBPF agent, job cgroups and FUSE need root")
@pytest.mark.timeout(900)
def test_unseen_job_gets_its_learned_class_before_first_io(tmp_path_factory, tmp_path: Path):
    """Two earlier jobs on the real stack (a 4-rank fio checkpoint writer: dedicated, a 1-rank dd
    of 4 MiB: default) train the model; a job whose name and command never ran (another name,
    another fio job name, another size) gets the dedicated node fwd2 before its first I/O, and
    every forwarding daemon record of its requests carries fwd2, for all its bytes."""
    import subprocess
    import sys
    from datetime import datetime

    from pharos_testkit import pharos_run

    from pharos_agents.runner import _user
    from pharos_api import stack
    from pharos_api.demo import fio_totals, wait_for_summary

    env = dfra_live_env(RANKS) | {
        "PHAROS_CONTROL_DFRA_MODEL_MIN_JOBS": "2",
        "PHAROS_CONTROL_DFRA_MODEL_RETRAIN_S": "0",
        # two training jobs: the forest's vote for the most similar one is 0.645 (the default 0.7 is
        # for a real history; bench/dfra_class_model.py)
        "PHAROS_CONTROL_DFRA_MODEL_MIN_CONFIDENCE": "0.6",
    }
    state = tmp_path_factory.mktemp("classes")
    tag = os.getpid()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        settings = stack_settings(state, "pharos-classes")
        stack.start(settings)
        try:
            api = settings.api_url
            data = settings.mount_point / "classes"
            data.mkdir(exist_ok=True)

            def run(job: str, name: str, ranks: int, script: str, nbytes: int | None = None) -> dict:
                """``pharos run`` of ``sh -c script``; waits until the forwarder layer stored all
                its bytes (fio's own count, else ``nbytes``)."""
                out = tmp_path / job
                argv, penv = pharos_run(settings, job, ["sh", "-c", script], ranks, name, out)
                p = subprocess.run(argv, env=penv | {"PHAROS_DATA": str(data)}, capture_output=True, timeout=300)
                assert p.returncode == 0, p.stderr.decode()[-2000:]
                written = fio_totals(sorted(out.glob("rank_*.out")))["bytes_written"] if nbytes is None else nbytes
                fwd = wait_for_summary(api, job, written, timeout_s=90, layer="forwarder")
                assert fwd is not None and fwd["bytes_written"] == written, fwd
                lines = [ln for ln in p.stderr.decode().splitlines() if ln.startswith("pharos run:")]
                nodes = forwarder_nodes(api, job)
                print(f"[classes] {job} {name}: {lines}; forwarder bytes per node {nodes}", file=sys.stderr)
                return {"bytes": written, "fwd": fwd, "lines": lines, "nodes": nodes}

            # 4 ranks x 32 MiB, N-N: dedicated (dfra_live_env); dd of 4 MiB on 1 rank: default
            run(f"cl-ckpt-{tag}", f"ckpt-{tag}", RANKS, _fio_rank("32m", "ckpt"))
            run(f"cl-small-{tag}", f"small-{tag}", 1, DD, 4 * MiB)
            # both profiles stored: the preview of the unseen job (nothing recorded) shows the model's class
            unseen_cmd = ["sh", "-c", _fio_rank("40m", "restart")]
            deadline = time.monotonic() + 60
            while True:
                pv = httpx.get(
                    f"{api}/v1/hints",
                    params={"name": f"restart-{tag}", "user": _user(), "command": unseen_cmd, "ranks": RANKS},
                    timeout=30,
                ).json()
                if pv["class"] == "dedicated" or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            assert pv["class"] == "dedicated" and pv["evidence"]["runs"] == 0, pv
            job = f"cl-restart-{tag}"
            got = run(job, f"restart-{tag}", RANKS, _fio_rank("40m", "restart"))
            acts = httpx.get(f"{api}/v1/control/actions", params={"job": job}, timeout=30).json()["items"]
            d = [a for a in acts if a["kind"].startswith("dfra_")]
            assert len(d) == 1 and d[0]["kind"] == "dfra_dedicated" and d[0]["status"] == "applied", acts
            assert d[0]["reason"].startswith("no earlier run with this name, user and command; learned class dedicated")
            learned = d[0]["evidence"]["learned"]
            assert learned["predicted"] == "dedicated" and learned["confidence"] >= 0.6
            assert f"cl-ckpt-{tag}" == learned["similar_jobs"][0]["job_id"]
            assert got["lines"] == [f"pharos run: job {job}: forwarding dedicated on fwd2 (applied)"]

            def ts(iso: str) -> float:
                return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()

            assert ts(d[0]["time"]) < ts(got["fwd"]["first_io"]), (d[0]["time"], got["fwd"]["first_io"])
            assert set(got["nodes"]) == {"fwd2"} and sum(got["nodes"].values()) == got["bytes"]
        finally:
            stack.stop(settings)
