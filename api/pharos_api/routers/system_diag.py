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
(imported or replayed history), else now. Thresholds: ``DiagnosisConfig()`` per request. The SQL
and the reading of rows are :mod:`pharos_analytics.system_diag`'s; this module maps its results to
JSON and hides other users' jobs from a ``user`` token.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.failslow import Anomaly
from pharos_analytics.interference import InterferenceEvent, job_interference
from pharos_analytics.profiles import job_profiles
from pharos_analytics.system_diag import (
    FailSlowState,
    ForwarderLoad,
    StoredAnomaly,
    TargetLoad,
    data_anchor,
    failslow_state,
    forwarder_loads,
    last_cycle_ns,
    live_anomalies,
    recent_anomalies,
    target_loads,
)

from ..auth import OTHER_JOB, Principal, Reader, redact_job, user_jobs
from ..deps import StoreDep, require_job
from ..schemas.common import MAX_WINDOW_S, NAME_MAX, NOT_FOUND, ErrorOut, JobIdPath
from . import V1

router = APIRouter(prefix=V1, tags=["system diagnosis"])

#: A status window: seconds, > 0 and at most 100 years (422 beyond); default DiagnosisConfig.status_window_s.
WindowS = Annotated[
    float | None,
    Query(gt=0, le=MAX_WINDOW_S, description="Window in seconds up to the newest data (<= 100 years)."),
]


def _iso(ns: int | None) -> str | None:
    if not ns:
        return None
    return datetime.fromtimestamp(int(ns) / 1e9, UTC).isoformat().replace("+00:00", "Z")


def _anomaly_out(a: StoredAnomaly) -> dict[str, Any]:
    return {
        "key": a.key,
        "kind": a.kind,
        "node": a.node,
        "node_type": a.node_type,
        "job_id": a.job_id,
        "culprit_job": a.culprit_job,
        "persistence": a.persistence,
        "active": a.active,
        "severity": a.severity,
        "ratio": a.ratio,
        "onset": _iso(a.onset_ns),
        "start": _iso(a.start_ns),
        "end": _iso(a.end_ns),
        "first_seen": _iso(a.first_seen_ns),
        "last_seen": _iso(a.last_seen_ns),
        "cycles": a.cycles,
        "evidence": a.evidence,
    }


def _live_anomaly_out(x: Anomaly | InterferenceEvent) -> dict[str, Any]:
    if isinstance(x, Anomaly):
        return x.to_dict() | {"onset": _iso(x.onset_ns)}
    return x.to_dict() | {"kind": "interference", "node": x.resource, "onset": _iso(x.start_ns)}


def _fail_slow_out(state: FailSlowState | None) -> dict[str, Any]:
    """The ``fail_slow`` and ``state`` members of a target or forwarding node."""
    if state is None:
        return {"fail_slow": None, "state": "ok"}
    verdict = {
        "persistence": state.persistence,
        "severity": state.severity,
        "ratio": state.ratio,
        "stall_added_ms": state.stall_added_ms,
    }
    return {"fail_slow": verdict | {"onset": _iso(state.onset_ns)}, "state": "fail_slow"}


