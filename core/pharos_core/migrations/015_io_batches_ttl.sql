-- kind: mutation (MODIFY TTL re-evaluates existing parts once)
-- io_batches holds a row per Kafka message of records (the exactly-once marker, and each
-- producer's liveness timeline) and had no TTL: at a 40,960-node site's ~205,000 messages/s,
-- ~17.7 G rows a day kept for ever. It expires with the raw records it marks: the same
-- interval, [retention] raw_days (pharos_core.retention), 90 days by default. The exactly-once
-- checks read the recent batches only; the gaps of a job older than that have no raw records
-- left to complete. ingested is DateTime64: TTL needs a DateTime.
ALTER TABLE io_batches MODIFY TTL toDateTime(ingested) + INTERVAL 90 DAY;
