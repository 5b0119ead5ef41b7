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
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.failslow import ROLLUP_FWD_WINDOW, detect_failslow
from pharos_analytics.interference import detect_interference, job_interference
from pharos_analytics.profiles import job_profiles
from pharos_pipeline.store import Store, ns_to_datetime64

from ..auth import OTHER_JOB, Principal, Reader, redact_job, user_jobs
from ..deps import StoreDep
from ..schemas import MAX_WINDOW_S, NAME_MAX, ErrorOut, JobIdPath
from .diagnosis import _known, _not_found

router = APIRouter(tags=["system diagnosis"])

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
#: reads it): the cost grows with seconds x nodes x targets x jobs, not with records.
FORWARDERS_SQL = f"""
SELECT node, sum(n) AS requests, sum(b) AS bytes,
       sum(b) / {{window_s:Float64}} AS bandwidth_b_s,
       sum(qw) / greatest(sum(n), 1) AS queue_wait_ns, quantilesBFloat16Merge(0.5, 0.99)(qwq)[2] AS queue_wait_p99_ns,
       sum(svc) / greatest(sum(n), 1) AS service_ns, quantilesBFloat16Merge(0.5, 0.99)(svcq)[2] AS service_p99_ns,
       length(groupUniqArrayArray(tgts)) AS targets, length(groupUniqArrayArray(cns)) AS compute_nodes,
       arraySlice(arraySort(x -> -x.2, groupArray((job_id, b))), 1, 20) AS _jobs
FROM
(
    SELECT forwarding_node AS node, job_id, sum(ops) AS n, sum(bytes) AS b, sum(queue_wait_ns) AS qw,
           sum(service_ns) AS svc, quantilesBFloat16MergeState(0.5, 0.99)(queue_wait_quantiles) AS qwq,
           quantilesBFloat16MergeState(0.5, 0.99)(service_quantiles) AS svcq, groupUniqArray(target) AS tgts,
           groupUniqArrayArray(compute_nodes) AS cns
    FROM io_rollup_1s
    WHERE {ROLLUP_FWD_WINDOW}
    GROUP BY node, job_id
)
GROUP BY node
ORDER BY node
"""


#: A status window: seconds, > 0 and at most 100 years (422 beyond); default DiagnosisConfig.status_window_s.
WindowS = Annotated[
    float | None,
    Query(gt=0, le=MAX_WINDOW_S, description="Window in seconds up to the newest data (<= 100 years)."),
]


def _window_params(until: int, window_s: float) -> dict[str, Any]:
    """since/until/window_s parameters of TARGETS_SQL and FORWARDERS_SQL (since never before 1970)."""
    since = max(0, until - int(window_s * 1e9))
    return {"since": ns_to_datetime64(since), "until": ns_to_datetime64(until), "window_s": window_s}


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
        since = ns_to_datetime64(int(loop.last["time_ns"]))
        rows = store.query(RECENT_ANOMALIES_SQL, {"since": since, "limit": 10000} | ANY_ANOMALY)
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
    "/v1/anomalies",
    operation_id="list_anomalies",
    responses={403: {"model": ErrorOut, "description": "live=true without the admin role."}},
    summary="Fail-slow nodes and interference: current and recent",
)
def list_anomalies(
    store: StoreDep,
    request: Request,
    principal: Reader,
    kind: Literal["fail_slow_target", "fail_slow_forwarder", "interference", "straggler_resource"] | None = None,
    node: Annotated[
        str | None, Query(max_length=NAME_MAX, description="Target, forwarding node or shared resource.")
    ] = None,
    job: Annotated[
        str | None, Query(max_length=NAME_MAX, description="Interference: the slowed job or the culprit.")
    ] = None,
    active: Annotated[bool | None, Query(description="Only active (true) or only cleared (false).")] = None,
    since_s: Annotated[
        float, Query(gt=0, le=MAX_WINDOW_S, description="Recent: detected in the last since_s seconds (<= 100 years).")
    ] = 3600.0,
    live: Annotated[
        bool,
        Query(description="Detect now over the tables instead of reading the detector's results (role admin)."),
    ] = False,
    limit: Annotated[int, Query(ge=1, le=10000, description="At most this many items (after the filters).")] = 200,
) -> dict[str, Any]:
    """``{source: detector | live, as_of, items: [...], detector}``; the filters apply before
    ``limit``. A ``user`` token sees other users' job ids as ``(other)``, no evidence of items
    naming them, and nothing for ``job`` = another user's job. ``live=true`` runs the detectors
    now (seconds of work): role admin, 403 otherwise."""
    if live and principal.role != "admin":
        raise HTTPException(403, "live=true runs the detectors now: it needs the admin role")
    mine = set() if principal.sees_all else user_jobs(store, principal.user)
    cfg = DiagnosisConfig()
    loop = getattr(request.app.state, "sysdiag", None)
    if job is not None and not principal.sees_all and job not in mine:  # as for a job without anomalies
        return {"source": "detector", "as_of": None, "items": [], "detector": loop.status() if loop else None}
    if live:
        until = _anchor(store)
        rep = detect_failslow(store, cfg, now_ns=until)
        evs = detect_interference(store, cfg, until_ns=until)
        items = [a.to_dict() | {"onset": _iso(a.onset_ns)} for a in rep.anomalies]
        items += [e.to_dict() | {"kind": "interference", "node": e.resource, "onset": _iso(e.start_ns)} for e in evs]
        items = [
            i
            for i in items
            if (kind is None or i["kind"] == kind)
            and (node is None or i.get("node") == node)
            and (job is None or job in (i.get("job_id"), i.get("culprit_job")))
            and (active is None or i["active"] == active)
        ][:limit]
        source, last = "live", until
    else:
        since = max(0, time.time_ns() - int(since_s * 1e9))
        flt = {
            "kind": kind or "",
            "node": node or "",
            "job": job or "",
            "active": -1 if active is None else int(active),
        }
        rows = store.query(RECENT_ANOMALIES_SQL, {"since": ns_to_datetime64(since), "limit": limit} | flt)
        items = [_anomaly_out(r) for r in rows]
        t = store.query(LAST_CYCLE_SQL, {"since": ns_to_datetime64(since)})
        last = int(t[0]["t"] or 0) if t else 0
        for it in items:  # current = seen in the newest cycle and active
            it["current"] = it["active"] and it["last_seen"] == _iso(last)
        source = "detector"
    if not principal.sees_all:
        items = [_redact_anomaly(principal, i, mine) for i in items]
    return {
        "source": source,
        "as_of": _iso(last),
        "items": items,
        "detector": loop.status() if loop is not None else None,
    }


