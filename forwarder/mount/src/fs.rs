//! The FUSE file system: every operation becomes one request to the forwarding layer.
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
use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::consts::{FOPEN_DIRECT_IO, FUSE_WRITE_KILL_PRIV};
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use pharos_fwd_proto::{errno, Attr, Body, Cap, Ctx, DirEntry, Kind, Op, SetAttr, Time};

use crate::rpc::{Conns, Rpc};

pub const ROOT: u64 = 1;
const STALE: &str = "\0stale";

type Task = Box<dyn FnOnce(&mut Conns) + Send>;

/// Job id and rank of processes, cached per pid (bounded, 30 s TTL against pid reuse), by the
/// rule the eBPF agent applies too (`pharos-attribution`, proto/attribution): the job from the
/// `job_<ID>` component of the cgroup v2 path only (never the environment: a user can set
/// PHAROS_JOB_ID, not join a cgroup), the rank from the innermost launcher's variable (PMI_RANK,
/// PMIX_RANK, OMPI_COMM_WORLD_RANK, PHAROS_RANK, SLURM_PROCID), else the cgroup path's
/// `rank_<r>` / `task_<r>`. The process is alive: it is waiting for this request.
pub struct JobCache {
    m: Mutex<HashMap<u32, (Instant, String, i32)>>,
}

const JOB_CACHE_MAX: usize = 8192;
const JOB_TTL: Duration = Duration::from_secs(30);

/// Job id ("" none) and rank (-1 none) from /proc/<pid>/cgroup text and the environment block
/// (None: unreadable).
pub fn job_from_cgroup(cgroup: &str, environ: Option<&[u8]>) -> (String, i32) {
    pharos_attribution::attribute(cgroup, environ)
}

/// The environment block of `pid`, None when unreadable.
fn env_of(pid: u32) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/environ")).ok()
}

impl JobCache {
    pub fn new() -> JobCache {
        JobCache { m: Mutex::new(HashMap::new()) }
    }

    pub fn get(&self, pid: u32) -> (String, i32) {
        if pid == 0 {
            return (String::new(), -1);
        }
        if let Some((t, j, r)) = self.m.lock().unwrap().get(&pid) {
            if t.elapsed() < JOB_TTL {
                return (j.clone(), *r);
            }
        }
        let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return (String::new(), -1); // gone: nothing to cache
        };
        let (job, rank) = job_from_cgroup(&cgroup, env_of(pid).as_deref());
        let mut m = self.m.lock().unwrap();
        if m.len() >= JOB_CACHE_MAX {
            m.clear();
        }
        m.insert(pid, (Instant::now(), job.clone(), rank));
        (job, rank)
    }
}

impl Default for JobCache {
    fn default() -> Self {
        Self::new()
    }
}

struct Inode {
    path: String,
    nlookup: u64,
}

struct Open {
    /// Attributes at open (an fstat of the open file once its last name is gone).
    attr: Attr,
    ino: u64,
    /// What the daemon granted: layout, open handle (released with it; keeps unlinked data
    /// alive) and rights, signed.
    cap: Cap,
    /// The file may have setuid/setgid set (at open, or a chmod through this mount since):
    /// the next write the kernel flags `FUSE_WRITE_KILL_PRIV` (a writer without
    /// `CAP_FSETID`; set on every direct-I/O write of such a caller) clears them first.
    suidgid: AtomicBool,
}

impl Open {
    fn new(attr: Attr, ino: u64, cap: Cap) -> Open {
        let suidgid = AtomicBool::new(attr.perm & SUIDGID != 0);
        Open { attr, ino, cap, suidgid }
    }
}

const SUIDGID: u32 = 0o6000;

