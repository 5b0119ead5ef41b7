"""The Pharos dashboards: system overview, job, forwarding nodes, storage targets, anomalies and
control actions. Every query is raw ClickHouse SQL on the tables of
pipeline/pharos_pipeline/migrations with the plugin's macros (docs/dashboards.md); op lists and
the system-path rule come from pharos_analytics, so the dashboards count what the job summary
counts."""

from __future__ import annotations

from pharos_analytics.pattern import SYSTEM_PATH_REGEX
from pharos_analytics.summary import DATA_OPS, META_OPS, READ_OPS, WRITE_OPS, sql_list

from .grafana import PLUGIN, Board, custom_variable, job_link, query_variable, series_name, unit_override

READ, WRITE, DATA, META = sql_list(READ_OPS), sql_list(WRITE_OPS), sql_list(DATA_OPS), sql_list(META_OPS)
#: Data I/O on regular files (what the job summary calls bytes and data ops).
IS_DATA = f"(file_type = 'regular' AND op IN {DATA})"
#: Data I/O on a job's data files: also not a system path (libraries, /etc) nor a standard stream.
IS_DATA_FILE = f"({IS_DATA} AND path != '' AND NOT match(path, '{SYSTEM_PATH_REGEX}'))"
DIRECTION = f"if(op IN {READ}, 'read', 'write')"
JOB = "job_id = '${job}'"  # a single-value variable is interpolated as is: quote it


def all_of(condition: str, var: str) -> str:
    """The plugin's filter for a multi-select variable with All: the condition, or 1=1 for All."""
    return f"$__conditionalAll({condition}, ${var})"


LAYER_F = all_of("layer IN (${layer})", "layer")

#: The system-wide panels read the rollups (migrations 009 and 011, issue 15 item 2), not raw
#: records: their cost grows with the range and the objects in it, not with the records. A range
#: that starts within the last ROLLUP_1S_DAYS days (inside the 1 s rollup's 8-day TTL) reads
#: io_rollup_1s, an older one io_rollup_1m; ``t`` is the row's second or minute, ``span`` its
#: length in seconds (a rate divides by RATE_S, never less than one row's span).
ROLLUP_1S_DAYS = 7
RATE_S = "greatest($__interval_s, max(span))"


def rollup(cols: str, where: str = "1", cols_1m: str | None = None) -> str:
    """A FROM source over the rollup of the selected range with ``t``, ``span`` and ``cols``
    (columns both rollups have: layer, job_id, forwarding_node, target, records, ops, bytes,
    service_ns, queue_wait_ns, service_quantiles, data_bytes_read, data_bytes_written, data_reads,
    data_writes, meta_ops; ``cols_1m`` for the minute rollup when ``cols`` names a 1 s-only
    column: queue_wait_quantiles, compute_nodes), rows matching ``where``."""
    return f"""(
  SELECT sec AS t, 1 AS span, {cols} FROM io_rollup_1s
  WHERE $__fromTime >= now() - INTERVAL {ROLLUP_1S_DAYS} DAY AND $__timeFilter(sec) AND {where}
  UNION ALL
  SELECT minute AS t, 60 AS span, {cols_1m or cols} FROM io_rollup_1m
  WHERE $__fromTime < now() - INTERVAL {ROLLUP_1S_DAYS} DAY AND $__timeFilter(minute) AND {where}
)"""


def per_series(label: str, fmt: str = "") -> dict:
    d = series_name(label)
    if fmt:
        d["displayName"] = fmt
    return d


# ---------------------------------------------------------------- annotations (shared)


def anomaly_annotation_sql(where: str = "") -> str:
    """One annotation per anomaly condition (``key``): its time span over every detection cycle
    that stored it, columns time, timeEnd, title, tags, text."""
    return f"""
SELECT
  min(coalesce(start, onset, detected)) AS time,
  max(coalesce(end, detected)) AS timeEnd,
  concat(any(kind), ' ', any(node), if(any(job_id) = '', '', concat(' (job ', any(job_id), ')'))) AS title,
  concat(any(kind), ',', argMax(severity, detected), ',', any(node_type)) AS tags,
  concat('x', toString(round(max(ratio), 2)),
         if(any(culprit_job) = '', '', concat(', culprit job ', any(culprit_job))),
         if(any(persistence) = '', '', concat(', ', any(persistence))),
         if(argMax(active, detected) = 1, ', active', '')) AS text
FROM anomalies
WHERE $__timeFilter(detected){where}
GROUP BY key
ORDER BY time
"""