@router.get(
    "/anomalies",
    operation_id="list_anomalies",
    responses={403: {"model": ErrorOut, "description": "live=true without the admin role."}},
    summary="Fail-slow nodes and interference: current and recent",
)
def list_anomalies(
    store: StoreDep,
    request: Request,
    principal: Reader,
    kind: Literal[
        "fail_slow_target",
        "fail_slow_forwarder",
        "forwarder_silent",
        "broker_unreachable",
        "network_slow",
        "interference",
        "straggler_resource",
    ]
    | None = None,
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
    flt = {"kind": kind, "node": node, "job": job, "active": active}
    if live:
        until = data_anchor(store)
        items = [_live_anomaly_out(x) for x in live_anomalies(store, cfg, until, limit, **flt)]
        source, last = "live", until
    else:
        since = max(0, time.time_ns() - int(since_s * 1e9))
        items = [_anomaly_out(a) for a in recent_anomalies(store, since, limit, **flt)]
        last = last_cycle_ns(store, since)
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


def _target_out(t: TargetLoad, state: FailSlowState | None) -> dict[str, Any]:
    return {
        "target": t.target,
        "bandwidth_b_s": t.bandwidth_b_s,
        "peak_b_s": t.peak_b_s,
        "bytes_read": t.bytes_read,
        "bytes_written": t.bytes_written,
        "ops": t.ops,
        "latency_p50_ns": t.latency_p50_ns,
        "latency_p99_ns": t.latency_p99_ns,
        "latency_max_ns": t.latency_max_ns,
        "latency_mean_ns": t.latency_mean_ns,
        "queue_depth": t.queue_depth,
        "throttled_share": t.throttled_share,
        "limits": {"max_perf_mb_s": t.max_perf_mb_s},
        "faults": {"slowdown": t.slowdown, "added_latency_ns": t.added_latency_ns},
        "forwarding_nodes": t.forwarding_nodes,
        "last_interval": _iso(t.last_ns),
    } | _fail_slow_out(state)


def _forwarder_out(f: ForwarderLoad, state: FailSlowState | None, principal: Principal, mine: set[str]) -> dict:
    """A ``user`` token sees its own jobs, the others' bytes summed under ``(other)``."""
    jobs = [{"job_id": j, "bytes": b} for j, b in f.jobs]
    if not principal.sees_all:
        others = sum(j["bytes"] for j in jobs if j["job_id"] not in mine)
        jobs = [j for j in jobs if j["job_id"] in mine] + ([{"job_id": OTHER_JOB, "bytes": others}] if others else [])
    return {
        "node": f.node,
        "requests": f.requests,
        "bytes": f.bytes,
        "bandwidth_b_s": f.bandwidth_b_s,
        "queue_wait_ns": f.queue_wait_ns,
        "queue_wait_p99_ns": f.queue_wait_p99_ns,
        "service_ns": f.service_ns,
        "service_p99_ns": f.service_p99_ns,
        "targets": f.targets,
        "compute_nodes": f.compute_nodes,
        "jobs": jobs,
    } | _fail_slow_out(state)


@router.get(
    "/targets",
    operation_id="list_targets",
    summary="Storage targets: recent bandwidth, latency, limits, faults, fail-slow state",
)
def list_targets(store: StoreDep, request: Request, _: Reader, window_s: WindowS = None) -> dict[str, Any]:
    """``{window_s, until, state_source, items: [...]}``: per target, bytes, B/s, latency in ns,
    limits (MB/s), faults, forwarding nodes, fail-slow state. No job ids: every reading role."""
    cfg = DiagnosisConfig()
    w = window_s or cfg.status_window_s
    until = data_anchor(store)
    loads = target_loads(store, until, w)
    detector = getattr(request.app.state, "sysdiag", None)
    state, source = failslow_state(store, detector, cfg, "fail_slow_target", until)
    items = [_target_out(t, state.get(t.target)) for t in loads]
    return {"window_s": w, "until": _iso(until), "state_source": source, "items": items}


@router.get(
    "/forwarders", operation_id="list_forwarders", summary="Forwarding nodes: recent load, jobs, fail-slow state"
)
def list_forwarders(store: StoreDep, request: Request, principal: Reader, window_s: WindowS = None) -> dict[str, Any]:
    """``{window_s, until, state_source, items: [...]}``: per forwarding node, requests, bytes,
    B/s, queue wait and service in ns, its 20 largest jobs by bytes (a ``user`` token: its own
    jobs, the others' bytes summed under ``(other)``), fail-slow state."""
    cfg = DiagnosisConfig()
    w = window_s or cfg.status_window_s
    until = data_anchor(store)
    loads = forwarder_loads(store, until, w)
    mine = set() if principal.sees_all else user_jobs(store, principal.user)
    detector = getattr(request.app.state, "sysdiag", None)
    state, source = failslow_state(store, detector, cfg, "fail_slow_forwarder", until)
    items = [_forwarder_out(f, state.get(f.node), principal, mine) for f in loads]
    return {"window_s": w, "until": _iso(until), "state_source": source, "items": items}


@router.get(
    "/jobs/{job_id}/interference",
    operation_id="get_job_interference",
    responses=NOT_FOUND,
    summary="Jobs that shared this job's forwarding nodes and targets, and what it cost it",
)
def get_job_interference(job_id: JobIdPath, store: StoreDep, principal: Reader) -> dict[str, Any]:
    """``{job_id, window_s, events, shared_windows, note}``; a ``user`` token (its own jobs
    only: 404 otherwise) sees the other jobs as ``(other)``."""
    require_job(store, job_id, principal)
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


@router.get("/profiles", operation_id="list_profiles", summary="Job profiles per name and user, from history")
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