pub struct Shared {
    pub rpc: Rpc,
    pub jobs: JobCache,
    inodes: Mutex<HashMap<u64, Inode>>,
    files: Mutex<HashMap<u64, Arc<Open>>>,
    /// Open directories: the page of entries fetched last (Readdir is paginated by cookie).
    dirs: Mutex<HashMap<u64, Option<Arc<DirPage>>>>,
    groups: crate::creds::GroupsCache,
    next_fh: AtomicU64,
    ttl: Duration,
    /// `FOPEN_*` flags of every open and create reply: [`FOPEN_DIRECT_IO`], plus
    /// [`FOPEN_PARALLEL_DIRECT_WRITES`] with `--parallel-writes`.
    open_flags: u32,
    pub ops: AtomicU64,
}

/// `FOPEN_PARALLEL_DIRECT_WRITES` (FUSE protocol 7.36, Linux 6.2; not in fuser 0.15's
/// constants): the kernel lets direct writes to one file inside its size reach the file system
/// concurrently, instead of one at a time under the inode lock. Writes that extend the file,
/// and O_APPEND writes, stay serialised by the kernel. Older kernels ignore the bit.
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

pub struct PharosFs {
    pub sh: Arc<Shared>,
    pool: Arc<TaskQueue>,
}

fn ftime(t: Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH
    }
}

/// One page of a directory listing from the daemon: the entries after cookie `start`.
struct DirPage {
    start: u64,
    entries: Vec<DirEntry>,
    eof: bool,
}

fn ftype(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
        Kind::File | Kind::Other => FileType::RegularFile,
    }
}

fn fattr(a: &Attr, ino: u64) -> FileAttr {
    FileAttr {
        ino,
        size: a.size,
        blocks: a.blocks,
        atime: ftime(a.atime),
        mtime: ftime(a.mtime),
        ctime: ftime(a.ctime),
        crtime: ftime(a.ctime),
        kind: ftype(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: 1 << 20,
        flags: 0,
    }
}

fn join(parent: &str, name: &OsStr) -> Result<String, i32> {
    let name = name.to_str().ok_or(errno::EINVAL)?;
    if parent == STALE {
        return Err(errno::ENOENT);
    }
    Ok(if parent.is_empty() { name.to_string() } else { format!("{parent}/{name}") })
}

fn tott(t: Option<TimeOrNow>) -> Option<Option<Time>> {
    t.map(|t| match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(st) => {
            let d = st.duration_since(UNIX_EPOCH).unwrap_or_default();
            Some(Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() })
        }
    })
}

impl Shared {
    fn path(&self, ino: u64) -> Result<String, i32> {
        match self.inodes.lock().unwrap().get(&ino) {
            Some(i) if i.path != STALE => Ok(i.path.clone()),
            _ => Err(errno::ENOENT),
        }
    }

    /// Remembers `path` for the backend inode `ino` (one more kernel lookup). Returns the
    /// inode number the kernel sees (the root stays 1).
    fn learn(&self, ino: u64, path: &str) -> u64 {
        let mut m = self.inodes.lock().unwrap();
        let e = m.entry(ino).or_insert(Inode { path: path.to_string(), nlookup: 0 });
        e.path = path.to_string();
        e.nlookup += 1;
        ino
    }

