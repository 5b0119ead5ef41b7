-- kind: idempotent (IF NOT EXISTS; each backfill runs only into an empty rollup, before its view exists)
-- Coarser rollups of the forwarder layer (issue 28, item 3): per minute and per 10 minutes by
-- forwarding node, target and job. Fail-slow detection's look-back windows (Beacon NSDI'19 §5.3:
-- 1 h, 4 h, 12 h, 96 h) and the interference pass's look-back (1 h of 60 s windows) read them
-- instead of io_rollup_1s, whose rows grow with seconds x (forwarding node, target, job): 27,600
-- per second for 1,024 simulated compute nodes, 99 M per hour, every detection cycle. The 1 s
-- rollup still answers the partial intervals at a range's edges, so the sums are exact
-- (pharos_analytics.failslow_sql.forwarder_rollup).
-- Filled by views on io_rollup_1s (1 min) and on the 1 min rollup (10 min): each insert into
-- io_requests reaches them through io_rollup_1s_mv, in the same INSERT. The rows already in
-- io_rollup_1s fill them once when this migration runs.
-- Rows without a forwarding node (forwarder-layer records that name none) are kept: the interference
-- pass counts a job's requests with them; fail-slow leaves them out when it reads.
-- AggregatingMergeTree: read with GROUP BY and sum() / quantilesBFloat16Merge(0.5, 0.99)(service_quantiles).
CREATE TABLE IF NOT EXISTS io_rollup_forwarder_1m
(
    time              DateTime('UTC'),                        -- start of the minute
    forwarding_node   LowCardinality(String),
    target            LowCardinality(String),
    job_id            String,
    ops               SimpleAggregateFunction(sum, UInt64),   -- requests (sum of count)
    bytes             SimpleAggregateFunction(sum, UInt64),
    service_ns        SimpleAggregateFunction(sum, UInt64),   -- sum of duration_ns
    queue_wait_ns     SimpleAggregateFunction(sum, UInt64),
    service_quantiles AggregateFunction(quantilesBFloat16(0.5, 0.99), UInt64),
    ingested          SimpleAggregateFunction(max, DateTime('UTC'))  -- the TTL counts from the insert
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (time, forwarding_node, target, job_id)
TTL ingested + INTERVAL 90 DAY;

CREATE TABLE IF NOT EXISTS io_rollup_forwarder_10m
(
    time              DateTime('UTC'),                        -- start of the 10 minutes
    forwarding_node   LowCardinality(String),
    target            LowCardinality(String),
    job_id            String,
    ops               SimpleAggregateFunction(sum, UInt64),
    bytes             SimpleAggregateFunction(sum, UInt64),
    service_ns        SimpleAggregateFunction(sum, UInt64),
    queue_wait_ns     SimpleAggregateFunction(sum, UInt64),
    service_quantiles AggregateFunction(quantilesBFloat16(0.5, 0.99), UInt64),
    ingested          SimpleAggregateFunction(max, DateTime('UTC'))
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (time, forwarding_node, target, job_id)
TTL ingested + INTERVAL 90 DAY;

INSERT INTO io_rollup_forwarder_1m
SELECT toStartOfMinute(sec) AS time, forwarding_node, target, job_id,
       sum(ops) AS ops, sum(bytes) AS bytes, sum(service_ns) AS service_ns, sum(queue_wait_ns) AS queue_wait_ns,
       quantilesBFloat16MergeState(0.5, 0.99)(service_quantiles) AS service_quantiles, max(ingested) AS ingested
FROM io_rollup_1s
WHERE (SELECT count() FROM io_rollup_forwarder_1m) = 0 AND layer = 'forwarder'
GROUP BY time, forwarding_node, target, job_id;

INSERT INTO io_rollup_forwarder_10m
SELECT toStartOfTenMinutes(m.time) AS time, forwarding_node, target, job_id,
       sum(ops) AS ops, sum(bytes) AS bytes, sum(service_ns) AS service_ns, sum(queue_wait_ns) AS queue_wait_ns,
       quantilesBFloat16MergeState(0.5, 0.99)(service_quantiles) AS service_quantiles, max(ingested) AS ingested
FROM io_rollup_forwarder_1m AS m
WHERE (SELECT count() FROM io_rollup_forwarder_10m) = 0
GROUP BY time, forwarding_node, target, job_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS io_rollup_forwarder_1m_mv TO io_rollup_forwarder_1m AS
SELECT toStartOfMinute(sec) AS time, forwarding_node, target, job_id,
       sum(ops) AS ops, sum(bytes) AS bytes, sum(service_ns) AS service_ns, sum(queue_wait_ns) AS queue_wait_ns,
       quantilesBFloat16MergeState(0.5, 0.99)(service_quantiles) AS service_quantiles, max(ingested) AS ingested
FROM io_rollup_1s
WHERE layer = 'forwarder'
GROUP BY time, forwarding_node, target, job_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS io_rollup_forwarder_10m_mv TO io_rollup_forwarder_10m AS
SELECT toStartOfTenMinutes(m.time) AS time, forwarding_node, target, job_id,
       sum(ops) AS ops, sum(bytes) AS bytes, sum(service_ns) AS service_ns, sum(queue_wait_ns) AS queue_wait_ns,
       quantilesBFloat16MergeState(0.5, 0.99)(service_quantiles) AS service_quantiles, max(ingested) AS ingested
FROM io_rollup_forwarder_1m AS m
GROUP BY time, forwarding_node, target, job_id;
