"""Jobs: the job list and each job's I/O summary (pharos_analytics.summary)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request

from pharos_agents.runner import JobEventProducer, RunError
from pharos_analytics.summary import count_jobs, job_summary, list_jobs
from pharos_pipeline.wire import SCHEMA_VERSION, JobEvent, io_pb2

from ..auth import Reader, SchedulerCall, check_job
from ..deps import SettingsDep, StoreDep, require_found
from ..schemas.common import ErrorOut, JobIdPath
from ..schemas.jobs import JobEventIn, JobEventOut, JobListItemOut, JobListOut, JobSummaryOut
from . import V1

router = APIRouter(prefix=V1, tags=["jobs"])

Layer = Literal["client", "forwarder", "storage"]


@router.get("/jobs", operation_id="list_jobs", response_model=JobListOut, summary="List jobs, newest first")
def get_jobs(
    store: StoreDep,
    principal: Reader,
    limit: Annotated[int, Query(ge=1, le=1000, description="Jobs per page.")] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9, description="Jobs to skip.")] = 0,
    layer: Annotated[Layer, Query(description="Layer whose I/O gives bytes and pattern.")] = "client",
) -> JobListOut:
    """Jobs with an event; a ``user`` token gets its own jobs only (``total`` counts those)."""
    user = None if principal.sees_all else principal.user
    items = list_jobs(store, limit=limit, offset=offset, layer=layer, user=user)
    return JobListOut(
        items=[JobListItemOut.model_validate(i) for i in items],
        total=count_jobs(store, user=user),
        limit=limit,
        offset=offset,
    )


@router.get(
    "/jobs/{job_id}",
    operation_id="get_job",
    response_model=JobSummaryOut,
    responses={404: {"model": ErrorOut, "description": "No event and no record of the job."}},
    summary="A job's I/O summary",
    description="Bytes, operations, sizes, files, pattern and drops of one job on one layer, and whether the "
    "eBPF agents watched it all along: `complete` false and `gaps` [{host, producer, start, end}] when an agent on "
    "one of its hosts was silent (dead, hung, cut off from Kafka) while it ran (docs/architecture.md, "
    "'Loss is never silent').",
)
def get_job(
    job_id: JobIdPath,
    store: StoreDep,
    settings: SettingsDep,
    principal: Reader,
    layer: Annotated[Layer, Query(description="Layer to summarise.")] = "client",
    files_limit: Annotated[int, Query(ge=0, le=10000, description="At most this many files.")] = 100,
) -> JobSummaryOut:
    check_job(principal, store, job_id)
    summary = job_summary(store, job_id, layer=layer, files_limit=files_limit, silence_s=settings.silence_s)
    require_found(summary is not None, f"job {job_id!r} not found: no job event and no {layer}-layer I/O record")
    return JobSummaryOut.model_validate(summary)


_producer_lock = threading.Lock()


def _job_events(request: Request, settings) -> JobEventProducer:
    """The app's one job-event producer (made on first use). Raises RunError (Kafka unreachable)."""
    with _producer_lock:
        prod = getattr(request.app.state, "job_events", None)
        if prod is None:
            prod = JobEventProducer(settings, timeout=5.0)
            request.app.state.job_events = prod
        return prod


@router.post(
    "/jobs/{job_id}/events",
    operation_id="post_job_event",
    status_code=202,
    response_model=JobEventOut,
    responses={503: {"model": ErrorOut, "description": "Kafka did not acknowledge the event."}},
    summary="Record a job's start or end (scheduler plugins; `pharos run` writes its own)",
)
def post_job_event(
    job_id: Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")],
    body: JobEventIn,
    request: Request,
    settings: SettingsDep,
    _: SchedulerCall,
) -> JobEventOut:
    """Send the event to the jobs topic (roles admin, scheduler). 503 when Kafka does not acknowledge it."""
    kind = io_pb2.JobEvent.KIND_START if body.kind == "start" else io_pb2.JobEvent.KIND_END
    t = body.time_ns or time.time_ns()
    event = JobEvent(
        schema_version=SCHEMA_VERSION,
        job_id=job_id,
        kind=kind,
        time_ns=t,
        name=body.name,
        command=body.command,
        user=body.user,
        ranks=body.ranks,
        host=body.host or socket.gethostname(),
        exit_code=body.exit_code,
    )
    try:
        _job_events(request, settings).send(event)
    except RunError as exc:
        raise HTTPException(503, str(exc)) from None
    return JobEventOut(job_id=job_id, kind=body.kind, time_ns=t, delivered=True)
