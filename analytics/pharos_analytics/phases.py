"""I/O phases of a job and the access profile of each phase and of the whole job.

A *phase* is a burst of the job's I/O: requests are ordered by start time and a new phase
begins where the job was idle (no request of any rank in flight) for at least
``DiagnosisConfig.phase_gap_s`` (default 1 s). When more than ``max_phases`` phases would
result, only the ``max_phases - 1`` longest gaps split the job. The requests are the
job's *data ops on data files* and its *metadata ops* (open, close, fsync, fdatasync,
stat, unlink, mkdir, rename) outside system paths, as :mod:`pharos_analytics.summary`
defines them; one layer at a time (``client`` by default).

Each phase, and the job, gets an :class:`IoProfile`:

* ``pattern``: Beacon's N-N / N-1 / N-M / 1-1 / 1-N decided by volume dominance over the
  span's reads and writes (:func:`pattern.decide_pattern`, NSDI'19 §4), the same function
  the job summary uses; ``patterns`` keeps the pattern of the reads alone and of the writes
  alone, ``fan_in_pattern`` the fan-in pattern of all data I/O together
  (:func:`pattern.classify_fan_in`). For the whole job the pattern fields are those of
  :func:`pharos_analytics.summary.job_summary` (same definition and data: for a Darshan job,
  with or without DXT, the summary's counter records: POSIX + STDIO + DFS, MPI-IO or DAOS
  by its per-log rule).
* ``direction``: ``write`` or ``read`` when |writes - reads| / (reads + writes), in bytes,
  exceeds ``dominance_ratio`` (Drishti imbalance_operations), else ``mixed``.
* ``access``: ``random`` when the share of non-sequential requests exceeds ``random_ratio``
  (Drishti), else ``sequential``. A request is *sequential* when its offset is at or after
  the end (offset + bytes) of the previous request of the same rank, file and direction,
  *consecutive* when exactly at it (Darshan's POSIX_SEQ_* / POSIX_CONSEC_* definitions);
  the first request of a stream is sequential, and consecutive iff at offset 0. A merged
  record of ``count`` requests (Beacon's compression: contiguous, equal sizes) adds
  ``count - 1`` consecutive requests.
* ``size_class``: ``small`` when more than half of the data requests are under
  ``small_request_bytes`` (1 MiB, Drishti), else ``large``.
* ``alignment``: ``misaligned`` when the share of requests whose offset is not a multiple
  of ``alignment_bytes`` (4 KiB), or of the file's stripe size when a Darshan LUSTRE record
  gives it, exceeds ``misaligned_ratio`` (Drishti misaligned_requests). In a merged record
  the first request has the record's offset, the others are misaligned iff the size is.
* ``metadata_heavy``: the job sustained more than ``metadata_rate_ops_s`` (1,000, Beacon)
  metadata ops per second for ``metadata_sustained_s`` consecutive whole seconds.

Aggregation is SQL (window functions order the requests, one pass per query); Python only
finds runs of busy seconds among the few seconds above the rate.

Jobs without traced requests (Darshan logs without DXT) have no phases; their job profile
comes from the Darshan counters (:func:`counters_profile`): sequential and consecutive
shares from POSIX_SEQ_*/POSIX_CONSEC_*, small requests from the POSIX_SIZE_* bins,
misalignment from POSIX_FILE_NOT_ALIGNED (Darshan checks offsets against
POSIX_FILE_ALIGNMENT, the file system's block or stripe size: ``alignment_bytes`` reports
the largest one seen), metadata rate as the average over the run
(opens + stats + fsyncs + renames over the job's wall time: Darshan has no per-second
count, so ``metadata_heavy`` means the *average* rate is above the threshold).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

from pharos_core.store import Store

from .diagnosis_config import DiagnosisConfig
from .pattern import SYSTEM_PATH_REGEX, Pattern, classify_fan_in, is_system_path
from .phases_sql import (
    BUSY_SECONDS_SQL,
    COUNTER_FILES_SQL,
    GAPS_SQL,
    JOB_LOGS_SQL,
    JOB_PROFILE_SQL,
    PHASE_PROFILES_SQL,
    SMALL_BIN_COUNTERS,
    STRIPES_SQL,
)
from .summary import _check_layer, _darshan_totals, fan_in_patterns
from .summary_sql import ns_to_datetime

Direction = Literal["read", "write", "mixed", "none"]
Access = Literal["sequential", "random", "none"]
SizeClass = Literal["small", "large", "none"]
Alignment = Literal["aligned", "misaligned", "none"]
Source = Literal["trace", "counters", "none"]


@dataclass(frozen=True)
class IoProfile:
    """Access profile of a span of a job's I/O. Shares are 0-1 (``None`` without data
    requests); bytes in bytes, times in seconds, rates per second."""

    start: datetime | None
    end: datetime | None
    duration_s: float
    pattern: Pattern
    io_ranks: int
    n_files: int
    max_fan_in: int
    reads: int
    writes: int
    bytes_read: int
    bytes_written: int
    direction: Direction
    sequential_share: float | None
    consecutive_share: float | None
    access: Access
    small_share: float | None
    size_class: SizeClass
    misaligned_share: float | None
    alignment: Alignment
    alignment_bytes: int
    stripe_misaligned_share: float | None
    metadata_ops: int
    metadata_time_s: float
    data_time_s: float
    metadata_peak_ops_s: float
    metadata_busy_s: int
    metadata_heavy: bool
    patterns: dict[str, Pattern] = field(default_factory=dict)
    fan_in_pattern: Pattern = "none"


@dataclass(frozen=True)
class Phase:
    """One burst of I/O (``index`` from 1, in time order) and its profile."""

    index: int
    profile: IoProfile


@dataclass(frozen=True)
class JobPhases:
    """A job's phases and whole-job profile. ``source`` says where the numbers come from:
    ``trace`` (io_requests: agent or DXT), ``counters`` (Darshan counters only), ``none``."""

    job_id: str
    layer: str
    source: Source
    gap_s: float
    job: IoProfile | None
    phases: list[Phase] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# Helpers


def _share(part: float, whole: float) -> float | None:
    return float(part) / float(whole) if whole else None


def _direction(bytes_read: int, bytes_written: int, cfg: DiagnosisConfig) -> Direction:
    total = bytes_read + bytes_written
    if total == 0:
        return "none"
    if abs(bytes_written - bytes_read) / total <= cfg.dominance_ratio:
        return "mixed"
    return "write" if bytes_written > bytes_read else "read"


def longest_run(seconds: list[int]) -> int:
    """Length of the longest run of consecutive integers in a sorted list."""
    best = run = 0
    prev = None
    for s in seconds:
        run = run + 1 if prev is not None and s == prev + 1 else 1
        best = max(best, run)
        prev = s
    return best


def _profile(r: dict, busy: list[tuple[int, int]], cfg: DiagnosisConfig) -> IoProfile:
    g = lambda k: int(r[k] or 0)  # noqa: E731
    data = g("data_requests")
    reads, writes = g("reads"), g("writes")
    seq = _share(g("sequential"), data)
    small = _share(g("small"), data)
    mis = _share(g("misaligned"), data)
    smis = _share(g("stripe_misaligned"), g("stripe_known"))
    start_ns, end_ns = g("start_ns"), g("end_ns")
    duration = max(end_ns - start_ns, 0) / 1e9
    busy_s = longest_run([s for s, _ in busy])
    peak = max((ops for _, ops in busy), default=0)
    meta_ops = g("meta_ops")
    if not peak and meta_ops:
        peak = meta_ops / max(duration, 1.0)  # none above the rate: report the average instead
    misaligned = max(x for x in (mis, smis, 0.0) if x is not None)
    io_ranks, n_files, pattern, patterns, fan_in = fan_in_patterns(r, g("bytes_read"), g("bytes_written"))
    return IoProfile(
        start=ns_to_datetime(start_ns),
        end=ns_to_datetime(end_ns),
        duration_s=duration,
        pattern=pattern,
        patterns=patterns,
        fan_in_pattern=fan_in,
        io_ranks=io_ranks,
        n_files=n_files,
        max_fan_in=g("max_fan_in"),
        reads=reads,
        writes=writes,
        bytes_read=g("bytes_read"),
        bytes_written=g("bytes_written"),
        direction=_direction(g("bytes_read"), g("bytes_written"), cfg),
        sequential_share=seq,
        consecutive_share=_share(g("consecutive"), data),
        access="none" if seq is None else ("random" if 1 - seq > cfg.random_ratio else "sequential"),
        small_share=small,
        size_class="none" if small is None else ("small" if small > 0.5 else "large"),
        misaligned_share=mis,
        alignment="none" if mis is None else ("misaligned" if misaligned > cfg.misaligned_ratio else "aligned"),
        alignment_bytes=cfg.alignment_bytes,
        stripe_misaligned_share=smis,
        metadata_ops=meta_ops,
        metadata_time_s=g("meta_time_ns") / 1e9,
        data_time_s=g("data_time_ns") / 1e9,
        metadata_peak_ops_s=float(peak),
        metadata_busy_s=busy_s,
        metadata_heavy=busy_s >= cfg.metadata_sustained_s,
    )


def _params(store: Store, job_id: str, layer: str, cfg: DiagnosisConfig) -> dict:
    stripes = store.query(STRIPES_SQL, {"job_id": job_id})
    return {
        "job_id": job_id,
        "layer": layer,
        "system_re": SYSTEM_PATH_REGEX,
        "stripe_paths": [r["path"] for r in stripes],
        "stripe_sizes": [int(r["stripe"]) for r in stripes],
        "small": cfg.small_request_bytes,
        "align": cfg.alignment_bytes,
        "rate": cfg.metadata_rate_ops_s,
    }


def _gap_ns(store: Store, p: dict, cfg: DiagnosisConfig) -> int:
    """The gap threshold: phase_gap_s, raised so that at most max_phases phases result."""
    gap_ns = int(cfg.phase_gap_s * 1e9)
    rows = store.query(GAPS_SQL, {**p, "gap_ns": gap_ns, "limit": cfg.max_phases})
    if len(rows) >= cfg.max_phases:  # more than max_phases - 1 splits: keep the longest
        gap_ns = int(rows[cfg.max_phases - 2]["gap"]) if cfg.max_phases > 1 else 1 << 62
    return gap_ns


# --------------------------------------------------------------------------------------
# Public API


def trace_phases(
    store: Store, job_id: str, layer: str = "client", cfg: DiagnosisConfig | None = None
) -> tuple[IoProfile | None, list[Phase], float]:
    """(job profile, phases, gap threshold in s) from the job's requests on ``layer``;
    ``(None, [], gap)`` when the job has no data or metadata request there."""
    _check_layer(layer)
    cfg = cfg or DiagnosisConfig()
    p = _params(store, job_id, layer, cfg)
    gap_ns = _gap_ns(store, p, cfg)
    p["gap_ns"] = gap_ns
    phase_rows = store.query(PHASE_PROFILES_SQL, p)
    if not phase_rows:
        return None, [], gap_ns / 1e9
    # one phase: the job's profile is that phase's (the same rows, the same sums); each query here
    # is a window query over all the job's requests, so the common case is spared one
    job_rows = [phase_rows[0]] if len(phase_rows) == 1 else store.query(JOB_PROFILE_SQL, p)
    busy: dict[int, list[tuple[int, int]]] = {}
    # no second can exceed the metadata rate when the whole job has fewer metadata ops than it
    if float(job_rows[0]["meta_ops"]) > cfg.metadata_rate_ops_s:
        for r in store.query(BUSY_SECONDS_SQL, p):
            busy.setdefault(int(r["phase"]), []).append((int(r["sec"]), int(r["ops"])))
    # Seconds of the whole job: the same second may hold ops of two phases; sum them.
    job_secs: dict[int, int] = {}
    for rows in busy.values():
        for sec, ops in rows:
            job_secs[sec] = job_secs.get(sec, 0) + ops
    job = _profile(job_rows[0], sorted(job_secs.items()), cfg)
    phases = [
        Phase(index=i + 1, profile=_profile(r, busy.get(int(r["phase"]), []), cfg)) for i, r in enumerate(phase_rows)
    ]
    return job, phases, gap_ns / 1e9


def counters_profile(store: Store, job_id: str, cfg: DiagnosisConfig | None = None) -> IoProfile | None:
    """The job's profile from imported Darshan POSIX counters (no per-request data);
    ``None`` when the job has no POSIX counter. Data files exclude system paths."""
    cfg = cfg or DiagnosisConfig()
    rows = store.query(COUNTER_FILES_SQL, {"job_id": job_id, "small_bins": list(SMALL_BIN_COUNTERS)})
    if not rows:
        return None
    logs = {r["log_id"]: r for r in store.query(JOB_LOGS_SQL, {"job_id": job_id})}
    tot = dict.fromkeys(
        (
            "reads",
            "writes",
            "bytes_read",
            "bytes_written",
            "sequential",
            "consecutive",
            "small",
            "misaligned",
            "meta_ops",
            "meta_time_s",
            "data_time_s",
        ),
        0.0,
    )
    ranks_per_file: dict[str, set[int]] = {}
    for r in rows:
        if is_system_path(r["path"]):
            continue
        for k in tot:
            tot[k] += float(r[k] or 0)
        if float(r["reads"] or 0) + float(r["writes"] or 0) == 0:
            continue
        key = r["path"] or str(r["record_id"])
        ranks = ranks_per_file.setdefault(key, set())
        rank = int(r["rank"])
        if rank >= 0:
            ranks.add(rank)
        else:  # shared record: every rank of its log
            lg = logs.get(r["log_id"])
            n, off = (int(lg["nprocs"]), int(lg["rank_offset"])) if lg else (1, 0)
            ranks.update(range(off, off + max(n, 1)))
    all_ranks = set().union(*ranks_per_file.values()) if ranks_per_file else set()
    data = tot["reads"] + tot["writes"]
    start_ns = min((int(lg["start_ns"]) for lg in logs.values()), default=0)
    end_ns = max((int(lg["end_ns"]) for lg in logs.values()), default=0)
    duration = max(end_ns - start_ns, 0) / 1e9
    seq = _share(tot["sequential"], data)
    small = _share(tot["small"], data)
    mis = _share(tot["misaligned"], data)
    align = max((int(float(r["file_alignment"] or 0)) for r in rows), default=0) or cfg.alignment_bytes
    avg_rate = tot["meta_ops"] / max(duration, 1.0)
    heavy = avg_rate > cfg.metadata_rate_ops_s and duration >= cfg.metadata_sustained_s
    return IoProfile(
        start=ns_to_datetime(start_ns),
        end=ns_to_datetime(end_ns),
        duration_s=duration,
        pattern=classify_fan_in(
            len(all_ranks), len(ranks_per_file), max((len(v) for v in ranks_per_file.values()), default=0)
        ),
        io_ranks=len(all_ranks),
        n_files=len(ranks_per_file),
        max_fan_in=max((len(v) for v in ranks_per_file.values()), default=0),
        reads=int(tot["reads"]),
        writes=int(tot["writes"]),
        bytes_read=int(tot["bytes_read"]),
        bytes_written=int(tot["bytes_written"]),
        direction=_direction(int(tot["bytes_read"]), int(tot["bytes_written"]), cfg),
        sequential_share=seq,
        consecutive_share=_share(tot["consecutive"], data),
        access="none" if seq is None else ("random" if 1 - seq > cfg.random_ratio else "sequential"),
        small_share=small,
        size_class="none" if small is None else ("small" if small > 0.5 else "large"),
        misaligned_share=mis,
        alignment="none" if mis is None else ("misaligned" if mis > cfg.misaligned_ratio else "aligned"),
        alignment_bytes=align,
        stripe_misaligned_share=None,
        metadata_ops=int(tot["meta_ops"]),
        metadata_time_s=tot["meta_time_s"],
        data_time_s=tot["data_time_s"],
        metadata_peak_ops_s=avg_rate,
        metadata_busy_s=int(duration) if heavy else 0,
        metadata_heavy=heavy,
    )


def _summary_pattern(prof: IoProfile | None, figs: dict | None, cfg: DiagnosisConfig) -> IoProfile | None:
    """``prof`` with the pattern fields of the job's Darshan-counter summary (``figs``, from
    :func:`pharos_analytics.summary._darshan_totals`): one definition of a Darshan job's pattern.
    A job with counters but no POSIX record (STDIO, MPI-IO or DFS only) gets a profile of its
    summary's figures alone (shares unknown: ``None``)."""
    if figs is None:
        return prof
    fields = {
        "pattern": figs["pattern"],
        "patterns": figs["patterns"],
        "fan_in_pattern": figs["fan_in_pattern"],
        "io_ranks": figs["io_ranks"],
        "n_files": figs["n_files"],
    }
    if prof is not None:
        return replace(prof, **fields)
    reads, writes = figs["ops"].get("read", 0), figs["ops"].get("write", 0)
    span = figs["io_span_s"] or 0.0
    return IoProfile(
        start=figs["first_io"],
        end=figs["last_io"],
        duration_s=span,
        max_fan_in=max((f.ranks for f in figs["files"]), default=0),
        reads=reads,
        writes=writes,
        bytes_read=figs["bytes_read"],
        bytes_written=figs["bytes_written"],
        direction=_direction(figs["bytes_read"], figs["bytes_written"], cfg),
        sequential_share=None,
        consecutive_share=None,
        access="none",
        small_share=None,
        size_class="none",
        misaligned_share=None,
        alignment="none",
        alignment_bytes=cfg.alignment_bytes,
        stripe_misaligned_share=None,
        metadata_ops=figs["ops"].get("open", 0) + figs["ops"].get("stat", 0),
        metadata_time_s=0.0,
        data_time_s=figs["io_time_s"],
        metadata_peak_ops_s=0.0,
        metadata_busy_s=0,
        metadata_heavy=False,
        **fields,
    )


