"""Every panel, variable and annotation query of every dashboard, and every alert rule's query,
expanded the way Grafana and grafana-clickhouse-datasource expand them (grafana_expand), runs on
chDB against the real schema (the migrations) with synthetic jobs, metrics, anomalies and control
actions, and returns rows with the columns its panel reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import yaml
from dashboard_check import check_dashboard, dashboards, is_numeric, panel_queries, run, time_range
from grafana_expand import Context, expand, macro_args
from pharos_dashboards import ROOT
from pharos_dashboards.alerting import DATASOURCE_UID, RULES
from pharos_synthetic_jobs import T0, S

PICK = {"job": "mix"}  # single-value variables: the synthetic job with every kind of row


def context() -> Callable[..., Context]:
    return time_range(datetime.fromtimestamp(T0 / S - 600, UTC), datetime.fromtimestamp(time.time() + 60, UTC))


@pytest.mark.parametrize("uid", sorted(dashboards()))
def test_every_query_runs_and_returns_the_columns_its_panel_reads(store, uid):
    out = check_dashboard(store, uid, context(), PICK)
    assert not out.errors, "\n".join(out.errors)
    # the synthetic data has rows for every panel and annotation
    assert not out.empty, f"{uid}: no rows in {sorted(out.empty)}"
    assert out.checked >= len(list(panel_queries(dashboards()[uid])))


def test_multi_value_variables_filter_with_conditional_all():
    """The plugin's convention: a multi-value variable with All appears in panels only inside
    $__conditionalAll (so All costs nothing), never bare."""
    for uid, dash in dashboards().items():
        multi = {v["name"] for v in dash["templating"]["list"] if v["type"] == "query" and v["multi"]}
        assert all(v["multi"] and v["includeAll"] for v in dash["templating"]["list"] if v["name"] in multi)
        sqls = [t["rawSql"] for _, t in panel_queries(dash)] + [
            a["target"]["rawSql"] for a in dash["annotations"]["list"] if "target" in a
        ]
        for name in multi:
            uses = [s for s in sqls if f"${{{name}}}" in s or f"${name}" in s]
            assert uses, f"{uid}: variable {name} is not used"
            for s in uses:
                bare = without_conditional_all(s, name)
                assert f"${name}" not in bare and f"${{{name}}}" not in bare, (uid, name, s)


def without_conditional_all(sql: str, name: str) -> str:
    """The SQL with every $__conditionalAll(..., $name) removed."""
    macro = "$__conditionalAll("
    i = sql.find(macro)
    while i != -1:
        (_, var), end = macro_args(sql, i + len(macro) - 1)
        if var.strip() in (f"${name}", f"${{{name}}}"):
            sql = sql[:i] + sql[end:]
            i = sql.find(macro, i)
        else:
            i = sql.find(macro, end)
    return sql


@pytest.mark.parametrize("rule", RULES, ids=[r["uid"] for r in RULES])
def test_alert_rule_query_runs_on_the_last_ten_minutes(store, rule):
    """Alert rules run in Grafana's back end: only the back-end macros apply. One row per alert
    instance: string columns are its labels, exactly one number is the value."""
    doc = yaml.safe_load((ROOT / "provisioning/alerting/pharos-alerts.yaml").read_text())
    (group,) = doc["groups"]
    r = next(x for x in group["rules"] if x["uid"] == rule["uid"])
    query = next(d for d in r["data"] if d["refId"] == "A")
    assert query["datasourceUid"] == DATASOURCE_UID
    rng = query["relativeTimeRange"]
    now = time.time()
    ctx = Context(
        time_from=datetime.fromtimestamp(now - rng["from"], UTC), time_to=datetime.fromtimestamp(now - rng["to"], UTC)
    )
    rows, cols = run(store, expand(query["model"]["rawSql"], ctx, frontend=False))
    assert list(cols) == list(rule["columns"])
    numeric = [c for c, ty in cols.items() if is_numeric(ty)]
    assert len(numeric) == 1, cols
    assert all("String" in ty for c, ty in cols.items() if c not in numeric), cols
    assert rows, f"{rule['uid']}: no alert instance on the synthetic anomalies"
    assert all(float(row[numeric[0]]) > 0 for row in rows)  # the threshold C: A > 0 fires
