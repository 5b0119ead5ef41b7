"""The control loop over HTTP: DFRA hints, the audit trail of actions, admins' pins.

* ``POST /v1/hints/jobs/{job_id}`` (claim; roles admin, scheduler): the job's DFRA decision
  (forwarding nodes, class, reason, evidence), taken now if it has none: recorded, reserved
  nodes held for the job (leased: returned when it ends or its lease expires, docs/security.md
  "Leases"; dry run: none held), ``apply=true`` also pushes the mapping to every mount at once.
  What the Slurm plugin's prolog and ``pharos run`` call, before the job's first I/O. A job
  with no start event needs ``name`` (and ``user``, ``command``; ``ranks``): 404 otherwise.
* ``GET /v1/hints/jobs/{job_id}`` (read; admin, operator, scheduler, and a ``user`` token for
  its own job: 404 for another's): the recorded decision (``decided`` true), else the decision
  the job would get now (``decided`` false). The same query parameters as the claim; records
  nothing, holds nothing, pushes nothing (``apply`` is accepted and ignored).
* ``GET /v1/hints?name=&user=&command=``: the decision a job not started yet would get
  (nothing recorded, nothing held).
* ``GET /v1/hints/classes``: the class of every (user, job name) with history, from data at
  hand (no call to a mount or daemon per item), at most 10,000 items.
* ``GET /v1/control/actions``: every decision and push (``control_actions``), newest first,
  among them ``release`` and ``lease_expired`` (reserved nodes returned).
* ``GET /v1/control/pins``, ``PUT``/``DELETE /v1/control/pins/jobs/{job_id}`` (a job's
  forwarding nodes) and ``/v1/control/pins/pools/{pool}`` (a placement pool): the loop never
  changes what is pinned.
* ``GET /v1/control/migrations``: online migrations off fail-slow targets (issue 27; GVDS MODM):
  every daemon's tasks (``GET /migrations``: state, source and destination target, bytes done
  and left, allocated and achieved MB/s) and settings, and the loop's plannings
  (pharos_analytics.control.migration). ``PUT``/``DELETE
  /v1/control/migrations/{daemon}/{id}`` (admin): pin, re-prioritise or cancel a task on its
  daemon, recorded (``migration_change``, ``migration_cancel``); in dry run recorded only.

No hint route waits on an admin interface that does not answer: they read the kept view of the
forwarding layer (pharos_analytics.control.liveness), and a claim's pushes are bounded by
``[control] liveness_timeout_s`` (0.5 s), so a hint answers within the Slurm plugin's 2 s with
a daemon that accepts connections and never answers.

The loop is ``app.state.control`` (``pharos serve``); without it (tests, a stand-alone API) a
loop that is never started serves the requests with the same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from pharos_analytics.control.loop import ControlError, ControlLoop
from pharos_analytics.control.migration import FINISHED, MigrationCallError

from ..auth import Admin, HintReader, SchedulerCall, Staff, check_job
from ..deps import SettingsDep, StoreDep, require_found
from ..schemas.common import MAX_WINDOW_S, NAME_MAX, NOT_FOUND, ErrorOut, JobIdPath
from ..schemas.control import (
    KINDS,
    ActionsOut,
    DaemonName,
    HintOut,
    IoClassesOut,
    JobPinIn,
    MigrationCallOut,
    MigrationChangeIn,
    MigrationsOut,
    PinOut,
    PinsOut,
    PoolName,
    PoolPinIn,
    TaskId,
)
from . import V1

router = APIRouter(prefix=V1, tags=["control"])

#: At most this many items of ``GET /v1/hints/classes``.
CLASSES_MAX = 10000


def _iso(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


def get_loop(request: Request, store, settings) -> ControlLoop:
    """The serving process's loop, or one built on demand (never started) and kept on the app."""
    loop = getattr(request.app.state, "control", None)
    if loop is None:
        loop = getattr(request.app.state, "control_on_demand", None)
        if loop is None:
            loop = ControlLoop(store, settings, detector=getattr(request.app.state, "sysdiag", None))
            request.app.state.control_on_demand = loop
    return loop


