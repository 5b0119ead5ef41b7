//! Bounded batching Kafka sink for [`IoRecord`]s.
//!
//! Records pushed with [`Sink::push`] go into a bounded queue (never blocks; a full queue
//! drops the record and counts it as `overflow_drops` of its job). A background thread
//! groups them into [`IoBatch`] messages of at most `batch_max_records` records (or
//! `batch_max_bytes` encoded bytes), waiting at most `batch_max_ms` after the first record of
//! a batch, and produces each batch to `topic` with key = `producer_id` through an
//! idempotent librdkafka producer (`acks=all`, zstd). Batches are numbered `seq` = 0, 1, 2, ...
//! per producer and carry the cumulative [`DropCounters`] of every job with a nonzero counter
//! (Beacon-style loss accounting: loss is never silent). Failed deliveries add the batch's
//! records per job to `delivery_failures`. Dropping the sink (or [`Sink::close`]) sends what
//! is queued and waits for delivery.
//!
//! **Heartbeats.** A producer with nothing to send still sends a batch every `heartbeat`
//! (default 2 s; zero turns it off): an `IoBatch` with no records (its drop counters
//! included), numbered like any other. The first one leaves as soon as the sink starts, or
//! when [`Sink::set_heartbeat`] turns them on (the agent does once its probes are attached,
//! so a heartbeat means "tracing"). The
//! pipeline stores an `io_batches` row per batch, so that table is every producer's liveness
//! timeline: a producer that died or hung (or cannot reach Kafka) stops appearing in it, and
//! a job that ran on a host while its agent was silent is marked incomplete
//! (`pharos_analytics.coverage`).
use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::{DropCounters, IoBatch, IoRecord, SCHEMA_VERSION};

/// Settings of a [`Sink`].
#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// Kafka bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Topic of IoBatch messages (`pharos.io.requests`).
    pub topic: String,
    /// Unique per producer process instance; also the message key.
    pub producer_id: String,
    /// Host name written into each batch.
    pub host: String,
    /// Records per batch, at most (default 4096).
    pub batch_max_records: usize,
    /// Encoded record bytes per batch, at most (default 900 000, below Kafka's 1 MB default).
    pub batch_max_bytes: usize,
    /// A batch is sent at most this many ms after its first record arrived (default 200).
    pub batch_max_ms: u64,
    /// An empty batch is sent when no batch left for this long (default 2 s; zero: never).
    pub heartbeat: Duration,
    /// Records waiting in the queue, at most (default 262 144).
    pub queue_max_records: usize,
    /// librdkafka `compression.type` (default "zstd").
    pub compression: String,
    /// librdkafka `queue.buffering.max.kbytes`: bound of the producer's own buffer (default 65536).
    pub kafka_buffer_kbytes: u64,
    /// How long closing the sink waits for outstanding deliveries (default 30 s).
    pub close_timeout: Duration,
    /// Extra librdkafka settings, applied last.
    pub extra: Vec<(String, String)>,
}

impl SinkConfig {
    /// A configuration with the documented defaults.
    pub fn new(brokers: &str, topic: &str, producer_id: &str, host: &str) -> Self {
        SinkConfig {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            producer_id: producer_id.to_string(),
            host: host.to_string(),
            ..Default::default()
        }
    }
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            brokers: "127.0.0.1:19092".into(),
            topic: "pharos.io.requests".into(),
            producer_id: String::new(),
            host: String::new(),
            batch_max_records: 4096,
            batch_max_bytes: 900_000,
            batch_max_ms: 200,
            heartbeat: Duration::from_secs(2),
            queue_max_records: 262_144,
            compression: "zstd".into(),
            kafka_buffer_kbytes: 65_536,
            close_timeout: Duration::from_secs(30),
            extra: Vec::new(),
        }
    }
}

/// Returned by [`Sink::push`] when the bounded queue is full; the record was dropped and
/// counted as an overflow drop of its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("sink queue full, record dropped")
    }
}
impl std::error::Error for Full {}

/// Error of [`Sink::new`] and [`Sink::flush`].
#[derive(Debug)]
pub enum SinkError {
    Kafka(KafkaError),
    /// Outstanding deliveries did not finish within the timeout.
    Timeout,
    /// The background thread is gone.
    Closed,
}

