//! Executing requests: the workers' loop, the execution of an operation on the backend (a
//! large single-target read sent with `sendfile(2)`, shared-memory slots, a caught panic
//! answered `EIO`), the reply, the counters and the request's `IoRecord`.
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pharos_fwd_proto::region::Region;
use pharos_fwd_proto::{self as proto, errno, Body, Cap, Op, Reply, Request, WireError};
use pharos_wire::{FileType, IoRecord, Layer};

use super::{write_len, Class, Server, Work};
use crate::backend::IoInfo;

/// Fault injection for tests: a lookup of this namespace path panics in the worker
/// (`PHAROS_FWD_FAULT_PANIC_PATH`, read once). Only in a build with the `test-hooks` feature
/// (the `pharos-fwd-hooks` binary); a release build has no such hook and ignores the variable.
#[cfg(feature = "test-hooks")]
fn fault_panic_path() -> Option<&'static str> {
    static P: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    P.get_or_init(|| std::env::var("PHAROS_FWD_FAULT_PANIC_PATH").ok().filter(|p| !p.is_empty())).as_deref()
}

/// The attributes of the directory holding `path` (after a name change in it: the mount
/// answers the kernel's next GETATTR of the directory from them); None when it cannot be read.
fn parent_attr(b: &crate::backend::Backend, path: &str, c: &pharos_fwd_proto::Ctx) -> Option<pharos_fwd_proto::Attr> {
    let p = path.trim_matches('/');
    b.getattr(p.rsplit_once('/').map(|(d, _)| d).unwrap_or(""), c).ok()
}

impl Server {
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

    pub(super) fn worker(self: Arc<Self>, idx: usize) {
        let mut pos = idx; // workers start at different points of the cycle
        while let Some((work, class)) = self.next(idx, &mut pos) {
            self.serve(idx, work, class);
        }
    }

    /// Serves one request and replies: worker `idx`'s, or (`idx` = [`super::INLINE`]) the decoder's
    /// own in a lent worker's place ([`ClassQueues::lend`]).
    pub(super) fn serve(&self, idx: usize, mut work: Work, class: Class) {
        let started = Instant::now();
        let queue_wait = started.duration_since(work.arrival);
        self.sched.waits.dequeued(class as usize, started.duration_since(work.decoded));
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
        // Directory holders: a directory another mount holds is recalled from it first
        // (its pending creates there reach the daemon before this request is served).
        let origin = work.conn.mount.get().copied().unwrap_or(0);
        super::holders::recall_before(&self.backend, &self.watch, origin, &work.req.op);
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
        // Directory holders: a mkdir's holder recorded (`holders.rs`).
        let body = super::holders::settle(&self.backend, origin, &work.req.op, body);
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
            // Other mounts' caches of what this request changed: attributes before the reply
            // (acknowledged), names and writes' sizes after it (pushed within milliseconds).
            let now = super::watch::waits_for_acks(&work.req.op);
            if now {
                self.watch.changed_now(&self.backend, origin, super::watch::changes_of(&work.req.op, &reply.body));
            }
            work.conn.reply(&reply, &self.counters);
            if !now {
                self.watch.changed(origin, || super::watch::changes_of(&work.req.op, &reply.body));
            }
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
        match info.release {
            // One request, two records: the create (an open) and the release of its open.
            Some(r) => {
                let open = self.record(&work, &info, queue_wait, service.saturating_sub(r), result, size);
                let close = IoRecord {
                    op: pharos_wire::Op::Close as i32,
                    start_ns: open.end_ns,
                    duration_ns: r.as_nanos() as u64,
                    end_ns: open.end_ns + r.as_nanos() as u64,
                    queue_wait_ns: 0,
                    ..open.clone()
                };
                self.sink.push(open);
                self.sink.push(close);
            }
            None => self.sink.push(self.record(&work, &info, queue_wait, service, result, size)),
        }
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
            Op::Create { path, .. } | Op::CreateReleased { path, .. } | Op::Open { path, .. } => {
                (WOp::Open, path.as_str(), 0, FileType::Regular)
            }
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
            Op::ReaddirPlus { path, .. } => (WOp::Unspecified, path.as_str(), 0, FileType::Directory),
            Op::Statfs
            | Op::Ping
            | Op::Auth { .. }
            | Op::ShmAttach { .. }
            | Op::Flush
            | Op::Watch { .. }
            | Op::WatchAck { .. } => (WOp::Unspecified, "", 0, FileType::Unspecified),
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
            // The mount's request id and replay flag: the pipeline counts a replayed request once.
            request_id: w.req.id,
            replay: w.req.replay,
        }
    }

    /// Executes `req`; `shm`: its data is in (write) or goes to (read) that region's slot
    /// (offset, length or size), checked by [`Server::unwrap_shm`].
    /// Runs `req` against the backend; a socket write's buffer may be moved out of it (into the
    /// GAS buffers, [`Backend::write_owned`]) and replaced by a pooled one.
    pub(super) fn execute(
        &self,
        req: &mut Request,
        info: &mut IoInfo,
        shm: Option<(&Region, u64, u32)>,
    ) -> Result<Body, proto::WireError> {
        let b = &self.backend;
        let c = &req.ctx;
        let then_release = matches!(req.op, Op::CreateReleased { .. });
        Ok(match &mut req.op {
            Op::Ping => Body::Ok,
            #[cfg(feature = "test-hooks")]
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
            Op::ReaddirPlus { path, cookie } => {
                let (entries, eof) = b.readdir_plus(path, *cookie, c)?;
                Body::EntriesPlus { entries, eof }
            }
            Op::Watch { .. } | Op::WatchAck { .. } => {
                return Err(WireError { errno: errno::EPROTO, msg: "watch is the decoder's".into() })
            }
            Op::Mkdir { path, mode } => Body::Attr(b.mkdir(path, *mode, c)?),
            Op::Rmdir { path } => {
                b.rmdir(path, c)?;
                Body::Ok
            }
            Op::Unlink { path } => {
                b.unlink(path, c)?;
                match parent_attr(b, path, c) {
                    Some(parent) => Body::Removed { parent },
                    None => Body::Ok,
                }
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
            Op::Create { path, mode, flags, token } | Op::CreateReleased { path, mode, flags, token } => {
                let (attr, layout, handle) = b.create(path, *mode, *flags, *token, c)?;
                info.target = b.first_target(&layout, 0);
                info.oid = layout.oid;
                if then_release {
                    let t0 = Instant::now();
                    let flushed = b.gas_close(&layout);
                    // The file is made: a failed release is counted, as a release's own is.
                    if let Err(e) = b.release(&layout, handle).and(flushed) {
                        self.counters.errors.fetch_add(1, Relaxed);
                        log::warn!("release after the create of {path}: {}", e.msg);
                    }
                    info.release = Some(t0.elapsed());
                }
                let cap = self.cfg.key.sign(layout, handle, Cap::rights_of(*flags));
                match parent_attr(b, path, c) {
                    Some(parent) => Body::Created { attr, cap, parent },
                    None => Body::Opened { attr, cap },
                }
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
            Op::Flush => {
                b.gas_flush_node(&c.compute_node)?; // before a remap (issue 26, item 6)
                Body::Ok
            }
        })
    }
}
