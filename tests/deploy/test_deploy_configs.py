"""The configuration files docker-compose.yml mounts, checked by the real tools: promtool (Debian's
prometheus), amtool and the Alertmanager itself (prometheus-alertmanager), ClickHouse's parser
(chDB) for the SQL of the ClickHouse init script."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest
from deploy_testkit import REPO
from pharos_testkit import running_alertmanager

PROMETHEUS_YML = REPO / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS_RULES = REPO / "deploy" / "prometheus" / "rules.yml"
ALERTMANAGER_YML = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
INITDB = REPO / "deploy" / "clickhouse" / "initdb"


def tool(name: str, package: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} missing: apt-get install {package} (make setup)")
    return exe


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_promtool_accepts_the_prometheus_config(tmp_path):
    """The whole check (files included), as the container sees it once the operator token is
    in deploy/prometheus/secrets (mounted at /etc/prometheus/secrets; its README says how)."""
    promtool = tool("promtool", "prometheus")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "pharos-operator.token").write_text("token\n")
    text = PROMETHEUS_YML.read_text()
    assert "/etc/prometheus/secrets/pharos-operator.token" in text
    assert "/etc/prometheus/rules.yml" in text
    config = tmp_path / "prometheus.yml"
    config.write_text(
        text.replace("/etc/prometheus/secrets/", f"{secrets}/").replace(
            "/etc/prometheus/rules.yml", str(PROMETHEUS_RULES)
        )
    )
    res = run(promtool, "check", "config", str(config))
    assert res.returncode == 0, res.stdout + res.stderr
    (secrets / "pharos-operator.token").unlink()
    assert run(promtool, "check", "config", str(config)).returncode != 0  # the token is required
    broken = tmp_path / "broken.yml"
    broken.write_text(config.read_text().replace("scrape_interval: 15s", "scrape_interval: fifteen"))
    assert run(promtool, "check", "config", str(broken)).returncode != 0


def test_promtool_rules_name_a_dead_pharos_process(tmp_path):
    """``promtool test rules``: the server's death fires PharosComponentDown after two missed
    scrapes (30 s) and clears when it is back; a restart within one scrape and a job that is not
    Pharos's fire nothing."""
    import yaml

    promtool = tool("promtool", "prometheus")
    rule = yaml.safe_load(PROMETHEUS_RULES.read_text())["groups"][0]["rules"][0]
    assert run(promtool, "check", "rules", str(PROMETHEUS_RULES)).returncode == 0
    server = {"job": "pharos-server", "instance": "pharos-server:8400"}
    fired = {
        "exp_labels": {"severity": "critical", "source": "prometheus", **server},
        "exp_annotations": {
            "summary": "pharos-server on pharos-server:8400 does not answer Prometheus' scrapes",
            "description": rule["annotations"]["description"],
        },
    }
    spec = {
        "rule_files": [str(PROMETHEUS_RULES)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    # the server killed after 30 s, back at 2 min; an agent restarted within one scrape
                    {
                        "series": 'up{job="pharos-server", instance="pharos-server:8400"}',
                        "values": "1 1 0 0 0 0 0 0 1 1",
                    },
                    {"series": 'up{job="pharos-agent", instance="cn1:9435"}', "values": "1 1 0 1 1 1 1 1 1 1"},
                    {"series": 'up{job="prometheus", instance="localhost:9090"}', "values": "0 0 0 0 0 0 0 0 0 0"},
                ],
                "alert_rule_test": [
                    {"eval_time": "40s", "alertname": "PharosComponentDown", "exp_alerts": []},
                    {"eval_time": "75s", "alertname": "PharosComponentDown", "exp_alerts": [fired]},
                    {"eval_time": "150s", "alertname": "PharosComponentDown", "exp_alerts": []},
                ],
            }
        ],
    }
    test = tmp_path / "test.yml"
    test.write_text(yaml.safe_dump(spec))
    res = run(promtool, "test", "rules", str(test))
    assert res.returncode == 0, res.stdout + res.stderr
    fired["exp_labels"]["instance"] = "elsewhere:8400"  # the test can fail: the wrong instance
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(spec))
    assert run(promtool, "test", "rules", str(broken)).returncode != 0


def test_amtool_accepts_the_alertmanager_config(tmp_path):
    amtool = tool("amtool", "prometheus-alertmanager")
    res = run(amtool, "check-config", str(ALERTMANAGER_YML))
    assert res.returncode == 0, res.stdout + res.stderr
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(ALERTMANAGER_YML.read_text().replace("receiver: default", "receiver: nobody"))
    assert run(amtool, "check-config", str(broken)).returncode != 0


