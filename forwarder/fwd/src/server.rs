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
use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pharos_fwd_proto::auth::{self, SiteKey};
use pharos_fwd_proto::region::Region;
use pharos_fwd_proto::{self as proto, errno, Body, Cap, FrameError, Op, Reply, Request, WireError};
use pharos_wire::{FileType, IoRecord, Layer};
use serde::Serialize;

use crate::backend::{Backend, FileSpan, IoInfo};
use crate::clock::wall_ns;
use crate::metrics::TargetStats;
use crate::queues::ClassQueues;
pub use crate::raas::wrr_cycle;
use crate::raas::{Scheduler, ThreadsConfig};
use crate::records::RecordSink;

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
}

pub(crate) struct Conn {
    w: Mutex<TcpStream>,
    /// The client's shared-memory data region, once attached.
    shm: std::sync::OnceLock<Region>,
}

/// A connection's decoding state: the reply half, the buffered reader, the frame buffer.
pub(crate) struct ConnIn {
    pub(crate) conn: Arc<Conn>,
    pub(crate) r: BufReader<TcpStream>,
    frame: proto::Frame,
}

impl Conn {
    /// Sends `r` (one vectored write: prefix, header, data from the reply's own buffer). A
    /// reply too large for a frame goes out as an `EMSGSIZE` error reply instead; a failed
    /// send is logged and counted, and the connection is shut down, so the client sees the
    /// failure at once (and replays) instead of waiting for its timeout.
    fn reply(&self, r: &Reply, c: &Counters) {
        let w = self.w.lock().unwrap();
        let res = match proto::write_msg(&mut &*w, r) {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                c.oversized_replies.fetch_add(1, Relaxed);
                log::error!("reply {} does not fit a frame ({e}): sent as EMSGSIZE", r.id);
                proto::write_msg(&mut &*w, &Reply::err(r.id, errno::EMSGSIZE, format!("reply too large: {e}")))
            }
            res => res,
        };
        if let Err(e) = res {
            c.reply_failures.fetch_add(1, Relaxed);
            log::warn!("reply {} not sent: {e}; closing the connection", r.id);
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Sends a read reply whose data segment comes straight from `span`'s file
    /// (`sendfile(2)`: page cache to socket without a copy through user space). Should the
    /// file have shrunk meanwhile, the rest of the announced segment is zeros (the frame
    /// length is already on the wire).
    fn reply_file(&self, id: u64, span: &FileSpan) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let head = proto::encode_head(&Reply { id, body: Ok(Body::Data { data: Vec::new() }) }, span.len)?;
        let w = self.w.lock().unwrap();
        let sock = w.as_raw_fd();
        let mut sent = 0;
        while sent < head.len() {
            let n = unsafe {
                libc::send(
                    sock,
                    head[sent..].as_ptr() as *const libc::c_void,
                    head.len() - sent,
                    libc::MSG_MORE | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            sent += n as usize;
        }
        let mut off = span.off as libc::off_t;
        let mut left = span.len;
        while left > 0 {
            let n = unsafe { libc::sendfile(sock, span.file.as_raw_fd(), &mut off, left) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                // The object shrank: keep the framing with zeros.
                let zeros = vec![0u8; left.min(1 << 20)];
                while left > 0 {
                    let k = left.min(zeros.len());
                    (&*w).write_all(&zeros[..k])?;
                    left -= k;
                }
                break;
            }
            left -= n as usize;
        }
        Ok(())
    }
}

/// Reusable data buffers (write data from the decoders, read data of the workers).
pub struct BufPool {
    bufs: Mutex<Vec<Vec<u8>>>,
    max: usize,
    /// Times `get` found the pool empty (a new buffer gets allocated).
    pub misses: AtomicU64,
}

impl BufPool {
    pub fn new(max: usize) -> BufPool {
        BufPool { bufs: Mutex::new(Vec::new()), max, misses: AtomicU64::new(0) }
    }
    pub fn get(&self) -> Vec<u8> {
        self.bufs.lock().unwrap().pop().unwrap_or_else(|| {
            self.misses.fetch_add(1, Relaxed);
            Vec::new()
        })
    }
    /// A pooled buffer, or an empty (unallocated) one without counting a miss.
    pub fn take(&self) -> Vec<u8> {
        self.bufs.lock().unwrap().pop().unwrap_or_default()
    }
    pub fn put(&self, b: Vec<u8>) {
        if b.capacity() < 4096 || b.capacity() > proto::MAX_FRAME {
            return;
        }
        let mut m = self.bufs.lock().unwrap();
        if m.len() < self.max {
            m.push(b);
        }
    }
}

/// The worker index [`Server::serve`] logs for a request its decoder served inline.
const INLINE: usize = usize::MAX;

pub(crate) struct Work {
    req: Request,
    conn: Arc<Conn>,
    arrival_ns: u64,
    arrival: Instant,
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
}

/// Fault injection for tests: a lookup of this namespace path panics in the worker
/// (`PHAROS_FWD_FAULT_PANIC_PATH`, read once; unset in production).
fn fault_panic_path() -> Option<&'static str> {
    static P: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    P.get_or_init(|| std::env::var("PHAROS_FWD_FAULT_PANIC_PATH").ok().filter(|p| !p.is_empty())).as_deref()
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
            .name("fwd-sched".into())
            .spawn(move || s.sched.run_controller(&s.queues, &s.stop))
            .expect("spawn scheduler controller");
        if self.cfg.threads.masters > 0 {
            crate::masters::start(self, listener);
            return;
        }
        let s = self.clone();
        std::thread::Builder::new()
            .name("fwd-accept".into())
            .spawn(move || s.accept(listener))
            .expect("spawn acceptor");
    }

