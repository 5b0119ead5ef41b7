"""The committed dashboards, alert rules and provisioning files are what the generator makes
(`make dashboards`), every dashboard type-checks as a Grafana dashboard (@grafana/schema, tsc
--strict), and the macro expander the query tests use follows the plugin's documented examples."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from datetime import UTC, datetime

import pytest
import yaml
from grafana_expand import ALL, Context, ExpandError, expand, expand_promql, rate_interval
from pharos_dashboards import ROOT, boards, render, stale
from pharos_dashboards.alerting import DATASOURCE_UID, PROMETHEUS_UID
from pharos_dashboards.grafana import PROMETHEUS


def test_committed_files_are_what_the_generator_makes():
    bad = stale()
    assert not bad, f"stale generated files, run `make dashboards`: {bad}"


def test_provisioning_points_at_one_clickhouse_datasource():
    files = render()
    ds = yaml.safe_load(files["provisioning/datasources/pharos-clickhouse.yaml"])["datasources"]
    assert [(d["uid"], d["type"]) for d in ds] == [(DATASOURCE_UID, "grafana-clickhouse-datasource")]
    assert {"host", "port", "protocol", "username", "defaultDatabase"} <= set(ds[0]["jsonData"])
    (prom,) = yaml.safe_load(files["provisioning/datasources/pharos-prometheus.yaml"])["datasources"]
    assert (prom["uid"], prom["type"], prom["isDefault"]) == (PROMETHEUS_UID, "prometheus", False)
    assert prom["url"] and prom["jsonData"]["timeInterval"]
    (prov,) = yaml.safe_load(files["provisioning/dashboards/pharos.yaml"])["providers"]
    assert prov["type"] == "file" and prov["options"]["path"]
    rules = yaml.safe_load(files["provisioning/alerting/pharos-alerts.yaml"])
    assert rules["apiVersion"] == 1
    for r in (r for g in rules["groups"] for r in g["rules"]):
        assert r["condition"] in {d["refId"] for d in r["data"]}
        assert {d["datasourceUid"] for d in r["data"]} == {DATASOURCE_UID, "__expr__"}
    uids = [b.uid for b in boards()]
    assert len(set(uids)) == len(uids) == len(list((ROOT / "json").glob("*.json")))
    for b in boards():
        d = b.json()
        assert d["templating"]["list"][0]["type"] == "datasource"
        targets = [t for p in d["panels"] for t in p.get("targets", [])]
        assert targets and all(t["datasource"]["uid"] == "${datasource}" for t in targets)


def npm_ci() -> None:
    """Install dashboards/package-lock.json's packages (git-ignored node_modules) unless done."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("node and npm are not installed (make setup installs them)")
    lock = (ROOT / "package-lock.json").read_bytes()
    stamp = ROOT / "node_modules" / ".pharos-lock.sha256"
    digest = hashlib.sha256(lock).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=ROOT, check=True)
        stamp.write_text(digest)


