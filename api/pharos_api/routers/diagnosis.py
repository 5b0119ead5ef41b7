"""Diagnosis: a job's phases and insights; Darshan import through the running server.

``GET /v1/jobs/{id}/phases`` and ``GET /v1/jobs/{id}/insights`` (pharos_analytics.phases,
pharos_analytics.insights); ``POST /v1/import/darshan`` imports logs that the *server*
can read (paths on its file system): ``pharos import darshan`` uses it when ``pharos
serve`` holds the chDB directory, and opens the store itself otherwise.

Thresholds: ``DiagnosisConfig()`` (the ``[diagnosis]`` table of the settings file and
``PHAROS_DIAGNOSIS_*``), read per request so edits apply without a restart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.insights import job_insights
from pharos_analytics.phases import job_phases
from pharos_analytics.summary import JOB_EVENTS_SQL

from ..deps import StoreDep
from ..schemas import ErrorOut

router = APIRouter(tags=["diagnosis"])

Pattern = Literal["none", "1-1", "1-N", "N-1", "N-N", "N-M"]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class IoProfileOut(_Out):
    """Access profile of a span of I/O; shares 0-1, bytes, seconds, ops per second."""

    start: datetime | None
    end: datetime | None
    duration_s: float
    pattern: Pattern = Field(
        description="Beacon I/O pattern (NSDI'19 §4) by volume dominance over reads and writes; for the "
        "whole job the same as GET /v1/jobs/{id} (pharos_analytics.pattern.decide_pattern)."
    )
    patterns: dict[str, Pattern] = Field(default_factory=dict, description="Pattern of reads alone, writes alone.")
    fan_in_pattern: Pattern = Field("none", description="Pattern of all data I/O together (file fan-in).")
    io_ranks: int
    n_files: int
    max_fan_in: int = Field(description="Most ranks on one file.")
    reads: int
    writes: int
    bytes_read: int
    bytes_written: int
    direction: Literal["read", "write", "mixed", "none"]
    sequential_share: float | None = Field(description="Requests at or after the previous end (same rank, file).")
    consecutive_share: float | None = Field(description="Requests exactly at the previous end.")
    access: Literal["sequential", "random", "none"]
    small_share: float | None = Field(description="Data requests under small_request_bytes.")
    size_class: Literal["small", "large", "none"]
    misaligned_share: float | None
    alignment: Literal["aligned", "misaligned", "none"]
    alignment_bytes: int
    stripe_misaligned_share: float | None = Field(description="Against the file's stripe size, when known.")
    metadata_ops: int
    metadata_time_s: float
    data_time_s: float
    metadata_peak_ops_s: float
    metadata_busy_s: int = Field(description="Longest run of seconds above the metadata rate threshold.")
    metadata_heavy: bool


class PhaseOut(_Out):
    index: int
    profile: IoProfileOut


class JobPhasesOut(_Out):
    job_id: str
    layer: str
    source: Literal["trace", "counters", "none"] = Field(
        description="trace: io_requests (agent or DXT); counters: Darshan counters only (no phases)."
    )
    gap_s: float = Field(description="Idle time that separated phases.")
    job: IoProfileOut | None
    phases: list[PhaseOut]


class InsightOut(_Out):
    id: str
    title: str
    severity: Literal["high", "warn", "info"]
    source: Literal["trace", "counters"]
    message: str
    evidence: dict[str, Any]
    recommendations: list[str]
    rule_source: str = Field(description="Paper, Drishti trigger or 'Pharos'.")


class JobInsightsOut(_Out):
    job_id: str
    insights: list[InsightOut]
    phases: JobPhasesOut
    notes: list[str]


class DarshanImportIn(BaseModel):
    paths: list[str] = Field(min_length=1, description="Log paths on the server's file system.")
    job_id: str | None = Field(default=None, description="Import every log into this job.")
    name: str | None = Field(default=None, description="Job name (default: the exe's base name).")


class LogImportOut(_Out):
    path: str
    status: Literal["imported", "skipped", "failed"]
    job_id: str | None
    log_id: str | None
    dxt_segments: int
    dxt_skipped: int
    counter_rows: int
    ranks: int
    rank_offset: int
    modules: list[str]
    partial_modules: list[str]
    warnings: list[str]
    error: str | None


class DarshanImportOut(BaseModel):
    results: list[LogImportOut]


def _known(store, job_id: str) -> bool:
    if store.query(JOB_EVENTS_SQL, {"job_id": job_id}):
        return True
    rows = store.query("SELECT count() AS n FROM io_requests WHERE job_id = {job_id:String}", {"job_id": job_id})
    if int(rows[0]["n"]):
        return True
    rows = store.query("SELECT count() AS n FROM darshan_counters WHERE job_id = {job_id:String}", {"job_id": job_id})
    return bool(int(rows[0]["n"]))


def _not_found(job_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"job {job_id!r} not found: no event, record or Darshan counter")


@router.get(
    "/v1/jobs/{job_id}/phases",
    operation_id="get_job_phases",
    response_model=JobPhasesOut,
    responses={404: {"model": ErrorOut}},
    summary="A job's I/O phases and access profile",
)
def get_phases(
    job_id: str, store: StoreDep, layer: Literal["client", "forwarder", "storage"] = "client"
) -> JobPhasesOut:
    if not _known(store, job_id):
        raise _not_found(job_id)
    return JobPhasesOut.model_validate(job_phases(store, job_id, layer, DiagnosisConfig()))


@router.get(
    "/v1/jobs/{job_id}/insights",
    operation_id="get_job_insights",
    response_model=JobInsightsOut,
    responses={404: {"model": ErrorOut}},
    summary="What slowed a job's I/O: insights (with evidence and recommendations) and phases",
)
def get_insights(job_id: str, store: StoreDep) -> JobInsightsOut:
    if not _known(store, job_id):
        raise _not_found(job_id)
    return JobInsightsOut.model_validate(job_insights(store, job_id, DiagnosisConfig()))


@router.post(
    "/v1/import/darshan",
    operation_id="import_darshan",
    response_model=DarshanImportOut,
    summary="Import Darshan logs that the server can read (idempotent per log)",
)
def post_import(body: DarshanImportIn, store: StoreDep) -> DarshanImportOut:
    from pharos_agents.darshan_import import import_logs

    results = import_logs(store, body.paths, job_id=body.job_id, name=body.name)
    return DarshanImportOut(results=[LogImportOut.model_validate(r) for r in results])
