"""Insights: a catalogue of rules that say, with numbers, what slowed a job's I/O.

In the spirit of Drishti (Bez et al., PDSW'22; hpc-io/drishti-io): every rule has an id,
a severity (``high``, ``warn``, ``info``), the evidence (numbers) and recommendations.
Thresholds come from ONE config, :class:`pharos_analytics.diagnosis_config.DiagnosisConfig`
(defaults and their sources documented there; each rule's docstring names its source and
its threshold's unit).

Two sources of evidence, named in each insight's ``source``:

* ``counters``: the job's imported Darshan counters (``darshan_counters``); complete for
  the whole run even when DXT traces overflowed, so rules that both sources can answer
  use the counters when a job has them.
* ``trace``: the job's requests in ``io_requests`` (the eBPF agent, or DXT segments),
  client layer; used for jobs without counters, and for what counters cannot tell
  (reads after writes of the same bytes, sustained metadata rate, storage targets).

Aggregation runs in ClickHouse (one pass per query over the job's rows); Python applies
the rules to the few aggregate rows, and runs the one sequential analysis
(read-after-write) over at most ``scan_max_records`` records.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pharos_pipeline.store import Store

from .diagnosis_config import DiagnosisConfig
from .pattern import SYSTEM_PATH_REGEX, is_system_path
from .phases import _PHASED, JobPhases, _params, job_phases

Severity = Literal["high", "warn", "info"]
SEVERITY_ORDER = {"high": 0, "warn": 1, "info": 2}


@dataclass(frozen=True)
class Insight:
    """One finding. ``evidence`` holds the numbers (bytes, counts, seconds, shares 0-1)."""

    id: str
    title: str
    severity: Severity
    source: Literal["trace", "counters"]
    message: str
    evidence: dict[str, Any]
    recommendations: list[str]
    rule_source: str


@dataclass(frozen=True)
class JobInsights:
    job_id: str
    insights: list[Insight]
    phases: JobPhases
    notes: list[str] = field(default_factory=list)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


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

_SMALL_BINS = ("0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M")


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


class _Counters:
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
    _PHASED
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
    _PHASED
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
    _PHASED
    + """
SELECT file, is_read, offset, bytes
FROM phased
WHERE is_data AND bytes > 0 AND file IN (
    SELECT file FROM phased WHERE is_data GROUP BY file HAVING countIf(is_read) > 0 AND countIf(NOT is_read) > 0)
