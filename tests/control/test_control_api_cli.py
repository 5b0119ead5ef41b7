"""GET /v1/hints..., /v1/control/actions, pins, and `pharos hint` / `pharos control ...` on a real
chDB store and a real uvicorn server (no forwarding layer configured: decisions are recorded)."""

from __future__ import annotations

import json
import time

import control_rows as cr
import pytest
import typer
from pharos_testkit import free_port, served
from typer.testing import CliRunner

from pharos_api.app import create_app
from pharos_api.cli_control import register
from pharos_api.cli_slurm import classes_tsv
from pharos_core.settings import Settings

T = time.time_ns() - 3600 * cr.NS


@pytest.fixture(scope="module")
def app(store, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("PHAROS_CONTROL_DFRA_MIN_BYTES", str(100 * cr.MiB))
    monkeypatch_module.setenv("PHAROS_CONTROL_DFRA_MIN_IO_RANKS", "8")
    monkeypatch_module.setenv("PHAROS_CONTROL_PLACEMENT_ENABLED", "false")
    store.insert_rows("job_events", cr.job_events("w-prev", T, T + 20 * cr.NS, "wave", ranks=8))
    store.insert_rows("io_requests", cr.requests("w-prev", T, 8, 64))
    # an N-N job with 2,000 metadata ops/s over 10 s (metadata-heavy, Beacon): node-local suggested
    store.insert_rows("job_events", cr.job_events("md-prev", T, T + 20 * cr.NS, "mdwave", ranks=4))
    store.insert_rows("io_requests", cr.requests("md-prev", T, 4, 2, metadata_per_rank=5000))
    # fwd_nodes=2 on closed ports: nodes fwd0/fwd1 exist by name, their daemons do not answer
    s = Settings(
        state_dir=tmp_path_factory.mktemp("api"), fwd_nodes=2, fwd_port_base=9, mount_admin_port=9, api_auth="none"
    )
    return create_app(store, s)


def test_hints(client):
    p = client.get("/v1/hints", params={"name": "wave", "user": "alice", "command": ["wave"]}).json()
    assert p["class"] == "default" and not p["decided"]  # both nodes down: nothing usable
    assert p["evidence"]["criteria"]["io_ranks"] == {"value": 8.0, "need": ">= 8", "ok": True}
    new = client.get("/v1/hints", params={"name": "never-ran"}).json()
    assert new["reason"].startswith("no earlier run with this name, user and command")
    assert client.get("/v1/hints/jobs/unknown-job").status_code == 404
    ident = {"name": "wave", "user": "alice", "command": ["wave"]}
    read = client.get("/v1/hints/jobs/w1", params=ident).json()
    assert not read["decided"] and not read["new"]  # reading records nothing
    h = client.post("/v1/hints/jobs/w1", params=ident).json()
    assert h["decided"] and h["new"] and h["status"] == "recorded"
    again = client.get("/v1/hints/jobs/w1").json()
    assert again["decided"] and not again["new"] and again["class"] == h["class"]
    assert not client.post("/v1/hints/jobs/w1").json()["new"]
    assert p["node_local"] is False and h["node_local"] is False and again["node_local"] is False


def test_hints_suggest_node_local_for_an_n_n_metadata_heavy_job(client):
    """Preview, read, claim and the recorded decision read back (its evidence) all carry it."""
    ident = {"name": "mdwave", "user": "alice", "command": ["mdwave"]}
    p = client.get("/v1/hints", params=ident).json()
    assert p["node_local"] is True, p["evidence"]["node_local"]
    nl = p["evidence"]["node_local"]
    assert nl["suggested"] and nl["reason"].startswith("N-N, 2000 metadata ops/s >= 1000 (metadata-heavy)"), nl
    assert nl["criteria"]["pattern"] == {"value": "N-N", "need": ["N-N"], "ok": True}
    assert client.get("/v1/hints/jobs/md1", params=ident).json()["node_local"] is True
    claimed = client.post("/v1/hints/jobs/md1", params=ident).json()
    assert claimed["new"] and claimed["node_local"] is True
    stored = client.get("/v1/hints/jobs/md1").json()
    assert stored["decided"] and not stored["new"] and stored["node_local"] is True
    assert stored["evidence"]["node_local"]["reason"] == nl["reason"]
    assert client.get("/v1/hints", params={"name": ""}).status_code == 422


def test_actions_pins_and_bounds(client):
    a = client.get("/v1/control/actions", params={"job": "w1"}).json()
    assert [x["kind"] for x in a["items"]] == ["dfra_default"] and a["loop"] is None
    assert client.get("/v1/control/actions", params={"limit": 10**12}).status_code == 422
    assert client.get("/v1/control/actions", params={"since_s": 1e300}).status_code == 422
    assert client.get("/v1/control/actions", params={"kind": "bogus"}).status_code == 422
    r = client.put("/v1/control/pins/jobs/w1", json={"nodes": ["fwd1"], "reason": "test"})
    assert r.status_code == 200 and r.json()["value"] == ["fwd1"]
    assert client.put("/v1/control/pins/jobs/w1", json={"nodes": ["fwd9"]}).status_code == 400
    assert client.put("/v1/control/pins/jobs/w1", json={"nodes": []}).status_code == 422
    assert (
        client.put("/v1/control/pins/pools/p1", json={"targets": ["ost0"], "max_perf": {"ost1": 5}}).status_code == 400
    )
    assert (
        client.put("/v1/control/pins/pools/p1", json={"targets": ["ost0"], "max_perf": {"ost0": 5}}).status_code == 200
    )
    pins = client.get("/v1/control/pins").json()["items"]
    assert [(p["scope"], p["name"]) for p in pins] == [("job", "w1"), ("pool", "p1")]
    assert client.delete("/v1/control/pins/pools/p1").status_code == 204
    assert client.delete("/v1/control/pins/pools/p1").status_code == 404
    assert [x["kind"] for x in client.get("/v1/control/actions", params={"kind": "unpin"}).json()["items"]] == ["unpin"]
    ops = {op["operationId"] for path in client.get("/openapi.json").json()["paths"].values() for op in path.values()}
    assert {"get_job_hint", "get_hint_by_identity", "list_control_actions", "put_job_pin", "delete_pool_pin"} <= ops


@pytest.fixture(scope="module")
def api_url(app):
    with served(app) as url:
        yield url


def _cli():
    app = typer.Typer()
    register(app)
    return app


def test_cli(api_url):
    run = lambda *a: CliRunner().invoke(_cli(), [*a, "--api", api_url], env={"COLUMNS": "200"})  # noqa: E731
    r = run("hint", "--name", "wave", "--user", "alice", "--command", "wave")
    assert r.exit_code == 0, r.output
    assert "a new job: default" in r.output and "io_ranks" in r.output
    assert "node-local" not in r.output
    r = run("hint", "--name", "mdwave", "--user", "alice", "--command", "mdwave")
    assert r.exit_code == 0, r.output
    assert (
        "node-local: suggested (N-N, 2000 metadata ops/s >= 1000 (metadata-heavy)): "
        "srun --pharos-node-local=MOUNT / pharos run --node-local MOUNT" in r.output
    ), r.output
    r = run("hint", "w2", "--name", "wave", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["job_id"] == "w2" and not json.loads(r.output)["decided"]
    r = run("hint", "w2", "--name", "wave", "--claim", "--json")  # recorded: the actions below show it
    assert r.exit_code == 0 and json.loads(r.output)["decided"] and json.loads(r.output)["new"]
    r = CliRunner().invoke(_cli(), ["hint", "--api", api_url])
    assert r.exit_code == 1 and "give a JOB id" in r.output
    r = run("control", "pin", "job", "w2", "fwd0", "--reason", "cli")
    assert r.exit_code == 0 and "pinned to fwd0" in r.output
    r = run("control", "pin", "pool", "px", "ost0", "--max-perf", "ost0=abc")
    assert r.exit_code == 1 and "expected TARGET=MB_S" in r.output
    r = run("control", "pins")
    assert r.exit_code == 0 and "w2" in r.output and "fwd0" in r.output
    r = run("control", "actions", "--job", "w2")
    assert r.exit_code == 0 and "pin" in r.output and "dfra_default" in r.output
    r = run("control", "unpin", "job", "nope")
    assert r.exit_code == 1 and "not pinned" in r.output
    r = CliRunner().invoke(_cli(), ["control", "actions", "--api", f"http://127.0.0.1:{free_port()}"])
    assert r.exit_code == 1 and "not reachable" in r.output


def test_io_classes_for_job_submit(client, tmp_path):
    """GET /v1/hints/classes: one row per (user, name) with history, the class a new job of it gets;
    ``pharos slurm classes --out`` writes the table job_submit.lua reads."""
    doc = client.get("/v1/hints/classes").json()
    wave = [i for i in doc["items"] if i["name"] == "wave"]
    assert len(wave) == 1 and wave[0]["runs"] >= 1 and wave[0]["pattern"] == "N-N", doc
    want = client.get("/v1/hints", params={"name": "wave", "user": wave[0]["user"]}).json()["class"]
    assert wave[0]["class"] == want and wave[0]["node_local"] is False
    md = [i for i in doc["items"] if i["name"] == "mdwave"]
    assert len(md) == 1 and md[0]["pattern"] == "N-N" and md[0]["node_local"] is True, doc
    assert client.get("/v1/hints/classes", params={"since_s": 0}).status_code == 422
    # the table job_submit.lua reads: a 6th column node_local, yes or no
    lines = classes_tsv([*wave, *md]).splitlines()
    assert lines[0] == "# user\tname\tclass\tpattern\truns\tnode_local (pharos slurm classes)"
    assert lines[1].split("\t") == ["alice", "wave", wave[0]["class"], "N-N", str(wave[0]["runs"]), "no"]
    assert lines[2].split("\t") == ["alice", "mdwave", md[0]["class"], "N-N", str(md[0]["runs"]), "yes"]
    assert classes_tsv([{"user": "bob", "name": "a\tb", "class": "default", "pattern": "1-1", "runs": 1}]).splitlines()[
        1
    ].split("\t") == ["bob", "a b", "default", "1-1", "1", "no"]  # an API without node_local
