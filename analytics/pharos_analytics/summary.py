"""Per-job I/O summary and job list, aggregated in ClickHouse.

Every number is computed by SQL in the store (named query constants below, bound
parameters for every input); Python only reshapes the few aggregate rows. The counters
follow Darshan's POSIX module where it has one (bytes, op counts, access-size histogram,
cumulative I/O time); the I/O pattern follows Beacon (NSDI'19 §4, see
:mod:`pharos_analytics.pattern`).

Definitions used throughout (one layer at a time, ``client`` by default):

* *data ops*: ``read``/``pread``/``readv`` (reads) and ``write``/``pwrite``/``writev``
  (writes) on **regular** files. ``bytes_read``/``bytes_written``, the size histogram,
  ``first_io``/``last_io`` and ``io_time_s`` count data ops on data files only (below),
  as Darshan excludes system paths by default (DARSHAN_EXCLUDE_DIRS: /etc, /dev, /usr,
  /lib, /proc, /sys, ...): loading shared libraries is not the job's I/O.
* *data files*: regular files outside system paths
  (:data:`pharos_analytics.pattern.SYSTEM_PREFIXES`) that saw data ops. ``files``,
  ``n_files``, ``io_ranks`` and ``pattern`` use data files only. A file is its path, or
  ``dev:<dev>:inode:<inode>`` when the path is unknown.
* *non-file ops*: any op on pipes, sockets and character devices (terminals), and data ops on
  the standard streams (path ``<STDIN>``/``<STDOUT>``/``<STDERR>``: descriptors 0-2 inherited
  from the launcher, as Darshan's STDIO module names them; ``by_type`` key ``stdio``), counted
  apart.
* ``ops``: requests per op on regular files plus metadata ops (open, close, fsync,
  fdatasync, stat, unlink, mkdir, rename) on anything but non-file descriptors;
  everything else (block-layer ops, data ops on directories or unknown file types) is in
  ``other_ops``, so ``sum(ops) + non_file_ops.requests + sum(other_ops) == requests``.
* A row of ``io_requests`` is a run of ``count`` merged requests (Beacon's compression);
  ``records`` counts rows, ``requests`` sums ``count``; ``data_records``/``data_requests``
  do the same for data ops on data files, so their ratio is the merge ratio of the job's
  data I/O (metadata ops are never merged).

Darshan fallback (``source == "darshan-counters"``): a job whose ``client`` layer has no
data-op rows in ``io_requests`` (a Darshan log imported without DXT) but has rows in
``darshan_counters`` is summarised from the module counters instead
(:data:`JOB_DARSHAN_SQL`, one query). Per log, the POSIX and STDIO modules are used; a log
without a POSIX module uses MPI-IO instead (never both: MPI-IO bytes are the POSIX bytes
one layer up). The standard streams ``<STDIN>``/``<STDOUT>``/``<STDERR>`` count as
non-file ops (``by_type`` key ``stdio``). Counter -> summary field:

* ``bytes_read``/``bytes_written`` (bytes): ``POSIX_BYTES_READ``/``_WRITTEN`` +
  ``STDIO_BYTES_READ``/``_WRITTEN`` (``MPIIO_BYTES_*`` for logs without POSIX).
* ``ops`` (requests): ``read`` = ``POSIX_READS`` + ``STDIO_READS`` (or
  ``MPIIO_{INDEP,COLL,SPLIT,NB}_READS``), ``write`` likewise, ``open`` = ``POSIX_OPENS`` +
  ``STDIO_OPENS`` (or ``MPIIO_{INDEP,COLL}_OPENS``), ``stat`` = ``POSIX_STATS``,
  ``fsync`` = ``POSIX_FSYNCS`` (or ``MPIIO_SYNCS``), ``fdatasync`` = ``POSIX_FDSYNCS``.
  Seeks, mmaps and dup/fileno calls are not I/O requests in Pharos' op model and are left out.
  ``requests`` = ``data_requests`` + metadata ops; ``records`` = ``data_records`` = 0
  (no stored rows).
* ``size_histogram``: ``POSIX_SIZE_{READ,WRITE}_<bin>`` (``MPIIO_SIZE_*_AGG_<bin>``);
  STDIO has no histogram, so its requests are not binned.
* ``io_time_s`` (s): ``POSIX_F_READ_TIME`` + ``POSIX_F_WRITE_TIME`` (+ STDIO/MPI-IO alike).
* ``files``/``n_files``: records (by path) with bytes, reads, writes or opens.
  ``io_ranks``/``pattern``: ranks >= 0 of those records; a shared record (rank -1,
  reduced over ranks) stands for every rank of its log (``darshan_logs.nprocs``,
  shifted by ``rank_offset``).
* ``first_io``/``last_io``: the earliest ``darshan_logs.start`` and latest ``end`` of the
  job's logs (the counters carry no absolute times), so ``io_span_s`` is the logs' span.
* ``failed_requests`` = 0: Darshan counts no failed requests.

Rows older than the table's TTL (90 days) are gone; a job then shows only its events.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

from pharos_pipeline.store import Store

from .pattern import STREAM_PATHS, SYSTEM_PATH_REGEX, Pattern, classify_fan_in, decide_directions

if TYPE_CHECKING:
    from .coverage import Coverage, Gap

READ_OPS: tuple[str, ...] = ("read", "pread", "readv")
WRITE_OPS: tuple[str, ...] = ("write", "pwrite", "writev")
DATA_OPS: tuple[str, ...] = READ_OPS + WRITE_OPS
META_OPS: tuple[str, ...] = ("open", "close", "fsync", "fdatasync", "stat", "unlink", "mkdir", "rename")
#: File types whose I/O is not file I/O (io.proto ``FileType``): pipes, sockets, terminals.
NON_FILE_TYPES: tuple[str, ...] = ("pipe", "socket", "char_device")
LAYERS: tuple[str, ...] = ("client", "forwarder", "storage")

#: Darshan's POSIX access-size bins (``POSIX_SIZE_READ_0_100`` ... ``_1G_PLUS``): label and
#: lower bound in bytes; bin i holds sizes in [lower_i, lower_{i+1}).
SIZE_BINS: tuple[tuple[str, int], ...] = (
    ("0-100", 0),
    ("100-1K", 100),
    ("1K-10K", 1024),
    ("10K-100K", 10240),
    ("100K-1M", 102400),
    ("1M-4M", 1048576),
    ("4M-10M", 4194304),
    ("10M-100M", 10485760),
    ("100M-1G", 104857600),
    ("1G+", 1073741824),
)

JobState = Literal["running", "finished", "failed", "unknown"]
#: Where a summary's figures come from: ``io_requests`` rows, or Darshan module counters.
SummarySource = Literal["traces", "darshan-counters"]


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
    ``source`` is ``"traces"`` (``io_requests``) or ``"darshan-counters"`` (the Darshan
    fallback, see the module docstring for the counters behind each field).
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


# --------------------------------------------------------------------------------------
# SQL. Constant fragments below are built from the module's own tuples, never from input;
# every input (job id, layer, paging) is a bound {name:Type} parameter.


def sql_list(values: tuple[str, ...]) -> str:
    """A SQL tuple literal ``('a', 'b')`` of constant identifiers (op names, file types).

    Raises ValueError for anything that is not a plain identifier: never pass user input."""
    for v in values:  # constants only; refuse anything that would need escaping
        if not v.replace("_", "").isalnum():
            raise ValueError(f"not a plain identifier: {v!r}")
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


_READ = f"op IN {sql_list(READ_OPS)}"
_WRITE = f"op IN {sql_list(WRITE_OPS)}"
_DATA = f"file_type = 'regular' AND op IN {sql_list(DATA_OPS)}"
_DATA_FILE = f"{_DATA} AND NOT match(path, {{system_re:String}})"
_FILE_KEY = "if(path != '', path, concat('dev:', toString(dev), ':inode:', toString(inode)))"
_SIZE_BOUNDS = "[" + ", ".join(str(lo) for _, lo in SIZE_BINS[1:]) + "]"

_JOB_EVENTS_SELECT = """
SELECT
    job_id,
    countIf(kind = 'start') > 0                             AS has_start,
    countIf(kind = 'end') > 0                               AS has_end,
    anyIf(name, kind = 'start')                             AS name,
    anyIf(user, kind = 'start')                             AS user,
    anyIf(command, kind = 'start')                          AS command,
    anyIf(host, kind = 'start')                             AS host,
    anyIf(ranks, kind = 'start')                            AS ranks,
    anyIf(exit_code, kind = 'end')                          AS exit_code,
    toUnixTimestamp64Nano(minIf(time, kind = 'start'))      AS start_ns,
    toUnixTimestamp64Nano(maxIf(time, kind = 'end'))        AS end_ns
