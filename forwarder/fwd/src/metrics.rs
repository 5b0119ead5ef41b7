//! Per-target interval metrics (`TargetMetrics` of the wire contract) and their shipping
//! as `TargetMetricsBatch` messages to Kafka topic `pharos.target.metrics`
//! (key = producer_id, seq rising from 0). One message per interval holds every target.
//!
//! Latency percentiles come from at most `SAMPLES_MAX` service-time samples per target and
//! interval (later samples overwrite earlier ones round-robin, `latency_max_ns` stays exact).
//! Batches Kafka does not accept are counted (`delivery_failures`), as are batches not
//! shipped because Kafka is disabled.
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pharos_fwd_proto::Op;
use pharos_wire::v1::{TargetMetrics, TargetMetricsBatch};
use prost::Message;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use serde::Serialize;

use crate::backend::Backend;
use crate::clock::wall_ns;

const SAMPLES_MAX: usize = 8192;

#[derive(Default, Clone)]
struct Interval {
    bytes_read: u64,
    bytes_written: u64,
    read_ops: u64,
    write_ops: u64,
    metadata_ops: u64,
    samples: Vec<u64>,
    seen: u64,
    max_ns: u64,
    service_ns_sum: u64,
    throttled: bool,
}

pub struct TargetStats {
    cur: Vec<Mutex<Interval>>,
    depth: Vec<AtomicI64>,
}

impl TargetStats {
    pub fn new(n: usize) -> TargetStats {
        TargetStats {
            cur: (0..n).map(|_| Mutex::default()).collect(),
            depth: (0..n).map(|_| AtomicI64::new(0)).collect(),
        }
    }

    pub fn queued(&self, t: u32, d: i64) {
        if let Some(q) = self.depth.get(t as usize) {
            q.fetch_add(d, Relaxed);
        }
    }

    pub fn record(&self, t: u32, op: &Op, result: i64, service: Duration, throttled: bool) {
        let Some(m) = self.cur.get(t as usize) else { return };
        let mut m = m.lock().unwrap();
        let ns = service.as_nanos() as u64;
        match op {
            Op::Read { .. } => {
                m.read_ops += 1;
                m.bytes_read += result.max(0) as u64;
            }
            Op::Write { .. } => {
                m.write_ops += 1;
                m.bytes_written += result.max(0) as u64;
            }
            _ => m.metadata_ops += 1,
        }
        if m.samples.len() < SAMPLES_MAX {
            m.samples.push(ns);
        } else {
            let i = (m.seen as usize) % SAMPLES_MAX;
            m.samples[i] = ns;
        }
        m.seen += 1;
        m.max_ns = m.max_ns.max(ns);
        m.service_ns_sum += ns;
        m.throttled |= throttled;
    }

    /// Closes the interval: returns one `TargetMetrics` per target and starts a new one.
    pub fn take(&self, backend: &Backend, node: &str, start_ns: u64, interval_ms: u32) -> Vec<TargetMetrics> {
        let mut out = Vec::with_capacity(self.cur.len());
        for (i, m) in self.cur.iter().enumerate() {
            let mut iv = std::mem::take(&mut *m.lock().unwrap());
            iv.samples.sort_unstable();
            let pct = |p: f64| -> u64 {
                if iv.samples.is_empty() {
                    return 0;
                }
                let k = ((iv.samples.len() as f64 * p).ceil() as usize).clamp(1, iv.samples.len());
                iv.samples[k - 1]
            };
            let t = &backend.targets[i];
            out.push(TargetMetrics {
                target: t.name.clone(),
                forwarding_node: node.to_string(),
                time_ns: start_ns,
                interval_ms,
                bytes_read: iv.bytes_read,
                bytes_written: iv.bytes_written,
                read_ops: iv.read_ops,
                write_ops: iv.write_ops,
                metadata_ops: iv.metadata_ops,
                latency_p50_ns: pct(0.50),
                latency_p95_ns: pct(0.95),
                latency_p99_ns: pct(0.99),
                latency_max_ns: iv.max_ns,
                queue_depth: self.depth[i].load(Relaxed).max(0) as u32,
                throttled: iv.throttled,
                max_perf_mb_s: t.shm.max_perf(),
                slowdown: t.shm.slowdown(),
                added_latency_ns: t.shm.added_latency_ns(),
                service_ns_sum: iv.service_ns_sum,
            });
        }
        out
    }
}

