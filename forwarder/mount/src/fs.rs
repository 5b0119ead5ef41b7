//! The FUSE file system: every operation becomes one request to the forwarding layer, but
//! what the mount answers itself (absent names and directory attributes in directories it
//! knows whole, and creates in node-local rank directories: `writeback.rs`).
//!
//! No data cache: files are opened `FOPEN_DIRECT_IO`, attribute and entry TTLs are
//! `--attr-ttl-ms` (0 by default). The fuser session thread only decodes; each operation
//! runs on a bounded pool of `--threads` threads (each with its own connections) and
//! replies from there, so slow requests do not serialise the mount.
//!
//! Inode numbers are the namespace's (the MDT directory's) inode numbers, so every
//! forwarding node gives the same answer and failover is transparent; the mount keeps
//! ino → path (with kernel lookup counts) and fh → capability (the layout, open handle and
//! rights the daemon signed at open). Data requests carry the capability, so an open file
//! survives renames, and the daemon acts only on what it granted.

//!
//! Where things are: this file holds the mount's state ([`Shared`]: inodes, open files and
//! directories) and the file system ([`PharosFs`]) with its I/O pool (`pool.rs`); `ops.rs`
//! the FUSE operations, `data.rs` their data path (read, write), `attr.rs` the conversions
//! between the wire's attributes and FUSE's, `jobs.rs` the job and rank of a request.
mod attr;
mod complete;
mod data;
mod dir;
mod dirattrs;
mod inodes;
mod jobs;
mod ops;
mod pool;
mod writeback;
mod writeback_path;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::consts::FOPEN_DIRECT_IO;
use fuser::Request;
use pharos_fwd_proto::{errno, Attr, Cap, Ctx, DirEntry};

use crate::rpc::{Conns, Rpc};
use jobs::JobCache;
use pool::TaskQueue;
pub use writeback::RefusedHook;

/// Inode number of the mount's root (FUSE's `FUSE_ROOT_ID`); stands for the namespace root.
pub const ROOT: u64 = 1;
/// The path of an inode whose name is gone (unlinked, or replaced by a rename): not a valid
/// path, so nothing resolves to it.
const STALE: &str = "\0stale";

/// The daemon's grant of an open file: known, or to come with its write-back create.
enum Grant {
    /// What the daemon granted: layout, open handle (released with it; keeps unlinked data
    /// alive) and rights, signed.
    Cap(Cap),
    /// A create the mount answered itself (`writeback.rs`): the capability comes with the
    /// daemon's answer.
    Pending(Arc<writeback::PendingCreate>),
}

/// An open file (a FUSE file handle).
struct Open {
    /// Attributes at open (an fstat of the open file once its last name is gone).
    attr: Attr,
    ino: u64,
    grant: Grant,
    /// The file may have setuid/setgid set (at open, or a chmod through this mount since):
    /// the next write the kernel flags `FUSE_WRITE_KILL_PRIV` (a writer without
    /// `CAP_FSETID`; set on every direct-I/O write of such a caller) clears them first.
    suidgid: AtomicBool,
    /// The job and rank that opened it: the release, which the kernel often sends with no
    /// process (pid 0, no job), goes where that job's requests go, so the forwarding node that
    /// gathered the open's writes flushes them at close.
    job: (String, i32),
}

impl Open {
    /// The open of inode `ino` with attributes `attr` at open and capability `cap`, made by
    /// a request with context `ctx`.
    fn new(attr: Attr, ino: u64, cap: Cap, ctx: &Ctx) -> Open {
        Open::granted(attr, ino, Grant::Cap(cap), ctx)
    }

    fn granted(attr: Attr, ino: u64, grant: Grant, ctx: &Ctx) -> Open {
        let suidgid = AtomicBool::new(attr.perm & SUIDGID != 0);
        Open { attr, ino, grant, suidgid, job: (ctx.job_id.clone(), ctx.rank) }
    }

    /// The open's capability; for a write-back create, once the daemon made the file (waits).
    /// Errors: the errno the daemon refused the create with.
    fn cap(&self) -> Result<Cap, i32> {
        match &self.grant {
            Grant::Cap(c) => Ok(c.clone()),
            Grant::Pending(p) => p.wait(),
        }
    }

    /// The errno of this open's write-back create, when it is known to have failed.
    fn failed(&self) -> Option<i32> {
        match &self.grant {
            Grant::Cap(_) => None,
            Grant::Pending(p) => p.failed(),
        }
    }
}

/// Whether `path` is inside a node-local rank directory (`/.nodelocal/<job>/<rank>/...`, the
/// forwarding daemon's `backend/nodelocal.rs`): written by this compute node only, so the
/// names of a directory this mount made there are all known here, whatever
/// `--answer-absent-names` says.
pub fn node_local(path: &str) -> bool {
    node_local_depth(path) >= 3
}

/// The components of `path` below `/.nodelocal` (`<job>/<rank>/...`; 0 elsewhere).
pub fn node_local_depth(path: &str) -> usize {
    let rel = path.trim_start_matches('/');
    rel.strip_prefix(".nodelocal/").map_or(0, |r| r.split('/').count())
}

