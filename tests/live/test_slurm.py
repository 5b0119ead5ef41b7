"""Slurm jobs on the REAL stack and a REAL Slurm (issue 13): ranks, pattern, bytes, the scheduler
plugin's hint before the first I/O, and jobs that run when Pharos is down.

One embedded stack (``pharos up``: Kafka, eBPF agent, forwarding daemons fwd0..fwd3 of which fwd2
and fwd3 are reserved, the FUSE mount, pipeline + API + control loop on chDB) and one Slurm
(munged, slurmctld, slurmd on loopback; tests/slurm_testkit.py) with the Pharos SPANK plugin
(agents/slurm/pharos_spank.c) and job_submit.lua. The job is what a user submits: ``sbatch`` of a
script whose ``srun --mpi=pmi2 -n 4`` runs an MPICH MPI-IO program (tests/data/mpi_write_at.c)
in which each rank writes 32 MiB at its own offset of ONE file on the Pharos mount, and rank 0 a
4 KiB results file beside it, as IOR does (issue 24: a side file must not turn N-1 into N-M).

1. The first job: Pharos shows it under Slurm's job id, with Slurm's job name and user, 4 ranks
   that all did I/O, pattern N-1 (writes N-1 by volume; the fan-in over both files N-M) and exactly
   the bytes MPI reports, on the client layer (eBPF agent) and the
   forwarder layer (mount + daemons); its DFRA decision (default mapping: no history) was taken
   before its first forwarder record, and those records carry its node.
2. ``pharos slurm classes`` writes the I/O class table; job_submit.lua tags the second job of the
   same name (AdminComment ``pharos:class=dedicated,...``); its plugin's hint gives it a reserved
   node before its first I/O, and the daemons' records of all its requests carry that node only.
3. With the API unreachable (a closed port; then a port that accepts but never answers), the same
   job completes, its I/O is still traced (the plugin's cgroup placement is local), the skipped
   hint and the failed events are counted (``pharos slurm status``) and the events are spooled;
   with the API back, the next job's prolog sends them again and Pharos has those jobs' start
   and end at the times they happened.
4. Spool and resend (issue 26): the API goes down while a job runs; its epilog spools the job's
   end (one root-only file); the API comes back; the next job's prolog sends it again and Pharos
   records the first job's end, with the time of its epilog.

The classifier's thresholds are lowered by configuration for this machine's size, as in
tests/control/test_control_dfra_live.py. Needs root (eBPF, cgroups, FUSE, slurmd), MPICH, Slurm.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from mpi_testkit import build_mpi_writer
from pharos_testkit import assert_one_pattern, dfra_live_env, forwarder_nodes, free_port, running_stack
from slurm_testkit import SlurmCluster, running_slurm

from pharos_api.demo import wait_for_summary
from pharos_core.settings import Settings

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the eBPF agent, job cgroups, FUSE and slurmd need root"),
]

MiB = 1 << 20
RANKS = 4
PER_RANK = 32 * MiB
TOTAL = RANKS * PER_RANK
SIDE = 4096  # rank 0's results file
WRITTEN = TOTAL + SIDE
NAME = "slurm-mpi-write"
CONTROL_ENV = dfra_live_env(RANKS)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The stack and a Slurm whose plugin talks to its API; yields (settings, cluster)."""
    state = tmp_path_factory.mktemp("slurm-stack")
    t0 = time.monotonic()
    with running_stack(state, "pharos-slurm", CONTROL_ENV) as settings:
        options = {"api": settings.api_url, "cgroup_parent": settings.cgroup_parent, "timeout": "2"}
        with running_slurm(options, job_submit=True) as cluster:
            print(f"\n[slurm] stack and Slurm ready in {time.monotonic() - t0:.1f} s ({cluster.dir})")
            yield settings, cluster


@pytest.fixture(scope="module")
def writer(tmp_path_factory) -> Path:
    return build_mpi_writer(tmp_path_factory.mktemp("mpi"))


