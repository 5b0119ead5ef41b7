"""Jobs: the job list and each job's I/O summary (pharos_analytics.summary)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query

from pharos_analytics.summary import count_jobs, job_summary, list_jobs

from ..deps import StoreDep
from ..schemas import ErrorOut, JobListItemOut, JobListOut, JobSummaryOut

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

Layer = Literal["client", "forwarder", "storage"]


@router.get("", operation_id="list_jobs", response_model=JobListOut, summary="List jobs, newest first")
def get_jobs(
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="Jobs per page.")] = 50,
    offset: Annotated[int, Query(ge=0, description="Jobs to skip.")] = 0,
    layer: Annotated[Layer, Query(description="Layer whose I/O gives bytes and pattern.")] = "client",
) -> JobListOut:
    items = list_jobs(store, limit=limit, offset=offset, layer=layer)
    return JobListOut(
        items=[JobListItemOut.model_validate(i) for i in items],
        total=count_jobs(store),
        limit=limit,
        offset=offset,
    )


@router.get(
    "/{job_id}",
    operation_id="get_job",
    response_model=JobSummaryOut,
    responses={404: {"model": ErrorOut, "description": "No event and no record of the job."}},
    summary="A job's I/O summary",
)
def get_job(
    job_id: str,
    store: StoreDep,
    layer: Annotated[Layer, Query(description="Layer to summarise.")] = "client",
    files_limit: Annotated[int, Query(ge=0, le=10000, description="At most this many files.")] = 100,
) -> JobSummaryOut:
    summary = job_summary(store, job_id, layer=layer, files_limit=files_limit)
    if summary is None:
        raise HTTPException(
            status_code=404,
            detail=f"job {job_id!r} not found: no job event and no {layer}-layer I/O record",
        )
    return JobSummaryOut.model_validate(summary)