    fn mark_stale(&self, path: &str, keep: Option<u64>) {
        let mut m = self.inodes.lock().unwrap();
        for (ino, i) in m.iter_mut() {
            if i.path == path && Some(*ino) != keep && *ino != ROOT {
                i.path = STALE.to_string();
            }
        }
    }

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

impl PharosFs {
    /// A file system over `rpc`, `threads` I/O threads, attribute TTL `ttl`; with
    /// `parallel_writes`, files are opened [`FOPEN_PARALLEL_DIRECT_WRITES`].
    pub fn new(rpc: Rpc, threads: usize, ttl: Duration, parallel_writes: bool) -> PharosFs {
        let mut inodes = HashMap::new();
        inodes.insert(ROOT, Inode { path: String::new(), nlookup: u64::MAX / 2 });
        let sh = Arc::new(Shared {
            rpc,
            jobs: JobCache::new(),
            inodes: Mutex::new(inodes),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            groups: crate::creds::GroupsCache::default(),
            next_fh: AtomicU64::new(1),
            ttl,
            open_flags: FOPEN_DIRECT_IO | if parallel_writes { FOPEN_PARALLEL_DIRECT_WRITES } else { 0 },
            ops: AtomicU64::new(0),
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

impl Drop for PharosFs {
    fn drop(&mut self) {
        self.pool.close();
    }
}

/// The I/O pool's bounded task queue: idle threads block on a condition variable (no
/// spinning or yielding while waiting, unlike a spin-then-park channel: with many idle
/// threads that burned CPU on every wakeup), one thread is woken per task.
pub struct TaskQueue {
    q: Mutex<(VecDeque<Task>, bool)>,
    ready: Condvar,
    room: Condvar,
    cap: usize,
}

impl TaskQueue {
    fn new(cap: usize) -> TaskQueue {
        TaskQueue {
            q: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
            room: Condvar::new(),
            cap: cap.max(1),
        }
    }

    /// Queues `t`; blocks while the queue is full (backpressure towards the kernel).
    fn push(&self, t: Task) {
        let mut g = self.q.lock().unwrap();
        while g.0.len() >= self.cap && !g.1 {
            g = self.room.wait(g).unwrap();
        }
        g.0.push_back(t);
        drop(g);
        self.ready.notify_one();
    }

    /// Next task; `None` once closed and drained.
    fn pop(&self) -> Option<Task> {
        let mut g = self.q.lock().unwrap();
        loop {
            if let Some(t) = g.0.pop_front() {
                drop(g);
                self.room.notify_one();
                return Some(t);
            }
            if g.1 {
                return None;
            }
            g = self.ready.wait(g).unwrap();
        }
    }

    fn close(&self) {
        self.q.lock().unwrap().1 = true;
        self.ready.notify_all();
        self.room.notify_all();
    }
}

impl Filesystem for PharosFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        let _ = config.add_capabilities(fuser::consts::FUSE_ASYNC_DIO | fuser::consts::FUSE_PARALLEL_DIROPS);
        Ok(())
    }

    fn lookup(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(parent).and_then(|p| join(&p, name)) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        self.spawn(move |sh, c| match sh.rpc.call(c, &ctx, Op::Lookup { path: path.clone() }) {
            Ok(Body::Attr(a)) => {
                let ino = sh.learn(a.ino, &path);
                reply.entry(&sh.ttl, &fattr(&a, ino), 0)
            }
            Ok(_) => reply.error(errno::EIO),
            Err(e) => reply.error(e),
        });
    }

    fn forget(&mut self, _req: &Request<'_>, ino: u64, nlookup: u64) {
        if ino == ROOT {
            return;
        }
        let mut m = self.sh.inodes.lock().unwrap();
        if let Some(i) = m.get_mut(&ino) {
            i.nlookup = i.nlookup.saturating_sub(nlookup);
            if i.nlookup == 0 {
                m.remove(&ino);
            }
        }
    }

    fn getattr(&mut self, req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
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
        self.spawn(move |sh, c| match sh.rpc.call(c, &ctx, Op::Getattr { path }) {
            Ok(Body::Attr(a)) => reply.attr(&sh.ttl, &fattr(&a, kino)),
            Ok(_) => reply.error(errno::EIO),
            Err(e) => reply.error(e),
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
        // Through an open file (ftruncate): its capability (the open already checked the access).
        let fd = fh.and_then(|fh| self.sh.files.lock().unwrap().get(&fh).map(|f| f.cap.clone()));
        if mode.is_some_and(|m| m & SUIDGID != 0) {
            // chmod u+s/g+s through this mount: open files' next flagged write clears them again.
            for f in self.sh.files.lock().unwrap().values().filter(|f| f.ino == ino) {
                f.suidgid.store(true, Relaxed);
            }
        }
        self.spawn(move |sh, c| match sh.rpc.call(c, &ctx, Op::Setattr { path, set, fd }) {
            Ok(Body::Attr(a)) => reply.attr(&sh.ttl, &fattr(&a, ino)),
            Ok(_) => reply.error(errno::EIO),
            Err(e) => reply.error(e),
        });
    }

    fn mkdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(parent).and_then(|p| join(&p, name)) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let mode = mode & !umask;
        self.entry_op(ctx, path.clone(), Op::Mkdir { path, mode }, reply);
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
        self.spawn(move |sh, c| {
            match sh.rpc.call(c, &ctx, Op::Rename { from: from.clone(), to: to.clone(), noreplace }) {
                Ok(_) => {
                    let mut m = sh.inodes.lock().unwrap();
                    let moved: Vec<u64> = m.iter().filter(|(_, i)| i.path == from).map(|(k, _)| *k).collect();
                    // The entry replaced at `to` (if any) is gone.
                    for (ino, i) in m.iter_mut() {
                        if i.path == to && !moved.contains(ino) && *ino != ROOT {
                            i.path = STALE.to_string();
                        }
                    }
                    let pre = format!("{from}/");
                    for i in m.values_mut() {
                        if i.path == from {
                            i.path = to.clone();
                        } else if let Some(rest) = i.path.strip_prefix(&pre) {
                            i.path = format!("{to}/{rest}");
                        }
                    }
                    drop(m);
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
        self.spawn(move |sh, c| {
            match sh.rpc.call(c, &ctx, Op::Create { path: path.clone(), mode: mode & !umask & 0o7777, flags, token }) {
                Ok(Body::Opened { attr, cap }) => {
                    let ino = sh.learn(attr.ino, &path);
                    let fh = sh.next_fh.fetch_add(1, Relaxed);
                    sh.files.lock().unwrap().insert(fh, Arc::new(Open::new(attr.clone(), ino, cap)));
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
        self.spawn(move |sh, c| match sh.rpc.call(c, &ctx, Op::Open { path, flags }) {
            Ok(Body::Opened { attr, cap }) => {
                let fh = sh.next_fh.fetch_add(1, Relaxed);
                sh.files.lock().unwrap().insert(fh, Arc::new(Open::new(attr, ino, cap)));
                reply.opened(fh, sh.open_flags)
            }
            Ok(_) => reply.error(errno::EIO),
            Err(e) => reply.error(e),
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
        let ctx = self.sh.ctx(req);
        let Some(f) = self.sh.files.lock().unwrap().get(&fh).cloned() else { return reply.error(errno::EBADF) };
        let path = self.sh.path(ino).unwrap_or_default();
        if offset < 0 {
            return reply.error(errno::EINVAL);
        }
        self.spawn(move |sh, c| {
            let slot = sh.rpc.shm.as_ref().and_then(|s| s.get(size as usize)).map(|s| (s, size));
            let op = Op::Read { path, cap: f.cap.clone(), offset: offset as u64, size };
            match sh.rpc.call_slot(c, &ctx, op, slot) {
                Ok(Body::Data { data }) => {
                    reply.data(&data);
                    sh.rpc.bufs.put(data);
                }
                Ok(Body::ShmData { len }) if slot.is_some() && len <= size => {
                    // SAFETY: the slot is ours until put back; the daemon is done with it.
                    let slots = sh.rpc.shm.as_ref().unwrap();
                    reply.data(unsafe { slots.bytes(slot.unwrap().0, len as usize) });
                }
                Ok(_) => reply.error(errno::EIO),
                Err(e) => reply.error(e),
            }
            if let (Some((s, _)), Some(slots)) = (slot, &sh.rpc.shm) {
                slots.put(s);
            }
        });
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
        let ctx = self.sh.ctx(req);
        let Some(f) = self.sh.files.lock().unwrap().get(&fh).cloned() else { return reply.error(errno::EBADF) };
        let path = self.sh.path(ino).unwrap_or_default();
        if offset < 0 {
            return reply.error(errno::EINVAL);
        }
        // One copy out of the session's buffer: into a slot of the shared-memory region (the
        // daemon writes the objects from there), else into a pooled buffer (no allocation).
        let slot = self.sh.rpc.shm.as_ref().and_then(|s| s.get(data.len())).map(|s| (s, data.len() as u32));
        let data = match (slot, &self.sh.rpc.shm) {
            (Some((s, len)), Some(slots)) => {
                // SAFETY: the slot was just taken from the free list: only this request has it.
                unsafe { slots.bytes(s, len as usize) }.copy_from_slice(data);
                Vec::new()
            }
            _ => {
                let mut buf = self.sh.rpc.bufs.get();
                buf.clear();
                buf.extend_from_slice(data);
                buf
            }
        };
        // A writer without CAP_FSETID clears setuid/setgid (Linux's file_remove_privs): the
        // daemon does it once per open, before the first such write, if the file had them.
        let kill = wflags & FUSE_WRITE_KILL_PRIV != 0 && f.suidgid.swap(false, Relaxed);
        self.spawn(move |sh, c| {
            if kill {
                let op = Op::KillSuidgid { path: path.clone(), cap: f.cap.clone() };
                if let Err(e) = sh.rpc.call(c, &ctx, op) {
                    log::warn!("clearing setuid/setgid of {path:?} before a write: errno {e}");
                }
            }
            let op = Op::Write { path, cap: f.cap.clone(), offset: offset as u64, data };
            match sh.rpc.call_slot(c, &ctx, op, slot) {
                Ok(Body::Written(n)) => reply.written(n),
                Ok(_) => reply.error(errno::EIO),
                Err(e) => reply.error(e),
            }
            if let (Some((s, _)), Some(slots)) = (slot, &sh.rpc.shm) {
                slots.put(s);
            }
        });
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _lock: u64, reply: ReplyEmpty) {
        // No client-side data cache: nothing to write back.
        if self.sh.files.lock().unwrap().contains_key(&fh) {
            reply.ok()
        } else {
            reply.error(errno::EBADF)
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
        let ctx = self.sh.ctx(req);
        let Some(f) = self.sh.files.lock().unwrap().remove(&fh) else { return reply.error(errno::EBADF) };
        let path = self.sh.path(ino).unwrap_or_default();
        self.spawn(move |sh, c| {
            // close(2) does not report release errors; the daemon counts failures.
            let _ = sh.rpc.call(c, &ctx, Op::Release { path, cap: f.cap.clone() });
            reply.ok()
        });
    }

    fn fsync(&mut self, req: &Request<'_>, ino: u64, fh: u64, datasync: bool, reply: ReplyEmpty) {
        let ctx = self.sh.ctx(req);
        let Some(f) = self.sh.files.lock().unwrap().get(&fh).cloned() else { return reply.error(errno::EBADF) };
        let path = self.sh.path(ino).unwrap_or_default();
        self.spawn(move |sh, c| match sh.rpc.call(c, &ctx, Op::Fsync { path, cap: f.cap.clone(), datasync }) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
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

    fn readdir(&mut self, req: &Request<'_>, ino: u64, fh: u64, offset: i64, mut reply: ReplyDirectory) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let cached = match self.sh.dirs.lock().unwrap().get(&fh) {
            None => return reply.error(errno::EBADF),
            Some(c) => c.clone(),
        };
        self.spawn(move |sh, c| {
            // The daemon lists a page at a time from a cookie (the namespace's directory
            // offset), which is also the offset handed to the kernel: the kernel continues
            // from any entry, served from the handle's last page while it covers it. Offset 0
            // (opendir, rewinddir) always fetches anew.
            let mut pos = offset.max(0) as u64;
            let mut page = cached.filter(|_| pos != 0);
            loop {
                let from = page.as_ref().and_then(|p| {
                    if p.start == pos {
                        Some(0)
                    } else {
                        p.entries.iter().position(|e| e.next == pos).map(|i| i + 1)
                    }
                });
                let (p, from) = match (page.take(), from) {
                    (Some(p), Some(i)) => (p, i),
                    _ => match sh.rpc.call(c, &ctx, Op::Readdir { path: path.clone(), cookie: pos }) {
                        Ok(Body::Entries { entries, eof }) => {
                            let p = Arc::new(DirPage { start: pos, entries, eof });
                            if let Some(slot) = sh.dirs.lock().unwrap().get_mut(&fh) {
                                *slot = Some(p.clone());
                            }
                            (p, 0)
                        }
                        Ok(_) => return reply.error(errno::EIO),
                        Err(e) => return reply.error(e),
                    },
                };
                for e in &p.entries[from..] {
                    let (eino, k) = match e.name.as_str() {
                        "." => (ino, FileType::Directory),
                        ".." => (ROOT, FileType::Directory),
                        _ => (e.ino, ftype(e.kind)),
                    };
                    if reply.add(eino, e.next as i64, k, &e.name) {
                        return reply.ok();
                    }
                    pos = e.next;
                }
                if p.eof || p.entries.is_empty() {
                    return reply.ok();
                }
                // This page is used up: the next one starts after its last entry.
            }
        });
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
            Ok(path) => self.entry_op(ctx, path.clone(), Op::Symlink { path, target }, reply),
            Err(e) => reply.error(e),
        }
    }

    fn link(&mut self, req: &Request<'_>, ino: u64, newparent: u64, newname: &OsStr, reply: ReplyEntry) {
        let ctx = self.sh.ctx(req);
        match (self.sh.path(ino), self.sh.path(newparent).and_then(|p| join(&p, newname))) {
            (Ok(from), Ok(to)) => self.entry_op(ctx, to.clone(), Op::Link { from, to }, reply),
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
            Ok(path) => self.entry_op(ctx, path.clone(), Op::Mknod { path, mode, rdev: rdev as u64 }, reply),
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
    fn entry_op(&self, ctx: Ctx, path: String, op: Op, reply: ReplyEntry) {
        self.spawn(move |sh, c| match sh.rpc.call(c, &ctx, op) {
            Ok(Body::Attr(a)) => {
                let ino = sh.learn(a.ino, &path);
                reply.entry(&sh.ttl, &fattr(&a, ino), 0)
            }
            Ok(_) => reply.error(errno::EIO),
            Err(e) => reply.error(e),
        });
    }

    fn remove(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty, dir: bool) {
        let ctx = self.sh.ctx(req);
        let path = match self.sh.path(parent).and_then(|p| join(&p, name)) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        self.spawn(move |sh, c| {
            let op = if dir { Op::Rmdir { path: path.clone() } } else { Op::Unlink { path: path.clone() } };
            match sh.rpc.call(c, &ctx, op) {
                Ok(_) => {
                    sh.mark_stale(&path, None);
                    reply.ok()
                }
                Err(e) => reply.error(e),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared attribution vectors (proto/attribution/vectors.json) through the mount's
    /// attribution: /proc/<pid>/cgroup text and environment → job and rank.
    #[test]
    fn attribution_vectors() {
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(pharos_attribution::VECTORS).unwrap()).unwrap();
        for c in doc["cases"].as_array().unwrap() {
            let env = c["environ"]
                .as_array()
                .map(|vars| vars.iter().map(|v| format!("{}\0", v.as_str().unwrap())).collect::<String>().into_bytes());
            let want = (c["job"].as_str().unwrap().to_string(), c["rank"].as_i64().unwrap() as i32);
            assert_eq!(job_from_cgroup(c["cgroup"].as_str().unwrap(), env.as_deref()), want, "case {}", c["name"]);
        }
    }

    /// A live process: its cgroup decides the job (a PHAROS_JOB_ID it sets is ignored), its
    /// environment the rank.
    #[test]
    fn job_cache_reads_a_live_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .env("PHAROS_JOB_ID", "spoofed")
            .env("PHAROS_RANK", "1")
            .env("PMI_RANK", "3")
            .spawn()
            .unwrap();
        let pid = child.id();
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let got = JobCache::new().get(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        let in_job = !pharos_attribution::JobCgroup::from_proc_cgroup(&cgroup).job.is_empty();
        assert_ne!(got.0, "spoofed");
        assert_eq!(got, job_from_cgroup(&cgroup, Some(b"PHAROS_RANK=1\0PMI_RANK=3\0")));
        assert_eq!(got.1, if in_job { 3 } else { -1 });
    }
}
