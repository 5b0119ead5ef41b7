"""The result types of the job summary and job list (:mod:`pharos_analytics.summary`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from .coverage import Coverage, Gap
from .pattern import Pattern

JobState = Literal["running", "finished", "failed", "unknown"]
#: Where a summary's figures come from: ``io_requests`` rows (``traces``), or a Darshan job's
#: module counters, without DXT rows (``darshan-counters``) or with DXT rows that give the
#: per-request detail (``darshan-counters+dxt``); see :mod:`pharos_analytics.summary`.
SummarySource = Literal["traces", "darshan-counters", "darshan-counters+dxt"]


# --------------------------------------------------------------------------------------
# Result types


@dataclass(frozen=True)
class FileSummary:
    """One data file of a job: bytes moved, requests (sum of ``count``), distinct ranks."""

    path: str
    bytes_read: int
    bytes_written: int
    reads: int
    writes: int
    ranks: int


@dataclass(frozen=True)
class NonFileOps:
    """Requests and bytes on pipes, sockets and terminals; ``by_type`` maps file type -> requests."""

    requests: int = 0
    bytes: int = 0
    by_type: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Drops:
    """Records lost before the store, summed over producers (latest counters of each).

    ``unmerged_fallbacks`` are requests shipped unmerged (not a loss) and are not in ``total``.
    """

    total: int = 0
    ringbuf_drops: int = 0
    delivery_failures: int = 0
    overflow_drops: int = 0
    unmerged_fallbacks: int = 0
    producers: int = 0


@dataclass(frozen=True)
class DxtCoverage:
    """How much of a Darshan job's I/O its DXT trace holds (client layer, all the job's logs).

    ``bytes`` (bytes) and ``records`` are the DXT segments stored as ``io_requests`` rows
    (DXT_POSIX, and DXT_MPIIO of files without DXT_POSIX). ``counter_bytes`` (bytes) is what the
    counters of the modules DXT can trace say: ``POSIX_BYTES_READ`` + ``POSIX_BYTES_WRITTEN``
    (``MPIIO_BYTES_*`` for logs with neither POSIX nor DFS) over every record, standard streams
    included; DXT never traces STDIO, DFS or DAOS, so their bytes are in neither figure.
    ``share`` = ``bytes / counter_bytes`` in [0, 1] (capped at 1; 1.0 when ``counter_bytes`` is 0).
    ``partial_modules``: the DXT modules (``DXT_POSIX``, ``DXT_MPIIO``) a log marks as partial
    (DXT ran out of its trace memory). ``partial`` is true when ``share < 1`` or
    ``partial_modules`` is not empty: the per-request detail (phases, heat map) then shows part of
    the job's I/O, the totals do not (they come from the counters).
    """

    bytes: int
    counter_bytes: int
    share: float
    partial: bool
    records: int = 0
    partial_modules: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class JobSummary:
    """What one job did on one layer. Bytes in bytes, times UTC, rates in MiB/s (2**20 B/s).

    ``size_histogram`` is ``{"read": {bin: requests}, "write": {bin: requests}}`` with
    Darshan's bins (:data:`SIZE_BINS`, all present, in order), weighted by ``count``.
    ``pattern`` is the job's Beacon pattern decided by volume dominance over its reads and
    writes (:func:`pharos_analytics.pattern.decide_pattern`, NSDI'19 §4); ``patterns`` is the
    pattern of reads alone and of writes alone (the modes), ``fan_in_pattern`` the pattern of
    all data I/O together (the answer when no mode dominates).
    ``io_time_s`` is the cumulative time inside data ops (Darshan's ``POSIX_F_*_TIME``,
    summed over ranks and threads); ``io_span_s`` is ``last_io - first_io``;
    ``bandwidth_mib_s`` is ``(bytes_read + bytes_written) / 2**20 / io_span_s``, ``None``
    without data I/O or with a zero span.
    ``source`` is ``"traces"`` (``io_requests``), ``"darshan-counters"`` (a Darshan job without
    DXT rows: every figure from the module counters) or ``"darshan-counters+dxt"`` (a Darshan job
    with DXT rows: totals from the counters, ``records``/``data_records`` the DXT rows); see
    :mod:`pharos_analytics.summary` for the counters behind each field. ``dxt`` is the DXT
    coverage of a Darshan job whose logs have a DXT module (:class:`DxtCoverage`), else ``None``.
    ``compute_nodes`` are the nodes the job's requests on ``layer`` came from (sorted names: the
    agents' host on the client layer, the FUSE clients' compute node on the others);
    ``forwarding_nodes`` maps each of them to the forwarding nodes that served its requests
    (forwarder and storage layers; DFRA maps compute nodes to forwarding nodes).
    A request a FUSE mount replayed on another forwarding node counts once in every figure (the
    original's node in ``forwarding_nodes``): ``replayed_requests`` are the requests the mounts
    sent as replays, ``duplicate_requests`` those of them left out because another record of the
    same request counts (both 0 on the client layer; see :mod:`pharos_analytics.summary`).
    ``complete`` is false when an agent on one of the job's hosts was silent (dead, hung, cut
    off from Kafka) during the job: ``gaps`` says where and when, the figures are a lower
    bound; ``coverage`` how it was checked (:mod:`pharos_analytics.coverage`). Both are about
    the agents (client layer), whatever ``layer``.
    """

    job_id: str
    layer: str
    name: str | None
    user: str | None
    command: list[str]
    host: str | None
    ranks: int | None
    exit_code: int | None
    start: datetime | None
    end: datetime | None
    state: JobState
    io_ranks: int
    pattern: Pattern
    patterns: dict[str, Pattern]
    bytes_read: int
    bytes_written: int
    ops: dict[str, int]
    other_ops: dict[str, int]
    non_file_ops: NonFileOps
    failed_requests: int
    records: int
    requests: int
    data_records: int
    data_requests: int
    size_histogram: dict[str, dict[str, int]]
    files: list[FileSummary]
    n_files: int
    first_io: datetime | None
    last_io: datetime | None
    io_time_s: float
    io_span_s: float | None
    bandwidth_mib_s: float | None
    dropped_records: int
    drops: Drops
    source: SummarySource = "traces"
    fan_in_pattern: Pattern = "none"
    complete: bool = True
    gaps: list[Gap] = field(default_factory=list)
    coverage: Coverage | None = None
    compute_nodes: list[str] = field(default_factory=list)
    forwarding_nodes: dict[str, list[str]] = field(default_factory=dict)
    dxt: DxtCoverage | None = None
    replayed_requests: int = 0
    duplicate_requests: int = 0


@dataclass(frozen=True)
class JobListItem:
    """One line of the job list (client layer unless asked otherwise)."""

    job_id: str
    name: str | None
    user: str | None
    host: str | None
    ranks: int | None
    state: JobState
    exit_code: int | None
    start: datetime | None
    end: datetime | None
    pattern: Pattern
    io_ranks: int
    n_files: int
    bytes_read: int
    bytes_written: int
    patterns: dict[str, Pattern] = field(default_factory=dict)
    fan_in_pattern: Pattern = "none"
    source: SummarySource = "traces"