@dataclass
class HintQuery:
    """The query parameters of a job's hint, the same for the claim (POST) and the read (GET)."""

    name: Annotated[str | None, Query(max_length=256, description="Job name, for a job without a start event.")] = None
    user: Annotated[str | None, Query(max_length=256)] = None
    command: Annotated[list[str] | None, Query(max_length=256, description="argv, one parameter per word.")] = None
    apply: Annotated[bool, Query(description="Claim: push the mapping to the mounts now. Read: ignored.")] = False
    ranks: Annotated[
        int | None, Query(ge=1, description="The job's ranks, for a job without a start event (learned class).")
    ] = None


HintParams = Annotated[HintQuery, Depends()]


@router.post(
    "/hints/jobs/{job_id}",
    operation_id="claim_job_hint",
    response_model=HintOut,
    response_model_by_alias=True,
    responses=NOT_FOUND,
    summary="Claim a job's DFRA decision: recorded, reserved nodes held, mapping pushed (apply), before its first I/O",
)
def claim_job_hint(
    job_id: JobIdPath, request: Request, store: StoreDep, settings: SettingsDep, _: SchedulerCall, q: HintParams
) -> dict[str, Any]:
    """Records the decision and may hold reserved nodes, so a control action: roles admin and
    scheduler (the Slurm plugin's prolog, ``pharos run``). A second claim returns the recorded
    decision (``new`` false). 404: no decision, no start event and no ``name``."""
    try:
        loop = get_loop(request, store, settings)
        return loop.hint(job_id, q.name, q.user, q.command, apply=q.apply, ranks=q.ranks)
    except ControlError as exc:
        raise HTTPException(404, str(exc)) from None


@router.get(
    "/hints/jobs/{job_id}",
    operation_id="get_job_hint",
    response_model=HintOut,
    response_model_by_alias=True,
    responses=NOT_FOUND,
    summary="A job's DFRA decision (recorded, else what it would get now): reading changes nothing",
)
def get_job_hint(
    job_id: JobIdPath, request: Request, store: StoreDep, settings: SettingsDep, principal: HintReader, q: HintParams
) -> dict[str, Any]:
    """Records nothing, holds nothing, pushes nothing. Roles admin, operator, scheduler; a
    ``user`` token for its own job only (404 for another's, as other job routes). 404: no
    decision, no start event and no ``name``."""
    check_job(principal, store, job_id)
    try:
        return get_loop(request, store, settings).read_hint(job_id, q.name, q.user, q.command, ranks=q.ranks)
    except ControlError as exc:
        raise HTTPException(404, str(exc)) from None


@router.get(
    "/hints",
    operation_id="get_hint_by_identity",
    response_model=HintOut,
    response_model_by_alias=True,
    summary="DFRA decision a job not started yet would get (by name, user, command)",
)
def get_hint(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    principal: HintReader,
    name: Annotated[str, Query(min_length=1, max_length=NAME_MAX)],
    user: Annotated[str, Query(max_length=NAME_MAX)] = "",
    command: Annotated[list[str] | None, Query(max_length=256)] = None,
    ranks: Annotated[int | None, Query(ge=1, description="The job's ranks (learned class).")] = None,
) -> dict[str, Any]:
    """Nothing recorded. A ``user`` token previews its own jobs only (``user`` is its name; 403
    for another user)."""
    if not principal.sees_all:
        if user not in ("", principal.user):
            raise HTTPException(403, "a user token previews the hints of its own user only")
        user = principal.user
    return get_loop(request, store, settings).preview(name, user, command, ranks=ranks)


@router.get(
    "/hints/classes",
    operation_id="list_io_classes",
    response_model=IoClassesOut,
    response_model_by_alias=True,
    summary="Predicted I/O class of each (user, job name) with history: what the scheduler tags jobs with",
)
def list_io_classes(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    principal: HintReader,
    since_s: Annotated[float, Query(gt=0, le=MAX_WINDOW_S, description="History of the last seconds.")] = (
        30 * 86400.0
    ),
    limit: Annotated[int, Query(ge=1, le=CLASSES_MAX)] = CLASSES_MAX,
) -> dict[str, Any]:
    """The DFRA class (default | more_nodes | dedicated; Ji et al., FAST'19 §3) a job of each
    (user, name) in the history would get now, and its usual pattern: read by the Slurm
    job_submit.lua (agents/slurm) through the file ``pharos slurm classes`` writes. Bounded:
    computed from the stored metrics and the kept view of the forwarding layer, no call to a
    mount or daemon per item, at most ``limit`` (10,000) items, largest total bytes first. A
    ``user`` token gets its own (user, name) pairs only."""
    since = max(0, time.time_ns() - int(since_s * 1e9))
    user = None if principal.sees_all else principal.user
    return {"items": get_loop(request, store, settings).io_classes(since, user, limit)}


