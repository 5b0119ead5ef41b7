"""System-side diagnosis read from the store: stored anomalies, the load and state of storage
targets and forwarding nodes (what ``GET /v1/anomalies``, ``/v1/targets`` and ``/v1/forwarders``
serve; :mod:`pharos_api.routers.system_diag` maps these results to JSON).

Anomalies are the ``anomalies`` table (migration 005) written by the detection loop: fail-slow
nodes (:mod:`~pharos_analytics.failslow`, Beacon NSDI'19 §5.3), interference events
(:mod:`~pharos_analytics.interference`) and ``straggler_resource`` rows
(:mod:`~pharos_analytics.straggler`). Target load comes from ``target_metrics`` (migration 004),
forwarding-node load from the per-second rollup ``io_rollup_1s`` (migrations 009 and 011).

"Recent" ends at :func:`data_anchor`: the newest stored interval when the data are older than
the wall clock (imported or replayed history), else now. Times are ns since the epoch, bytes in
bytes, rates in B/s, latencies in ns, ``max_perf_mb_s`` in MB/s (10^6 B/s).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from pharos_core.store import Store, ns_to_datetime64

from .diagnosis_config import DiagnosisConfig
from .failslow import Anomaly, detect_failslow, stall_added_ms
from .failslow_sql import ROLLUP_FWD_WINDOW
from .interference import InterferenceEvent, detect_interference
from .replays_sql import RECORD_KEY, duplicate_replays

#: The newest state of each anomaly key detected since ``since``, filtered (before the LIMIT) by
#: kind, node, job (the slowed job or the culprit) and active ('' / -1: any).
RECENT_ANOMALIES_SQL = """
SELECT * FROM (
SELECT key, argMax(kind, detected) AS kind, argMax(node, detected) AS node, argMax(node_type, detected) AS node_type,
       argMax(job_id, detected) AS job_id, argMax(culprit_job, detected) AS culprit_job,
       argMax(persistence, detected) AS persistence, argMax(active, detected) AS active,
       argMax(severity, detected) AS severity, argMax(ratio, detected) AS ratio,
       toUnixTimestamp64Nano(argMax(onset, detected)) AS onset_ns,
       toUnixTimestamp64Nano(argMax(start, detected)) AS start_ns, toUnixTimestamp64Nano(argMax(end, detected)) AS end_ns,
       toUnixTimestamp64Nano(min(detected)) AS first_seen_ns, toUnixTimestamp64Nano(max(detected)) AS last_seen_ns,
       count() AS cycles, argMax(evidence, detected) AS evidence
FROM anomalies
WHERE detected >= {since:DateTime64(9)}
GROUP BY key
)
WHERE ({kind:String} = '' OR kind = {kind:String})
  AND ({node:String} = '' OR node = {node:String})
  AND ({job:String} = '' OR job_id = {job:String} OR culprit_job = {job:String})
  AND ({active:Int8} < 0 OR active = {active:Int8})
ORDER BY last_seen_ns DESC, key
LIMIT {limit:UInt32}
"""
#: No filter (every parameter of RECENT_ANOMALIES_SQL but since and limit).
ANY_ANOMALY = {"kind": "", "node": "", "job": "", "active": -1}
LAST_CYCLE_SQL = (
    "SELECT toUnixTimestamp64Nano(max(detected)) AS t FROM anomalies WHERE detected >= {since:DateTime64(9)}"
)
#: The newest data: the last target_metrics interval, or the end of the last second of forwarder
#: requests in the per-second rollup.
DATA_END_SQL = """
SELECT greatest((SELECT toUnixTimestamp64Nano(max(time)) FROM target_metrics),
                (SELECT if(count() = 0, 0, (toInt64(toUnixTimestamp(max(sec))) + 1) * 1000000000)
                 FROM io_rollup_1s WHERE layer = 'forwarder')) AS t