def test_alertmanager_takes_pharos_alerts_with_the_deploy_config(tmp_path):
    """The real Alertmanager runs the stack's configuration and takes a fail-slow alert from
    Pharos's own alerter (as `pharos serve` sends it), routed to the default receiver."""
    from pharos_analytics.alerts import Alerter, Condition
    from pharos_analytics.diagnosis_config import DiagnosisConfig

    with running_alertmanager(tmp_path, ALERTMANAGER_YML.read_text()) as url:
        alerter = Alerter.from_config(
            DiagnosisConfig(alertmanager_url=url), generator_url="http://pharos-server:8400/v1/anomalies"
        )
        labels = {"alertname": "PharosFailSlowTarget", "severity": "critical", "target": "ost3", "job": ""}
        alerter.update([Condition("fail_slow_target:ost3", {**labels, "source": "pharos"}, {"summary": "slow"}, None)])
        deadline = time.monotonic() + 10
        while True:
            got = httpx.get(url + "/api/v2/alerts", timeout=5).json()
            if got or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [a["labels"]["target"] for a in got] == ["ost3"], got
        assert [r["name"] for r in got[0]["receivers"]] == ["default"]


def test_clickhouse_init_script_makes_a_read_only_grafana_user(tmp_path):
    """The init script run by bash with the clickhouse-server image's variables (its `clickhouse`
    replaced by a stand-in that keeps the SQL); each statement parsed by ClickHouse (chDB,
    EXPLAIN AST): a settings profile with readonly = 2, the user, SELECT on the database only."""
    from chdb import session

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "clickhouse"
    shim.write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/args\ncat > {tmp_path}/sql\n')
    shim.chmod(0o755)
    scripts = sorted(INITDB.glob("*.sh"))
    assert [s.name for s in scripts] == ["10-grafana-user.sh"]
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CLICKHOUSE_USER": "pharos",
        "CLICKHOUSE_PASSWORD": "0123abcd",
        "CLICKHOUSE_DB": "pharos",
        "GRAFANA_CLICKHOUSE_PASSWORD": "4567ef01",
    }
    res = subprocess.run(["bash", str(scripts[0])], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "args").read_text().split() == [
        "client",
        "--user",
        "pharos",
        "--password",
        "0123abcd",
        "--multiquery",
    ]
    statements = [s.strip() for s in (tmp_path / "sql").read_text().split(";") if s.strip()]
    assert len(statements) == 3
    s = session.Session(str(tmp_path / "chdb"))
    try:
        asts = [str(s.query("EXPLAIN AST " + stmt, "TSVRaw")) for stmt in statements]
    finally:
        s.close()
    assert asts[0].startswith("CreateSettingsProfileQuery") and "readonly = 2" in statements[0]
    assert asts[1].startswith("CreateUserQuery") and "'4567ef01'" in statements[1]
    assert asts[2].startswith("GrantQuery") and statements[2] == "GRANT SELECT ON pharos.* TO grafana"
    # The script must fail, not half-run, when the variables are missing.
    env.pop("GRAFANA_CLICKHOUSE_PASSWORD")
    assert subprocess.run(["bash", str(scripts[0])], env=env, capture_output=True, timeout=60).returncode != 0


def test_clickhouse_backup_disk_is_a_volume(compose):
    """config.d/backups.xml (parsed as XML) allows BACKUP to the disk `backups`, whose path is the
    mount point of a named volume of the clickhouse service."""
    root = ET.parse(REPO / "deploy" / "clickhouse" / "config.d" / "backups.xml").getroot()
    assert root.tag == "clickhouse"
    disk = root.findtext("backups/allowed_disk")
    path = root.findtext(f"storage_configuration/disks/{disk}/path")
    assert root.findtext(f"storage_configuration/disks/{disk}/type") == "local" and path
    volumes = [v for v in compose["services"]["clickhouse"]["volumes"]]
    targets = {(v["target"] if isinstance(v, dict) else str(v).split(":")[1]).rstrip("/") for v in volumes}
    assert path.rstrip("/") in targets
    assert "/etc/clickhouse-server/config.d/backups.xml" in targets


def test_deploy_files_are_mounted_by_compose():
    """Every file under deploy/ is used by docker-compose.yml (no stray config nobody loads)."""
    compose = (REPO / "docker-compose.yml").read_text()
    for f in (REPO / "deploy").rglob("*"):
        if f.is_file() and f.name != "env.example":
            rel = f.relative_to(REPO)
            assert any(f"./{p}" in compose for p in [rel, *rel.parents] if str(p) != "."), f"{rel} is not mounted"
    assert Path(REPO / "deploy" / "env.example").read_text().count("=") >= 4
