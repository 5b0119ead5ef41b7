"""Jobs: the job list, a job's I/O summary (pharos_analytics.summary), job events.

Units: bytes in bytes, times ISO 8601 UTC, durations in seconds, rates in MiB/s (2**20 B/s).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from pharos_analytics.pattern import Pattern
from pharos_analytics.summary_types import DxtCoverage, JobListItem, JobState, SummarySource

from .common import OutModel, model_of


class FileOut(OutModel):
    path: str = Field(description="Path, or dev:<dev>:inode:<inode> when the path is unknown.")
    bytes_read: int
    bytes_written: int
    reads: int = Field(description="Read requests (merged requests counted one by one).")
    writes: int = Field(description="Write requests.")
    ranks: int = Field(description="Distinct ranks that read or wrote the file.")


class NonFileOpsOut(OutModel):
    requests: int = Field(description="Requests on pipes, sockets and terminals.")
    bytes: int
    by_type: dict[str, int] = Field(description="File type -> requests.")


class DropsOut(OutModel):
    total: int = Field(description="ringbuf_drops + delivery_failures + overflow_drops.")
    ringbuf_drops: int
    delivery_failures: int
    overflow_drops: int
    unmerged_fallbacks: int = Field(description="Requests shipped unmerged; not a loss.")
    producers: int = Field(description="Producers that reported counters for the job.")


class GapOut(OutModel):
    """A stretch of the job's time on ``host`` with no batch from any eBPF agent there."""

    host: str
    producer: str = Field(description="The agent that fell silent (its producer id); '' when none was heard before.")
    start: datetime
    end: datetime
    next_producer: str = Field("", description="The agent heard next (a restarted one); '' when none yet.")
    duration_s: float


class CoverageOut(OutModel):
    """How the agents' coverage of the job was checked (pharos_analytics.coverage)."""

    checked: Literal["agents", "no-agent", "darshan", "no-time"] = Field(
        description="agents: the job's hosts with an agent were checked; no-agent: none of its hosts ever had one "
        "(nothing to miss); darshan: an imported Darshan log; no-time: the job has no time range."
    )
    hosts: list[str] = Field(description="Hosts checked: the job's hosts that had an agent.")
    unmonitored_hosts: list[str] = Field(description="The job's hosts (or compute-node names) without an agent.")
    silence_s: float = Field(description="Longest silence of a live agent (heartbeat_missed x heartbeat_interval_s).")


#: A Darshan job's DXT coverage: the fields of :class:`pharos_analytics.summary_types.DxtCoverage`.
DxtCoverageOut = model_of(
    DxtCoverage,
    "DxtCoverageOut",
    bytes=Field(description="Bytes of the DXT segments stored as requests (DXT_POSIX; DXT_MPIIO of files without it)."),
    counter_bytes=Field(
        description="Bytes the counters of the modules DXT traces count: POSIX_BYTES_READ + POSIX_BYTES_WRITTEN "
        "(MPIIO_BYTES_* for logs with neither POSIX nor DFS). DXT never traces STDIO, DFS or DAOS."
    ),
    share=Field(description="bytes / counter_bytes, 0..1 (1 when counter_bytes is 0)."),
    partial=Field(
        description="DXT holds less than the counters (share < 1) or a log marks DXT partial (out of trace "
        "memory): phases and heat maps show part of the I/O; the job's totals come from the counters."
    ),
    records=Field(0, description="DXT segments stored (io_requests rows)."),
    partial_modules=Field(default_factory=list, description="DXT modules a log marks partial (DXT_POSIX, DXT_MPIIO)."),
)


