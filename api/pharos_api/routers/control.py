"""The control loop over HTTP: DFRA hints, the audit trail of actions, admins' pins.

* ``GET /v1/hints/jobs/{job_id}``: the job's DFRA decision (forwarding nodes, class, reason,
  evidence), taken now if it has none (and recorded; reserved nodes are held for the job),
  before its first I/O: what a Slurm prolog or ``pharos run`` asks. ``apply=true`` also pushes
  the mapping to the mount at once. A job with no start event needs ``name`` (and ``user``,
  ``command``): 404 otherwise.
* ``GET /v1/hints?name=&user=&command=``: the decision a job not started yet would get
  (nothing recorded, nothing held).
* ``GET /v1/control/actions``: every decision and push (``control_actions``), newest first.
* ``GET /v1/control/pins``, ``PUT``/``DELETE /v1/control/pins/jobs/{job_id}`` (a job's
  forwarding nodes) and ``/v1/control/pins/pools/{pool}`` (a placement pool): the loop never
  changes what is pinned.

The loop is ``app.state.control`` (``pharos serve``); without it (tests, a stand-alone API) a
loop that is never started serves the requests with the same code.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from pharos_analytics.control.loop import ControlError, ControlLoop
from pharos_analytics.profiles import job_profiles

from ..auth import Admin, HintReader, SchedulerCall, Staff
from ..deps import SettingsDep, StoreDep
from ..schemas import MAX_WINDOW_S, NAME_MAX, ErrorOut, JobIdPath

router = APIRouter(prefix="/v1", tags=["control"])

PoolName = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$", description="Pool name.")]
KINDS = ("dfra_default", "dfra_more_nodes", "dfra_dedicated", "remap", "release", "placement", "sync", "pin", "unpin")


class HintOut(BaseModel):
    """A DFRA decision (Ji et al., FAST'19; Beacon NSDI'19 classifier)."""

    model_config = ConfigDict(populate_by_name=True)

    job_id: str = Field(description="The job ('' for a preview by name/user/command).")
    klass: Literal["default", "more_nodes", "dedicated"] = Field(
        alias="class", description="default mapping | more forwarding nodes | dedicated (reserved) forwarding nodes."
    )
    nodes: list[str] = Field(description="Forwarding nodes, primary first (the mount's mapping entry).")
    reserved: list[str] = Field(description="Those of nodes held by this job alone until it ends.")
    reason: str
    evidence: dict[str, Any] = Field(description="History criteria and values, node states, sizing.")
    decided: bool = Field(description="A decision of this job (recorded), not a preview.")
    new: bool = Field(description="Taken by this request.")
    current_nodes: list[str] | None = Field(None, description="Nodes now, after any live remap.")
    pinned: list[str] | None = Field(None, description="An admin's pin, which wins over the decision.")
    status: str | None = Field(None, description="Push status of a new decision: applied | failed | recorded.")
    error: str | None = None
    dry_run: bool


class ActionOut(BaseModel):
    time: datetime
    action_id: str
    job_id: str
    kind: str = Field(
        description="dfra_default | dfra_more_nodes | dfra_dedicated | remap | release | placement | sync | pin | unpin"
    )
    resource: str = Field(description="mapping | pool:<name> | node:<name>")
    from_state: str = Field(description="Nodes (comma-separated, primary first) or the pool as JSON.")
    to_state: str
    reason: str
    evidence: dict[str, Any]
    dry_run: bool
    status: Literal["applied", "failed", "recorded"]
    error: str
    endpoints: list[str] = Field(description="Admin URLs pushed to.")


class ActionsOut(BaseModel):
    items: list[ActionOut]
    loop: dict[str, Any] | None = Field(description="The running loop's status (None: not running here).")


class JobPinIn(BaseModel):
    nodes: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        min_length=1, max_length=64, description="Forwarding nodes, primary first."
    )
    reason: str = Field("", max_length=1000)


class PoolPinIn(BaseModel):
    targets: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        min_length=1, max_length=4096, description="Targets of the pool (never empty)."
    )
    max_perf: dict[str, Annotated[float, Field(gt=0, le=1e9)]] = Field(
        default_factory=dict, description="Target -> MB/s (10^6 B/s) the pool places by."
    )
    reason: str = Field("", max_length=1000)


class PinOut(BaseModel):
    scope: Literal["job", "pool"]
    name: str
    value: Any
    reason: str
    updated: datetime | None = None


class PinsOut(BaseModel):
    items: list[PinOut]


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


@router.get(
    "/hints/jobs/{job_id}",
    operation_id="get_job_hint",
    response_model=HintOut,
    response_model_by_alias=True,
    responses={404: {"model": ErrorOut}},
    summary="DFRA decision for a job: its forwarding nodes, before its first I/O",
)
def get_job_hint(
    job_id: JobIdPath,
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    _: SchedulerCall,
    name: Annotated[str | None, Query(max_length=256, description="Job name, for a job without a start event.")] = None,
    user: Annotated[str | None, Query(max_length=256)] = None,
    command: Annotated[list[str] | None, Query(max_length=256, description="argv, one parameter per word.")] = None,
    apply: Annotated[bool, Query(description="Push the mapping to the mount now.")] = False,
) -> dict[str, Any]:
    """Records the decision and may hold reserved nodes, so a control action: roles admin and
    scheduler (the Slurm plugin's prolog, ``pharos run`` with such a token). 404: no start event
    and no ``name``."""
    try:
        return get_loop(request, store, settings).hint(job_id, name, user, command, apply=apply)
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
) -> dict[str, Any]:
    """Nothing recorded. A ``user`` token previews its own jobs only (``user`` is its name; 403
    for another user)."""
    if not principal.sees_all:
        if user not in ("", principal.user):
            raise HTTPException(403, "a user token previews the hints of its own user only")
        user = principal.user
    return get_loop(request, store, settings).preview(name, user, command)


class IoClassOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    user: str
    name: str
    klass: Literal["default", "more_nodes", "dedicated"] = Field(alias="class")
    pattern: str = Field(description="The job pattern most frequent in the history (Beacon's volume dominance).")
    runs: int


class IoClassesOut(BaseModel):
    items: list[IoClassOut]


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
    limit: Annotated[int, Query(ge=1, le=100000)] = 10000,
) -> dict[str, Any]:
    """The DFRA class (default | more_nodes | dedicated; Ji et al., FAST'19 §3) a job of each
    (user, name) in the history would get now, and its usual pattern: read by the Slurm
    job_submit.lua (agents/slurm) through the file ``pharos slurm classes`` writes. A ``user``
    token gets its own (user, name) pairs only."""
    loop = get_loop(request, store, settings)
    since = max(0, time.time_ns() - int(since_s * 1e9))
    items = []
    mine = lambda p: principal.sees_all or p.user == principal.user  # noqa: E731
    for p in [p for p in job_profiles(store, since_ns=since) if p.name and mine(p)][:limit]:
        d = loop.preview(p.name, p.user)
        items.append({"user": p.user, "name": p.name, "class": d["class"], "pattern": p.pattern, "runs": p.runs})
    return {"items": items}


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


@router.put(
    "/control/pins/jobs/{job_id}",
    operation_id="put_job_pin",
    response_model=PinOut,
    responses={400: {"model": ErrorOut}},
    summary="Pin a job's forwarding nodes (the loop never remaps it)",
)
def put_job_pin(
    job_id: JobIdPath, body: JobPinIn, request: Request, store: StoreDep, settings: SettingsDep, _: Admin
) -> dict:
    try:
        return get_loop(request, store, settings).set_pin("job", job_id, body.nodes, body.reason)
    except ControlError as exc:
        raise HTTPException(400, str(exc)) from None


@router.delete(
    "/control/pins/jobs/{job_id}",
    operation_id="delete_job_pin",
    status_code=204,
    responses={404: {"model": ErrorOut}},
    summary="Remove a job's pin",
)
def delete_job_pin(job_id: JobIdPath, request: Request, store: StoreDep, settings: SettingsDep, _: Admin) -> None:
    if not get_loop(request, store, settings).delete_pin("job", job_id):
        raise HTTPException(404, f"job {job_id} is not pinned")


@router.put(
    "/control/pins/pools/{pool}",
    operation_id="put_pool_pin",
    response_model=PinOut,
    responses={400: {"model": ErrorOut}},
    summary="Pin a placement pool (targets and max_perf) as given",
)
def put_pool_pin(
    pool: PoolName, body: PoolPinIn, request: Request, store: StoreDep, settings: SettingsDep, _: Admin
) -> dict:
    unknown = sorted(set(body.max_perf) - set(body.targets))
    if unknown:
        raise HTTPException(400, f"max_perf names targets outside the pool: {', '.join(unknown)}")
    try:
        return get_loop(request, store, settings).set_pin(
            "pool", pool, {"targets": body.targets, "max_perf": body.max_perf}, body.reason
        )
    except ControlError as exc:
        raise HTTPException(400, str(exc)) from None


@router.delete(
    "/control/pins/pools/{pool}",
    operation_id="delete_pool_pin",
    status_code=204,
    responses={404: {"model": ErrorOut}},
    summary="Remove a pool's pin",
)
def delete_pool_pin(pool: PoolName, request: Request, store: StoreDep, settings: SettingsDep, _: Admin) -> None:
    if not get_loop(request, store, settings).delete_pin("pool", pool):
        raise HTTPException(404, f"pool {pool} is not pinned")
