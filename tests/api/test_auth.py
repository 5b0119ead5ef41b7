"""API tokens and roles (issue 14; pharos_api.auth, docs/security.md) on a real chDB store with the
synthetic jobs (alice owns mix, failed, nm, one; bob owns n1; orphan has no event).

The matrix iterates the app's own routes (its OpenAPI paths): a route missing from ROUTES fails the first test, so a
new endpoint cannot be left out. For every route: no token and a made-up token are 401 (only
/v1/health is open); each role gets 403 where it lacks the right, a ``user`` token asking for
another user's job gets 404, and ``admin`` gets a 2xx.
"""

from __future__ import annotations

import json
import time

import pytest
import typer
from fastapi.testclient import TestClient
from pharos_synthetic_jobs import T0, MiB, build_store, rec

from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.loop import ControlLoop
from pharos_api.app import ExposureError, create_app
from pharos_api.auth import OTHER_JOB, create_token, revoke_token
from pharos_core.settings import Settings, is_loopback
from pharos_core.store import ns_to_datetime64

ALL = {"admin", "operator", "user", "scheduler"}
READ = {"admin", "operator", "user"}
STAFF = {"admin", "operator"}
SCHED = {"admin", "scheduler"}
ADMIN = {"admin"}

# (method, path) -> (roles admitted, the request's URL path with alice's job "mix", request kwargs,
# whether a 'user' token is confined to its own jobs there, admin's status)
ROUTES: dict[tuple[str, str], tuple[set[str], str, dict, bool, int]] = {
    ("GET", "/v1/health"): (ALL, "/v1/health", {}, False, 200),
    ("GET", "/v1/pipeline"): (READ, "/v1/pipeline", {}, False, 200),
    ("GET", "/v1/producers"): (READ, "/v1/producers", {}, False, 200),
    ("GET", "/v1/jobs"): (READ, "/v1/jobs", {}, False, 200),
    ("GET", "/v1/jobs/{job_id}"): (READ, "/v1/jobs/mix", {}, True, 200),
    ("POST", "/v1/jobs/{job_id}/events"): (SCHED, "/v1/jobs/mix/events", {"json": {"kind": "end"}}, False, 202),
    ("GET", "/v1/jobs/{job_id}/phases"): (READ, "/v1/jobs/mix/phases", {}, True, 200),
    ("GET", "/v1/jobs/{job_id}/insights"): (READ, "/v1/jobs/mix/insights", {}, True, 200),
    ("GET", "/v1/jobs/{job_id}/interference"): (READ, "/v1/jobs/mix/interference", {}, True, 200),
    ("GET", "/v1/jobs/{job_id}/report"): (READ, "/v1/jobs/mix/report", {}, True, 200),
    ("POST", "/v1/import/darshan"): (ADMIN, "/v1/import/darshan", {"json": {"paths": ["junk.darshan"]}}, False, 200),
    ("POST", "/v1/import/darshan/upload"): (
        ADMIN,
        "/v1/import/darshan/upload",
        {"content": b"not a log", "headers": {"Content-Type": "application/octet-stream"}},
        False,
        200,
    ),
    ("GET", "/v1/anomalies"): (READ, "/v1/anomalies", {}, False, 200),
    ("GET", "/v1/targets"): (READ, "/v1/targets", {}, False, 200),
    ("GET", "/v1/forwarders"): (READ, "/v1/forwarders", {}, False, 200),
    ("GET", "/v1/profiles"): (READ, "/v1/profiles", {}, False, 200),
    ("GET", "/v1/hints/jobs/{job_id}"): (ALL, "/v1/hints/jobs/mix", {}, True, 200),
    ("POST", "/v1/hints/jobs/{job_id}"): (SCHED, "/v1/hints/jobs/mix", {}, False, 200),
    ("GET", "/v1/hints"): (ALL, "/v1/hints", {"params": {"name": "ior"}}, False, 200),
    ("GET", "/v1/hints/classes"): (ALL, "/v1/hints/classes", {}, False, 200),
    ("GET", "/v1/control/actions"): (STAFF, "/v1/control/actions", {}, False, 200),
    ("GET", "/v1/control/pins"): (STAFF, "/v1/control/pins", {}, False, 200),
    ("GET", "/v1/control/migrations"): (STAFF, "/v1/control/migrations", {}, False, 200),
    ("PUT", "/v1/control/migrations/{daemon}/{task_id}"): (
        ADMIN,
        "/v1/control/migrations/fwd0/1",
        {"json": {"pinned": True, "reason": "auth matrix"}},
        False,
        200,
    ),
    ("DELETE", "/v1/control/migrations/{daemon}/{task_id}"): (ADMIN, "/v1/control/migrations/fwd0/1", {}, False, 200),
    ("PUT", "/v1/control/pins/jobs/{job_id}"): (
        ADMIN,
        "/v1/control/pins/jobs/mix",
        {"json": {"nodes": ["fwd0"], "reason": "test"}},
        False,
        200,
    ),
    ("DELETE", "/v1/control/pins/jobs/{job_id}"): (ADMIN, "/v1/control/pins/jobs/mix", {}, False, 204),
    ("PUT", "/v1/control/pins/pools/{pool}"): (
        ADMIN,
        "/v1/control/pins/pools/p1",
        {"json": {"targets": ["ost0", "ost1"], "reason": "test"}},
        False,
        200,
    ),
    ("DELETE", "/v1/control/pins/pools/{pool}"): (ADMIN, "/v1/control/pins/pools/p1", {}, False, 204),
    ("POST", "/v1/tokens"): (ADMIN, "/v1/tokens", {"json": {"role": "operator", "user": "ops"}}, False, 201),
    ("GET", "/v1/tokens"): (ADMIN, "/v1/tokens", {}, False, 200),
    ("DELETE", "/v1/tokens/{token_id}"): (ADMIN, "/v1/tokens/{throwaway}", {}, False, 204),
    ("GET", "/metrics"): (STAFF, "/metrics", {}, False, 200),
}