/// Longest name the namespace's file systems take (ext4, XFS): a longer one is never answered
/// by the mount (the daemon answers `ENAMETOOLONG`).
pub const NAME_MAX: usize = 255;

/// How long a directory this mount made in a node-local rank directory (or the rank directory
/// itself) is known whole: no other compute node changes names there (they get `EROFS`), so
/// far longer than the attribute TTL that bounds it elsewhere.
pub const NODE_LOCAL_KNOWN: Duration = Duration::from_secs(3600);

/// Most write-back tasks (creates, releases) an executor thread sends in one pipelined batch.
const WRITEBACK_BATCH: usize = 128;

/// The setuid and setgid permission bits.
const SUIDGID: u32 = 0o6000;

/// The mount's state, shared by the session thread and the I/O threads.
pub struct Shared {
    /// The connections to the forwarding nodes (routing, failover, data buffers and slots).
    pub rpc: Rpc,
    /// Job and rank of the processes making requests.
    pub jobs: JobCache,
    inodes: Mutex<inodes::Inodes>,
    files: Mutex<HashMap<u64, Arc<Open>>>,
    /// Open directories: the page of entries fetched last (Readdir is paginated by cookie).
    dirs: Mutex<HashMap<u64, Option<Arc<DirPage>>>>,
    groups: crate::creds::GroupsCache,
    next_fh: AtomicU64,
    ttl: Duration,
    /// `FOPEN_*` flags of every open and create reply: [`FOPEN_DIRECT_IO`] and
    /// [`FOPEN_NOFLUSH`], plus [`FOPEN_PARALLEL_DIRECT_WRITES`] with `--parallel-writes`.
    open_flags: u32,
    /// FUSE operations handed to the I/O pool (`/status` and `/metrics`: `ops`).
    pub ops: AtomicU64,
    /// Directories whose every name this mount knows (`complete.rs`).
    pub complete: complete::Complete,
    /// Answer lookups of absent names in directories this mount made (`--answer-absent-names`).
    pub answer_absent: bool,
    /// Directories' attributes as the daemon answered them after a change (`dirattrs.rs`).
    pub dir_attrs: dirattrs::DirAttrs,
    /// Creates answered by the mount (node-local rank directories and directories it holds),
    /// pending at the daemon (`writeback.rs`).
    pub wb: writeback::WriteBack,
    /// Held by a create from its write-back check to its queueing (read), and by a recall
    /// between ending the directory's knowledge and waiting for its pending creates (write):
    /// no create answered here slips past a recall.
    pub wb_gate: std::sync::RwLock<()>,
}

/// `FOPEN_PARALLEL_DIRECT_WRITES` (FUSE protocol 7.36, Linux 6.2; not in fuser 0.15's
/// constants): the kernel lets direct writes to one file inside its size reach the file system
/// concurrently, instead of one at a time under the inode lock. Writes that extend the file,
/// and O_APPEND writes, stay serialised by the kernel. Older kernels ignore the bit.
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

/// `FOPEN_NOFLUSH` (FUSE protocol 7.35, Linux 5.16; not in fuser 0.15's constants): close(2)
/// sends no FLUSH. The mount has no data cache and no POSIX locks of its own (the kernel's
/// local locks), so a FLUSH had nothing to do: one request less per close. A write-back
/// create's refusal is reported at the file's next operation and at fsync, not at close
/// (`writeback.rs`; close could not wait for a create still in flight anyway). Older kernels
/// ignore the bit and send FLUSH, answered as before (`flush` in `ops.rs`).
pub const FOPEN_NOFLUSH: u32 = 1 << 5;

/// The FUSE file system (`fuser::Filesystem`, in `ops.rs`) and its I/O pool, whose threads
/// stop when it is dropped.
pub struct PharosFs {
    /// The state, also read by the admin interface.
    pub sh: Arc<Shared>,
    pool: Arc<TaskQueue>,
}

/// One page of a directory listing from the daemon: the entries after cookie `start`.
struct DirPage {
    start: u64,
    entries: Vec<DirEntry>,
    /// Each entry's attributes (a READDIRPLUS page; empty for a plain one).
    attrs: Vec<Option<Attr>>,
    eof: bool,
}

impl Shared {
    /// The namespace path of inode `ino`. Errors: `ENOENT` for an unknown or stale inode.
    fn path(&self, ino: u64) -> Result<String, i32> {
        match self.inodes.lock().unwrap().path(ino) {
            Some(p) if p != STALE => Ok(p.to_string()),
            _ => Err(errno::ENOENT),
        }
    }

    /// Remembers `path` for the backend inode `ino` (one more kernel lookup). Returns the
    /// inode number the kernel sees (the root stays 1).
    fn learn(&self, ino: u64, path: &str) -> u64 {
        let ino = self.wb.kernel_ino(ino);
        self.inodes.lock().unwrap().learn(ino, path);
        ino
    }