def control_annotation_sql(where: str = "") -> str:
    return f"""
SELECT
  time,
  time AS timeEnd,
  concat(kind, ' ', resource, if(job_id = '', '', concat(' job ', job_id))) AS title,
  concat(kind, ',', status, if(dry_run = 1, ',dry-run', '')) AS tags,
  concat(from_state, ' -> ', to_state, ': ', reason, if(error = '', '', concat(' (error: ', error, ')'))) AS text
FROM control_actions
WHERE $__timeFilter(time){where}
ORDER BY time
"""


def annotations(board: Board, anomaly_where: str = "", control_where: str = "") -> None:
    from .grafana import annotation

    board.annotations += [
        annotation("Anomalies", anomaly_annotation_sql(anomaly_where), "red"),
        annotation("Control actions", control_annotation_sql(control_where), "blue"),
    ]


LINKS = [
    {
        "asDropdown": True,
        "icon": "external link",
        "includeVars": False,
        "keepTime": True,
        "tags": ["pharos"],
        "targetBlank": False,
        "title": "Pharos",
        "tooltip": "",
        "type": "dashboards",
        "url": "",
    }
]


def board(uid: str, title: str, description: str, datasource: str = PLUGIN) -> Board:
    return Board(uid=uid, title=title, description=description, tags=["pharos"], links=LINKS, datasource=datasource)


# ---------------------------------------------------------------- system overview


def top_jobs_sql(value: str, alias: str) -> str:
    """Top-N jobs by ``value`` (over the rollup's rows) over the selected layers; per job the
    largest layer's value (each layer sees the same requests: summing layers would count them twice)."""
    cols = "layer, job_id, data_bytes_read, data_bytes_written, data_reads, data_writes, meta_ops"
    return f"""
SELECT job_id, max(v) AS {alias}
FROM (
  SELECT job_id, layer, {value} AS v
  FROM {rollup(cols, LAYER_F)}
  GROUP BY job_id, layer
)
GROUP BY job_id
ORDER BY {alias} DESC
LIMIT ${{topn}}
"""


