-- kind: idempotent
-- Heartbeats (every producer sends a batch at least every heartbeat_interval_s, an empty one when
-- idle) make io_batches each producer's liveness timeline, read by time: the producers heard in
-- the last hour (GET /v1/producers, `pharos status`). Rows are ordered by (producer_id, seq) and a
-- producer's seq rises with time, so a minmax index on `created` skips the granules outside the
-- range asked for. (A job's coverage reads its hosts' agents by the producer-id prefix
-- `<host>:agent:`, which the key serves: pharos_analytics.coverage.)
ALTER TABLE io_batches ADD INDEX IF NOT EXISTS idx_created created TYPE minmax GRANULARITY 1;
ALTER TABLE io_batches MATERIALIZE INDEX idx_created;
