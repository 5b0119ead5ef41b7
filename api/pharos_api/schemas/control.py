"""The control loop: DFRA hints (Ji et al., FAST'19), I/O classes, the audit trail of actions,
admins' pins, online migrations off fail-slow targets (GVDS MODM; Sunway storage paper).

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
    "migration",
    "migration_change",
    "migration_cancel",
)
#: A forwarding node's name in a path (the daemons' ``--node-name``).
DaemonName = Annotated[
    str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$", description="Forwarding node name.")
]
TaskId = Annotated[int, Path(ge=0, le=2**63 - 1, description="Migration task id on that daemon.")]


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
    evidence: dict[str, Any] = Field(
        description="History criteria and values, node states, sizing; node_local: {suggested, reason, criteria}."
    )
    node_local: bool = Field(
        description="Node-local mode suggested (Sunway storage paper §6): the history is N-N and metadata-heavy "
        "or metadata-dominated; the job asks for it with srun --pharos-node-local=MOUNT or pharos run --node-local "
        "MOUNT."
    )
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
        "sync | pin | unpin | migration (a migration planned off a persistently fail-slow target) | migration_change | "
        "migration_cancel (an admin's change or cancel of a migration task)"
    )
    resource: str = Field(
        description="mapping | pool:<name> | node:<name> | target:<name> (migration) | migration:<node>/<task id>"
    )
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
    node_local: bool = Field(description="Node-local mode suggested (N-N and metadata-heavy or metadata-dominated).")


class IoClassesOut(BaseModel):
    items: list[IoClassOut]


# -- online migration (issue 27, item 1; forwarder/README.md "Online migration") ---------------


class MigrationTaskOut(BaseModel):
    """One migration task of a daemon (its ``GET /migrations``): one file's objects on the source
    target moving to one destination. Rates in MB/s (10^6 B/s), sizes in bytes."""

    model_config = ConfigDict(extra="allow")

    id: int
    path: str = Field(description="The file (path in the namespace).")
    source_target: str
    dest_target: str | None = Field(None, description="Chosen when the copy starts (the placement pool's best).")
    state: Literal["queued", "copying", "switched", "done", "failed", "cancelled", "deferred"]
    pinned: bool = Field(False, description="Pinned by an admin: the file stays where it is while pinned.")
    priority: int = 0
    min_mb_s: float = Field(0.0, description="MODM: the bandwidth guaranteed while copying.")
    max_mb_s: float | None = None
    unit_bytes: int = 0
    rate_mb_s: float = Field(0.0, description="Allocated now (0 unless copying).")
    bytes_done: int = 0
    bytes_left: int = 0
    recopies: int = Field(0, description="Copies redone because the file was written during them.")
    deferrals: int = Field(0, description="Switches put off because the file was open.")
    error: str | None = None
    copy_s: float = Field(0.0, description="Seconds of the last copy.")
    achieved_mb_s: float = Field(0.0, description="Bandwidth achieved over the last copy.")


class MigrationSettingsOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    max_total_mb_s: float = Field(description="MODM total cap of the daemon's migrations (MB/s).")
    max_active: int = Field(description="Tasks copying at once.")
    retry_s: float = Field(description="Seconds before a deferred task is tried again.")


class DaemonMigrationsOut(BaseModel):
    daemon: str = Field(description="Forwarding node name.")
    url: str = Field(description="Its admin base URL.")
    ok: bool = Field(description="Its GET /migrations answered.")
    error: str = Field(description="Why not ('' when ok).")
    settings: MigrationSettingsOut | None = None
    minimums_scaled: bool = Field(description="The copying tasks' minimums exceeded the cap and were scaled down.")
    tasks: list[MigrationTaskOut]
    bytes_left: int = Field(description="Bytes left to copy over the unfinished tasks listed.")
    states: dict[str, int] = Field(description="Tasks listed per state.")


class MigrationsOut(BaseModel):
    """Every daemon's migrations and the loop's plannings (the audit trail's ``migration`` rows)."""

    daemons: list[DaemonMigrationsOut]
    planned: list[ActionOut] = Field(description="The loop's migration plannings, newest first.")
    enabled: bool = Field(description="[control] migration_enabled.")
    dry_run: bool
    config: dict[str, Any] = Field(description="The loop's [control] migration_* settings.")


class MigrationChangeIn(BaseModel):
    """An admin's change of a task (what the daemon's ``PUT /migrations/{id}`` takes)."""

    model_config = ConfigDict(extra="forbid")

    pinned: bool | None = Field(None, description="true: the file stays where it is (a copy under way rolls back).")
    priority: int | None = Field(None, ge=-(2**31), le=2**31 - 1)
    min_mb_s: float | None = Field(None, ge=0, le=1e6)
    max_mb_s: float | None = Field(None, gt=0, le=1e6)
    reason: str = Field("", max_length=1000)


class MigrationCallOut(BaseModel):
    daemon: str
    id: int
    status: Literal["applied", "recorded"] = Field(description="recorded: the loop is in dry run, nothing forwarded.")
    task: dict[str, Any] | None = Field(description="The daemon's answer (None in dry run).")
