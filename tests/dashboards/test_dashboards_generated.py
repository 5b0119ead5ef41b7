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
from grafana_expand import ALL, Context, expand
from pharos_dashboards import ROOT, boards, render, stale
from pharos_dashboards.alerting import DATASOURCE_UID


def test_committed_files_are_what_the_generator_makes():
    bad = stale()
    assert not bad, f"stale generated files, run `make dashboards`: {bad}"


def test_provisioning_points_at_one_clickhouse_datasource():
    files = render()
    ds = yaml.safe_load(files["provisioning/datasources/pharos-clickhouse.yaml"])["datasources"]
    assert [(d["uid"], d["type"]) for d in ds] == [(DATASOURCE_UID, "grafana-clickhouse-datasource")]
    assert {"host", "port", "protocol", "username", "defaultDatabase"} <= set(ds[0]["jsonData"])
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
    assert "5 dashboard(s) type-check" in r.stdout


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
    for name, spoil in cases.items():
        d = json.loads(json.dumps(good))
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
