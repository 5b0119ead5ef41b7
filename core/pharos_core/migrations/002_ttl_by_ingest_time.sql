-- kind: mutation (MODIFY TTL re-evaluates existing parts once)
-- Expire io_requests 90 days after they were stored, not 90 days after the request ran:
-- imported history (Darshan logs, replays) must not vanish at its first merge.
ALTER TABLE io_requests ADD COLUMN IF NOT EXISTS ingested DateTime('UTC') DEFAULT now();
ALTER TABLE io_requests MODIFY TTL ingested + INTERVAL 90 DAY;