def job_phases(store: Store, job_id: str, layer: str = "client", cfg: DiagnosisConfig | None = None) -> JobPhases:
    """A job's phases and profile: from its traced requests when it has any on ``layer``,
    else (client layer) from its Darshan counters, else empty (``source`` ``none``).

    The job profile's pattern fields (``pattern``, ``patterns``, ``fan_in_pattern``,
    ``io_ranks``, ``n_files``) are those of :func:`pharos_analytics.summary.job_summary` for
    the same job and layer: on the client layer, a Darshan job's (with or without DXT) from the
    Darshan counters the summary uses, else from the trace."""
    cfg = cfg or DiagnosisConfig()
    job, phases, gap_s = trace_phases(store, job_id, layer, cfg)
    figs = None
    if layer == "client":  # a Darshan job's summary takes its pattern from the counters: same here
        figs = _darshan_totals(store, job_id, 100)[0]
    if job is not None and (job.reads + job.writes + job.metadata_ops) > 0:
        return JobPhases(
            job_id=job_id,
            layer=layer,
            source="trace",
            gap_s=gap_s,
            job=_summary_pattern(job, figs, cfg),
            phases=phases,
        )
    if layer == "client":
        prof = _summary_pattern(counters_profile(store, job_id, cfg), figs, cfg)
        if prof is not None:
            return JobPhases(job_id=job_id, layer=layer, source="counters", gap_s=gap_s, job=prof, phases=[])
    return JobPhases(job_id=job_id, layer=layer, source="none", gap_s=gap_s, job=None, phases=[])


__all__ = [
    "IoProfile",
    "JobPhases",
    "Phase",
    "counters_profile",
    "job_phases",
    "longest_run",
    "trace_phases",
]
