-- kind: idempotent (every statement is IF NOT EXISTS)
-- The control loop (pharos_analytics.control): its audit trail, admins' pins, and which job
-- holds each reserved (dedicated) forwarding node. TTLs count from the insert (as 005).

-- Every decision and push of the control loop: DFRA at job start (kind dfra_default |
-- dfra_more_nodes | dfra_dedicated), live remapping (remap), reserved nodes returned at job
-- end (release), placement-pool hints (placement), re-pushes of an unchanged decision after
-- a failure or a restarted daemon (sync), admins' pins (pin | unpin).
-- from_state / to_state: forwarding nodes, primary first, comma-separated (mapping kinds), or
-- the pool as JSON (placement, pool pins). status: applied (pushed and accepted), failed
-- (push refused or unreachable: the previous mapping / placement keeps serving; error says
-- why; retried later), recorded (dry run, or nothing to push).
CREATE TABLE IF NOT EXISTS control_actions
(
    time         DateTime64(9, 'UTC'),
    action_id    String,
    job_id       String,                    -- '' for placement
    kind         LowCardinality(String),
    resource     String,                    -- 'mapping' | 'pool:<name>' | 'node:<name>'
    from_state   String,
    to_state     String,
    reason       String,
    evidence     String,                    -- JSON
    dry_run      UInt8,
    status       LowCardinality(String),    -- applied | failed | recorded
    error        String,
    endpoints    Array(String),             -- admin URLs pushed to
    ingested     DateTime('UTC') DEFAULT now()
)
ENGINE = MergeTree
PARTITION BY toDate(time)
ORDER BY (time, job_id)
TTL ingested + INTERVAL 90 DAY;

-- Admins' pins: a job's forwarding nodes (scope 'job', name = job id, value = JSON list of
-- nodes) or a placement pool (scope 'pool', name = pool, value = JSON {"targets": [...],
-- "max_perf": {...}}). The newest row per (scope, name) is the truth (read with FINAL);
-- deleted = 1 removes the pin.
CREATE TABLE IF NOT EXISTS control_pins
(
    scope    LowCardinality(String),
    name     String,
    value    String,
    reason   String,
    deleted  UInt8,
    updated  DateTime64(9, 'UTC')
)
ENGINE = ReplacingMergeTree(updated)
ORDER BY (scope, name);

-- Reserved (dedicated) forwarding nodes: the newest row per node says which job holds it
-- (job_id '' = free). Handed out by DFRA to one job at a time, returned when the job ends
-- (job_events 'end') or when a hinted job never started.
CREATE TABLE IF NOT EXISTS control_allocations
(
    node     String,
    job_id   String,
    since    DateTime64(9, 'UTC'),
    reason   String,
    updated  DateTime64(9, 'UTC')
)
ENGINE = ReplacingMergeTree(updated)
ORDER BY node;
