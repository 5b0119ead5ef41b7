"""The job dashboard: one job's rank x time (DXT-like), request sizes, files, I/O pattern, stored
findings, interference and control actions, from its raw records (io_requests)."""

from __future__ import annotations

from pharos_analytics.replays_sql import counted_once

from ..grafana import Board, job_link, query_variable, unit_override
from .common import (
    DIRECTION,
    IS_DATA,
    IS_DATA_FILE,
    JOB,
    LAYER_F,
    META,
    READ,
    WRITE,
    all_of,
    annotations,
    board,
    per_series,
    rollup,
)

#: The Job dashboard's auto-refresh: a running job's heat map and bandwidth grow while it runs.
REFRESH = "10s"
#: Margin of the "follow" link's time range around the job's run, ms.
FOLLOW_MARGIN_MS = 60_000

SIZE_BINS = ("0-100", "100-1K", "1K-10K", "10K-100K", "100K-1M", "1M-4M", "4M-10M", "10M-100M", "100M-1G", "1G+")
SIZE_LIMITS = (100, 1024, 10 * 1024, 100 * 1024, 1 << 20, 4 << 20, 10 << 20, 100 << 20, 1 << 30)


def follow_link() -> dict:
    """The job id's link to this dashboard over the job's run: from its start to its end, or to
    ``now`` while it runs (columns ``view_from``, ``view_to`` of the Job table)."""
    return {
        "matcher": {"id": "byName", "options": "job_id"},
        "properties": [
            {
                "id": "links",
                "value": [
                    {
                        "title": "Follow job ${__value.raw} (its run; live while it runs)",
                        "url": "/d/pharos-job/pharos-job?var-job=${__value.raw}&from=${__data.fields.view_from}"
                        "&to=${__data.fields.view_to}&refresh=" + REFRESH + "&${datasource:queryparam}",
                    }
                ],
            }
        ],
    }


def hidden(field_name: str) -> dict:
    """A table column the panel reads (for links) but does not show."""
    return {"matcher": {"id": "byName", "options": field_name}, "properties": [{"id": "custom.hidden", "value": True}]}


