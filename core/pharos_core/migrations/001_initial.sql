-- kind: idempotent (every statement is IF NOT EXISTS)
-- Pharos store, version 1. The same SQL runs on embedded chDB and on a ClickHouse server.
-- Enum-like columns hold the lower-case names of the wire contract's enums without their
-- prefix: layer 'client'|'forwarder'|'storage'; op 'read'|'write'|'pread'|'pwrite'|'readv'|
-- 'writev'|'open'|'close'|'fsync'|'fdatasync'|'stat'|'unlink'|'mkdir'|'rename'|'block_read'|
-- 'block_write'|'block_other'; file_type 'regular'|'directory'|'pipe'|'socket'|'char_device'|
-- 'block_device'|'symlink'|'other'|'' (none).

-- One row per IoRecord (a request, or a run of `count` merged requests).
CREATE TABLE IF NOT EXISTS io_requests
(
    start           DateTime64(9, 'UTC') CODEC(Delta, ZSTD),
    end             DateTime64(9, 'UTC') CODEC(Delta, ZSTD),
    duration_ns     UInt64 CODEC(T64, ZSTD),
    layer           LowCardinality(String),
    host            LowCardinality(String),
    job_id          String,
    rank            Int32,
    pid             UInt32,
    tid             UInt32,
    comm            LowCardinality(String),
    op              LowCardinality(String),
    file_type       LowCardinality(String),
    dev             UInt64,
    inode           UInt64,
    path            String,
    fd              Int32,
    offset          UInt64,
    size            UInt64,
    result          Int64,
    count           UInt32,
    bytes           UInt64,                 -- max(result, 0) * count, computed at ingest
    compute_node    LowCardinality(String),
    forwarding_node LowCardinality(String),
    target          LowCardinality(String),
    object_id       UInt64,
    queue_wait_ns   UInt64,
    producer_id     LowCardinality(String),
    seq             UInt64,
    record_index    UInt32,                 -- position of the record in its batch
    INDEX idx_producer producer_id TYPE set(64) GRANULARITY 4,
    INDEX idx_seq seq TYPE minmax GRANULARITY 4
)
ENGINE = MergeTree
PARTITION BY toDate(start)
ORDER BY (job_id, layer, start)
TTL toDateTime(start) + INTERVAL 90 DAY
SETTINGS ttl_only_drop_parts = 1;

-- One row per stored batch: gap detection per producer. Written after the batch's records.
CREATE TABLE IF NOT EXISTS io_batches
(
    producer_id LowCardinality(String),
    seq         UInt64,
    host        LowCardinality(String),
    records     UInt32,
    created     DateTime64(9, 'UTC'),
    ingested    DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY (producer_id, seq);

-- Job life-cycle events from `pharos run` / Slurm.
CREATE TABLE IF NOT EXISTS job_events
(
    job_id    String,
    kind      LowCardinality(String),      -- 'start' | 'end'
    time      DateTime64(9, 'UTC'),
    name      String,
    command   Array(String),
    user      LowCardinality(String),
    ranks     UInt32,
    host      LowCardinality(String),
    exit_code Int32,
    cgroup    String
)
ENGINE = ReplacingMergeTree
ORDER BY (job_id, kind);

-- Cumulative loss counters per (producer, job); the newest row per key is the truth.
CREATE TABLE IF NOT EXISTS producer_drops
(
    producer_id        LowCardinality(String),
    job_id             String,
    ringbuf_drops      UInt64,
    delivery_failures  UInt64,
    overflow_drops     UInt64,
    unmerged_fallbacks UInt64,
    updated            DateTime64(9, 'UTC')
)
ENGINE = ReplacingMergeTree(updated)
ORDER BY (producer_id, job_id);

-- Messages that did not decode (also forwarded to the dead-letter topic).
CREATE TABLE IF NOT EXISTS dead_letters
(
    time          DateTime64(3, 'UTC'),
    topic         LowCardinality(String),
    partition     Int32,
    offset        Int64,
    error         String,
    size          UInt32,
    payload_head  String                   -- first 256 bytes, hex
)
ENGINE = MergeTree
ORDER BY (time);
