"""The interference pass's queries (:mod:`pharos_analytics.interference`): per (job, window,
resource) and per (job, window) sums of forwarder-layer requests, from raw records or from the
forwarder rollups (migrations 009, 014), and the look-ups of job names, spans and earlier runs.
Parameters: ``since``/``until`` DateTime64(9), ``win`` window in ns, ``jobs`` Array(String)."""

#: Per (job, window, resource): requests, bytes, service and queue-wait sums.
WINDOW_USAGE_SQL = """
SELECT job_id, w, r.1 AS rtype, r.2 AS res,
       sum(count) AS n, sum(bytes) AS bytes, sum(duration_ns) AS svc_ns, sum(queue_wait_ns) AS qw_ns
FROM
(
    SELECT job_id, intDiv(toUnixTimestamp64Nano(start), {win:UInt64}) AS w, count, bytes, duration_ns, queue_wait_ns,
           arrayJoin([('forwarding_node', forwarding_node), ('target', target)]) AS r
    FROM io_requests
    WHERE layer = 'forwarder' AND start >= {since:DateTime64(9)} AND start < {until:DateTime64(9)}
      __JOBS__
)
WHERE r.2 != ''
GROUP BY job_id, w, rtype, res
"""

#: Per (job, window): the job's own latency (each request once, not once per resource).
WINDOW_JOB_SQL = """
SELECT job_id, intDiv(toUnixTimestamp64Nano(start), {win:UInt64}) AS w,
       sum(count) AS n, sum(bytes) AS bytes, sum(duration_ns) AS svc_ns, sum(queue_wait_ns) AS qw_ns
FROM io_requests
WHERE layer = 'forwarder' AND start >= {since:DateTime64(9)} AND start < {until:DateTime64(9)}
  __JOBS__
GROUP BY job_id, w
"""

#: The same two views from the forwarder layer's rollups (io_rollup_1s, migration 009; per minute
#: and per 10 minutes, migration 014: :func:`~pharos_analytics.failslow_sql.forwarder_rollup`),
#: used when the window is a whole number of seconds and the range lies within the per-second
#: rollup's retention: the cost grows with intervals x (job, forwarding node, target), not with
#: records; 60 s windows read whole minutes (a 1 h look-back: 60 x those rows, not 3,600 x).
#: Seconds [since, until) by the second each request started in (a partial last second is left
#: out, as fail-slow does).
_ROLLUP_W = "intDiv(toUInt64(toUnixTimestamp(t)) * 1000000000, {win:UInt64})"
ROLLUP_USAGE_SQL = f"""
SELECT job_id, w, r.1 AS rtype, r.2 AS res, sum(o) AS n, sum(b) AS bytes, sum(s) AS svc_ns, sum(q) AS qw_ns
FROM
(
    SELECT job_id, {_ROLLUP_W} AS w, ops AS o, bytes AS b, service_ns AS s, queue_wait_ns AS q,
           arrayJoin([('forwarding_node', forwarding_node), ('target', target)]) AS r
    FROM (__SRC__)
    WHERE 1 __JOBS__
)
WHERE r.2 != ''
GROUP BY job_id, w, rtype, res
"""
ROLLUP_JOB_SQL = f"""
SELECT job_id, {_ROLLUP_W} AS w, sum(ops) AS n, sum(bytes) AS bytes, sum(service_ns) AS svc_ns,
       sum(queue_wait_ns) AS qw_ns
FROM (__SRC__)
WHERE 1 __JOBS__
GROUP BY job_id, w
"""
#: The indexes of a usage query (``__USAGE__``: one of the two above): per (job, window), whether
#: another job used one of its resources in the window and the bytes the others moved on them
#: (:class:`~pharos_analytics.interference_usage._Windows`). Grouped per (window, resource) and
#: spread back with arrayJoin: 1.3 s for 3 M usage rows where window functions took 5.7 s.
INDEX_SQL = """
SELECT j AS job_id, w, max(k) > 1 AS shared, sum(tot - b) AS co
FROM
(
    SELECT w, length(jobs) AS k, arraySum(bs) AS tot, arrayJoin(arrayZip(jobs, bs)) AS jb, jb.1 AS j, jb.2 AS b
    FROM (SELECT w, rtype, res, groupArray(job_id) AS jobs, groupArray(bytes) AS bs FROM (__USAGE__) GROUP BY w, rtype, res)
)
GROUP BY j, w
"""
#: io_rollup_1s keeps 8 days (TTL by ingest time, migration 009): older ranges read raw records.
ROLLUP_1S_RETENTION_NS = 7 * 86400 * 10**9

JOB_SPAN_SQL = """
SELECT toUnixTimestamp64Nano(min(start)) AS first_ns, toUnixTimestamp64Nano(max(start)) AS last_ns, count() AS n
FROM io_requests WHERE job_id = {job_id:String} AND layer = 'forwarder'
"""

#: Earlier runs of the same job name with forwarder-layer requests that started before ``before``,
#: newest first, from the per-minute rollup (its minutes bound each run's span; the exact span of
#: a candidate is then read from its own records by job id, the table's primary key).
PREVIOUS_RUNS_SQL = """
SELECT job_id, toUnixTimestamp(max(minute)) AS last_minute
FROM io_rollup_1m
WHERE layer = 'forwarder' AND job_id IN (
    SELECT job_id FROM job_events FINAL WHERE kind = 'start' AND name = {name:String} AND name != '')
GROUP BY job_id
ORDER BY last_minute DESC
"""

#: :data:`PREVIOUS_RUNS_SQL` for many names at once (``names`` Array(String)), per name newest first.
PREVIOUS_RUNS_BY_NAME_SQL = """
SELECT e.job_name AS name, r.job_id AS job_id, r.last_minute AS last_minute
FROM
(
    SELECT job_id, toUnixTimestamp(max(minute)) AS last_minute
    FROM io_rollup_1m
    WHERE layer = 'forwarder' AND job_id IN (
        SELECT job_id FROM job_events FINAL WHERE kind = 'start' AND name IN {names:Array(String)} AND name != '')
    GROUP BY job_id
) AS r
INNER JOIN
(
    SELECT job_id, any(name) AS job_name FROM job_events FINAL
    WHERE kind = 'start' AND name IN {names:Array(String)} AND name != '' GROUP BY job_id
) AS e ON e.job_id = r.job_id
ORDER BY name, last_minute DESC, job_id
"""

JOB_SPANS_SQL = """
SELECT job_id, toUnixTimestamp64Nano(min(start)) AS first_ns, toUnixTimestamp64Nano(max(start)) AS last_ns, count() AS n
FROM io_requests WHERE job_id IN {jobs:Array(String)} AND layer = 'forwarder'
GROUP BY job_id
"""

JOB_NAME_SQL = "SELECT anyIf(name, kind = 'start') AS name FROM job_events FINAL WHERE job_id = {job_id:String}"
JOB_NAMES_SQL = """
SELECT job_id, anyIf(name, kind = 'start') AS name FROM job_events FINAL
WHERE job_id IN {jobs:Array(String)} GROUP BY job_id
"""
