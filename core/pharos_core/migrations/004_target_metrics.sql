-- kind: idempotent
-- Per-interval metrics of each storage target (OST) as served by each forwarding daemon
-- (TargetMetricsBatch on pharos.target.metrics). The sorting key holds the batch identity's
-- natural key, so a re-delivered batch collapses into the same rows: query with FINAL.
CREATE TABLE IF NOT EXISTS target_metrics
(
    time             DateTime64(9, 'UTC') CODEC(Delta, ZSTD),
    target           LowCardinality(String),
    forwarding_node  LowCardinality(String),
    interval_ms      UInt32,
    bytes_read       UInt64,
    bytes_written    UInt64,
    read_ops         UInt64,
    write_ops        UInt64,
    metadata_ops     UInt64,
    latency_p50_ns   UInt64,
    latency_p95_ns   UInt64,
    latency_p99_ns   UInt64,
    latency_max_ns   UInt64,
    queue_depth      UInt32,
    throttled        UInt8,
    max_perf_mb_s    Float64,
    slowdown         Float64,
    added_latency_ns UInt64,
    producer_id      LowCardinality(String),
    seq              UInt64,
    host             LowCardinality(String),
    ingested         DateTime('UTC') DEFAULT now()
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (target, forwarding_node, time, producer_id)
TTL ingested + INTERVAL 90 DAY;