class FakeJobEvents:
    """Stands for the Kafka job-event producer (tests/api/test_job_events.py runs the real one)."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, event) -> None:
        self.sent.append(event)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = build_store(tmp_path_factory.mktemp("auth"))
    fwd = {"forwarding_node": "fwd0", "target": "ost0", "compute_node": "cn01"}
    s.insert_rows(
        "io_requests",
        [rec(j, 0, "write", f"/scratch/{j}", MiB, MiB, 2, start=60, layer="forwarder") | fwd for j in ("mix", "n1")],
    )
    yield s
    s.close()


@pytest.fixture(scope="module")
def import_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("imports")
    (d / "junk.darshan").write_bytes(b"junk")
    return d


@pytest.fixture(scope="module")
def app(store, import_dir, tmp_path_factory):
    a = create_app(store, Settings(state_dir=tmp_path_factory.mktemp("st"), api_auth="token", import_dir=import_dir))
    a.state.job_events = FakeJobEvents()
    # dry run: decisions and pins are recorded, nothing is pushed to a mount or daemon that may be
    # listening on this machine's default admin ports
    a.state.control_on_demand = ControlLoop(store, a.state.settings, cfg_factory=lambda: ControlConfig(dry_run=True))
    return a


@pytest.fixture(scope="module")
def tokens(store):
    return {
        "admin": create_token(store, "admin", "root")["token"],
        "operator": create_token(store, "operator", "ops")["token"],
        "user": create_token(store, "user", "bob")["token"],  # bob: n1 only
        "alice": create_token(store, "user", "alice")["token"],
        "scheduler": create_token(store, "scheduler", "slurm")["token"],
    }


def call(client, method: str, url: str, token: str | None, kwargs: dict):
    headers = dict(kwargs.get("headers", {}))
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.request(method, url, **{**kwargs, "headers": headers})


def test_every_route_is_in_the_matrix(app):
    spec = app.openapi()["paths"]  # every route of the app (the routers are included lazily)
    routes = {(m.upper(), path) for path, ops in spec.items() for m in ops}
    assert routes == set(ROUTES), "add the new route to ROUTES (its roles, an example request)"


def test_the_matrix(client, store, tokens):
    throwaway = create_token(store, "operator", "tmp")["token_id"]
    outcomes = {}
    for (method, path), (roles, url, kwargs, own_only, admin_status) in ROUTES.items():
        url = url.replace("{throwaway}", throwaway)
        want_anon = 200 if path == "/v1/health" else 401
        assert call(client, method, url, None, kwargs).status_code == want_anon, (method, path)
        bad = "pht_0123456789ab_" + "x" * 43
        assert call(client, method, url, bad, kwargs).status_code == want_anon, (method, path)
        for role in ("operator", "user", "scheduler", "admin"):  # admin last: it changes things
            r = call(client, method, url, tokens[role], kwargs)
            if role not in roles:
                want = {403}
            elif role == "user" and own_only:
                want = {404}  # mix is alice's, the user token is bob's
            else:
                want = {admin_status}
            outcomes[(method, path, role)] = r.status_code
            assert r.status_code in want, (method, path, role, r.status_code, r.text[:300])
            if r.status_code == 401:
                assert r.headers["www-authenticate"] == "Bearer"
        if own_only:  # the job's owner gets it
            assert call(client, method, url, tokens["alice"], kwargs).status_code == 200, (method, path)
    # the four claims, spelled out
    assert all(outcomes[(m, p, "admin")] < 300 for (m, p) in ROUTES)
    for m, p in [
        ("PUT", "/v1/control/pins/jobs/{job_id}"),
        ("POST", "/v1/import/darshan"),
        ("POST", "/v1/jobs/{job_id}/events"),
    ]:
        assert outcomes[(m, p, "operator")] == 403


def test_user_tokens_see_their_own_jobs(client, tokens):
    h = lambda who: {"Authorization": f"Bearer {tokens[who]}"}  # noqa: E731
    bob = client.get("/v1/jobs", headers=h("user")).json()
    assert [j["job_id"] for j in bob["items"]] == ["n1"] and bob["total"] == 1
    alice = client.get("/v1/jobs", headers=h("alice")).json()
    assert {j["job_id"] for j in alice["items"]} == {"mix", "failed", "nm", "one"} and alice["total"] == 4
    assert client.get("/v1/jobs", headers=h("operator")).json()["total"] == 5
    assert client.get("/v1/jobs/orphan", headers=h("alice")).status_code == 404  # no owner: nobody's
    assert client.get("/v1/jobs/orphan", headers=h("operator")).status_code == 200
    # forwarders: mix's bytes are someone else's for bob
    fw = client.get("/v1/forwarders", headers=h("operator")).json()["items"]
    assert {j["job_id"] for f in fw for j in f["jobs"]} == {"mix", "n1"}
    fw = client.get("/v1/forwarders", headers=h("user")).json()["items"]
    assert {j["job_id"] for f in fw for j in f["jobs"]} == {"n1", OTHER_JOB}
    fw = client.get("/v1/forwarders", headers=h("alice")).json()["items"]
    assert {j["job_id"] for f in fw for j in f["jobs"]} == {"mix", OTHER_JOB}
    # profiles: only one's own user
    prof = client.get("/v1/profiles", headers=h("user")).json()["items"]
    assert prof and {p["user"] for p in prof} == {"bob"}
    assert client.get("/v1/profiles", params={"user": "alice"}, headers=h("user")).json()["items"] == []
    # hint previews for another user are refused
    assert client.get("/v1/hints", params={"name": "ior", "user": "alice"}, headers=h("user")).status_code == 403


def anomaly(key, kind, at_s, job="", culprit="", node="ost0", active=1):
    return {
        "detected": ns_to_datetime64(time.time_ns() - int(at_s * 1e9)),
        "key": key,
        "kind": kind,
        "node": node,
        "node_type": "target",
        "job_id": job,
        "culprit_job": culprit,
        "persistence": "",
        "active": active,
        "severity": "warning",
        "ratio": 2.0,
        "onset": ns_to_datetime64(T0),
        "start": None,
        "end": None,
        "evidence": json.dumps({"jobs": [job, culprit]}),
    }


def test_anomalies_filter_before_the_limit_and_hide_other_users_jobs(client, store, tokens):
    # 5 newer interference rows and 2 older fail-slow rows: a kind filter applied after the
    # LIMIT would return nothing for kind=fail_slow_target&limit=2
    rows = [anomaly(f"interference:{i}", "interference", 10 + i, job="mix", culprit="n1") for i in range(5)]
    rows += [anomaly(f"fail_slow_target:ost{i}", "fail_slow_target", 100 + i, node=f"ost{i}") for i in range(2)]
    store.insert_rows("anomalies", rows)
    h = {"Authorization": f"Bearer {tokens['operator']}"}
    got = client.get("/v1/anomalies", params={"kind": "fail_slow_target", "limit": 2}, headers=h).json()["items"]
    assert [a["node"] for a in got] == ["ost0", "ost1"]
    got = client.get("/v1/anomalies", params={"job": "n1", "limit": 3}, headers=h).json()["items"]
    assert len(got) == 3 and all(a["culprit_job"] == "n1" for a in got)
    assert client.get("/v1/anomalies", params={"active": False}, headers=h).json()["items"] == []
    # bob (n1) sees alice's job as (other) and no evidence naming it; alice's job filter gives him nothing
    hb = {"Authorization": f"Bearer {tokens['user']}"}
    got = client.get("/v1/anomalies", params={"kind": "interference"}, headers=hb).json()["items"]
    assert got and all(a["job_id"] == OTHER_JOB and a["culprit_job"] == "n1" and a["evidence"] == {} for a in got)
    assert client.get("/v1/anomalies", params={"job": "mix"}, headers=hb).json()["items"] == []
    # a live detection run is an admin action
    for role in ("operator", "user"):
        h = {"Authorization": f"Bearer {tokens[role]}"}
        assert client.get("/v1/anomalies", params={"live": True}, headers=h).status_code == 403
    h = {"Authorization": f"Bearer {tokens['admin']}"}
    r = client.get("/v1/anomalies", params={"live": True}, headers=h)
    assert r.status_code == 200 and r.json()["source"] == "live"


def test_revoked_and_malformed_tokens_are_401(client, store):
    t = create_token(store, "operator", "temp")
    h = {"Authorization": f"Bearer {t['token']}"}
    assert client.get("/v1/jobs", headers=h).status_code == 200
    r = client.delete(f"/v1/tokens/{t['token_id']}", headers={"Authorization": f"Bearer {t['token']}"})
    assert r.status_code == 403  # an operator cannot revoke
    assert revoke_token(store, t["token_id"]) and not revoke_token(store, t["token_id"])
    client.app.state.token_cache.forget()  # revoked in the store by another process: at most CACHE_TTL_S
    assert client.get("/v1/jobs", headers=h).status_code == 401
    for bad in ("Basic abc", "Bearer ", "Bearer pht_x", "Bearer " + t["token"][:-1] + "A"):
        assert client.get("/v1/jobs", headers={"Authorization": bad}).status_code == 401, bad
    # tokens are stored hashed: the secret is nowhere in the table
    dump = json.dumps(store.query("SELECT * FROM api_tokens"))
    secret = t["token"].split("_", 2)[2]  # pht_<token_id>_<secret>; the secret may hold "_"
    assert len(secret) == 43 and secret not in dump


def test_token_endpoints(client, tokens):
    h = {"Authorization": f"Bearer {tokens['admin']}"}
    r = client.post("/v1/tokens", json={"role": "user", "user": "carol"}, headers=h)
    assert r.status_code == 201 and r.json()["token"].startswith("pht_")
    new = r.json()
    assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {new['token']}"}).json()["total"] == 0
    listed = client.get("/v1/tokens", headers=h).json()["items"]
    assert new["token_id"] in {t["token_id"] for t in listed} and all("token" not in t for t in listed)
    assert client.post("/v1/tokens", json={"role": "user"}, headers=h).status_code == 400  # no user
    assert client.post("/v1/tokens", json={"role": "root", "user": "x"}, headers=h).status_code == 422
    assert client.delete(f"/v1/tokens/{new['token_id']}", headers=h).status_code == 204
    assert client.delete(f"/v1/tokens/{new['token_id']}", headers=h).status_code == 404
    assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {new['token']}"}).status_code == 401


def test_auth_off_is_loopback_only(store, tmp_path):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("login01")
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        with pytest.raises(ExposureError, match="api_auth"):
            create_app(store, Settings(state_dir=tmp_path, api_host=host, api_auth="none"))
        create_app(store, Settings(state_dir=tmp_path, api_host=host, api_auth="token"))
        create_app(store, Settings(state_dir=tmp_path, api_host=host))  # the default: tokens
    from pharos_api.cli import check_exposure

    with pytest.raises(typer.Exit):
        check_exposure(Settings(state_dir=tmp_path, api_host="0.0.0.0", api_auth="none"))
    # open mode on loopback (explicit: no longer the default): everything acts as admin
    with TestClient(create_app(store, Settings(state_dir=tmp_path, api_auth="none"))) as c:
        assert c.get("/v1/tokens").status_code == 200
