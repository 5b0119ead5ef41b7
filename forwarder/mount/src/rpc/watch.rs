//! The mount's side of the invalidations (issue 29, item 1; the daemon's side is
//! `pharos-fwd`'s `server/watch.rs`): every connection names this mount instance
//! ([`Op::Watch`], so a daemon never pushes a mount's own changes back to it), and one thread
//! per forwarding node keeps a watch connection to it and hands each pushed
//! [`Body::Changes`] to the file system, which turns them into the kernel's
//! `FUSE_NOTIFY_INVAL_ENTRY` / `FUSE_NOTIFY_INVAL_INODE`.
//!
//! A watch connection that fails is made again after [`RETRY`]; changes pushed meanwhile are
//! lost, which the cache TTL bounds (`--attr-ttl-ms`).
use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use pharos_fwd_proto::{self as proto, Body, Change, Ctx, Op, Reply, Request};

use super::Rpc;

/// Wait before a failed watch connection is made again.
pub const RETRY: Duration = Duration::from_secs(1);

/// Counters of the watch connections (`/status`, `/metrics`).
#[derive(Default)]
pub struct WatchCounters {
    /// Changes received from the daemons.
    pub changes: AtomicU64,
    /// Watch connections made (a first one per node, then each re-made one).
    pub connects: AtomicU64,
}

impl Rpc {
    /// Names connection (`r`, `w`) as this mount's (`push`: and makes it a watch connection).
    /// An error reply is not an error here (the daemon does not push: TTL only).
    pub(super) fn name_conn(
        &self,
        r: &mut BufReader<TcpStream>,
        w: &mut TcpStream,
        push: bool,
    ) -> Result<bool, String> {
        let id = self.next_id.fetch_add(1, Relaxed);
        let ctx = Ctx { compute_node: self.compute_node.clone(), rank: -1, ..Default::default() };
        let op = Op::Watch { mount: self.instance, push };
        proto::write_msg(w, &Request { id, ctx, op, replay: false }).map_err(|e| format!("watch: send: {e}"))?;
        match proto::read_msg::<Reply>(r).map_err(|e| format!("watch: {e}"))? {
            Reply { id: rid, body: Ok(Body::Ok) } if rid == id => Ok(true),
            Reply { id: rid, body: Err(e) } if rid == id || rid == 0 => {
                log::debug!("connection not named: {}", e.msg);
                Ok(false)
            }
            other => Err(format!("watch: unexpected reply {other:?}")),
        }
    }

    /// Keeps a watch connection to node `i` and calls `apply` with each pushed batch of
    /// changes, until `stop`. Runs on its own thread.
    pub fn watch(&self, i: usize, apply: &dyn Fn(&[Change]), stop: &AtomicBool) {
        while !stop.load(Relaxed) {
            match self.watch_once(i, apply, stop) {
                Ok(()) => return,
                Err(e) => log::debug!("watch of forwarding node {}: {e}", self.nodes[i].name),
            }
            std::thread::sleep(RETRY);
        }
    }

    fn watch_once(&self, i: usize, apply: &dyn Fn(&[Change]), stop: &AtomicBool) -> Result<(), String> {
        let (mut r, mut w) = self.dial(i)?;
        if !self.name_conn(&mut r, &mut w, true)? {
            return Err("the daemon does not push invalidations".into());
        }
        self.watches.connects.fetch_add(1, Relaxed);
        // Pushes come when something changes: no read timeout; a dead daemon is found by TCP
        // keepalive, and `stop` by the shutdown below.
        r.get_ref().set_read_timeout(Some(Duration::from_secs(1))).ok();
        keepalive(r.get_ref());
        let mut frame = proto::Frame::default();
        loop {
            if stop.load(Relaxed) {
                return Ok(());
            }
            // Wait for the first byte of a frame with a short timeout (to see `stop`); a frame
            // once started is read whole.
            match r.fill_buf_timeout() {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => return Err(e),
            }
            r.get_ref().set_read_timeout(Some(self.timeout)).ok();
            proto::read_frame_into(&mut r, &mut frame).map_err(|e| e.to_string())?;
            r.get_ref().set_read_timeout(Some(Duration::from_secs(1))).ok();
            match proto::decode::<Reply>(&mut frame).map_err(|e| e.to_string())? {
                Reply { body: Ok(Body::Changes { ack, changes }), .. } => {
                    self.watches.changes.fetch_add(changes.len() as u64, Relaxed);
                    apply(&changes);
                    if ack != 0 {
                        // The daemon holds the reply of the request that made them until now.
                        let id = self.next_id.fetch_add(1, Relaxed);
                        let ctx = Ctx { compute_node: self.compute_node.clone(), rank: -1, ..Default::default() };
                        let req = Request { id, ctx, op: Op::WatchAck { ack }, replay: false };
                        proto::write_msg(&mut w, &req).map_err(|e| format!("watch ack: {e}"))?;
                    }
                }
                other => return Err(format!("unexpected push {other:?}")),
            }
        }
    }
}

/// Waiting for a frame's first byte.
trait FillTimeout {
    /// Ok(true): bytes are buffered; Ok(false): the read timed out; Err: EOF or an error.
    fn fill_buf_timeout(&mut self) -> Result<bool, String>;
}

impl FillTimeout for BufReader<TcpStream> {
    fn fill_buf_timeout(&mut self) -> Result<bool, String> {
        use std::io::BufRead;
        match self.fill_buf() {
            Ok([]) => Err("closed by the daemon".into()),
            Ok(_) => Ok(true),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// TCP keepalive on `s`: a daemon gone without a FIN is noticed within about 30 s.
fn keepalive(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    let idle: libc::c_int = 10;
    let intvl: libc::c_int = 5;
    let cnt: libc::c_int = 4;
    let fd = s.as_raw_fd();
    let sz = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: setsockopt with pointers to live c_ints of the size given.
    unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, &on as *const _ as *const libc::c_void, sz);
        libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, &idle as *const _ as *const libc::c_void, sz);
        libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, &intvl as *const _ as *const libc::c_void, sz);
        libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, &cnt as *const _ as *const libc::c_void, sz);
    }
}
