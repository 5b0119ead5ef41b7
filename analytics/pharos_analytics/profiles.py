"""Job profiles: what a job name (per user) does to the storage, from history (Pharos; input
of the DFRA control loop, Ji et al. FAST'19 §3: decide a job's forwarding resources from
its past runs).

Per job (``io_requests``, the client layer when the job has one, else the forwarder layer,
else the storage layer; names and users from ``job_events``): bytes read and written,
I/O span (s, first to last request), bandwidth (bytes/s over the span), busy seconds, data
requests and mean request size (bytes), metadata ops and their rate (ops/s over the span),
ranks that did I/O, forwarding nodes and targets used (forwarder-layer rows of the job,
whatever layer the rest comes from), and the Beacon I/O pattern (NSDI'19 §4, volume dominance over
reads and writes, :func:`pharos_analytics.summary.fan_in_patterns`). Per (name, user): mean, population std, n,
min and max of every number, and the pattern counts. A request a mount replayed on another
forwarding node counts once (:mod:`pharos_analytics.replays_sql`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

from pharos_core.store import Store, ns_to_datetime64

from .pattern import SYSTEM_PATH_REGEX
from .replays_sql import counted_once
from .summary import fan_in_patterns
from .summary_sql import DATA_OPS, FAN_IN_SELECT, META_OPS, NON_FILE_TYPES, READ_OPS, WRITE_OPS, sql_list

#: Metadata ops the file systems serve: on files and directories, not on system paths (libraries,
#: /proc, the launcher's files) nor on pipes, sockets and terminals; the rule of the phases'
#: metadata profile (:data:`pharos_analytics.phases_sql._PHASE_REQUESTS`), so the DFRA classifier's
#: metadata-heavy test and the diagnosis' count the same ops.
_META = (
    f"op IN {sql_list(META_OPS)} AND file_type NOT IN {sql_list(NON_FILE_TYPES)}"
    " AND NOT match(path, {system_re:String})"
)

#: Per (job, layer): the numbers of a profile.
JOB_METRICS_SQL = f"""
SELECT job_id, layer,
       sumIf(bytes, op IN {sql_list(READ_OPS)})                    AS bytes_read,
       sumIf(bytes, op IN {sql_list(WRITE_OPS)})                   AS bytes_written,
       sumIf(count, op IN {sql_list(DATA_OPS)})                    AS data_requests,
       sumIf(count, {_META})                                       AS metadata_ops,
       toUnixTimestamp64Nano(min(start))                           AS first_ns,
       toUnixTimestamp64Nano(max(end))                             AS last_ns,
       uniqExact(toStartOfSecond(start))                           AS busy_s,
       uniqExactIf(rank, op IN {sql_list(DATA_OPS)})              AS io_ranks,
       uniqExactIf(forwarding_node, forwarding_node != '')         AS forwarding_nodes,
       uniqExactIf(target, target != '')                           AS targets
FROM io_requests
WHERE __WHERE__ AND __ONCE__
GROUP BY job_id, layer
"""

JOB_NAMES_SQL = """
SELECT job_id, anyIf(name, kind = 'start') AS name, anyIf(user, kind = 'start') AS user,
       anyIf(ranks, kind = 'start') AS ranks, toUnixTimestamp64Nano(minIf(time, kind = 'start')) AS start_ns