def submit(cluster: SlurmCluster, exe: Path, data: Path, out_dir: Path, tag: str) -> tuple[str, dict, list[dict]]:
    """sbatch a job script running ``srun --mpi=pmi2 -n 4`` of the writer; waits for it; returns
    (Slurm job id, its final scontrol fields, the JSON lines its ranks printed)."""
    script = out_dir / f"{tag}.sbatch"
    out = out_dir / f"{tag}.out"
    script.write_text(
        "#!/bin/sh\n"
        f"#SBATCH --job-name={NAME}\n#SBATCH --ntasks={RANKS}\n#SBATCH --overcommit\n#SBATCH --output={out}\n"
        + f"srun --mpi=pmi2 -n {RANKS} --overcommit {exe} {data} {PER_RANK} {MiB} {data}.results\n"
    )
    job = cluster.sbatch(script)
    info = cluster.wait(job)
    text = out.read_text() if out.exists() else ""
    assert info["JobState"] == "COMPLETED", f"job {job}: {info.get('JobState')} {info.get('ExitCode')}\n{text}"
    printed = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert sorted(x["rank"] for x in printed) == list(range(RANKS)), text
    assert sum(x["bytes_written"] for x in printed) == TOTAL, printed
    assert sum(x["results_bytes"] for x in printed) == SIDE, printed
    return job, info, printed


def decisions(api: str, job_id: str) -> list[dict]:
    items = httpx.get(f"{api}/v1/control/actions", params={"job": job_id}, timeout=30).json()["items"]
    return [a for a in items if a["kind"].startswith("dfra_")]


def first_forwarder_record(settings: Settings, job_id: str) -> float:
    """Wall-clock time (s) of the job's first forwarder-layer record, from the API's timeline."""
    r = httpx.get(f"{settings.api_url}/v1/jobs/{job_id}", params={"layer": "forwarder"}, timeout=30)
    assert r.status_code == 200, r.text
    return datetime.fromisoformat(r.json()["first_io"].replace("Z", "+00:00")).timestamp()


def check_job(settings: Settings, job_id: str, user: str) -> dict:
    """The job on both layers: Slurm's id, name and user, 4 ranks and 4 I/O ranks, N-1 with the
    results file as a side file, exact bytes."""
    out = {}
    for layer in ("client", "forwarder"):
        s = wait_for_summary(settings.api_url, job_id, WRITTEN, timeout_s=90, layer=layer)
        assert s is not None, f"{layer}: Slurm job {job_id} never reached the API"
        line = f"{layer}: {s['name']}/{s['user']} ranks {s['ranks']} ({s['io_ranks']} did I/O) {s['pattern']}"
        line += f" (writes {s['patterns']['write']}, fan-in {s['fan_in_pattern']}) {s['bytes_written']} B"
        line += f", files {[(f['path'], f['bytes_written'], f['ranks']) for f in s['files']]}"
        assert s["name"] == NAME and s["user"] == user, line
        assert s["ranks"] == RANKS and s["io_ranks"] == RANKS and s["pattern"] == "N-1", line
        assert (s["patterns"]["write"], s["fan_in_pattern"]) == ("N-1", "N-M"), line
        assert s["bytes_written"] == WRITTEN and s["n_files"] == 2, line
        assert sorted((f["bytes_written"], f["ranks"]) for f in s["files"]) == [(SIDE, 1), (TOTAL, RANKS)], line
        assert_one_pattern(settings.api_url, [job_id], layer=layer)  # every view says N-1 (issue 10)
        out[layer] = s
    return out


