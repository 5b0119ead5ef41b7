-- kind: idempotent (ADD ... IF NOT EXISTS; MATERIALIZE INDEX of an existing index rebuilds it)
-- Replayed requests counted once (issue 25, item 5). A FUSE mount whose forwarding node does not
-- answer in time replays an idempotent request on the next node; when the first node had
-- executed it, both daemons sent a record of it. Each forwarder-layer record now carries
--   request_id: the mount's id of the client request (IoRecord.request_id; unique per mount
--     instance, the same on every try): (compute_node, request_id) names one client request;
--     0 = unknown (records of older daemons, and every other layer);
--   replay: 1 when the mount sent this try as a replay (IoRecord.replay).
-- Queries that count a job's forwarder-layer requests keep a replay record only when no other
-- record of its (compute_node, request_id) exists (pharos_analytics.replays). Replays are rare:
-- the minmax index on `replay` lets a query that looks for them skip every granule without one.
-- Rows stored before this migration read 0 for both (not replays).
ALTER TABLE io_requests
    ADD COLUMN IF NOT EXISTS request_id UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS replay UInt8 DEFAULT 0;

ALTER TABLE io_requests ADD INDEX IF NOT EXISTS idx_replay replay TYPE minmax GRANULARITY 1;

ALTER TABLE io_requests MATERIALIZE INDEX idx_replay;