"""

TARGETS_SQL = """
SELECT target,
       sum(br) AS bytes_read, sum(bw) AS bytes_written, sum(o) AS ops,
       sum(br + bw) / {window_s:Float64} AS bandwidth_b_s, max((br + bw) / secs) AS peak_b_s,
       quantileExactIf(0.5)(p50, o > 0) AS latency_p50_ns, quantileExactIf(0.5)(p99, o > 0) AS latency_p99_ns,
       max(pmax) AS latency_max_ns, sum(svc) / greatest(sumIf(o, svc > 0), 1) AS latency_mean_ns, avg(qd) AS queue_depth, avgIf(thr, o > 0) AS throttled_share,
       max(perf) AS max_perf_mb_s, max(slow) AS slowdown, max(added) AS added_latency_ns,
       groupUniqArrayArray(fwds) AS forwarding_nodes, toUnixTimestamp64Nano(max(time)) AS last_ns
FROM
(
    SELECT target, time, greatest(max(interval_ms), 1) / 1000 AS secs,
           sum(bytes_read) AS br, sum(bytes_written) AS bw, sum(bytes_read + bytes_written) AS b,
           sum(read_ops + write_ops + metadata_ops) AS o, max(latency_p50_ns) AS p50, max(latency_p99_ns) AS p99,
           max(latency_max_ns) AS pmax, sum(service_ns_sum) AS svc, sum(queue_depth) AS qd, max(throttled) AS thr, max(max_perf_mb_s) AS perf,
           max(slowdown) AS slow, max(added_latency_ns) AS added, groupUniqArrayIf(forwarding_node, read_ops + write_ops + metadata_ops > 0) AS fwds
    FROM target_metrics FINAL
    WHERE time > {since:DateTime64(9)} AND time <= {until:DateTime64(9)}
    GROUP BY target, time
)
GROUP BY target
ORDER BY target
"""

#: Per forwarding node over the window, from the per-second rollup (io_rollup_1s, migrations 009
#: and 011; the seconds of ``(since, until]``, the last partial second left out, as fail-slow
#: reads it): the cost grows with seconds x nodes x targets x jobs, not with records. A request a
#: mount replayed on another forwarding node counts once, on the node of the execution kept: the
#: replay records of the window that repeat a counted request (few: only replay records are
#: read, :mod:`pharos_analytics.replays_sql`) are taken off their node's and job's requests and
#: bytes and their summed queue wait and service time (the p99 latencies keep every execution).
_WINDOW_START = "start >= toStartOfSecond({since:DateTime64(9)}) AND start < toStartOfSecond({until:DateTime64(9)})"
_WINDOW_REPLAY_JOBS = (
    f"job_id IN (SELECT job_id FROM io_requests WHERE layer = 'forwarder' AND replay = 1 AND {_WINDOW_START})"
)
WINDOW_DUPLICATES_SQL = f"""
SELECT forwarding_node AS node, job_id, sum(count) AS n, sum(bytes) AS b, sum(queue_wait_ns) AS qw,
       sum(duration_ns) AS svc
FROM io_requests
WHERE layer = 'forwarder' AND replay = 1 AND {_WINDOW_START}
  AND {RECORD_KEY} IN ({duplicate_replays(_WINDOW_REPLAY_JOBS)})
GROUP BY node, job_id
"""
FORWARDERS_SQL = f"""
SELECT node, sum(n) AS requests, sum(b) AS bytes,
       sum(b) / {{window_s:Float64}} AS bandwidth_b_s,
       sum(qw) / greatest(sum(n), 1) AS queue_wait_ns, quantilesBFloat16Merge(0.5, 0.99)(qwq)[2] AS queue_wait_p99_ns,
       sum(svc) / greatest(sum(n), 1) AS service_ns, quantilesBFloat16Merge(0.5, 0.99)(svcq)[2] AS service_p99_ns,
       length(groupUniqArrayArray(tgts)) AS targets, length(groupUniqArrayArray(cns)) AS compute_nodes,
       arraySlice(arraySort(x -> -x.2, groupArray((job_id, b))), 1, 20) AS _jobs
