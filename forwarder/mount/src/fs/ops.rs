//! The FUSE operations ([`Filesystem`] for [`PharosFs`]): each becomes one request to the
//! forwarding layer, sent from the I/O pool, and answers the kernel from there. Namespace and
//! attribute operations are here; read and write are the data path (`data.rs`).
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use pharos_fwd_proto::{errno, Body, Ctx, Op, SetAttr};

use super::attr::{fattr, join, tott};
use super::writeback::DeferredRelease;
use super::{Grant, Open, PharosFs, SUIDGID};

impl Filesystem for PharosFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        let _ = config.add_capabilities(fuser::consts::FUSE_ASYNC_DIO | fuser::consts::FUSE_PARALLEL_DIROPS);
        if !self.sh.ttl.is_zero() {
            // READDIRPLUS when the kernel sees a listing followed by lookups (`ls -l`): one
            // request per page of entries with their attributes, not one per entry.
            let _ = config.add_capabilities(fuser::consts::FUSE_DO_READDIRPLUS | fuser::consts::FUSE_READDIRPLUS_AUTO);
        }
        Ok(())
    }

    fn lookup(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let absent = || name.to_str().is_some_and(|n| n.len() <= super::NAME_MAX && self.sh.complete.absent(parent, n));
        if self.sh.answer_absent && absent() {
            // Not cached by the kernel (TTL 0): every lookup comes here, and ends here.
            return reply.error(errno::ENOENT);
        }
        let path = match self.sh.path(parent).and_then(|p| join(&p, name)) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        // A node-local rank directory is this compute node's alone: answered here too.
        if !self.sh.answer_absent && super::node_local(&path) && absent() {
            return reply.error(errno::ENOENT);
        }
        let ctx = self.sh.ctx(req);
        self.spawn(move |sh, c| {
            sh.wait_name(&path); // a create this mount answered reaches the daemon first
            match sh.rpc.call(c, &ctx, Op::Lookup { path: path.clone() }) {
                Ok(Body::Attr(a)) => {
                    let ino = sh.learn(a.ino, &path);
                    reply.entry(&sh.ttl, &fattr(&a, ino), 0)
                }
                Ok(_) => reply.error(errno::EIO),
                Err(e) => reply.error(e),
            }
        });
    }

    fn forget(&mut self, _req: &Request<'_>, ino: u64, nlookup: u64) {
        if self.sh.inodes.lock().unwrap().forget(ino, nlookup) {
            self.sh.complete.drop_dir(ino);
            self.sh.dir_attrs.drop_ino(ino);
            self.sh.wb.forget(ino);
        }
    }

    fn getattr(&mut self, req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if let Some(a) = self.sh.dir_attrs.get(ino) {
            return reply.attr(&self.sh.ttl, &fattr(&a, ino));
        }
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(ino) {
            Ok(p) => p,
            Err(e) => {
                // fstat of an open file whose last name went: its attributes at open, no link.
                let open = self.sh.files.lock().unwrap().values().find(|f| f.ino == ino).cloned();
                if let Some(f) = open {
                    let mut a = f.attr.clone();
                    a.nlink = 0;
                    return reply.attr(&self.sh.ttl, &fattr(&a, ino));
                }
                return reply.error(e);
            }
        };
        let kino = ino;
        self.spawn(move |sh, c| {
            if let Err(e) = sh.wb.wait_ino(kino) {
                return reply.error(e);
            }
            match sh.rpc.call(c, &ctx, Op::Getattr { path }) {
                Ok(Body::Attr(a)) => reply.attr(&sh.ttl, &fattr(&a, kino)),
                Ok(_) => reply.error(errno::EIO),
                Err(e) => reply.error(e),
            }
        });
    }

    fn setattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let set = SetAttr { mode, uid, gid, size, atime: tott(atime), mtime: tott(mtime) };
        self.sh.dir_attrs.drop_ino(ino);
        // Through an open file (ftruncate): its capability (the open already checked the access).
        let fd = fh.and_then(|fh| self.sh.files.lock().unwrap().get(&fh).cloned());
        if mode.is_some_and(|m| m & SUIDGID != 0) {
            // chmod u+s/g+s through this mount: open files' next flagged write clears them again.
            for f in self.sh.files.lock().unwrap().values().filter(|f| f.ino == ino) {
                f.suidgid.store(true, Relaxed);
            }
        }
        self.spawn(move |sh, c| {
            let fd = match (sh.wb.wait_ino(ino), fd.map(|f| f.cap()).transpose()) {
                (Ok(()), Ok(fd)) => fd,
                (Err(e), _) | (_, Err(e)) => return reply.error(e),
            };
            match sh.rpc.call(c, &ctx, Op::Setattr { path, set, fd }) {
                Ok(Body::Attr(a)) => reply.attr(&sh.ttl, &fattr(&a, ino)),
                Ok(_) => reply.error(errno::EIO),
                Err(e) => reply.error(e),
            }
        });
    }

    fn mkdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(parent).and_then(|p| join(&p, name)) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let mode = mode & !umask;
        self.entry_op(ctx, (parent, name), path.clone(), Op::Mkdir { path, mode }, reply);
    }

    fn unlink(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        self.remove(req, parent, name, reply, false)
    }

    fn rmdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        self.remove(req, parent, name, reply, true)
    }

    fn rename(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let ctx = self.sh.ctx(req);
        let (from, to) = match (
            self.sh.path(parent).and_then(|p| join(&p, name)),
            self.sh.path(newparent).and_then(|p| join(&p, newname)),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        if flags & !(libc::RENAME_NOREPLACE) != 0 {
            return reply.error(errno::EINVAL);
        }
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let (name, newname) = (name.to_string_lossy().into_owned(), newname.to_string_lossy().into_owned());
        self.spawn(move |sh, c| {
            sh.wait_name(&from);
            sh.wait_name(&to);
            match sh.rpc.call(c, &ctx, Op::Rename { from: from.clone(), to: to.clone(), noreplace }) {
                Ok(_) => {
                    sh.dir_attrs.drop_ino(parent);
                    sh.dir_attrs.drop_ino(newparent);
                    sh.complete.removed(parent, &name);
                    sh.complete.added(newparent, &newname);
                    sh.inodes.lock().unwrap().rename(&from, &to);
                    reply.ok()
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(parent).and_then(|p| join(&p, name)) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let token = crate::random_token();
        let name = name.to_string_lossy().into_owned();
        let mode = mode & !umask & 0o7777;
        {
            let _recall_waits = self.sh.wb_gate.read().unwrap();
            if let Some(dir) = self.writeback_parent(parent, &name, &path) {
                return self.create_here(ctx, (parent, dir, name), path, (mode, flags, token), reply);
            }
        }
        self.spawn(move |sh, c| {
            sh.wait_name(&path); // an unlink of the name this mount answered reaches the daemon first
            match sh.rpc.call(c, &ctx, Op::Create { path: path.clone(), mode, flags, token }) {
                Ok(body @ (Body::Opened { .. } | Body::Created { .. })) => {
                    let (attr, cap) = match body {
                        Body::Created { attr, cap, parent: pa } => {
                            sh.dir_attrs.put(parent, pa, sh.ttl);
                            (attr, cap)
                        }
                        Body::Opened { attr, cap } => {
                            sh.dir_attrs.drop_ino(parent);
                            (attr, cap)
                        }
                        _ => unreachable!(),
                    };
                    let ino = sh.learn(attr.ino, &path);
                    sh.complete.added(parent, &name);
                    let fh = sh.next_fh.fetch_add(1, Relaxed);
                    sh.files.lock().unwrap().insert(fh, Arc::new(Open::new(attr.clone(), ino, cap, &ctx)));
                    reply.created(&sh.ttl, &fattr(&attr, ino), 0, fh, sh.open_flags)
                }
                Ok(_) => reply.error(errno::EIO),
                Err(e) => reply.error(e),
            }
        });
    }

    fn open(&mut self, req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        self.spawn(move |sh, c| {
            if let Err(e) = sh.wb.wait_ino(ino) {
                return reply.error(e);
            }
            match sh.rpc.call(c, &ctx, Op::Open { path, flags }) {
                Ok(Body::Opened { attr, cap }) => {
                    let fh = sh.next_fh.fetch_add(1, Relaxed);
                    sh.files.lock().unwrap().insert(fh, Arc::new(Open::new(attr, ino, cap, &ctx)));
                    reply.opened(fh, sh.open_flags)
                }
                Ok(_) => reply.error(errno::EIO),
                Err(e) => reply.error(e),
            }
        });
    }

    fn read(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyData,
    ) {
        match self.data_args(req, ino, fh, offset) {
            Ok(a) => self.read_data(a, size, reply),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        wflags: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyWrite,
    ) {
        match self.data_args(req, ino, fh, offset) {
            Ok(a) => self.write_data(a, data, wflags, reply),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _lock: u64, reply: ReplyEmpty) {
        // Sent only by kernels older than FOPEN_NOFLUSH (`fs.rs`). No client-side data cache:
        // nothing to write back. A write-back create already known to have failed is reported
        // here (close(2)); one still in flight is not waited for: fsync is the point that waits.
        match self.sh.files.lock().unwrap().get(&fh).map(|f| f.failed()) {
            Some(None) => reply.ok(),
            Some(Some(e)) => reply.error(e),
            None => reply.error(errno::EBADF),
        }
    }

    fn release(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        _flags: i32,
        _lock: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut ctx = self.sh.ctx(req);
        let Some(f) = self.sh.files.lock().unwrap().remove(&fh) else { return reply.error(errno::EBADF) };
        if ctx.job_id.is_empty() {
            (ctx.job_id, ctx.rank) = f.job.clone(); // routed as the opener's requests
        }
        let path = self.sh.path(ino).unwrap_or_default();
        // The kernel does not wait for a release (close(2) has returned before it is sent):
        // it is answered first where the release can follow in the write-back threads'
        // batches (any file, `--writeback-creates` > 0), and for a node-local file (its opens
        // have no open marker). A shared file's open marker then goes a few ms later: an
        // unlink meanwhile keeps the data as an orphan that this release reaps.
        let reply = match super::node_local(&path) || self.sh.wb.enabled() {
            true => {
                reply.ok();
                None
            }
            false => Some(reply),
        };
        // The release of a file whose write-back create is in flight is sent after it.
        let (ctx, path) = match &f.grant {
            Grant::Pending(p) => match p.defer_release(DeferredRelease { ctx, path }) {
                Ok(()) => return,
                Err(d) => (d.ctx, d.path),
            },
            Grant::Cap(_) => (ctx, path),
        };
        if reply.is_none() && self.sh.wb.enabled() {
            // Answered already: sent in a batch by the write-back threads.
            if let Ok(cap) = f.cap() {
                self.sh.wb.submit_release(ctx, path, cap);
            }
            return;
        }
        self.spawn(move |sh, c| {
            // close(2) does not report release errors; the daemon counts failures. A refused
            // write-back create opened nothing: nothing to release.
            if let Ok(cap) = f.cap() {
                let _ = sh.rpc.call(c, &ctx, Op::Release { path, cap });
            }
            if let Some(r) = reply {
                r.ok()
            }
        });
    }

    fn fsync(&mut self, req: &Request<'_>, ino: u64, fh: u64, datasync: bool, reply: ReplyEmpty) {
        let ctx = self.sh.ctx(req);
        let Some(f) = self.sh.files.lock().unwrap().get(&fh).cloned() else { return reply.error(errno::EBADF) };
        let path = self.sh.path(ino).unwrap_or_default();
        self.spawn(move |sh, c| {
            // A write-back create reaches the daemon first (the durability point).
            let cap = match f.cap() {
                Ok(cap) => cap,
                Err(e) => return reply.error(e),
            };
            match sh.rpc.call(c, &ctx, Op::Fsync { path, cap, datasync }) {
                Ok(_) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        // The names made in the directory are the daemon's once its write-back creates are done
        // (a durability point, as fsync of a directory is for a local file system); the first
        // create there that failed since the last fsync is its answer.
        let path = match self.sh.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        self.spawn(move |sh, _| {
            sh.wb.wait_under(&path);
            match sh.wb.take_dir_error(ino) {
                Some(e) => reply.error(e),
                None => reply.ok(),
            }
        });
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if let Err(e) = self.sh.path(ino) {
            return reply.error(e);
        }
        let fh = self.sh.next_fh.fetch_add(1, Relaxed);
        self.sh.dirs.lock().unwrap().insert(fh, None);
        reply.opened(fh, 0)
    }

    fn releasedir(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _flags: i32, reply: ReplyEmpty) {
        self.sh.dirs.lock().unwrap().remove(&fh);
        reply.ok()
    }

    fn readdir(&mut self, req: &Request<'_>, ino: u64, fh: u64, offset: i64, reply: ReplyDirectory) {
        self.list(req, ino, fh, offset, super::dir::Listing::Plain(reply))
    }

    fn readdirplus(&mut self, req: &Request<'_>, ino: u64, fh: u64, offset: i64, reply: ReplyDirectoryPlus) {
        self.list(req, ino, fh, offset, super::dir::Listing::Plus(reply))
    }

    fn readlink(&mut self, req: &Request<'_>, ino: u64, reply: ReplyData) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        self.spawn(move |sh, c| match sh.rpc.call(c, &ctx, Op::Readlink { path }) {
            Ok(Body::Link(t)) => reply.data(t.as_bytes()),
            Ok(_) => reply.error(errno::EIO),
            Err(e) => reply.error(e),
        });
    }

    fn symlink(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, target: &Path, reply: ReplyEntry) {
        let ctx = self.sh.ctx(req);
        let Some(target) = target.to_str().map(String::from) else { return reply.error(errno::EINVAL) };
        match self.sh.path(parent).and_then(|p| join(&p, name)) {
            Ok(path) => self.entry_op(ctx, (parent, name), path.clone(), Op::Symlink { path, target }, reply),
            Err(e) => reply.error(e),
        }
    }

    fn link(&mut self, req: &Request<'_>, ino: u64, newparent: u64, newname: &OsStr, reply: ReplyEntry) {
        let ctx = self.sh.ctx(req);
        match (self.sh.path(ino), self.sh.path(newparent).and_then(|p| join(&p, newname))) {
            (Ok(from), Ok(to)) => {
                if let Err(e) = self.sh.wb.wait_ino(ino) {
                    return reply.error(e); // (rare: a link to a file just made; waits on this thread)
                }
                self.entry_op(ctx, (newparent, newname), to.clone(), Op::Link { from, to }, reply)
            }
            (Err(e), _) | (_, Err(e)) => reply.error(e),
        }
    }

    fn mknod(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let ctx = self.sh.ctx(req);
        let mode = mode & !(umask & 0o7777);
        match self.sh.path(parent).and_then(|p| join(&p, name)) {
            Ok(path) => {
                self.entry_op(ctx, (parent, name), path.clone(), Op::Mknod { path, mode, rdev: rdev as u64 }, reply)
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&mut self, req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let ctx = self.sh.ctx(req);
        self.spawn(move |sh, c| match sh.rpc.call(c, &ctx, Op::Statfs) {
            Ok(Body::Statfs(s)) => {
                reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize)
            }
            Ok(_) => reply.error(errno::EIO),
            Err(e) => reply.error(e),
        });
    }
}

impl PharosFs {
    /// Sends `op`, which makes the name `path` and answers its attributes (mkdir, symlink,
    /// link, mknod), and replies with the new entry.
    /// `at`: the new name's directory and name.
    fn entry_op(&self, ctx: Ctx, at: (u64, &OsStr), path: String, op: Op, reply: ReplyEntry) {
        let (parent, name) = (at.0, at.1.to_string_lossy().into_owned());
        let made_dir = matches!(op, Op::Mkdir { .. });
        self.spawn(move |sh, c| {
            sh.wait_name(&path); // an unlink of the name this mount answered reaches the daemon first
            let asked = std::time::Instant::now();
            let (a, held) = match sh.rpc.call(c, &ctx, op) {
                Ok(Body::Attr(a)) => (a, false),
                Ok(Body::MadeDir { attr, held }) => (attr, held),
                Ok(_) => return reply.error(errno::EIO),
                Err(e) => return reply.error(e),
            };
            sh.dir_attrs.drop_ino(parent);
            let ino = sh.learn(a.ino, &path);
            sh.complete.added(parent, &name);
            let private = made_dir && super::node_local_depth(&path) >= 2 && !sh.ttl.is_zero();
            // Known whole: a directory this mount holds (recalled by the forwarding node when
            // another mount adds a name there), or its own node-local rank directory.
            if held || private {
                sh.complete.made_dir(ino, if private { super::NODE_LOCAL_KNOWN } else { sh.ttl }, asked);
                // Its attributes: the permission check before a write-back create there.
                sh.dir_attrs.put(ino, a.clone(), sh.ttl);
            }
            reply.entry(&sh.ttl, &fattr(&a, ino), 0)
        });
    }

    fn remove(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty, dir: bool) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(parent).and_then(|p| join(&p, name)) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let name = name.to_string_lossy().into_owned();
        if !dir {
            let _recall_waits = self.sh.wb_gate.read().unwrap();
            if self.unlink_here(&ctx, parent, &name, &path) {
                return reply.ok();
            }
        }
        self.spawn(move |sh, c| {
            sh.wait_name(&path);
            let op = if dir { Op::Rmdir { path: path.clone() } } else { Op::Unlink { path: path.clone() } };
            match sh.rpc.call(c, &ctx, op) {
                Ok(body) => {
                    match body {
                        Body::Removed { parent: pa } => sh.dir_attrs.put(parent, pa, sh.ttl),
                        _ => sh.dir_attrs.drop_ino(parent),
                    }
                    sh.complete.removed(parent, &name);
                    sh.mark_stale(&path, None);
                    reply.ok()
                }
                Err(e) => reply.error(e),
            }
        });
    }
}