class JobSummaryOut(OutModel):
    """A job's I/O on one layer (Darshan counters, Beacon pattern); see pharos_analytics.summary."""

    job_id: str
    layer: str
    source: SummarySource = Field(
        "traces",
        description="Where the figures come from: traces: per-request rows (io_requests); darshan-counters: a "
        "Darshan log's module counters (no DXT); darshan-counters+dxt: the counters for every total, the DXT "
        "rows for records and data_records (per-request detail; see dxt).",
    )
    name: str | None
    user: str | None
    command: list[str]
    host: str | None
    ranks: int | None = Field(description="Ranks launched (start event).")
    exit_code: int | None
    start: datetime | None
    end: datetime | None
    state: JobState
    io_ranks: int = Field(description="Ranks that did data I/O on data files.")
    compute_nodes: list[str] = Field(
        default_factory=list,
        description="Compute nodes the job's requests on this layer came from (the agents' host on the client "
        "layer, the FUSE clients' compute node on the others), sorted.",
    )
    forwarding_nodes: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Compute node -> the forwarding nodes that served its requests (forwarder layer; empty on "
        "the client layer): the job's DFRA mapping as it ran.",
    )
    replayed_requests: int = Field(
        0,
        description="Requests the FUSE mounts replayed on another forwarding node after a node failed during them "
        "(forwarder layer; 0 on the client layer). Every figure counts each request once.",
    )
    duplicate_requests: int = Field(
        0,
        description="Replayed requests left out of every figure because their original execution (or an "
        "earlier replay) is counted: what a node that failed after executing them would have added twice.",
    )
    pattern: Pattern = Field(
        description="Beacon I/O pattern (NSDI'19 §4) decided by volume dominance over reads and writes "
        "(pharos_analytics.pattern.decide_pattern): the one every view of the job reports."
    )
    patterns: dict[str, Pattern] = Field(description="Pattern of reads alone and of writes alone (the modes).")
    fan_in_pattern: Pattern = Field(
        "none", description="Pattern of all data I/O together (file fan-in); used when no mode dominates."
    )
    bytes_read: int
    bytes_written: int
    ops: dict[str, int] = Field(description="Op -> requests, regular files and metadata ops.")
    other_ops: dict[str, int] = Field(description="Op -> requests not in ops nor non_file_ops (block layer, ...).")
    non_file_ops: NonFileOpsOut
    failed_requests: int = Field(description="Requests that returned -errno.")
    records: int = Field(description="Stored records (rows); each may merge several requests.")
    requests: int = Field(description="Requests (sum of the records' counts).")
    data_records: int = Field(description="Records of data ops on data files.")
    data_requests: int = Field(
        description="Requests of data ops on data files; data_records/data_requests is the merge ratio."
    )
    size_histogram: dict[str, dict[str, int]] = Field(
        description='{"read"|"write": {Darshan bin: requests}}, bins 0-100 ... 1G+.'
    )
    files: list[FileOut] = Field(description="Data files, largest first (at most files_limit).")
    n_files: int = Field(description="All data files of the job.")
    first_io: datetime | None
    last_io: datetime | None
    io_time_s: float = Field(description="Cumulative time inside data ops, over all ranks.")
    io_span_s: float | None = Field(description="last_io - first_io.")
    bandwidth_mib_s: float | None = Field(description="Data bytes / 2**20 / io_span_s.")
    dropped_records: int = Field(description="Records lost before the store (drops.total).")
    drops: DropsOut
    complete: bool = Field(
        True,
        description="False when an eBPF agent on one of the job's hosts was silent (dead, hung, cut off from "
        "Kafka) while the job ran: see gaps; the figures are then a lower bound.",
    )
    gaps: list[GapOut] = Field(default_factory=list, description="Where and when no agent watched the job.")
    coverage: CoverageOut | None = None
    dxt: DxtCoverageOut | None = Field(
        None, description="A Darshan job's DXT coverage (client layer, logs with DXT); null otherwise."
    )


#: One line of the job list: the fields of :class:`pharos_analytics.summary.JobListItem`, in its
#: order and with its types and defaults (one definition of the line), described for the API.
JobListItemOut = model_of(
    JobListItem,
    "JobListItemOut",
    pattern=Field(description="As JobSummaryOut.pattern (volume dominance)."),
    patterns=Field(default_factory=dict, description="Pattern of reads and of writes."),
    source=Field(
        "traces",
        description="darshan-counters / darshan-counters+dxt: bytes and pattern from a Darshan log's module "
        "counters (without / with DXT), as JobSummaryOut.source.",
    ),
)


class JobListOut(BaseModel):
    items: list[JobListItemOut]
    total: int = Field(description="Jobs with at least one event.")
    limit: int
    offset: int


class JobEventIn(BaseModel):
    """A job's start or end, as a scheduler plugin reports it (the Pharos SPANK plugin does at its
    job prolog and epilog); stored as a ``JobEvent`` on the jobs topic like ``pharos run``'s."""

    kind: Literal["start", "end"]
    name: str = Field("", max_length=256, description="Job name (Slurm: --job-name).")
    user: str = Field("", max_length=256)
    command: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=256)
    ranks: int = Field(0, ge=0, le=10_000_000, description="Tasks of the job (0: not known yet).")
    host: str = Field("", max_length=1024, description="Node or node list (Slurm hostlist, e.g. cn[1-4]).")
    exit_code: int = Field(0, ge=-(2**31), le=2**31 - 1, description="End only: the job's exit code.")
    time_ns: int | None = Field(None, ge=0, le=2**63 - 1, description="Wall clock ns; default: now.")


class JobEventOut(BaseModel):
    job_id: str
    kind: Literal["start", "end"]
    time_ns: int
    delivered: bool = Field(description="Acknowledged by Kafka (acks=all).")
