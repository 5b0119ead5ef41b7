//! The forwarding daemon's request path (LWFS optimisation paper: multi-threaded master,
//! wait-free queue workers).
//!
//! * **Master**: one acceptor thread and one decoder thread per connection. A decoder reads
//!   frames, decodes [`Request`]s, classifies them (metadata, small data ≤ `small_max`
//!   bytes, large data) and pushes them into that class's bounded crossbeam channel. A full
//!   channel blocks the decoder, which stops reading its socket: backpressure reaches the
//!   client through TCP, memory stays bounded (queue capacity × frame size).
//! * **Workers** ("slaves"): `workers` threads pop requests with smooth weighted
//!   round-robin over the classes (default weights metadata 4, small 2, large 1): metadata
//!   first most of the time, yet every class is served at least once per cycle of
//!   `sum(weights)` picks, so data never starves. A worker executes the request against
//!   the [`Backend`], writes the reply on the connection, and emits one `IoRecord`.
//! * **Threading switches** (issue 12, items 2 and 5): `--masters N` replaces the decoder
//!   threads with N epoll masters ([`crate::masters`]); `--queue mutex` the lock-free class
//!   queues with one mutex-protected set (the baseline, [`crate::queues`]); `--scheduler raas`
//!   the fixed weights with request-aware thread allocation ([`crate::raas`]).
//! * **Serving inline** (`--serve-inline`, on by default; decoder threads only): a request
//!   that finds nothing queued and a worker able to take its class asleep is served by its
//!   decoder in that worker's place ([`ClassQueues::lend`]): as many requests are in service
//!   as if the worker had been woken, without the wake-up and thread switch (the queue delay
//!   of a 4 KiB request at queue depth 1 was ~25 us of its ~115 us round trip). Under load,
//!   when requests queue, they go through the queues and the scheduler as before.
//! * **Authentication** (issue 14, item 3; [`pharos_fwd_proto::auth`]): a decoder first runs
//!   the handshake (challenge, the client's proof of the site key, the daemon's proof); a
//!   connection that fails it gets an error reply and is closed. Data operations carry a
//!   capability the daemon issued at open/create: the decoder verifies its MAC (one HMAC per
//!   request, on the connection's own thread) and its rights before the request is queued.
//! * **Data path**: a write's data segment is read from the socket straight into a pooled
//!   buffer (no zeroing) that moves (no copy) through the queue to the worker. A large read
//!   of a single-target file goes page cache → socket with `sendfile(2)` after the reply
//!   header; other reads fill a pooled buffer sent with one vectored write after the
//!   header. Buffers go back to the pool, so steady-state large I/O allocates nothing.
//! * **Shared-memory data path** (issue 12, item 1; [`pharos_fwd_proto::region`]): a client on
//!   the same host attaches its sealed memfd region to the connection (`ShmAttach`, handled
//!   by the decoder, `--shm-data`); its `WriteShm`/`ReadShm` requests carry a slot of that
//!   region instead of a data segment: the worker writes the objects straight from the slot,
//!   or reads them straight into it, and no data crosses the socket.
//!
//! Files: this one holds the server's configuration, counters and start; `server/conn.rs`
//! the connection handling (accept, handshake, shared-memory attach, decoding and the
//! capability check, replies); `server/exec.rs` the workers and the execution of an
//! operation on the backend (with its record); `server/tests.rs` the tests.
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pharos_fwd_proto::auth::SiteKey;
use pharos_fwd_proto::{BufPool, Op, Request};
use serde::Serialize;

use crate::backend::Backend;
use crate::metrics::TargetStats;
use crate::queues::ClassQueues;
pub use crate::raas::wrr_cycle;
use crate::raas::{Scheduler, ThreadsConfig};
use crate::records::RecordSink;

mod conn;
mod exec;
mod holders;
#[cfg(test)]
pub(crate) mod tests;
mod watch;

use conn::Conn;

/// Request classes, in priority order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Meta = 0,
    Small = 1,
    Large = 2,
}

pub struct Config {
    pub node_name: String,
    pub workers: usize,
    /// Weights of metadata, small data, large data.
    pub weights: [u32; 3],
    /// Capacity of each class's queue, requests.
    pub queue_depth: [usize; 3],
    /// Data requests up to this many bytes are "small".
    pub small_max: u64,
    pub max_conns: u32,
    /// The site key: handshake and capabilities.
    pub key: SiteKey,
    /// Masters, queue kind and scheduler (issue 12, items 2 and 5; [`crate::raas`]).
    pub threads: ThreadsConfig,
    /// Accept clients' shared-memory data regions (`ShmAttach`; `--shm-data`).
    pub shm_data: bool,
}

