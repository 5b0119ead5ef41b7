-- kind: idempotent (IF NOT EXISTS; the backfill runs only into an empty rollup, before its view exists)
-- Rollups of io_requests (issue 15): per second by layer, forwarding node, target and job; per
-- minute also by rank. Detection reads them instead of raw records (fail-slow forwarding nodes:
-- analytics/pharos_analytics/failslow.py), so its cost grows with time range and objects, not with
-- records. Filled by materialized views at every insert into io_requests (the same INSERT: no
-- separate job), and once from the records already stored when this migration runs.
-- AggregatingMergeTree: read with GROUP BY and sum() / quantilesMerge(0.5, 0.99)(duration).
CREATE TABLE IF NOT EXISTS io_rollup_1s
(
    sec             DateTime('UTC'),
    layer           LowCardinality(String),
    forwarding_node LowCardinality(String),
    target          LowCardinality(String),
    job_id          String,
    records         SimpleAggregateFunction(sum, UInt64),   -- io_requests rows
    ops             SimpleAggregateFunction(sum, UInt64),   -- requests (sum of count)
    bytes           SimpleAggregateFunction(sum, UInt64),
    service_ns      SimpleAggregateFunction(sum, UInt64),   -- sum of duration_ns
    queue_wait_ns   SimpleAggregateFunction(sum, UInt64),
    duration        AggregateFunction(quantiles(0.5, 0.99), UInt64),
    ingested        SimpleAggregateFunction(max, DateTime('UTC'))  -- the TTL counts from the insert, as io_requests'
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(sec)
ORDER BY (layer, sec, forwarding_node, target, job_id)
TTL ingested + INTERVAL 8 DAY;

CREATE TABLE IF NOT EXISTS io_rollup_1m
(
    minute          DateTime('UTC'),
    layer           LowCardinality(String),
    job_id          String,
    rank            Int32,
    forwarding_node LowCardinality(String),
    target          LowCardinality(String),
    records         SimpleAggregateFunction(sum, UInt64),
    ops             SimpleAggregateFunction(sum, UInt64),
    bytes           SimpleAggregateFunction(sum, UInt64),
    bytes_read      SimpleAggregateFunction(sum, UInt64),
    bytes_written   SimpleAggregateFunction(sum, UInt64),
    service_ns      SimpleAggregateFunction(sum, UInt64),
    queue_wait_ns   SimpleAggregateFunction(sum, UInt64),
    duration        AggregateFunction(quantiles(0.5, 0.99), UInt64),
    ingested        SimpleAggregateFunction(max, DateTime('UTC'))
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (layer, minute, job_id, rank, forwarding_node, target)
TTL ingested + INTERVAL 90 DAY;

INSERT INTO io_rollup_1s
SELECT toStartOfSecond(start) AS sec, layer, forwarding_node, target, job_id,
       count() AS records, sum(count) AS ops, sum(bytes) AS bytes, sum(duration_ns) AS service_ns,
       sum(queue_wait_ns) AS queue_wait_ns, quantilesState(0.5, 0.99)(duration_ns) AS duration, now() AS ingested
FROM io_requests
WHERE (SELECT count() FROM io_rollup_1s) = 0 AND ingested >= now() - INTERVAL 8 DAY
GROUP BY sec, layer, forwarding_node, target, job_id;

INSERT INTO io_rollup_1m
SELECT toStartOfMinute(start) AS minute, layer, job_id, rank, forwarding_node, target,
       count() AS records, sum(count) AS ops, sum(bytes) AS bytes,
       sumIf(io_requests.bytes, op IN ('read', 'pread', 'readv')) AS bytes_read,
       sumIf(io_requests.bytes, op IN ('write', 'pwrite', 'writev')) AS bytes_written,
       sum(duration_ns) AS service_ns, sum(queue_wait_ns) AS queue_wait_ns,
       quantilesState(0.5, 0.99)(duration_ns) AS duration, now() AS ingested
FROM io_requests
WHERE (SELECT count() FROM io_rollup_1m) = 0
GROUP BY minute, layer, job_id, rank, forwarding_node, target;

CREATE MATERIALIZED VIEW IF NOT EXISTS io_rollup_1s_mv TO io_rollup_1s AS
SELECT toStartOfSecond(start) AS sec, layer, forwarding_node, target, job_id,
       count() AS records, sum(count) AS ops, sum(bytes) AS bytes, sum(duration_ns) AS service_ns,
       sum(queue_wait_ns) AS queue_wait_ns, quantilesState(0.5, 0.99)(duration_ns) AS duration, now() AS ingested
FROM io_requests
GROUP BY sec, layer, forwarding_node, target, job_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS io_rollup_1m_mv TO io_rollup_1m AS
SELECT toStartOfMinute(start) AS minute, layer, job_id, rank, forwarding_node, target,
       count() AS records, sum(count) AS ops, sum(bytes) AS bytes,
       sumIf(io_requests.bytes, op IN ('read', 'pread', 'readv')) AS bytes_read,
       sumIf(io_requests.bytes, op IN ('write', 'pwrite', 'writev')) AS bytes_written,
       sum(duration_ns) AS service_ns, sum(queue_wait_ns) AS queue_wait_ns,
       quantilesState(0.5, 0.99)(duration_ns) AS duration, now() AS ingested
FROM io_requests
GROUP BY minute, layer, job_id, rank, forwarding_node, target;
