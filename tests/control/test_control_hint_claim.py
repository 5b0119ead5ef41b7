"""Issue 26 item 3: reading a hint has no side effect; claiming it is ``POST``. Against the REAL
forwarding daemons and FUSE mount (forwarder_testkit), a real chDB store and the real API with
token authentication:

* ``GET /v1/hints/jobs/{id}`` (admin, operator, scheduler; a ``user`` token for its own job
  only, 404 for another's) answers the decision the job would get and records nothing, holds
  nothing, pushes nothing, even with ``apply=true``;
* ``POST /v1/hints/jobs/{id}`` (admin, scheduler) with the same query parameters claims it:
  recorded, the reserved node held, the mapping on the mount; a read then returns it;
* dry run: a claim and a cycle record their decisions but hold no reserved node (no
  ``control_allocations`` row)."""

from __future__ import annotations

import time

import control_rows as cr
import pytest
from fastapi.testclient import TestClient
from forwarder_testkit import http

from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.loop import ControlLoop
from pharos_api.app import create_app
from pharos_api.auth import create_token
from pharos_core.settings import Settings

S = cr.NS


def loop_for(store, cluster, mount, daemons, **kw) -> ControlLoop:
    """Reserved fwd2, fwd3; a job of 8 ranks x 64 MiB N-N (the history below) is dedicated."""
    cfg = ControlConfig(
        mount_admin_urls=[mount.admin],
        fwd_admin_urls={d.name: d.admin for d in daemons},
        admin_token_file=cluster.token_file,
        node_capacity_b_s=100e6,
        dfra_min_bytes=100 * cr.MiB,
        dfra_min_io_ranks=8,
        dfra_dedicated_min_bytes=200 * cr.MiB,
        reserved_nodes=["fwd2", "fwd3"],
        placement_enabled=False,
        **kw,
    )
    return ControlLoop(store, Settings(), lambda: cfg)


def history(store, name: str, t0: int) -> None:
    store.insert_rows("job_events", cr.job_events(f"{name}-prev", t0, t0 + 20 * S, name, ranks=8))
    store.insert_rows("io_requests", cr.requests(f"{name}-prev", t0, 8, 64))


def allocations(store, jobs: list[str]) -> list[dict]:
    """Every allocation row ever written for ``jobs`` (not only the newest per node)."""
    return store.query("SELECT node, job_id FROM control_allocations WHERE job_id IN {j:Array(String)}", {"j": jobs})


@pytest.fixture
def stack(store, cluster, tmp_path):
    ds = [cluster.start_daemon(f"fwd{i}") for i in range(4)]
    m = cluster.start_mount(ds)
    app = create_app(store, Settings(state_dir=tmp_path / "st", api_auth="token"))
    tokens = {
        role: create_token(store, role, user)["token"]
        for role, user in (("admin", "root"), ("operator", "ops"), ("scheduler", "slurm"))
    }
    tokens["alice"] = create_token(store, "user", "alice")["token"]
    tokens["bob"] = create_token(store, "user", "bob")["token"]
    with TestClient(app) as client:
        yield app, client, tokens, m, ds


def as_(tokens: dict, who: str) -> dict:
    return {"Authorization": f"Bearer {tokens[who]}"}


def test_get_hint_reads_post_claims(store, cluster, stack):
    app, client, tokens, m, ds = stack
    t = time.time_ns()
    history(store, "rd", t - 3600 * S)
    app.state.control_on_demand = loop = loop_for(store, cluster, m, ds)
    # c1 has started (alice's): the read takes name, user and command from its start event
    store.insert_rows("job_events", cr.job_events("c1", t - 5 * S, None, "rd", user="alice"))
    url = "/v1/hints/jobs/c1"
    q = {"apply": "true", "name": "rd", "user": "alice", "command": ["rd"]}
    for who in ("scheduler", "operator", "admin", "alice"):
        r = client.get(url, params=q, headers=as_(tokens, who))
        assert r.status_code == 200, (who, r.text)
        h = r.json()
        assert (h["class"], h["nodes"], h["decided"], h["new"]) == ("dedicated", ["fwd2"], False, False), who
    assert client.get(url, params=q, headers=as_(tokens, "bob")).status_code == 404  # not bob's job
    # reading changed nothing: no action, no reserved node held, nothing on the mount
    assert loop.actions(job="c1") == [] and allocations(store, ["c1"]) == []
    assert "c1" not in http("GET", m.admin + "/mapping")["jobs"]
    for who in ("operator", "alice"):
        assert client.post(url, params=q, headers=as_(tokens, who)).status_code == 403
    # the claim: the same parameters, POST
    r = client.post(url, params=q, headers=as_(tokens, "scheduler"))
    assert r.status_code == 200, r.text
    h = r.json()
    assert (h["class"], h["reserved"], h["decided"], h["new"], h["status"]) == (
        "dedicated",
        ["fwd2"],
        True,
        True,
        "applied",
    )
    assert http("GET", m.admin + "/mapping")["jobs"]["c1"] == ["fwd2"]
    assert loop._holders()["fwd2"] == "c1"
    # a read now returns the recorded decision, and still records nothing
    again = client.get(url, headers=as_(tokens, "alice")).json()
    assert again["decided"] and not again["new"] and again["nodes"] == ["fwd2"]
    assert [a["kind"] for a in loop.actions(job="c1")] == ["dfra_dedicated"]
    # a job without start event nor name: 404 on both
    assert client.get("/v1/hints/jobs/nobody", headers=as_(tokens, "scheduler")).status_code == 404
    assert client.post("/v1/hints/jobs/nobody", headers=as_(tokens, "scheduler")).status_code == 404


def test_dry_run_holds_no_reserved_node(store, cluster, stack):
    app, client, tokens, m, ds = stack
    t = time.time_ns()
    history(store, "dry", t - 3600 * S)
    app.state.control_on_demand = loop = loop_for(store, cluster, m, ds, dry_run=True)
    q = {"apply": "true", "name": "dry", "user": "alice", "command": ["dry"]}
    h = client.post("/v1/hints/jobs/d1", params=q, headers=as_(tokens, "scheduler")).json()
    assert (h["class"], h["decided"], h["new"], h["status"], h["dry_run"]) == (
        "dedicated",
        True,
        True,
        "recorded",
        True,
    )
    # a running job the cycle decides, in dry run too
    store.insert_rows("job_events", cr.job_events("d2", t - 5 * S, None, "dry", user="alice"))
    loop.cycle()
    assert [a["kind"] for a in loop.actions(job="d2")] == ["dfra_dedicated"]
    assert [a["status"] for a in loop.actions(job="d1") + loop.actions(job="d2")] == ["recorded", "recorded"]
    assert allocations(store, ["d1", "d2"]) == []  # nothing reserved, no row written
    assert "d1" not in http("GET", m.admin + "/mapping")["jobs"]
