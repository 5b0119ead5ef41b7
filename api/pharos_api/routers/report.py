"""``GET /v1/jobs/{id}/report``: the job's visual report, one self-contained HTML page
(:mod:`pharos_api.report`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path
from fastapi.responses import HTMLResponse

from ..deps import StoreDep
from ..report import render_report
from ..schemas import ErrorOut

router = APIRouter(tags=["jobs"])


@router.get(
    "/v1/jobs/{job_id}/report",
    operation_id="get_job_report",
    response_class=HTMLResponse,
    responses={200: {"content": {"text/html": {}}}, 404: {"model": ErrorOut}},
    summary="A job's report: diagnosis in plain words and plots, one HTML page with no external resources",
)
def get_job_report(job_id: Annotated[str, Path(min_length=1, max_length=256)], store: StoreDep) -> HTMLResponse:
    page = render_report(store, job_id)
    if page is None:
        raise HTTPException(404, f"job {job_id!r} not found: no job event and no I/O record")
    return HTMLResponse(page)