#[derive(Default)]
struct ShipCounters {
    batches_sent: AtomicU64,
    delivery_failures: AtomicU64,
    not_shipped: AtomicU64,
    produced: AtomicU64,
}

#[derive(Serialize)]
pub struct ShipStats {
    pub batches_produced: u64,
    pub batches_sent: u64,
    pub delivery_failures: u64,
    pub not_shipped: u64,
}

struct Ctx {
    c: Arc<ShipCounters>,
}
impl ClientContext for Ctx {}
impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(_) => self.c.batches_sent.fetch_add(1, Relaxed),
            Err((e, _)) => {
                log::warn!("target metrics batch not delivered: {e}");
                self.c.delivery_failures.fetch_add(1, Relaxed)
            }
        };
    }
}

/// Ships `TargetMetricsBatch` messages; `brokers = None` only counts them.
pub struct MetricsShipper {
    producer: Option<ThreadedProducer<Ctx>>,
    topic: String,
    producer_id: String,
    host: String,
    seq: u64,
    c: Arc<ShipCounters>,
}

impl MetricsShipper {
    pub fn new(brokers: Option<&str>, topic: &str, producer_id: &str, host: &str) -> Result<MetricsShipper, String> {
        let c = Arc::new(ShipCounters::default());
        let producer = match brokers {
            Some(b) => Some(
                ClientConfig::new()
                    .set("bootstrap.servers", b)
                    .set("compression.type", "zstd")
                    .set("enable.idempotence", "true")
                    .set("acks", "all")
                    .set("linger.ms", "5")
                    .set("client.id", producer_id)
                    .create_with_context(Ctx { c: c.clone() })
                    .map_err(|e| format!("kafka producer for target metrics: {e}"))?,
            ),
            None => None,
        };
        Ok(MetricsShipper {
            producer,
            topic: topic.into(),
            producer_id: producer_id.into(),
            host: host.into(),
            seq: 0,
            c,
        })
    }

    pub fn ship(&mut self, metrics: Vec<TargetMetrics>) {
        let batch = TargetMetricsBatch {
            schema_version: pharos_wire::SCHEMA_VERSION,
            producer_id: self.producer_id.clone(),
            seq: self.seq,
            created_ns: wall_ns(),
            host: self.host.clone(),
            metrics,
        };
        self.seq += 1;
        self.c.produced.fetch_add(1, Relaxed);
        let Some(p) = &self.producer else {
            self.c.not_shipped.fetch_add(1, Relaxed);
            return;
        };
        let payload = batch.encode_to_vec();
        if let Err((e, _)) = p.send(BaseRecord::to(&self.topic).key(&self.producer_id).payload(&payload)) {
            log::warn!("target metrics batch not queued: {e}");
            self.c.delivery_failures.fetch_add(1, Relaxed);
        }
    }

    pub fn stats_handle(&self) -> impl Fn() -> ShipStats + Send + Sync + 'static {
        let c = self.c.clone();
        move || ShipStats {
            batches_produced: c.produced.load(Relaxed),
            batches_sent: c.batches_sent.load(Relaxed),
            delivery_failures: c.delivery_failures.load(Relaxed),
            not_shipped: c.not_shipped.load(Relaxed),
        }
    }

    pub fn flush(&self, timeout: Duration) {
        if let Some(p) = &self.producer {
            let _ = p.flush(timeout);
        }
    }
}