FROM job_events FINAL
WHERE __WHERE__
GROUP BY job_id
"""

NUMBERS = (
    "bytes_read",
    "bytes_written",
    "bytes",
    "span_s",
    "bandwidth_b_s",
    "busy_s",
    "data_requests",
    "mean_request_bytes",
    "metadata_ops",
    "metadata_ops_s",
    "io_ranks",
    "ranks",
    "forwarding_nodes",
    "targets",
)
_LAYER_ORDER = ("client", "forwarder", "storage")


@dataclass
class JobMetrics:
    job_id: str
    name: str
    user: str
    layer: str
    start_ns: int
    numbers: dict[str, float]
    pattern: str


@dataclass
class Stat:
    mean: float
    std: float
    n: int
    min: float
    max: float


@dataclass
class JobProfile:
    name: str
    user: str
    runs: int
    jobs: list[str]  # newest first, at most 20
    last_start_ns: int
    stats: dict[str, Stat]
    patterns: dict[str, int]
    pattern: str  # the most frequent
    units: dict[str, str] = field(
        default_factory=lambda: {
            "bytes_read": "B",
            "bytes_written": "B",
            "bytes": "B",
            "span_s": "s",
            "bandwidth_b_s": "B/s",
            "busy_s": "s",
            "data_requests": "requests",
            "mean_request_bytes": "B",
            "metadata_ops": "ops",
            "metadata_ops_s": "ops/s",
            "io_ranks": "ranks",
            "ranks": "ranks",
            "forwarding_nodes": "nodes",
            "targets": "targets",
        }
    )

    def to_dict(self) -> dict:
        return asdict(self)


def job_metrics(store: Store, job_ids: list[str] | None = None, since_ns: int | None = None) -> list[JobMetrics]:
    """The profile numbers of each job (all jobs with events or requests, or ``job_ids``; requests
    from ``since_ns`` on)."""
    p: dict = {"system_re": SYSTEM_PATH_REGEX}
    where = ["1"]
    if job_ids is not None:
        where.append("job_id IN {jobs:Array(String)}")
        p["jobs"] = job_ids
    ev_where = list(where)
    if since_ns is not None:
        where.append("start >= {since:DateTime64(9)}")
        p["since"] = ns_to_datetime64(since_ns)
    jobs_where = " AND ".join(where)
    rows = store.query(
        JOB_METRICS_SQL.replace("__WHERE__", jobs_where).replace("__ONCE__", counted_once(jobs_where)), p
    )
    names = {r["job_id"]: r for r in store.query(JOB_NAMES_SQL.replace("__WHERE__", " AND ".join(ev_where)), p)}
    by_job: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_job.setdefault(r["job_id"], {})[r["layer"]] = r
    jobs = sorted(by_job)
    fan: dict[tuple[str, str], dict] = {}
    if jobs:
        for layer in _LAYER_ORDER:
            sel = [j for j in jobs if _layer(by_job[j]) == layer]
            if not sel:
                continue
            q = FAN_IN_SELECT.replace("__JOBS__", "job_id IN {jobs:Array(String)}")
            for f in store.query(q, {"jobs": sel, "layer": layer, "system_re": SYSTEM_PATH_REGEX}):
                fan[(f["job_id"], layer)] = f
    out = []
    for j in jobs:
        layer = _layer(by_job[j])
        r = by_job[j][layer]
        fwd = by_job[j].get("forwarder", r)
        ev = names.get(j, {})
        span = max(0.0, (int(r["last_ns"]) - int(r["first_ns"])) / 1e9)
        b = int(r["bytes_read"]) + int(r["bytes_written"])
        dr = int(r["data_requests"])
        f = fan.get((j, layer))
        nums = {
            "bytes_read": float(r["bytes_read"]),
            "bytes_written": float(r["bytes_written"]),
            "bytes": float(b),
            "span_s": span,
            "bandwidth_b_s": b / span if span > 0 else 0.0,
            "busy_s": float(r["busy_s"]),
            "data_requests": float(dr),
            "mean_request_bytes": b / dr if dr else 0.0,
            "metadata_ops": float(r["metadata_ops"]),
            "metadata_ops_s": int(r["metadata_ops"]) / span if span > 0 else 0.0,
            "io_ranks": float(r["io_ranks"]),
            "ranks": float(ev.get("ranks") or 0),
            "forwarding_nodes": float(fwd["forwarding_nodes"]),
            "targets": float(fwd["targets"]),
        }
        pattern = fan_in_patterns(f, int(r["bytes_read"]), int(r["bytes_written"]))[2]  # volume dominance
        out.append(
            JobMetrics(
                j,
                ev.get("name") or "",
                ev.get("user") or "",
                layer,
                int(ev.get("start_ns") or r["first_ns"]),
                nums,
                pattern,
            )
        )
    return out


def _layer(layers: dict[str, dict]) -> str:
    return next(name for name in (*_LAYER_ORDER, *layers) if name in layers)


def _stat(xs: list[float]) -> Stat:
    n = len(xs)
    m = sum(xs) / n
    return Stat(mean=m, std=math.sqrt(sum((x - m) ** 2 for x in xs) / n), n=n, min=min(xs), max=max(xs))


def job_profiles(
    store: Store, name: str | None = None, user: str | None = None, since_ns: int | None = None
) -> list[JobProfile]:
    """Profiles per (job name, user) over the jobs' history (jobs without a name are grouped
    under their job id), largest total bytes first."""
    groups: dict[tuple[str, str], list[JobMetrics]] = {}
    for m in job_metrics(store, since_ns=since_ns):
        key = (m.name or m.job_id, m.user)
        if (name is None or key[0] == name) and (user is None or key[1] == user):
            groups.setdefault(key, []).append(m)
    out = []
    for (n, u), ms in groups.items():
        ms.sort(key=lambda m: m.start_ns, reverse=True)
        pats = Counter(m.pattern for m in ms)
        out.append(
            JobProfile(
                name=n,
                user=u,
                runs=len(ms),
                jobs=[m.job_id for m in ms[:20]],
                last_start_ns=ms[0].start_ns,
                stats={k: _stat([m.numbers[k] for m in ms]) for k in NUMBERS},
                patterns=dict(pats),
                pattern=pats.most_common(1)[0][0],
            )
        )
    out.sort(key=lambda p: -p.stats["bytes"].mean * p.runs)
    return out
