"""Evidence of the insights: the job's Darshan counters and its traced requests.

Two sources, named in each insight's ``source`` (see :mod:`pharos_analytics.insights`):
``counters`` (``darshan_counters``, complete for the whole run) and ``trace``
(``io_requests``, client layer). Aggregation runs in ClickHouse (one pass per query over the
job's rows); the rules get the few aggregate rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from pharos_core.store import Store

from ..diagnosis_config import DiagnosisConfig
from ..pattern import is_system_path
from ..phases import JobPhases, _params, job_phases
from ..phases_sql import PHASED

# ======================================================================================
# Evidence: counters


#: Every counter record of a job (one row per module, record, rank, log) with its counters.
COUNTER_RECORDS_SQL = """
SELECT module, record_id, rank, log_id, any(path) AS path,
       groupArray(counter) AS names, groupArray(value) AS values
FROM darshan_counters
WHERE job_id = {job_id:String} AND module IN ('POSIX', 'MPI-IO', 'STDIO', 'LUSTRE')
GROUP BY module, record_id, rank, log_id
"""
LOG_RANKS_SQL = "SELECT log_id, nprocs, rank_offset FROM darshan_logs FINAL WHERE job_id = {job_id:String}"

SMALL_BINS = ("0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M")


@dataclass
class _Rec:
    module: str
    record_id: int
    rank: int
    log_id: str
    path: str
    c: dict[str, float]

    def g(self, name: str) -> float:
        return self.c.get(name, 0.0)


class Counters:
    """The job's Darshan records, grouped for the rules (data files only for POSIX)."""

    def __init__(self, store: Store, job_id: str):
        rows = store.query(COUNTER_RECORDS_SQL, {"job_id": job_id})
        self.logs = {
            r["log_id"]: (int(r["nprocs"]), int(r["rank_offset"]))
            for r in store.query(LOG_RANKS_SQL, {"job_id": job_id})
        }
        self.recs = [
            _Rec(
                r["module"],
                int(r["record_id"]),
                int(r["rank"]),
                r["log_id"],
                r["path"],
                dict(zip(r["names"], (float(v) for v in r["values"]), strict=True)),
            )
            for r in rows
        ]
        self.posix = [r for r in self.recs if r.module == "POSIX" and not is_system_path(r.path)]
        self.stdio = [r for r in self.recs if r.module == "STDIO" and not is_system_path(r.path)]
        self.mpiio = [r for r in self.recs if r.module == "MPI-IO"]
        self.lustre: dict[int, _Rec] = {}
        for r in self.recs:
            if r.module == "LUSTRE":
                self.lustre[r.record_id] = r

    @property
    def present(self) -> bool:
        return bool(self.recs)

    def nprocs(self, rec: _Rec) -> int:
        return max(self.logs.get(rec.log_id, (1, 0))[0], 1)

    def ranks_of(self, rec: _Rec) -> set[int]:
        if rec.rank >= 0:
            return {rec.rank}
        n, off = self.logs.get(rec.log_id, (1, 0))
        return set(range(off, off + max(n, 1)))

    def name(self, rec: _Rec) -> str:
        return rec.path or f"record {rec.record_id}"


# ======================================================================================
# Evidence: trace


