"""The SQL of a job's I/O phases and profiles (:mod:`pharos_analytics.phases`): the requests
ordered and cut into phases by window functions, the profile of each phase and of the job, the
busy metadata seconds, and the Darshan counters of jobs without traced requests.
"""

from __future__ import annotations

from .replays_sql import counted_once
from .summary_sql import DATA_OPS, FILE_KEY, META_OPS, NON_FILE_TYPES, READ_OPS, fan_in_columns, sql_list

#: The requests phases are made of: data ops on data files and metadata ops outside system
#: paths, of one job and layer (see :mod:`pharos_analytics.phases`); a replayed request once.
_PHASE_REQUESTS = f"""FROM io_requests
    WHERE job_id = {{job_id:String}} AND layer = {{layer:String}} AND {counted_once("job_id = {job_id:String}")}
      AND NOT match(path, {{system_re:String}})
      AND ((file_type = 'regular' AND op IN {sql_list(DATA_OPS)})
           OR (op IN {sql_list(META_OPS)} AND file_type NOT IN {sql_list(NON_FILE_TYPES)}))"""

#: Each request's idle gap (ns) since every earlier request ended, and its rank in start order.
_GAP_COLUMNS = """s - max(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS gap,
        row_number() OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS rn"""

#: The job's data and metadata requests with their phase number and stream position.
PHASED = f"""
WITH
base AS (
    SELECT
        toUnixTimestamp64Nano(start)                        AS s,
        toUnixTimestamp64Nano(end)                          AS e,
        rank,
        op,
        {FILE_KEY}                                         AS file,
        op IN {sql_list(READ_OPS)}                         AS is_read,
        op IN {sql_list(DATA_OPS)}                         AS is_data,
        offset, size, count, bytes, duration_ns,
        transform(path, {{stripe_paths:Array(String)}}, {{stripe_sizes:Array(UInt64)}}, toUInt64(0)) AS stripe
    {_PHASE_REQUESTS}
),
gapped AS (
    SELECT *,
        {_GAP_COLUMNS}
    FROM base
),
phased AS (
    SELECT *,
        sum(rn > 1 AND gap >= {{gap_ns:Int64}}) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) + 1 AS phase,
        lagInFrame(toInt64(offset + bytes), 1, toInt64(0)) OVER (
            PARTITION BY rank, file, is_read, is_data ORDER BY s, e
            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)                       AS prev_end
    FROM gapped
)
"""

#: The longest idle gaps (ns) between requests, longest first.
GAPS_SQL = f"""
WITH
base AS (
    SELECT toUnixTimestamp64Nano(start) AS s, toUnixTimestamp64Nano(end) AS e
    {_PHASE_REQUESTS}
),
gapped AS (
    SELECT
        {_GAP_COLUMNS}
    FROM base
)
SELECT gap FROM gapped WHERE rn > 1 AND gap >= {{gap_ns:Int64}} ORDER BY gap DESC LIMIT {{limit:UInt32}}
"""

_PROFILE_TMPL = (
    PHASED
    + """
SELECT
    __KEY__                                                 AS phase,
    min(fs)                                                 AS start_ns,
    max(fe)                                                 AS end_ns,
    sum(reads)                                              AS reads,
    sum(writes)                                             AS writes,
    sum(bytes_read)                                         AS bytes_read,
    sum(bytes_written)                                      AS bytes_written,
    sum(data_requests)                                      AS data_requests,
    sum(sequential)                                         AS sequential,
    sum(consecutive)                                        AS consecutive,
    sum(small)                                              AS small,
    sum(misaligned)                                         AS misaligned,
    sum(stripe_known)                                       AS stripe_known,
    sum(stripe_misaligned)                                  AS stripe_misaligned,
    sum(meta_ops)                                           AS meta_ops,
    sum(meta_time_ns)                                       AS meta_time_ns,
    sum(data_time_ns)                                       AS data_time_ns,
    __FAN_IN__
FROM
(
    SELECT
        __KEY__                                                             AS phase,
        file,
        min(s)                                                              AS fs,
        max(e)                                                              AS fe,
        sumIf(count, is_data AND is_read)                                   AS reads,
        sumIf(count, is_data AND NOT is_read)                               AS writes,
        sumIf(bytes, is_data AND is_read)                                   AS bytes_read,
        sumIf(bytes, is_data AND NOT is_read)                               AS bytes_written,
        bytes_read                                                          AS file_rbytes,
        bytes_written                                                       AS file_wbytes,
        sumIf(count, is_data)                                               AS data_requests,
        sumIf(count - 1 + (toInt64(offset) >= prev_end), is_data)           AS sequential,
        sumIf(count - 1 + (toInt64(offset) = prev_end), is_data)            AS consecutive,
        sumIf(count, is_data AND size < {small:UInt64})                     AS small,
        sumIf(if(offset % {align:UInt64} != 0, count,
                 if(size % {align:UInt64} != 0, count - 1, 0)), is_data)    AS misaligned,
        sumIf(count, is_data AND stripe > 0)                                AS stripe_known,
        sumIf(if(offset % greatest(stripe, 1) != 0, count, if(size % greatest(stripe, 1) != 0, count - 1, 0)),
              is_data AND stripe > 0)                                       AS stripe_misaligned,
        sumIf(count, NOT is_data)                                           AS meta_ops,
        sumIf(duration_ns, NOT is_data)                                     AS meta_time_ns,
        sumIf(duration_ns, is_data)                                         AS data_time_ns,
        groupUniqArrayIf(rank, is_data)                                     AS franks,
        groupUniqArrayIf(rank, is_data AND is_read)                         AS rranks,
        groupUniqArrayIf(rank, is_data AND NOT is_read)                     AS wranks
    FROM phased
    GROUP BY phase, file
)
GROUP BY phase
ORDER BY phase
"""
).replace(
    "__FAN_IN__",
    fan_in_columns("franks", "rranks", "wranks", "file_rbytes", "file_wbytes", files="countIf(notEmpty(franks))"),
)
#: Profile of each phase (one row per phase).
PHASE_PROFILES_SQL = _PROFILE_TMPL.replace("__KEY__", "phase")
#: Profile of the whole job (one row, phase 0).
JOB_PROFILE_SQL = _PROFILE_TMPL.replace("__KEY__", "toUInt64(0)")

