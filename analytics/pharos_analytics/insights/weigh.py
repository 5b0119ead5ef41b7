"""Significance: every insight weighs the bytes and the time it concerns (one rule for all,
Drishti's thresholds)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..diagnosis_config import DiagnosisConfig
from .evidence import Counters, Trace
from .model import Insight, pct


@dataclass(frozen=True)
class Totals:
    """The job's I/O to weigh insights against. Bytes in bytes, times in seconds; per
    direction (``read``/``write``): requests, bytes, data time summed over ranks."""

    bytes: float
    time_s: float  # data + metadata time summed over ranks
    crit_s: float  # the slowest rank's data + metadata time (the job's critical path in I/O)
    dirs: dict[str, tuple[float, float, float]]  # direction -> (requests, bytes, time_s)


def totals(c: Counters, t: Trace) -> Totals:
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
        return Totals(
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
    return Totals(
        bytes=br + bw,
        time_s=sum(per),
        crit_s=max(per, default=0.0),
        dirs={"read": (nr, br, data_s * nr / n), "write": (nw, bw, data_s * nw / n)},
    )


def _concerns(i: Insight, tot: Totals) -> tuple[float | None, float | None, float | None, str]:
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
    if i.id == "rank_imbalance_bytes_per_rank":  # the heaviest rank's excess over the lightest
        return None, float(ev["max"]) - float(ev["min"]), None, "sum"
    if i.id == "metadata_heavy":  # the job's metadata time, summed over ranks
        return None, None, max(tot.time_s - sum(v[2] for v in tot.dirs.values()), 0.0), "sum"
    if i.id == "metadata_time":
        return None, None, float(ev["worst_s"]), "critical"
    if i.id == "single_target_shared_file":
        return None, float(ev.get("bytes") or 0) or None, None, "sum"
    if i.id == "straggler_resource":  # the excess time, against the slowest rank's I/O time
        return None, None, float(ev.get("excess_time_s", 0)), "critical"
    return None, None, None, "sum"


def weigh(i: Insight, tot: Totals, cfg: DiagnosisConfig) -> Insight:
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
                f"{pct(bshare)} of the bytes" if bshare is not None else "",
                f"{pct(tshare)} of the I/O time" if tshare is not None else "",
                f"{int(n)} requests" if n is not None else "",
            )
            if x
        )
        msg += f" (concerns {what}: below the significance thresholds, so {sev}, not high)"
    return replace(i, severity=sev, message=msg, evidence={**i.evidence, "significance": sig})