@pytest.mark.timeout(900)
def test_sbatch_srun_mpi_job_with_hint(site, writer: Path, tmp_path: Path):
    settings, cluster = site
    d = settings.mount_point / "slurm"
    d.mkdir(exist_ok=True)
    user = "root"

    # 1. first job: no history, the default mapping, decided before its first I/O
    t0 = time.monotonic()
    job_a, info_a, _ = submit(cluster, writer, d / "a.dat", tmp_path, "a")
    assert info_a["UserId"].startswith(user) and info_a["JobName"] == NAME, info_a
    check_job(settings, job_a, user)
    dec_a = decisions(settings.api_url, job_a)
    assert len(dec_a) == 1 and dec_a[0]["kind"] == "dfra_default", dec_a
    nodes_a = forwarder_nodes(settings.api_url, job_a)
    want_a = dec_a[0]["to_state"].split(",") if dec_a[0]["to_state"] else ["fwd0"]
    assert set(nodes_a) == set(want_a) and sum(nodes_a.values()) >= TOTAL, (nodes_a, dec_a)
    t_dec = datetime.fromisoformat(dec_a[0]["time"].replace("Z", "+00:00")).timestamp()
    assert t_dec <= first_forwarder_record(settings, job_a), "the hint came after the job's first I/O"
    print(f"[slurm] job {job_a}: {time.monotonic() - t0:.1f} s, default mapping {want_a}, bytes per node {nodes_a}")

    # 2. the class table for job_submit.lua, then the second job of the same name
    deadline = time.monotonic() + 60
    classes = [sys.executable, "-m", "pharos_api.cli", "slurm", "classes", "--api", settings.api_url]
    while True:
        r = subprocess.run(
            [*classes, "--out", str(cluster.classes)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        rows = [ln.split("\t") for ln in cluster.classes.read_text().splitlines() if not ln.startswith("#")]
        if any(x[:3] == [user, NAME, "dedicated"] for x in rows) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert any(x[:4] == [user, NAME, "dedicated", "N-1"] for x in rows), rows

    t0 = time.monotonic()
    job_b, info_b, _ = submit(cluster, writer, d / "b.dat", tmp_path, "b")
    assert info_b.get("AdminComment", "").startswith("pharos:class=dedicated,pattern=N-1"), info_b
    check_job(settings, job_b, user)
    dec_b = decisions(settings.api_url, job_b)
    assert len(dec_b) == 1 and dec_b[0]["kind"] == "dfra_dedicated", dec_b
    hinted = dec_b[0]["to_state"].split(",")
    assert hinted and set(hinted) <= {"fwd2", "fwd3"}, dec_b  # the reserved nodes
    nodes_b = forwarder_nodes(settings.api_url, job_b)
    assert set(nodes_b) == set(hinted) and sum(nodes_b.values()) >= TOTAL, (nodes_b, hinted)
    t_dec = datetime.fromisoformat(dec_b[0]["time"].replace("Z", "+00:00")).timestamp()
    assert t_dec <= first_forwarder_record(settings, job_b), "the hint came after the job's first I/O"
    print(f"[slurm] job {job_b}: {time.monotonic() - t0:.1f} s, {info_b['AdminComment']}, hint {hinted}, {nodes_b}")


def status_argv(cluster: SlurmCluster) -> list[str]:
    return [sys.executable, "-m", "pharos_api.cli", "slurm", "status", "--statedir", str(cluster.statedir)]


def counters(cluster: SlurmCluster) -> dict[str, int]:
    """The plugin's counters and spool backlog (``pharos slurm status --json``)."""
    r = subprocess.run([*status_argv(cluster), "--json"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def job_times(api: str, job_id: str, timeout_s: float = 60) -> dict:
    """The job's summary once Pharos has its end (the pipeline stores the job events from Kafka)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{api}/v1/jobs/{job_id}", timeout=10)
        doc = r.json() if r.status_code == 200 else {}
        if doc.get("end") or time.monotonic() > deadline:
            return doc
        time.sleep(0.5)


def ns(t: str) -> int:
    return int(datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() * 1e9)


def trivial_job(cluster: SlurmCluster, out_dir: Path, name: str) -> str:
    """sbatch of a job that does nothing; waits for it; its id."""
    job = cluster.run("sbatch", "--parsable", f"--job-name={name}", f"--output={out_dir / name}.out", "--wrap", "true")
    info = cluster.wait(job.strip(), 60)
    assert info["JobState"] == "COMPLETED", info
    return job.strip()


@pytest.mark.timeout(600)
def test_job_runs_when_pharos_api_is_down(site, writer: Path, tmp_path: Path):
    settings, cluster = site
    d = settings.mount_point / "slurm-down"
    d.mkdir(exist_ok=True)
    os.chmod(tmp_path, 0o755)

    hung = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    urls = {"closed port": f"http://127.0.0.1:{free_port()}", "no answer": f"http://127.0.0.1:{hung.getsockname()[1]}"}
    base = {"cgroup_parent": settings.cgroup_parent, "timeout": "1"}
    down: dict[str, tuple[int, int]] = {}  # job -> wall-clock ns before its submission and after its end
    try:
        for i, (why, url) in enumerate(urls.items()):
            before = counters(cluster)
            cluster.set_plugin_options({"api": url, **base})
            t0, w0 = time.monotonic(), time.time_ns()
            job, info, _ = submit(cluster, writer, d / f"{i}.dat", tmp_path, f"down{i}")
            took = time.monotonic() - t0
            down[job] = (w0, time.time_ns())
            after = counters(cluster)
            diff = {k: after[k] - before[k] for k in after}
            print(f"[slurm] API {why}: job {job} {info['JobState']} in {took:.1f} s; counters {diff}")
            assert diff["hints_skipped"] == 1 and diff["hints_applied"] == 0, diff
            assert diff["events_failed"] == 2 and diff["events_sent"] == 0, diff  # start and end
            assert diff["spooled"] == 2 and diff["spool_pending"] == 2 and diff["dropped"] == 0, diff
            assert diff["tasks_placed"] == RANKS + 1 and diff["tasks_unplaced"] == 0, diff  # + the batch script
            # still traced: the agent's records reach the store under Slurm's job id
            deadline = time.monotonic() + 90
            got = 0
            while time.monotonic() < deadline and got < WRITTEN:
                r = httpx.get(f"{settings.api_url}/v1/jobs/{job}", timeout=10)
                got = r.json().get("bytes_written", 0) if r.status_code == 200 else 0
                time.sleep(0.5)
            assert got == WRITTEN, f"job {job}: {got} of {WRITTEN} B traced with the API down"
    finally:
        hung.close()
        cluster.set_plugin_options({"api": settings.api_url, **base})
    # the API is back: the next job's prolog sends the spooled events again, oldest first
    before = counters(cluster)
    trivial_job(cluster, tmp_path, "after-down")
    after = counters(cluster)
    diff = {k: after[k] - before[k] for k in after}
    print(f"[slurm] API back: counters {diff}")
    assert diff["resent"] == 4 and after["spool_pending"] == 0 and diff["dropped"] == 0, diff
    for job, (w0, w1) in down.items():
        s = job_times(settings.api_url, job)
        assert s.get("end"), f"job {job}: its end never reached Pharos: {s}"
        assert w0 <= ns(s["start"]) <= ns(s["end"]) <= w1, (job, s["start"], s["end"], w0, w1)  # their own times
        assert s["name"] == NAME and s["state"] == "finished", s
    shown = subprocess.run(status_argv(cluster), capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and "hints_skipped" in shown.stdout and "resent" in shown.stdout, shown.stderr


@pytest.mark.timeout(300)
def test_end_event_spooled_while_api_down_is_sent_by_the_next_prolog(site, tmp_path: Path):
    """The API goes down while a job runs: its end is spooled, then sent by the next job's prolog."""
    settings, cluster = site
    os.chmod(tmp_path, 0o755)
    base = {"cgroup_parent": settings.cgroup_parent, "timeout": "1", "hint": "no"}
    cluster.set_plugin_options({"api": settings.api_url, **base})
    gate, started = tmp_path / "go", tmp_path / "started"
    out = tmp_path / "spool-a.out"
    c0 = counters(cluster)
    job_a = cluster.run(
        "sbatch",
        "--parsable",
        "--job-name=spool-a",
        f"--output={out}",
        "--wrap",
        f"touch {started}; while [ ! -e {gate} ]; do sleep 0.2; done",
    ).strip()
    # The batch script starts once the job prolog (which sends the start event) is done; Slurm
    # says RUNNING before that, and a prolog slow enough (a loaded host) would read the options
    # below and spool the start event too.
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline, cluster.job(job_a)
        time.sleep(0.3)
    try:
        cluster.set_plugin_options({"api": f"http://127.0.0.1:{free_port()}", **base})  # the API is down
        w0 = time.time_ns()
        gate.touch()
        assert cluster.wait(job_a, 60)["JobState"] == "COMPLETED"
        w1 = time.time_ns()
    finally:
        cluster.set_plugin_options({"api": settings.api_url, **base})
    c1 = counters(cluster)
    spool = cluster.statedir / "spool"
    files = sorted(p.name for p in spool.glob("*.json"))
    print(f"\n[slurm] job {job_a}: end spooled {files}; counters {c1}")
    assert c1["events_sent"] - c0["events_sent"] == 1 and c1["spooled"] - c0["spooled"] == 1, (c0, c1)
    assert len(files) == 1 and files[0].endswith(f"-{job_a}-end.json"), files
    assert (spool.stat().st_mode & 0o777, (spool / files[0]).stat().st_mode & 0o777) == (0o700, 0o600)
    assert not httpx.get(f"{settings.api_url}/v1/jobs/{job_a}", timeout=10).json().get("end")

    trivial_job(cluster, tmp_path, "spool-b")  # the API is back: job B's prolog sends A's end
    c2 = counters(cluster)
    assert c2["resent"] - c1["resent"] == 1 and c2["spool_pending"] == 0, (c1, c2)
    s = job_times(settings.api_url, job_a)
    assert s.get("end"), f"job {job_a}: its end never reached Pharos: {s}"
    assert w0 <= ns(s["end"]) <= w1, (s["end"], w0, w1)  # the time of A's epilog, not of B's prolog
    assert s["name"] == "spool-a" and s["state"] == "finished" and s["exit_code"] == 0, s
    print(f"[slurm] job {job_a}: end recorded at {s['end']} (sent again by the next job's prolog)")
