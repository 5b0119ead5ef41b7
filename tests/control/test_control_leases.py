"""Issue 26 item 1: reserved forwarding nodes are leased, so a lost end event does not hold a
node forever (pharos_analytics.control.lease).

* On the REAL forwarding daemons and FUSE mount: two jobs hold the two reserved nodes; neither
  end event arrives. The job that keeps doing I/O keeps its node (its records renew the lease);
  the one that went silent loses it after ``lease_s``: a ``lease_expired`` action (visible in
  ``GET /v1/control/actions``), the node free for the next dedicated job, the job's entry off
  the mount.
* With a REAL Slurm (slurm_testkit): a job that does no I/O keeps its node while ``squeue``
  says it runs (``lease_slurm``), and loses it once Slurm says it ended."""

from __future__ import annotations

import os
import time
from pathlib import Path

import control_rows as cr
import pytest
from fastapi.testclient import TestClient
from forwarder_testkit import http
from pharos_testkit import free_port

from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.loop import ControlLoop
from pharos_api.app import create_app
from pharos_core.settings import Settings

S = cr.NS


def history(store, name: str, t0: int) -> None:
    """One finished earlier run: 8 ranks x 64 MiB N-N (dedicated with the thresholds below)."""
    store.insert_rows("job_events", cr.job_events(f"{name}-prev", t0, t0 + 20 * S, name, ranks=8))
    store.insert_rows("io_requests", cr.requests(f"{name}-prev", t0, 8, 64))


def dedicated_cfg(**kw) -> dict:
    return {
        "node_capacity_b_s": 100e6,
        "dfra_min_bytes": 100 * cr.MiB,
        "dfra_min_io_ranks": 8,
        "dfra_dedicated_min_bytes": 200 * cr.MiB,
        "reserved_nodes": ["fwd2", "fwd3"],
        "placement_enabled": False,
    } | kw


def test_lost_end_event_lease_expires_and_node_returns(store, cluster, tmp_path):
    ds = [cluster.start_daemon(f"fwd{i}") for i in range(4)]
    m = cluster.start_mount(ds)
    t = 1_772_000_000 * S
    history(store, "lz", t)
    cfg = ControlConfig(
        mount_admin_urls=[m.admin],
        fwd_admin_urls={d.name: d.admin for d in ds},
        admin_token_file=cluster.token_file,
        **dedicated_cfg(lease_s=60.0),
    )
    loop = ControlLoop(store, Settings(), lambda: cfg)
    ident = ("lz", "alice", ["lz"])
    assert loop.hint("q1", *ident, apply=True, now_ns=t + 100 * S)["reserved"] == ["fwd2"]
    assert loop.hint("q2", *ident, apply=True, now_ns=t + 101 * S)["reserved"] == ["fwd3"]
    for job in ("q1", "q2"):  # both start; their end events will never arrive
        store.insert_rows("job_events", cr.job_events(job, t + 110 * S, None, "lz"))
        store.insert_rows("io_requests", cr.requests(job, t + 120 * S, 1, 4, fwd="fwd2" if job == "q1" else "fwd3"))
    loop.cycle(now_ns=t + 150 * S)
    assert loop._holders() == {"fwd2": "q1", "fwd3": "q2"}
    # q2 keeps writing, q1 went silent after t+130 s: its lease ran to t+130+60
    store.insert_rows("io_requests", cr.requests("q2", t + 200 * S, 1, 4, fwd="fwd3"))
    loop.cycle(now_ns=t + 185 * S)
    assert loop._holders() == {"fwd2": "q1", "fwd3": "q2"}  # within the lease
    loop.cycle(now_ns=t + 215 * S)
    assert loop._holders() == {"fwd2": "", "fwd3": "q2"}
    (row,) = loop.actions(kind="lease_expired", since_ns=t)
    assert (row["job_id"], row["resource"], row["status"]) == ("q1", "node:fwd2", "recorded")
    # its lease: its last record (t+127.5 s) + 60 s
    assert t + 180 * S < row["evidence"]["lease_until_ns"] < t + 190 * S and "expired" in row["reason"]
    jobs = http("GET", m.admin + "/mapping")["jobs"]
    assert "q1" not in jobs and jobs["q2"] == ["fwd3"]  # the expired job's entry is off the mount
    # the audit trail over HTTP
    app = create_app(store, Settings(state_dir=tmp_path / "st", api_auth="none"))
    app.state.control_on_demand = loop
    with TestClient(app) as client:
        r = client.get("/v1/control/actions", params={"kind": "lease_expired", "since_s": 10**8})
        assert r.status_code == 200 and [i["job_id"] for i in r.json()["items"]] == ["q1"]
    # the returned node goes to the next dedicated job; later cycles leave q1 alone
    assert loop.hint("q3", *ident, now_ns=t + 220 * S)["reserved"] == ["fwd2"]
    loop.cycle(now_ns=t + 225 * S)
    assert "q1" not in http("GET", m.admin + "/mapping")["jobs"]
    assert len(loop.actions(kind="lease_expired", since_ns=t)) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="slurmd needs root")
def test_slurm_renews_the_lease_of_a_running_job_without_io(store, tmp_path, monkeypatch):
    from slurm_testkit import running_slurm

    # the plugin's API is a closed port: the job runs without Pharos (fail-open)
    with running_slurm({"api": f"http://127.0.0.1:{free_port()}", "timeout": "1"}) as slurm:
        monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
        script = tmp_path / "sleep.sh"
        script.write_text("#!/bin/sh\n#SBATCH --output=/dev/null\nsleep 300\n")
        job = slurm.sbatch(Path(script))
        deadline = time.monotonic() + 60
        while slurm.job(job).get("JobState") != "RUNNING":
            assert time.monotonic() < deadline, slurm.job(job)
            time.sleep(0.5)
        now = time.time_ns()
        store.insert_rows("job_events", cr.job_events(job, now - 1000 * S, None, "sl"))  # started long ago, no I/O
        # no mount nor daemon: the loop only keeps the leases here
        settings = Settings(state_dir=tmp_path / "st", fwd_nodes=0)
        base = dedicated_cfg(lease_s=60.0, reserved_nodes=["fwd7"])
        with_slurm = ControlLoop(store, settings, lambda: ControlConfig(lease_slurm=True, **base))
        with_slurm._hold(["fwd7"], job, "DFRA dedicated", now - 990 * S)  # its lease ran out long ago
        with_slurm.cycle(now_ns=now)
        assert with_slurm._holders()["fwd7"] == job  # Slurm says it runs: renewed
        returned = lambda: [a for a in with_slurm.actions(job=job) if a["kind"] in ("release", "lease_expired")]  # noqa: E731
        assert returned() == []
        slurm.run("scancel", job)
        slurm.wait(job, timeout_s=60)
        with_slurm.cycle(now_ns=now + 61 * S)
        assert with_slurm._holders()["fwd7"] == ""
        (row,) = returned()
        assert row["kind"] == "lease_expired" and job not in row["evidence"]["slurm"]
