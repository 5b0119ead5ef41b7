-- kind: idempotent (every statement is IF NOT EXISTS)
-- System-side diagnosis (pharos_analytics.failslow / interference / alerts). TTLs count from
-- the insert (as 002 does for io_requests): detections over replayed history are kept.

-- What each detection cycle found: one row per anomaly (fail-slow node) or interference
-- event per cycle. `key` identifies the condition across cycles (kind:node, or
-- interference:job:culprit:resource_type:resource); evidence is JSON text.
CREATE TABLE IF NOT EXISTS anomalies
(
    detected     DateTime64(9, 'UTC'),
    key          String,
    kind         LowCardinality(String),    -- fail_slow_target | fail_slow_forwarder | interference
    node         String,                    -- target or forwarding node (fail-slow), shared resource (interference)
    node_type    LowCardinality(String),    -- target | forwarder | forwarding_node
    job_id       String,                    -- interference: the slowed job
    culprit_job  String,
    persistence  LowCardinality(String),    -- persistent | transient | '' (interference)
    active       UInt8,
    severity     LowCardinality(String),    -- critical | warning
    ratio        Float64,                   -- x peers' median service time per byte, or x baseline latency
    onset        Nullable(DateTime64(9, 'UTC')),
    start        Nullable(DateTime64(9, 'UTC')),
    end          Nullable(DateTime64(9, 'UTC')),
    evidence     String,
    ingested     DateTime('UTC') DEFAULT now()
)
ENGINE = MergeTree
PARTITION BY toDate(detected)
ORDER BY (detected, key)
TTL ingested + INTERVAL 90 DAY;

-- Every alert notification sent (firing or resolved) and whether the sink accepted it.
CREATE TABLE IF NOT EXISTS alert_log
(
    time         DateTime64(9, 'UTC'),
    key          String,
    alertname    LowCardinality(String),
    state        LowCardinality(String),    -- firing | resolved
    sink         LowCardinality(String),    -- alertmanager | webhook
    accepted     UInt8,
    status_code  Int32,
    onset        Nullable(DateTime64(9, 'UTC')),
    latency_s    Nullable(Float64),         -- accepted time - onset (first notification only)
    labels       String,
    error        String,
    ingested     DateTime('UTC') DEFAULT now()
)
ENGINE = MergeTree
PARTITION BY toDate(time)
ORDER BY (time, key)
TTL ingested + INTERVAL 90 DAY;