FROM job_events FINAL
"""

#: The start/end events of one job, merged into one row (none when the job has no event).
JOB_EVENTS_SQL = _JOB_EVENTS_SELECT + "WHERE job_id = {job_id:String} GROUP BY job_id"

#: Requests, bytes, failures, time and I/O window per (op, file_type) of one job and layer.
JOB_OPS_SQL = """
SELECT
    op,
    file_type,
    count()                                  AS records,
    sum(count)                               AS requests,
    sum(bytes)                               AS bytes,
    sumIf(count, result < 0)                 AS failed,
    sum(duration_ns)                         AS duration_ns,
    toUnixTimestamp64Nano(min(start))        AS first_ns,
    toUnixTimestamp64Nano(max(end))          AS last_ns,
    match(path, {system_re:String})          AS system_path,
    path IN __STREAMS__                      AS stream
FROM io_requests
WHERE job_id = {job_id:String} AND layer = {layer:String}
GROUP BY op, file_type, system_path, stream
""".replace("__STREAMS__", "(" + ", ".join(f"'{p}'" for p in STREAM_PATHS) + ")")

#: Darshan access-size histogram of data ops: requests per (direction, bin index).
JOB_SIZE_HISTOGRAM_SQL = f"""
SELECT
    if({_READ}, 'read', 'write')                     AS direction,
    arrayCount(b -> b <= size, {_SIZE_BOUNDS})       AS bin,
    sum(count)                                       AS requests
