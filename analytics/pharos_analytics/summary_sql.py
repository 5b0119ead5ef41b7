"""The job summary's SQL and the op model it counts by (:mod:`pharos_analytics.summary`).

The operation sets (data ops, reads, writes, metadata ops, non-file types), the layers,
Darshan's access-size bins, and every query of the summary and job list, built from these
constants and bound parameters only. Definitions: see :mod:`pharos_analytics.summary`.
:func:`ns_to_datetime` reads the queries' nanosecond columns. The ground floor of the
summary and of :mod:`pharos_analytics.coverage` (both read the job events query).

Every query that sums or lists a job's records counts a replayed request once
(:func:`pharos_analytics.replays_sql.counted_once`: a forwarder-layer replay record counts only
when no other record of its request exists).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .pattern import STREAM_PATHS
from .replays_sql import RECORD_KEY, counted_once, duplicate_replays

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


def fan_in_columns(
    ranks: str,
    read_ranks: str,
    write_ranks: str,
    read_bytes: str,
    write_bytes: str,
    files: str = "count()",
    where: str = "",
) -> str:
    """The Beacon fan-in columns that :func:`pharos_analytics.summary.fan_in_patterns` reads,
    aggregated over one row per file.

    Over all data ops, reads only and writes only (prefixes ``''``, ``read_``, ``write_``):
    ``n_{kind}ranks``, ``n_{kind}files`` and ``max_{kind}fan_in`` (distinct ranks, files,
    largest number of ranks on one file). Per direction (``read_``/``write_``) also the two
    groups of :class:`pharos_analytics.pattern.DirectionFanIn`: ``n_{kind}shared_files``,
    ``n_{kind}shared_ranks``, ``{kind}shared_bytes``, ``{kind}top_shared_bytes`` (files with
    more than one rank) and ``n_{kind}private_files``, ``n_{kind}private_ranks``,
    ``{kind}private_bytes`` (files with one rank), bytes in bytes.

    ``ranks``, ``read_ranks``, ``write_ranks``: the columns holding each file's ranks (all data
    ops, reads, writes); ``read_bytes``, ``write_bytes``: each file's bytes read and written
    (names that are not aliases of the outer query); ``files``: how the files of all data ops
    are counted; ``where``: a condition on the rows that count (none: all rows). Constants
    only: never pass user input."""
    cols = []
    cond = f"({where})" if where else "1"
    for kind, col in (("", ranks), ("read_", read_ranks), ("write_", write_ranks)):
        if where:
            n_files = f"countIf({where})" if not kind else f"countIf({where} AND notEmpty({col}))"
            cols += [
                f"length(groupUniqArrayArrayIf({col}, {where})) AS n_{kind}ranks",
                f"{n_files} AS n_{kind}files",
                f"maxIf(length({col}), {where}) AS max_{kind}fan_in",
            ]
        else:
            n_files = files if not kind else f"countIf(notEmpty({col}))"
            cols += [
                f"length(groupUniqArrayArray({col})) AS n_{kind}ranks",
                f"{n_files} AS n_{kind}files",
                f"max(length({col})) AS max_{kind}fan_in",
            ]
        if kind:
            nbytes = read_bytes if kind == "read_" else write_bytes
            for group, test in (("shared", f"length({col}) > 1"), ("private", f"length({col}) = 1")):
                c = f"{cond} AND {test}"
                cols += [
                    f"countIf({c}) AS n_{kind}{group}_files",
                    f"length(groupUniqArrayArrayIf({col}, {c})) AS n_{kind}{group}_ranks",
                    f"sumIf({nbytes}, {c}) AS {kind}{group}_bytes",
                ]
            cols.append(f"maxIf({nbytes}, {cond} AND length({col}) > 1) AS {kind}top_shared_bytes")
    return ",\n    ".join(cols)


_READ = f"op IN {sql_list(READ_OPS)}"
_WRITE = f"op IN {sql_list(WRITE_OPS)}"
_DATA = f"file_type = 'regular' AND op IN {sql_list(DATA_OPS)}"
_DATA_FILE = f"{_DATA} AND NOT match(path, {{system_re:String}})"
FILE_KEY = "if(path != '', path, concat('dev:', toString(dev), ':inode:', toString(inode)))"
#: The rows of one job that count (a replayed request once).
_ONCE = counted_once("job_id = {job_id:String}")
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
WHERE job_id = {job_id:String} AND layer = {layer:String} AND __ONCE__
GROUP BY op, file_type, system_path, stream
""".replace("__STREAMS__", "(" + ", ".join(f"'{p}'" for p in STREAM_PATHS) + ")").replace("__ONCE__", _ONCE)

