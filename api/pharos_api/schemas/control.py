"""The control loop: DFRA hints (Ji et al., FAST'19), I/O classes, the audit trail of actions,
admins' pins.

Units: times ISO 8601 UTC, ``max_perf`` in MB/s (10^6 B/s).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field

PoolName = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$", description="Pool name.")]
KINDS = (
    "dfra_default",
    "dfra_more_nodes",
    "dfra_dedicated",
    "remap",
    "release",
    "lease_expired",
    "placement",
    "sync",
    "pin",
    "unpin",
)


class HintOut(BaseModel):
    """A DFRA decision (Ji et al., FAST'19; Beacon NSDI'19 classifier)."""

    model_config = ConfigDict(populate_by_name=True)

    job_id: str = Field(description="The job ('' for a preview by name/user/command).")
    klass: Literal["default", "more_nodes", "dedicated"] = Field(
        alias="class", description="default mapping | more forwarding nodes | dedicated (reserved) forwarding nodes."
    )
    nodes: list[str] = Field(description="Forwarding nodes, primary first (the mount's mapping entry).")
    reserved: list[str] = Field(description="Those of nodes held by this job alone until it ends.")
    reason: str
    evidence: dict[str, Any] = Field(description="History criteria and values, node states, sizing.")
    decided: bool = Field(
        description="A decision of this job (recorded), not a preview (a read of a job without one, or by identity)."
    )
    new: bool = Field(description="Taken by this request (a claim).")
    current_nodes: list[str] | None = Field(None, description="Nodes now, after any live remap.")
    pinned: list[str] | None = Field(None, description="An admin's pin, which wins over the decision.")
    status: str | None = Field(None, description="Push status of a new decision: applied | failed | recorded.")
    error: str | None = None
    dry_run: bool


class ActionOut(BaseModel):
    time: datetime
    action_id: str
    job_id: str
    kind: str = Field(
        description="dfra_default | dfra_more_nodes | dfra_dedicated | remap | release (a reserved node returned: "
        "its job ended or never started) | lease_expired (returned: the job's lease was not renewed) | placement | "
        "sync | pin | unpin"
    )
    resource: str = Field(description="mapping | pool:<name> | node:<name>")
    from_state: str = Field(description="Nodes (comma-separated, primary first) or the pool as JSON.")
    to_state: str
    reason: str
    evidence: dict[str, Any]
    dry_run: bool
    status: Literal["applied", "failed", "recorded"]
    error: str
    endpoints: list[str] = Field(description="Admin URLs pushed to.")


class ActionsOut(BaseModel):
    items: list[ActionOut]
    loop: dict[str, Any] | None = Field(description="The running loop's status (None: not running here).")


class JobPinIn(BaseModel):
    nodes: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        min_length=1, max_length=64, description="Forwarding nodes, primary first."
    )
    reason: str = Field("", max_length=1000)


class PoolPinIn(BaseModel):
    targets: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        min_length=1, max_length=4096, description="Targets of the pool (never empty)."
    )
    max_perf: dict[str, Annotated[float, Field(gt=0, le=1e9)]] = Field(
        default_factory=dict, description="Target -> MB/s (10^6 B/s) the pool places by."
    )
    reason: str = Field("", max_length=1000)


class PinOut(BaseModel):
    scope: Literal["job", "pool"]
    name: str
    value: Any
    reason: str
    updated: datetime | None = None


class PinsOut(BaseModel):
    items: list[PinOut]


class IoClassOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    user: str
    name: str
    klass: Literal["default", "more_nodes", "dedicated"] = Field(alias="class")
    pattern: str = Field(description="The job pattern most frequent in the history (Beacon's volume dominance).")
    runs: int


class IoClassesOut(BaseModel):
    items: list[IoClassOut]