FROM io_requests
WHERE job_id = {{job_id:String}} AND layer = {{layer:String}} AND {_DATA_FILE}
GROUP BY direction, bin
"""

#: The job's data files, largest first, at most {limit}.
JOB_FILES_SQL = f"""
SELECT
    {_FILE_KEY}                      AS file,
    sumIf(bytes, {_READ})            AS bytes_read,
    sumIf(bytes, {_WRITE})           AS bytes_written,
    sumIf(count, {_READ})            AS reads,
    sumIf(count, {_WRITE})           AS writes,
    uniqExact(rank)                  AS ranks
FROM io_requests
WHERE job_id = {{job_id:String}} AND layer = {{layer:String}} AND {_DATA_FILE}
GROUP BY file
ORDER BY bytes_read + bytes_written DESC, file
LIMIT {{limit:UInt32}}
"""

#: Beacon fan-in statistics per job (all data ops, reads only, writes only): distinct
#: I/O ranks, data files, and the largest number of ranks on one file. ``__JOBS__`` is
#: replaced by the caller's job filter (a bound-parameter condition on ``job_id``).
FAN_IN_SELECT = f"""
SELECT
    job_id,
    length(groupUniqArrayArray(all_ranks))                  AS n_ranks,
    count()                                                 AS n_files,
    max(length(all_ranks))                                  AS max_fan_in,
    length(groupUniqArrayArray(read_ranks))                 AS n_read_ranks,
    countIf(notEmpty(read_ranks))                           AS n_read_files,
    max(length(read_ranks))                                 AS max_read_fan_in,
    length(groupUniqArrayArray(write_ranks))                AS n_write_ranks,
    countIf(notEmpty(write_ranks))                          AS n_write_files,
    max(length(write_ranks))                                AS max_write_fan_in
FROM
(
    SELECT
        job_id,
        {_FILE_KEY}                                 AS file,
        groupUniqArray(rank)                        AS all_ranks,
        groupUniqArrayIf(rank, {_READ})             AS read_ranks,
        groupUniqArrayIf(rank, {_WRITE})            AS write_ranks
    FROM io_requests
    WHERE __JOBS__ AND layer = {{layer:String}} AND {_DATA_FILE}
    GROUP BY job_id, file
)
GROUP BY job_id
"""
JOB_FAN_IN_SQL = FAN_IN_SELECT.replace("__JOBS__", "job_id = {job_id:String}")

#: Loss counters of one job: the newest row of each producer, summed.
JOB_DROPS_SQL = """
SELECT
    count()                 AS producers,
    sum(ringbuf_drops)      AS ringbuf_drops,
    sum(delivery_failures)  AS delivery_failures,
    sum(overflow_drops)     AS overflow_drops,
    sum(unmerged_fallbacks) AS unmerged_fallbacks