#: The job's replay records on one layer (forwarder): ``replayed`` requests (sum of count) the
#: mounts sent as replays, ``duplicates`` those of them left out because their request's
#: original (or an earlier replay) is counted.
JOB_REPLAYS_SQL = f"""
SELECT
    sum(count)                                                              AS replayed,
    sumIf(count, {RECORD_KEY} IN ({duplicate_replays("job_id = {job_id:String}")}))   AS duplicates
FROM io_requests
WHERE job_id = {{job_id:String}} AND layer = {{layer:String}} AND replay = 1
"""

#: Darshan access-size histogram of data ops: requests per (direction, bin index).
JOB_SIZE_HISTOGRAM_SQL = f"""
SELECT
    if({_READ}, 'read', 'write')                     AS direction,
    arrayCount(b -> b <= size, {_SIZE_BOUNDS})       AS bin,
    sum(count)                                       AS requests
FROM io_requests
WHERE job_id = {{job_id:String}} AND layer = {{layer:String}} AND {_DATA_FILE} AND {_ONCE}
GROUP BY direction, bin
"""

#: The job's data files, largest first, at most {limit}.
JOB_FILES_SQL = f"""
SELECT
    {FILE_KEY}                      AS file,
    sumIf(bytes, {_READ})            AS bytes_read,
    sumIf(bytes, {_WRITE})           AS bytes_written,
    sumIf(count, {_READ})            AS reads,
    sumIf(count, {_WRITE})           AS writes,
    uniqExact(rank)                  AS ranks
FROM io_requests
WHERE job_id = {{job_id:String}} AND layer = {{layer:String}} AND {_DATA_FILE} AND {_ONCE}
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
    {fan_in_columns("all_ranks", "read_ranks", "write_ranks", "file_read_bytes", "file_write_bytes")}
FROM
(
    SELECT
        job_id,
        {FILE_KEY}                                 AS file,
        sumIf(bytes, {_READ})                       AS file_read_bytes,
        sumIf(bytes, {_WRITE})                      AS file_write_bytes,
        groupUniqArray(rank)                        AS all_ranks,
        groupUniqArrayIf(rank, {_READ})             AS read_ranks,
        groupUniqArrayIf(rank, {_WRITE})            AS write_ranks
    FROM io_requests
    WHERE __JOBS__ AND layer = {{layer:String}} AND {_DATA_FILE} AND {counted_once("__JOBS__")}
    GROUP BY job_id, file
)
GROUP BY job_id
"""
JOB_FAN_IN_SQL = FAN_IN_SELECT.replace("__JOBS__", "job_id = {job_id:String}")

#: The compute nodes one job's requests came from on one layer: the agents' host on the client
#: layer (a Darshan log's DXT hostnames too), the FUSE clients' compute node on the others.
#: With them, the forwarding nodes that served each (none on the client layer; of a replayed
#: request, the node of the execution that counts).
JOB_NODES_SQL = f"""
SELECT if(layer = 'client', toString(host), toString(compute_node)) AS node,
       arraySort(groupUniqArrayIf(toString(forwarding_node), forwarding_node != '')) AS forwarding_nodes
FROM io_requests
WHERE job_id = {{job_id:String}} AND layer = {{layer:String}} AND node != '' AND {_ONCE}
GROUP BY node
ORDER BY node
"""

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

