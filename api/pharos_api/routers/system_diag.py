"""System-side diagnosis: fail-slow targets and forwarding nodes, interference, job profiles.

``GET /v1/anomalies``: current and recent anomalies (fail-slow nodes, interference events,
and ``straggler_resource`` rows: a storage target / OST / forwarding node that a job's own
slow files shared, stored by the Darshan import and by the detection loop for ended jobs,
``job_id`` the job, ``start``/``end`` its I/O time range) as stored in the ``anomalies``
table, or computed now (``live=true``; fail-slow and interference only). ``GET /v1/targets`` and ``GET /v1/forwarders``: recent load, latency, limits,
injected faults and fail-slow state per target / forwarding node. ``GET
/v1/jobs/{id}/interference``: the jobs that shared a job's forwarding nodes and targets and
what it cost it. ``GET /v1/profiles``: per job name and user, from history.

"Recent" ends at the newest stored interval when the data are older than the wall clock
(imported or replayed history), else now. Thresholds: ``DiagnosisConfig()`` per request.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.failslow import detect_failslow
from pharos_analytics.interference import detect_interference, job_interference
from pharos_analytics.profiles import job_profiles
from pharos_pipeline.store import Store, ns_to_datetime64

from ..deps import StoreDep
from ..schemas import ErrorOut
from .diagnosis import _known, _not_found

router = APIRouter(tags=["system diagnosis"])

RECENT_ANOMALIES_SQL = """
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
ORDER BY last_seen_ns DESC, key
LIMIT {limit:UInt32}
"""
LAST_CYCLE_SQL = (
    "SELECT toUnixTimestamp64Nano(max(detected)) AS t FROM anomalies WHERE detected >= {since:DateTime64(9)}"
)
DATA_END_SQL = """
SELECT greatest((SELECT toUnixTimestamp64Nano(max(time)) FROM target_metrics),
                (SELECT toUnixTimestamp64Nano(max(start)) FROM io_requests WHERE layer = 'forwarder')) AS t
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

FORWARDERS_SQL = """
SELECT fwd AS node, sum(n) AS requests, sum(b) AS bytes,
       sum(b) / {window_s:Float64} AS bandwidth_b_s,
       sum(qw) / greatest(sum(n), 1) AS queue_wait_ns, quantile(0.99)(qw) AS queue_wait_p99_ns,
       sum(svc) / greatest(sum(n), 1) AS service_ns, quantile(0.99)(svc) AS service_p99_ns,
       uniqExact(tgt) AS targets, uniqExact(cn) AS compute_nodes,
       arraySlice(arraySort(x -> -x.2, groupUniqArray((job, jb))), 1, 20) AS _jobs
FROM
(
    SELECT forwarding_node AS fwd, target AS tgt, compute_node AS cn, job_id AS job, count AS n, bytes AS b,
           queue_wait_ns AS qw, duration_ns AS svc, sum(bytes) OVER (PARTITION BY forwarding_node, job_id) AS jb
    FROM io_requests
    WHERE layer = 'forwarder' AND forwarding_node != '' AND start > {since:DateTime64(9)} AND start <= {until:DateTime64(9)}
)
GROUP BY fwd
ORDER BY fwd
"""


def _iso(ns: int | None) -> str | None:
    if not ns:
        return None
    return datetime.fromtimestamp(int(ns) / 1e9, UTC).isoformat().replace("+00:00", "Z")


def _anchor(store: Store) -> int:
    """Now, or the newest stored interval (+1 ns) when the data end in the past."""
    now = time.time_ns()
    t = store.query(DATA_END_SQL)
    end = int(t[0]["t"] or 0) if t else 0
    return end + 1 if 0 < end < now - 5_000_000_000 else now


def _failslow_state(
    store: Store, request: Request, cfg: DiagnosisConfig, kind: str, until: int
) -> tuple[dict[str, dict], str]:
    """node -> anomaly dict (active ones), and where the verdict comes from ('detector' | 'live')."""
    loop = getattr(request.app.state, "sysdiag", None)
    if loop is not None and loop.cycles:
        rows = store.query(RECENT_ANOMALIES_SQL, {"since": ns_to_datetime64(int(loop.last["time_ns"])), "limit": 10000})
        return {r["node"]: _anomaly_out(r) for r in rows if r["kind"] == kind and int(r["active"])}, "detector"
    rep = detect_failslow(store, cfg, now_ns=until, kinds=("target",) if kind == "fail_slow_target" else ("forwarder",))
    return {a.node: a.to_dict() for a in rep.anomalies if a.active}, "live"