def _redact_anomaly(principal: Principal, item: dict, mine: set[str]) -> dict:
    """An anomaly as a ``user`` token sees it: other users' job ids replaced by ``(other)``, the
    evidence (which may name jobs) dropped unless every job it is about is theirs."""
    out = dict(item)
    foreign = False
    for k in ("job_id", "culprit_job"):
        if out.get(k):
            out[k] = redact_job(principal, out[k], mine)
            foreign |= out[k] == OTHER_JOB
    if "co_located" in out:
        out["co_located"] = sorted({redact_job(principal, j, mine) for j in out["co_located"]})
        foreign |= OTHER_JOB in out["co_located"]
    if foreign or not out.get("job_id"):
        out["evidence"] = {}
        if str(out.get("baseline_source", "")).startswith("previous_run:"):
            out["baseline_source"] = "previous_run"
    return out


@router.get(
    "/v1/targets",
    operation_id="list_targets",
    summary="Storage targets: recent bandwidth, latency, limits, faults, fail-slow state",
)
def list_targets(store: StoreDep, request: Request, _: Reader, window_s: WindowS = None) -> dict[str, Any]:
    """``{window_s, until, state_source, items: [...]}``: per target, bytes, B/s, latency in ns,
    limits (MB/s), faults, forwarding nodes, fail-slow state. No job ids: every reading role."""
    cfg = DiagnosisConfig()
    w = window_s or cfg.status_window_s
    until = _anchor(store)
    rows = store.query(TARGETS_SQL, _window_params(until, w))
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
def list_forwarders(store: StoreDep, request: Request, principal: Reader, window_s: WindowS = None) -> dict[str, Any]:
    """``{window_s, until, state_source, items: [...]}``: per forwarding node, requests, bytes,
    B/s, queue wait and service in ns, its 20 largest jobs by bytes (a ``user`` token: its own
    jobs, the others' bytes summed under ``(other)``), fail-slow state."""
    cfg = DiagnosisConfig()
    w = window_s or cfg.status_window_s
    until = _anchor(store)
    rows = store.query(FORWARDERS_SQL, _window_params(until, w))
    mine = set() if principal.sees_all else user_jobs(store, principal.user)
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
        if not principal.sees_all:
            others = sum(j["bytes"] for j in jobs if j["job_id"] not in mine)
            jobs = [j for j in jobs if j["job_id"] in mine] + (
                [{"job_id": OTHER_JOB, "bytes": others}] if others else []
            )
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
def get_job_interference(job_id: JobIdPath, store: StoreDep, principal: Reader) -> dict[str, Any]:
    """``{job_id, window_s, events, shared_windows, note}``; a ``user`` token (its own jobs
    only: 404 otherwise) sees the other jobs as ``(other)``."""
    if not _known(store, job_id, principal):
        raise _not_found(job_id)
    out = job_interference(store, job_id, DiagnosisConfig())
    mine = set() if principal.sees_all else user_jobs(store, principal.user)
    if not principal.sees_all:
        out["events"] = [_redact_anomaly(principal, e, mine) for e in out["events"]]
    for e in out["events"]:
        e["start"], e["end"] = _iso(e["start_ns"]), _iso(e["end_ns"])
    for w in out["shared_windows"]:
        w["start"] = _iso(w["start_ns"])
        if not principal.sees_all:
            for sh in w["shared"]:
                jobs: dict[str, int] = {}
                for j, b in sh["jobs"].items():
                    k = redact_job(principal, j, mine)
                    jobs[k] = jobs.get(k, 0) + b
                sh["jobs"] = jobs
    return out


@router.get("/v1/profiles", operation_id="list_profiles", summary="Job profiles per name and user, from history")
def list_profiles(
    store: StoreDep,
    principal: Reader,
    name: Annotated[str | None, Query(max_length=NAME_MAX, description="Only this job name.")] = None,
    user: Annotated[str | None, Query(max_length=NAME_MAX, description="Only this user.")] = None,
) -> dict[str, Any]:
    """``{items: [profile]}`` (pharos_analytics.profiles.JobProfile: runs, job ids, stats with
    units). A ``user`` token gets its own profiles only."""
    if not principal.sees_all:
        if user not in (None, principal.user):
            return {"items": []}
        user = principal.user
    return {"items": [p.to_dict() for p in job_profiles(store, name=name, user=user)]}
