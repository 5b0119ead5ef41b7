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


def _no_import_dir() -> HTTPException:
    return HTTPException(
        403,
        "no import directory is configured (import_dir in pharos.toml, PHAROS_IMPORT_DIR): the server reads "
        "no path; upload the log instead (POST /v1/import/darshan/upload, what `pharos import darshan` does)",
    )


def check_import_path(import_dir: FsPath | None, rel: str) -> None:
    """Lexical checks of a path to import, before anything is opened. Raises HTTPException 403
    when no import directory is configured, and for an empty or absolute path, a ``..``
    component or a NUL byte."""
    if import_dir is None:
        raise _no_import_dir()
    p = FsPath(rel.replace("\0", ""))
    if "\0" in rel or not rel.strip("/.") or p.is_absolute() or ".." in p.parts:
        raise HTTPException(403, f"{rel!r}: give a path relative to the import directory, without '..'")


def open_import(import_dir: FsPath, rel: str, max_bytes: int) -> int | str:
    """Open ``rel`` beneath ``import_dir`` once, following no symbolic link
    (:func:`pharos_pipeline.darshan_log.open_beneath`): the descriptor of the regular file, or
    the error (str) of a path that cannot be opened (missing, not regular, too large: a failed
    result). Raises HTTPException 403 when a component is a symbolic link."""
    from pharos_pipeline.darshan_log import DarshanImportError, open_beneath

    try:
        return open_beneath(import_dir, rel, max_bytes)
    except DarshanImportError as exc:
        if "symbolic link" in str(exc):
            raise HTTPException(403, str(exc)) from None
        return str(exc)
    except OSError as exc:
        return f"{rel}: {exc.strerror or exc}"


@router.post(
    "/import/darshan",
    operation_id="import_darshan",
    response_model=DarshanImportOut,
    responses={403: {"model": ErrorOut, "description": "No import directory, a path outside it or a symbolic link."}},
    summary="Import Darshan logs from the server's import directory (idempotent per log)",
)
def post_import(body: DarshanImportIn, store: StoreDep, settings: SettingsDep, _: Admin) -> DarshanImportOut:
    """Results in the order of ``paths`` (``path`` as given). 403: no import directory, a path
    outside it (every path is checked before any is opened) or with a symbolic link on the way
    (every file is opened, once, before any is read; the import reads the descriptor opened)."""
    from pharos_pipeline.darshan_import import LogImport, import_fd

    for p in body.paths:
        check_import_path(settings.import_dir, p)
    opened: list[int | str] = []
    try:
        for p in body.paths:
            opened.append(open_import(settings.import_dir, p, settings.import_max_bytes))
        results = []
        for p, fd in zip(body.paths, opened, strict=True):
            if isinstance(fd, str):
                results.append(LogImport(path=p, status="failed", error=fd))
                continue
            results.append(
                import_fd(
                    store,
                    fd,
                    p,
                    body.job_id,
                    body.name,
                    max_bytes=settings.import_max_bytes,
                    timeout_s=settings.import_timeout_s,
                    limits=parse_limits(settings),
                )
            )
    finally:
        for fd in opened:
            if isinstance(fd, int):
                os.close(fd)
    return DarshanImportOut(results=[LogImportOut.model_validate(r) for r in results])


def parse_limits(settings):
    """The Darshan parse limits of ``settings`` (``import_parse_cpu_s``, ``import_parse_memory_bytes``)."""
    from pharos_pipeline.darshan_parse import ParseLimits

    return ParseLimits(cpu_s=settings.import_parse_cpu_s, memory_bytes=settings.import_parse_memory_bytes)


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
            limits=parse_limits(settings),
        )
    return DarshanImportOut(results=[LogImportOut.model_validate(result)])