ORDER BY s, e
LIMIT {limit:UInt64}
"""
)


class _Trace:
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


# ======================================================================================
# Rules. Each takes (counters, trace, cfg, phases) and returns its insights.

Rule = Callable[["_Counters", "_Trace", DiagnosisConfig, JobPhases], list[Insight]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def _small_insight(
    direction: str,
    n_small: float,
    n_all: float,
    source: str,
    cfg: DiagnosisConfig,
    shared: bool = False,
    mpiio: bool = False,
    exact: tuple[float, float] | None = None,
) -> Insight | None:
    """``exact``: (bytes, seconds) the small requests moved and took, when the trace knows them
    (then :func:`weigh` uses them instead of a pro-rata share of the direction's bytes and time)."""
    if n_all <= 0 or n_small / n_all <= cfg.small_requests_ratio:
        return None
    high = n_small > cfg.small_requests_absolute
    where = " to shared files" if shared else ""
    recs = [f"Buffer {direction}s into larger, contiguous requests (at least {_mib(cfg.small_request_bytes)})."]
    if shared:
        recs.append(
            "Use collective MPI-IO (MPI_File_{}_all) so aggregators issue large requests to the shared file.".format(
                "read" if direction == "read" else "write"
            )
        )
    elif mpiio:
        recs.append("The job already uses MPI-IO: collective calls (MPI_File_*_all) aggregate small requests.")
    else:
        recs.append("Consider an I/O library with collective buffering (MPI-IO, HDF5 or PnetCDF on MPI-IO).")
    msg = (
        f"{int(n_small)} of {int(n_all)} {direction} requests{where} ({_pct(n_small / n_all)}) are under "
        f"{_mib(cfg.small_request_bytes)}"
    )
    if not high:
        msg += f"; only {int(n_small)} of them (high severity above {cfg.small_requests_absolute}), so they cost little"
    return Insight(
        id=f"small_{direction}s" + ("_shared" if shared else ""),
        title=f"Small {direction}s" + (" to shared files" if shared else ""),
        severity="high" if high else "info",
        source=source,  # type: ignore[arg-type]
        message=msg,
        evidence={
            "small_requests": int(n_small),
            "requests": int(n_all),
            "share": n_small / n_all,
            "small_bytes": cfg.small_request_bytes,
            "absolute_threshold": cfg.small_requests_absolute,
        }
        | ({"small_requests_bytes": exact[0], "small_requests_time_s": exact[1]} if exact else {}),
        recommendations=recs,
        rule_source="Drishti P05/P06 (P15/P16 for shared files): small_requests, small_requests_absolute",
    )


@rule
def small_requests(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Small reads / small writes. Source: Drishti P05 (reads) / P06 (writes).

    Fires when more than ``small_requests_ratio`` (share 0-1, default 0.1) of a direction's
    requests are under ``small_request_bytes`` (bytes, default 1 MiB); severity ``high``
    when there are more than ``small_requests_absolute`` (requests, default 1000) of them,
    ``info`` below (a few tiny requests cost little). Counters: POSIX_SIZE_{READ,WRITE}_*
    bins under 1 MiB over POSIX_READS / POSIX_WRITES; trace: request sizes.
    """
    out = []
    if c.present and c.posix:
        for d, D in (("read", "READ"), ("write", "WRITE")):
            small = sum(r.g(f"POSIX_SIZE_{D}_{b}") for r in c.posix for b in _SMALL_BINS)
            total = sum(r.g(f"POSIX_{D}S") for r in c.posix)
            if i := _small_insight(d, small, total, "counters", cfg, mpiio=bool(c.mpiio)):
                out.append(i)
    elif t.files:
        for d in ("read", "write"):
            exact = (t.f(f"small_{d}_bytes"), t.f(f"small_{d}_ns") / 1e9)
            if i := _small_insight(d, t.f(f"small_{d}s"), t.f(f"{d}s"), "trace", cfg, exact=exact):
                out.append(i)
    return out


@rule
def small_shared(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Small requests to shared files. Source: Drishti P15 (reads) / P16 (writes).

    Same thresholds as :func:`small_requests`: ``small_requests_ratio`` (share 0-1, default
    0.1), ``small_requests_absolute`` (requests, default 1000), ``small_request_bytes``
    (bytes, default 1 MiB), over the
    requests to files accessed by more than one rank (counters: shared records, rank -1).
    """
    out = []
    if c.present and c.posix:
        shared = [r for r in c.posix if r.rank < 0]
        for d, D in (("read", "READ"), ("write", "WRITE")):
            small = sum(r.g(f"POSIX_SIZE_{D}_{b}") for r in shared for b in _SMALL_BINS)
            total = sum(r.g(f"POSIX_{D}S") for r in shared)
            if i := _small_insight(d, small, total, "counters", cfg, shared=True):
                out.append(i)
    elif t.files:
        for d in ("read", "write"):
            exact = (t.f(f"shared_small_{d}_bytes"), t.f(f"shared_small_{d}_ns") / 1e9)
            n, n_all = t.f(f"shared_small_{d}s"), t.f(f"shared_{d}s")
            if i := _small_insight(d, n, n_all, "trace", cfg, shared=True, exact=exact):
                out.append(i)
    return out


@rule
def misaligned(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Misaligned file accesses and memory buffers. Source: Drishti P08 (file) / P07 (memory).

    Fires when the share (0-1) of data requests at an offset that is not a multiple of the
    alignment exceeds ``misaligned_ratio`` (default 0.1). Counters: POSIX_FILE_NOT_ALIGNED
    against Darshan's POSIX_FILE_ALIGNMENT (bytes: file system block or stripe size) and
    POSIX_MEM_NOT_ALIGNED against POSIX_MEM_ALIGNMENT; trace: offset modulo
    ``alignment_bytes`` (bytes, default 4096).
    """
    out = []
    rec = [
        "Align requests to the file system's block/stripe size (e.g. H5Pset_alignment for HDF5, "
        "striping_unit / cb_buffer_size hints for MPI-IO)."
    ]
    if c.present and c.posix:
        ops = sum(r.g("POSIX_READS") + r.g("POSIX_WRITES") for r in c.posix)
        nf = sum(r.g("POSIX_FILE_NOT_ALIGNED") for r in c.posix)
        nm = sum(r.g("POSIX_MEM_NOT_ALIGNED") for r in c.posix)
        align = max((r.g("POSIX_FILE_ALIGNMENT") for r in c.posix), default=0)
        if ops and nf / ops > cfg.misaligned_ratio:
            out.append(
                Insight(
                    "misaligned_file",
                    "Misaligned file requests",
                    "high",
                    "counters",
                    f"{_pct(nf / ops)} of {int(ops)} requests are not aligned to the file alignment "
                    f"({int(align)} bytes)",
                    {"misaligned": int(nf), "requests": int(ops), "share": nf / ops, "alignment_bytes": int(align)},
                    rec,
                    "Drishti P08: misaligned_requests",
                )
            )
        if ops and nm / ops > cfg.misaligned_ratio:
            out.append(
                Insight(
                    "misaligned_memory",
                    "Misaligned memory buffers",
                    "warn",
                    "counters",
                    f"{_pct(nm / ops)} of {int(ops)} requests use memory buffers that are not aligned",
                    {
                        "misaligned": int(nm),
                        "requests": int(ops),
                        "share": nm / ops,
                        "alignment_bytes": int(max((r.g("POSIX_MEM_ALIGNMENT") for r in c.posix), default=0)),
                    },
                    ["Allocate I/O buffers aligned (posix_memalign) to the memory alignment."],
                    "Drishti P07: misaligned_requests",
                )
            )
    elif t.files:
        ops = t.f("reads") + t.f("writes")
        nf = t.f("misaligned")
        if ops and nf / ops > cfg.misaligned_ratio:
            out.append(
                Insight(
                    "misaligned_file",
                    "Misaligned file requests",
                    "high",
                    "trace",
                    f"{_pct(nf / ops)} of {int(ops)} requests start at an offset that is not a multiple "
                    f"of {cfg.alignment_bytes} bytes",
                    {
                        "misaligned": int(nf),
                        "requests": int(ops),
                        "share": nf / ops,
                        "alignment_bytes": cfg.alignment_bytes,
                    },
                    rec,
                    "Drishti P08: misaligned_requests",
                )
            )
    return out


@rule
def random_access(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Random reads / writes. Source: Drishti P11 (reads) / P13 (writes).

    Fires when the share (0-1) of non-sequential requests of a direction exceeds
    ``random_ratio`` (default 0.2) and their count exceeds ``random_absolute`` (requests,
    default 1000). Sequential = at or after the previous request's end, same rank and file
    (Darshan POSIX_SEQ_*).
    """
    out = []
    if c.present and c.posix:
        src = "counters"
        vals = {
            d: (sum(r.g(f"POSIX_{D}S") for r in c.posix), sum(r.g(f"POSIX_SEQ_{D}S") for r in c.posix))
            for d, D in (("read", "READ"), ("write", "WRITE"))
        }
    elif t.files:
        src = "trace"
        vals = {d: (t.f(f"{d}s"), t.f(f"seq_{d}s")) for d in ("read", "write")}
    else:
        return out
    for d, (n, seq) in vals.items():
        rnd = max(n - seq, 0)
        if n and rnd / n > cfg.random_ratio and rnd > cfg.random_absolute:
            out.append(
                Insight(
                    f"random_{d}s",
                    f"Random {d}s",
                    "high",
                    src,  # type: ignore[arg-type]
                    f"{int(rnd)} of {int(n)} {d} requests ({_pct(rnd / n)}) are not sequential",
                    {"random": int(rnd), "requests": int(n), "share": rnd / n},
                    [
                        f"Reorder {d}s by offset, or gather them (collective I/O, data sieving) into "
                        "sequential streams.",
                        "If the access is inherently random, a read-ahead/cache layer or a key-value "
                        "format may suit better.",
                    ],
                    "Drishti P11/P13: random_operations, random_operations_absolute",
                )
            )
    return out


@rule
def redundant_reads(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Redundant reads: the same bytes read more than once. Source: Drishti P09.

    Per file, the bytes read beyond the file's read extent (counters: POSIX_BYTES_READ -
    (POSIX_MAX_BYTE_READ + 1); trace: bytes read - (highest read end - lowest read offset))
    are certainly read twice; fires above ``redundant_min_bytes`` (bytes, default 1 MiB).
    """
    if c.present and c.posix:
        per = [
            (r.g("POSIX_BYTES_READ") - (r.g("POSIX_MAX_BYTE_READ") + 1), c.name(r))
            for r in c.posix
            if r.g("POSIX_BYTES_READ") > 0
        ]
        red = sum(max(x, 0) for x, _ in per)
        top = max(per, default=(0, ""))[1]
        src = "counters"
    elif t.files:
        red, top, src = t.f("redundant_bytes"), t.files["redundant_top_file"], "trace"
    else:
        return []
    if red <= cfg.redundant_min_bytes:
        return []
    return [
        Insight(
            "redundant_reads",
            "Redundant reads",
            "warn",
            src,  # type: ignore[arg-type]
            f"at least {_mib(red)} were read more than once (most in {top})",
            {"redundant_bytes": int(red), "top_file": top},
            [
                "Read the data once and keep it in memory, or share it between ranks (MPI broadcast) "
                "instead of every rank reading it."
            ],
            "Drishti P09 (redundant read traffic)",
        )
    ]


@rule
def stragglers(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Rank imbalance on shared files: stragglers of bytes and of time. Source: Drishti
    P18 (bytes) / P19 (time).

    Counters, per shared record (rank -1): (POSIX_SLOWEST_RANK_BYTES -
    POSIX_FASTEST_RANK_BYTES) / (POSIX_BYTES_READ + POSIX_BYTES_WRITTEN) and
    (POSIX_F_SLOWEST_RANK_TIME - POSIX_F_FASTEST_RANK_TIME) / (POSIX_F_READ_TIME +
    POSIX_F_WRITE_TIME + POSIX_F_META_TIME); trace: (most - fewest bytes of a rank) / bytes
    of the file. Fires above ``imbalance_stragglers`` (share 0-1, default 0.15). When the
    file's Darshan LUSTRE record shows ONE stripe (one OST), the insight says so: the ranks
    that aggregate I/O for that file queue on a single storage target.
    """
    out = []
    if c.present and c.posix:
        for kind in ("bytes", "time"):
            hits = []
            for r in c.posix:
                if r.rank >= 0:
                    continue
                if kind == "bytes":
                    total = r.g("POSIX_BYTES_READ") + r.g("POSIX_BYTES_WRITTEN")
                    diff = r.g("POSIX_SLOWEST_RANK_BYTES") - r.g("POSIX_FASTEST_RANK_BYTES")
                else:
                    total = r.g("POSIX_F_READ_TIME") + r.g("POSIX_F_WRITE_TIME") + r.g("POSIX_F_META_TIME")
                    diff = r.g("POSIX_F_SLOWEST_RANK_TIME") - r.g("POSIX_F_FASTEST_RANK_TIME")
                if total > 0 and abs(diff) / total > cfg.imbalance_stragglers:
                    hits.append((abs(diff) / total, r))
            if not hits:
                continue
            share, worst = max(hits, key=lambda h: h[0])
            lus = c.lustre.get(worst.record_id)
            stripes = int(lus.g("LUSTRE_STRIPE_COUNT")) if lus else None
            ev: dict[str, Any] = {
                "files": len(hits),
                "worst_file": c.name(worst),
                "imbalance": share,
                "slowest_rank": int(worst.g("POSIX_SLOWEST_RANK")),
                "fastest_rank": int(worst.g("POSIX_FASTEST_RANK")),
                "ranks": c.nprocs(worst),
            }
            if kind == "bytes":
                ev |= {
                    "slowest_rank_bytes": int(worst.g("POSIX_SLOWEST_RANK_BYTES")),
                    "fastest_rank_bytes": int(worst.g("POSIX_FASTEST_RANK_BYTES")),
                    "file_bytes": int(worst.g("POSIX_BYTES_READ") + worst.g("POSIX_BYTES_WRITTEN")),
                }
            else:
                ev |= {
                    "slowest_rank_time_s": worst.g("POSIX_F_SLOWEST_RANK_TIME"),
                    "fastest_rank_time_s": worst.g("POSIX_F_FASTEST_RANK_TIME"),
                }
            recs = [
                "Balance the data each rank moves; with collective MPI-IO, check which ranks are "
                "aggregators (cb_nodes) and spread them over nodes."
            ]
            if kind == "bytes":
                what = (
                    f"the slowest rank ({ev['slowest_rank']}) moved {_mib(ev['slowest_rank_bytes'])}, the "
                    f"fastest ({ev['fastest_rank']}) {_mib(ev['fastest_rank_bytes'])}"
                )
            else:
                what = (
                    f"the slowest rank ({ev['slowest_rank']}) spent {ev['slowest_rank_time_s']:.1f} s in I/O, "
                    f"the fastest ({ev['fastest_rank']}) {ev['fastest_rank_time_s']:.1f} s"
                )
            msg = (
                f"shared file {c.name(worst)}: {what}; the difference is {_pct(share)} of the file's "
                f"{'bytes' if kind == 'bytes' else 'I/O time'} ({len(hits)} shared file(s) above "
                f"{_pct(cfg.imbalance_stragglers)})"
            )
            if stripes is not None:
                ev["stripe_count"] = stripes
                if stripes == 1:
                    msg += "; the file is striped over ONE storage target (OST), so its aggregator(s) serialise on it"
                    recs.insert(
                        0,
                        "Stripe the shared file over many OSTs (lfs setstripe -c -1, or the MPI-IO "
                        "striping_factor hint): ROMIO sets one aggregator per stripe, so one stripe "
                        "means one rank does all the I/O.",
                    )
            out.append(
                Insight(
                    f"rank_imbalance_{kind}",
                    f"Rank imbalance of {kind} on shared files (stragglers)",
                    "high",
                    "counters",
                    msg,
                    ev,
                    recs,
                    f"Drishti {'P18' if kind == 'bytes' else 'P19'}: imbalance_stragglers",
                )
            )
    elif t.files and t.f("straggler_files") > 0:
        out.append(
            Insight(
                "rank_imbalance_bytes",
                "Rank imbalance of bytes on shared files (stragglers)",
                "high",
                "trace",
                f"{int(t.f('straggler_files'))} shared file(s) where one rank moved "
                f"{_pct(t.f('worst_shared_imbalance'))} more of the bytes than another "
                f"(worst: {t.files['worst_shared_file']})",
                {
                    "files": int(t.f("straggler_files")),
                    "worst_file": t.files["worst_shared_file"],
                    "imbalance": t.f("worst_shared_imbalance"),
                },
                ["Balance the data each rank moves to shared files."],
                "Drishti P18: imbalance_stragglers",
            )
        )
    return out


@rule
def rank_imbalance(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Imbalance of bytes and of I/O time across the job's ranks. Source: Drishti
    P21/P22 (per-rank size imbalance, imbalance_size), extended to time by Pharos.

    (max - min) / max over the ranks that did data I/O, of bytes and of data-op time,
    above ``imbalance_size`` (share 0-1, default 0.3), with at least
    ``imbalance_min_ranks`` ranks. Counters: non-shared records only (shared records are
    judged by :func:`stragglers`); trace: all data requests.
    """
    per: dict[int, list[float]] = {}
    if c.present and c.posix:
        src = "counters"
        for r in c.posix:
            if r.rank < 0:
                continue
            v = per.setdefault(r.rank, [0.0, 0.0])
            v[0] += r.g("POSIX_BYTES_READ") + r.g("POSIX_BYTES_WRITTEN")
            v[1] += r.g("POSIX_F_READ_TIME") + r.g("POSIX_F_WRITE_TIME")
    elif t.ranks:
        src = "trace"
        for r in t.ranks:
            if int(r["bytes"]) > 0:
                per[int(r["rank"])] = [float(r["bytes"]), int(r["data_ns"]) / 1e9]
    per = {k: v for k, v in per.items() if v[0] > 0}
    if len(per) < cfg.imbalance_min_ranks:
        return []
    out = []
    for i, kind, unit in ((0, "bytes", "bytes"), (1, "time", "s")):
        vals = {k: v[i] for k, v in per.items()}
        hi, lo = max(vals, key=vals.get), min(vals, key=vals.get)  # type: ignore[arg-type]
        if vals[hi] <= 0:
            continue
        imb = (vals[hi] - vals[lo]) / vals[hi]
        if imb > cfg.imbalance_size:
            out.append(
                Insight(
                    f"rank_imbalance_{kind}_per_rank",
                    f"Ranks move unequal {kind}",
                    "warn",
                    src,  # type: ignore[arg-type]
                    f"rank {hi} has {vals[hi]:.6g} {unit} of data I/O, rank {lo} {vals[lo]:.6g} {unit} "
                    f"({_pct(imb)} imbalance over {len(vals)} ranks)",
                    {
                        "max_rank": hi,
                        "max": vals[hi],
                        "min_rank": lo,
                        "min": vals[lo],
                        "imbalance": imb,
                        "ranks": len(vals),
                        "unit": unit,
                    },
                    [
                        "Distribute the data evenly over the ranks, or let fewer ranks (aggregators) "
                        "do the I/O on purpose."
                    ],
                    "Drishti P21/P22: imbalance_size",
                )
            )
    return out


@rule
def metadata_time(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Excessive metadata time. Source: Drishti P17 (metadata_time_rank).

    Fires when some rank spends more than ``metadata_time_rank_s`` (seconds, default 30)
    in metadata operations. Counters: POSIX_F_META_TIME per rank (a shared record's time,
    summed over its ranks, is spread evenly over them); trace: duration of open, close,
    stat, fsync, ... per rank.
    """
    per: dict[int, float] = {}
    if c.present and c.posix:
        src = "counters"
        for r in c.posix:
            ranks = c.ranks_of(r)
            share = r.g("POSIX_F_META_TIME") / len(ranks)
            for k in ranks:
                per[k] = per.get(k, 0.0) + share
    elif t.ranks:
        src = "trace"
        per = {int(r["rank"]): int(r["meta_ns"]) / 1e9 for r in t.ranks}
    slow = {k: v for k, v in per.items() if v > cfg.metadata_time_rank_s}
    if not slow:
        return []
    worst = max(slow, key=slow.get)  # type: ignore[arg-type]
    return [
        Insight(
            "metadata_time",
            "Excessive metadata time",
            "high",
            src,  # type: ignore[arg-type]
            f"{len(slow)} rank(s) spent more than {cfg.metadata_time_rank_s:g} s in metadata operations "
            f"(rank {worst}: {slow[worst]:.1f} s)",
            {"ranks": len(slow), "worst_rank": worst, "worst_s": slow[worst], "threshold_s": cfg.metadata_time_rank_s},
            [
                "Open files once and keep them open; avoid stat/open storms (let one rank open and "
                "broadcast); use fewer, larger files."
            ],
            "Drishti P17: metadata_time_rank",
        )
    ]


@rule
def metadata_rate(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Metadata-heavy I/O. Source: Beacon (NSDI'19): more than ``metadata_rate_ops_s``
    (operations per second, default 1,000) metadata operations, sustained for
    ``metadata_sustained_s`` (seconds, default 3; Pharos) consecutive seconds in the trace;
    from counters, the average rate over the run (opens, stats, fsyncs, renames / s)."""
    prof = ph.job
    if prof is None or not prof.metadata_heavy:
        return []
    src = "counters" if ph.source == "counters" else "trace"
    heavy = [p.index for p in ph.phases if p.profile.metadata_heavy]
    return [
        Insight(
            "metadata_heavy",
            "Metadata-heavy I/O",
            "warn",
            src,  # type: ignore[arg-type]
            f"{prof.metadata_ops} metadata operations, {prof.metadata_peak_ops_s:.0f} per second "
            f"({'peak' if src == 'trace' else 'average'}; threshold {cfg.metadata_rate_ops_s:g}/s)"
            + (f" sustained {prof.metadata_busy_s} s" if src == "trace" else "")
            + (f", in phase(s) {', '.join(map(str, heavy))}" if heavy else ""),
            {
                "metadata_ops": prof.metadata_ops,
                "rate_ops_s": prof.metadata_peak_ops_s,
                "busy_s": prof.metadata_busy_s,
                "phases": heavy,
                "threshold_ops_s": cfg.metadata_rate_ops_s,
            },
            [
                "Cut opens/stats: cache file handles, avoid per-step existence checks, aggregate small "
                "files into containers (HDF5, tar, record files)."
            ],
            "Beacon (NSDI'19) metadata rate",
        )
    ]


@rule
def many_small_files(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Many small files. Source: Pharos.

    Fires when at least ``many_files_absolute`` (files, default 1000) data files each
    moved fewer than ``small_file_bytes`` (bytes, default 1 MiB). Counters: POSIX and
    STDIO records summed per file; trace: data requests per file.
    """
    if c.present and (c.posix or c.stdio):
        per: dict[str, float] = {}
        for r in c.posix:
            per[c.name(r)] = per.get(c.name(r), 0.0) + r.g("POSIX_BYTES_READ") + r.g("POSIX_BYTES_WRITTEN")
        for r in c.stdio:
            per[c.name(r)] = per.get(c.name(r), 0.0) + r.g("STDIO_BYTES_READ") + r.g("STDIO_BYTES_WRITTEN")
        small = sum(1 for v in per.values() if 0 < v < cfg.small_file_bytes)
        files, src = len(per), "counters"
    elif t.files:
        small, files, src = int(t.f("small_files")), int(t.f("n_files")), "trace"
    else:
        return []
    if small < cfg.many_files_absolute:
        return []
    return [
        Insight(
            "many_small_files",
            "Many small files",
            "warn",
            src,  # type: ignore[arg-type]
            f"{small} of {files} files each moved less than {_mib(cfg.small_file_bytes)}",
            {"small_files": small, "files": files, "small_file_bytes": cfg.small_file_bytes},
            [
                "Pack small files into fewer large ones (HDF5/NetCDF containers, tar, record formats); "
                "each file costs metadata operations on the file system."
            ],
            "Pharos",
        )
    ]


@rule
def fsync_storm(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """fsync storms. Source: Pharos.

    Fires when fsync + fdatasync calls reach ``fsync_absolute`` (calls, default 100) and
    exceed ``fsync_per_write_ratio`` (calls per write request, default 0.1). Counters:
    POSIX_FSYNCS + POSIX_FDSYNCS over POSIX_WRITES; trace: fsync/fdatasync requests.
    """
    if c.present and c.posix:
        n = sum(r.g("POSIX_FSYNCS") + r.g("POSIX_FDSYNCS") for r in c.posix)
        w = sum(r.g("POSIX_WRITES") for r in c.posix)
        src = "counters"
    elif t.ranks:
        n = sum(float(r["fsyncs"]) for r in t.ranks)
        w = sum(float(r["writes"]) for r in t.ranks)
        src = "trace"
    else:
        return []
    if n < cfg.fsync_absolute or n <= cfg.fsync_per_write_ratio * w:
        return []
    return [
        Insight(
            "fsync_storm",
            "fsync storm",
            "warn",
            src,  # type: ignore[arg-type]
            f"{int(n)} fsync/fdatasync calls for {int(w)} writes ({n / max(w, 1):.2f} per write)",
            {"fsyncs": int(n), "writes": int(w), "per_write": n / max(w, 1)},
            [
                "Sync once at the end of a phase or checkpoint, not after every write; let the file "
                "system's write-back work."
            ],
            "Pharos",
        )
    ]


@rule
def single_target(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """A file striped on a single storage target while many ranks share it. Source: Pharos
    (the imbalanced_io case of the Darshan corpus; Lustre striping guidance).

    Fires for a data file with one stripe / one target used by at least
    ``shared_file_min_ranks`` (ranks, default 16) that moved at least ``small_file_bytes``
    (bytes, default 1 MiB; counters). Counters: LUSTRE_STRIPE_COUNT == 1 (or
    one OST) and the ranks of its POSIX/MPI-IO records (a shared record counts all ranks of
    its log); trace: storage-layer requests of the file that all went to one target.
    """
    hits: list[tuple[str, int, str, float]] = []
    src = "counters"
    if c.present and c.lustre:
        ranks: dict[int, set[int]] = {}
        moved: dict[int, float] = {}
        for r in c.posix + c.mpiio:
            ranks.setdefault(r.record_id, set()).update(c.ranks_of(r))
            moved[r.record_id] = (
                moved.get(r.record_id, 0.0)
                + r.g("POSIX_BYTES_READ")
                + r.g("POSIX_BYTES_WRITTEN")
                + r.g("MPIIO_BYTES_READ")
                + r.g("MPIIO_BYTES_WRITTEN")
            )
        for rid, lus in c.lustre.items():
            one = lus.g("LUSTRE_STRIPE_COUNT") == 1 or lus.g("LUSTRE_OSTS") == 1
            n = len(ranks.get(rid, ()))
            if (
                one
                and n >= cfg.shared_file_min_ranks
                and moved.get(rid, 0) >= cfg.small_file_bytes
                and not is_system_path(lus.path)
            ):
                hits.append((c.name(lus), n, "1 stripe", moved[rid]))
    if not hits and t.present:
        rows = t.store.query(
            TRACE_TARGETS_SQL,
            {"job_id": t.job_id, "system_re": SYSTEM_PATH_REGEX, "min_ranks": cfg.shared_file_min_ranks},
        )
        hits = [(r["path"], int(r["n_ranks"]), f"target {r['one_target']}", 0.0) for r in rows]
        src = "trace"
    if not hits:
        return []
    hits.sort(key=lambda h: (-h[1], -h[3]))
    path, n, what, _ = hits[0]
    return [
        Insight(
            "single_target_shared_file",
            "Shared file on a single storage target",
            "high",
            src,  # type: ignore[arg-type]
            f"{len(hits)} file(s) shared by {cfg.shared_file_min_ranks} or more ranks sit on one storage "
            f"target; {path} is used by {n} ranks ({what})",
            {
                "files": len(hits),
                "worst_file": path,
                "ranks": n,
                "layout": what,
                "min_ranks": cfg.shared_file_min_ranks,
                "bytes": int(sum(h[3] for h in hits)),
            },
            [
                "Stripe the file over many targets before writing it (lfs setstripe -c <n> or -1 on the "
                "directory; MPI-IO hints striping_factor / striping_unit)."
            ],
            "Pharos (Lustre striping; Darshan corpus imbalanced_io)",
        )
    ]


@rule
def straggler_resource(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """The resource the slow files (and their ranks) share. Source: TOKIO darshan_bad_ost
    (Pearson r of per-file log performance with each OST <= -``straggler_correlation``
    (dimensionless, default 0.5), p < ``straggler_p_value`` (default 0.05)) + Beacon §5.3 (median
    performance, B/s, <= 1/``straggler_min_ratio`` (default 2) of the peers'); at least
    ``straggler_min_files`` (files, default 2) of at least ``straggler_min_file_bytes`` (bytes,
    default 64 KiB) on the resource and on its peers; see :mod:`pharos_analytics.straggler`. Trace (live jobs): storage
    targets, forwarding nodes, compute nodes of the forwarder-layer requests; DXT (a Darshan
    log with files striped over several OSTs): each request on the OST of its stripe, one
    observation per (file, OST); counters: OSTs of the Darshan LUSTRE records. Weighed by the excess time of its files (time beyond what
    the peers' median performance needs) against the slowest rank's I/O time."""
    from .straggler import job_stragglers

    rep = job_stragglers(t.store, t.job_id, cfg)
    out = []
    for f in rep.findings:
        v = f.verdict
        kind = {"ost": "OST", "target": "storage target", "forwarding_node": "forwarding node"}.get(
            f.resource_type, f.resource_type.replace("_", " ")
        )
        files = ", ".join(f.files[:5]) + (f" +{len(f.files) - 5}" if len(f.files) > 5 else "")
        ranks = ", ".join(map(str, f.ranks[:16])) + (f" +{len(f.ranks) - 16}" if len(f.ranks) > 16 else "")
        out.append(
            Insight(
                "straggler_resource",
                f"Slow files share {kind} {f.resource}",
                "high",
                "counters" if f.source == "counters" else "trace",
                f"the {v.files} file(s) on {kind} {f.resource} ran at a median {_mib(v.median_perf_b_s)}/s, "
                f"{v.ratio:.1f}x slower than the {v.peer_files} file(s) on its peers ({_mib(v.peers_median_perf_b_s)}/s; "
                f"Pearson r {v.coefficient:.2f}, p {v.p_value:.2g}): files {files}; ranks {ranks}; "
                f"{f.excess_time_s:.2f} s more than at the peers' performance",
                {
                    **f.evidence(),
                    "median_perf_b_s": v.median_perf_b_s,
                    "peers_median_perf_b_s": v.peers_median_perf_b_s,
                    "peer_files": v.peer_files,
                    "ratio": v.ratio,
                    "coefficient": v.coefficient,
                    "p_value": v.p_value,
                },
                [
                    f"Report {kind} {f.resource} to the administrators (GET /v1/anomalies lists it as evidence "
                    "from this job); avoid it for new files (lfs setstripe -o / a placement pool without it) "
                    "until it is healthy again."
                ],
                "TOKIO darshan_bad_ost (per-file performance vs OST correlation) + Beacon NSDI'19 §5.3 ratio",
            )
        )
    return out


@rule
def stdio_heavy(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Heavy use of STDIO. Source: Drishti S01 (interface_stdio): STDIO bytes / (POSIX +
    STDIO bytes) above ``interface_stdio_ratio`` (share 0-1, default 0.1), and at least
    ``stdio_min_bytes`` (bytes, default 1 MiB; Pharos) through STDIO. Counters only."""
    if not c.present:
        return []
    sb = sum(r.g("STDIO_BYTES_READ") + r.g("STDIO_BYTES_WRITTEN") for r in c.stdio)
    pb = sum(r.g("POSIX_BYTES_READ") + r.g("POSIX_BYTES_WRITTEN") for r in c.posix)
    if sb < cfg.stdio_min_bytes or sb / (sb + pb) <= cfg.interface_stdio_ratio:
        return []
    return [
        Insight(
            "stdio_heavy",
            "STDIO carries much of the data",
            "warn",
            "counters",
            f"{_pct(sb / (sb + pb))} of the bytes ({_mib(sb)}) go through STDIO (fopen/fread/fwrite)",
            {"stdio_bytes": int(sb), "posix_bytes": int(pb), "share": sb / (sb + pb)},
            ["Use POSIX or MPI-IO for bulk data: STDIO buffers in small chunks."],
            "Drishti S01: interface_stdio",
        )
    ]


@rule
def read_after_write(c: _Counters, t: _Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Reads of bytes the job wrote earlier. Source: Pharos.

    Sequential scan, in time order, of the data records of files both read and written
    (at most ``scan_max_records`` records; the rest is not scanned and the insight says
    so): the written byte ranges of each file are kept as a union of intervals, and a read
    counts the bytes it overlaps. Fires above ``redundant_min_bytes`` (bytes, default
    1 MiB). Trace only (Darshan counters do not keep byte ranges).
    """
    if not t.files:
        return []
    rows = t.store.query(TRACE_RAW_SQL, {**t.p, "limit": cfg.scan_max_records + 1})
    truncated = len(rows) > cfg.scan_max_records
    rows = rows[: cfg.scan_max_records]
    written: dict[str, tuple[list[int], list[int]]] = {}
    raw = 0
    files: dict[str, int] = {}
    for r in rows:
        f, lo = r["file"], int(r["offset"])
        hi = lo + int(r["bytes"])
        starts, ends = written.setdefault(f, ([], []))
        if int(r["is_read"]):
            n = _overlap(starts, ends, lo, hi)
            raw += n
            if n:
                files[f] = files.get(f, 0) + n
        else:
            _add_interval(starts, ends, lo, hi)
    if raw <= cfg.redundant_min_bytes:
        return []
    top = max(files, key=files.get)  # type: ignore[arg-type]
    return [
        Insight(
            "read_after_write",
            "Reads of data written earlier",
            "info",
            "trace",
            f"{_mib(raw)} read back after the job wrote them ({len(files)} file(s), most in {top})"
            + (f"; only the first {cfg.scan_max_records} records were scanned" if truncated else ""),
            {"bytes": raw, "files": len(files), "top_file": top, "scanned_records": len(rows), "truncated": truncated},
            [
                "Keep data the job reads back in memory, or hand it between ranks by messages; if it is a "
                "checkpoint verification, consider checksums at write time."
            ],
            "Pharos",
        )
    ]


def _add_interval(starts: list[int], ends: list[int], lo: int, hi: int) -> None:
    """Add [lo, hi) to the sorted, disjoint intervals (starts[i], ends[i])."""
    if hi <= lo:
        return
    i = bisect.bisect_left(ends, lo)  # first interval ending at or after lo
    j = bisect.bisect_right(starts, hi)  # intervals [i, j) touch [lo, hi]
    if i < j:
        lo, hi = min(lo, starts[i]), max(hi, ends[j - 1])
    starts[i:j] = [lo]
    ends[i:j] = [hi]


def _overlap(starts: list[int], ends: list[int], lo: int, hi: int) -> int:
    """Bytes of [lo, hi) covered by the intervals."""
    n = 0
    i = bisect.bisect_right(ends, lo)
    while i < len(starts) and starts[i] < hi:
        n += max(0, min(hi, ends[i]) - max(lo, starts[i]))
        i += 1
    return n


# ======================================================================================
# Public API


# ======================================================================================
# Significance: every insight weighs the bytes and the time it concerns


@dataclass(frozen=True)
class _Totals:
    """The job's I/O to weigh insights against. Bytes in bytes, times in seconds; per
    direction (``read``/``write``): requests, bytes, data time summed over ranks."""

    bytes: float
    time_s: float  # data + metadata time summed over ranks
    crit_s: float  # the slowest rank's data + metadata time (the job's critical path in I/O)
    dirs: dict[str, tuple[float, float, float]]  # direction -> (requests, bytes, time_s)


def _totals(c: _Counters, t: _Trace) -> _Totals:
    """From the counters when the job has POSIX records (the rules use them then), else the trace.

    Counters: POSIX + STDIO bytes and F_{READ,WRITE,META}_TIME; a shared record's time counts
    once in the sum and as its POSIX_F_SLOWEST_RANK_TIME on the critical path, added to the
    slowest rank of the non-shared records (an upper bound). Trace: per-rank data and
    metadata time of the requests."""
    if c.present and c.posix:
        dirs: dict[str, list[float]] = {"read": [0.0, 0.0, 0.0], "write": [0.0, 0.0, 0.0]}
        meta = 0.0
        per_rank: dict[int, float] = {}
        shared_crit = 0.0
        for r in c.posix + c.stdio:
            m = r.module
            for d, D in (("read", "READ"), ("write", "WRITE")):
                dirs[d][0] += r.g(f"{m}_{D}S")
                dirs[d][1] += r.g(f"{m}_BYTES_{D if D == 'READ' else 'WRITTEN'}")
                dirs[d][2] += r.g(f"{m}_F_{D}_TIME")
            rt = r.g(f"{m}_F_READ_TIME") + r.g(f"{m}_F_WRITE_TIME") + r.g(f"{m}_F_META_TIME")
            meta += r.g(f"{m}_F_META_TIME")
            if r.rank >= 0:
                per_rank[r.rank] = per_rank.get(r.rank, 0.0) + rt
            else:
                shared_crit += r.g(f"{m}_F_SLOWEST_RANK_TIME") or rt / c.nprocs(r)
        total_t = meta + dirs["read"][2] + dirs["write"][2]
        return _Totals(
            bytes=dirs["read"][1] + dirs["write"][1],
            time_s=total_t,
            crit_s=max(per_rank.values(), default=0.0) + shared_crit,
            dirs={d: (v[0], v[1], v[2]) for d, v in dirs.items()},
        )
    per = [(int(r["data_ns"]) + int(r["meta_ns"])) / 1e9 for r in t.ranks]
    data_s = sum(int(r["data_ns"]) for r in t.ranks) / 1e9
    nr, nw = t.f("reads"), t.f("writes")
    br = bw = 0.0
    if t.files:
        prof = t.phases().job
        br, bw = (float(prof.bytes_read), float(prof.bytes_written)) if prof else (0.0, 0.0)
    n = max(nr + nw, 1.0)
    return _Totals(
        bytes=br + bw,
        time_s=sum(per),
        crit_s=max(per, default=0.0),
        dirs={"read": (nr, br, data_s * nr / n), "write": (nw, bw, data_s * nw / n)},
    )


def _concerns(i: Insight, tot: _Totals) -> tuple[float | None, float | None, float | None, str]:
    """(requests, bytes, time_s, time basis) an insight is about; ``None`` when the rule does not
    say. Small requests of a trace carry their exact bytes and time; otherwise (Darshan counters,
    random and misaligned requests) requests of a direction are weighed pro rata: n of the
    direction's N requests are taken to move n/N of its bytes and to take n/N of its time."""
    ev = i.evidence
    d = "read" if "read" in i.id else ("write" if "write" in i.id else None)
    if i.id.startswith(("small_", "random_", "misaligned_")):
        n = float(ev.get("small_requests", ev.get("random", ev.get("misaligned", 0))))
        if d is None:  # misaligned: all data requests
            N = sum(v[0] for v in tot.dirs.values())
            B = sum(v[1] for v in tot.dirs.values())
            T = sum(v[2] for v in tot.dirs.values())
        else:
            N, B, T = tot.dirs[d]
        if "small_requests_bytes" in ev:  # the trace's exact bytes and time of the small requests
            return n, float(ev["small_requests_bytes"]), float(ev["small_requests_time_s"]), "sum"
        f = min(n / N, 1.0) if N else 0.0
        return n, f * B, f * T, "sum"
    if i.id in ("rank_imbalance_bytes", "rank_imbalance_time"):
        if "slowest_rank_time_s" in ev:
            return None, None, float(ev["slowest_rank_time_s"]) - float(ev["fastest_rank_time_s"]), "critical"
        return None, float(ev.get("file_bytes", 0)) or None, None, "critical"
    if i.id == "metadata_time":
        return None, None, float(ev["worst_s"]), "critical"
    if i.id == "single_target_shared_file":
        return None, float(ev.get("bytes") or 0) or None, None, "sum"
    if i.id == "straggler_resource":  # the excess time, against the slowest rank's I/O time
        return None, None, float(ev.get("excess_time_s", 0)), "critical"
    return None, None, None, "sum"


def weigh(i: Insight, tot: _Totals, cfg: DiagnosisConfig) -> Insight:
    """The insight with its severity weighed by what it costs (Drishti thresholds, ONE rule for all).

    A rule's ``high`` stays high only when what it describes is at least
    ``significance_share`` (0-1, Drishti 0.1) of the job's bytes or of its I/O time (summed
    over ranks; for rank-time rules, the slowest rank's I/O time; a share that cannot be
    computed is not held against the insight) and, for rules about
    requests there are at least as many as the rule's absolute threshold (Drishti:
    ``small_requests_absolute`` for small requests, ``random_absolute`` for random ones,
    ``significance_min_requests`` for misaligned ones; 1000 each). Otherwise it becomes ``warn`` when one of the two holds, else
    ``info``. ``warn``/``info`` insights keep their severity. The numbers go to
    ``evidence["significance"]``: requests, bytes, time_s, bytes_share, time_share (0-1,
    ``None`` when not known), time_basis (``sum`` or ``critical``); rules that concern neither
    requests, bytes nor time (fsync storms, metadata rate, ...) are left as they are."""
    n, b, ts, basis = _concerns(i, tot)
    if n is None and b is None and ts is None:
        return i  # the rule's own threshold is its significance (warn/info rules, Pharos rules)
    T = tot.crit_s if basis == "critical" else tot.time_s
    bshare = min(b / tot.bytes, 1.0) if b is not None and tot.bytes > 0 else None
    tshare = min(ts / T, 1.0) if ts is not None and T > 0 else None
    shares = [x for x in (bshare, tshare) if x is not None]
    material = max(shares) >= cfg.significance_share if shares else True  # unknown: not held against it
    min_n = (
        cfg.small_requests_absolute
        if i.id.startswith("small_")
        else cfg.random_absolute
        if i.id.startswith("random_")
        else cfg.significance_min_requests
    )
    many = n is None or n >= min_n
    sev = i.severity
    if sev == "high" and not (material and many):
        sev = "warn" if (material or many) else "info"
    sig = {
        "requests": n,
        "bytes": b,
        "time_s": ts,
        "bytes_share": bshare,
        "time_share": tshare,
        "time_basis": basis,
        "share_threshold": cfg.significance_share,
        "min_requests": min_n,
    }
    msg = i.message
    if sev != i.severity:
        what = " and ".join(
            x
            for x in (
                f"{_pct(bshare)} of the bytes" if bshare is not None else "",
                f"{_pct(tshare)} of the I/O time" if tshare is not None else "",
                f"{int(n)} requests" if n is not None else "",
            )
            if x
        )
        msg += f" (concerns {what}: below the significance thresholds, so {sev}, not high)"
    return replace(i, severity=sev, message=msg, evidence={**i.evidence, "significance": sig})


# ======================================================================================
# Public API


def job_insights(store: Store, job_id: str, cfg: DiagnosisConfig | None = None) -> JobInsights:
    """Run every rule on ``job_id`` (client layer), weigh each insight's severity by the bytes
    and time it concerns (:func:`weigh`), sort by severity, then id. An unknown job or one
    without I/O gives no insight (and its phases' source ``none``)."""
    cfg = cfg or DiagnosisConfig()
    counters = _Counters(store, job_id)
    trace = _Trace(store, job_id, cfg)
    ph = trace.phases()
    notes = []
    if counters.present and trace.present:
        notes.append(
            "rules that both can answer use the Darshan counters (complete); the trace adds "
            "phases, read-after-write and metadata rate"
        )
    out: list[Insight] = []
    for r in RULES:
        out += r(counters, trace, cfg, ph)
    if out:
        tot = _totals(counters, trace)
        out = [weigh(i, tot, cfg) for i in out]
    out.sort(key=lambda i: (SEVERITY_ORDER[i.severity], i.id))
    return JobInsights(job_id=job_id, insights=out, phases=ph, notes=notes)


def catalogue() -> list[dict[str, str]]:
    """The rules with their docstrings (source, thresholds and units)."""
    return [{"rule": r.__name__, "doc": (r.__doc__ or "").strip()} for r in RULES]