/// Time a new connection has to complete the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest frame accepted before the handshake completed, bytes (an `Auth` request is ~150).
pub const AUTH_FRAME_MAX: usize = 4096;

/// Counters of the daemon (admin `/status`).
#[derive(Default)]
pub struct Counters {
    pub served: [AtomicU64; 3],
    pub errors: AtomicU64,
    pub bad_frames: AtomicU64,
    pub rejected_conns: AtomicU64,
    pub conns: AtomicU32,
    pub conns_total: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Replies that could not be sent (the connection is then closed: the client replays).
    pub reply_failures: AtomicU64,
    /// Connections attached to a client's shared-memory data region.
    pub shm_attaches: AtomicU64,
    /// `ShmAttach` requests refused (off, another host, bad region).
    pub shm_refusals: AtomicU64,
    /// Data requests served through a shared-memory region.
    pub shm_requests: AtomicU64,
    /// Replies too large for a frame, answered with an `EMSGSIZE` error instead.
    pub oversized_replies: AtomicU64,
    /// Requests whose execution panicked (answered `EIO`; the worker goes on).
    pub worker_panics: AtomicU64,
    /// Requests served by their connection's decoder in a sleeping worker's place
    /// (`--serve-inline`), not handed to a worker.
    pub served_inline: AtomicU64,
    /// Connections refused by the handshake (no or a wrong proof of the site key).
    pub auth_failures: AtomicU64,
    /// Requests refused for their capability (MAC does not verify, or a right missing).
    pub cap_refusals: AtomicU64,
}

#[derive(Serialize)]
pub struct CountersView {
    pub served_metadata: u64,
    pub served_small: u64,
    pub served_large: u64,
    pub errors: u64,
    pub bad_frames: u64,
    pub rejected_conns: u64,
    pub open_conns: u32,
    pub conns_total: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub reply_failures: u64,
    pub oversized_replies: u64,
    pub worker_panics: u64,
    pub served_inline: u64,
    pub auth_failures: u64,
    pub cap_refusals: u64,
    pub queued: [usize; 3],
    /// Data buffers allocated because the pool was empty.
    pub buffer_pool_misses: u64,
    pub shm_attaches: u64,
    pub shm_refusals: u64,
    pub shm_requests: u64,
    /// Invalidations (issue 29): mounts watching now, changes pushed to them, pushes sent,
    /// changes dropped (queue full: those mounts see them within their TTL), watch
    /// connections dropped (a failed push).
    pub watching_mounts: usize,
    pub invalidations_pushed: u64,
    pub invalidation_pushes: u64,
    pub invalidations_dropped: u64,
    pub watchers_lost: u64,
    /// Attribute changes and recalls not acknowledged by every watching mount within 100 ms.
    pub invalidation_acks_late: u64,
    /// Directories recalled from the mount holding them (another mount added a name there).
    pub directory_recalls: u64,
}

/// The worker index [`Server::serve`] logs for a request its decoder served inline.
const INLINE: usize = usize::MAX;

pub(crate) struct Work {
    req: Request,
    conn: Arc<Conn>,
    /// The kernel's receipt of the request (ns since the epoch; [`crate::rx`]), its record's
    /// `start_ns`: the queue wait counts from here, the time in the receive buffer included.
    arrival_ns: u64,
    /// The same moment on the monotonic clock.
    arrival: Instant,
    /// When the decoder read it: the scheduler's queuing delay (RaaS) counts from here, the
    /// daemon's own queues only.
    decoded: Instant,
    /// Target whose queue depth counts this request.
    target: Option<u32>,
    /// A `WriteShm`/`ReadShm` (decoded into `Write`/`Read`): the slot's offset in the
    /// connection's region and the write's length or the read's size.
    shm: Option<(u64, u32)>,
}

pub struct Server {
    pub cfg: Config,
    pub backend: Arc<Backend>,
    pub counters: Counters,
    pub stats: Arc<TargetStats>,
    pub sink: Arc<RecordSink>,
    /// The per-class queues (lock-free or the mutex baseline: [`crate::queues`]).
    queues: ClassQueues<Work>,
    /// Which class each worker serves next, per-class queuing delays ([`crate::raas`]).
    pub sched: Scheduler,
    pub stop: AtomicBool,
    pub bufs: BufPool,
    /// Mounts watching for invalidations, and the changes to push to them ([`watch`]).
    pub(crate) watch: watch::Watchers,
}