@router.get(
    "/control/actions",
    operation_id="list_control_actions",
    response_model=ActionsOut,
    summary="Decisions and pushes of the control loop, newest first",
)
def list_actions(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    _: Staff,
    job: Annotated[str | None, Query(max_length=NAME_MAX)] = None,
    kind: Annotated[Literal[KINDS] | None, Query()] = None,  # type: ignore[valid-type]
    since_s: Annotated[float, Query(gt=0, le=MAX_WINDOW_S, description="Recorded in the last seconds.")] = 86400.0,
    limit: Annotated[int, Query(ge=1, le=10000)] = 100,
) -> dict[str, Any]:
    loop = get_loop(request, store, settings)
    since = max(0, time.time_ns() - int(since_s * 1e9))
    items = loop.actions(job, kind, since, limit)
    for it in items:
        it["time"] = _iso(it.pop("time_ns"))
    running = getattr(request.app.state, "control", None)
    return {"items": items, "loop": running.status() if running is not None else None}


@router.get("/control/pins", operation_id="list_control_pins", response_model=PinsOut, summary="Admins' pins")
def list_pins(request: Request, store: StoreDep, settings: SettingsDep, _: Staff) -> dict[str, Any]:
    pins = get_loop(request, store, settings).pins()
    return {
        "items": [
            {"scope": scope, "name": n, "value": p["value"], "reason": p["reason"], "updated": _iso(p["updated_ns"])}
            for scope in ("job", "pool")
            for n, p in sorted(pins.get(scope, {}).items())
        ]
    }


#: The pin routes' 400: a pin the loop refuses (ControlError).
REFUSED = {400: {"model": ErrorOut}}


def _set_pin(request: Request, store, settings, scope: str, name: str, value: Any, reason: str) -> dict:
    """Pin ``scope`` ``name`` to ``value``; 400 when the loop refuses it."""
    try:
        return get_loop(request, store, settings).set_pin(scope, name, value, reason)
    except ControlError as exc:
        raise HTTPException(400, str(exc)) from None


def _delete_pin(request: Request, store, settings, scope: str, name: str) -> None:
    """Remove the pin of ``scope`` ``name``; 404 when there is none."""
    require_found(get_loop(request, store, settings).delete_pin(scope, name), f"{scope} {name} is not pinned")


@router.put(
    "/control/pins/jobs/{job_id}",
    operation_id="put_job_pin",
    response_model=PinOut,
    responses=REFUSED,
    summary="Pin a job's forwarding nodes (the loop never remaps it)",
)
def put_job_pin(
    job_id: JobIdPath, body: JobPinIn, request: Request, store: StoreDep, settings: SettingsDep, _: Admin
) -> dict:
    return _set_pin(request, store, settings, "job", job_id, body.nodes, body.reason)


@router.delete(
    "/control/pins/jobs/{job_id}",
    operation_id="delete_job_pin",
    status_code=204,
    responses=NOT_FOUND,
    summary="Remove a job's pin",
)
def delete_job_pin(job_id: JobIdPath, request: Request, store: StoreDep, settings: SettingsDep, _: Admin) -> None:
    _delete_pin(request, store, settings, "job", job_id)


@router.put(
    "/control/pins/pools/{pool}",
    operation_id="put_pool_pin",
    response_model=PinOut,
    responses=REFUSED,
    summary="Pin a placement pool (targets and max_perf) as given",
)
def put_pool_pin(
    pool: PoolName, body: PoolPinIn, request: Request, store: StoreDep, settings: SettingsDep, _: Admin
) -> dict:
    unknown = sorted(set(body.max_perf) - set(body.targets))
    if unknown:
        raise HTTPException(400, f"max_perf names targets outside the pool: {', '.join(unknown)}")
    value = {"targets": body.targets, "max_perf": body.max_perf}
    return _set_pin(request, store, settings, "pool", pool, value, body.reason)


