"""Diagnosis: a job's phases and insights; Darshan import through the running server.

``GET /v1/jobs/{id}/phases`` and ``GET /v1/jobs/{id}/insights`` (pharos_analytics.phases,
pharos_analytics.insights). Darshan import (role admin), used by ``pharos import darshan`` when
an API answers (``pharos serve`` holds the chDB directory, or a remote server):

* ``POST /v1/import/darshan/upload?filename=&job_id=&name=``: the log is the request body
  (``application/octet-stream``), streamed to a temporary file, at most
  ``Settings.import_max_bytes`` bytes (``413`` beyond, also when ``Content-Length`` says so
  up front) and ``Settings.import_timeout_s`` seconds (``408``).
* ``POST /v1/import/darshan`` ``{"paths": [...]}``: logs in the server's import directory
  (``Settings.import_dir``) only, paths relative to it; ``403`` when no import directory is
  configured, and for an absolute path, a ``..`` component or a path (symlinks resolved)
  that leads out of it. Nothing outside the directory is opened.

Either way a log is read only if it is a regular file within the size and time bounds
(:func:`pharos_pipeline.darshan_import.import_log`); a failed log says why and carries no hash.

Thresholds: ``DiagnosisConfig()`` (the ``[diagnosis]`` table of the settings file and
``PHAROS_DIAGNOSIS_*``), read per request so edits apply without a restart.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path as FsPath
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.insights import job_insights
from pharos_analytics.phases import job_phases

from ..auth import Admin, Reader
from ..deps import SettingsDep, StoreDep, require_job
from ..schemas.common import NAME_MAX, NOT_FOUND, ErrorOut, JobIdPath
from ..schemas.diagnosis import DarshanImportIn, DarshanImportOut, JobInsightsOut, JobPhasesOut, LogImportOut
from . import V1

router = APIRouter(prefix=V1, tags=["diagnosis"])


@router.get(
    "/jobs/{job_id}/phases",
    operation_id="get_job_phases",
    response_model=JobPhasesOut,
    responses=NOT_FOUND,
    summary="A job's I/O phases and access profile",
)
def get_phases(
    job_id: JobIdPath, store: StoreDep, principal: Reader, layer: Literal["client", "forwarder", "storage"] = "client"
) -> JobPhasesOut:
    require_job(store, job_id, principal)
    return JobPhasesOut.model_validate(job_phases(store, job_id, layer, DiagnosisConfig()))


@router.get(
    "/jobs/{job_id}/insights",
    operation_id="get_job_insights",
    response_model=JobInsightsOut,
    responses=NOT_FOUND,
    summary="What slowed a job's I/O: insights (with evidence and recommendations) and phases",
)
def get_insights(job_id: JobIdPath, store: StoreDep, principal: Reader) -> JobInsightsOut:
    require_job(store, job_id, principal)
    return JobInsightsOut.model_validate(job_insights(store, job_id, DiagnosisConfig()))


def import_path(import_dir: FsPath | None, rel: str) -> FsPath:
    """``rel`` inside ``import_dir``, symlinks resolved. Raises HTTPException 403 when no import
    directory is configured, and for an absolute path, a ``..`` component, a NUL byte or a
    path that resolves outside the directory (nothing is opened)."""
    if import_dir is None:
        raise HTTPException(
            403,
            "no import directory is configured (import_dir in pharos.toml, PHAROS_IMPORT_DIR): the server reads "
            "no path; upload the log instead (POST /v1/import/darshan/upload, what `pharos import darshan` does)",
        )
    p = FsPath(rel)
    if "\0" in rel or p.is_absolute() or ".." in p.parts:
        raise HTTPException(403, f"{rel!r}: give a path relative to the import directory, without '..'")
    base = import_dir.resolve()
    full = (base / p).resolve()
    if not full.is_relative_to(base) or full == base:
        raise HTTPException(403, f"{rel!r} leads outside the import directory")
    return full


@router.post(
    "/import/darshan",
    operation_id="import_darshan",
    response_model=DarshanImportOut,
    responses={403: {"model": ErrorOut, "description": "No import directory, or a path outside it."}},
    summary="Import Darshan logs from the server's import directory (idempotent per log)",
)
def post_import(body: DarshanImportIn, store: StoreDep, settings: SettingsDep, _: Admin) -> DarshanImportOut:
    """Results in the order of ``paths`` (``path`` as given). 403: no import directory, or a
    path outside it (every path is checked before any is read)."""
    from pharos_pipeline.darshan_import import import_logs

    full = [import_path(settings.import_dir, p) for p in body.paths]
    results = import_logs(
        store,
        full,
        job_id=body.job_id,
        name=body.name,
        max_bytes=settings.import_max_bytes,
        timeout_s=settings.import_timeout_s,
        labels=list(body.paths),
    )
    return DarshanImportOut(results=[LogImportOut.model_validate(r) for r in results])


UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The Darshan log's bytes (at most Settings.import_max_bytes).",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


async def _receive(request: Request, dest, max_bytes: int, timeout_s: float) -> int:
    """Stream the request body into ``dest``; bytes written. 413 beyond ``max_bytes``, 408 beyond ``timeout_s``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise HTTPException(413, f"the log is {declared} bytes, over the import limit of {max_bytes} bytes")
    deadline = time.monotonic() + timeout_s
    n = 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > max_bytes:
            raise HTTPException(413, f"the log is over the import limit of {max_bytes} bytes")
        if time.monotonic() > deadline:
            raise HTTPException(408, f"the upload took longer than {timeout_s:g} s")
        dest.write(chunk)
    return n


@router.post(
    "/import/darshan/upload",
    operation_id="upload_darshan",
    response_model=DarshanImportOut,
    responses={408: {"model": ErrorOut}, 413: {"model": ErrorOut}},
    openapi_extra=UPLOAD_BODY,
    summary="Import one Darshan log sent as the request body (idempotent per log)",
)
async def post_upload(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    _: Admin,
    filename: Annotated[
        str, Query(min_length=1, max_length=255, description="The log's file name (shown in results).")
    ] = "upload.darshan",
    job_id: Annotated[str | None, Query(min_length=1, max_length=NAME_MAX, description="Import into this job.")] = None,
    name: Annotated[
        str | None, Query(max_length=NAME_MAX, description="Job name (default: the exe's base name).")
    ] = None,
) -> DarshanImportOut:
    """One result (``path`` = ``filename``'s base name). 413: over ``import_max_bytes``; 408:
    slower than ``import_timeout_s``; an unreadable log is a ``failed`` result (200)."""
    from pharos_pipeline.darshan_import import import_log

    label = os.path.basename(filename.replace("\0", "")) or "upload.darshan"
    with tempfile.NamedTemporaryFile(prefix="pharos-upload-", suffix=".darshan") as tmp:
        await _receive(request, tmp, settings.import_max_bytes, settings.import_timeout_s)
        tmp.flush()
        result = await run_in_threadpool(
            import_log,
            store,
            tmp.name,
            job_id=job_id,
            name=name,
            max_bytes=settings.import_max_bytes,
            timeout_s=settings.import_timeout_s,
            label=label,
        )
    return DarshanImportOut(results=[LogImportOut.model_validate(result)])
