"""The system overview dashboard: bandwidth, IOPS and metadata operations by layer, active
jobs, top jobs (from the rollups)."""

from __future__ import annotations

from ..grafana import Board, custom_variable, job_link, query_variable, unit_override
from .common import LAYER_F, META, RATE_S, annotations, board, per_series, rollup


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