def overview() -> Board:
    b = board(
        "pharos-overview",
        "Pharos / System overview",
        "Bandwidth, IOPS and metadata operations by layer, active jobs, top jobs.",
    )
    b.variables = [
        query_variable("layer", "Layer", f"SELECT DISTINCT layer FROM {rollup('layer')} ORDER BY layer"),
        custom_variable("topn", "Top N", ["5", "10", "20", "50"], "10"),
    ]
    annotations(b)
    b.row("I/O by layer")
    for title, value, alias, unit, description in (
        (
            "Bandwidth by layer",
            "sum(d.2)",
            "bandwidth",
            "Bps",
            "Bytes read and written on regular files per second, per layer (client: eBPF agent, "
            "forwarder: pharos-fwd, storage: block layer). A merged record counts at its start.",
        ),
        (
            "IOPS by layer",
            "sum(d.3)",
            "iops",
            "iops",
            "Data requests per second (a merged record counts its requests).",
        ),
    ):
        b.panel(
            "timeseries",
            title,
            f"""
SELECT $__timeInterval(t) AS time, concat(layer, ' ', d.1) AS series, {value} / {RATE_S} AS {alias}
FROM {rollup("layer, data_bytes_read, data_bytes_written, data_reads, data_writes", LAYER_F)}
ARRAY JOIN [('read', data_bytes_read, data_reads), ('write', data_bytes_written, data_writes)] AS d
WHERE d.3 > 0
GROUP BY time, series
ORDER BY time
""",
            ("time", "series", alias),
            w=8,
            unit=unit,
            description=description,
            defaults=per_series("series"),
        )
    b.panel(
        "timeseries",
        "Metadata ops by layer",
        f"""
SELECT $__timeInterval(t) AS time, layer, sum(meta_ops) / {RATE_S} AS metadata_ops
FROM {rollup("layer, meta_ops", LAYER_F + " AND meta_ops > 0")}
GROUP BY time, layer
ORDER BY time
""",
        ("time", "layer", "metadata_ops"),
        w=8,
        unit="ops",
        description=f"open, close, stat, fsync, unlink, mkdir, rename per second: {META}.",
        defaults=per_series("layer"),
    )
    b.row("Jobs")
    b.panel(
        "stat",
        "Jobs active in range",
        """
SELECT count() AS active_jobs
FROM (
  SELECT job_id, minIf(time, kind = 'start') AS started, maxIf(time, kind = 'end') AS ended, countIf(kind = 'end') AS ends
  FROM job_events FINAL
  GROUP BY job_id
)
WHERE started <= $__toTime AND (ends = 0 OR ended >= $__fromTime)
""",
        ("active_jobs",),
        w=4,
        description="Jobs running at some time in the range (start event before its end, no end event or one after its start).",
    )
    b.panel(
        "timeseries",
        "Jobs doing I/O",
        f"""
SELECT $__timeInterval(t) AS time, uniqExact(job_id) AS jobs
FROM {rollup("job_id", LAYER_F)}
GROUP BY time
ORDER BY time
""",
        ("time", "jobs"),
        w=8,
        unit="short",
    )
    b.panel(
        "table",
        "Active jobs",
        f"""
SELECT job_id, e.name AS name, e.user AS user, e.ranks AS ranks, e.started AS started, e.ended AS ended,
       j.bytes AS bytes, j.ops AS data_ops
FROM (
  SELECT job_id, max(b) AS bytes, max(o) AS ops
  FROM (
    SELECT job_id, layer, sum(data_bytes_read + data_bytes_written) AS b, sum(data_reads + data_writes) AS o
    FROM {rollup("layer, job_id, data_bytes_read, data_bytes_written, data_reads, data_writes", LAYER_F)}
    GROUP BY job_id, layer
    HAVING o > 0
  )
  GROUP BY job_id
) AS j
LEFT JOIN (
  SELECT job_id, anyIf(name, kind = 'start') AS name, anyIf(user, kind = 'start') AS user,
         maxIf(ranks, kind = 'start') AS ranks, minIf(time, kind = 'start') AS started,
         if(countIf(kind = 'end') = 0, NULL, maxIf(time, kind = 'end')) AS ended
  FROM job_events FINAL
  GROUP BY job_id
) AS e USING (job_id)
ORDER BY bytes DESC
LIMIT 100
""",
        ("job_id", "name", "user", "ranks", "started", "ended", "bytes", "data_ops"),
        w=12,
        overrides=[job_link("job_id"), unit_override("bytes", "bytes")],
    )
    b.row("Top jobs")
    for title, value, alias, unit in (
        ("Top jobs by bytes", "sum(data_bytes_read + data_bytes_written)", "bytes", "bytes"),
        (
            "Top jobs by IOPS",
            "sumIf(data_reads + data_writes, data_reads + data_writes > 0) "
            "/ greatest(1, dateDiff('second', minIf(t, data_reads + data_writes > 0), "
            "maxIf(t, data_reads + data_writes > 0)) + max(span))",
            "iops",
            "iops",
        ),
        ("Top jobs by metadata ops", "sum(meta_ops)", "metadata_ops", "short"),
    ):
        b.panel(
            "table",
            title,
            top_jobs_sql(value, alias),
            ("job_id", alias),
            w=8,
            description="IOPS: data requests over the seconds (minutes, for a range older than 7 days) "
            "from the job's first to its last data request in the range."
            if alias == "iops"
            else "",
            overrides=[job_link("job_id"), unit_override(alias, unit)],
        )
    return b


# ---------------------------------------------------------------- job

SIZE_BINS = ("0-100", "100-1K", "1K-10K", "10K-100K", "100K-1M", "1M-4M", "4M-10M", "10M-100M", "100M-1G", "1G+")
SIZE_LIMITS = (100, 1024, 10 * 1024, 100 * 1024, 1 << 20, 4 << 20, 10 << 20, 100 << 20, 1 << 30)