def typecheck(name: str, *files: str) -> subprocess.CompletedProcess:
    out = ROOT / ".typecheck" / f"{name}-{os.getpid()}"
    try:
        return subprocess.run(
            ["node", "typecheck/check.mjs", "--out", str(out), *files],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_dashboards_type_check_against_grafana_schema(tmp_path):
    npm_ci()
    r = typecheck("ok", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(boards())} dashboard(s) type-check" in r.stdout


def test_type_check_rejects_what_grafana_would_not_read(tmp_path):
    """The check bites: a misspelt option, a wrong type and an unknown panel type each fail."""
    npm_ci()
    good = json.loads((ROOT / "json" / "pharos-targets.json").read_text())
    cases = {
        "option": lambda d: d["panels"][0]["options"].update(calcualte=False),
        "type": lambda d: d["panels"][0]["gridPos"].update(w="wide"),
        "enum": lambda d: d["panels"][0]["options"].update(showValue="sometimes"),
        "panel": lambda d: d["panels"][0].update(type="no-such-panel"),
        "variable": lambda d: d["templating"]["list"][1].update(multi="yes"),
    }
    health = json.loads((ROOT / "json" / "pharos-health.json").read_text())
    prom_cases = {
        "prom-query": lambda d: d["panels"][1]["targets"][0].update(exp=d["panels"][1]["targets"][0].pop("expr")),
        "prom-enum": lambda d: d["panels"][1]["targets"][0].update(editorMode="typing"),
    }
    for name, spoil in [*cases.items(), *prom_cases.items()]:
        d = json.loads(json.dumps(health if name.startswith("prom-") else good))
        spoil(d)
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
        r = typecheck(f"bad-{name}", str(tmp_path / f"{name}.json"))
        assert r.returncode != 0, f"{name}: accepted\n{r.stdout}"
        assert "error TS" in r.stdout + r.stderr


def test_expander_follows_the_plugins_documented_examples():
    ctx = Context(
        time_from=datetime.fromtimestamp(1415792726, UTC),
        time_to=datetime.fromtimestamp(1447328726, UTC),
        interval_s=20,
        values={"svc": [ALL], "lvl": ["a", "b"], "job": "42", "one": ["x"]},
        options={"svc": ["s1", "s2"]},
    )
    assert expand("$__timeFilter(time)", ctx) == "time >= toDateTime(1415792726) AND time <= toDateTime(1447328726)"
    assert expand("$__timeInterval(c)", ctx) == "toStartOfInterval(toDateTime(c), INTERVAL 20 second)"
    assert expand("$__fromTime $__toTime $__interval_s", ctx) == "toDateTime(1415792726) toDateTime(1447328726) 20"
    assert expand("$__fromTime_ms", ctx) == "fromUnixTimestamp64Milli(1415792726000)"
    # All -> 1=1; a selection keeps the condition, quoted and comma-joined; a single value is raw.
    assert expand("$__conditionalAll(s IN (${svc}), $svc)", ctx) == "1=1"
    assert expand("$__conditionalAll(l IN (${lvl}), $lvl)", ctx) == "l IN ('a','b')"
    assert expand("$__conditionalAll(o IN ($one), $one)", ctx) == "o IN ('x')"
    assert expand("j = '${job}' AND s IN ($svc)", ctx) == "j = '42' AND s IN ('s1','s2')"
    # nested parentheses inside the condition, two macros in one query (the last expands first)
    sql = "$__conditionalAll(hasAny(splitByChar(',', x), [${lvl}]), $lvl) AND $__conditionalAll(s IN ($svc), $svc)"
    assert expand(sql, ctx) == "hasAny(splitByChar(',', x), ['a','b']) AND 1=1"


def health_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL as written) of every query of the Pharos health dashboard."""
    d = json.loads((ROOT / "json" / "pharos-health.json").read_text())
    return [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]


def test_health_dashboard_reads_prometheus_only():
    (b,) = [b for b in boards() if b.uid == "pharos-health"]
    d = b.json()
    (ds,) = d["templating"]["list"]  # no variable but the data source
    assert ds["type"] == "datasource" and ds["query"] == PROMETHEUS
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert panels and all(p["datasource"] == {"type": PROMETHEUS, "uid": "${datasource}"} for p in panels)
    assert all(t["datasource"]["type"] == PROMETHEUS and t["expr"] for p in panels for t in p["targets"])
    # every other dashboard is the ClickHouse plugin's only
    for other in (x.json() for x in boards() if x.uid != "pharos-health"):
        assert all(t["datasource"]["type"] != PROMETHEUS for p in other["panels"] for t in p.get("targets", []))


def test_health_queries_parse_as_promql(tmp_path):
    """Every query, with Grafana's $__rate_interval expanded, is valid PromQL for Prometheus 2.42's
    own parser (promtool check rules); tests/e2e/test_self_monitoring.py runs them on real data."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: apt-get install prometheus (make setup)")
    assert rate_interval(15, 2) == 60 and rate_interval(15, 120) == 135
    with pytest.raises(ExpandError):
        expand_promql("rate(x[$__range])", 15, 2)
    rules = [
        {"record": f"pharos_health:q{i}", "expr": expand_promql(expr, 15, 15)}
        for i, (_, expr) in enumerate(health_queries())
    ]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "health", "rules": rules}]}))
    r = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules)} rules found" in r.stdout


def test_deploy_scrape_config_is_valid_and_has_the_jobs_the_health_dashboard_reads():
    """deploy/prometheus/prometheus.yml (docker-compose mounts it): valid for Prometheus 2.42
    (promtool, syntax only: the token file exists only where it is deployed), the four Pharos jobs,
    the server's scrape with a Bearer token file."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: apt-get install prometheus (make setup)")
    path = ROOT.parent / "deploy" / "prometheus" / "prometheus.yml"
    r = subprocess.run([promtool, "check", "config", "--syntax-only", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = {j["job_name"]: j for j in yaml.safe_load(path.read_text())["scrape_configs"]}
    jobs.pop("prometheus", None)  # Prometheus's own metrics
    assert set(jobs) == {"pharos-server", "pharos-agent", "pharos-fwd", "pharos-mount"}
    assert all(j["metrics_path"] == "/metrics" for j in jobs.values())
    assert jobs["pharos-server"]["authorization"]["credentials_file"]
    assert jobs["pharos-server"]["static_configs"][0]["targets"][0].endswith(":8400")
    # the dashboard shows whether each of these jobs' targets is up
    assert any(expr == "up" for _, expr in health_queries())
