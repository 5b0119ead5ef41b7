"""The SQL of :mod:`pharos_analytics.insights.price` (per-rank sums of a job's requests, the site's
bandwidth and metadata latency, a job's span)."""

from __future__ import annotations

from ..phases_sql import PHASED
from ..summary_sql import DATA_OPS, READ_OPS, sql_list

#: Per rank, file sharing (a data file more than one rank touched) and direction: the bytes and
#: summed request time (ns) of the job's data requests by kind (small = under ``small`` bytes;
#: random = starting before the previous request's end on the same rank and file, Darshan's
#: non-sequential; consecutive = starting exactly at it; misaligned = offset not a multiple of
#: ``align``), the fsync calls, their time and files, and the metadata operations and time.
#: A merged record (count > 1: consecutive requests) is random only in its first request.
PRICE_RANKS_SQL = (
    PHASED
    + """,
shared_files AS (SELECT file FROM phased WHERE is_data GROUP BY file HAVING uniqExact(rank) > 1)
SELECT
    rank, file IN shared_files AS shared, is_read,
    sumIf(count, is_data AND size < {small:UInt64})                       AS small_n,
    sumIf(bytes, is_data AND size < {small:UInt64})                       AS small_b,
    sumIf(duration_ns, is_data AND size < {small:UInt64})                 AS small_ns,
    sumIf(bytes, is_data AND size >= {small:UInt64})                      AS large_b,
    sumIf(duration_ns, is_data AND size >= {small:UInt64})                AS large_ns,
    sumIf(bytes / count, is_data AND toInt64(offset) < prev_end)          AS rnd_b,
    sumIf(duration_ns / count, is_data AND toInt64(offset) < prev_end)    AS rnd_ns,
    sumIf(bytes, is_data AND toInt64(offset) = prev_end)                  AS cons_b,
    sumIf(duration_ns, is_data AND toInt64(offset) = prev_end)            AS cons_ns,
    sumIf(bytes, is_data AND offset % {align:UInt64} != 0)                AS mis_b,
    sumIf(duration_ns, is_data AND offset % {align:UInt64} != 0)          AS mis_ns,
    sumIf(bytes, is_data AND offset % {align:UInt64} = 0)                 AS ali_b,
    sumIf(duration_ns, is_data AND offset % {align:UInt64} = 0)           AS ali_ns,
    sumIf(count, op IN ('fsync', 'fdatasync'))                            AS fsync_n,
    sumIf(duration_ns, op IN ('fsync', 'fdatasync'))                      AS fsync_ns,
    uniqExactIf(file, op IN ('fsync', 'fdatasync'))                       AS fsync_files,
    sumIf(count, NOT is_data AND op NOT IN ('fsync', 'fdatasync'))        AS meta_n,
    sumIf(duration_ns, NOT is_data AND op NOT IN ('fsync', 'fdatasync'))  AS meta_ns,
    sumIf(count, op = 'open')                                             AS open_n,
    sumIf(duration_ns, op = 'open')                                       AS open_ns,
    sumIf(count, op = 'close')                                            AS close_n,
    sumIf(duration_ns, op = 'close')                                      AS close_ns,
    sumIf(count, op = 'stat')                                             AS stat_n,
    sumIf(duration_ns, op = 'stat')                                       AS stat_ns,
    sumIf(bytes, is_data)                                                 AS data_b,
    sumIf(duration_ns, is_data)                                           AS data_ns
FROM phased
GROUP BY rank, shared, is_read
"""
)

#: Per shared data file: its ranks' data time (ns): the slowest, the median (interpolated) and
#: the (most - fewest) / all bytes of a rank on it.
SHARED_FILE_TIMES_SQL = (
    PHASED
    + """
SELECT file, max(ns) AS slow_ns, quantileExactInclusive(0.5)(ns) AS median_ns,
       (max(b) - min(b)) / greatest(sum(b), 1) AS imbalance
FROM (SELECT file, rank, sum(duration_ns) AS ns, sum(bytes) AS b FROM phased WHERE is_data GROUP BY file, rank)
GROUP BY file
HAVING count() > 1
"""
)

#: The site's per-stream bandwidth of large requests (bytes / summed request time) per
#: direction: other jobs' data requests of at least ``small`` bytes on ``layer`` near the job.
SITE_BANDWIDTH_SQL = f"""
SELECT op IN {sql_list(READ_OPS)} AS is_read, sum(bytes) AS b, sum(duration_ns) AS ns, sum(count) AS n
FROM io_requests
WHERE layer = {{layer:String}} AND job_id != {{job_id:String}}
  AND start >= {{since:DateTime64(9)}} AND start <= {{until:DateTime64(9)}}
  AND file_type = 'regular' AND op IN {sql_list(DATA_OPS)} AND size >= {{small:UInt64}} AND duration_ns > 0
GROUP BY is_read
"""
#: The site's median latency (ns) of one metadata operation of other jobs near the job, per
#: operation (open, close, stat, other) and over all of them but fsync, which flushes data
#: (the rollup row, ``op`` '').
SITE_META_LATENCY_SQL = """
SELECT if(op IN ('open', 'close', 'stat'), op, 'other') AS op, quantile(0.5)(duration_ns / greatest(count, 1)) AS ns,
       count() AS n
FROM io_requests
WHERE layer = {layer:String} AND job_id != {job_id:String}
  AND start >= {since:DateTime64(9)} AND start <= {until:DateTime64(9)}
  AND op IN ('open', 'close', 'stat', 'unlink', 'mkdir', 'rename') AND duration_ns > 0
GROUP BY op WITH ROLLUP
"""
JOB_SPAN_SQL = """
SELECT toUnixTimestamp64Nano(min(start)) AS first_ns, toUnixTimestamp64Nano(max(end)) AS last_ns, count() AS n
FROM io_requests WHERE job_id = {job_id:String} AND layer = 'client'
"""