def job() -> Board:
    b = board(
        "pharos-job",
        "Pharos / Job",
        "One job: rank x time (DXT-like), request sizes, files, I/O pattern, stored findings, interference, control actions.",
    )
    b.time_from = "now-24h"
    b.refresh = REFRESH
    rank_f = all_of("toString(rank) IN (${rank})", "rank")
    # a request a mount replayed on another forwarding node after the first had executed it counts
    # once (pharos_analytics.replays_sql), as in `pharos job`; the forwarding nodes' own panel below
    # keeps every execution: the work each node did
    where = f"{JOB} AND $__timeFilter(start) AND {LAYER_F} AND {counted_once(JOB)}"
    b.variables = [
        query_variable(
            "job",
            "Job",
            f"""
SELECT job_id
FROM (
  SELECT job_id, max(t) AS t FROM {rollup("job_id")} GROUP BY job_id
  UNION ALL
  SELECT job_id, max(time) AS t FROM job_events WHERE $__timeFilter(time) GROUP BY job_id
)
GROUP BY job_id
ORDER BY max(t) DESC
""",
            multi=False,
            include_all=False,
        ),
        query_variable("layer", "Layer", f"SELECT DISTINCT layer FROM io_requests WHERE {JOB} ORDER BY layer"),
        query_variable(
            "rank", "Rank", f"SELECT DISTINCT rank FROM io_requests WHERE {JOB} AND rank >= 0 ORDER BY rank"
        ),
    ]
    annotations(
        b,
        anomaly_where=" AND (job_id = '${job}' OR culprit_job = '${job}')",
        control_where=" AND job_id = '${job}'",
    )
    b.panel(
        "table",
        "Job",
        f"""
SELECT job_id, anyIf(name, kind = 'start') AS name, anyIf(user, kind = 'start') AS user,
       maxIf(ranks, kind = 'start') AS ranks, minIf(time, kind = 'start') AS started,
       if(countIf(kind = 'end') = 0, NULL, maxIf(time, kind = 'end')) AS ended,
       anyIf(exit_code, kind = 'end') AS exit_code, anyIf(arrayStringConcat(command, ' '), kind = 'start') AS command,
       multiIf(countIf(kind = 'end') = 0, 'running', exit_code = 0, 'finished', 'failed') AS state,
       toUnixTimestamp64Milli(minIf(time, kind = 'start')) - {FOLLOW_MARGIN_MS} AS view_from,
       if(countIf(kind = 'end') = 0, 'now',
          toString(toUnixTimestamp64Milli(maxIf(time, kind = 'end')) + {FOLLOW_MARGIN_MS})) AS view_to
FROM job_events FINAL
WHERE {JOB}
GROUP BY job_id
""",
        (
            "job_id",
            "name",
            "user",
            "ranks",
            "started",
            "ended",
            "exit_code",
            "command",
            "state",
            "view_from",
            "view_to",
        ),
        w=24,
        h=4,
        description="The job's events. Its id links to this dashboard over the job's run (a minute either side): "
        "to 'now' while the job runs, so the heat map and bandwidth grow at each refresh (every "
        f"{REFRESH}).",
        overrides=[follow_link(), hidden("view_from"), hidden("view_to")],
    )
    b.panel(
        "table",
        "I/O by layer",
        f"""
SELECT layer,
       sumIf(bytes, {IS_DATA} AND op IN {READ}) AS bytes_read,
       sumIf(bytes, {IS_DATA} AND op IN {WRITE}) AS bytes_written,
       sumIf(count, {IS_DATA}) AS data_ops,
       sumIf(count, op IN {META}) AS metadata_ops,
       uniqExactIf(rank, {IS_DATA} AND rank >= 0) AS io_ranks,
       uniqExactIf(path, {IS_DATA_FILE}) AS data_files,
       min(start) AS first_request,
       max(end) AS last_request
FROM io_requests
WHERE {where}
GROUP BY layer
ORDER BY layer
""",
        ("layer", "bytes_read", "bytes_written", "data_ops", "metadata_ops", "io_ranks", "data_files"),
        w=14,
        h=6,
        overrides=[unit_override("bytes_read", "bytes"), unit_override("bytes_written", "bytes")],
    )
    b.panel(
        "table",
        "I/O pattern",
        f"""
SELECT direction, ranks, files, max_ranks_per_file,
       multiIf(ranks = 0 OR files = 0, 'none', ranks = 1 AND files = 1, '1-1', ranks = 1, '1-N',
               files = 1, 'N-1', max_ranks_per_file <= 1, 'N-N', 'N-M') AS pattern
FROM (
  SELECT d AS direction, length(arrayDistinct(arrayFlatten(groupArray(rs)))) AS ranks, count() AS files,
         max(length(rs)) AS max_ranks_per_file
  FROM (
    SELECT arrayJoin([{DIRECTION}, 'all']) AS d, path, groupUniqArray(rank) AS rs
    FROM io_requests
    WHERE {where} AND {IS_DATA_FILE} AND rank >= 0
    GROUP BY d, path
  )
  GROUP BY d
)
ORDER BY direction
""",
        ("direction", "ranks", "files", "max_ranks_per_file", "pattern"),
        w=10,
        h=6,
        description="Beacon's fan-in pattern over the job's data files (pharos_analytics.pattern.classify_fan_in): "
        "R ranks, M files, the most ranks on one file. This is the fan-in detail: the job's pattern, decided by "
        "volume so that a side file (e.g. rank 0's results file) does not count, is in `pharos job` and the API. "
        "`pharos diagnose` also splits it by phase.",
    )
    node = "if(layer = 'client', toString(host), toString(compute_node))"
    b.panel(
        "table",
        "Compute nodes",
        f"""
SELECT layer, {node} AS node, uniqExactIf(rank, {IS_DATA} AND rank >= 0) AS io_ranks,
       sumIf(bytes, {IS_DATA} AND op IN {READ}) AS bytes_read,
       sumIf(bytes, {IS_DATA} AND op IN {WRITE}) AS bytes_written,
       arrayStringConcat(arraySort(groupUniqArrayIf(forwarding_node, forwarding_node != '')), ', ') AS forwarding_nodes
FROM io_requests
WHERE {where} AND {node} != ''
GROUP BY layer, node
ORDER BY layer, node
""",
        ("layer", "node", "io_ranks", "bytes_read", "bytes_written", "forwarding_nodes"),
        w=24,
        h=6,
        description="The nodes the job ran on, per layer (the agents' host on the client layer, the FUSE "
        "clients' compute node on the forwarder layer) and the forwarding nodes that served each: the job's "
        "DFRA mapping per compute node as it ran (pharos job's compute_nodes and forwarding_nodes).",
        overrides=[unit_override("bytes_read", "bytes"), unit_override("bytes_written", "bytes")],
    )
    b.panel(
        "heatmap",
        "Rank x time (bytes)",
        f"""
SELECT $__timeInterval(start) AS time, toString(rank) AS rank_id, sum(bytes) AS bytes
FROM io_requests
WHERE {where} AND {rank_f} AND {IS_DATA} AND rank >= 0
GROUP BY time, rank_id
ORDER BY time, toInt32(rank_id)
""",
        ("time", "rank_id", "bytes"),
        w=24,
        h=10,
        description="Like Darshan's DXT view: one row per rank, one column per interval, colour = bytes moved.",
        defaults=per_series("rank_id"),
    )
    b.panel(
        "timeseries",
        "Bandwidth",
        f"""
SELECT $__timeInterval(start) AS time, concat(layer, ' ', {DIRECTION}) AS series, sum(bytes) / $__interval_s AS bandwidth
FROM io_requests
WHERE {where} AND {rank_f} AND {IS_DATA}
GROUP BY time, series
ORDER BY time
""",
        ("time", "series", "bandwidth"),
        w=12,
        unit="Bps",
        defaults=per_series("series"),
    )
    bins = ", ".join(f"'{x}'" for x in SIZE_BINS)
    tests = ", ".join(f"size <= {lim}, {i + 1}" for i, lim in enumerate(SIZE_LIMITS))
    b.panel(
        "barchart",
        "Request sizes",
        f"""
SELECT [{bins}][bin] AS size, sumIf(count, op IN {READ}) AS reads, sumIf(count, op IN {WRITE}) AS writes
FROM (
  SELECT op, count, multiIf({tests}, {len(SIZE_BINS)}) AS bin
  FROM io_requests
  WHERE {where} AND {rank_f} AND {IS_DATA}
)
GROUP BY bin
ORDER BY bin
""",
        ("size", "reads", "writes"),
        w=12,
        description="Requests per size bin, Darshan's bins (bytes, upper bound included).",
        options={"xField": "size"},
    )
    b.panel(
        "table",
        "Files",
        f"""
SELECT path, uniqExact(rank) AS ranks,
       sumIf(bytes, op IN {READ}) AS bytes_read, sumIf(bytes, op IN {WRITE}) AS bytes_written, sum(count) AS ops,
       arrayStringConcat(arraySort(groupUniqArrayIf(forwarding_node, forwarding_node != '')), ', ') AS forwarding_nodes,
       arrayStringConcat(arraySort(groupUniqArrayIf(target, target != '')), ', ') AS targets,
       min(start) AS first_request, max(end) AS last_request
FROM io_requests
WHERE {where} AND {rank_f} AND {IS_DATA_FILE}
GROUP BY path
ORDER BY bytes_read + bytes_written DESC
LIMIT 200
""",
        ("path", "ranks", "bytes_read", "bytes_written", "ops", "forwarding_nodes", "targets"),
        w=24,
        overrides=[unit_override("bytes_read", "bytes"), unit_override("bytes_written", "bytes")],
    )
    b.panel(
        "table",
        "Forwarding nodes and targets",
        f"""
SELECT forwarding_node, target, sum(bytes) AS bytes, sum(count) AS ops,
       avg(queue_wait_ns) / 1e9 AS mean_queue_wait, sum(duration_ns) / greatest(sum(count), 1) / 1e9 AS mean_service_time
FROM io_requests
WHERE {JOB} AND $__timeFilter(start) AND layer = 'forwarder'
GROUP BY forwarding_node, target
ORDER BY bytes DESC
""",
        ("forwarding_node", "target", "bytes", "ops", "mean_queue_wait", "mean_service_time"),
        w=12,
        overrides=[
            unit_override("bytes", "bytes"),
            unit_override("mean_queue_wait", "s"),
            unit_override("mean_service_time", "s"),
        ],
    )
    b.panel(
        "table",
        "Stored findings (straggler resources)",
        f"""
SELECT detected, node_type AS resource_type, node AS resource, ratio, severity,
       JSONExtractString(evidence, 'method') AS method
FROM anomalies
WHERE {JOB} AND kind = 'straggler_resource'
ORDER BY detected DESC
LIMIT 100
""",
        ("detected", "resource_type", "resource", "ratio", "severity", "method"),
        w=12,
        description="Insights are computed on demand (`pharos diagnose JOB`, GET /v1/jobs/JOB/diagnosis); the "
        "detection loop stores only the resources that made the job's stragglers (kind straggler_resource).",
    )
    b.panel(
        "table",
        "Interference",
        """
SELECT min(coalesce(start, onset, detected)) AS started, max(coalesce(end, detected)) AS ended,
       if(job_id = '${job}', 'victim', 'culprit') AS role, job_id AS slowed_job, culprit_job,
       concat(node_type, ':', node) AS resource, max(ratio) AS latency_ratio,
       argMax(severity, detected) AS severity, argMax(active, detected) AS active
FROM anomalies
WHERE kind = 'interference' AND (job_id = '${job}' OR culprit_job = '${job}')
GROUP BY key, job_id, culprit_job, node_type, node
ORDER BY started
""",
        ("started", "ended", "role", "slowed_job", "culprit_job", "resource", "latency_ratio", "severity"),
        w=24,
        overrides=[job_link("slowed_job"), job_link("culprit_job")],
    )
    b.panel(
        "table",
        "Control actions",
        f"""
SELECT time, kind, resource, from_state, to_state, status, reason, error
FROM control_actions
WHERE {JOB}
ORDER BY time DESC
LIMIT 200
""",
        ("time", "kind", "resource", "from_state", "to_state", "status", "reason"),
        w=24,
    )
    b.text(
        "Full diagnosis",
        "Insights (Drishti-style), phases and the plain-words diagnosis: `pharos diagnose ${job}`, "
        "`pharos report ${job} --html FILE`, or the API's `/v1/jobs/${job}/diagnosis` and `/v1/jobs/${job}/report`.",
    )
    return b
