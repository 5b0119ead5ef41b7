"""GET /v1/anomalies, /v1/targets, /v1/forwarders, /v1/jobs/{id}/interference, /v1/profiles and
`pharos anomalies|targets|forwarders|diagnose` on a real chDB store and a real uvicorn server."""

from __future__ import annotations

import json
from datetime import datetime

import pharos_sysdiag_sim as sim
import pytest
import typer
from pharos_testkit import free_port, served
from typer.testing import CliRunner

from pharos_analytics.alerts import DetectionLoop
from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_api.app import create_app
from pharos_api.cli_diagnose import register as register_diagnose
from pharos_api.cli_system import register
from pharos_api.routers import system_diag
from pharos_core.settings import Settings

T0 = 1_730_000_000 * sim.NS
END = T0 + 90 * sim.NS


@pytest.fixture(scope="module")
def app(store, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("PHAROS_DIAGNOSIS_FAILSLOW_WINDOWS_S", "[5, 20, 60]")
    monkeypatch_module.setenv("PHAROS_DIAGNOSIS_INTERFERENCE_WINDOW_S", "5")
    cl = sim.Cluster(fwd_nodes=["fwd0", "fwd1"], fwd_capacity_mb_s=150)
    jobs = [
        sim.SimJob("light", ["fwd0"], 20, req_bytes=256 << 10, targets=["ost0", "ost1"], name="lightapp"),
        sim.SimJob("heavy", ["fwd0"], 200, start_s=30, name="heavyapp"),
        sim.SimJob("bg", ["fwd1"], 60, name="bgapp"),
    ]
    rows = sim.simulate(cl, jobs, T0, 90, seed=4, faults=[sim.Fault("target", "ost6", 4.0)])
    sim.insert(store, rows)
    a = create_app(store, Settings(state_dir=tmp_path_factory.mktemp("api"), api_auth="none"))
    a.include_router(system_diag.router)  # what app.py gets
    return a


def test_targets_and_forwarders(client):
    t = client.get("/v1/targets").json()
    assert t["state_source"] == "live" and len(t["items"]) == 8
    by = {x["target"]: x for x in t["items"]}
    assert by["ost6"]["state"] == "fail_slow" and by["ost6"]["fail_slow"]["persistence"] == "persistent"
    assert {k for k, v in by.items() if v["state"] != "ok"} == {"ost6"}
    assert by["ost5"]["limits"]["max_perf_mb_s"] == 10 and by["ost6"]["faults"]["slowdown"] == 4
    # mean service time per request from the summed busy time: the slowed 50 MB/s target
    # is slower per request than its healthy 50 MB/s peers
    assert by["ost6"]["latency_mean_ns"] > 2 * max(by[x]["latency_mean_ns"] for x in ("ost0", "ost2"))
    f = client.get("/v1/forwarders", params={"window_s": 30}).json()
    fw = {x["node"]: x for x in f["items"]}
    assert set(fw) == {"fwd0", "fwd1"} and all(x["state"] == "ok" for x in fw.values())
    assert [j["job_id"] for j in fw["fwd0"]["jobs"]] == ["heavy", "light"]
    assert fw["fwd0"]["queue_wait_ns"] > 100 * fw["fwd1"]["queue_wait_ns"]
    assert fw["fwd0"]["queue_wait_p99_ns"] >= fw["fwd0"]["queue_wait_ns"] > 0


def test_forwarders_from_the_rollup_equal_the_raw_records(client, store):
    """/v1/forwarders reads io_rollup_1s: over the window's whole seconds its counts equal the
    raw forwarder records' (mean queue wait and service time exactly; p99s approximate)."""
    f = client.get("/v1/forwarders", params={"window_s": 30}).json()
    until = datetime.fromisoformat(f["until"].replace("Z", "+00:00"))
    hi = int(until.timestamp())  # seconds [hi - 30, hi): the last partial second left out
    raw = store.query(
        """
        SELECT node, sum(n) AS requests, sum(b) AS bytes, sum(q) / sum(n) AS qw, sum(d) / sum(n) AS svc,
               arraySlice(arraySort(x -> -x.2, groupArray((job_id, b))), 1, 20) AS jobs
        FROM (
            SELECT forwarding_node AS node, job_id, sum(count) AS n, sum(bytes) AS b, sum(queue_wait_ns) AS q,
                   sum(duration_ns) AS d
            FROM io_requests
            WHERE layer = 'forwarder' AND forwarding_node != ''
              AND toUnixTimestamp(start) >= {lo:Int64} AND toUnixTimestamp(start) < {hi:Int64}
            GROUP BY node, job_id
        )
        GROUP BY node ORDER BY node
        """,
        {"lo": hi - 30, "hi": hi},
    )
    raw_exact = {
        r["node"]: r
        for r in store.query(
            """
            SELECT forwarding_node AS node, uniqExact(target) AS targets,
                   uniqExactIf(compute_node, compute_node != '') AS cns, quantileExact(0.99)(queue_wait_ns) AS qw99
            FROM io_requests
            WHERE layer = 'forwarder' AND forwarding_node != ''
              AND toUnixTimestamp(start) >= {lo:Int64} AND toUnixTimestamp(start) < {hi:Int64}
            GROUP BY node
            """,
            {"lo": hi - 30, "hi": hi},
        )
    }
    got = {x["node"]: x for x in f["items"]}
    assert set(got) == {r["node"] for r in raw} == {"fwd0", "fwd1"}
    for r in raw:
        g, e = got[r["node"]], raw_exact[r["node"]]
        assert (g["requests"], g["bytes"]) == (int(r["requests"]), int(r["bytes"]))
        assert g["queue_wait_ns"] == pytest.approx(float(r["qw"])) and g["service_ns"] == pytest.approx(float(r["svc"]))
        assert (g["targets"], g["compute_nodes"]) == (int(e["targets"]), int(e["cns"]))
        assert g["queue_wait_p99_ns"] == pytest.approx(float(e["qw99"]), rel=0.25)
        assert [(j["job_id"], j["bytes"]) for j in g["jobs"]] == [
            (j[0], int(j[1])) if isinstance(j, (list, tuple)) else (j["1"], int(j["2"])) for j in r["jobs"]
        ]


def test_interference_endpoint(client):
    d = client.get("/v1/jobs/light/interference").json()
    assert [(e["culprit_job"], e["resource"], e["baseline_source"]) for e in d["events"]] == [
        ("heavy", "fwd0", "least_shared_windows")
    ]  # bg shares its targets all along: never alone
    assert d["events"][0]["start"].startswith("2024-10-27T03:33:50")
    assert client.get("/v1/jobs/nope/interference").status_code == 404


def test_anomalies_live_and_from_detector(client, app):
    live = client.get("/v1/anomalies", params={"live": "true"}).json()
    kinds = {(a["kind"], a["node"]) for a in live["items"]}
    assert ("fail_slow_target", "ost6") in kinds and ("interference", "fwd0") in kinds
    assert client.get("/v1/anomalies").json()["items"] == []  # nothing stored yet
    loop = DetectionLoop(app.state.store, DiagnosisConfig)
    loop.run_once(now_ns=END)
    app.state.sysdiag = loop
    try:
        d = client.get("/v1/anomalies", params={"since_s": 1e9}).json()
        assert d["source"] == "detector" and d["detector"]["cycles"] == 1
        cur = {(a["kind"], a["node"], a["job_id"], a["culprit_job"]) for a in d["items"] if a["current"]}
        # light slowed on fwd0; bg (never alone: no quiet window) slowed on the targets heavy saturates
        assert cur == {
            ("fail_slow_target", "ost6", "", ""),
            ("interference", "fwd0", "light", "heavy"),
            ("interference", "ost2", "bg", "heavy"),
        }
        only = client.get("/v1/anomalies", params={"since_s": 1e9, "kind": "interference", "job": "heavy"}).json()
        assert sorted(a["job_id"] for a in only["items"]) == ["bg", "light"]
        assert client.get("/v1/targets").json()["state_source"] == "detector"
    finally:
        app.state.sysdiag = None


def test_profiles(client):
    p = {x["name"]: x for x in client.get("/v1/profiles").json()["items"]}
    assert set(p) == {"lightapp", "heavyapp", "bgapp"}
    assert p["lightapp"]["stats"]["targets"]["mean"] == 2 and p["heavyapp"]["stats"]["forwarding_nodes"]["mean"] == 1
    assert p["bgapp"]["runs"] == 1 and p["bgapp"]["stats"]["bandwidth_b_s"]["mean"] > 40e6


@pytest.fixture(scope="module")
def api_url(app):
    """The app served by uvicorn on a free loopback port, in a thread."""
    with served(app) as url:
        yield url


def _cli():
    app = typer.Typer()
    register(app)
    register_diagnose(app)
    return app


def test_cli_tables_and_json(api_url):
    r = CliRunner().invoke(_cli(), ["targets", "--api", api_url], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.strip().startswith("ost6"))
    assert "FAIL-SLOW persistent" in line and "slowdown 4x" in line
    assert "FAIL-SLOW" not in "".join(x for x in r.output.splitlines() if not x.strip().startswith("ost6"))
    r = CliRunner().invoke(_cli(), ["forwarders", "--api", api_url, "--json"])
    assert r.exit_code == 0 and {x["node"] for x in json.loads(r.output)["items"]} == {"fwd0", "fwd1"}
    r = CliRunner().invoke(_cli(), ["anomalies", "--api", api_url, "--live"], env={"COLUMNS": "160"})
    assert (
        r.exit_code == 0
        and "fail_slow_target" in r.output
        and "light <- heavy" in r.output
        and "bg <- heavy" in r.output
    )
    r = CliRunner().invoke(_cli(), ["diagnose", "light", "--api", api_url], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    assert "interference (1)" in r.output and "by job heavy on forwarding node fwd0" in r.output


def test_cli_api_down(tmp_path):
    r = CliRunner().invoke(_cli(), ["anomalies", "--api", f"http://127.0.0.1:{free_port()}"])
    assert r.exit_code == 1 and "not reachable" in r.output
