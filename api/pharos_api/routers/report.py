"""``GET /v1/jobs/{id}/report``: the job's visual report, one self-contained HTML page
(:mod:`pharos_api.report`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from ..auth import Reader, check_job
from ..deps import SettingsDep, StoreDep, require_found
from ..report import render_report
from ..schemas.common import ErrorOut, JobIdPath
from . import V1

router = APIRouter(prefix=V1, tags=["jobs"])


@router.get(
    "/jobs/{job_id}/report",
    operation_id="get_job_report",
    response_model=None,
    # HTMLResponse returned as is; errors stay JSON (404 here, 401/403/503 from the app)
    responses={
        200: {"description": "The page.", "content": {"text/html": {"schema": {"type": "string"}}}},
        404: {"model": ErrorOut},
    },
    summary="A job's report: diagnosis in plain words and plots, one HTML page with no external resources",
)
def get_job_report(
    job_id: JobIdPath,
    store: StoreDep,
    settings: SettingsDep,
    principal: Reader,
    refresh_s: Annotated[
        float,
        Query(
            ge=0,
            le=3600,
            description="A running job's page re-fetches itself every refresh_s seconds until the job ends "
            "(0: never). A finished job's page never does.",
        ),
    ] = 10.0,
) -> HTMLResponse:
    """The page (text/html); 404 for an unknown job (or another user's, for a ``user`` token).
    A running job's page shows its I/O stored so far and refreshes itself."""
    check_job(principal, store, job_id)
    page = render_report(store, job_id, silence_s=settings.silence_s, refresh_s=refresh_s)
    require_found(page is not None, f"job {job_id!r} not found: no job event and no I/O record")
    return HTMLResponse(page, headers={"Cache-Control": "no-store"})  # a running job's page changes
