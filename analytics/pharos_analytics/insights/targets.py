"""Rules on the storage targets and other resources the job's files sit on: a shared file on
one target, the resource slow files share (Pharos, TOKIO darshan_bad_ost, Beacon §5.3)."""

from __future__ import annotations

from ..diagnosis_config import DiagnosisConfig
from ..pattern import SYSTEM_PATH_REGEX, is_system_path
from ..phases import JobPhases
from ..straggler import job_stragglers
from .evidence import TRACE_TARGETS_SQL, Counters, Trace
from .model import Insight, mib


def single_target(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
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


def straggler_resource(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
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
                f"the {v.files} file(s) on {kind} {f.resource} ran at a median {mib(v.median_perf_b_s)}/s, "
                f"{v.ratio:.1f}x slower than the {v.peer_files} file(s) on its peers ({mib(v.peers_median_perf_b_s)}/s; "
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


def interference(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Another job slowed this one on a shared forwarding node or target. Source: Pharos
    (:mod:`pharos_analytics.interference`: latency per request above the job's quiet-window
    baseline by ``interference_latency_ratio`` (x, default 1.5), the culprit the
    largest co-located job). Trace only (forwarder-layer requests); priced by
    :func:`pharos_analytics.system_diag.interference_price`."""
    if not t.present:
        return []
    from ..interference import job_interference
    from ..system_diag import interference_price

    rep = job_interference(t.store, t.job_id, cfg)
    ranks = sum(1 for r in t.ranks if int(r["bytes"]) > 0) or 1
    out = []
    for e in rep["events"]:
        if e["job_id"] != t.job_id:
            continue
        s, basis = interference_price(e, rep["shared_windows"], ranks)
        kind = e["resource_type"].replace("_", " ")
        out.append(
            Insight(
                "interference",
                f"Slowed by job {e['culprit_job']} on {kind} {e['resource']}",
                "high" if e["severity"] == "critical" else "warn",
                "trace",
                f"job {e['culprit_job']} moved {mib(e['culprit_bytes'])} through {kind} {e['resource']} while this job's "
                f"requests there took {e['latency_ms']:.2f} ms instead of {e['baseline_latency_ms']:.2f} ms "
                f"({e['latency_ratio']:.1f}x, {e['windows']} window(s))",
                {
                    k: e[k]
                    for k in (
                        "culprit_job",
                        "resource_type",
                        "resource",
                        "windows",
                        "latency_ms",
                        "baseline_latency_ms",
                        "latency_ratio",
                        "baseline_source",
                        "culprit_bytes",
                    )
                }
                | {"seconds_lost_basis": basis},
                [
                    f"Ask the administrators to keep job {e['culprit_job']}'s I/O off {kind} {e['resource']} "
                    "(forwarding-node mapping / target placement), or schedule the two apart."
                ],
                e.get("rule_source", "Pharos"),
                seconds_lost=s,
            )
        )
    return out