def _anomaly_out(r: dict) -> dict:
    ev = json.loads(r["evidence"]) if r.get("evidence") else {}
    return {
        "key": r["key"],
        "kind": r["kind"],
        "node": r["node"],
        "node_type": r["node_type"],
        "job_id": r["job_id"],
        "culprit_job": r["culprit_job"],
        "persistence": r["persistence"],
        "active": bool(int(r["active"])),
        "severity": r["severity"],
        "ratio": float(r["ratio"]),
        "onset": _iso(r["onset_ns"]),
        "start": _iso(r.get("start_ns")),
        "end": _iso(r.get("end_ns")),
        "first_seen": _iso(r["first_seen_ns"]),
        "last_seen": _iso(r["last_seen_ns"]),
        "cycles": int(r["cycles"]),
        "evidence": ev,
    }


@router.get(
    "/v1/anomalies", operation_id="list_anomalies", summary="Fail-slow nodes and interference: current and recent"
)
def list_anomalies(
    store: StoreDep,
    request: Request,
    kind: Literal["fail_slow_target", "fail_slow_forwarder", "interference", "straggler_resource"] | None = None,
    node: str | None = Query(default=None, description="Target, forwarding node or shared resource."),
    job: str | None = Query(default=None, description="Interference: the slowed job or the culprit."),
    active: bool | None = Query(default=None, description="Only active (true) or only cleared (false)."),
    since_s: float = Query(default=3600.0, gt=0, description="Recent: detected in the last since_s seconds."),
    live: bool = Query(
        default=False, description="Detect now over the tables instead of reading the detector's results."
    ),
    limit: int = Query(default=200, ge=1, le=10000),
) -> dict[str, Any]:
    cfg = DiagnosisConfig()
    loop = getattr(request.app.state, "sysdiag", None)
    if live:
        until = _anchor(store)
        rep = detect_failslow(store, cfg, now_ns=until)
        evs = detect_interference(store, cfg, until_ns=until)
        items = [a.to_dict() | {"onset": _iso(a.onset_ns)} for a in rep.anomalies]
        items += [e.to_dict() | {"kind": "interference", "node": e.resource, "onset": _iso(e.start_ns)} for e in evs]
        source, last = "live", until
    else:
        since = time.time_ns() - int(since_s * 1e9)
        rows = store.query(RECENT_ANOMALIES_SQL, {"since": ns_to_datetime64(since), "limit": limit})
        items = [_anomaly_out(r) for r in rows]
        t = store.query(LAST_CYCLE_SQL, {"since": ns_to_datetime64(since)})
        last = int(t[0]["t"] or 0) if t else 0
        for it in items:  # current = seen in the newest cycle and active
            it["current"] = it["active"] and it["last_seen"] == _iso(last)
        source = "detector"
    items = [
        i
        for i in items
        if (kind is None or i["kind"] == kind)
        and (node is None or i.get("node") == node)
        and (job is None or job in (i.get("job_id"), i.get("culprit_job")))
        and (active is None or i["active"] == active)
    ]
    return {
        "source": source,
        "as_of": _iso(last),
        "items": items[:limit],
        "detector": loop.status() if loop is not None else None,
    }


