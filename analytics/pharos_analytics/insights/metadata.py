"""Rules on the job's metadata operations: time per rank, sustained rate, fsync storms
(Drishti P17, Beacon's metadata rate, Pharos)."""

from __future__ import annotations

from ..diagnosis_config import DiagnosisConfig
from ..phases import JobPhases
from .evidence import Counters, Trace
from .model import Insight


def metadata_time(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
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


def metadata_rate(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Metadata-heavy I/O. Source: Beacon (NSDI'19): more than ``metadata_rate_ops_s``
    (operations per second, default 1,000) metadata operations, sustained for
    ``metadata_sustained_s`` (seconds, default 3; Pharos) consecutive seconds in the trace;
    from counters, the average rate over the run (opens, stats, fsyncs, renames / s). Severity
    high, weighed by the job's metadata time (:func:`~.weigh.weigh`)."""
    prof = ph.job
    if prof is None or not prof.metadata_heavy:
        return []
    src = "counters" if ph.source == "counters" else "trace"
    heavy = [p.index for p in ph.phases if p.profile.metadata_heavy]
    return [
        Insight(
            "metadata_heavy",
            "Metadata-heavy I/O",
            "high",
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


def fsync_storm(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """fsync storms. Source: Pharos.

    Fires when fsync + fdatasync calls reach ``fsync_absolute`` (calls, default 100) and
    exceed ``fsync_per_write_ratio`` (calls per write request, default 0.1). Counters:
    POSIX_FSYNCS + POSIX_FDSYNCS over POSIX_WRITES; trace: fsync/fdatasync requests. Severity
    high: a sync per write forces every write to the storage before the next (its count is its
    threshold).
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
            "high",
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
