//! Per-target interval metrics (`TargetMetrics` of the wire contract) and their shipping
//! as `TargetMetricsBatch` messages to Kafka topic `pharos.target.metrics`
//! (key = producer_id, seq rising from 0). One message per interval holds every target.
//!
//! Latency percentiles come from at most `SAMPLES_MAX` service-time samples per target and
//! interval (later samples overwrite earlier ones round-robin, `latency_max_ns` stays exact).
//! Batches Kafka does not accept are counted (`delivery_failures`), as are batches not
//! shipped because Kafka is disabled.
//!
//! For Prometheus (`GET /metrics` of the admin interface, [`crate::admin`]) the same two hooks
//! also keep cumulative values since the start: each target's queue wait ([`QueueWait`]) and the
//! service time of every request with a target, by op kind ([`TargetStats::service`]).
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use pharos_fwd_proto::Op;
use pharos_wire::v1::{TargetMetrics, TargetMetricsBatch};
use prost::Message;
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

/// Labels of [`TargetStats::service`]: `op` is read, write or metadata.
pub type OpLabel = [(&'static str, &'static str); 1];
/// A histogram family with Pharos's service-time buckets.
pub type ServiceHistograms = Family<OpLabel, Histogram, fn() -> Histogram>;

fn service_histogram() -> Histogram {
    // 50 µs .. 6.6 s, doubling
    Histogram::new(exponential_buckets(50e-6, 2.0, 18))
}

/// A target queue's waits since the start, by Little's law: the integral of the queue's depth
/// over time is the sum of the time its requests waited in it (each is counted in the depth from
/// its enqueue to its dequeue, the interval of its record's `queue_wait_ns`).
#[derive(Default)]
struct QueueArea {
    since: Option<Instant>,
    wait_s: f64,
    dequeued: u64,
}

impl QueueArea {
    fn advance(&mut self, depth: i64) {
        let now = Instant::now();
        if let Some(s) = self.since {
            self.wait_s += depth.max(0) as f64 * now.duration_since(s).as_secs_f64();
        }
        self.since = Some(now);
    }
}

/// One target's cumulative queue wait: `wait_s` summed over its requests (those still queued
/// included, up to now) and the requests that left the queue.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueWait {
    pub wait_s: f64,
    pub dequeued: u64,
    pub depth: i64,
}

pub struct TargetStats {
    cur: Vec<Mutex<Interval>>,
    depth: Vec<AtomicI64>,
    waits: Vec<Mutex<QueueArea>>,
    /// Service time of every request with a target since the start, seconds, by op kind.
    pub service: ServiceHistograms,
}

impl TargetStats {
    pub fn new(n: usize) -> TargetStats {
        let service = ServiceHistograms::new_with_constructor(service_histogram);
        for op in ["read", "write", "metadata"] {
            let _ = service.get_or_create(&[("op", op)]); // exported (empty) from the start
        }
        TargetStats {
            cur: (0..n).map(|_| Mutex::default()).collect(),
            depth: (0..n).map(|_| AtomicI64::new(0)).collect(),
            waits: (0..n).map(|_| Mutex::default()).collect(),
            service,
        }
    }

    pub fn queued(&self, t: u32, d: i64) {
        if let Some(q) = self.depth.get(t as usize) {
            let mut w = self.waits[t as usize].lock().unwrap();
            w.advance(q.load(Relaxed));
            q.fetch_add(d, Relaxed);
            w.dequeued += d.min(0).unsigned_abs();
        }
    }

    /// Every target's [`QueueWait`] up to now, in target order.
    pub fn queue_waits(&self) -> Vec<QueueWait> {
        self.waits
            .iter()
            .zip(&self.depth)
            .map(|(w, q)| {
                let mut w = w.lock().unwrap();
                let depth = q.load(Relaxed);
                w.advance(depth);
                QueueWait { wait_s: w.wait_s, dequeued: w.dequeued, depth }
            })
            .collect()
    }

    pub fn record(&self, t: u32, op: &Op, result: i64, service: Duration, throttled: bool) {
        let Some(m) = self.cur.get(t as usize) else { return };
        let mut m = m.lock().unwrap();
        let ns = service.as_nanos() as u64;
        let kind = match op {
            Op::Read { .. } => {
                m.read_ops += 1;
                m.bytes_read += result.max(0) as u64;
                "read"
            }
            Op::Write { .. } => {
                m.write_ops += 1;
                m.bytes_written += result.max(0) as u64;
                "write"
            }
            _ => {
                m.metadata_ops += 1;
                "metadata"
            }
        };
        self.service.get_or_create(&[("op", kind)]).observe(service.as_secs_f64());
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
                pharos_wire::sink::producer_config(b, "zstd", producer_id)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_wait_is_the_depth_integrated_over_time() {
        let s = TargetStats::new(2);
        s.queued(1, 1);
        s.queued(1, 1);
        std::thread::sleep(Duration::from_millis(40));
        s.queued(1, -1); // waited ~40 ms
        std::thread::sleep(Duration::from_millis(40));
        s.queued(1, -1); // waited ~80 ms
        let w = s.queue_waits();
        assert_eq!(w[0], QueueWait::default());
        assert_eq!((w[1].dequeued, w[1].depth), (2, 0));
        assert!((0.12..0.2).contains(&w[1].wait_s), "{w:?}");
        // a request still queued counts up to now
        s.queued(0, 1);
        std::thread::sleep(Duration::from_millis(30));
        let w = s.queue_waits();
        assert!(w[0].wait_s >= 0.03 && w[0].dequeued == 0 && w[0].depth == 1, "{w:?}");
    }

    #[test]
    fn service_time_is_observed_by_op_kind() {
        let s = TargetStats::new(1);
        s.record(0, &Op::Statfs, 0, Duration::from_micros(300), false);
        s.record(0, &Op::Ping, 0, Duration::from_secs(30), false);
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("pharos_fwd_service_seconds", "t", s.service.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(text.contains("pharos_fwd_service_seconds_count{op=\"metadata\"} 2\n"), "{text}");
        assert!(text.contains("pharos_fwd_service_seconds_count{op=\"read\"} 0\n"), "{text}");
        // 300 µs falls in the fourth bucket (400 µs); 30 s only in +Inf
        let buckets: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("pharos_fwd_service_seconds_bucket") && l.contains("op=\"metadata\""))
            .collect();
        assert!(buckets[2].ends_with(" 0") && buckets[3].ends_with(" 1"), "{text}");
        assert!(buckets[buckets.len() - 2].ends_with(" 1") && buckets.last().unwrap().ends_with(" 2"), "{text}");
    }
}
