"""The SQL of the fail-slow detector (:mod:`pharos_analytics.failslow`): per target and per
forwarding node over one window, their per-interval rows for the onset of a fault. Named
constants with bound parameters (``since``/``until`` DateTime64(9), ``node``, ``bucket_ns``,
``min_ops``)."""

from __future__ import annotations

#: Busy time of a target in one interval row, ns: the reported sum of service times, or for rows
#: of producers without it (service_ns_sum = 0) the p50 x ops estimate.
_SERVICE_NS = "if(service_ns_sum > 0, service_ns_sum, latency_p50_ns * (read_ops + write_ops + metadata_ops))"

#: Per target over one window: intervals are summed over forwarding nodes first (the model's service
#: time per byte is then replaced by the fastest forwarding node's, TARGET_FWD_MEDIANS_SQL).
TARGET_WINDOW_SQL = """
SELECT
    target                                              AS node,
    count()                                             AS intervals,
    countIf(o > 0)                                      AS busy,
    sum(b)                                              AS bytes,
    sum(o)                                              AS ops,
    sum(b) / greatest(sumIf(secs, o > 0), 1e-9)         AS bw_avg,
    max(b / secs)                                       AS bw_max,
    sum(svc) / greatest(sum(b), 1)                      AS svc_ns_per_byte,
    sum(svc)                                            AS svc_ns,
    quantileExactIf(0.5)(svc / b, b > 0)                AS svc_ns_per_byte_median,
    quantileExactIf(0.5)(p99, o > 0)                    AS p99_ns,
    max(p99)                                            AS p99_max_ns,
    sum(b) / greatest(sum(o), 1)                        AS req_bytes,
    avg(qd)                                             AS queue_depth,
    avgIf(thr, o > 0)                                   AS throttled_share,
    max(perf)                                           AS max_perf_mb_s,
    max(slow)                                           AS injected_slowdown,
    toUnixTimestamp64Nano(min(time))                    AS first_ns,
    toUnixTimestamp64Nano(max(time))                    AS last_ns
FROM
(
    SELECT target, time,
           greatest(max(interval_ms), 1) / 1000                 AS secs,
           sum(bytes_read + bytes_written)                      AS b,
           sum(read_ops + write_ops + metadata_ops)             AS o,
           sum({svc}) AS svc,
           max(latency_p99_ns)                                  AS p99,
           sum(queue_depth)                                     AS qd,
           max(throttled)                                       AS thr,
           max(max_perf_mb_s)                                   AS perf,
           max(slowdown)                                        AS slow
    FROM target_metrics FINAL
    WHERE time > {since:DateTime64(9)} AND time <= {until:DateTime64(9)}
    GROUP BY target, time
)
GROUP BY target
ORDER BY target
""".replace("{svc}", _SERVICE_NS)

#: Per (target, forwarding node) over one window: the median over intervals of the service time per
#: byte the forwarding node saw on the target, and its requests.
TARGET_FWD_MEDIANS_SQL = """
SELECT target AS node, forwarding_node AS fwd, quantileExactIf(0.5)(svc / b, b > 0) AS med, sum(o) AS ops
FROM
(
    SELECT target, time, forwarding_node, sum({svc}) AS svc, sum(bytes_read + bytes_written) AS b,
           sum(read_ops + write_ops + metadata_ops) AS o
    FROM target_metrics FINAL
    WHERE time > {since:DateTime64(9)} AND time <= {until:DateTime64(9)}
    GROUP BY target, time, forwarding_node
)
GROUP BY target, forwarding_node
""".replace("{svc}", _SERVICE_NS)

#: Per target and interval (for the onset of a fault): the fastest forwarding node's ns/B, as in
#: :data:`TARGET_WINDOW_SQL`.
TARGET_INTERVALS_SQL = """
SELECT target AS node, toUnixTimestamp64Nano(time) AS t_ns,
       ifNull(minIf(svc_f / b_f, b_f > 0), 0) AS ns_per_byte, sum(o_f) AS ops, max(perf_f) AS perf
FROM
(
    SELECT target, time, forwarding_node,
           sum({svc}) AS svc_f, sum(bytes_read + bytes_written) AS b_f,
           sum(read_ops + write_ops + metadata_ops) AS o_f, max(max_perf_mb_s) AS perf_f
    FROM target_metrics FINAL
    WHERE time > {since:DateTime64(9)} AND time <= {until:DateTime64(9)}
    GROUP BY target, time, forwarding_node
)
GROUP BY target, time
ORDER BY t_ns
""".replace("{svc}", _SERVICE_NS)

#: The seconds of a window ``(since, until]`` in the per-second rollup (io_rollup_1s, migration
#: 009): the seconds its records started in, the last partial second left out.
ROLLUP_FWD_WINDOW = (
    "layer = 'forwarder' AND forwarding_node != '' "
    "AND sec >= toStartOfSecond({since:DateTime64(9)}) AND sec < toStartOfSecond({until:DateTime64(9)})"
)

