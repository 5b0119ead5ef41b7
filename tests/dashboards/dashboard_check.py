"""Runs a committed dashboard's queries on a store as Grafana would: variable queries first (in
order, later ones may use earlier ones), then every panel and annotation query with the
plugin's macros expanded (grafana_expand), once with every multi-value variable at All and once
per multi-value variable narrowed to its first two options. Used on the synthetic store
(tests/dashboards) and on the store of a real traced run (tests/live)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from grafana_expand import ALL, Context, expand
from pharos_dashboards import ROOT, boards
from pharos_dashboards.grafana import PLUGIN

ANNOTATION_COLUMNS = ("time", "timeEnd", "title", "tags", "text")
NUMERIC = ("Int", "UInt", "Float", "Decimal")


def dashboards() -> dict[str, dict]:
    """The committed dashboards of the ClickHouse plugin by uid (file stem). (Pharos health reads
    Prometheus: its PromQL runs on a real Prometheus in tests/e2e/test_self_monitoring.py.)"""
    out = {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "json").glob("*.json"))}
    return {k: d for k, d in out.items() if d["templating"]["list"][0]["query"] == PLUGIN}


def expected_columns() -> dict[str, dict[str, tuple[str, ...]]]:
    """{dashboard uid: {panel title: the columns the panel reads}}, from the generator."""
    return {b.uid: b.columns for b in boards()}


def is_numeric(ch_type: str) -> bool:
    t = ch_type.removeprefix("Nullable(").removeprefix("LowCardinality(")
    return t.startswith(NUMERIC)


def run(store, sql: str) -> tuple[list[dict], dict[str, str]]:
    """Rows and {column: ClickHouse type}, in the query's column order."""
    cols = {c["name"]: c["type"] for c in store.query(f"DESCRIBE ({sql})")}
    return store.query(sql), cols


def panel_queries(dash: dict):
    for p in dash["panels"]:
        for t in p.get("targets", []):
            yield p, t


def resolve_variables(store, dash: dict, ctx: Context, pick: dict[str, str]) -> list[str]:
    """Run the variable queries in order, as Grafana does at load: multi-value variables with All
    start at All, others at ``pick[name]`` or their first option. Returns the errors."""
    errors = []
    for v in dash["templating"]["list"]:
        name = v["name"]
        if v["type"] == "datasource":
            if v["query"] != "grafana-clickhouse-datasource":
                errors.append(f"variable {name}: data source type {v['query']!r}")
            continue
        if v["type"] == "custom":
            ctx.options[name] = [o["value"] for o in v["options"]]
            ctx.values[name] = v["current"]["value"]
            continue
        if v["type"] != "query":
            errors.append(f"variable {name}: type {v['type']!r}")
            continue
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
            want = pick.get(name, options[0])
            if want not in options:
                errors.append(f"variable {name}: {want!r} not among {options[:20]}")
            ctx.values[name] = want
    return errors


@dataclass
class Outcome:
    errors: list[str] = field(default_factory=list)
    empty: set[str] = field(default_factory=set)  # panel/annotation titles with no rows (all at All)
    checked: int = 0


def check_dashboard(
    store, uid: str, make_context: Callable[..., Context], pick: dict[str, str] | None = None
) -> Outcome:
    """Every variable, panel and annotation query of dashboard ``uid`` on ``store``.

    ``make_context(values=..., options=...)`` gives the time range and interval. Errors: a query
    ClickHouse rejects, a column the panel reads missing, a time series without ``time`` first
    and a number, an annotation without Grafana's annotation columns. Panels and annotations
    with no rows with every variable at All are listed in ``empty`` (the caller decides which
    may be empty on its data)."""
    dash = dashboards()[uid]
    expected = expected_columns()[uid]
    ctx = make_context()
    out = Outcome(errors=resolve_variables(store, dash, ctx, pick or {}))
    multi = [v["name"] for v in dash["templating"]["list"] if v["type"] == "query" and v["multi"]]
    selections = [({}, True)] + [({m: ctx.options[m][:2]}, False) for m in multi if m in ctx.options]
    for p, t in panel_queries(dash):
        title = p["title"]
        if title not in expected:
            out.errors.append(f"{uid}: panel {title!r} has no expected columns in the generator")
            continue
        for sel, at_all in selections:
            c = make_context(values={**ctx.values, **sel}, options=ctx.options)
            where = f"{uid} / {title}" + (f" with {sel}" if sel else "")
            try:
                rows, cols = run(store, expand(t["rawSql"], c))
            except Exception as exc:
                out.errors.append(f"{where}: {str(exc).splitlines()[0][:300]}")
                continue
            out.checked += 1
            missing = [col for col in expected[title] if col not in cols]
            if missing:
                out.errors.append(f"{where}: columns {missing} missing from {list(cols)}")
            # time series: a time column and numbers, long format
            if t["format"] == 0 and (next(iter(cols)) != "time" or not any(is_numeric(ty) for ty in cols.values())):
                out.errors.append(f"{where}: time series needs 'time' first and a number: {cols}")
            if at_all and not rows:
                out.empty.add(title)
    for a in dash["annotations"]["list"]:
        if a.get("builtIn"):
            continue
        if a["datasource"] != {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"}:
            out.errors.append(f"{uid} / annotation {a['name']}: data source {a['datasource']}")
        try:
            rows, cols = run(store, expand(a["target"]["rawSql"], ctx))
        except Exception as exc:
            out.errors.append(f"{uid} / annotation {a['name']}: {str(exc).splitlines()[0][:300]}")
            continue
        out.checked += 1
        if missing := [c for c in ANNOTATION_COLUMNS if c not in cols]:
            out.errors.append(f"{uid} / annotation {a['name']}: columns {missing} missing from {list(cols)}")
        if not rows:
            out.empty.add(f"annotation {a['name']}")
    return out


def time_range(start: datetime, end: datetime, interval_s: float = 1.0) -> Callable[..., Context]:
    """A ``make_context`` for check_dashboard: a fixed time range and panel interval."""

    def make(**kw) -> Context:
        return Context(time_from=start, time_to=end, interval_s=interval_s, **kw)

    return make
