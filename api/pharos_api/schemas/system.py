"""System: the API's health, what the pipeline has stored, the producers' liveness.

Units: bytes in bytes, times ISO 8601 UTC, durations in seconds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from .common import OutModel
from .jobs import DropsOut


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    store: str = Field(description='"ok", or the store error.')
    version: str


class PipelineOut(BaseModel):
    """What the pipeline has stored (all jobs, all layers), and this process's live counters."""

    records: int = Field(description="Rows of io_requests.")
    bytes: int = Field(description="Bytes moved by those records.")
    batches: int = Field(description="Distinct (producer, seq) batches stored.")
    producers: int = Field(description="Producers that delivered at least one batch.")
    gaps: int = Field(description="Missing batches: seqs below each producer's highest that are not stored.")
    dead_letters: int = Field(description="Messages that did not decode.")
    jobs: int = Field(description="Jobs with at least one event.")
    dropped_records: int = Field(description="Records lost before the store (drops.total), all producers and jobs.")
    drops: DropsOut
    last_ingested: datetime | None = Field(description="When the newest batch was stored.")
    live: dict[str, int | float | None] | None = Field(
        default=None,
        description="Counters of the pipeline running in this process since it started "
        "(Pipeline.stats()); null when the API runs without a pipeline.",
    )


class ProducerOut(OutModel):
    """One producer (eBPF agent, forwarding daemon) and its liveness, from its batches (io_batches)."""

    producer_id: str
    kind: Literal["agent", "fwd", "other"]
    host: str
    pid: int | None = Field(description="Its process id (from the producer id), if it carries one.")
    first_batch: datetime | None
    last_batch: datetime | None = Field(description="When its newest stored batch left it (its clock).")
    last_ingested: datetime | None
    age_s: float = Field(description="Seconds since last_batch.")
    batches: int
    heartbeats: int = Field(description="Batches without records: sent when it had nothing else to send.")
    records: int
    state: Literal["alive", "silent"] = Field(description="silent: no batch for more than silence_s.")


class ProducersOut(BaseModel):
    items: list[ProducerOut]
    silence_s: float = Field(description="heartbeat_missed x heartbeat_interval_s of the server's settings.")
    since_s: float
    now: datetime