#: Per (forwarding node, target, bucket of ``bucket_ns``, a whole number of seconds) over one
#: window, from the forwarder layer's per-second rollup.
FWD_PAIRS_SQL = f"""
SELECT forwarding_node AS node, target, intDiv(toUInt64(toUnixTimestamp(sec)) * 1000000000, {{bucket_ns:UInt64}}) AS bucket,
       sum(ops) AS ops, sum(bytes) AS bytes, sum(service_ns) AS svc_ns, sum(queue_wait_ns) AS qw_ns
FROM io_rollup_1s
WHERE {ROLLUP_FWD_WINDOW}
GROUP BY node, target, bucket
"""
FWD_BUCKETS_PER_WINDOW = 600  # the forwarders' median is taken over at most this many intervals per window

#: The per-target medians: over the forwarding nodes with at least {min_ops} requests and some
#: bytes on the target in the window, of each one's ns/B there (targets served by at least two).
#: quantileExactInclusive(0.5) is the median numpy takes (the mean of the middle two).
_FWD_TARGET_MEDIANS = """
    SELECT target, quantileExactInclusive(0.5)(svc / b) AS med
    FROM (SELECT node, target, sum(ops) AS o, sum(bytes) AS b, sum(svc_ns) AS svc FROM pairs GROUP BY node, target)
    WHERE o >= {min_ops:UInt64} AND b > 0
    GROUP BY target HAVING count() >= 2
"""
#: Per forwarding node: its service ns and bytes over the window, and its relative service time
#: (``rel``; ``intervals`` 0: none): the median over intervals of exp(bytes-weighted mean over the
#: targets of log(its ns/B on the target / the target's median ns/B)). In the store, not in Python
#: loops over (node, target, interval) rows: 240 forwarding nodes x 1,280 targets make 10^5-10^6.
FWD_RELATIVE_SQL = f"""
WITH pairs AS ({FWD_PAIRS_SQL}), medians AS ({_FWD_TARGET_MEDIANS})
SELECT n.node AS node, n.svc_ns AS svc_ns, n.bytes AS bytes, r.rel AS rel, r.intervals AS intervals
FROM (SELECT node, sum(svc_ns) AS svc_ns, sum(bytes) AS bytes FROM pairs GROUP BY node) AS n
LEFT JOIN
(
    SELECT node, quantileExactInclusive(0.5)(x) AS rel, count() AS intervals
    FROM
    (
        SELECT p.node AS node, p.bucket AS bucket,
               exp(sum(log(greatest(p.svc_ns / p.bytes, 1e-12) / m.med) * p.bytes) / sum(p.bytes)) AS x
        FROM pairs AS p INNER JOIN medians AS m ON p.target = m.target
        WHERE p.bytes > 0 AND m.med > 0
        GROUP BY node, bucket
    )
    GROUP BY node
) AS r ON n.node = r.node
"""
FWD_TARGET_MEDIANS_SQL = f"WITH pairs AS ({FWD_PAIRS_SQL})\n{_FWD_TARGET_MEDIANS}"

#: Per forwarding node over one window: bandwidth per busy second, tail service time, queue wait.
FWD_WINDOW_SQL = f"""
SELECT node,
       count() AS busy,
       sum(b) AS bytes,
       sum(o) AS ops,
       sum(b) / greatest(count(), 1) AS bw_avg,
       max(b) AS bw_max,
       sum(qw) / greatest(sum(o), 1) AS queue_wait_ns,
       max(p99) AS p99_max_ns,
       quantileExact(0.5)(p99) AS p99_ns,
       length(groupUniqArrayArray(js)) AS jobs
FROM
(
    SELECT forwarding_node AS node, sec,
           sum(bytes) AS b, sum(ops) AS o, sum(queue_wait_ns) AS qw,
           quantilesBFloat16Merge(0.5, 0.99)(service_quantiles)[2] AS p99, groupUniqArray(job_id) AS js
    FROM io_rollup_1s
    WHERE {ROLLUP_FWD_WINDOW}
    GROUP BY node, sec
)
GROUP BY node
ORDER BY node
"""

#: Per (forwarding node, second, target): for the onset of a forwarder fault.
FWD_INTERVALS_SQL = f"""
SELECT forwarding_node AS node, target, toUnixTimestamp64Nano(toDateTime64(sec, 9)) AS t_ns,
       sum(service_ns) / greatest(sum(bytes), 1) AS ns_per_byte, sum(ops) AS ops
FROM io_rollup_1s
WHERE {ROLLUP_FWD_WINDOW} AND forwarding_node = {{node:String}}
GROUP BY node, target, t_ns
ORDER BY t_ns
"""
