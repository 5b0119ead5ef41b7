"""``GET /v1/jobs/{id}/report``: the job's visual report, one self-contained HTML page
(:mod:`pharos_api.report`)."""

from __future__ import annotations

from fastapi import APIRouter
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
def get_job_report(job_id: JobIdPath, store: StoreDep, settings: SettingsDep, principal: Reader) -> HTMLResponse:
    """The page (text/html); 404 for an unknown job (or another user's, for a ``user`` token)."""
    check_job(principal, store, job_id)
    page = render_report(store, job_id, silence_s=settings.silence_s)
    require_found(page is not None, f"job {job_id!r} not found: no job event and no I/O record")
    return HTMLResponse(page)