#: Whole seconds in which the job issued more than {rate} metadata ops, per phase.
BUSY_SECONDS_SQL = (
    PHASED
    + """
SELECT phase, intDiv(s, 1000000000) AS sec, sum(count) AS ops
FROM phased WHERE NOT is_data
GROUP BY phase, sec
HAVING ops > {rate:Float64}
ORDER BY phase, sec
"""
)

#: Stripe size per file of a job, from imported Darshan LUSTRE records.
STRIPES_SQL = """
SELECT path, max(value) AS stripe
FROM darshan_counters
WHERE job_id = {job_id:String} AND module = 'LUSTRE' AND counter = 'LUSTRE_STRIPE_SIZE' AND path != ''
GROUP BY path
"""

HAS_COUNTERS_SQL = "SELECT count() AS n FROM darshan_counters WHERE job_id = {job_id:String}"

#: Sums of the POSIX counters of a job over its data files, plus fan-in input.
COUNTER_FILES_SQL = """
SELECT
    c.record_id                                              AS record_id,
    any(c.path)                                              AS path,
    c.rank                                                   AS rank,
    c.log_id                                                 AS log_id,
    sumIf(c.value, c.counter = 'POSIX_READS')                AS reads,
    sumIf(c.value, c.counter = 'POSIX_WRITES')               AS writes,
    sumIf(c.value, c.counter = 'POSIX_BYTES_READ')           AS bytes_read,
    sumIf(c.value, c.counter = 'POSIX_BYTES_WRITTEN')        AS bytes_written,
    sumIf(c.value, c.counter IN ('POSIX_SEQ_READS', 'POSIX_SEQ_WRITES'))       AS sequential,
    sumIf(c.value, c.counter IN ('POSIX_CONSEC_READS', 'POSIX_CONSEC_WRITES')) AS consecutive,
    sumIf(c.value, c.counter IN {small_bins:Array(String)})  AS small,
    sumIf(c.value, c.counter = 'POSIX_FILE_NOT_ALIGNED')     AS misaligned,
    maxIf(c.value, c.counter = 'POSIX_FILE_ALIGNMENT')       AS file_alignment,
    sumIf(c.value, c.counter IN ('POSIX_OPENS', 'POSIX_STATS', 'POSIX_FSYNCS', 'POSIX_FDSYNCS',
                                 'POSIX_RENAME_SOURCES'))                      AS meta_ops,
    sumIf(c.value, c.counter = 'POSIX_F_META_TIME')          AS meta_time_s,
    sumIf(c.value, c.counter IN ('POSIX_F_READ_TIME', 'POSIX_F_WRITE_TIME'))   AS data_time_s
FROM darshan_counters AS c
WHERE c.job_id = {job_id:String} AND c.module = 'POSIX'
GROUP BY c.record_id, c.rank, c.log_id
"""

#: Imported logs of a job: rank range of each (for shared records) and time span.
JOB_LOGS_SQL = """
SELECT log_id, nprocs, rank_offset, toUnixTimestamp64Nano(start) AS start_ns, toUnixTimestamp64Nano(end) AS end_ns
FROM darshan_logs FINAL WHERE job_id = {job_id:String}
"""

#: Darshan's POSIX access-size bins below 1 MiB (the "small" requests of Drishti).
SMALL_BIN_COUNTERS: tuple[str, ...] = tuple(
    f"POSIX_SIZE_{d}_{b}" for d in ("READ", "WRITE") for b in ("0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M")
)
