-- kind: idempotent (DROP VIEW IF EXISTS, CREATE ... IF NOT EXISTS; no data moves)
-- io_rollup_1m per job, no longer per rank (issue 28, item 3: what does not scale). Nothing reads
-- its rank: the dashboards, the interference pass's earlier runs and the retention read it by
-- layer, minute, job, forwarding node and target; per-rank questions (stragglers, a job's ranks)
-- read the raw records, kept as long as this rollup (90 days). Per rank it was hardly a rollup:
-- on the simulated 4,096-node mix (bench/ingest.py --mix simulated) a poll of 137,000 records
-- made 64,000 rows of it (one per rank, minute, forwarding node and target seen), 7,400 without
-- the rank; writing them was a quarter of the ingest insert's CPU (2.0 -> 1.5 s for 548,394 records).
-- ClickHouse cannot take a column out of a table's sorting key, so `rank` stays in the table:
-- rows written from now on hold -1 (all ranks), those already stored keep their rank. Sums by
-- any other column are unchanged.
DROP VIEW IF EXISTS io_rollup_1m_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS io_rollup_1m_mv TO io_rollup_1m AS
SELECT toStartOfMinute(start) AS minute, layer, job_id, toInt32(-1) AS rank, forwarding_node, target,
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
GROUP BY minute, layer, job_id, forwarding_node, target;
