"""The anomalies and control actions dashboard: what the detection loop found, what the
control loop did, and the alerts sent."""

from __future__ import annotations

from ..grafana import Board, job_link, query_variable, unit_override
from .common import all_of, annotations, board, per_series


def counts_over_time(b: Board, title: str, table: str, time: str, series: str, count: str, where: str) -> None:
    """A time series of ``count`` (``expr AS name``) per ``series`` (a column, or ``expr AS name``)
    over the rows of ``table`` in the range by their ``time`` column, those matching ``where``."""
    s, v = series.rpartition(" AS ")[2], count.rpartition(" AS ")[2]
    b.panel(
        "timeseries",
        title,
        f"""
SELECT $__timeInterval({time}) AS time, {series}, {count}
FROM {table}
WHERE $__timeFilter({time}) AND {where}
GROUP BY time, {s}
ORDER BY time
""",
        ("time", s, v),
        unit="short",
        defaults=per_series(s),
    )


def anomalies() -> Board:
    b = board(
        "pharos-anomalies",
        "Pharos / Anomalies and control actions",
        "What the detection loop found and what the control loop did, also as annotations.",
    )
    b.variables = [
        query_variable(
            "kind", "Anomaly", "SELECT DISTINCT kind FROM anomalies WHERE $__timeFilter(detected) ORDER BY kind"
        ),
        query_variable(
            "action", "Action", "SELECT DISTINCT kind FROM control_actions WHERE $__timeFilter(time) ORDER BY kind"
        ),
    ]
    annotations(
        b,
        anomaly_where=" AND " + all_of("kind IN (${kind})", "kind"),
        control_where=" AND " + all_of("kind IN (${action})", "action"),
    )
    kind_f = all_of("kind IN (${kind})", "kind")
    action_f = all_of("kind IN (${action})", "action")
    counts_over_time(b, "Anomalies over time", "anomalies", "detected", "kind", "uniqExact(key) AS anomalies", kind_f)
    counts_over_time(
        b,
        "Control actions over time",
        "control_actions",
        "time",
        "concat(kind, ' ', status) AS series",
        "count() AS actions",
        action_f,
    )
    b.panel(
        "table",
        "Anomalies",
        f"""
SELECT min(coalesce(start, onset, detected)) AS first_seen, max(detected) AS last_detected, kind, node, node_type,
       job_id, culprit_job, argMax(severity, detected) AS severity, argMax(active, detected) AS active,
       max(ratio) AS ratio, argMax(persistence, detected) AS persistence
FROM anomalies
WHERE $__timeFilter(detected) AND {kind_f}
GROUP BY key, kind, node, node_type, job_id, culprit_job
ORDER BY last_detected DESC
LIMIT 500
""",
        (
            "first_seen",
            "last_detected",
            "kind",
            "node",
            "node_type",
            "job_id",
            "culprit_job",
            "severity",
            "active",
            "ratio",
        ),
        w=24,
        overrides=[job_link("job_id"), job_link("culprit_job")],
    )
    b.panel(
        "table",
        "Control actions",
        f"""
SELECT time, kind, job_id, resource, from_state, to_state, status, dry_run, reason, error
FROM control_actions
WHERE $__timeFilter(time) AND {action_f}
ORDER BY time DESC
LIMIT 500
""",
        ("time", "kind", "job_id", "resource", "from_state", "to_state", "status", "dry_run", "reason"),
        w=24,
        overrides=[job_link("job_id")],
    )
    b.panel(
        "table",
        "Alerts sent",
        """
SELECT time, alertname, state, sink, accepted, status_code, latency_s, key, error
FROM alert_log
WHERE $__timeFilter(time)
ORDER BY time DESC
LIMIT 500
""",
        ("time", "alertname", "state", "sink", "accepted", "status_code", "latency_s", "key"),
        w=24,
        description="Notifications Pharos's own alerter sent to Alertmanager or the webhook (alert_log).",
        overrides=[unit_override("latency_s", "s")],
    )
    return b