#: Job-level sums of the traced data requests, overall and on shared files.
TRACE_FILES_SQL = (
    PHASED
    + """
SELECT
    count()                                                     AS n_files,
    sum(f_reads)                                                  AS reads,
    sum(f_writes)                                                 AS writes,
    sum(f_small_reads)                                            AS small_reads,
    sum(f_small_writes)                                           AS small_writes,
    sumIf(f_small_reads, f_nranks > 1)                              AS shared_small_reads,
    sumIf(f_small_writes, f_nranks > 1)                             AS shared_small_writes,
    sum(f_small_read_bytes)                                       AS small_read_bytes,
    sum(f_small_write_bytes)                                      AS small_write_bytes,
    sum(f_small_read_ns)                                          AS small_read_ns,
    sum(f_small_write_ns)                                         AS small_write_ns,
    sumIf(f_small_read_bytes, f_nranks > 1)                         AS shared_small_read_bytes,
    sumIf(f_small_write_bytes, f_nranks > 1)                        AS shared_small_write_bytes,
    sumIf(f_small_read_ns, f_nranks > 1)                            AS shared_small_read_ns,
    sumIf(f_small_write_ns, f_nranks > 1)                           AS shared_small_write_ns,
    sumIf(f_reads, f_nranks > 1)                                    AS shared_reads,
    sumIf(f_writes, f_nranks > 1)                                   AS shared_writes,
    sum(f_seq_reads)                                              AS seq_reads,
    sum(f_seq_writes)                                             AS seq_writes,
    sum(f_misaligned)                                             AS misaligned,
    sum(greatest(toInt64(f_bytes_read) - toInt64(f_read_extent), 0)) AS redundant_bytes,
    argMax(file, toInt64(f_bytes_read) - toInt64(f_read_extent))    AS redundant_top_file,
    countIf(f_bytes_read + f_bytes_written < {small_file:UInt64})   AS small_files,
    countIf(f_nranks > 1)                                         AS shared_files,
    sumIf(f_straggler, f_nranks > 1)                                AS straggler_files,
    argMax(file, if(f_nranks > 1, f_imbalance, -1.0))               AS worst_shared_file,
    max(if(f_nranks > 1, f_imbalance, 0.0))                         AS worst_shared_imbalance
FROM
(
    SELECT
        file,
        count(DISTINCT rank)                                                AS f_nranks,
        sum(r_reads)                                                        AS f_reads,
        sum(r_writes)                                                       AS f_writes,
        sum(r_small_reads)                                                  AS f_small_reads,
        sum(r_small_writes)                                                 AS f_small_writes,
        sum(r_small_read_bytes)                                             AS f_small_read_bytes,
        sum(r_small_write_bytes)                                            AS f_small_write_bytes,
        sum(r_small_read_ns)                                                AS f_small_read_ns,
        sum(r_small_write_ns)                                               AS f_small_write_ns,
        sum(r_seq_reads)                                                    AS f_seq_reads,
        sum(r_seq_writes)                                                   AS f_seq_writes,
        sum(r_misaligned)                                                   AS f_misaligned,
        sum(r_bytes_read)                                                   AS f_bytes_read,
        sum(r_bytes_written)                                                AS f_bytes_written,
        maxIf(r_read_end, r_reads > 0) - minIf(r_read_start, r_reads > 0)   AS f_read_extent,
        (max(r_bytes) - min(r_bytes)) / greatest(sum(r_bytes), 1)           AS f_imbalance,
        f_imbalance > {stragglers:Float64}                                    AS f_straggler
    FROM
    (
        SELECT
            file, rank,
            sumIf(count, is_read)                                           AS r_reads,
            sumIf(count, NOT is_read)                                       AS r_writes,
            sumIf(count, is_read AND size < {small:UInt64})                 AS r_small_reads,
            sumIf(count, NOT is_read AND size < {small:UInt64})             AS r_small_writes,
            sumIf(bytes, is_read AND size < {small:UInt64})                 AS r_small_read_bytes,
            sumIf(bytes, NOT is_read AND size < {small:UInt64})             AS r_small_write_bytes,
            sumIf(duration_ns, is_read AND size < {small:UInt64})           AS r_small_read_ns,
            sumIf(duration_ns, NOT is_read AND size < {small:UInt64})       AS r_small_write_ns,
            sumIf(count - 1 + (toInt64(offset) >= prev_end), is_read)       AS r_seq_reads,
            sumIf(count - 1 + (toInt64(offset) >= prev_end), NOT is_read)   AS r_seq_writes,
            sum(if(offset % {align:UInt64} != 0, count, if(size % {align:UInt64} != 0, count - 1, 0))) AS r_misaligned,
            sumIf(bytes, is_read)                                           AS r_bytes_read,
            sumIf(bytes, NOT is_read)                                       AS r_bytes_written,
            sum(bytes)                                                      AS r_bytes,
            maxIf(offset + bytes, is_read)                                  AS r_read_end,
            minIf(offset, is_read)                                          AS r_read_start
        FROM phased
        WHERE is_data
        GROUP BY file, rank
    )
    GROUP BY file
)
"""
)

#: Per-rank bytes, data time and metadata time / ops of the traced job.
TRACE_RANKS_SQL = (
    PHASED
    + """
SELECT
    rank,
    sumIf(bytes, is_data)                                       AS bytes,
    sumIf(duration_ns, is_data)                                 AS data_ns,
    sumIf(duration_ns, NOT is_data)                             AS meta_ns,
    sumIf(count, op IN ('fsync', 'fdatasync'))                  AS fsyncs,
    sumIf(count, is_data AND NOT is_read)                       AS writes
FROM phased
GROUP BY rank
"""
)

#: Files of the job whose storage-layer requests went to one target only, with their ranks.
TRACE_TARGETS_SQL = """
SELECT path,
       uniqExactIf(rank, layer = 'client')      AS n_ranks,
       uniqExactIf(target, target != '')        AS n_targets,
       anyIf(target, target != '')              AS one_target
FROM io_requests
WHERE job_id = {job_id:String} AND path != '' AND NOT match(path, {system_re:String})
GROUP BY path
HAVING n_targets = 1 AND n_ranks >= {min_ranks:UInt32}
ORDER BY n_ranks DESC
LIMIT 20
"""

#: Data records of files that were both read and written, in time order (bounded).
TRACE_RAW_SQL = (
    PHASED
    + """
SELECT file, is_read, offset, bytes
FROM phased
WHERE is_data AND bytes > 0 AND file IN (
    SELECT file FROM phased WHERE is_data GROUP BY file HAVING countIf(is_read) > 0 AND countIf(NOT is_read) > 0)
ORDER BY s, e
LIMIT {limit:UInt64}
"""
)


class Trace:
    def __init__(self, store: Store, job_id: str, cfg: DiagnosisConfig):
        self.store, self.job_id, self.cfg = store, job_id, cfg
        self.p = {
            **_params(store, job_id, "client", cfg),
            "gap_ns": 1 << 62,
            "small_file": cfg.small_file_bytes,
            "stragglers": cfg.imbalance_stragglers,
        }
        rows = store.query(TRACE_FILES_SQL, self.p)
        self.files = rows[0] if rows and int(rows[0]["n_files"]) > 0 else None
        self.ranks = store.query(TRACE_RANKS_SQL, self.p)
        self._phases: JobPhases | None = None

    def phases(self) -> JobPhases:
        """The job's client-layer phases, computed once per diagnosis (each is a window query
        over all of the job's requests)."""
        if self._phases is None:
            self._phases = job_phases(self.store, self.job_id, "client", self.cfg)
        return self._phases

    @property
    def present(self) -> bool:
        return self.files is not None or bool(self.ranks)

    def f(self, key: str) -> float:
        return float(self.files[key] or 0) if self.files else 0.0
