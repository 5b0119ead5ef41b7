-- kind: idempotent (DROP/ADD ... IF [NOT] EXISTS; the backfill runs only while the new columns are all zero)
-- The rollups by direction and kind of request (issue 15, item 2), so that the system-wide views
-- (the API's forwarding-node view, the control loop's load and capacity, the overview and
-- forwarders dashboards) read them instead of raw records. For each (second | minute, ...):
--   data_bytes_read / data_bytes_written: bytes of read / write requests on regular files
--   data_reads / data_writes: those requests (sum of count)
--   meta_ops: metadata requests (open, close, fsync, fdatasync, stat, unlink, mkdir, rename)
--   service_quantiles: quantilesBFloat16State(0.5, 0.99) of the records' duration (ns), which
--     replaces 009's `duration` (quantilesState, a reservoir of up to 8192 values per row: merging
--     it costs as much as the records it saw; a bfloat16 histogram is bounded by the distinct
--     values, relative error < 1%). On a 10 M-record store, the fail-slow forwarder window query:
--     0.113 s with the reservoir, 0.022 s with bfloat16.
-- and in the 1 s rollup, for the API's forwarding-node view:
--   queue_wait_quantiles: quantilesBFloat16State(0.5, 0.99) of the requests' queue wait (ns)
--   compute_nodes: the compute nodes the requests came from
-- The same operation sets as pharos_analytics.summary READ_OPS / WRITE_OPS / META_OPS and the
-- dashboards' IS_DATA (tests/pipeline/test_rollups.py checks the text against them).
-- The views are re-created with the new columns; the rows already in the rollups get them once
-- from the raw records still stored (the 1 s rollup: those ingested in its 8-day TTL). Run before
-- any pipeline ingests (`pharos up` and the pipeline migrate at start): an insert between the
-- DROP and the CREATE of a view would miss that rollup.
DROP VIEW IF EXISTS io_rollup_1s_mv;

DROP VIEW IF EXISTS io_rollup_1m_mv;

ALTER TABLE io_rollup_1s DROP COLUMN IF EXISTS duration;

ALTER TABLE io_rollup_1s
    ADD COLUMN IF NOT EXISTS service_quantiles AggregateFunction(quantilesBFloat16(0.5, 0.99), UInt64),
    ADD COLUMN IF NOT EXISTS data_bytes_read SimpleAggregateFunction(sum, UInt64),
    ADD COLUMN IF NOT EXISTS data_bytes_written SimpleAggregateFunction(sum, UInt64),
    ADD COLUMN IF NOT EXISTS data_reads SimpleAggregateFunction(sum, UInt64),
    ADD COLUMN IF NOT EXISTS data_writes SimpleAggregateFunction(sum, UInt64),
    ADD COLUMN IF NOT EXISTS meta_ops SimpleAggregateFunction(sum, UInt64),
    ADD COLUMN IF NOT EXISTS queue_wait_quantiles AggregateFunction(quantilesBFloat16(0.5, 0.99), UInt64),
    ADD COLUMN IF NOT EXISTS compute_nodes SimpleAggregateFunction(groupUniqArrayArray, Array(String));

ALTER TABLE io_rollup_1m DROP COLUMN IF EXISTS duration;

ALTER TABLE io_rollup_1m
    ADD COLUMN IF NOT EXISTS service_quantiles AggregateFunction(quantilesBFloat16(0.5, 0.99), UInt64),
    ADD COLUMN IF NOT EXISTS data_bytes_read SimpleAggregateFunction(sum, UInt64),
    ADD COLUMN IF NOT EXISTS data_bytes_written SimpleAggregateFunction(sum, UInt64),
    ADD COLUMN IF NOT EXISTS data_reads SimpleAggregateFunction(sum, UInt64),
    ADD COLUMN IF NOT EXISTS data_writes SimpleAggregateFunction(sum, UInt64),
    ADD COLUMN IF NOT EXISTS meta_ops SimpleAggregateFunction(sum, UInt64);

INSERT INTO io_rollup_1s
SELECT toStartOfSecond(start) AS sec, layer, forwarding_node, target, job_id,
       0 AS records, 0 AS ops, 0 AS bytes, 0 AS service_ns, 0 AS queue_wait_ns,
       max(io_requests.ingested) AS ingested, quantilesBFloat16State(0.5, 0.99)(duration_ns) AS service_quantiles,
       sumIf(io_requests.bytes, file_type = 'regular' AND op IN ('read', 'pread', 'readv')) AS data_bytes_read,
       sumIf(io_requests.bytes, file_type = 'regular' AND op IN ('write', 'pwrite', 'writev')) AS data_bytes_written,
       sumIf(count, file_type = 'regular' AND op IN ('read', 'pread', 'readv')) AS data_reads,
       sumIf(count, file_type = 'regular' AND op IN ('write', 'pwrite', 'writev')) AS data_writes,
       sumIf(count, op IN ('open', 'close', 'fsync', 'fdatasync', 'stat', 'unlink', 'mkdir', 'rename')) AS meta_ops,
       quantilesBFloat16State(0.5, 0.99)(io_requests.queue_wait_ns) AS queue_wait_quantiles, groupUniqArrayIf(compute_node, compute_node != '') AS compute_nodes