FROM
(
    SELECT
        producer_id,
        argMax(ringbuf_drops, updated)      AS ringbuf_drops,
        argMax(delivery_failures, updated)  AS delivery_failures,
        argMax(overflow_drops, updated)     AS overflow_drops,
        argMax(unmerged_fallbacks, updated) AS unmerged_fallbacks
    FROM producer_drops
    WHERE job_id = {job_id:String}
    GROUP BY producer_id
)
"""

#: Darshan counter names behind each fallback figure (see the module docstring). POSIX and
#: STDIO names apply to every log, MPI-IO names only to logs without a POSIX module.
DARSHAN_COUNTERS: dict[str, tuple[str, ...]] = {
    "bytes_read": ("POSIX_BYTES_READ", "STDIO_BYTES_READ", "MPIIO_BYTES_READ"),
    "bytes_written": ("POSIX_BYTES_WRITTEN", "STDIO_BYTES_WRITTEN", "MPIIO_BYTES_WRITTEN"),
    "reads": (
        "POSIX_READS",
        "STDIO_READS",
        "MPIIO_INDEP_READS",
        "MPIIO_COLL_READS",
        "MPIIO_SPLIT_READS",
        "MPIIO_NB_READS",
    ),
    "writes": (
        "POSIX_WRITES",
        "STDIO_WRITES",
        "MPIIO_INDEP_WRITES",
        "MPIIO_COLL_WRITES",
        "MPIIO_SPLIT_WRITES",
        "MPIIO_NB_WRITES",
    ),
    "opens": ("POSIX_OPENS", "STDIO_OPENS", "MPIIO_INDEP_OPENS", "MPIIO_COLL_OPENS"),
    "stats": ("POSIX_STATS",),
    "fsyncs": ("POSIX_FSYNCS", "MPIIO_SYNCS"),
    "fdsyncs": ("POSIX_FDSYNCS",),
    "io_time_s": (
        "POSIX_F_READ_TIME",
        "POSIX_F_WRITE_TIME",
        "STDIO_F_READ_TIME",
        "STDIO_F_WRITE_TIME",
        "MPIIO_F_READ_TIME",
        "MPIIO_F_WRITE_TIME",
    ),
}
#: Darshan's counter suffix of each :data:`SIZE_BINS` bin (``POSIX_SIZE_READ_<suffix>``).
_DARSHAN_BIN_SUFFIXES: tuple[str, ...] = (
    "0_100",
    "100_1K",
    "1K_10K",
    "10K_100K",
    "100K_1M",
    "1M_4M",
    "4M_10M",
    "10M_100M",
    "100M_1G",
    "1G_PLUS",
)
#: Darshan's names of the standard streams (STDIO records): non-file ops, not data files.
DARSHAN_STREAMS: tuple[str, ...] = ("<STDIN>", "<STDOUT>", "<STDERR>")


def _sum_counters(names: tuple[str, ...]) -> str:
    return f"sumIf(value, counter IN {sql_list(names)})"


def _hist_counters(direction: str) -> str:
    """An array with one sum per size bin: POSIX bins, or MPI-IO aggregate bins."""
    return (
        "["
        + ", ".join(
            _sum_counters((f"POSIX_SIZE_{direction}_{b}", f"MPIIO_SIZE_{direction}_AGG_{b}"))
            for b in _DARSHAN_BIN_SUFFIXES
        )
        + "]"
    )


_STREAMS = "(" + ", ".join(f"'{v}'" for v in DARSHAN_STREAMS) + ")"  # constants with <>: no sql_list

#: The Darshan fallback of one job, one row (see the module docstring): totals over data
#: files and over the standard streams, size histogram, fan-in statistics (as
#: :data:`FAN_IN_SELECT`), the {limit:UInt32} largest files as tuples (path, bytes_read,
#: bytes_written, reads, writes, ranks) and the logs' time span. ``counted_files`` (files
#: and streams) is 0 when the job has no counters of a completely imported log.
JOB_DARSHAN_SQL = f"""
WITH logs AS
(
    SELECT log_id, nprocs, rank_offset, has(modules, 'POSIX') AS has_posix,
           toUnixTimestamp64Nano(start) AS start_ns, toUnixTimestamp64Nano(end) AS end_ns
    FROM darshan_logs FINAL
    WHERE job_id = {{job_id:String}}
)
SELECT
    count()                                                         AS counted_files,
    sumIf(f_bytes_read, NOT f_stream)                                   AS bytes_read,
    sumIf(f_bytes_written, NOT f_stream)                                AS bytes_written,
    sumIf(f_reads, NOT f_stream)                                        AS reads,
    sumIf(f_writes, NOT f_stream)                                       AS writes,
    sumIf(f_opens, NOT f_stream)                                        AS opens,
    sumIf(f_stats, NOT f_stream)                                        AS stats,
    sumIf(f_fsyncs, NOT f_stream)                                       AS fsyncs,
    sumIf(f_fdsyncs, NOT f_stream)                                      AS fdsyncs,
    sumIf(f_io_time_s, NOT f_stream)                                    AS io_time_s,
    sumIf(f_reads + f_writes + f_opens + f_stats + f_fsyncs + f_fdsyncs, f_stream) AS stream_requests,
    sumIf(f_bytes_read + f_bytes_written, f_stream)                       AS stream_bytes,
    sumForEachIf(f_hist_read, NOT f_stream)                             AS hist_read,
    sumForEachIf(f_hist_write, NOT f_stream)                            AS hist_write,
    length(groupUniqArrayArrayIf(all_ranks, data_file))            AS n_ranks,
    countIf(data_file)                                             AS n_files,
    maxIf(length(all_ranks), data_file)                            AS max_fan_in,
    length(groupUniqArrayArrayIf(read_ranks, data_file))           AS n_read_ranks,
    countIf(data_file AND notEmpty(read_ranks))                    AS n_read_files,
    maxIf(length(read_ranks), data_file)                           AS max_read_fan_in,
    length(groupUniqArrayArrayIf(write_ranks, data_file))          AS n_write_ranks,
    countIf(data_file AND notEmpty(write_ranks))                   AS n_write_files,
    maxIf(length(write_ranks), data_file)                          AS max_write_fan_in,
    arraySlice(arraySort(x -> (-(x.2 + x.3), x.1),
        groupArrayIf((file, toUInt64(f_bytes_read), toUInt64(f_bytes_written), toUInt64(f_reads),
                      toUInt64(f_writes), length(all_ranks)), data_file)), 1, {{limit:UInt32}}) AS files,
    (SELECT min(start_ns) FROM logs)                                AS start_ns,
    (SELECT max(end_ns) FROM logs)                                  AS end_ns
