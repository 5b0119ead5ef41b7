"""Self-monitoring end to end: the real Prometheus (Debian's prometheus 2.42) scrapes a whole real
stack (broker, eBPF agent, four forwarding daemons, the FUSE mount, ``pharos serve`` with token
authentication) with the jobs, paths and authorization of deploy/prometheus/prometheus.yml (only
the targets, the token file and the scrape interval are this test's); after a traced job wrote
through the mount, EVERY PromQL query of the Pharos health dashboard (dashboards/json/
pharos-health.json, $__rate_interval expanded as Grafana does) runs through Prometheus's HTTP API
and returns series, each panel some finite value, and every target is up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from pharos_testkit import LIVE_STACK_MARKS, REPO, running_prometheus, running_stack, sample, scrape

from pharos_agents.runner import run_job
from pharos_api import stack

sys.path.insert(0, str(REPO / "tests" / "dashboards"))
from grafana_expand import expand_promql

pytestmark = LIVE_STACK_MARKS

SCRAPE_S = 2
#: the panel interval Grafana would use; $__rate_interval = max(30 + 2, 4 * 2) = 32 s
INTERVAL_S = 30
HEALTH = REPO / "dashboards" / "json" / "pharos-health.json"


def operator_token(state: Path) -> str:
    """``pharos token create --role operator`` before the API runs (docs/security.md, step 1)."""
    env = dict(os.environ, PHAROS_STATE_DIR=str(state))
    argv = [sys.executable, "-m", "pharos_api.cli", "token", "create", "--role", "operator", "--user", "prometheus"]
    r = subprocess.run([*argv, "--direct"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def scrape_config(targets: dict[str, list[str]], token_file: Path) -> str:
    """deploy/prometheus/prometheus.yml with this stack's targets and token file."""
    cfg = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    # Prometheus's own job and the stack's Alertmanager are the compose deployment's, not this stack's
    cfg["scrape_configs"] = [j for j in cfg["scrape_configs"] if j["job_name"] != "prometheus"]
    cfg.pop("alerting", None)
    assert {j["job_name"] for j in cfg["scrape_configs"]} == set(targets)
    cfg["global"].update(scrape_interval=f"{SCRAPE_S}s", scrape_timeout=f"{SCRAPE_S}s", evaluation_interval="5s")
    for job in cfg["scrape_configs"]:
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token_file)
    return yaml.safe_dump(cfg)


def query(prom: str, expr: str, at: float | None = None) -> list[dict]:
    """An instant query through Prometheus's HTTP API, at Unix time ``at`` (default now)."""
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    r = httpx.get(f"{prom}/api/v1/query", params=params, timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


def up(prom: str) -> dict[tuple[str, str], str]:
    """{(job, instance): "1" or "0"} of the last scrape of every target."""
    return {(r["metric"]["job"], r["metric"]["instance"]): r["value"][1] for r in query(prom, "up")}


def wait_for(prom: str, expr: str, timeout: float = 60) -> None:
    """Until ``expr`` (an instant query) gives a series with a value > 0."""
    deadline = time.monotonic() + timeout
    while not any(float(s["value"][1]) > 0 for s in query(prom, expr)):
        assert time.monotonic() < deadline, f"{expr} still nothing after {timeout} s"
        time.sleep(1)


@pytest.mark.timeout(300)
def test_every_health_dashboard_query_returns_series(tmp_path):
    state = tmp_path / "state"
    token = operator_token(state)
    token_file = tmp_path / "operator.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    periods = {"PHAROS_DIAGNOSIS_DETECT_PERIOD_S": "2", "PHAROS_CONTROL_PERIOD_S": "2"}
    with running_stack(state, "pharos-test-selfmon", periods, api_auth="token") as s:
        admin = {n: json.loads(stack.ready_file(s, n).read_text())["admin"] for n in ("mount", "fwd0")}
        admin |= {f"fwd{i}": json.loads(stack.ready_file(s, f"fwd{i}").read_text())["admin"] for i in range(4)}
        targets = {
            "pharos-server": [f"127.0.0.1:{s.api_port}"],
            "pharos-agent": [s.agent_metrics_addr],
            "pharos-fwd": [admin[f"fwd{i}"] for i in range(4)],
            "pharos-mount": [admin["mount"]],
        }
        # /metrics of the server: operator token, not without one
        assert httpx.get(f"{s.api_url}/metrics", timeout=10).status_code == 401
        assert sample(scrape(f"{s.api_url}/metrics", token), "pharos_build_info", service="server") == 1
        (tmp_path / "prom").mkdir()
        with running_prometheus(tmp_path / "prom", scrape_config(targets, token_file)) as prom:
            # every target scraped once (the operator token accepted) before the traffic
            want = {(j, t): "1" for j, ts in targets.items() for t in ts}
            deadline = time.monotonic() + 30
            while (got := up(prom)) != want:
                assert time.monotonic() < deadline, f"targets not all up: {got}"
                time.sleep(0.5)
            # traffic: a traced job writing through the forwarding layer, and API reads
            job = f"selfmon-{os.getpid()}"
            (s.mount_point / job).mkdir()
            dd = ["dd", "if=/dev/zero", f"of={s.mount_point / job / 'f'}", "bs=1M", "count=16", "conv=fsync"]
            res = run_job(s, job, dd, hint=False, quiet=True, output_dir=tmp_path / "out")
            assert res.exit_code == 0
            auth = {"Authorization": f"Bearer {token}"}
            for path in ("/v1/jobs", "/v1/pipeline", "/v1/jobs/no-such-job"):
                httpx.get(s.api_url + path, headers=auth, timeout=30)
            deadline = time.monotonic() + 60
            while httpx.get(f"{s.api_url}/v1/jobs/{job}", headers=auth, timeout=30).status_code != 200:
                assert time.monotonic() < deadline, "the job never reached the API"
                time.sleep(1)
            # the dashboard as it looks a few scrapes after the job (its requests in every rate window)
            at = time.time()
            wait_for(prom, 'sum(pharos_pipeline_records_stored_total{topic=~".*io.requests"})')
            wait_for(prom, "sum(pharos_fwd_dequeued_requests_total)")
            wait_for(prom, "sum(pharos_mount_requests_total)")
            wait_for(prom, "sum(pharos_agent_records_sent_total)")
            time.sleep(max(0.0, at + 2 * SCRAPE_S - time.time()))

            panels = [p for p in json.loads(HEALTH.read_text())["panels"] if p["type"] != "row"]
            failures, n = [], 0
            for p in panels:
                finite = False
                for t in p["targets"]:
                    expr = expand_promql(t["expr"], SCRAPE_S, INTERVAL_S)
                    n += 1
                    result = query(prom, expr, at + SCRAPE_S)
                    if not result:
                        failures.append(f"{p['title']} / {t['refId']}: no series for {expr}")
                    finite |= any(r["value"][1] not in ("NaN", "+Inf", "-Inf") for r in result)
                if not finite:
                    failures.append(f"{p['title']}: no finite value")
            assert not failures, "\n".join(failures)
            assert n >= 30
