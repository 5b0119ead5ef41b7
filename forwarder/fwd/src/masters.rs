//! The multi-threaded master (issue 12, item 2; the LWFS master/slave optimisation paper:
//! several master threads accept connections and decode requests, workers take them from
//! wait-free queues).
//!
//! `--masters N` (`PHAROS_FWD_MASTERS`) > 0: `N` master threads share one epoll set holding
//! the listener and every authenticated connection, each registered `EPOLLONESHOT`, so a
//! readable socket is handed to exactly one master at a time. The master that gets the
//! listener accepts (and admits) every pending connection; a short-lived thread runs each
//! new connection's handshake (so a slow client cannot hold a master for the handshake's
//! timeout) and then registers it. The master that gets a connection decodes its requests
//! ([`Frontend::decode_one`]) into the class queues while frames are buffered, then re-arms it.
//! `--masters 1` is the paper's baseline: one master decodes every connection's requests.
//!
//! `--masters 0` (default) keeps one decoder thread per connection (`Server::serve_conn`).
//!
//! The masters know the server only through [`Frontend`] (admission, handshake, decoding),
//! which `crate::server` implements: this module imports nothing of the server.
//!
//! A master reads a frame whose first bytes arrived to its end: a client that stops in the
//! middle of a frame holds that master for at most [`FRAME_TIMEOUT`], then loses the
//! connection.
use std::collections::HashMap;
use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::rx::RxStream;

/// What the masters need of the server that owns the connections.
pub trait Frontend: Send + Sync + 'static {
    /// A connection's decoding state.
    type Conn: Send + 'static;
    /// The server is stopping: the masters end.
    fn stopped(&self) -> bool;
    /// A new connection: counted and returned, or refused (`None`).
    fn admit(&self, stream: TcpStream) -> Option<TcpStream>;
    /// Runs the handshake on an admitted connection; its decoding state, or `None` (refused).
    fn open_conn(&self, stream: TcpStream) -> Option<Self::Conn>;
    /// Reads, checks and queues one request; `false` when the connection is done.
    fn decode_one(&self, c: &mut Self::Conn) -> bool;
    /// The buffered reader of a connection (its socket and the bytes buffered).
    fn reader(c: &Self::Conn) -> &BufReader<RxStream>;
    /// An admitted connection is closed.
    fn conn_closed(&self);
}

/// Longest a master waits for the rest of a frame once its first bytes arrived.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

const LISTENER: u64 = u64::MAX;

/// The masters' shared state: the epoll set and the connections registered in it.
struct Masters<C> {
    ep: RawFd,
    conns: Mutex<HashMap<u64, Arc<Mutex<C>>>>,
    next: std::sync::atomic::AtomicU64,
}

impl<C> Masters<C> {
    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64) -> std::io::Result<()> {
        let mut ev =
            libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32, u64: token };
        // SAFETY: `ev` is a valid epoll_event for the call's duration; `ep` is our epoll fd.
        let r = unsafe { libc::epoll_ctl(self.ep, op, fd, &mut ev) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn register(&self, c: C, fd: RawFd) -> std::io::Result<()> {
        let token = self.next.fetch_add(1, Relaxed);
        self.conns.lock().unwrap().insert(token, Arc::new(Mutex::new(c)));
        self.ctl(libc::EPOLL_CTL_ADD, fd, token).inspect_err(|_| {
            self.conns.lock().unwrap().remove(&token);
        })
    }
}

impl<C> Drop for Masters<C> {
    fn drop(&mut self) {
        // SAFETY: closes the epoll fd this struct owns, once.
        unsafe { libc::close(self.ep) };
    }
}

/// Starts `masters` master threads serving `listener`.
pub fn start<S: Frontend>(server: &Arc<S>, masters: usize, listener: TcpListener) {
    // SAFETY: plain syscall; the result is checked.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0, "epoll_create1: {}", std::io::Error::last_os_error());
    let m = Arc::new(Masters { ep, conns: Mutex::new(HashMap::new()), next: Default::default() });
    listener.set_nonblocking(true).expect("non-blocking listener");
    m.ctl(libc::EPOLL_CTL_ADD, listener.as_raw_fd(), LISTENER).expect("register the listener");
    let listener = Arc::new(listener);
    for i in 0..masters {
        let (s, m, l) = (server.clone(), m.clone(), listener.clone());
        std::thread::Builder::new()
            .name(format!("fwd-master-{i}"))
            .spawn(move || master(&s, &m, &l))
            .expect("spawn master");
    }
}

fn master<S: Frontend>(s: &Arc<S>, m: &Arc<Masters<S::Conn>>, listener: &TcpListener) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    while !s.stopped() {
        // SAFETY: `events` outlives the call and holds `len` entries.
        let n = unsafe { libc::epoll_wait(m.ep, events.as_mut_ptr(), events.len() as i32, 200) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                log::error!("epoll_wait: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        for ev in &events[..n as usize] {
            let token = ev.u64;
            if token == LISTENER {
                accept_all(s, m, listener);
                if let Err(e) = m.ctl(libc::EPOLL_CTL_MOD, listener.as_raw_fd(), LISTENER) {
                    log::error!("re-arm the listener: {e}");
                }
                continue;
            }
            let Some(c) = m.conns.lock().unwrap().get(&token).cloned() else { continue };
            let mut c = c.lock().unwrap();
            // Decode while whole frames may be buffered (epoll sees the socket, not the buffer).
            let open = loop {
                if !s.decode_one(&mut c) {
                    break false;
                }
                if S::reader(&c).buffer().is_empty() {
                    break true;
                }
            };
            let fd = S::reader(&c).get_ref().as_raw_fd();
            if open && m.ctl(libc::EPOLL_CTL_MOD, fd, token).is_ok() {
                continue;
            }
            let _ = m.ctl(libc::EPOLL_CTL_DEL, fd, token);
            drop(c);
            m.conns.lock().unwrap().remove(&token);
            s.conn_closed();
        }
    }
}

fn accept_all<S: Frontend>(s: &Arc<S>, m: &Arc<Masters<S::Conn>>, listener: &TcpListener) {
    loop {
        let stream = match listener.accept() {
            Ok((st, _)) => st,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                log::warn!("accept: {e}");
                return;
            }
        };
        if s.stopped() {
            return;
        }
        let Some(stream) = s.admit(stream) else { continue };
        let (s2, m2) = (s.clone(), m.clone());
        let r = std::thread::Builder::new().name("fwd-handshake".into()).spawn(move || handshake(&s2, &m2, stream));
        if let Err(e) = r {
            log::warn!("spawn handshake thread: {e}");
            s.conn_closed();
        }
    }
}

fn handshake<S: Frontend>(s: &Arc<S>, m: &Arc<Masters<S::Conn>>, stream: TcpStream) {
    let _ = stream.set_nonblocking(false);
    let Some(mut c) = s.open_conn(stream) else {
        s.conn_closed();
        return;
    };
    let _ = S::reader(&c).get_ref().set_read_timeout(Some(FRAME_TIMEOUT));
    // Requests that came with the handshake's bytes are buffered: epoll will not report them.
    while !S::reader(&c).buffer().is_empty() {
        if !s.decode_one(&mut c) {
            s.conn_closed();
            return;
        }
    }
    let fd = S::reader(&c).get_ref().as_raw_fd();
    if let Err(e) = m.register(c, fd) {
        log::warn!("register a connection with the masters: {e}");
        s.conn_closed();
    }
}