FROM
(
    SELECT
        file,
        any(r_stream)                                                 AS f_stream,
        sum(r_bytes_read) AS f_bytes_read, sum(r_bytes_written) AS f_bytes_written,
        sum(r_reads) AS f_reads, sum(r_writes) AS f_writes, sum(r_opens) AS f_opens, sum(r_stats) AS f_stats,
        sum(r_fsyncs) AS f_fsyncs, sum(r_fdsyncs) AS f_fdsyncs, sum(r_io_time_s) AS f_io_time_s,
        sumForEach(r_hist_read) AS f_hist_read, sumForEach(r_hist_write) AS f_hist_write,
        groupUniqArrayArray(ranks)                                  AS all_ranks,
        groupUniqArrayArrayIf(ranks, r_reads > 0 OR r_bytes_read > 0)   AS read_ranks,
        groupUniqArrayArrayIf(ranks, r_writes > 0 OR r_bytes_written > 0) AS write_ranks,
        NOT f_stream AND f_bytes_read + f_bytes_written + f_reads + f_writes + f_opens > 0    AS data_file
    FROM
    (
        SELECT
            if(c.path != '', c.path, concat('darshan:record:', hex(c.record_id))) AS file,
            c.path IN {_STREAMS}                                    AS r_stream,
            if(c.rank < 0, arrayMap(i -> toInt32(l.rank_offset + i), range(l.nprocs)), [c.rank]) AS ranks,
            {_sum_counters(DARSHAN_COUNTERS["bytes_read"])}         AS r_bytes_read,
            {_sum_counters(DARSHAN_COUNTERS["bytes_written"])}      AS r_bytes_written,
            {_sum_counters(DARSHAN_COUNTERS["reads"])}              AS r_reads,
            {_sum_counters(DARSHAN_COUNTERS["writes"])}             AS r_writes,
            {_sum_counters(DARSHAN_COUNTERS["opens"])}              AS r_opens,
            {_sum_counters(DARSHAN_COUNTERS["stats"])}              AS r_stats,
            {_sum_counters(DARSHAN_COUNTERS["fsyncs"])}             AS r_fsyncs,
            {_sum_counters(DARSHAN_COUNTERS["fdsyncs"])}            AS r_fdsyncs,
            {_sum_counters(DARSHAN_COUNTERS["io_time_s"])}          AS r_io_time_s,
            {_hist_counters("READ")}                                AS r_hist_read,
            {_hist_counters("WRITE")}                               AS r_hist_write
        FROM darshan_counters AS c
        INNER JOIN logs AS l ON c.log_id = l.log_id
        WHERE c.job_id = {{job_id:String}}
          AND (c.module IN ('POSIX', 'STDIO') OR (c.module = 'MPI-IO' AND NOT l.has_posix))
        GROUP BY c.log_id, c.record_id, c.rank, c.path, l.rank_offset, l.nprocs
    )
    GROUP BY file
)
"""

#: A page of jobs (newest start first) with their events; ``only_user`` 1: the jobs whose start
#: event names ``user`` (an API token of role 'user').
JOBS_PAGE_SQL = (
    _JOB_EVENTS_SELECT
    + """WHERE {only_user:UInt8} = 0
   OR job_id IN (SELECT job_id FROM job_events WHERE kind = 'start' AND user = {user:String})
GROUP BY job_id
ORDER BY if(has_start, start_ns, end_ns) DESC, job_id DESC
LIMIT {limit:UInt32} OFFSET {offset:UInt64}"""
)

_PAGE_IDS = f"job_id IN (SELECT job_id FROM ({JOBS_PAGE_SQL}))"

#: Data bytes of the jobs on a page.
JOBS_PAGE_BYTES_SQL = f"""
SELECT
    job_id,
    sumIf(bytes, {_READ})   AS bytes_read,
    sumIf(bytes, {_WRITE})  AS bytes_written