impl std::fmt::Display for SinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SinkError::Kafka(e) => write!(f, "kafka: {e}"),
            SinkError::Timeout => f.write_str("timed out waiting for Kafka deliveries"),
            SinkError::Closed => f.write_str("sink closed"),
        }
    }
}
impl std::error::Error for SinkError {}

impl From<KafkaError> for SinkError {
    fn from(e: KafkaError) -> Self {
        SinkError::Kafka(e)
    }
}

/// Counters of a sink since it started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SinkStats {
    /// Records in batches Kafka acknowledged.
    pub records_sent: u64,
    /// Batches Kafka acknowledged (heartbeats included).
    pub batches_sent: u64,
    /// Heartbeats (batches without records) handed to Kafka.
    pub heartbeats: u64,
    /// Records dropped because the queue was full.
    pub overflow_drops: u64,
    /// Records in batches Kafka did not accept.
    pub delivery_failures: u64,
    /// Cumulative loss counters per job id (including kernel-side counters reported with
    /// [`Sink::report_kernel_counters`]).
    pub per_job: BTreeMap<String, DropCounters>,
}

#[derive(Default)]
struct Shared {
    stats: SinkStats,
}

type SharedRef = Arc<Mutex<Shared>>;

fn job_entry<'a>(s: &'a mut SinkStats, job: &str) -> &'a mut DropCounters {
    s.per_job.entry(job.to_string()).or_insert_with(|| DropCounters { job_id: job.to_string(), ..Default::default() })
}

/// Per-job record counts of one batch, handed to the delivery callback.
struct BatchInfo {
    records: u64,
    per_job: BTreeMap<String, u64>,
}

struct Ctx {
    shared: SharedRef,
}

impl ClientContext for Ctx {}

impl ProducerContext for Ctx {
    type DeliveryOpaque = Box<BatchInfo>;

    fn delivery(&self, result: &DeliveryResult<'_>, info: Self::DeliveryOpaque) {
        let mut sh = self.shared.lock().unwrap();
        match result {
            Ok(_) => {
                sh.stats.records_sent += info.records;
                sh.stats.batches_sent += 1;
            }
            Err((e, _)) => {
                log::warn!("kafka delivery of a batch of {} records failed: {e}", info.records);
                sh.stats.delivery_failures += info.records;
                for (job, n) in &info.per_job {
                    job_entry(&mut sh.stats, job).delivery_failures += n;
                }
            }
        }
    }
}

enum Msg {
    Record(Box<IoRecord>),
    Flush(Duration, mpsc::Sender<Result<(), SinkError>>),
    Heartbeat(Duration),
    Close,
}

/// The bounded batching Kafka sink. See the module documentation.
pub struct Sink {
    tx: SyncSender<Msg>,
    shared: SharedRef,
    thread: Option<JoinHandle<()>>,
}

/// The producer settings every Pharos Rust producer shares (this sink, the forwarding daemon's
/// target metrics): idempotent, `acks=all`, `compression` (e.g. zstd), 5 ms linger, `client_id`.
///
/// A producer started before its topic exists (agents and daemons may start before the brokers,
/// and before `pharos serve` has created the topics) keeps its messages until the topic appears,
/// as long as librdkafka keeps any message (`message.timeout.ms`, 5 min), instead of failing them
/// after librdkafka's default 30 s (`topic.metadata.propagation.max.ms`; measured on the cluster
/// rig: 126 batches lost at a start-up).
pub fn producer_config(brokers: &str, compression: &str, client_id: &str) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", brokers)
        .set("compression.type", compression)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("topic.metadata.propagation.max.ms", "300000")
        .set("client.id", client_id);
    cc
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

impl Sink {
    /// Creates the producer and starts the background batching thread.
    /// Fails when librdkafka rejects the configuration (not when brokers are unreachable:
    /// librdkafka keeps retrying; undelivered batches end as delivery failures).
    pub fn new(cfg: SinkConfig) -> Result<Sink, SinkError> {
        let shared: SharedRef = Arc::default();
        let mut cc = producer_config(&cfg.brokers, &cfg.compression, &cfg.producer_id);
        cc.set("queue.buffering.max.kbytes", cfg.kafka_buffer_kbytes.to_string());
        for (k, v) in &cfg.extra {
            cc.set(k, v);
        }
        let producer: ThreadedProducer<Ctx> = cc.create_with_context(Ctx { shared: shared.clone() })?;
        let (tx, rx) = mpsc::sync_channel(cfg.queue_max_records.max(1));
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pharos-sink".into())
            .spawn(move || Worker { cfg, producer, shared: sh, seq: 0, deadline: None, last_sent: None }.run(rx))
            .expect("spawn sink thread");
        Ok(Sink { tx, shared, thread: Some(thread) })
    }