    /// Marks the inodes at `path` stale (but `keep` and the root): their name is gone.
    fn mark_stale(&self, path: &str, keep: Option<u64>) {
        self.inodes.lock().unwrap().drop_name(path, keep);
    }

    /// The request context of a FUSE request: caller's job and rank, pid, credentials and
    /// supplementary groups, this compute node.
    fn ctx(&self, req: &Request<'_>) -> Ctx {
        let (job_id, rank) = self.jobs.get(req.pid());
        Ctx {
            job_id,
            rank,
            pid: req.pid(),
            uid: req.uid(),
            gid: req.gid(),
            compute_node: self.rpc.compute_node.clone(),
            groups: self.groups.get(req.pid(), req.uid(), req.gid()),
        }
    }
}

impl Shared {
    /// Applies the changes another mount made (pushed by a forwarding node): what this mount
    /// answers itself first, then the kernel's caches (`invalidate`). The inode table keeps its
    /// names: the kernel looks a changed name up again, and the name looked up last is the one
    /// an inode is reached by (dropping it here raced with that lookup: an open of a file just
    /// made on another node found no path).
    pub fn changed_elsewhere(
        &self,
        changes: &[pharos_fwd_proto::Change],
        invalidate: impl Fn(&[pharos_fwd_proto::Change]),
    ) {
        use pharos_fwd_proto::Change;
        for c in changes {
            match c {
                Change::Entry { parent, .. } => {
                    self.complete.drop_dir(*parent);
                    self.dir_attrs.drop_ino(*parent);
                }
                Change::Inode { ino } => self.dir_attrs.drop_ino(*ino),
                Change::Recall { dir } => {
                    // No more answers here for `dir`; then its pending creates reach the daemon
                    // (the acknowledgement follows this: the other mount's request waits).
                    {
                        let _creates_queued = self.wb_gate.write().unwrap();
                        self.complete.recall(*dir);
                    }
                    self.wb.wait_under(&self.path(*dir).unwrap_or_default());
                }
            }
        }
        invalidate(changes);
    }
}

impl PharosFs {
    /// A file system over `rpc`, `threads` I/O threads, attribute TTL `ttl`; with
    /// `parallel_writes`, files are opened [`FOPEN_PARALLEL_DIRECT_WRITES`].
    pub fn new(rpc: Rpc, threads: usize, ttl: Duration, parallel_writes: bool) -> PharosFs {
        let sh = Arc::new(Shared {
            rpc,
            jobs: JobCache::new(),
            inodes: Mutex::new(inodes::Inodes::new()),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            groups: crate::creds::GroupsCache::default(),
            next_fh: AtomicU64::new(1),
            ttl,
            open_flags: FOPEN_DIRECT_IO
                | FOPEN_NOFLUSH
                | if parallel_writes { FOPEN_PARALLEL_DIRECT_WRITES } else { 0 },
            ops: AtomicU64::new(0),
            complete: complete::Complete::default(),
            answer_absent: false,
            dir_attrs: dirattrs::DirAttrs::default(),
            wb: writeback::WriteBack::default(),
            wb_gate: std::sync::RwLock::new(()),
        });
        let pool = Arc::new(TaskQueue::new(threads.max(1) * 4));
        for i in 0..threads.max(1) {
            let q = pool.clone();
            std::thread::Builder::new()
                .name(format!("mount-io-{i}"))
                .spawn(move || {
                    let mut conns = Conns::default();
                    while let Some(t) = q.pop() {
                        t(&mut conns);
                    }
                })
                .expect("spawn io thread");
        }
        PharosFs { sh, pool }
    }

    /// Runs `f` on the I/O pool (blocks the session thread when the pool is saturated:
    /// backpressure towards the kernel).
    fn spawn(&self, f: impl FnOnce(&Shared, &mut Conns) + Send + 'static) {
        let sh = self.sh.clone();
        sh.ops.fetch_add(1, Relaxed);
        self.pool.push(Box::new(move |c: &mut Conns| f(&sh, c)));
    }
}

impl PharosFs {
    /// Answers creates in node-local rank directories here, at most `max` pending at the daemon
    /// (`--writeback-creates`; 0: off), sent by `threads` executor threads with connections of
    /// their own (`writeback.rs`).
    pub fn start_writeback(&self, max: usize, threads: usize) {
        self.sh.wb.max.store(max, Relaxed);
        if max == 0 {
            return;
        }
        for i in 0..threads.max(1) {
            let sh = self.sh.clone();
            std::thread::Builder::new()
                .name(format!("mount-wb-{i}"))
                .spawn(move || {
                    let mut conns = Conns::default();
                    while let Some(batch) = sh.wb.next_batch(WRITEBACK_BATCH) {
                        let n = batch.len();
                        sh.send_batch(&mut conns, batch);
                        sh.wb.sent(n);
                    }
                })
                .expect("spawn write-back thread");
        }
    }
}

impl Drop for PharosFs {
    fn drop(&mut self) {
        self.pool.close();
        self.sh.wb.close();
    }
}
