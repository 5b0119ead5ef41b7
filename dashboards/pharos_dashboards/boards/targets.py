"""The storage-targets dashboard: bandwidth per target over time, latency percentiles, fail-slow
state, placement pools (target_metrics, anomalies, control_actions)."""

from __future__ import annotations

from ..grafana import Board, query_variable, unit_override
from .common import all_of, annotations, board, failslow_table_sql, per_series, service_per_mib

TARGET_F = all_of("target IN (${target})", "target")


def targets() -> Board:
    b = board(
        "pharos-targets",
        "Pharos / Storage targets",
        "Bandwidth per target over time, latency percentiles, fail-slow state, placement pools.",
    )
    b.variables = [
        query_variable(
            "target", "Target", "SELECT DISTINCT target FROM target_metrics WHERE $__timeFilter(time) ORDER BY target"
        )
    ]
    annotations(b, anomaly_where=" AND kind = 'fail_slow_target'", control_where=" AND kind = 'placement'")
    b.panel(
        "heatmap",
        "Bandwidth: target x time",
        f"""
SELECT $__timeInterval(time) AS time, target, sum(bytes_read + bytes_written) / $__interval_s AS bandwidth
FROM target_metrics FINAL
WHERE $__timeFilter(time) AND {TARGET_F}
GROUP BY time, target
ORDER BY time, target
""",
        ("time", "target", "bandwidth"),
        w=24,
        h=9,
        unit="Bps",
        description="Bytes read and written per second on each target, summed over the forwarding daemons serving it.",
        defaults=per_series("target"),
    )
    b.panel(
        "timeseries",
        "Latency percentiles",
        f"""
SELECT $__timeInterval(time) AS time, target,
       max(latency_p50_ns) / 1e9 AS p50, max(latency_p95_ns) / 1e9 AS p95, max(latency_p99_ns) / 1e9 AS p99
FROM target_metrics FINAL
WHERE $__timeFilter(time) AND {TARGET_F} AND read_ops + write_ops + metadata_ops > 0
GROUP BY time, target
ORDER BY time
""",
        ("time", "target", "p50", "p95", "p99"),
        unit="s",
        description="Service-time percentiles of each interval; the largest over the daemons and intervals in a bucket.",
        defaults=per_series("target", "${__field.labels.target} ${__field.name}"),
    )
    service_per_mib(
        b,
        "Service time per MiB",
        "target",
        TARGET_F,
        "What the fail-slow detector compares between peers (pharos_analytics.failslow).",
    )
    b.panel(
        "state-timeline",
        "Fail-slow state",
        f"""
SELECT $__timeInterval(detected) AS time, node AS target, max(active) AS fail_slow
FROM anomalies
WHERE kind = 'fail_slow_target' AND $__timeFilter(detected) AND {all_of("node IN (${target})", "target")}
GROUP BY time, target
ORDER BY time
""",
        ("time", "target", "fail_slow"),
        w=24,
        h=6,
        description="Each detection cycle that found the target fail-slow (1) or saw it recover (0).",
        defaults={
            **per_series("target"),
            "mappings": [
                {
                    "options": {
                        "0": {"color": "green", "text": "recovered"},
                        "1": {"color": "red", "text": "fail-slow"},
                    },
                    "type": "value",
                }
            ],
        },
    )
    b.panel(
        "table",
        "Fail-slow targets",
        failslow_table_sql("fail_slow_target", all_of("node IN (${target})", "target")),
        ("node", "active", "persistence", "severity", "ratio", "onset", "last_detected"),
    )
    b.panel(
        "table",
        "Target state",
        f"""
SELECT target, max(time) AS last_report, argMax(max_perf_mb_s, time) AS max_perf_mb_s, argMax(slowdown, time) AS slowdown,
       argMax(added_latency_ns, time) / 1e9 AS added_latency, argMax(throttled, time) AS throttled,
       max(queue_depth) AS max_queue_depth
FROM target_metrics FINAL
WHERE $__timeFilter(time) AND {TARGET_F}
GROUP BY target
ORDER BY target
""",
        ("target", "last_report", "max_perf_mb_s", "slowdown", "added_latency", "throttled", "max_queue_depth"),
        description="Configured token-bucket limit and injected faults as the daemons last reported them.",
        overrides=[unit_override("added_latency", "s")],
    )
    b.panel(
        "table",
        "Pool membership",
        f"""
SELECT pool, target, source, JSONExtractFloat(state, 'max_perf', target) AS max_perf_mb_s, since
FROM (
  SELECT substring(resource, 6) AS pool, argMax(to_state, time) AS state, 'control loop' AS source, max(time) AS since
  FROM control_actions
  WHERE kind = 'placement' AND status IN ('applied', 'recorded') AND time <= $__toTime
  GROUP BY resource
  UNION ALL
  SELECT name AS pool, argMax(value, updated) AS state, 'pin' AS source, max(updated) AS since
  FROM control_pins
  WHERE scope = 'pool'
  GROUP BY name
  HAVING argMax(deleted, updated) = 0
)
ARRAY JOIN JSONExtract(state, 'targets', 'Array(String)') AS target
WHERE {TARGET_F}
ORDER BY pool, source, target
""",
        ("pool", "target", "source", "max_perf_mb_s", "since"),
        w=24,
        description="Targets of each placement pool: the control loop's newest plan and admins' pins "
        "(a pin wins over the plan, `pharos control pin`).",
    )
    return b
