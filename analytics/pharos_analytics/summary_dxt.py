"""A Darshan job's DXT trace beside its module counters (:mod:`pharos_analytics.summary`).

A Darshan log's DXT segments (``io_requests`` rows of producer ``darshan:<sha16>``, see
:mod:`pharos_pipeline.darshan_import`) are the per-request detail of the job, but DXT never
traces STDIO, DFS or DAOS and stops at its trace memory limit (the log then marks DXT_POSIX /
DXT_MPIIO as partial). :func:`job_dxt` says how much of the job's I/O the DXT rows hold
(:class:`~pharos_analytics.summary_types.DxtCoverage`), when they start and end, and whether the
job also has rows traced by Pharos (its own agents) on the client layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from pharos_core.store import Store

from .summary_sql import DARSHAN_MODULES_RULE, DATA_OPS, sql_list
from .summary_types import DxtCoverage

#: DXT modules (darshan_logs.modules / partial_modules names).
DXT_MODULES: tuple[str, ...] = ("DXT_POSIX", "DXT_MPIIO")
#: The counters of the modules DXT traces (summed under :data:`DARSHAN_MODULES_RULE`).
DXT_COUNTERS: tuple[str, ...] = ("POSIX_BYTES_READ", "POSIX_BYTES_WRITTEN", "MPIIO_BYTES_READ", "MPIIO_BYTES_WRITTEN")

#: Number of completely imported Darshan logs of one job.
JOB_DARSHAN_LOGS_SQL = "SELECT count() AS n FROM darshan_logs FINAL WHERE job_id = {job_id:String}"

#: One row about one job's DXT: logs with a DXT module (``dxt_logs``), the DXT modules marked
#: partial (``partial_modules``), the counter bytes DXT could trace (``counter_bytes``), the DXT
#: rows' bytes, count and time window (``dxt_bytes``, ``dxt_records``, ``first_ns``, ``last_ns``)
#: and the job's client-layer data rows of other producers (``traced_records``).
JOB_DXT_SQL = f"""
WITH logs AS
(
    SELECT log_id, has(modules, 'POSIX') AS has_posix, has(modules, 'DFS') AS has_dfs,
           hasAny(modules, [{", ".join(f"'{m}'" for m in DXT_MODULES)}]) AS has_dxt,
           arrayFilter(m -> m IN {sql_list(DXT_MODULES)}, partial_modules) AS dxt_partial
    FROM darshan_logs FINAL
    WHERE job_id = {{job_id:String}}
)
SELECT
    (SELECT countIf(has_dxt) FROM logs)                                     AS dxt_logs,
    (SELECT arraySort(groupUniqArrayArray(dxt_partial)) FROM logs)          AS partial_modules,
    (
        SELECT sum(c.value)
        FROM darshan_counters AS c
        INNER JOIN logs AS l ON c.log_id = l.log_id
        WHERE c.job_id = {{job_id:String}} AND c.counter IN {sql_list(DXT_COUNTERS)}
          AND {DARSHAN_MODULES_RULE}
    )                                                                       AS counter_bytes,
    d.dxt_bytes, d.dxt_records, d.first_ns, d.last_ns, d.traced_records
FROM
(
    SELECT
        sumIf(bytes, dxt)                                   AS dxt_bytes,
        countIf(dxt)                                        AS dxt_records,
        toUnixTimestamp64Nano(minIf(start, dxt))            AS first_ns,
        toUnixTimestamp64Nano(maxIf(end, dxt))              AS last_ns,
        countIf(NOT dxt)                                    AS traced_records
    FROM
    (
        SELECT bytes, start, end, producer_id IN (SELECT log_id FROM logs) AS dxt
        FROM io_requests
        WHERE job_id = {{job_id:String}} AND layer = 'client' AND file_type = 'regular'
          AND op IN {sql_list(DATA_OPS)}
    )
) AS d
"""


class JobDxt(NamedTuple):
    """What :func:`job_dxt` found (times in ns since the epoch)."""

    #: None when no log of the job has a DXT module and no DXT row is stored.
    coverage: DxtCoverage | None
    #: The job's client-layer data-op rows that are not from its Darshan logs (Pharos traces).
    traced_records: int
    #: The DXT rows' earliest start and latest end; None without DXT rows.
    first_ns: int | None
    last_ns: int | None


def job_dxt(store: Store, job_id: str) -> JobDxt | None:
    """The DXT coverage of ``job_id``'s Darshan logs (see :class:`JobDxt`,
    :class:`~pharos_analytics.summary_types.DxtCoverage`); ``None`` when the job has no
    completely imported Darshan log. Two queries (one when there is no log).

    Raises:
        pharos_core.store.StoreError: the store failed.
    """
    if not int(store.query(JOB_DARSHAN_LOGS_SQL, {"job_id": job_id})[0]["n"]):
        return None
    r = store.query(JOB_DXT_SQL, {"job_id": job_id})[0]
    dxt_bytes, records = int(r["dxt_bytes"] or 0), int(r["dxt_records"] or 0)
    counter_bytes = int(r["counter_bytes"] or 0)
    partial_modules = [str(m) for m in r["partial_modules"]]
    coverage = None
    if int(r["dxt_logs"]) or records:
        share = min(1.0, dxt_bytes / counter_bytes) if counter_bytes else 1.0
        coverage = DxtCoverage(
            bytes=dxt_bytes,
            counter_bytes=counter_bytes,
            share=share,
            partial=dxt_bytes < counter_bytes or bool(partial_modules),
            records=records,
            partial_modules=partial_modules,
        )
    return JobDxt(
        coverage=coverage,
        traced_records=int(r["traced_records"] or 0),
        first_ns=(int(r["first_ns"]) or None) if records else None,
        last_ns=(int(r["last_ns"]) or None) if records else None,
    )


def dxt_text(d: Mapping[str, Any]) -> str:
    """One line about a DXT coverage, from its fields as a mapping (the API's JSON, or
    ``dataclasses.asdict`` of a :class:`~pharos_analytics.summary_types.DxtCoverage`), e.g.
    ``DXT covers 6.5% of the bytes (65,536 of 1,000,000 B; partial: DXT_POSIX out of trace
    memory)``. The share is rounded down to 0.1% so that a partial DXT never reads 100%."""
    pct = f"{math.floor(float(d['share']) * 1000) / 10:g}%"
    detail = f"{int(d['bytes']):,} of {int(d['counter_bytes']):,} B"
    if d.get("partial_modules"):
        detail += f"; partial: {', '.join(d['partial_modules'])} out of trace memory"
    elif d["partial"]:
        detail += "; partial"
    return f"DXT covers {pct} of the bytes ({detail})"
