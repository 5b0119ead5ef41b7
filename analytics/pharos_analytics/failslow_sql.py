"""The SQL of the fail-slow detector (:mod:`pharos_analytics.failslow`): per target and per
forwarding node over one window, their per-interval rows for the onset of a fault. Named
constants with bound parameters (``since``/``until`` DateTime64(9), ``node``, ``bucket_ns``,
``min_ops``)."""

from __future__ import annotations

from dataclasses import dataclass

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
#: 009): the seconds its records started in, the last partial second left out. (The control loop's
#: and the API's short windows; fail-slow and interference read :func:`forwarder_rollup`.)
ROLLUP_FWD_WINDOW = (
    "layer = 'forwarder' AND forwarding_node != '' "
    "AND sec >= toStartOfSecond({since:DateTime64(9)}) AND sec < toStartOfSecond({until:DateTime64(9)})"
)


@dataclass(frozen=True)
class ForwarderRollup:
    """One rollup of the forwarder layer's records: its interval (s), table, time column and the
    condition that keeps its forwarder-layer rows."""

    step_s: int
    table: str
    time: str
    rows: str


#: The forwarder layer's rollups, coarsest first (migrations 009 and 014).
FORWARDER_ROLLUPS = (
    ForwarderRollup(600, "io_rollup_forwarder_10m", "time", "1"),
    ForwarderRollup(60, "io_rollup_forwarder_1m", "time", "1"),
    ForwarderRollup(1, "io_rollup_1s", "sec", "layer = 'forwarder'"),
)


def rollup_step(window_s: float, min_intervals: int) -> int:
    """Interval (s) a window of ``window_s`` s is read in: the coarsest rollup's that still cuts it
    into at least ``min_intervals`` intervals (1 h with 60: 60 s; 12 h: 600 s; 60 s: 1 s)."""
    return next((r.step_s for r in FORWARDER_ROLLUPS if window_s / r.step_s >= min_intervals), 1)