def job() -> Board:
    b = board(
        "pharos-job",
        "Pharos / Job",
        "One job: rank x time (DXT-like), request sizes, files, I/O pattern, stored findings, interference, control actions.",
    )
    b.time_from = "now-24h"
    rank_f = all_of("toString(rank) IN (${rank})", "rank")
    where = f"{JOB} AND $__timeFilter(start) AND {LAYER_F}"
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
       anyIf(exit_code, kind = 'end') AS exit_code, anyIf(arrayStringConcat(command, ' '), kind = 'start') AS command
FROM job_events FINAL
WHERE {JOB}
GROUP BY job_id
""",
        ("job_id", "name", "user", "ranks", "started", "ended", "exit_code", "command"),
        w=24,
        h=4,
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
        "R ranks, M files, the most ranks on one file. `pharos diagnose` also splits it by phase.",
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


# ---------------------------------------------------------------- forwarding nodes

NODE_F = all_of("forwarding_node IN (${node})", "node")
FWD = f"layer = 'forwarder' AND forwarding_node != '' AND {NODE_F}"


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
    b.panel(
        "timeseries",
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
        ("time", "forwarding_node", "mean", "p99"),
        unit="s",
        description="Time a request waited in the daemon's class queue before a worker took it "
        "(p99: ranges within the last 7 days, which the per-second rollup keeps).",
        defaults=per_series("forwarding_node", "${__field.labels.forwarding_node} ${__field.name}"),
    )
    b.panel(
        "timeseries",
        "Service time",
        f"""
SELECT $__timeInterval(t) AS time, forwarding_node,
       sum(service_ns) / greatest(sum(ops), 1) / 1e9 AS mean, quantilesBFloat16Merge(0.5, 0.99)(service_quantiles)[2] / 1e9 AS p99
FROM {rollup("forwarding_node, ops, service_ns, service_quantiles", FWD)}
GROUP BY time, forwarding_node
ORDER BY time
""",
        ("time", "forwarding_node", "mean", "p99"),
        unit="s",
        description="Time per request inside the daemon, data and metadata (mean: a merged record's time "
        "divided by its requests; p99: of the records' times).",
        defaults=per_series("forwarding_node", "${__field.labels.forwarding_node} ${__field.name}"),
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


def service_per_mib(b: Board, title: str, by: str, where: str, description: str) -> None:
    """Busy time of the targets per MiB moved (TargetMetrics.service_ns_sum / bytes), per ``by``."""
    b.panel(
        "timeseries",
        title,
        f"""
SELECT $__timeInterval(time) AS time, {by},
       if(sum(bytes_read + bytes_written) = 0, NULL,
          sum(service_ns_sum) / 1e9 / (sum(bytes_read + bytes_written) / 1048576)) AS per_mib
FROM target_metrics FINAL
WHERE $__timeFilter(time) AND {where}
GROUP BY time, {by}
ORDER BY time
""",
        ("time", by, "per_mib"),
        unit="s",
        description=description,
        defaults=per_series(by),
    )


def failslow_table_sql(kind: str, extra: str) -> str:
    return f"""
SELECT node, argMax(active, detected) AS active, argMax(persistence, detected) AS persistence,
       argMax(severity, detected) AS severity, argMax(ratio, detected) AS ratio, min(onset) AS onset,
       max(detected) AS last_detected
FROM anomalies
WHERE kind = '{kind}' AND $__timeFilter(detected) AND {extra}
GROUP BY node
ORDER BY active DESC, ratio DESC
"""


# ---------------------------------------------------------------- storage targets

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


# ---------------------------------------------------------------- anomalies and control actions


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
    b.panel(
        "timeseries",
        "Anomalies over time",
        f"""
SELECT $__timeInterval(detected) AS time, kind, uniqExact(key) AS anomalies
FROM anomalies
WHERE $__timeFilter(detected) AND {kind_f}
GROUP BY time, kind
ORDER BY time
""",
        ("time", "kind", "anomalies"),
        unit="short",
        defaults=per_series("kind"),
    )
    b.panel(
        "timeseries",
        "Control actions over time",
        f"""
SELECT $__timeInterval(time) AS time, concat(kind, ' ', status) AS series, count() AS actions
FROM control_actions
WHERE $__timeFilter(time) AND {action_f}
GROUP BY time, series
ORDER BY time
""",
        ("time", "series", "actions"),
        unit="short",
        defaults=per_series("series"),
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


BOARDS = (overview, job, forwarders, targets, anomalies)
