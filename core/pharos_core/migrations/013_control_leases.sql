-- kind: idempotent (ADD COLUMN IF NOT EXISTS)
-- Leases of reserved forwarding nodes (issue 26, item 1; pharos_analytics.control.lease): each
-- allocation row says until when the job holds the node. A claimed hint holds it for the start
-- grace ([control] reservation_start_grace_s); the control loop renews it to t + lease_s from the
-- job's start event, its newest stored I/O record or Slurm's view; a lease not renewed expires and
-- the node is returned (a 'lease_expired' control action), so a lost end event never holds a node
-- forever. Rows stored before this migration read 0: their lease is since + the start grace.
ALTER TABLE control_allocations
    ADD COLUMN IF NOT EXISTS lease_until DateTime64(9, 'UTC') DEFAULT toDateTime64(0, 9, 'UTC');
