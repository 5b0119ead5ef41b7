-- kind: idempotent
-- Busy time of a target per interval (TargetMetrics.service_ns_sum): service time per byte is
-- service_ns_sum / bytes, exact, where the p50 x ops estimate misses bimodal intervals (half
-- the requests paced by the token bucket, half not). 0 in rows from older producers.
ALTER TABLE target_metrics ADD COLUMN IF NOT EXISTS service_ns_sum UInt64 DEFAULT 0 AFTER added_latency_ns;
