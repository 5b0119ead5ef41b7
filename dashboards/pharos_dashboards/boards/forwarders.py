"""The forwarding-nodes dashboard: load, queue wait, service time and jobs mapped per
forwarding node (pharos-fwd)."""

from __future__ import annotations

from ..grafana import Board, job_link, query_variable, unit_override
from .common import RATE_S, all_of, annotations, board, failslow_table_sql, per_series, rollup, service_per_mib

NODE_F = all_of("forwarding_node IN (${node})", "node")
FWD = f"layer = 'forwarder' AND forwarding_node != '' AND {NODE_F}"


def mean_p99_per_node(b: Board, title: str, sql: str, description: str) -> None:
    """A time series of ``sql``'s ``mean`` and ``p99`` (seconds) per forwarding node."""
    b.panel(
        "timeseries",
        title,
        sql,
        ("time", "forwarding_node", "mean", "p99"),
        unit="s",
        description=description,
        defaults=per_series("forwarding_node", "${__field.labels.forwarding_node} ${__field.name}"),
    )


def forwarders() -> Board:
    b = board(
        "pharos-forwarders",
        "Pharos / Forwarding nodes",
        "Load, queue wait, service time and jobs mapped per forwarding node (pharos-fwd).",
    )
    b.variables = [
        query_variable(
            "node",
            "Forwarding node",
            f"""
SELECT node
FROM (
  SELECT DISTINCT forwarding_node AS node FROM {rollup("forwarding_node", "layer = 'forwarder'")}
  UNION DISTINCT
  SELECT DISTINCT forwarding_node AS node FROM target_metrics WHERE $__timeFilter(time)
)
WHERE node != ''
ORDER BY node
""",
        )
    ]
    annotations(
        b,
        anomaly_where=" AND kind IN ('fail_slow_forwarder', 'interference')",
        control_where=" AND resource = 'mapping'",
    )
    b.panel(
        "timeseries",
        "Load: bandwidth",
        f"""
SELECT $__timeInterval(t) AS time, forwarding_node, sum(data_bytes_read + data_bytes_written) / {RATE_S} AS bandwidth
FROM {rollup("forwarding_node, data_bytes_read, data_bytes_written", FWD)}
GROUP BY time, forwarding_node
ORDER BY time
""",
        ("time", "forwarding_node", "bandwidth"),
        unit="Bps",
        defaults=per_series("forwarding_node"),
    )
    b.panel(
        "timeseries",
        "Load: requests",
        f"""
SELECT $__timeInterval(t) AS time, forwarding_node, sum(ops) / {RATE_S} AS requests
FROM {rollup("forwarding_node, ops", FWD)}
GROUP BY time, forwarding_node
ORDER BY time
""",
        ("time", "forwarding_node", "requests"),
        unit="reqps",
        description="Every request served (data and metadata) per second.",
        defaults=per_series("forwarding_node"),
    )
    mean_p99_per_node(
        b,
        "Queue wait",
        f"""
SELECT $__timeInterval(t) AS time, forwarding_node, sum(queue_wait_ns) / greatest(sum(ops), 1) / 1e9 AS mean,
       quantilesBFloat16Merge(0.5, 0.99)(queue_wait_quantiles)[2] / 1e9 AS p99
FROM {
            rollup(
                "forwarding_node, ops, queue_wait_ns, queue_wait_quantiles",
                FWD,
                "forwarding_node, ops, queue_wait_ns, arrayReduce('quantilesBFloat16StateIf(0.5, 0.99)', [toUInt64(0)], [0]) AS queue_wait_quantiles",
            )
        }
GROUP BY time, forwarding_node
ORDER BY time
""",
        "Time a request waited in the daemon's class queue before a worker took it "
        "(p99: ranges within the last 7 days, which the per-second rollup keeps).",
    )
    mean_p99_per_node(
        b,
        "Service time",
        f"""
SELECT $__timeInterval(t) AS time, forwarding_node,
       sum(service_ns) / greatest(sum(ops), 1) / 1e9 AS mean, quantilesBFloat16Merge(0.5, 0.99)(service_quantiles)[2] / 1e9 AS p99
FROM {rollup("forwarding_node, ops, service_ns, service_quantiles", FWD)}
GROUP BY time, forwarding_node
ORDER BY time
""",
        "Time per request inside the daemon, data and metadata (mean: a merged record's time "
        "divided by its requests; p99: of the records' times).",
    )
    service_per_mib(
        b,
        "Storage service time per MiB through each node",
        "forwarding_node",
        NODE_F,
        "Busy time of the targets per MiB served through the node (TargetMetrics.service_ns_sum): "
        "the fail-slow detector's signal.",
    )
    b.panel(
        "table",
        "Jobs mapped (served in range)",
        f"""
SELECT forwarding_node, uniqExact(job_id) AS jobs, arrayStringConcat(arraySort(groupUniqArray(job_id)), ', ') AS job_ids,
       sum(bytes) AS bytes, max(t) AS last_request
FROM {rollup("forwarding_node, job_id, bytes", FWD)}
GROUP BY forwarding_node
ORDER BY forwarding_node
""",
        ("forwarding_node", "jobs", "job_ids", "bytes", "last_request"),
        overrides=[unit_override("bytes", "bytes")],
    )
    b.panel(
        "table",
        "Mappings decided by the control loop",
        f"""
SELECT job_id, argMax(to_state, time) AS forwarding_nodes, argMax(kind, time) AS decision,
       argMax(status, time) AS status, max(time) AS decided
FROM control_actions
WHERE $__timeFilter(time) AND resource = 'mapping' AND job_id != ''
  AND {all_of("hasAny(splitByChar(',', to_state), [${node}])", "node")}
GROUP BY job_id
ORDER BY decided DESC
LIMIT 100
""",
        ("job_id", "forwarding_nodes", "decision", "status", "decided"),
        description="Newest DFRA / remap / release decision per job (primary node first).",
        overrides=[job_link("job_id")],
    )
    b.panel(
        "table",
        "Reserved (dedicated) nodes",
        """
SELECT node, argMax(job_id, updated) AS job_id, argMax(since, updated) AS since, argMax(reason, updated) AS reason
FROM control_allocations
GROUP BY node
ORDER BY node
""",
        ("node", "job_id", "since", "reason"),
        description="Which job holds each reserved node now (job_id empty: free).",
        overrides=[job_link("job_id")],
    )
    b.panel(
        "table",
        "Fail-slow forwarding nodes",
        failslow_table_sql("fail_slow_forwarder", all_of("node IN (${node})", "node")),
        ("node", "active", "persistence", "severity", "ratio", "onset", "last_detected"),
    )
    return b