FROM io_requests
WHERE {_PAGE_IDS} AND layer = {{layer:String}} AND {_DATA_FILE}
GROUP BY job_id
"""

#: Fan-in statistics of the jobs on a page.
JOBS_PAGE_FAN_IN_SQL = FAN_IN_SELECT.replace("__JOBS__", _PAGE_IDS)

#: Number of jobs with at least one event (``only_user`` 1: started by ``user``).
JOBS_COUNT_SQL = (
    "SELECT uniqExact(job_id) AS jobs FROM job_events "
    "WHERE {only_user:UInt8} = 0 OR (kind = 'start' AND user = {user:String})"
)


# --------------------------------------------------------------------------------------
# Helpers


def ns_to_datetime(ns: int | None) -> datetime | None:
    """ns since the epoch -> an aware UTC datetime (µs precision); ``None`` for None or 0."""
    if not ns:
        return None
    ns = int(ns)
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC) + timedelta(microseconds=(ns % 1_000_000_000) // 1000)


def _state(ev: dict | None) -> JobState:
    if ev is None or not (ev["has_start"] or ev["has_end"]):
        return "unknown"
    if not ev["has_end"]:
        return "running"
    return "finished" if int(ev["exit_code"]) == 0 else "failed"


def _check_layer(layer: str) -> None:
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; expected one of {', '.join(LAYERS)}")


def fan_in_patterns(
    fan: dict | None, bytes_read: int, bytes_written: int
) -> tuple[int, int, Pattern, dict[str, Pattern], Pattern]:
    """(io_ranks, n_files, pattern, {"read": p, "write": p}, fan-in pattern) from a fan-in row
    (the columns of :data:`FAN_IN_SELECT`) and the bytes read and written (bytes): the pattern
    is decided by Beacon's volume dominance over the two directions
    (:func:`pharos_analytics.pattern.decide_directions`)."""
    if fan is None:
        return 0, 0, "none", {"read": "none", "write": "none"}, "none"

    def g(k):
        return int(fan[k] or 0)

    fan_in = classify_fan_in(g("n_ranks"), g("n_files"), g("max_fan_in"))
    patterns: dict[str, Pattern] = {
        "read": classify_fan_in(g("n_read_ranks"), g("n_read_files"), g("max_read_fan_in")),
        "write": classify_fan_in(g("n_write_ranks"), g("n_write_files"), g("max_write_fan_in")),
    }
    return (
        g("n_ranks"),
        g("n_files"),
        decide_directions(patterns, bytes_read, bytes_written, fan_in),
        patterns,
        fan_in,
    )


def _darshan_figures(store: Store, job_id: str, files_limit: int) -> dict | None:
    """The JobSummary fields computed from the job's Darshan counters (:data:`JOB_DARSHAN_SQL`),
    ``None`` when the job has none. Units and counter names: see the module docstring."""
    r = store.query(JOB_DARSHAN_SQL, {"job_id": job_id, "limit": files_limit})[0]
    if not int(r["counted_files"]):
        return None

    def g(k):
        return int(r[k] or 0)

    reads, writes = g("reads"), g("writes")
    ops = {
        "read": reads,
        "write": writes,
        "open": g("opens"),
        "stat": g("stats"),
        "fsync": g("fsyncs"),
        "fdatasync": g("fdsyncs"),
    }
    ops = {op: n for op, n in sorted(ops.items()) if n}
    hist = {
        d: {label: int(r[f"hist_{d}"][i]) if len(r[f"hist_{d}"]) > i else 0 for i, (label, _) in enumerate(SIZE_BINS)}
        for d in ("read", "write")
    }
    io_ranks, n_files, pattern, patterns, fan_in = fan_in_patterns(r, g("bytes_read"), g("bytes_written"))
    first_ns, last_ns = g("start_ns") or None, g("end_ns") or None
    span_s = (last_ns - first_ns) / 1e9 if first_ns and last_ns else None
    total = g("bytes_read") + g("bytes_written")
    stream_requests = g("stream_requests")
    return {
        "source": "darshan-counters",
        "io_ranks": io_ranks,
        "pattern": pattern,
        "patterns": patterns,
        "fan_in_pattern": fan_in,
        "bytes_read": g("bytes_read"),
        "bytes_written": g("bytes_written"),
        "ops": ops,
        "other_ops": {},
        "non_file_ops": NonFileOps(
            requests=stream_requests,
            bytes=g("stream_bytes"),
            by_type={"stdio": stream_requests} if stream_requests else {},
        ),
        "failed_requests": 0,
        "records": 0,
        "requests": sum(ops.values()) + stream_requests,
        "data_records": 0,
        "data_requests": reads + writes,
        "size_histogram": hist,
        "files": [
            FileSummary(
                path=f[0],
                bytes_read=int(f[1]),
                bytes_written=int(f[2]),
                reads=int(f[3]),
                writes=int(f[4]),
                ranks=int(f[5]),
            )
            for f in r["files"]
        ],
        "n_files": n_files,
        "first_io": ns_to_datetime(first_ns),
        "last_io": ns_to_datetime(last_ns),
        "io_time_s": float(r["io_time_s"] or 0.0),
        "io_span_s": span_s,
        "bandwidth_mib_s": total / 2**20 / span_s if total and span_s and span_s > 0 else None,
    }


# --------------------------------------------------------------------------------------
# Public API


def job_summary(
    store: Store,
    job_id: str,
    layer: str = "client",
    files_limit: int = 100,
    coverage: bool = True,
    silence_s: float | None = None,
) -> JobSummary | None:
    """The I/O summary of ``job_id`` as seen on ``layer``.

    Args:
        store: an open, migrated store.
        job_id: the job's id as in ``job_events`` / ``io_requests``.
        layer: ``client`` (default), ``forwarder`` or ``storage``.
        files_limit: at most this many files in ``files`` (largest first); ``n_files``
            always counts all data files.
        coverage: check the agents' coverage of the job (``complete``, ``gaps``,
            :func:`pharos_analytics.coverage.job_coverage`); False leaves ``complete`` true and
            ``coverage`` None.
        silence_s: the coverage check's longest silence of a live agent (default: the
            settings' ``heartbeat_missed`` x ``heartbeat_interval_s``).

    Returns:
        A :class:`JobSummary`, or ``None`` when the job has neither an event nor a record
        on ``layer`` (unknown job). On the ``client`` layer, a job without data-op rows
        but with Darshan counters (a log imported without DXT) is summarised from the
        counters, ``source == "darshan-counters"`` (see the module docstring).

    Raises:
        ValueError: unknown layer or negative ``files_limit``.
        pharos_pipeline.store.StoreError: the store failed.
    """
    _check_layer(layer)
    if files_limit < 0:
        raise ValueError("files_limit must be >= 0")
    p = {"job_id": job_id, "layer": layer, "system_re": SYSTEM_PATH_REGEX}
    ev_rows = store.query(JOB_EVENTS_SQL, {"job_id": job_id})
    ev = ev_rows[0] if ev_rows else None
    op_rows = store.query(JOB_OPS_SQL, p)
    if ev is None and not op_rows:
        return None

    ops: dict[str, int] = {}
    other_ops: dict[str, int] = {}
    non_file: dict[str, int] = {}
    nf_requests = nf_bytes = records = requests = failed = 0
    bytes_read = bytes_written = data_duration_ns = data_records = data_requests = 0
    first_ns: int | None = None
    last_ns: int | None = None
    for r in op_rows:
        op, ftype = r["op"], "stdio" if int(r["stream"]) else r["file_type"]
        n = int(r["requests"])
        records += int(r["records"])
        requests += n
        failed += int(r["failed"])
        if ftype in NON_FILE_TYPES or ftype == "stdio":
            non_file[ftype] = non_file.get(ftype, 0) + n
            nf_requests += n
            nf_bytes += int(r["bytes"])
        elif ftype == "regular" or op in META_OPS:
            ops[op] = ops.get(op, 0) + n
        else:
            other_ops[op] = other_ops.get(op, 0) + n
        if ftype == "regular" and op in DATA_OPS and not int(r["system_path"]):
            if op in READ_OPS:
                bytes_read += int(r["bytes"])
            else:
                bytes_written += int(r["bytes"])
            data_duration_ns += int(r["duration_ns"])
            data_records += int(r["records"])
            data_requests += n
            first, last = int(r["first_ns"]), int(r["last_ns"])
            first_ns = first if first_ns is None else min(first_ns, first)
            last_ns = last if last_ns is None else max(last_ns, last)

    darshan = _darshan_figures(store, job_id, files_limit) if layer == "client" and not data_records else None

    hist = {d: {label: 0 for label, _ in SIZE_BINS} for d in ("read", "write")}
    for r in store.query(JOB_SIZE_HISTOGRAM_SQL, p):
        hist[r["direction"]][SIZE_BINS[int(r["bin"])][0]] += int(r["requests"])

    fp = p
    files = [
        FileSummary(
            path=r["file"],
            bytes_read=int(r["bytes_read"]),
            bytes_written=int(r["bytes_written"]),
            reads=int(r["reads"]),
            writes=int(r["writes"]),
            ranks=int(r["ranks"]),
        )
        for r in store.query(JOB_FILES_SQL, {**fp, "limit": files_limit})
    ]
    fan_rows = store.query(JOB_FAN_IN_SQL, fp)
    io_ranks, n_files, pattern, patterns, fan_in = fan_in_patterns(
        fan_rows[0] if fan_rows else None, bytes_read, bytes_written
    )

    d = store.query(JOB_DROPS_SQL, {"job_id": job_id})[0]
    drops = Drops(
        total=int(d["ringbuf_drops"]) + int(d["delivery_failures"]) + int(d["overflow_drops"]),
        ringbuf_drops=int(d["ringbuf_drops"]),
        delivery_failures=int(d["delivery_failures"]),
        overflow_drops=int(d["overflow_drops"]),
        unmerged_fallbacks=int(d["unmerged_fallbacks"]),
        producers=int(d["producers"]),
    )

    span_s = (last_ns - first_ns) / 1e9 if first_ns is not None and last_ns is not None else None
    total = bytes_read + bytes_written
    bandwidth = total / 2**20 / span_s if span_s and span_s > 0 else None

    has_start = bool(ev and ev["has_start"])
    has_end = bool(ev and ev["has_end"])
    summary = JobSummary(
        job_id=job_id,
        layer=layer,
        name=ev["name"] if has_start else None,
        user=ev["user"] if has_start else None,
        command=list(ev["command"]) if has_start else [],
        host=ev["host"] if has_start else None,
        ranks=int(ev["ranks"]) if has_start else None,
        exit_code=int(ev["exit_code"]) if has_end else None,
        start=ns_to_datetime(ev["start_ns"]) if has_start else None,
        end=ns_to_datetime(ev["end_ns"]) if has_end else None,
        state=_state(ev),
        io_ranks=io_ranks,
        pattern=pattern,
        patterns=patterns,
        bytes_read=bytes_read,
        bytes_written=bytes_written,
        ops=dict(sorted(ops.items())),
        other_ops=dict(sorted(other_ops.items())),
        non_file_ops=NonFileOps(requests=nf_requests, bytes=nf_bytes, by_type=dict(sorted(non_file.items()))),
        failed_requests=failed,
        records=records,
        requests=requests,
        data_records=data_records,
        data_requests=data_requests,
        size_histogram=hist,
        files=files,
        n_files=n_files,
        first_io=ns_to_datetime(first_ns),
        last_io=ns_to_datetime(last_ns),
        io_time_s=data_duration_ns / 1e9,
        io_span_s=span_s,
        bandwidth_mib_s=bandwidth,
        dropped_records=drops.total,
        drops=drops,
        fan_in_pattern=fan_in,
    )
    if darshan:
        summary = replace(summary, **darshan)
    if coverage:
        from .coverage import job_coverage  # coverage reads this module's job events query

        cov = job_coverage(store, job_id, silence_s=silence_s)
        summary = replace(summary, complete=cov.complete, gaps=cov.gaps, coverage=cov)
    return summary


def list_jobs(
    store: Store, limit: int = 50, offset: int = 0, layer: str = "client", user: str | None = None
) -> list[JobListItem]:
    """Jobs known from ``job_events``, newest start first, ``limit`` from ``offset``; with
    ``user``, only the jobs whose start event names that user.

    Bytes and pattern come from ``layer``'s data I/O (see module docstring), the pattern
    decided as in :func:`job_summary` (volume dominance). On the ``client`` layer, a job
    without data-op rows but with Darshan counters (a log imported without DXT) gets its
    bytes and pattern from the counters, as its summary does (``source``
    ``darshan-counters``; one more query per such job). Jobs that have records but no event
    are not listed (they still have a summary).

    Raises:
        ValueError: unknown layer, ``limit`` < 0 or ``offset`` < 0.
        pharos_pipeline.store.StoreError: the store failed.
    """
    _check_layer(layer)
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must be >= 0")
    page = {"limit": limit, "offset": offset, "only_user": int(user is not None), "user": user or ""}
    events = store.query(JOBS_PAGE_SQL, page)
    if not events:
        return []
    io = {
        r["job_id"]: r
        for r in store.query(JOBS_PAGE_BYTES_SQL, {**page, "layer": layer, "system_re": SYSTEM_PATH_REGEX})
    }
    fan = {
        r["job_id"]: r
        for r in store.query(JOBS_PAGE_FAN_IN_SQL, {**page, "layer": layer, "system_re": SYSTEM_PATH_REGEX})
    }
    out = []
    for ev in events:
        jid = ev["job_id"]
        b = io.get(jid)
        br, bw = (int(b["bytes_read"]), int(b["bytes_written"])) if b else (0, 0)
        io_ranks, n_files, pattern, patterns, fan_in = fan_in_patterns(fan.get(jid), br, bw)
        source: SummarySource = "traces"
        if layer == "client" and jid not in fan and (d := _darshan_figures(store, jid, 0)) is not None:
            io_ranks, n_files, pattern, patterns, fan_in = (
                d["io_ranks"],
                d["n_files"],
                d["pattern"],
                d["patterns"],
                d["fan_in_pattern"],
            )
            br, bw, source = d["bytes_read"], d["bytes_written"], "darshan-counters"
        out.append(
            JobListItem(
                job_id=jid,
                name=ev["name"] if ev["has_start"] else None,
                user=ev["user"] if ev["has_start"] else None,
                host=ev["host"] if ev["has_start"] else None,
                ranks=int(ev["ranks"]) if ev["has_start"] else None,
                state=_state(ev),
                exit_code=int(ev["exit_code"]) if ev["has_end"] else None,
                start=ns_to_datetime(ev["start_ns"]) if ev["has_start"] else None,
                end=ns_to_datetime(ev["end_ns"]) if ev["has_end"] else None,
                pattern=pattern,
                io_ranks=io_ranks,
                n_files=n_files,
                bytes_read=br,
                bytes_written=bw,
                patterns=patterns,
                fan_in_pattern=fan_in,
                source=source,
            )
        )
    return out


def count_jobs(store: Store, user: str | None = None) -> int:
    """Number of jobs with at least one event (the total behind :func:`list_jobs` paging);
    with ``user``, of the jobs whose start event names that user."""
    params = {"only_user": int(user is not None), "user": user or ""}
    return int(store.query(JOBS_COUNT_SQL, params)[0]["jobs"])
