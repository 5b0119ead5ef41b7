"""What the ClickHouse dashboards share: the op lists and data rules of the job summary, the
filters of the multi-select variables, the rollup source of the system-wide panels, the anomaly
and control-action annotations, the links, and the panels the forwarding-node and storage-target
boards both have. Every query is raw ClickHouse SQL on the tables of
core/pharos_core/migrations with the plugin's macros (docs/dashboards.md); op lists and
the system-path rule come from pharos_analytics, so the dashboards count what the job summary
counts."""

from __future__ import annotations

from pharos_analytics.pattern import SYSTEM_PATH_REGEX
from pharos_analytics.summary_sql import DATA_OPS, META_OPS, READ_OPS, WRITE_OPS, sql_list

from ..grafana import PLUGIN, Board, series_name

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


#: The evidence of a forwarding node named by its waits (a stall, whose service ratio stays ~1):
#: the shortest look-back window (seconds, as the evidence's keys) whose evidence has
#: ``model_slow`` and a ``stall_added_ms``; '' for any other anomaly. The SQL form of
#: pharos_analytics.failslow.stall_added_ms, on the condition's latest evidence.
STALL_EVIDENCE_SQL = """arrayFirst(e -> JSONExtractBool(e, 'model_slow') AND JSONExtractRaw(e, 'stall_added_ms') NOT IN ('', 'null'),
             arrayMap(w -> w.2, arraySort(w -> toFloat64OrNull(w.1),
               arrayFilter(w -> isNotNull(toFloat64OrNull(w.1)), JSONExtractKeysAndValuesRaw(argMax(evidence, detected))))))"""


def anomaly_annotation_sql(where: str = "") -> str:
    """One annotation per anomaly condition (``key``): its time span over every detection cycle
    that stored it, columns time, timeEnd, title, tags, text. The text leads with how slow: a
    stall's added wait ("stall +N ms wait", as ``pharos anomalies`` prints it), else the ratio to
    the peers ("xR")."""
    return f"""
SELECT
  min(coalesce(start, onset, detected)) AS time,
  max(coalesce(end, detected)) AS timeEnd,
  concat(any(kind), ' ', any(node), if(any(job_id) = '', '', concat(' (job ', any(job_id), ')'))) AS title,
  concat(any(kind), ',', argMax(severity, detected), ',', any(node_type)) AS tags,
  concat(if({STALL_EVIDENCE_SQL} AS stall = '', concat('x', toString(round(max(ratio), 2))),
            concat('stall +', toString(round(JSONExtractFloat(stall, 'stall_added_ms'))), ' ms wait')),
         if(any(culprit_job) = '', '', concat(', culprit job ', any(culprit_job))),
         if(argMax(persistence, detected) = '', '', concat(', ', argMax(persistence, detected))),
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
    from ..grafana import annotation

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
