//! Where the daemon's per-request `IoRecord`s go: the shared bounded batching Kafka sink
//! (`pharos_wire::sink::Sink`, topic `pharos.io.requests`), or nowhere with `--no-kafka`,
//! in which case every record is still counted (`not_shipped`), never silently lost.
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::Duration;

use pharos_wire::sink::Sink;
use pharos_wire::IoRecord;
use serde::Serialize;

pub struct RecordSink {
    sink: Option<Sink>,
    produced: AtomicU64,
    not_shipped: AtomicU64,
    bytes: AtomicU64,
}

#[derive(Serialize, Default)]
pub struct RecordStats {
    /// Records the daemon produced (one per served request).
    pub produced: u64,
    /// Bytes moved by the produced records (sum of max(result, 0) of reads and writes).
    pub bytes: u64,
    /// Records not shipped because Kafka is disabled (`--no-kafka`).
    pub not_shipped: u64,
    pub records_sent: u64,
    pub batches_sent: u64,
    pub overflow_drops: u64,
    pub delivery_failures: u64,
}

impl RecordSink {
    pub fn new(sink: Option<Sink>) -> RecordSink {
        RecordSink { sink, produced: AtomicU64::new(0), not_shipped: AtomicU64::new(0), bytes: AtomicU64::new(0) }
    }

    pub fn push(&self, r: IoRecord) {
        self.produced.fetch_add(1, Relaxed);
        if r.op == pharos_wire::Op::Pread as i32 || r.op == pharos_wire::Op::Pwrite as i32 {
            self.bytes.fetch_add(r.result.max(0) as u64, Relaxed);
        }
        match &self.sink {
            // A full queue is counted by the sink as an overflow drop of the job.
            Some(s) => {
                let _ = s.push(r);
            }
            None => {
                self.not_shipped.fetch_add(1, Relaxed);
            }
        }
    }

    pub fn stats(&self) -> RecordStats {
        let s = self.sink.as_ref().map(|s| s.stats()).unwrap_or_default();
        RecordStats {
            produced: self.produced.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            not_shipped: self.not_shipped.load(Relaxed),
            records_sent: s.records_sent,
            batches_sent: s.batches_sent,
            overflow_drops: s.overflow_drops,
            delivery_failures: s.delivery_failures,
        }
    }

    /// Ships what is queued and waits for Kafka, at most `timeout`.
    pub fn flush(&self, timeout: Duration) {
        if let Some(s) = &self.sink {
            if let Err(e) = s.flush(timeout) {
                log::warn!("flushing records: {e}");
            }
        }
    }
}

/// The record of one unit of migration I/O (`backend/migrate.rs`): job `migration`, layer
/// forwarder, on target `target` of object `oid` at object offset `offset`; no compute node.
/// Diagnosis tells it from client I/O by the job id.
#[allow(clippy::too_many_arguments)] // one record's fields
pub fn migration_record(
    node: &str,
    path: &str,
    target: &str,
    oid: u64,
    write: bool,
    offset: u64,
    len: u64,
    start_ns: u64,
    service: Duration,
) -> IoRecord {
    let op = if write { pharos_wire::Op::Pwrite } else { pharos_wire::Op::Pread };
    let path = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
    IoRecord {
        start_ns,
        duration_ns: service.as_nanos() as u64,
        end_ns: start_ns + service.as_nanos() as u64,
        layer: pharos_wire::Layer::Forwarder as i32,
        host: node.to_string(),
        job_id: MIGRATION_JOB.to_string(),
        op: op as i32,
        path,
        file_type: pharos_wire::FileType::Regular as i32,
        fd: -1,
        offset,
        size: len,
        result: len as i64,
        count: 1,
        forwarding_node: node.to_string(),
        target: target.to_string(),
        object_id: oid,
        ..Default::default()
    }
}

/// The job id of migration I/O records.
pub const MIGRATION_JOB: &str = "migration";