    fn accept(self: Arc<Self>, listener: TcpListener) {
        for stream in listener.incoming() {
            if self.stop.load(Relaxed) {
                return;
            }
            let stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    log::warn!("accept: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let Some(stream) = self.admit(stream) else { continue };
            let s = self.clone();
            let r = std::thread::Builder::new().name("fwd-conn".into()).spawn(move || {
                s.serve_conn(stream);
                s.counters.conns.fetch_sub(1, Relaxed);
            });
            if let Err(e) = r {
                log::warn!("spawn connection thread: {e}");
                self.counters.conns.fetch_sub(1, Relaxed);
            }
        }
    }

    /// A new connection: tuned and counted, or refused with `EBUSY` over `max_conns`.
    pub(crate) fn admit(&self, stream: TcpStream) -> Option<TcpStream> {
        pharos_fwd_proto::tune_data_socket(&stream);
        if self.counters.conns.load(Relaxed) >= self.cfg.max_conns {
            self.counters.rejected_conns.fetch_add(1, Relaxed);
            let mut s = stream;
            if let Err(e) = s.write_all(&proto::encode(&Reply::err(0, errno::EBUSY, "too many connections"))) {
                self.counters.reply_failures.fetch_add(1, Relaxed);
                log::warn!("EBUSY reply not sent: {e}");
            }
            return None;
        }
        self.counters.conns.fetch_add(1, Relaxed);
        self.counters.conns_total.fetch_add(1, Relaxed);
        Some(stream)
    }

    /// The decoder half of the master for one connection (its own thread: `--masters 0`).
    fn serve_conn(&self, stream: TcpStream) {
        if let Some(mut c) = self.open_conn(stream) {
            let inline = self.cfg.threads.serve_inline;
            while self.decode_then(&mut c, inline) {}
        }
    }

    /// Runs the handshake on a new connection; its decoding state, or `None` (refused, closed).
    pub(crate) fn open_conn(&self, stream: TcpStream) -> Option<ConnIn> {
        let w = stream.try_clone().ok()?;
        let conn = Arc::new(Conn { w: Mutex::new(w), shm: std::sync::OnceLock::new() });
        let mut r = BufReader::with_capacity(16 << 10, stream);
        let mut frame = proto::Frame::default();
        if let Err(why) = self.handshake(&conn, &mut r, &mut frame) {
            let peer = r.get_ref().peer_addr().map(|a| a.to_string()).unwrap_or_default();
            log::warn!("connection from {peer} refused: {why}");
            let _ = conn.w.lock().unwrap().shutdown(std::net::Shutdown::Both);
            return None;
        }
        Some(ConnIn { conn, r, frame })
    }

    /// Reads, checks and queues one request of `c`; `false` when the connection is done.
    pub(crate) fn decode_one(&self, c: &mut ConnIn) -> bool {
        self.decode_then(c, false)
    }

    /// [`Server::decode_one`]; with `inline`, a request that finds its class's worker asleep
    /// and nothing queued is served by the caller in that worker's place (`--serve-inline`).
    fn decode_then(&self, c: &mut ConnIn, inline: bool) -> bool {
        let ConnIn { conn, r, frame } = c;
        // One request per call (the block is the body of the former per-connection loop).
        {
            if frame.data.capacity() == 0 {
                // With a region attached most frames carry no data: an empty pool is no miss.
                frame.data = if conn.shm.get().is_some() { self.bufs.take() } else { self.bufs.get() };
            }
            match proto::read_frame_into(r, frame) {
                Ok(()) => {}
                Err(FrameError::Eof) => return false,
                Err(FrameError::Io(_)) => return false,
                Err(e) => {
                    self.counters.bad_frames.fetch_add(1, Relaxed);
                    conn.reply(&Reply::err(0, e.errno(), e.to_string()), &self.counters);
                    if e.recoverable() {
                        return true;
                    }
                    // Oversized or truncated: the next frame boundary is unknown.
                    let _ = conn.w.lock().unwrap().shutdown(std::net::Shutdown::Both);
                    return false;
                }
            };
            let mut req: Request = match proto::decode(frame) {
                Ok(r) => r,
                Err(e) => {
                    self.counters.bad_frames.fetch_add(1, Relaxed);
                    conn.reply(&Reply::err(0, e.errno(), e.to_string()), &self.counters);
                    return true;
                }
            };
            if req.id == 0 {
                self.counters.bad_frames.fetch_add(1, Relaxed);
                conn.reply(&Reply::err(0, errno::EPROTO, "request id 0 is reserved"), &self.counters);
                return true;
            }
            if let Op::ShmAttach { pid, fd, size, nonce } = req.op {
                let body = self.shm_attach(conn, pid, fd, size, nonce);
                conn.reply(&Reply { id: req.id, body }, &self.counters);
                return true;
            }
            let shm = match self.unwrap_shm(conn, &mut req.op) {
                Ok(shm) => shm,
                Err(e) => {
                    self.counters.bad_frames.fetch_add(1, Relaxed);
                    conn.reply(&Reply { id: req.id, body: Err(e) }, &self.counters);
                    return true;
                }
            };
            if let Err(e) = self.authorize(&req.op) {
                self.counters.cap_refusals.fetch_add(1, Relaxed);
                log::warn!("{} request {} refused: {}", req.op.name(), req.id, e.msg);
                conn.reply(&Reply { id: req.id, body: Err(e) }, &self.counters);
                if let Op::Write { data, .. } = req.op {
                    self.bufs.put(data);
                }
                return true;
            }
            let class = classify(&req.op, shm, self.cfg.small_max);
            // Target of the first byte (a progressive component not placed yet: none).
            let target = match &req.op {
                Op::Read { cap, offset, .. } | Op::Write { cap, offset, .. } => {
                    self.backend.first_target(&cap.layout, *offset)
                }
                _ => None,
            };
            if let Some(t) = target {
                self.stats.queued(t, 1);
            }
            let work = Work { req, conn: conn.clone(), arrival_ns: wall_ns(), arrival: Instant::now(), target, shm };
            if inline {
                if let Some(_lent) = self.queues.lend(class as usize) {
                    self.counters.served_inline.fetch_add(1, Relaxed);
                    self.serve(INLINE, work, class);
                    return true;
                }
            }
            self.queues.push(class as usize, work).is_ok()
        }
    }

    /// `ShmAttach`: maps the client's region ([`Region::attach`]) for this connection.
    fn shm_attach(&self, conn: &Conn, pid: u32, fd: i32, size: u64, nonce: [u8; 32]) -> Result<Body, WireError> {
        let refuse = |errno: i32, msg: String| {
            self.counters.shm_refusals.fetch_add(1, Relaxed);
            Err(WireError { errno, msg })
        };
        if !self.cfg.shm_data {
            return refuse(errno::ENOSYS, "shared-memory data path off (--shm-data false)".into());
        }
        if conn.shm.get().is_some() {
            return refuse(errno::EINVAL, "a region is already attached".into());
        }
        match Region::attach(pid, fd, size, nonce) {
            Ok(r) => {
                let _ = conn.shm.set(r);
                self.counters.shm_attaches.fetch_add(1, Relaxed);
                Ok(Body::Ok)
            }
            Err(e) => {
                log::info!("shared-memory region not attached: {e}");
                refuse(errno::EINVAL, e)
            }
        }
    }

    #[cfg(test)]
    fn conn_region<'a>(&self, conn: &'a Conn) -> &'a Region {
        conn.shm.get().expect("attached")
    }

    /// Turns a `WriteShm`/`ReadShm` into the `Write`/`Read` it stands for and returns its
    /// slot (checked against the connection's region: inside it, ≤ `MAX_IO`).
    fn unwrap_shm(&self, conn: &Conn, op: &mut Op) -> Result<Option<(u64, u32)>, WireError> {
        let (slot, n) = match op {
            Op::WriteShm { slot, len, .. } => (*slot, *len),
            Op::ReadShm { slot, size, .. } => (*slot, *size),
            _ => return Ok(None),
        };
        let bad = |msg: &str| Err(WireError { errno: errno::EPROTO, msg: msg.into() });
        let Some(region) = conn.shm.get() else { return bad("no shared-memory region attached") };
        if n as usize > proto::MAX_IO || unsafe { region.slice(slot, n as usize) }.is_none() {
            return bad("shared-memory slot outside the region or larger than MAX_IO");
        }
        let taken = std::mem::replace(op, Op::Ping);
        *op = match taken {
            Op::WriteShm { path, cap, offset, .. } => Op::Write { path, cap, offset, data: Vec::new() },
            Op::ReadShm { path, cap, offset, size, .. } => Op::Read { path, cap, offset, size },
            other => other,
        };
        Ok(Some((slot, n)))
    }

    /// The daemon's half of the handshake ([`pharos_fwd_proto::auth`]): sends the challenge,
    /// reads the client's `Auth` (one small frame, within [`HANDSHAKE_TIMEOUT`]) and answers
    /// with the daemon's proof. Anything else gets an error reply (`EACCES`, or the frame's
    /// error) and the reason back; the caller closes the connection.
    fn handshake(&self, conn: &Conn, r: &mut BufReader<TcpStream>, frame: &mut proto::Frame) -> Result<(), String> {
        let nonce: auth::Nonce = auth::random_bytes();
        conn.reply(&Reply { id: 0, body: Ok(Body::Challenge { nonce }) }, &self.counters);
        let refuse = |id: u64, errno: i32, why: String| {
            self.counters.auth_failures.fetch_add(1, Relaxed);
            conn.reply(&Reply::err(id, errno, format!("not authenticated: {why}")), &self.counters);
            Err(why)
        };
        let _ = r.get_ref().set_read_timeout(Some(HANDSHAKE_TIMEOUT));
        // The frame is read whole into a small buffer first: before authentication, a peer
        // cannot make the daemon hold more than AUTH_FRAME_MAX bytes.
        let mut buf = vec![0u8; 4];
        if let Err(e) = r.read_exact(&mut buf) {
            return match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Err("closed before authenticating".into()),
                _ => refuse(0, errno::EACCES, format!("no Auth request within {HANDSHAKE_TIMEOUT:?}: {e}")),
            };
        }
        let n = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if n == 0 || n > AUTH_FRAME_MAX {
            return refuse(0, errno::EACCES, format!("a {n}-byte frame where Auth was expected"));
        }
        buf.resize(4 + n, 0);
        if let Err(e) = r.read_exact(&mut buf[4..]) {
            return refuse(0, errno::EACCES, format!("Auth frame cut short: {e}"));
        }
        let req = match proto::read_frame_into(&mut &buf[..], frame).and_then(|()| proto::decode::<Request>(frame)) {
            Ok(req) => req,
            Err(e) => return refuse(0, e.errno(), format!("bad frame where Auth was expected: {e}")),
        };
        let key = &self.cfg.key;
        match req.op {
            Op::Auth { nonce: theirs, proof } if key.check_client_proof(&nonce, &theirs, &proof) => {
                let _ = r.get_ref().set_read_timeout(None);
                let proof = key.server_proof(&nonce, &theirs);
                conn.reply(&Reply { id: req.id, body: Ok(Body::Authed { proof }) }, &self.counters);
                Ok(())
            }
            Op::Auth { .. } => refuse(req.id, errno::EACCES, "wrong proof of the site key".into()),
            op => refuse(req.id, errno::EACCES, format!("{} before Auth", op.name())),
        }
    }

    /// Checks the capability a request carries (its MAC, one HMAC, and the right it needs:
    /// read for Read, write for Write and KillSuidgid). Requests without one pass.
    fn authorize(&self, op: &Op) -> Result<(), WireError> {
        let (cap, need) = match op {
            Op::Read { cap, .. } => (cap, Cap::READ),
            Op::Write { cap, .. } | Op::KillSuidgid { cap, .. } => (cap, Cap::WRITE),
            Op::Fsync { cap, .. } | Op::Release { cap, .. } | Op::Setattr { fd: Some(cap), .. } => (cap, 0),
            Op::Auth { .. } => return Err(WireError { errno: errno::EPROTO, msg: "already authenticated".into() }),
            // Decoded into Write/Read before this check (unwrap_shm); never reaches it.
            Op::ShmAttach { .. } | Op::WriteShm { .. } | Op::ReadShm { .. } => {
                return Err(WireError { errno: errno::EPROTO, msg: "unexpected shared-memory request".into() })
            }
            _ => return Ok(()),
        };
        if !self.cfg.key.verify(cap) {
            return Err(WireError {
                errno: errno::EACCES,
                msg: format!("capability for object {:016x} not issued by this site's daemons", cap.layout.oid),
            });
        }
        if !cap.may(need) {
            return Err(WireError { errno: errno::EBADF, msg: "the open's capability lacks the right".into() });
        }
        Ok(())
    }

    /// Worker `idx`'s next request and its class ([`Scheduler::next`]); `None` once stopped.
    fn next(&self, idx: usize, pos: &mut usize) -> Option<(Work, Class)> {
        const CLASSES: [Class; 3] = [Class::Meta, Class::Small, Class::Large];
        loop {
            if let Some((w, c)) = self.sched.next(idx, pos, &self.queues) {
                return Some((w, CLASSES[c]));
            }
            if self.stop.load(Relaxed) {
                return None;
            }
        }
    }

    fn worker(self: Arc<Self>, idx: usize) {
        let mut pos = idx; // workers start at different points of the cycle
        while let Some((work, class)) = self.next(idx, &mut pos) {
            self.serve(idx, work, class);
        }
    }

    /// Serves one request and replies: worker `idx`'s, or (`idx` = [`INLINE`]) the decoder's
    /// own in a lent worker's place ([`ClassQueues::lend`]).
    fn serve(&self, idx: usize, mut work: Work, class: Class) {
        let started = Instant::now();
        let queue_wait = started.duration_since(work.arrival);
        self.sched.waits.dequeued(class as usize, queue_wait);
        if let Some(t) = work.target {
            self.stats.queued(t, -1);
        }
        let mut info = IoInfo::default();
        // Large single-target reads go page cache → socket with sendfile(2); small ones
        // (one pread + one writev, no fstat) are cheaper through a pooled buffer.
        let mut span = None;
        let conn = work.conn.clone();
        let region = work.shm.and_then(|(slot, n)| conn.shm.get().map(|r| (r, slot, n)));
        // Bytes the request asked to write (a gathered write's buffer may move to GAS).
        let write_size = match &work.req.op {
            Op::Write { data, .. } => write_len(data, work.shm),
            _ => 0,
        };
        let body = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let spanned = match &work.req.op {
                Op::Read { cap, offset, size, .. }
                    if region.is_none() && *size as usize <= proto::MAX_IO && *size as u64 > self.cfg.small_max =>
                {
                    Some(self.backend.read_span(&cap.layout, *offset, *size, &mut info))
                }
                _ => None,
            };
            match spanned {
                Some(Ok(Some(s))) => {
                    span = Some(s);
                    Ok(Body::Data { data: Vec::new() })
                }
                Some(Err(e)) => Err(e),
                Some(Ok(None)) | None => self.execute(&mut work.req, &mut info, region),
            }
        }))
        .unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            self.counters.worker_panics.fetch_add(1, Relaxed);
            log::error!("worker {idx}: {} request {} panicked: {what}", work.req.op.name(), work.req.id);
            Err(proto::WireError { errno: errno::EIO, msg: format!("daemon fault: {what}") })
        });
        let mut service = started.elapsed();
        let (result, size) = match (&body, &work.req.op) {
            (Ok(Body::Data { .. }), Op::Read { size, .. }) if span.is_some() => {
                (span.as_ref().unwrap().len as i64, *size as u64)
            }
            (Ok(Body::Data { data }), Op::Read { size, .. }) => (data.len() as i64, *size as u64),
            (Ok(Body::ShmData { len }), Op::Read { size, .. }) => (*len as i64, *size as u64),
            (Ok(Body::Written(n)), Op::Write { .. }) => (*n as i64, write_size),
            (Ok(_), Op::Read { size, .. }) => (0, *size as u64),
            (Ok(_), Op::Write { .. }) => (0, write_size),
            (Ok(_), _) => (0, 0),
            (Err(e), Op::Read { size, .. }) => (-(e.errno as i64), *size as u64),
            (Err(e), Op::Write { .. }) => (-(e.errno as i64), write_size),
            (Err(e), _) => (-(e.errno as i64), 0),
        };
        let reply = Reply { id: work.req.id, body };
        if let Some(s) = &span {
            let t0 = Instant::now();
            if let Err(e) = work.conn.reply_file(work.req.id, s) {
                // Half a frame may be out: the stream is unusable, let the client see EOF.
                self.counters.reply_failures.fetch_add(1, Relaxed);
                log::warn!("read reply {} not sent: {e}; closing the connection", work.req.id);
                let _ = work.conn.w.lock().unwrap().shutdown(std::net::Shutdown::Both);
            }
            self.backend.stretch(s.target, t0.elapsed());
            service = started.elapsed();
        } else {
            work.conn.reply(&reply, &self.counters);
        }
        if let Ok(Body::Data { data }) = reply.body {
            self.bufs.put(data);
        }
        self.counters.served[class as usize].fetch_add(1, Relaxed);
        if work.shm.is_some() {
            self.counters.shm_requests.fetch_add(1, Relaxed);
        }
        if result < 0 {
            self.counters.errors.fetch_add(1, Relaxed);
        }
        match &work.req.op {
            Op::Read { .. } if result > 0 => {
                self.counters.bytes_read.fetch_add(result as u64, Relaxed);
            }
            Op::Write { .. } if result > 0 => {
                self.counters.bytes_written.fetch_add(result as u64, Relaxed);
            }
            _ => {}
        }
        if let Some(t) = info.target {
            self.stats.record(t, &work.req.op, result, service, !info.throttled.is_zero());
        }
        self.sink.push(self.record(&work, &info, queue_wait, service, result, size));
        if let Op::Write { data, .. } = work.req.op {
            self.bufs.put(data);
        }
    }

    fn record(
        &self,
        w: &Work,
        info: &IoInfo,
        queue_wait: Duration,
        service: Duration,
        result: i64,
        size: u64,
    ) -> IoRecord {
        use pharos_wire::Op as WOp;
        let (op, path, offset, ft) = match &w.req.op {
            Op::Read { path, offset, .. } => (WOp::Pread, path.as_str(), *offset, FileType::Regular),
            Op::Write { path, offset, .. } => (WOp::Pwrite, path.as_str(), *offset, FileType::Regular),
            Op::Create { path, .. } | Op::Open { path, .. } => (WOp::Open, path.as_str(), 0, FileType::Regular),
            Op::Release { path, .. } => (WOp::Close, path.as_str(), 0, FileType::Regular),
            Op::Fsync { path, datasync: false, .. } => (WOp::Fsync, path.as_str(), 0, FileType::Regular),
            Op::Fsync { path, datasync: true, .. } => (WOp::Fdatasync, path.as_str(), 0, FileType::Regular),
            Op::Lookup { path } | Op::Getattr { path } => (WOp::Stat, path.as_str(), 0, FileType::Unspecified),
            Op::Unlink { path } | Op::Rmdir { path } => (WOp::Unlink, path.as_str(), 0, FileType::Unspecified),
            Op::Mkdir { path, .. } => (WOp::Mkdir, path.as_str(), 0, FileType::Directory),
            Op::Rename { from, .. } => (WOp::Rename, from.as_str(), 0, FileType::Unspecified),
            Op::Readlink { path } => (WOp::Stat, path.as_str(), 0, FileType::Unspecified),
            Op::Setattr { path, .. }
            | Op::Readdir { path, .. }
            | Op::Symlink { path, .. }
            | Op::Link { to: path, .. }
            | Op::Mknod { path, .. } => (WOp::Unspecified, path.as_str(), 0, FileType::Unspecified),
            Op::KillSuidgid { path, .. } => (WOp::Unspecified, path.as_str(), 0, FileType::Regular),
            Op::Statfs | Op::Ping | Op::Auth { .. } | Op::ShmAttach { .. } => {
                (WOp::Unspecified, "", 0, FileType::Unspecified)
            }
            Op::WriteShm { path, offset, .. } => (WOp::Pwrite, path.as_str(), *offset, FileType::Regular),
            Op::ReadShm { path, offset, .. } => (WOp::Pread, path.as_str(), *offset, FileType::Regular),
        };
        let mut abs = String::with_capacity(path.len() + 1);
        if !path.starts_with('/') {
            abs.push('/');
        }
        abs.push_str(path);
        let target = info.target.map(|t| self.backend.targets[t as usize].name.clone()).unwrap_or_default();
        let start_ns = w.arrival_ns;
        IoRecord {
            start_ns,
            duration_ns: service.as_nanos() as u64,
            end_ns: start_ns + (queue_wait + service).as_nanos() as u64,
            layer: Layer::Forwarder as i32,
            host: self.cfg.node_name.clone(),
            job_id: w.req.ctx.job_id.clone(),
            rank: w.req.ctx.rank,
            pid: w.req.ctx.pid,
            tid: 0,
            comm: String::new(),
            op: op as i32,
            dev: 0,
            inode: 0,
            path: abs,
            file_type: ft as i32,
            fd: -1,
            offset,
            size,
            result,
            count: 1,
            compute_node: w.req.ctx.compute_node.clone(),
            forwarding_node: self.cfg.node_name.clone(),
            target,
            object_id: info.oid,
            queue_wait_ns: queue_wait.as_nanos() as u64,
        }
    }

    /// Executes `req`; `shm`: its data is in (write) or goes to (read) that region's slot
    /// (offset, length or size), checked by [`Server::unwrap_shm`].
    /// Runs `req` against the backend; a socket write's buffer may be moved out of it (into the
    /// GAS buffers, [`Backend::write_owned`]) and replaced by a pooled one.
    fn execute(
        &self,
        req: &mut Request,
        info: &mut IoInfo,
        shm: Option<(&Region, u64, u32)>,
    ) -> Result<Body, proto::WireError> {
        let b = &self.backend;
        let c = &req.ctx;
        Ok(match &mut req.op {
            Op::Ping => Body::Ok,
            Op::Lookup { path } if fault_panic_path() == Some(path.as_str()) => {
                panic!("injected fault: lookup of {path}")
            }
            Op::Lookup { path } | Op::Getattr { path } => Body::Attr(b.getattr(path, c)?),
            // Through an open file: its (verified) write capability names the object.
            Op::Setattr { path, set, fd } => {
                let by_fd = fd.as_ref().filter(|cap| cap.may(Cap::WRITE)).map(|cap| cap.layout.oid);
                Body::Attr(b.setattr(path, set, by_fd, c)?)
            }
            Op::Readdir { path, cookie } => {
                let (entries, eof) = b.readdir(path, *cookie, c)?;
                Body::Entries { entries, eof }
            }
            Op::Mkdir { path, mode } => Body::Attr(b.mkdir(path, *mode, c)?),
            Op::Rmdir { path } => {
                b.rmdir(path, c)?;
                Body::Ok
            }
            Op::Unlink { path } => {
                b.unlink(path, c)?;
                Body::Ok
            }
            Op::Rename { from, to, noreplace } => {
                b.rename(from, to, *noreplace, c)?;
                Body::Ok
            }
            Op::Symlink { path, target } => Body::Attr(b.symlink(path, target, c)?),
            Op::Readlink { path } => Body::Link(b.readlink(path, c)?),
            Op::Link { from, to } => Body::Attr(b.link(from, to, c)?),
            Op::Mknod { path, mode, rdev } => Body::Attr(b.mknod(path, *mode, *rdev, c)?),
            Op::KillSuidgid { path, cap } => {
                info.oid = cap.layout.oid;
                b.kill_suidgid(path, &cap.layout, cap.handle, c)?;
                Body::Ok
            }
            Op::Create { path, mode, flags, token } => {
                let (attr, layout, handle) = b.create(path, *mode, *flags, *token, c)?;
                info.target = b.first_target(&layout, 0);
                info.oid = layout.oid;
                Body::Opened { attr, cap: self.cfg.key.sign(layout, handle, Cap::rights_of(*flags)) }
            }
            Op::Open { path, flags } => {
                let (attr, layout, handle) = b.open(path, *flags, c)?;
                info.target = b.first_target(&layout, 0);
                info.oid = layout.oid;
                Body::Opened { attr, cap: self.cfg.key.sign(layout, handle, Cap::rights_of(*flags)) }
            }
            Op::Release { cap, .. } => {
                let flushed = b.gas_close(&cap.layout); // gathered writes (issue 12, item 3)
                b.release(&cap.layout, cap.handle)?;
                flushed?;
                info.target = b.first_target(&cap.layout, 0);
                info.oid = cap.layout.oid;
                Body::Ok
            }
            Op::Auth { .. } => return Err(WireError { errno: errno::EPROTO, msg: "already authenticated".into() }),
            Op::ShmAttach { .. } | Op::WriteShm { .. } | Op::ReadShm { .. } => {
                return Err(WireError { errno: errno::EPROTO, msg: "unexpected shared-memory request".into() })
            }
            Op::Read { cap, offset, size, .. } if shm.is_some() => {
                let (region, slot, _) = shm.unwrap();
                // SAFETY: the client gave this slot to this request until the reply (region.rs).
                let dst = unsafe { region.slice_mut(slot, *size as usize) }.ok_or_else(|| WireError {
                    errno: errno::EPROTO,
                    msg: "shared-memory slot outside the region".into(),
                })?;
                Body::ShmData { len: b.read_into_slice(&cap.layout, *offset, info, dst)? as u32 }
            }
            Op::Write { cap, offset, .. } if shm.is_some() => {
                let (region, slot, len) = shm.unwrap();
                // SAFETY: as above; the client does not touch the slot until the reply.
                let src = unsafe { region.slice(slot, len as usize) }.ok_or_else(|| WireError {
                    errno: errno::EPROTO,
                    msg: "shared-memory slot outside the region".into(),
                })?;
                Body::Written(b.write_from(&c.compute_node, &cap.layout, cap.handle, *offset, src, info)?)
            }
            Op::Read { cap, offset, size, .. } => {
                if *size as usize > proto::MAX_IO {
                    return Err(proto::WireError { errno: errno::EINVAL, msg: "read larger than MAX_IO".into() });
                }
                let mut buf = self.bufs.get();
                match b.read_into(&cap.layout, *offset, *size, info, &mut buf) {
                    Ok(()) => Body::Data { data: buf },
                    Err(e) => {
                        self.bufs.put(buf);
                        return Err(e);
                    }
                }
            }
            Op::Write { cap, offset, data, .. } => {
                Body::Written(b.write_owned(&c.compute_node, &cap.layout, cap.handle, *offset, data, info)?)
            }
            Op::Fsync { cap, datasync, .. } => {
                b.fsync(&cap.layout, *datasync, info)?;
                Body::Ok
            }
            Op::Statfs => Body::Statfs(b.statfs()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pharos_fwd_proto::{Layout, OpenHandle};

    fn server(key: &[u8]) -> (tempfile::TempDir, Arc<Server>) {
        server_shm(key, true)
    }

    fn server_shm(key: &[u8], shm_data: bool) -> (tempfile::TempDir, Arc<Server>) {
        let d = tempfile::tempdir().unwrap();
        let ts: Vec<(String, std::path::PathBuf)> =
            (0..2).map(|i| (format!("ost{i}"), d.path().join(format!("ost{i}")))).collect();
        let backend = Backend::new(&d.path().join("mdt"), &ts).unwrap();
        let cfg = Config {
            node_name: "fwd0".into(),
            workers: 1,
            weights: [4, 2, 1],
            queue_depth: [4, 4, 2],
            small_max: 65536,
            max_conns: 4,
            key: SiteKey::new(key),
            threads: Default::default(),
            shm_data,
        };
        (d, Server::new(cfg, Arc::new(backend), Arc::new(RecordSink::new(None))))
    }

    /// What the decoder checks before a data request is queued: the MAC (any daemon of the
    /// site, not another site), then the right the operation needs.
    #[test]
    fn capabilities_are_checked_before_queueing() {
        let (_d, s) = server(&[7; 32]);
        let (_d1, other_daemon) = server(&[7; 32]);
        let (_d2, other_site) = server(&[8; 32]);
        let l = Layout::striped(0x42, 1 << 20, vec![1]);
        let h = OpenHandle { daemon: 1, id: 2 };
        let ro = s.cfg.key.sign(l.clone(), h, Cap::READ);
        let rw = other_daemon.cfg.key.sign(l.clone(), h, Cap::READ | Cap::WRITE);
        let read = |cap: &Cap| Op::Read { path: "f".into(), cap: cap.clone(), offset: 0, size: 1 };
        let write = |cap: &Cap| Op::Write { path: "f".into(), cap: cap.clone(), offset: 0, data: vec![1] };
        assert!(s.authorize(&read(&ro)).is_ok());
        assert!(s.authorize(&write(&rw)).is_ok(), "a capability of another daemon of the site");
        assert_eq!(s.authorize(&write(&ro)).unwrap_err().errno, errno::EBADF);
        let kill = Op::KillSuidgid { path: "f".into(), cap: ro.clone() };
        assert_eq!(s.authorize(&kill).unwrap_err().errno, errno::EBADF);
        assert!(s.authorize(&Op::Fsync { path: "f".into(), cap: ro.clone(), datasync: false }).is_ok());
        assert!(s.authorize(&Op::Release { path: "f".into(), cap: ro.clone() }).is_ok());
        assert_eq!(other_site.authorize(&read(&ro)).unwrap_err().errno, errno::EACCES);
        // Another object, or more rights, under the same MAC.
        let mut forged = rw.clone();
        forged.layout.oid = 0x43;
        assert_eq!(s.authorize(&read(&forged)).unwrap_err().errno, errno::EACCES);
        let mut forged = ro.clone();
        forged.rights = Cap::READ | Cap::WRITE;
        assert_eq!(s.authorize(&write(&forged)).unwrap_err().errno, errno::EACCES);
        let set = Op::Setattr { path: "f".into(), set: Default::default(), fd: Some(forged) };
        assert_eq!(s.authorize(&set).unwrap_err().errno, errno::EACCES);
        // Requests without a capability pass; a second Auth is a protocol error.
        assert!(s.authorize(&Op::Setattr { path: "f".into(), set: Default::default(), fd: None }).is_ok());
        assert!(s.authorize(&Op::Lookup { path: "f".into() }).is_ok());
        assert_eq!(s.authorize(&Op::Auth { nonce: [0; 32], proof: [0; 32] }).unwrap_err().errno, errno::EPROTO);
    }

    /// The shared-memory data path (issue 12, item 1): an attach is refused when off, on a
    /// region that is not the client's, and twice; WriteShm/ReadShm need an attached region
    /// and a slot inside it, and become the Write/Read they stand for, with their capability
    /// checked as usual; a write from a slot and a read into one move the bytes.
    #[test]
    fn shared_memory_requests_are_bounded_and_checked() {
        let (_d, s) = server(&[7; 32]);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let conn = Conn { w: Mutex::new(c), shm: std::sync::OnceLock::new() };
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        let (_, lay, h) = s.backend.create("f", 0o644, flags, 1, &Default::default()).unwrap();
        let cap = s.cfg.key.sign(lay, h, Cap::READ | Cap::WRITE);
        let wshm = |slot: u64, len: u32| Op::WriteShm { path: "f".into(), cap: cap.clone(), offset: 0, slot, len };
        let head = pharos_fwd_proto::region::HEADER;
        // No region yet: refused.
        assert_eq!(s.unwrap_shm(&conn, &mut wshm(head, 3)).unwrap_err().errno, errno::EPROTO);
        let region = Region::create(2, 1 << 20, [5; 32]).unwrap();
        let pid = std::process::id();
        let size = region.len() as u64;
        let (fd, nonce) = (region.raw_fd(), region.nonce());
        assert!(s.shm_attach(&conn, pid, fd, size, [6; 32]).is_err(), "wrong nonce");
        let (_d2, off) = server_shm(&[7; 32], false);
        assert_eq!(off.shm_attach(&conn, pid, fd, size, nonce).unwrap_err().errno, errno::ENOSYS);
        assert_eq!(s.shm_attach(&conn, pid, fd, size, nonce).unwrap(), Body::Ok);
        assert!(s.shm_attach(&conn, pid, fd, size, nonce).is_err(), "attached twice");
        assert_eq!(s.counters.shm_attaches.load(Relaxed), 1);
        // Slots outside the region, in its header, or larger than MAX_IO.
        for (slot, len) in [(0, 3), (size - 2, 3), (u64::MAX - 1, 3), (head, proto::MAX_IO as u32 + 1)] {
            assert_eq!(s.unwrap_shm(&conn, &mut wshm(slot, len)).unwrap_err().errno, errno::EPROTO, "{slot} {len}");
        }
        let mut op = wshm(head + (1 << 20), 5);
        assert_eq!(s.unwrap_shm(&conn, &mut op).unwrap(), Some((head + (1 << 20), 5)));
        assert!(matches!(&op, Op::Write { data, offset: 0, .. } if data.is_empty()));
        assert!(s.authorize(&op).is_ok());
        assert_eq!(classify(&op, Some((0, 1 << 20)), 65536), Class::Large);
        // The bytes: written from the slot, read back into the other one.
        unsafe { region.slice_mut(head + (1 << 20), 5).unwrap().copy_from_slice(b"hello") };
        let r = s.conn_region(&conn);
        let mut w = Request { id: 1, ctx: Default::default(), op };
        let mut info = IoInfo::default();
        assert_eq!(s.execute(&mut w, &mut info, Some((r, head + (1 << 20), 5))).unwrap(), Body::Written(5));
        let mut op = Op::ReadShm { path: "f".into(), cap: cap.clone(), offset: 1, size: 100, slot: head };
        assert_eq!(s.unwrap_shm(&conn, &mut op).unwrap(), Some((head, 100)));
        let mut rd = Request { id: 2, ctx: Default::default(), op };
        assert_eq!(s.execute(&mut rd, &mut info, Some((r, head, 100))).unwrap(), Body::ShmData { len: 4 });
        assert_eq!(unsafe { region.slice(head, 4).unwrap() }, b"ello");
        // A forged capability is still refused after the conversion.
        let mut forged = cap.clone();
        forged.layout.oid ^= 1;
        let mut op = Op::ReadShm { path: "f".into(), cap: forged, offset: 0, size: 1, slot: head };
        s.unwrap_shm(&conn, &mut op).unwrap();
        assert_eq!(s.authorize(&op).unwrap_err().errno, errno::EACCES);
    }
}
