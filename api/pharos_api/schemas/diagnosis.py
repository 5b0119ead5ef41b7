"""Diagnosis: a job's phases and access profile (pharos_analytics.phases), its insights
(pharos_analytics.insights), Darshan imports.

Units: shares 0-1, bytes in bytes, times ISO 8601 UTC, durations in seconds, rates in ops/s.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from pharos_analytics.pattern import Pattern

from .common import NAME_MAX, OutModel


class IoProfileOut(OutModel):
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


class PhaseOut(OutModel):
    index: int
    profile: IoProfileOut


class JobPhasesOut(OutModel):
    job_id: str
    layer: str
    source: Literal["trace", "counters", "none"] = Field(
        description="trace: io_requests (agent or DXT); counters: Darshan counters only (no phases)."
    )
    gap_s: float = Field(description="Idle time that separated phases.")
    job: IoProfileOut | None
    phases: list[PhaseOut]


class InsightOut(OutModel):
    id: str
    title: str
    severity: Literal["high", "warn", "info"]
    source: Literal["trace", "counters"]
    message: str
    evidence: dict[str, Any]
    recommendations: list[str]
    rule_source: str = Field(description="Paper, Drishti trigger or 'Pharos'.")
    seconds_lost: float | None = Field(
        default=None,
        description="Seconds of the job's run time (critical path) the finding is estimated to have cost; null when "
        "the rule cannot price it. How: evidence.seconds_lost_basis. Insights come sorted by it, largest first.",
    )
    drishti_code: str | None = Field(default=None, description="Drishti trigger code (S01, P05..P22, M02/M03), if any.")


class JobInsightsOut(OutModel):
    job_id: str
    insights: list[InsightOut]
    phases: JobPhasesOut
    notes: list[str]


class DarshanImportIn(BaseModel):
    paths: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        min_length=1,
        max_length=1000,
        description="Log paths relative to the server's import directory (Settings.import_dir); no absolute "
        "path, no '..', nothing that resolves outside it.",
    )
    job_id: str | None = Field(
        default=None, min_length=1, max_length=NAME_MAX, description="Import every log into this job."
    )
    name: str | None = Field(default=None, max_length=NAME_MAX, description="Job name (default: the exe's base name).")


class LogImportOut(OutModel):
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