FROM io_requests
WHERE (SELECT sum(data_reads) + sum(data_writes) + sum(meta_ops) FROM io_rollup_1s) = 0
  AND io_requests.ingested >= now() - INTERVAL 8 DAY
GROUP BY sec, layer, forwarding_node, target, job_id;

INSERT INTO io_rollup_1m
SELECT toStartOfMinute(start) AS minute, layer, job_id, rank, forwarding_node, target,
       0 AS records, 0 AS ops, 0 AS bytes, 0 AS bytes_read, 0 AS bytes_written, 0 AS service_ns, 0 AS queue_wait_ns,
       max(io_requests.ingested) AS ingested, quantilesBFloat16State(0.5, 0.99)(duration_ns) AS service_quantiles,
       sumIf(io_requests.bytes, file_type = 'regular' AND op IN ('read', 'pread', 'readv')) AS data_bytes_read,
       sumIf(io_requests.bytes, file_type = 'regular' AND op IN ('write', 'pwrite', 'writev')) AS data_bytes_written,
       sumIf(count, file_type = 'regular' AND op IN ('read', 'pread', 'readv')) AS data_reads,
       sumIf(count, file_type = 'regular' AND op IN ('write', 'pwrite', 'writev')) AS data_writes,
       sumIf(count, op IN ('open', 'close', 'fsync', 'fdatasync', 'stat', 'unlink', 'mkdir', 'rename')) AS meta_ops
FROM io_requests
WHERE (SELECT sum(data_reads) + sum(data_writes) + sum(meta_ops) FROM io_rollup_1m) = 0
GROUP BY minute, layer, job_id, rank, forwarding_node, target;

CREATE MATERIALIZED VIEW IF NOT EXISTS io_rollup_1s_mv TO io_rollup_1s AS
SELECT toStartOfSecond(start) AS sec, layer, forwarding_node, target, job_id,
       count() AS records, sum(count) AS ops, sum(bytes) AS bytes, sum(duration_ns) AS service_ns,
       sum(queue_wait_ns) AS queue_wait_ns, now() AS ingested, quantilesBFloat16State(0.5, 0.99)(duration_ns) AS service_quantiles,
       sumIf(io_requests.bytes, file_type = 'regular' AND op IN ('read', 'pread', 'readv')) AS data_bytes_read,
       sumIf(io_requests.bytes, file_type = 'regular' AND op IN ('write', 'pwrite', 'writev')) AS data_bytes_written,
       sumIf(count, file_type = 'regular' AND op IN ('read', 'pread', 'readv')) AS data_reads,
       sumIf(count, file_type = 'regular' AND op IN ('write', 'pwrite', 'writev')) AS data_writes,
       sumIf(count, op IN ('open', 'close', 'fsync', 'fdatasync', 'stat', 'unlink', 'mkdir', 'rename')) AS meta_ops,
       quantilesBFloat16State(0.5, 0.99)(io_requests.queue_wait_ns) AS queue_wait_quantiles, groupUniqArrayIf(compute_node, compute_node != '') AS compute_nodes
FROM io_requests
GROUP BY sec, layer, forwarding_node, target, job_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS io_rollup_1m_mv TO io_rollup_1m AS
SELECT toStartOfMinute(start) AS minute, layer, job_id, rank, forwarding_node, target,
       count() AS records, sum(count) AS ops, sum(bytes) AS bytes,
       sumIf(io_requests.bytes, op IN ('read', 'pread', 'readv')) AS bytes_read,
       sumIf(io_requests.bytes, op IN ('write', 'pwrite', 'writev')) AS bytes_written,
       sum(duration_ns) AS service_ns, sum(queue_wait_ns) AS queue_wait_ns,
       now() AS ingested, quantilesBFloat16State(0.5, 0.99)(duration_ns) AS service_quantiles,
       sumIf(io_requests.bytes, file_type = 'regular' AND op IN ('read', 'pread', 'readv')) AS data_bytes_read,
       sumIf(io_requests.bytes, file_type = 'regular' AND op IN ('write', 'pwrite', 'writev')) AS data_bytes_written,
       sumIf(count, file_type = 'regular' AND op IN ('read', 'pread', 'readv')) AS data_reads,
       sumIf(count, file_type = 'regular' AND op IN ('write', 'pwrite', 'writev')) AS data_writes,
       sumIf(count, op IN ('open', 'close', 'fsync', 'fdatasync', 'stat', 'unlink', 'mkdir', 'rename')) AS meta_ops
FROM io_requests
GROUP BY minute, layer, job_id, rank, forwarding_node, target;
