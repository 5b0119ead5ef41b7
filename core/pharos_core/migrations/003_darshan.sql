-- kind: idempotent (every statement is IF NOT EXISTS)
-- Imported Darshan logs (pharos import darshan; pharos_pipeline.darshan_import).
-- DXT segments go to io_requests (one row per request, producer_id 'darshan:<sha256[:16]>',
-- seq 0); the module counters go to darshan_counters; job metadata to job_events.

-- Module counters, long format: one row per (record, counter) with a non-zero value.
-- A counter absent from the table is 0 for that record. module is Darshan's module name
-- ('POSIX', 'MPI-IO', 'STDIO', 'LUSTRE', 'H5F', 'H5D', 'PNETCDF_FILE', ...); rank is the
-- rank in the Pharos job (the log's rank + the log's rank_offset), -1 for a shared record
-- (reduced over every rank that opened the file). LUSTRE records give LUSTRE_STRIPE_SIZE,
-- LUSTRE_STRIPE_COUNT, LUSTRE_OSTS (distinct OSTs) and LUSTRE_COMPONENTS per file.
CREATE TABLE IF NOT EXISTS darshan_counters
(
    job_id      String,
    log_id      LowCardinality(String),     -- = io_requests.producer_id of the same log
    module      LowCardinality(String),
    rank        Int32,
    record_id   UInt64,                     -- Darshan's record id (hash of the path)
    path        String,                     -- from the log's name records, '' if absent
    counter     LowCardinality(String),
    value       Float64,
    ingested    DateTime('UTC') DEFAULT now()
)
ENGINE = MergeTree
ORDER BY (job_id, module, counter, record_id, rank)
TTL ingested + INTERVAL 90 DAY;

-- One row per imported log, written last: the marker that the log is stored completely.
-- A log is identified by the SHA-256 of its bytes, so re-importing it (any path, any job
-- id) is detected and skipped.
CREATE TABLE IF NOT EXISTS darshan_logs
(
    log_sha256     String,
    log_id         LowCardinality(String),  -- 'darshan:' + first 16 hex digits of log_sha256
    job_id         String,
    file_name      String,
    darshan_jobid  UInt64,
    uid            UInt32,
    exe            String,
    nprocs         UInt32,
    rank_offset    UInt32,                  -- added to the log's ranks in this job
    start          DateTime64(9, 'UTC'),
    end            DateTime64(9, 'UTC'),
    log_version    String,
    lib_version    String,
    modules        Array(String),
    partial_modules Array(String),          -- modules whose buffers overflowed (partial data)
    dxt_segments   UInt64,                  -- rows written to io_requests
    dxt_skipped    UInt64,                  -- DXT_MPIIO segments not stored, see the importer
    counter_rows   UInt64,
    imported       DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY log_sha256;