FROM
(
    SELECT r.node AS node, r.job_id AS job_id, toUInt64(greatest(toInt64(r.n) - toInt64(d.n), 0)) AS n,
           toUInt64(greatest(toInt64(r.b) - toInt64(d.b), 0)) AS b,
           toUInt64(greatest(toInt64(r.qw) - toInt64(d.qw), 0)) AS qw,
           toUInt64(greatest(toInt64(r.svc) - toInt64(d.svc), 0)) AS svc, r.qwq AS qwq,
           r.svcq AS svcq, r.tgts AS tgts, r.cns AS cns
    FROM
    (
        SELECT forwarding_node AS node, job_id, sum(ops) AS n, sum(bytes) AS b, sum(queue_wait_ns) AS qw,
               sum(service_ns) AS svc, quantilesBFloat16MergeState(0.5, 0.99)(queue_wait_quantiles) AS qwq,
               quantilesBFloat16MergeState(0.5, 0.99)(service_quantiles) AS svcq, groupUniqArray(target) AS tgts,
               groupUniqArrayArray(compute_nodes) AS cns
        FROM io_rollup_1s
        WHERE {ROLLUP_FWD_WINDOW}
        GROUP BY node, job_id
    ) AS r
    LEFT JOIN ({WINDOW_DUPLICATES_SQL}) AS d ON r.node = d.node AND r.job_id = d.job_id
)
GROUP BY node
ORDER BY node
"""


@dataclass(frozen=True)
class StoredAnomaly:
    """The newest state of one anomaly key in the ``anomalies`` table (RECENT_ANOMALIES_SQL).

    Times in ns since the epoch (None: not set); ``ratio`` dimensionless (x the peers' or the
    baseline's); ``cycles``: detection cycles that saw it; ``evidence`` as the detector stored it."""

    key: str
    kind: str
    node: str
    node_type: str
    job_id: str
    culprit_job: str
    persistence: str
    active: bool
    severity: str
    ratio: float
    onset_ns: int | None
    start_ns: int | None
    end_ns: int | None
    first_seen_ns: int | None
    last_seen_ns: int | None
    cycles: int
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FailSlowState:
    """An active fail-slow verdict on a node: what ``fail_slow`` of a target or forwarder says.
    ``ratio``: x the peers' median service time per byte; ``onset_ns``: start of the slow run;
    ``stall_added_ms``: for a forwarding node named by its waits (a stall: its ratio stays ~1),
    how much longer (ms) its requests wait than its peers' (:func:`~pharos_analytics.failslow.stall_added_ms`)."""

    persistence: str
    severity: str
    ratio: float | None
    onset_ns: int | None
    stall_added_ms: float | None = None


@dataclass(frozen=True)
class TargetLoad:
    """One storage target over the window (target_metrics): bytes, ``ops`` (data and metadata),
    B/s (mean over the window; ``peak_b_s`` the busiest interval), latencies in ns (median of the
    intervals' p50 and p99), ``queue_depth`` (mean), ``throttled_share`` 0-1, its limit in MB/s
    and injected faults (``slowdown`` x, ``added_latency_ns``), the forwarding nodes that used it."""

    target: str
    bandwidth_b_s: float
    peak_b_s: float
    bytes_read: int
    bytes_written: int
    ops: int
    latency_p50_ns: int
    latency_p99_ns: int
    latency_max_ns: int
    latency_mean_ns: int
    queue_depth: float
    throttled_share: float
    max_perf_mb_s: float
    slowdown: float
    added_latency_ns: int
    forwarding_nodes: list[str]
    last_ns: int | None


@dataclass(frozen=True)
class ForwarderLoad:
    """One forwarding node over the window (io_rollup_1s): requests, bytes, B/s, mean and p99
    queue wait and service in ns, distinct targets and compute nodes, and its 20 largest jobs
    as ``(job_id, bytes)``, largest first."""

    node: str
    requests: int
    bytes: int
    bandwidth_b_s: float
    queue_wait_ns: float
    queue_wait_p99_ns: float
    service_ns: float
    service_p99_ns: float
    targets: int
    compute_nodes: int
    jobs: list[tuple[str, int]]


class Detector(Protocol):
    """What :func:`failslow_state` reads of the running detection loop."""

    cycles: int
    last: dict[str, Any]


def _ns(v: Any) -> int | None:
    return None if v in (None, "") else int(v)


def _window_params(until: int, window_s: float) -> dict[str, Any]:
    """since/until/window_s parameters of TARGETS_SQL and FORWARDERS_SQL (since never before 1970)."""
    since = max(0, until - int(window_s * 1e9))
    return {"since": ns_to_datetime64(since), "until": ns_to_datetime64(until), "window_s": window_s}


def data_anchor(store: Store) -> int:
    """Now, or the newest stored interval (+1 ns) when the data end in the past."""
    now = time.time_ns()
    t = store.query(DATA_END_SQL)
    end = int(t[0]["t"] or 0) if t else 0
    return end + 1 if 0 < end < now - 5_000_000_000 else now


def _stored_anomaly(r: dict[str, Any]) -> StoredAnomaly:
    return StoredAnomaly(
        key=r["key"],
        kind=r["kind"],
        node=r["node"],
        node_type=r["node_type"],
        job_id=r["job_id"],
        culprit_job=r["culprit_job"],
        persistence=r["persistence"],
        active=bool(int(r["active"])),
        severity=r["severity"],
        ratio=float(r["ratio"]),
        onset_ns=_ns(r["onset_ns"]),
        start_ns=_ns(r.get("start_ns")),
        end_ns=_ns(r.get("end_ns")),
        first_seen_ns=_ns(r["first_seen_ns"]),
        last_seen_ns=_ns(r["last_seen_ns"]),
        cycles=int(r["cycles"]),
        evidence=json.loads(r["evidence"]) if r.get("evidence") else {},
    )


def recent_anomalies(
    store: Store,
    since_ns: int,
    limit: int,
    kind: str | None = None,
    node: str | None = None,
    job: str | None = None,
    active: bool | None = None,
) -> list[StoredAnomaly]:
    """The newest state of each anomaly detected since ``since_ns``, newest first, at most
    ``limit``; the filters (None: any) apply before the limit. ``job``: the slowed job or the
    culprit."""
    flt = {"kind": kind or "", "node": node or "", "job": job or "", "active": -1 if active is None else int(active)}
    rows = store.query(RECENT_ANOMALIES_SQL, {"since": ns_to_datetime64(since_ns), "limit": limit} | flt)
    return [_stored_anomaly(r) for r in rows]


def last_cycle_ns(store: Store, since_ns: int) -> int:
    """When the detector last stored anomalies since ``since_ns`` (ns; 0: never)."""
    t = store.query(LAST_CYCLE_SQL, {"since": ns_to_datetime64(since_ns)})
    return int(t[0]["t"] or 0) if t else 0


def live_anomalies(
    store: Store,
    cfg: DiagnosisConfig,
    until_ns: int,
    limit: int,
    kind: str | None = None,
    node: str | None = None,
    job: str | None = None,
    active: bool | None = None,
) -> list[Anomaly | InterferenceEvent]:
    """Fail-slow nodes then interference events detected now over the data up to ``until_ns``
    (seconds of work), filtered as :func:`recent_anomalies` (an interference event's node is its
    shared resource), at most ``limit``."""
    rep = detect_failslow(store, cfg, now_ns=until_ns)
    found: list[Anomaly | InterferenceEvent] = [*rep.anomalies, *detect_interference(store, cfg, until_ns=until_ns)]

    def keep(x: Anomaly | InterferenceEvent) -> bool:
        if isinstance(x, Anomaly):
            x_kind, x_node, x_jobs = x.kind, x.node, (None, None)
        else:
            x_kind, x_node, x_jobs = "interference", x.resource, (x.job_id, x.culprit_job)
        return (
            (kind is None or x_kind == kind)
            and (node is None or x_node == node)
            and (job is None or job in x_jobs)
            and (active is None or x.active == active)
        )

    return [x for x in found if keep(x)][:limit]


def failslow_state(
    store: Store, detector: Detector | None, cfg: DiagnosisConfig, kind: str, until: int
) -> tuple[dict[str, FailSlowState], str]:
    """node -> active fail-slow verdict of ``kind`` (``fail_slow_target`` | ``fail_slow_forwarder``),
    and where the verdict comes from: ``detector`` (the running loop's newest cycle) once it has
    run a cycle, else ``live`` (detected now up to ``until``)."""
    if detector is not None and detector.cycles:
        since = int(detector.last["time_ns"])
        found = recent_anomalies(store, since, 10000)
        return {
            a.node: FailSlowState(a.persistence, a.severity, a.ratio, a.onset_ns, stall_added_ms(a.evidence))
            for a in found
            if a.kind == kind and a.active
        }, "detector"
    rep = detect_failslow(store, cfg, now_ns=until, kinds=("target",) if kind == "fail_slow_target" else ("forwarder",))
    return {
        a.node: FailSlowState(a.persistence, a.severity, a.rel_service, a.onset_ns, stall_added_ms(a.evidence))
        for a in rep.anomalies
        if a.active
    }, "live"


def target_loads(store: Store, until: int, window_s: float) -> list[TargetLoad]:
    """Every storage target with metrics in the ``window_s`` seconds up to ``until`` (ns), by name."""
    return [
        TargetLoad(
            target=r["target"],
            bandwidth_b_s=float(r["bandwidth_b_s"]),
            peak_b_s=float(r["peak_b_s"]),
            bytes_read=int(r["bytes_read"]),
            bytes_written=int(r["bytes_written"]),
            ops=int(r["ops"]),
            latency_p50_ns=int(float(r["latency_p50_ns"])),
            latency_p99_ns=int(float(r["latency_p99_ns"])),
            latency_max_ns=int(r["latency_max_ns"]),
            latency_mean_ns=int(float(r["latency_mean_ns"])),
            queue_depth=float(r["queue_depth"]),
            throttled_share=float(r["throttled_share"] or 0),
            max_perf_mb_s=float(r["max_perf_mb_s"]),
            slowdown=float(r["slowdown"]),
            added_latency_ns=int(r["added_latency_ns"]),
            forwarding_nodes=sorted(r["forwarding_nodes"]),
            last_ns=_ns(r["last_ns"]),
        )
        for r in store.query(TARGETS_SQL, _window_params(until, window_s))
    ]


def forwarder_loads(store: Store, until: int, window_s: float) -> list[ForwarderLoad]:
    """Every forwarding node with requests in the ``window_s`` seconds up to ``until`` (ns), by name."""
    return [
        ForwarderLoad(
            node=r["node"],
            requests=int(r["requests"]),
            bytes=int(r["bytes"]),
            bandwidth_b_s=float(r["bandwidth_b_s"]),
            queue_wait_ns=float(r["queue_wait_ns"]),
            queue_wait_p99_ns=float(r["queue_wait_p99_ns"]),
            service_ns=float(r["service_ns"]),
            service_p99_ns=float(r["service_p99_ns"]),
            targets=int(r["targets"]),
            compute_nodes=int(r["compute_nodes"]),
            jobs=[(job_id, int(b)) for job_id, b in r["_jobs"]],
        )
        for r in store.query(FORWARDERS_SQL, _window_params(until, window_s))
    ]


# ======================================================================================
# System-side causes priced for one job (the insights catalogue's ``interference`` rule)


def interference_price(event: dict[str, Any], windows: list[dict[str, Any]], ranks: int) -> tuple[float, str]:
    """Seconds of a job's run time an interference event cost it, and how they were computed.

    ``event``: one event of :func:`pharos_analytics.interference.job_interference` (its
    ``start_ns``/``end_ns`` and ``baseline_latency_ms``, the latency per request of the job
    without the culprit); ``windows``: that function's ``shared_windows`` (per window of the
    job: ``start_ns``, ``requests``, ``latency_ms`` = mean queue wait + service per request at
    the forwarding layer); ``ranks``: the job's ranks that issue requests side by side.
    Price: over the event's windows, requests x (latency - baseline latency), divided by the
    ranks (each rank waits for its own share of the requests). Source: Pharos (the
    quiet-window baseline of :mod:`pharos_analytics.interference`)."""
    base = float(event["baseline_latency_ms"])
    ws = [w for w in windows if int(event["start_ns"]) <= int(w["start_ns"]) < int(event["end_ns"])]
    excess_ms = sum(int(w["requests"]) * max(float(w["latency_ms"]) - base, 0.0) for w in ws)
    r = max(ranks, 1)
    return excess_ms / 1e3 / r, (
        f"{sum(int(w['requests']) for w in ws)} requests x their latency above the baseline "
        f"({base:.3g} ms, {event['baseline_source']}), over {r} rank(s)"
    )
