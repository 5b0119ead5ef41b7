"""Every panel, variable and annotation query of every dashboard, and every alert rule's query,
expanded the way Grafana and grafana-clickhouse-datasource expand them (grafana_expand), runs on
chDB against the real schema (the migrations) with synthetic jobs, metrics, anomalies and control
actions, and returns rows with the columns its panel reads."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
import yaml
from grafana_expand import ALL, Context, expand, macro_args
from pharos_dashboards import ROOT, boards
from pharos_dashboards.alerting import DATASOURCE_UID, RULES
from pharos_dashboards.grafana import PLUGIN
from pharos_synthetic_jobs import T0, S

ANNOTATION_COLUMNS = ("time", "timeEnd", "title", "tags", "text")
PICK = {"job": "mix"}  # single-value variables: the synthetic job with every kind of row
NUMERIC = ("Int", "UInt", "Float", "Decimal")


def dashboards() -> dict[str, dict]:
    """The dashboards of the ClickHouse plugin (Pharos health reads Prometheus: its PromQL runs on a
    real Prometheus in tests/e2e/test_self_monitoring.py)."""
    out = {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "json").glob("*.json"))}
    return {k: d for k, d in out.items() if d["templating"]["list"][0]["query"] == PLUGIN}


def is_numeric(ch_type: str) -> bool:
    t = ch_type.removeprefix("Nullable(").removeprefix("LowCardinality(")
    return t.startswith(NUMERIC)


def run(store, sql: str) -> tuple[list[dict], dict[str, str]]:
    """Rows and {column: ClickHouse type}, in the query's column order."""
    cols = {c["name"]: c["type"] for c in store.query(f"DESCRIBE ({sql})")}
    return store.query(sql), cols


def context(**kw) -> Context:
    return Context(
        time_from=datetime.fromtimestamp(T0 / S - 600, UTC),
        time_to=datetime.fromtimestamp(time.time() + 60, UTC),
        interval_s=kw.pop("interval_s", 1.0),
        **kw,
    )


def resolve_variables(store, dash: dict, ctx: Context) -> list[str]:
    """Run the variable queries in order (later ones may use earlier ones), as Grafana does at
    load: multi-value variables with All start at All, others at PICK or their first option."""
    errors = []
    for v in dash["templating"]["list"]:
        name = v["name"]
        if v["type"] == "datasource":
            assert v["query"] == "grafana-clickhouse-datasource"
            continue
        if v["type"] == "custom":
            ctx.options[name] = [o["value"] for o in v["options"]]
            ctx.values[name] = v["current"]["value"]
            continue
        assert v["type"] == "query", v
        try:
            rows, cols = run(store, expand(v["query"]["rawSql"], ctx))
        except Exception as exc:
            errors.append(f"variable {name}: {str(exc).splitlines()[0]}")
            continue
        first = next(iter(cols))
        options = [str(r[first]) for r in rows]
        if not options:
            errors.append(f"variable {name}: no options")
            continue
        ctx.options[name] = options
        if v["multi"] and v["includeAll"]:
            ctx.values[name] = [ALL]
        else:
            want = PICK.get(name, options[0])
            if want not in options:
                errors.append(f"variable {name}: {want!r} not among {options}")
            ctx.values[name] = want
    return errors


def panel_queries(dash: dict):
    for p in dash["panels"]:
        for t in p.get("targets", []):
            yield p, t


@pytest.mark.parametrize("uid", sorted(dashboards()))
def test_every_query_runs_and_returns_the_columns_its_panel_reads(store, uid):
    dash = dashboards()[uid]
    expected = {b.uid: b.columns for b in boards()}[uid]
    ctx = context()
    errors = resolve_variables(store, dash, ctx)
    multi = [v["name"] for v in dash["templating"]["list"] if v["type"] == "query" and v["multi"]]
    # All on every multi-value variable (rows required), then each one narrowed to its first two options.
    selections = [({}, True)] + [({m: ctx.options[m][:2]}, False) for m in multi if m in ctx.options]
    checked = 0
    for p, t in panel_queries(dash):
        title = p["title"]
        assert title in expected, f"{uid}: panel {title!r} has no expected columns in the generator"
        for sel, need_rows in selections:
            c = context(values={**ctx.values, **sel}, options=ctx.options)
            where = f"{uid} / {title}" + (f" with {sel}" if sel else "")
            try:
                rows, cols = run(store, expand(t["rawSql"], c))
            except Exception as exc:
                errors.append(f"{where}: {str(exc).splitlines()[0][:300]}")
                continue
            checked += 1
            missing = [col for col in expected[title] if col not in cols]
            if missing:
                errors.append(f"{where}: columns {missing} missing from {list(cols)}")
            # time series: a time column and numbers, long format
            if t["format"] == 0 and (next(iter(cols)) != "time" or not any(is_numeric(ty) for ty in cols.values())):
                errors.append(f"{where}: time series needs 'time' first and a number: {cols}")
            if need_rows and not rows:
                errors.append(f"{where}: no rows")
    for a in dash["annotations"]["list"]:
        if a.get("builtIn"):
            continue
        assert a["datasource"] == {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"}
        try:
            rows, cols = run(store, expand(a["target"]["rawSql"], ctx))
        except Exception as exc:
            errors.append(f"{uid} / annotation {a['name']}: {str(exc).splitlines()[0][:300]}")
            continue
        checked += 1
        if [c for c in ANNOTATION_COLUMNS if c not in cols] or not rows:
            errors.append(f"{uid} / annotation {a['name']}: {len(rows)} rows, columns {list(cols)}")
    assert not errors, "\n".join(errors)
    assert checked >= len(list(panel_queries(dash)))


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