    /// Queues one record without blocking. When the queue is full the record is dropped,
    /// counted as an overflow drop of its job, and `Err(Full)` is returned.
    pub fn push(&self, record: IoRecord) -> Result<(), Full> {
        match self.tx.try_send(Msg::Record(Box::new(record))) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(Msg::Record(r))) | Err(TrySendError::Disconnected(Msg::Record(r))) => {
                let mut sh = self.shared.lock().unwrap();
                sh.stats.overflow_drops += 1;
                job_entry(&mut sh.stats, &r.job_id).overflow_drops += 1;
                Err(Full)
            }
            Err(_) => Err(Full),
        }
    }

    /// Sets the kernel-side cumulative counters of a job (ring-buffer drops and unmerged
    /// fallbacks, counted by the eBPF tracer); they travel in the `drops` of later batches.
    /// Values only rise: a smaller value than already known is ignored.
    pub fn report_kernel_counters(&self, job_id: &str, ringbuf_drops: u64, unmerged_fallbacks: u64) {
        let mut sh = self.shared.lock().unwrap();
        let e = job_entry(&mut sh.stats, job_id);
        e.ringbuf_drops = e.ringbuf_drops.max(ringbuf_drops);
        e.unmerged_fallbacks = e.unmerged_fallbacks.max(unmerged_fallbacks);
    }

    /// Sends every record queued so far and waits until Kafka acknowledged (or refused)
    /// all of them, at most `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        let (ack_tx, ack_rx) = mpsc::channel();
        self.tx.send(Msg::Flush(timeout, ack_tx)).map_err(|_| SinkError::Closed)?;
        ack_rx.recv().map_err(|_| SinkError::Closed)?
    }

    /// Sets the heartbeat interval (zero: no heartbeats); a nonzero one sends a heartbeat at
    /// once when nothing is waiting to be sent.
    pub fn set_heartbeat(&self, interval: Duration) -> Result<(), SinkError> {
        self.tx.send(Msg::Heartbeat(interval)).map_err(|_| SinkError::Closed)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SinkStats {
        self.shared.lock().unwrap().stats.clone()
    }

    /// Sends what is queued, waits for delivery (at most `close_timeout`) and stops the
    /// background thread. Also done on drop.
    pub fn close(mut self) -> SinkStats {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.tx.send(Msg::Close);
            let _ = t.join();
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Worker {
    cfg: SinkConfig,
    producer: ThreadedProducer<Ctx>,
    shared: SharedRef,
    seq: u64,
    /// Set while closing: past it, a batch librdkafka cannot queue is a delivery failure.
    deadline: Option<Instant>,
    /// When the last batch (records or heartbeat) was handed to librdkafka; None: none yet.
    last_sent: Option<Instant>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Msg>) {
        let max_wait = Duration::from_millis(self.cfg.batch_max_ms);
        let mut batch: Vec<IoRecord> = Vec::with_capacity(self.cfg.batch_max_records.min(65536));
        let mut bytes = 0usize;
        let mut first: Option<Instant> = None;
        loop {
            let beat = self.cfg.heartbeat;
            let msg = match first {
                None if beat.is_zero() => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                // idle: wait for a record until the next heartbeat is due
                None => match self.last_sent.map(|t| beat.saturating_sub(t.elapsed())) {
                    Some(left) if !left.is_zero() => rx.recv_timeout(left),
                    _ => Err(RecvTimeoutError::Timeout),
                },
                Some(t) => match max_wait.checked_sub(t.elapsed()) {
                    Some(left) if !left.is_zero() => rx.recv_timeout(left),
                    _ => Err(RecvTimeoutError::Timeout),
                },
            };
            match msg {
                Ok(Msg::Record(r)) => {
                    let len = r.encoded_len() + 4;
                    if !batch.is_empty() && bytes + len > self.cfg.batch_max_bytes {
                        self.send(&mut batch);
                        bytes = 0;
                        first = None;
                    }
                    if first.is_none() {
                        first = Some(Instant::now());
                    }
                    bytes += len;
                    batch.push(*r);
                    if batch.len() >= self.cfg.batch_max_records {
                        self.send(&mut batch);
                        bytes = 0;
                        first = None;
                    }
                }
                Ok(Msg::Flush(timeout, ack)) => {
                    self.send(&mut batch);
                    bytes = 0;
                    first = None;
                    let _ = ack.send(self.producer.flush(timeout).map_err(|e| match e {
                        KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut) => SinkError::Timeout,
                        e => SinkError::Kafka(e),
                    }));
                }
                Ok(Msg::Heartbeat(interval)) => {
                    self.cfg.heartbeat = interval;
                    if !interval.is_zero() && batch.is_empty() {
                        self.heartbeat();
                    }
                }
                Err(RecvTimeoutError::Timeout) if batch.is_empty() => self.heartbeat(),
                Err(RecvTimeoutError::Timeout) => {
                    self.send(&mut batch);
                    bytes = 0;
                    first = None;
                }
                Ok(Msg::Close) | Err(RecvTimeoutError::Disconnected) => {
                    self.deadline = Some(Instant::now() + self.cfg.close_timeout);
                    // Whatever is still queued behind Close (pushes racing the shutdown).
                    while let Ok(m) = rx.try_recv() {
                        if let Msg::Record(r) = m {
                            batch.push(*r);
                            if batch.len() >= self.cfg.batch_max_records {
                                self.send(&mut batch);
                            }
                        }
                    }
                    self.send(&mut batch);
                    if let Err(e) = self.producer.flush(self.cfg.close_timeout) {
                        log::warn!("kafka flush at close: {e}");
                    }
                    return;
                }
            }
        }
    }

    /// Sends a batch without records: the producer is alive (see the module documentation).
    fn heartbeat(&mut self) {
        self.shared.lock().unwrap().stats.heartbeats += 1;
        self.produce(Vec::new());
    }

    /// Builds one IoBatch from `records` (emptied) and hands it to librdkafka.
    fn send(&mut self, records: &mut Vec<IoRecord>) {
        if records.is_empty() {
            return;
        }
        self.produce(std::mem::take(records));
    }

    fn produce(&mut self, records: Vec<IoRecord>) {
        self.last_sent = Some(Instant::now());
        let mut per_job: BTreeMap<String, u64> = BTreeMap::new();
        for r in records.iter() {
            *per_job.entry(r.job_id.clone()).or_default() += 1;
        }
        let drops: Vec<DropCounters> = {
            let sh = self.shared.lock().unwrap();
            sh.stats
                .per_job
                .values()
                .filter(|d| d.ringbuf_drops + d.delivery_failures + d.overflow_drops + d.unmerged_fallbacks > 0)
                .cloned()
                .collect()
        };
        let n = records.len() as u64;
        let batch = IoBatch {
            schema_version: SCHEMA_VERSION,
            producer_id: self.cfg.producer_id.clone(),
            seq: self.seq,
            created_ns: now_ns(),
            host: self.cfg.host.clone(),
            records,
            drops,
        };
        self.seq += 1;
        let payload = batch.encode_to_vec();
        let mut info = Box::new(BatchInfo { records: n, per_job });
        loop {
            let rec = BaseRecord::with_opaque_to(&self.cfg.topic, info).key(&self.cfg.producer_id).payload(&payload);
            match self.producer.send(rec) {
                Ok(()) => return,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec))
                    if self.deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    // librdkafka's bounded buffer is full: wait for deliveries to free it.
                    info = rec.delivery_opaque;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err((e, rec)) => {
                    log::warn!("kafka produce of a batch of {n} records failed: {e}");
                    let info = rec.delivery_opaque;
                    let mut sh = self.shared.lock().unwrap();
                    sh.stats.delivery_failures += info.records;
                    for (job, k) in &info.per_job {
                        job_entry(&mut sh.stats, job).delivery_failures += k;
                    }
                    return;
                }
            }
        }
    }
}