@router.get(
    "/v1/targets",
    operation_id="list_targets",
    summary="Storage targets: recent bandwidth, latency, limits, faults, fail-slow state",
)
def list_targets(
    store: StoreDep, request: Request, window_s: float | None = Query(default=None, gt=0)
) -> dict[str, Any]:
    cfg = DiagnosisConfig()
    w = window_s or cfg.status_window_s
    until = _anchor(store)
    rows = store.query(
        TARGETS_SQL, {"since": ns_to_datetime64(until - int(w * 1e9)), "until": ns_to_datetime64(until), "window_s": w}
    )
    state, source = _failslow_state(store, request, cfg, "fail_slow_target", until)
    items = []
    for r in rows:
        a = state.get(r["target"])
        items.append(
            {
                "target": r["target"],
                "bandwidth_b_s": float(r["bandwidth_b_s"]),
                "peak_b_s": float(r["peak_b_s"]),
                "bytes_read": int(r["bytes_read"]),
                "bytes_written": int(r["bytes_written"]),
                "ops": int(r["ops"]),
                "latency_p50_ns": int(float(r["latency_p50_ns"])),
                "latency_p99_ns": int(float(r["latency_p99_ns"])),
                "latency_max_ns": int(r["latency_max_ns"]),
                "latency_mean_ns": int(float(r["latency_mean_ns"])),
                "queue_depth": float(r["queue_depth"]),
                "throttled_share": float(r["throttled_share"] or 0),
                "limits": {"max_perf_mb_s": float(r["max_perf_mb_s"])},
                "faults": {"slowdown": float(r["slowdown"]), "added_latency_ns": int(r["added_latency_ns"])},
                "forwarding_nodes": sorted(r["forwarding_nodes"]),
                "last_interval": _iso(r["last_ns"]),
                "fail_slow": None
                if a is None
                else {
                    "persistence": a["persistence"],
                    "severity": a["severity"],
                    "ratio": a.get("ratio", a.get("rel_service")),
                    "onset": a.get("onset") or _iso(a.get("onset_ns")),
                },
                "state": "ok" if a is None else "fail_slow",
            }
        )
    return {"window_s": w, "until": _iso(until), "state_source": source, "items": items}


@router.get(
    "/v1/forwarders", operation_id="list_forwarders", summary="Forwarding nodes: recent load, jobs, fail-slow state"
)
def list_forwarders(
    store: StoreDep, request: Request, window_s: float | None = Query(default=None, gt=0)
) -> dict[str, Any]:
    cfg = DiagnosisConfig()
    w = window_s or cfg.status_window_s
    until = _anchor(store)
    rows = store.query(
        FORWARDERS_SQL,
        {"since": ns_to_datetime64(until - int(w * 1e9)), "until": ns_to_datetime64(until), "window_s": w},
    )
    state, source = _failslow_state(store, request, cfg, "fail_slow_forwarder", until)
    items = []
    for r in rows:
        a = state.get(r["node"])
        jobs = [
            {
                "job_id": j[0] if isinstance(j, (list, tuple)) else j["1"],
                "bytes": int(j[1] if isinstance(j, (list, tuple)) else j["2"]),
            }
            for j in r["_jobs"]
        ]
        items.append(
            {
                "node": r["node"],
                "requests": int(r["requests"]),
                "bytes": int(r["bytes"]),
                "bandwidth_b_s": float(r["bandwidth_b_s"]),
                "queue_wait_ns": float(r["queue_wait_ns"]),
                "queue_wait_p99_ns": float(r["queue_wait_p99_ns"]),
                "service_ns": float(r["service_ns"]),
                "service_p99_ns": float(r["service_p99_ns"]),
                "targets": int(r["targets"]),
                "compute_nodes": int(r["compute_nodes"]),
                "jobs": jobs,
                "fail_slow": None
                if a is None
                else {
                    "persistence": a["persistence"],
                    "severity": a["severity"],
                    "ratio": a.get("ratio", a.get("rel_service")),
                    "onset": a.get("onset") or _iso(a.get("onset_ns")),
                },
                "state": "ok" if a is None else "fail_slow",
            }
        )
    return {"window_s": w, "until": _iso(until), "state_source": source, "items": items}


@router.get(
    "/v1/jobs/{job_id}/interference",
    operation_id="get_job_interference",
    responses={404: {"model": ErrorOut}},
    summary="Jobs that shared this job's forwarding nodes and targets, and what it cost it",
)
def get_job_interference(job_id: str, store: StoreDep) -> dict[str, Any]:
    if not _known(store, job_id):
        raise _not_found(job_id)
    out = job_interference(store, job_id, DiagnosisConfig())
    for e in out["events"]:
        e["start"], e["end"] = _iso(e["start_ns"]), _iso(e["end_ns"])
    for w in out["shared_windows"]:
        w["start"] = _iso(w["start_ns"])
    return out


@router.get("/v1/profiles", operation_id="list_profiles", summary="Job profiles per name and user, from history")
def list_profiles(store: StoreDep, name: str | None = None, user: str | None = None) -> dict[str, Any]:
    return {"items": [p.to_dict() for p in job_profiles(store, name=name, user=user)]}
