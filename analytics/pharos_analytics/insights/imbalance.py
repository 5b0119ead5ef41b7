"""Rules on the balance of the job's ranks: stragglers on shared files and per-rank imbalance
(Drishti P18, P19, P21, P22)."""

from __future__ import annotations

from typing import Any

from ..diagnosis_config import DiagnosisConfig
from ..phases import JobPhases
from .evidence import Counters, Trace
from .model import Insight, mib, pct


def stragglers(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
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
                    f"the slowest rank ({ev['slowest_rank']}) moved {mib(ev['slowest_rank_bytes'])}, the "
                    f"fastest ({ev['fastest_rank']}) {mib(ev['fastest_rank_bytes'])}"
                )
            else:
                what = (
                    f"the slowest rank ({ev['slowest_rank']}) spent {ev['slowest_rank_time_s']:.1f} s in I/O, "
                    f"the fastest ({ev['fastest_rank']}) {ev['fastest_rank_time_s']:.1f} s"
                )
            msg = (
                f"shared file {c.name(worst)}: {what}; the difference is {pct(share)} of the file's "
                f"{'bytes' if kind == 'bytes' else 'I/O time'} ({len(hits)} shared file(s) above "
                f"{pct(cfg.imbalance_stragglers)})"
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
                f"{pct(t.f('worst_shared_imbalance'))} more of the bytes than another "
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


def rank_imbalance(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Imbalance of bytes and of I/O time across the job's ranks. Source: Drishti
    P21/P22 (per-rank size imbalance, imbalance_size), extended to time by Pharos.

    (max - min) / max over the ranks that did data I/O, of bytes and of data-op time,
    above ``imbalance_size`` (share 0-1, default 0.3), with at least
    ``imbalance_min_ranks`` ranks. Bytes: severity high (Drishti), weighed by the heaviest rank's
    excess bytes (:func:`~.weigh.weigh`); time: warn (unequal time for equal bytes is a symptom
    of CPU or of a slow resource, which :func:`~.targets.straggler_resource` names). Counters: non-shared records only (shared records are
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
                    # bytes: the application's split of the data (Drishti P21/P22: HIGH, weighed);
                    # time with equal bytes is a symptom (CPU, a slow resource: straggler_resource)
                    "high" if kind == "bytes" else "warn",
                    src,  # type: ignore[arg-type]
                    f"rank {hi} has {vals[hi]:.6g} {unit} of data I/O, rank {lo} {vals[lo]:.6g} {unit} "
                    f"({pct(imb)} imbalance over {len(vals)} ranks)",
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