#: Darshan counter names behind each counter figure (see :mod:`pharos_analytics.summary`). Which
#: modules count is decided per log (:data:`DARSHAN_MODULES_RULE`): POSIX, STDIO and DFS names apply
#: to every log, MPI-IO names only to logs with neither POSIX nor DFS, DAOS names only to logs
#: without DFS (the same bytes one layer up or down are never counted twice).
DARSHAN_COUNTERS: dict[str, tuple[str, ...]] = {
    "bytes_read": ("POSIX_BYTES_READ", "STDIO_BYTES_READ", "MPIIO_BYTES_READ", "DFS_BYTES_READ", "DAOS_BYTES_READ"),
    "bytes_written": (
        "POSIX_BYTES_WRITTEN",
        "STDIO_BYTES_WRITTEN",
        "MPIIO_BYTES_WRITTEN",
        "DFS_BYTES_WRITTEN",
        "DAOS_BYTES_WRITTEN",
    ),
    "reads": (
        "POSIX_READS",
        "STDIO_READS",
        "MPIIO_INDEP_READS",
        "MPIIO_COLL_READS",
        "MPIIO_SPLIT_READS",
        "MPIIO_NB_READS",
        "DFS_READS",
        "DFS_READXS",
        "DAOS_OBJ_FETCHES",
        "DAOS_ARRAY_READS",
        "DAOS_KV_GETS",
    ),
    "writes": (
        "POSIX_WRITES",
        "STDIO_WRITES",
        "MPIIO_INDEP_WRITES",
        "MPIIO_COLL_WRITES",
        "MPIIO_SPLIT_WRITES",
        "MPIIO_NB_WRITES",
        "DFS_WRITES",
        "DFS_WRITEXS",
        "DAOS_OBJ_UPDATES",
        "DAOS_ARRAY_WRITES",
        "DAOS_KV_PUTS",
    ),
    "opens": (
        "POSIX_OPENS",
        "STDIO_OPENS",
        "MPIIO_INDEP_OPENS",
        "MPIIO_COLL_OPENS",
        "DFS_OPENS",
        "DFS_GLOBAL_OPENS",
        "DAOS_OBJ_OPENS",
        "DAOS_ARRAY_OPENS",
        "DAOS_KV_OPENS",
    ),
    "stats": ("POSIX_STATS", "DFS_STATS"),
    "fsyncs": ("POSIX_FSYNCS", "MPIIO_SYNCS"),
    "fdsyncs": ("POSIX_FDSYNCS",),
    "io_time_s": (
        "POSIX_F_READ_TIME",
        "POSIX_F_WRITE_TIME",
        "STDIO_F_READ_TIME",
        "STDIO_F_WRITE_TIME",
        "MPIIO_F_READ_TIME",
        "MPIIO_F_WRITE_TIME",
        "DFS_F_READ_TIME",
        "DFS_F_WRITE_TIME",
        "DAOS_F_READ_TIME",
        "DAOS_F_WRITE_TIME",
    ),
}
#: The modules whose counters a record of ``darshan_counters`` AS c of a log of ``darshan_logs``
#: AS l (columns ``has_posix``, ``has_dfs``) contributes: POSIX, STDIO and DFS always; MPI-IO
#: only without POSIX and DFS (MPI-IO's bytes are the POSIX bytes one layer up, or the DFS bytes
#: with ROMIO's DAOS driver); DAOS only without DFS (DFS stores its files as DAOS objects).
DARSHAN_MODULES_RULE = (
    "(c.module IN ('POSIX', 'STDIO', 'DFS') OR (c.module = 'MPI-IO' AND NOT l.has_posix AND NOT l.has_dfs)"
    " OR (c.module = 'DAOS' AND NOT l.has_dfs))"
)
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
    """An array with one sum per size bin: POSIX, MPI-IO aggregate, DFS and DAOS bins."""
    return (
        "["
        + ", ".join(
            _sum_counters(
                (
                    f"POSIX_SIZE_{direction}_{b}",
                    f"MPIIO_SIZE_{direction}_AGG_{b}",
                    f"DFS_SIZE_{direction}_{b}",
                    f"DAOS_SIZE_{direction}_{b}",
                )
            )
            for b in _DARSHAN_BIN_SUFFIXES
        )
        + "]"
    )


_STREAMS = "(" + ", ".join(f"'{v}'" for v in DARSHAN_STREAMS) + ")"  # constants with <>: no sql_list

#: The Darshan counter figures of one job, one row (see :mod:`pharos_analytics.summary`): totals over data
#: files and over the standard streams, size histogram, fan-in statistics (as
#: :data:`FAN_IN_SELECT`), the {limit:UInt32} largest files as tuples (path, bytes_read,
#: bytes_written, reads, writes, ranks) and the logs' time span. ``counted_files`` (files
#: and streams) is 0 when the job has no counters of a completely imported log.
JOB_DARSHAN_SQL = f"""
WITH logs AS
(
    SELECT log_id, nprocs, rank_offset, has(modules, 'POSIX') AS has_posix, has(modules, 'DFS') AS has_dfs,
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
    {fan_in_columns("all_ranks", "read_ranks", "write_ranks", "f_bytes_read", "f_bytes_written", where="data_file")},
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
          AND {DARSHAN_MODULES_RULE}
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
WHERE {_PAGE_IDS} AND layer = {{layer:String}} AND {_DATA_FILE} AND {counted_once(_PAGE_IDS)}
GROUP BY job_id
"""

#: Fan-in statistics of the jobs on a page.
JOBS_PAGE_FAN_IN_SQL = FAN_IN_SELECT.replace("__JOBS__", _PAGE_IDS)

#: The jobs on a page that have a completely imported Darshan log (their totals come from the counters).
JOBS_PAGE_DARSHAN_SQL = f"SELECT DISTINCT job_id FROM darshan_logs FINAL WHERE {_PAGE_IDS}"

#: Number of jobs with at least one event (``only_user`` 1: started by ``user``).
JOBS_COUNT_SQL = (
    "SELECT uniqExact(job_id) AS jobs FROM job_events "
    "WHERE {only_user:UInt8} = 0 OR (kind = 'start' AND user = {user:String})"
)


def ns_to_datetime(ns: int | None) -> datetime | None:
    """ns since the epoch -> an aware UTC datetime (µs precision); ``None`` for None or 0."""
    if not ns:
        return None
    ns = int(ns)
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC) + timedelta(microseconds=(ns % 1_000_000_000) // 1000)
