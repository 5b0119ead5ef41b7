"""What Grafana and grafana-clickhouse-datasource (v4) do to a query's SQL before ClickHouse sees
it, re-implemented from their documented semantics (docs/dashboards.md) for the tests:

1. front end, ``CHDatasource.applyTemplateVariables``: ``$__conditionalAll(condition, $var)``
   first (innermost-last: the last occurrence is expanded first): ``1=1`` when the variable's
   current value is All (``$__all``) or empty, else the condition as written; then Grafana's
   template variables with the plugin's formatter: a multi-value (an array, also All = every
   option when the variable has no custom all value) becomes ``'a','b'``, a single value is
   inserted as is (unquoted);
2. back end, ``pkg/macros``: ``$__timeFilter(c)`` → ``c >= toDateTime(F) AND c <= toDateTime(T)``,
   ``$__timeFilter_ms``, ``$__timeInterval(c)`` → ``toStartOfInterval(toDateTime(c), INTERVAL N
   second)`` (N = the panel interval in whole seconds, at least 1), ``$__timeInterval_ms``,
   ``$__interval_s`` → N, ``$__fromTime`` / ``$__toTime`` → ``toDateTime(F)`` / ``toDateTime(T)``,
   ``$__fromTime_ms`` / ``$__toTime_ms`` → ``fromUnixTimestamp64Milli(ms)``, ``$__dateFilter``,
   ``$__timeFrom`` / ``$__timeTo``. Alert rules get only step 2 (they run in Grafana's back end).

Anything left that looks like a macro or variable is an error here (ClickHouse would reject it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

ALL = "$__all"
# Grafana's templateSrv variable syntax: $var, [[var]], ${var}, ${var.path}, ${var:format}.
VARIABLE_RE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")
MACRO_RE = re.compile(r"\$__(\w+)")


class ExpandError(ValueError):
    pass


@dataclass
class Context:
    """Variables' current values (a list for multi-value, ``[ALL]`` for All), the options of each
    variable (what All stands for), the time range and the panel interval."""

    time_from: datetime
    time_to: datetime
    interval_s: float = 1.0
    values: dict[str, str | list[str]] = field(default_factory=dict)
    options: dict[str, list[str]] = field(default_factory=dict)


def macro_args(sql: str, open_paren: int) -> tuple[list[str], int] | None:
    """The arguments of a macro call whose '(' is at ``open_paren`` (split at depth-1 commas, as the
    plugin's getMacroArgs does) and the index just after the closing ')'."""
    depth, start, args = 0, open_paren + 1, []
    for i in range(open_paren, len(sql)):
        c = sql[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(sql[start:i])
                return args, i + 1
        elif c == "," and depth == 1:
            args.append(sql[start:i])
            start = i + 1
    return None


def _current(ctx: Context, name: str) -> str | list[str] | None:
    return ctx.values.get(name)


def conditional_all(sql: str, ctx: Context) -> str:
    macro = "$__conditionalAll("
    i = sql.rfind(macro)
    while i != -1:
        parsed = macro_args(sql, i + len(macro) - 1)
        if parsed is None or len(parsed[0]) != 2:
            raise ExpandError(f"$__conditionalAll needs 2 arguments: {sql[i : i + 80]!r}")
        (cond, var), end = parsed
        m = re.search(r"(?<=\$\{)\w+(?=\})|(?<=\$)\w+", var.strip())
        if m is None or m.group(0) not in ctx.values:
            raise ExpandError(f"$__conditionalAll on an unknown variable {var.strip()!r}")
        cur = _current(ctx, m.group(0))
        text = ",".join(cur) if isinstance(cur, list) else str(cur)
        sql = sql[:i] + ("1=1" if text in ("", ALL) else cond) + sql[end:]
        i = sql.rfind(macro)
    return sql


def _format(value: str | list[str]) -> str:
    """The plugin's formatter: arrays quoted and comma-joined, single values as they are."""
    if isinstance(value, list):
        return "'" + "','".join(value) + "'"
    return value


def variables(sql: str, ctx: Context) -> str:
    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        if name not in ctx.values:
            return m.group(0)  # not a variable (a macro such as $__timeFilter): left for the back end
        if m.group(3) or m.group(5) or m.group(6):
            raise ExpandError(f"variable formats and paths are not used by Pharos: {m.group(0)}")
        cur = ctx.values[name]
        if cur == ALL or cur == [ALL]:
            cur = list(ctx.options[name])
        return _format(cur)

    return VARIABLE_RE.sub(repl, sql)


def backend_macros(sql: str, ctx: Context) -> str:
    f, t = int(ctx.time_from.timestamp()), int(ctx.time_to.timestamp())
    fms, tms = int(ctx.time_from.timestamp() * 1000), int(ctx.time_to.timestamp() * 1000)
    secs = max(int(ctx.interval_s), 1)
    ms = max(int(ctx.interval_s * 1000), 1)
    one_arg = {
        "timeFilter": lambda c: f"{c} >= toDateTime({f}) AND {c} <= toDateTime({t})",
        "timeFilter_ms": lambda c: f"{c} >= fromUnixTimestamp64Milli({fms}) AND {c} <= fromUnixTimestamp64Milli({tms})",
        "timeInterval": lambda c: f"toStartOfInterval(toDateTime({c}), INTERVAL {secs} second)",
        "timeInterval_ms": lambda c: f"toStartOfInterval(toDateTime64({c}, 3), INTERVAL {ms} millisecond)",
        "dateFilter": lambda c: (
            f"{c} >= toDate('{ctx.time_from:%Y-%m-%d}') AND {c} <= toDate('{ctx.time_to:%Y-%m-%d}')"
        ),
        "timeFrom": lambda c: f"{c} >= toDateTime({f})",
        "timeTo": lambda c: f"{c} <= toDateTime({t})",
    }
    no_arg = {
        "fromTime": f"toDateTime({f})",
        "toTime": f"toDateTime({t})",
        "fromTime_ms": f"fromUnixTimestamp64Milli({fms})",
        "toTime_ms": f"fromUnixTimestamp64Milli({tms})",
        "interval_s": str(secs),
        "interval_ms": str(ms),
    }
    out, pos = [], 0
    for m in MACRO_RE.finditer(sql):
        if m.start() < pos:
            continue
        name = m.group(1)
        out.append(sql[pos : m.start()])
        if name in one_arg:
            parsed = macro_args(sql, m.end()) if sql[m.end() : m.end() + 1] == "(" else None
            if parsed is None or len(parsed[0]) != 1:
                raise ExpandError(f"$__{name} takes one argument: {sql[m.start() : m.start() + 60]!r}")
            out.append(one_arg[name](parsed[0][0].strip()))
            pos = parsed[1]
        elif name in no_arg:
            out.append(no_arg[name])
            pos = m.end()
        else:
            raise ExpandError(f"unknown macro $__{name}")
    out.append(sql[pos:])
    return "".join(out)


def expand(sql: str, ctx: Context, *, frontend: bool = True) -> str:
    """The SQL ClickHouse receives: front-end steps (dashboards), then the back-end macros."""
    if frontend:
        sql = variables(conditional_all(sql, ctx), ctx)
    sql = backend_macros(sql, ctx)
    left = re.search(r"\$\{?\w|\[\[\w", sql)
    if left:
        raise ExpandError(f"unexpanded variable or macro at {sql[left.start() : left.start() + 40]!r}")
    return sql


def rate_interval(scrape_interval_s: float, interval_s: float) -> float:
    """Grafana's ``$__rate_interval`` for a Prometheus data source: max(``$__interval`` + the data
    source's scrape interval, 4 × the scrape interval), so a rate() window always holds several
    scrapes."""
    return max(interval_s + scrape_interval_s, 4 * scrape_interval_s)


def expand_promql(expr: str, scrape_interval_s: float, interval_s: float) -> str:
    """A Prometheus panel query as Grafana sends it: ``$__rate_interval`` and ``$__interval`` become
    durations in whole seconds (at least 1). Anything else that looks like a macro or a variable is
    an error (the Pharos health dashboard has no variables but its data source)."""
    rate = f"{max(1, round(rate_interval(scrape_interval_s, interval_s)))}s"
    out = expr.replace("$__rate_interval", rate).replace("$__interval", f"{max(1, round(interval_s))}s")
    if "$" in out:
        raise ExpandError(f"unexpanded macro or variable in {out!r}")
    return out