@router.delete(
    "/control/pins/pools/{pool}",
    operation_id="delete_pool_pin",
    status_code=204,
    responses=NOT_FOUND,
    summary="Remove a pool's pin",
)
def delete_pool_pin(pool: PoolName, request: Request, store: StoreDep, settings: SettingsDep, _: Admin) -> None:
    _delete_pin(request, store, settings, "pool", pool)


@router.get(
    "/control/migrations",
    operation_id="list_migrations",
    response_model=MigrationsOut,
    summary="Online migrations off fail-slow targets: every daemon's tasks (progress, bytes left) and the loop's plannings",
)
def list_migrations(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    _: Staff,
    unfinished: Annotated[bool, Query(description="Only tasks not done, failed or cancelled.")] = False,
    since_s: Annotated[float, Query(gt=0, le=MAX_WINDOW_S, description="Plannings recorded in the last seconds.")] = 7
    * 86400.0,
    limit: Annotated[int, Query(ge=1, le=10000, description="At most this many plannings.")] = 100,
) -> dict[str, Any]:
    """Asks every daemon at once (``[control] http_timeout_s`` each); one that does not answer
    is listed with ``ok`` false and its error."""
    loop = get_loop(request, store, settings)
    daemons = loop.migrations_overview()
    for d in daemons:
        if unfinished:
            d["tasks"] = [t for t in d["tasks"] if t.get("state") not in FINISHED]
        d["bytes_left"] = sum(int(t.get("bytes_left") or 0) for t in d["tasks"] if t.get("state") not in FINISHED)
        states: dict[str, int] = {}
        for t in d["tasks"]:
            states[t.get("state", "")] = states.get(t.get("state", ""), 0) + 1
        d["states"] = states
    planned = loop.actions(None, "migration", max(0, time.time_ns() - int(since_s * 1e9)), limit)
    for it in planned:
        it["time"] = _iso(it.pop("time_ns"))
    cfg = loop.cfg
    return {
        "daemons": daemons,
        "planned": planned,
        "enabled": cfg.migration_enabled,
        "dry_run": cfg.dry_run,
        "config": {k: v for k, v in cfg.model_dump().items() if k.startswith("migration_")},
    }


#: The task routes' errors: unknown daemon or task (404), refused by the daemon (400), the daemon
#: unreachable (502).
TASK_ERRORS = {404: {"model": ErrorOut}, 400: {"model": ErrorOut}, 502: {"model": ErrorOut}}


@router.put(
    "/control/migrations/{daemon}/{task_id}",
    operation_id="put_migration",
    response_model=MigrationCallOut,
    responses=TASK_ERRORS,
    summary="Pin, re-prioritise or re-rate a migration task on its daemon (recorded)",
)
def put_migration(
    daemon: DaemonName,
    task_id: TaskId,
    body: MigrationChangeIn,
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    _: Admin,
) -> dict[str, Any]:
    change = body.model_dump(exclude={"reason"}, exclude_none=True)
    try:
        return get_loop(request, store, settings).change_migration(daemon, task_id, change, body.reason)
    except MigrationCallError as exc:
        raise HTTPException(exc.status, str(exc)) from None


@router.delete(
    "/control/migrations/{daemon}/{task_id}",
    operation_id="cancel_migration",
    response_model=MigrationCallOut,
    responses=TASK_ERRORS,
    summary="Cancel a migration task on its daemon (a copy under way is rolled back; recorded)",
)
def cancel_migration(
    daemon: DaemonName,
    task_id: TaskId,
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    _: Admin,
    reason: Annotated[str, Query(max_length=1000)] = "",
) -> dict[str, Any]:
    try:
        return get_loop(request, store, settings).cancel_migration(daemon, task_id, reason)
    except MigrationCallError as exc:
        raise HTTPException(exc.status, str(exc)) from None