def _split(lo: int, hi: int, step_s: int) -> list[tuple[ForwarderRollup, list[tuple[int, int]]]]:
    """Seconds ``[lo, hi)`` as (rollup, its ranges): the coarsest rollup whose interval divides
    ``step_s`` takes the whole intervals, finer ones the partial intervals at the edges."""
    parts, ranges = [], [(lo, hi)] if lo < hi else []
    for r in FORWARDER_ROLLUPS:
        if step_s % r.step_s or not ranges:
            continue
        if r.step_s == 1:
            parts.append((r, ranges))
            break
        mine, rest = [], []
        for a, b in ranges:
            x, y = -(-a // r.step_s) * r.step_s, b // r.step_s * r.step_s
            if x < y:
                mine.append((x, y))
                rest += [(u, v) for u, v in ((a, x), (y, b)) if u < v]
            else:
                rest.append((a, b))
        if mine:
            parts.append((r, mine))
        ranges = rest
    return parts


def forwarder_rollup(since_ns: int, until_ns: int, step_s: int, whole: bool = False) -> str:
    """A subquery of the forwarder layer's records started in the seconds of ``(since, until]``
    (ns since the epoch; as :data:`ROLLUP_FWD_WINDOW`: from the second of ``since`` to the last
    whole second before ``until``) in intervals of ``step_s`` (1, 60, 600 or a multiple),
    with columns ``t`` (interval start, DateTime), forwarding_node (also ``''``: records naming
    none), target, job_id, ops, bytes, service_ns, queue_wait_ns, service_quantiles (not merged:
    read with GROUP BY). The whole
    10-minute and minute intervals come from the coarse rollups (migration 014), the rest from
    io_rollup_1s: the same sums as the per-second rollup, from ~step x fewer rows. With ``whole``
    only the whole intervals of ``step_s`` inside the range (no per-second rows at all: the
    partial first and last intervals are left out, as a partial last second is)."""
    lo, hi = since_ns // 1_000_000_000, until_ns // 1_000_000_000
    if whole:
        lo, hi = -(-lo // step_s) * step_s, hi // step_s * step_s
    parts = []
    for r, ranges in _split(lo, hi, step_s) or [(FORWARDER_ROLLUPS[-1], [])]:
        when = " OR ".join(
            f"({r.time} >= toDateTime({a}, 'UTC') AND {r.time} < toDateTime({b}, 'UTC'))" for a, b in ranges
        )
        parts.append(
            f"SELECT toStartOfInterval({r.time}, INTERVAL {step_s} SECOND) AS t, forwarding_node, target, job_id, "
            f"ops, bytes, service_ns, queue_wait_ns, service_quantiles FROM {r.table} WHERE {r.rows} AND ({when or '0'})"
        )
    return "\n    UNION ALL\n    ".join(parts)


#: Per (forwarding node, target, bucket of ``bucket_ns``, a whole number of intervals) over one
#: window, from the rows of :func:`forwarder_rollup`.
_FWD_PAIRS = """
SELECT forwarding_node AS node, target, intDiv(toUInt64(toUnixTimestamp(t)) * 1000000000, {bucket_ns:UInt64}) AS bucket,
       sum(ops) AS ops, sum(bytes) AS bytes, sum(service_ns) AS svc_ns, sum(queue_wait_ns) AS qw_ns
FROM (__SRC__)
WHERE forwarding_node != ''
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
_FWD_RELATIVE = f"""
WITH pairs AS ({_FWD_PAIRS}), medians AS ({_FWD_TARGET_MEDIANS})
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

#: Per forwarding node over one window: bandwidth (B/s) per busy interval, tail service time,
#: queue wait; ``busy``: intervals with requests.
_FWD_WINDOW = """
SELECT node,
       count() AS busy,
       sum(b) AS bytes,
       sum(o) AS ops,
       sum(b) / greatest(count(), 1)__PER_S__ AS bw_avg,
       max(b)__PER_S__ AS bw_max,
       sum(qw) / greatest(sum(o), 1) AS queue_wait_ns,
       max(p99) AS p99_max_ns,
       quantileExact(0.5)(p99) AS p99_ns,
       length(groupUniqArrayArray(js)) AS jobs
FROM
(
    SELECT forwarding_node AS node, t,
           sum(bytes) AS b, sum(ops) AS o, sum(queue_wait_ns) AS qw,
           quantilesBFloat16Merge(0.5, 0.99)(service_quantiles)[2] AS p99, groupUniqArray(job_id) AS js
    FROM (__SRC__)
    WHERE forwarding_node != ''
    GROUP BY node, t
)
GROUP BY node
ORDER BY node
"""

#: Per (forwarding node, interval, target): for the onset of a forwarder fault.
_FWD_INTERVALS = """
SELECT forwarding_node AS node, target, toUnixTimestamp64Nano(toDateTime64(t, 9)) AS t_ns,
       sum(service_ns) / greatest(sum(bytes), 1) AS ns_per_byte, sum(ops) AS ops
FROM (__SRC__)
WHERE forwarding_node = {node:String}
GROUP BY node, target, t_ns
ORDER BY t_ns
"""


@dataclass(frozen=True)
class ForwarderWindowSql:
    """The fail-slow forwarder queries of one window ``(since, until]`` read in intervals of
    ``step_s`` (:func:`forwarder_rollup`); bound parameters ``bucket_ns``, ``min_ops``, ``node``."""

    step_s: int
    pairs: str
    relative: str
    target_medians: str
    window: str
    intervals: str


def forwarder_window_sql(since_ns: int, until_ns: int, step_s: int) -> ForwarderWindowSql:
    """:class:`ForwarderWindowSql` of the window ``(since_ns, until_ns]`` (ns) in ``step_s`` s
    intervals: its whole intervals (``whole`` of :func:`forwarder_rollup`): a 1 h window read in
    minutes leaves out up to a minute at each end, and reads no per-second rows."""
    src = forwarder_rollup(since_ns, until_ns, step_s, whole=True)
    per_s = f" / {step_s}" if step_s > 1 else ""
    return ForwarderWindowSql(
        step_s=step_s,
        pairs=_FWD_PAIRS.replace("__SRC__", src),
        relative=_FWD_RELATIVE.replace("__SRC__", src),
        target_medians=f"WITH pairs AS ({_FWD_PAIRS})\n{_FWD_TARGET_MEDIANS}".replace("__SRC__", src),
        window=_FWD_WINDOW.replace("__SRC__", src).replace("__PER_S__", per_s),
        intervals=_FWD_INTERVALS.replace("__SRC__", src),
    )