/// Bytes a write carries: its data segment, or its shared-memory slot's length.
fn write_len(data: &[u8], shm: Option<(u64, u32)>) -> u64 {
    shm.map(|(_, n)| n as u64).unwrap_or(data.len() as u64)
}

fn classify(op: &Op, shm: Option<(u64, u32)>, small_max: u64) -> Class {
    match op {
        Op::Read { size, .. } if *size as u64 <= small_max => Class::Small,
        Op::Write { data, .. } if write_len(data, shm) <= small_max => Class::Small,
        Op::Read { .. } | Op::Write { .. } => Class::Large,
        _ => Class::Meta,
    }
}

impl Server {
    pub fn new(cfg: Config, backend: Arc<Backend>, sink: Arc<RecordSink>) -> Arc<Server> {
        let queues = ClassQueues::new(cfg.threads.queue, cfg.queue_depth);
        let sched = Scheduler::new(cfg.threads.clone(), cfg.workers, cfg.weights);
        let stats = Arc::new(TargetStats::new(backend.targets.len()));
        Arc::new(Server {
            cfg,
            backend,
            counters: Counters::default(),
            stats,
            sink,
            queues,
            sched,
            stop: AtomicBool::new(false),
            bufs: BufPool::new(64),
            watch: watch::Watchers::default(),
        })
    }

    pub fn counters_view(&self) -> CountersView {
        let c = &self.counters;
        CountersView {
            served_metadata: c.served[0].load(Relaxed),
            served_small: c.served[1].load(Relaxed),
            served_large: c.served[2].load(Relaxed),
            errors: c.errors.load(Relaxed),
            bad_frames: c.bad_frames.load(Relaxed),
            rejected_conns: c.rejected_conns.load(Relaxed),
            open_conns: c.conns.load(Relaxed),
            conns_total: c.conns_total.load(Relaxed),
            bytes_read: c.bytes_read.load(Relaxed),
            bytes_written: c.bytes_written.load(Relaxed),
            reply_failures: c.reply_failures.load(Relaxed),
            oversized_replies: c.oversized_replies.load(Relaxed),
            worker_panics: c.worker_panics.load(Relaxed),
            served_inline: c.served_inline.load(Relaxed),
            auth_failures: c.auth_failures.load(Relaxed),
            cap_refusals: c.cap_refusals.load(Relaxed),
            queued: [self.queues.len(0), self.queues.len(1), self.queues.len(2)],
            buffer_pool_misses: self.bufs.misses.load(Relaxed),
            shm_attaches: c.shm_attaches.load(Relaxed),
            shm_refusals: c.shm_refusals.load(Relaxed),
            shm_requests: c.shm_requests.load(Relaxed),
            watching_mounts: self.watch.mounts(),
            invalidations_pushed: self.watch.pushed.load(Relaxed),
            invalidation_pushes: self.watch.pushes.load(Relaxed),
            invalidations_dropped: self.watch.dropped.load(Relaxed),
            watchers_lost: self.watch.lost_watchers.load(Relaxed),
            invalidation_acks_late: self.watch.late_acks.load(Relaxed),
            directory_recalls: self.watch.recalls.load(Relaxed),
        }
    }

    /// Starts the workers and the acceptor on `listener`.
    pub fn start(self: &Arc<Self>, listener: TcpListener) {
        for i in 0..self.cfg.workers.max(1) {
            let s = self.clone();
            // A panic outside a request's execution (those are caught per request) ends the
            // worker's loop: it is logged, counted and the loop starts again in its place.
            std::thread::Builder::new()
                .name(format!("fwd-worker-{i}"))
                .spawn(move || loop {
                    let w = s.clone();
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.worker(i))) {
                        Ok(()) => break,
                        Err(_) => {
                            s.counters.worker_panics.fetch_add(1, Relaxed);
                            log::error!("worker {i} panicked: replaced");
                        }
                    }
                })
                .expect("spawn worker");
        }
        let s = self.clone();
        std::thread::Builder::new()
            .name("fwd-notify".into())
            .spawn(move || s.watch.run(&s.backend, &s.stop))
            .expect("spawn notifier");
        let s = self.clone();
        std::thread::Builder::new()
            .name("fwd-sched".into())
            .spawn(move || s.sched.run_controller(&s.queues, &s.stop))
            .expect("spawn scheduler controller");
        if self.cfg.threads.masters > 0 {
            crate::masters::start(self, self.cfg.threads.masters, listener);
            return;
        }
        let s = self.clone();
        std::thread::Builder::new()
            .name("fwd-accept".into())
            .spawn(move || s.accept(listener))
            .expect("spawn acceptor");
    }
}
