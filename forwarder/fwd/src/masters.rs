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
//! ([`Server::decode_one`]) into the class queues while frames are buffered, then re-arms it.
//! `--masters 1` is the paper's baseline: one master decodes every connection's requests.
//!
//! `--masters 0` (default) keeps one decoder thread per connection (`Server::serve_conn`).
//!
//! A master reads a frame whose first bytes arrived to its end: a client that stops in the
//! middle of a frame holds that master for at most [`FRAME_TIMEOUT`], then loses the
//! connection.
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::server::{ConnIn, Server};

/// Longest a master waits for the rest of a frame once its first bytes arrived.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

const LISTENER: u64 = u64::MAX;

/// The masters' shared state: the epoll set and the connections registered in it.
struct Masters {
    ep: RawFd,
    conns: Mutex<HashMap<u64, Arc<Mutex<ConnIn>>>>,
    next: std::sync::atomic::AtomicU64,
}

impl Masters {
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

    fn register(&self, c: ConnIn) -> std::io::Result<()> {
        let fd = c.r.get_ref().as_raw_fd();
        let token = self.next.fetch_add(1, Relaxed);
        self.conns.lock().unwrap().insert(token, Arc::new(Mutex::new(c)));
        self.ctl(libc::EPOLL_CTL_ADD, fd, token).inspect_err(|_| {
            self.conns.lock().unwrap().remove(&token);
        })
    }
}

impl Drop for Masters {
    fn drop(&mut self) {
        // SAFETY: closes the epoll fd this struct owns, once.
        unsafe { libc::close(self.ep) };
    }
}

/// Starts `server.cfg.threads.masters` master threads serving `listener`.
pub fn start(server: &Arc<Server>, listener: TcpListener) {
    // SAFETY: plain syscall; the result is checked.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0, "epoll_create1: {}", std::io::Error::last_os_error());
    let m = Arc::new(Masters { ep, conns: Mutex::new(HashMap::new()), next: Default::default() });
    listener.set_nonblocking(true).expect("non-blocking listener");
    m.ctl(libc::EPOLL_CTL_ADD, listener.as_raw_fd(), LISTENER).expect("register the listener");
    let listener = Arc::new(listener);
    for i in 0..server.cfg.threads.masters {
        let (s, m, l) = (server.clone(), m.clone(), listener.clone());
        std::thread::Builder::new()
            .name(format!("fwd-master-{i}"))
            .spawn(move || master(&s, &m, &l))
            .expect("spawn master");
    }
}

fn master(s: &Arc<Server>, m: &Arc<Masters>, listener: &TcpListener) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    while !s.stop.load(Relaxed) {
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
                if c.r.buffer().is_empty() {
                    break true;
                }
            };
            let fd = c.r.get_ref().as_raw_fd();
            if open && m.ctl(libc::EPOLL_CTL_MOD, fd, token).is_ok() {
                continue;
            }
            let _ = m.ctl(libc::EPOLL_CTL_DEL, fd, token);
            drop(c);
            m.conns.lock().unwrap().remove(&token);
            s.counters.conns.fetch_sub(1, Relaxed);
        }
    }
}

fn accept_all(s: &Arc<Server>, m: &Arc<Masters>, listener: &TcpListener) {
    loop {
        let stream = match listener.accept() {
            Ok((st, _)) => st,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                log::warn!("accept: {e}");
                return;
            }
        };
        if s.stop.load(Relaxed) {
            return;
        }
        let Some(stream) = s.admit(stream) else { continue };
        let (s2, m2) = (s.clone(), m.clone());
        let r = std::thread::Builder::new().name("fwd-handshake".into()).spawn(move || handshake(&s2, &m2, stream));
        if let Err(e) = r {
            log::warn!("spawn handshake thread: {e}");
            s.counters.conns.fetch_sub(1, Relaxed);
        }
    }
}

fn handshake(s: &Arc<Server>, m: &Arc<Masters>, stream: TcpStream) {
    let _ = stream.set_nonblocking(false);
    let Some(mut c) = s.open_conn(stream) else {
        s.counters.conns.fetch_sub(1, Relaxed);
        return;
    };
    let _ = c.r.get_ref().set_read_timeout(Some(FRAME_TIMEOUT));
    // Requests that came with the handshake's bytes are buffered: epoll will not report them.
    while !c.r.buffer().is_empty() {
        if !s.decode_one(&mut c) {
            s.counters.conns.fetch_sub(1, Relaxed);
            return;
        }
    }
    if let Err(e) = m.register(c) {
        log::warn!("register a connection with the masters: {e}");
        s.counters.conns.fetch_sub(1, Relaxed);
    }
}
