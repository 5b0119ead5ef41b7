//! Connection handling: accepting and admitting connections, the handshake, the
//! shared-memory region attach, reading and decoding frames, the capability check, and the
//! queueing of requests (or their serving inline); the replies on the connection.
use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pharos_fwd_proto::auth;
use pharos_fwd_proto::region::Region;
use pharos_fwd_proto::{self as proto, errno, Body, Cap, FrameError, Op, Reply, Request, WireError};

use super::{classify, Counters, Server, Work, AUTH_FRAME_MAX, HANDSHAKE_TIMEOUT, INLINE};
use crate::backend::FileSpan;
use crate::clock::wall_ns;
use crate::masters::Frontend;
use crate::rx::RxStream;

pub(crate) struct Conn {
    pub(super) w: Mutex<TcpStream>,
    /// The client's shared-memory data region, once attached.
    pub(super) shm: std::sync::OnceLock<Region>,
    /// The mount instance this connection belongs to ([`Op::Watch`]; 0 until it says).
    pub(super) mount: std::sync::OnceLock<u64>,
}

/// A connection's decoding state: the reply half, the buffered reader, the frame buffer.
pub struct ConnIn {
    pub(crate) conn: Arc<Conn>,
    pub(crate) r: BufReader<RxStream>,
    frame: proto::Frame,
}

impl Conn {
    /// Sends `r` (one vectored write: prefix, header, data from the reply's own buffer). A
    /// reply too large for a frame goes out as an `EMSGSIZE` error reply instead; a failed
    /// send is logged and counted, and the connection is shut down, so the client sees the
    /// failure at once (and replays) instead of waiting for its timeout.
    pub(super) fn reply(&self, r: &Reply, c: &Counters) {
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
    pub(super) fn reply_file(&self, id: u64, span: &FileSpan) -> std::io::Result<()> {
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

impl Server {
    pub(super) fn accept(self: Arc<Self>, listener: TcpListener) {
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
    fn admit(&self, stream: TcpStream) -> Option<TcpStream> {
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
            let mut corked = false;
            loop {
                // A client that pipelines requests (a mount's write-back creates) has more of them
                // buffered here: their replies are corked (TCP_CORK) until the buffer is empty,
                // so they leave in as few segments as possible (one wakeup of the client, not one
                // per reply); uncorked before waiting for more. A lone request is never corked.
                let more = !c.r.buffer().is_empty();
                if more != corked {
                    set_cork(c.r.get_ref(), more);
                    corked = more;
                }
                if !self.decode_then(&mut c, inline) {
                    break;
                }
            }
        }
    }

    /// Runs the handshake on a new connection; its decoding state, or `None` (refused, closed).
    fn open_conn(&self, stream: TcpStream) -> Option<ConnIn> {
        let w = stream.try_clone().ok()?;
        let conn =
            Arc::new(Conn { w: Mutex::new(w), shm: std::sync::OnceLock::new(), mount: std::sync::OnceLock::new() });
        let mut r = BufReader::with_capacity(16 << 10, RxStream::new(stream));
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
    fn decode_one(&self, c: &mut ConnIn) -> bool {
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
            if let Op::WatchAck { ack } = req.op {
                self.watch.ack(conn.mount.get().copied().unwrap_or(0), ack);
                return true;
            }
            if let Op::Watch { mount, push } = req.op {
                // The connection's mount; a watch connection gets the pushes from now on.
                let _ = conn.mount.set(mount);
                conn.reply(&Reply { id: req.id, body: Ok(Body::Ok) }, &self.counters);
                if push {
                    self.watch.add(mount, conn.clone(), req.id);
                }
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
            // arrival: the kernel's receipt of the data the frame came in (crate::rx), so the
            // queue wait holds the time in the receive buffer too (a daemon not running)
            let decoded = Instant::now();
            let (arrival_ns, arrival) = r.get_ref().arrival(wall_ns(), decoded);
            let work = Work { req, conn: conn.clone(), arrival_ns, arrival, decoded, target, shm };
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
    pub(super) fn shm_attach(
        &self,
        conn: &Conn,
        pid: u32,
        fd: i32,
        size: u64,
        nonce: [u8; 32],
    ) -> Result<Body, WireError> {
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
    pub(super) fn conn_region<'a>(&self, conn: &'a Conn) -> &'a Region {
        conn.shm.get().expect("attached")
    }

    /// Turns a `WriteShm`/`ReadShm` into the `Write`/`Read` it stands for and returns its
    /// slot (checked against the connection's region: inside it, ≤ `MAX_IO`).
    pub(super) fn unwrap_shm(&self, conn: &Conn, op: &mut Op) -> Result<Option<(u64, u32)>, WireError> {
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
    fn handshake(&self, conn: &Conn, r: &mut BufReader<RxStream>, frame: &mut proto::Frame) -> Result<(), String> {
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
    pub(super) fn authorize(&self, op: &Op) -> Result<(), WireError> {
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
}

/// The masters (`--masters N`, [`crate::masters`]) decode connections through this.
impl Frontend for Server {
    type Conn = ConnIn;

    fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }

    fn admit(&self, stream: TcpStream) -> Option<TcpStream> {
        Server::admit(self, stream)
    }

    fn open_conn(&self, stream: TcpStream) -> Option<ConnIn> {
        Server::open_conn(self, stream)
    }

    fn decode_one(&self, c: &mut ConnIn) -> bool {
        Server::decode_one(self, c)
    }

    fn reader(c: &ConnIn) -> &BufReader<RxStream> {
        &c.r
    }

    fn conn_closed(&self) {
        self.counters.conns.fetch_sub(1, Relaxed);
    }
}

/// Sets or clears `TCP_CORK` on `s` (clearing sends what is held at once). Errors are ignored:
/// corking only saves segments.
fn set_cork(s: &TcpStream, on: bool) {
    crate::rx::set_int_option(s, libc::IPPROTO_TCP, libc::TCP_CORK, on as libc::c_int);
}
