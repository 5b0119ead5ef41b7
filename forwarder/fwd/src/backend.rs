//! Storage backend: a namespace directory (the MDT) and N target directories (the OSTs).
//!
//! * The namespace `<mdt>/ns` holds the directory tree. A regular file of the namespace is
//!   a small sidecar whose content is the file's layout
//!   (`pharos-layout v1 oid=<hex> stripe_size=<n> targets=<i,j,..> token=<n>`), written to
//!   `<mdt>/tmp` first and `link(2)`ed into place, so creation is atomic (EEXIST races are
//!   decided by the kernel) and other daemons never see a half-written layout.
//! * The data of stripe `s` of object `oid` is the file `<target dir>/<oid:016x>.<s>`.
//!   Striping is RAID-0 over the layout's targets in units of `stripe_size`.
//! * Open counts, token buckets and faults live in each target's shared state
//!   ([`crate::shm`]), so every daemon on the machine sees the same values.
//! * **Open files survive unlink** (POSIX). Every open (create, open) leaves a marker file
//!   `<mdt>/open/<oid:016x>/<daemon:016x>.<id:016x>` named by its [`OpenHandle`]; release
//!   (on any daemon) removes it. When a file's name goes (unlink, rename over it), its
//!   layout is written to `<mdt>/orphans/<oid:016x>` and its objects are deleted only if
//!   no marker exists; otherwise the release that removes the last marker deletes them and
//!   the orphan record. (Name removal happens before the marker check, marker removal
//!   before the orphan check, so one of the two always sees the other.) An open re-checks
//!   after placing its marker that the name still holds the same object, so an open racing
//!   an unlink either keeps the data alive or fails with ENOENT.
//! * **Daemon liveness**: each daemon holds an exclusive `flock` on
//!   `<mdt>/daemons/<daemon:016x>` for its lifetime. At start, a daemon garbage-collects:
//!   markers of daemons whose lock can be taken (dead), then orphans left without markers.
//!
//! Placement at create time (see [`Placement`]): round-robin over all targets by default;
//! with a pool, the performance-aware rule of the Sunway lessons §5: the target maximising
//! `max_perf / (open_count + 1)` among the pool's targets.
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use pharos_fwd_proto::{errno, validate_path, Attr, DirEntry, Kind, Layout, OpenHandle, SetAttr, StatFs, Time, WireError};
use serde::{Deserialize, Serialize};

use crate::shm::TargetShm;

/// One storage target (OST).
pub struct Target {
    pub name: String,
    pub dir: PathBuf,
    pub shm: TargetShm,
}

/// A placement pool: a set of targets and their planned performance (MB/s).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Pool {
    pub targets: Vec<String>,
    /// Planned MB/s per target; a target missing here uses its token-bucket limit, or 1.
    #[serde(default)]
    pub max_perf: BTreeMap<String, f64>,
    /// Targets per file (striping), default 1.
    #[serde(default)]
    pub stripe_count: Option<u32>,
}

/// Placement settings, replaced as a whole (atomically) by the admin interface.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Placement {
    #[serde(default)]
    pub pools: BTreeMap<String, Pool>,
    /// Pool used for jobs without an entry in `job_pools`; none = round-robin.
    #[serde(default)]
    pub default_pool: Option<String>,
    /// Job id -> pool name.
    #[serde(default)]
    pub job_pools: BTreeMap<String, String>,
    /// Stripe unit, bytes (default 1 MiB).
    #[serde(default)]
    pub stripe_size: Option<u64>,
    /// Targets per file for round-robin placement (default 1).
    #[serde(default)]
    pub stripe_count: Option<u32>,
}

pub type Res<T> = Result<T, WireError>;

pub fn werr(e: io::Error) -> WireError {
    WireError { errno: e.raw_os_error().unwrap_or(errno::EIO), msg: e.to_string() }
}
fn eno(n: i32, m: impl Into<String>) -> WireError {
    WireError { errno: n, msg: m.into() }
}

/// How long one piece of a data request spent where (for records and metrics).
#[derive(Default, Debug, Clone)]
pub struct IoInfo {
    /// Index of the first target touched, if any.
    pub target: Option<u32>,
    pub oid: u64,
    pub throttled: Duration,
}

const FD_CACHE_MAX: usize = 4096;
/// Shortest sleep of the injected slowdown; smaller stretches accumulate per thread.
pub const STRETCH_MIN_SLEEP: Duration = Duration::from_millis(1);

thread_local! {
    /// Slowdown owed by this worker thread, ns (negative: an overshoot credited).
    static STRETCH_DEBT_NS: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// Bytes `[off, off+len)` of one object file (see [`Backend::read_span`]).
pub struct FileSpan {
    pub file: Arc<File>,
    pub off: u64,
    pub len: usize,
    pub target: u32,
}

pub struct Backend {
    ns: PathBuf,
    tmp: PathBuf,
    open_dir: PathBuf,
    orphan_dir: PathBuf,
    pub targets: Vec<Target>,
    pub placement: ArcSwap<Placement>,
    rr: AtomicU64,
    fds: Mutex<HashMap<(u32, u64, u32), Arc<File>>>,
    /// This daemon instance's id (open handles, liveness lock).
    pub daemon_id: u64,
    open_seq: AtomicU64,
    /// Holds the exclusive flock on `<mdt>/daemons/<daemon_id>` while the daemon lives.
    _alive: File,
}

/// What a garbage collection found (daemon start).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct GcStats {
    pub dead_daemons: u64,
    pub stale_markers: u64,
    pub orphans_reaped: u64,
    pub orphans_kept: u64,
}

fn marker_name(h: OpenHandle) -> String {
    format!("{:016x}.{:016x}", h.daemon, h.id)
}

fn flock_nb(f: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
    if n != 8 {
        // getrandom cannot fail for 8 bytes on Linux >= 3.17; fall back to time ^ pid.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        return t ^ ((std::process::id() as u64) << 40);
    }
    u64::from_le_bytes(b)
}

fn kind_of(ft: fs::FileType) -> Kind {
    if ft.is_file() {
        Kind::File
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink
    } else {
        Kind::Other
    }
}

fn t(sec: i64, nsec: i64) -> Time {
    Time { sec, nsec: nsec as u32 }
}

/// Encodes a layout sidecar.
pub fn layout_text(l: &Layout, token: u64) -> String {
    let ts: Vec<String> = l.targets.iter().map(|t| t.to_string()).collect();
    format!("pharos-layout v1 oid={:016x} stripe_size={} targets={} token={}\n", l.oid, l.stripe_size, ts.join(","), token)
}

/// Decodes a layout sidecar; returns the layout and the create token.
pub fn parse_layout(s: &str) -> Option<(Layout, u64)> {
    let mut it = s.split_whitespace();
    if it.next()? != "pharos-layout" || it.next()? != "v1" {
        return None;
    }
    let (mut oid, mut ss, mut targets, mut token) = (None, None, None, 0);
    for kv in it {
        let (k, v) = kv.split_once('=')?;
        match k {
            "oid" => oid = u64::from_str_radix(v, 16).ok(),
            "stripe_size" => ss = v.parse().ok(),
            "targets" => targets = v.split(',').map(|x| x.parse().ok()).collect::<Option<Vec<u32>>>(),
            "token" => token = v.parse().ok()?,
            _ => {}
        }
    }
    let l = Layout { oid: oid?, stripe_size: ss?, targets: targets? };
    if l.stripe_size == 0 || l.targets.is_empty() {
        return None;
    }
    Some((l, token))
}

/// One contiguous piece of a logical byte range inside one stripe object.
#[derive(Debug, PartialEq)]
pub struct Piece {
    pub stripe: u32,
    pub obj_off: u64,
    pub len: u64,
    /// Offset of the piece within the request buffer.
    pub buf_off: u64,
}

/// Splits `[off, off+len)` of a file with layout `l` into per-object pieces (RAID-0).
pub fn pieces(l: &Layout, off: u64, len: u64) -> Vec<Piece> {
    let k = l.targets.len() as u64;
    let ss = l.stripe_size;
    let mut out = Vec::new();
    let mut pos = off;
    let end = off + len;
    while pos < end {
        let unit = pos / ss;
        let within = pos % ss;
        let n = (ss - within).min(end - pos);
        out.push(Piece { stripe: (unit % k) as u32, obj_off: (unit / k) * ss + within, len: n, buf_off: pos - off });
        pos += n;
    }
    out
}

/// Size of stripe object `i` when the file is `size` bytes long.
pub fn obj_size(l: &Layout, size: u64, i: u32) -> u64 {
    let k = l.targets.len() as u64;
    let ss = l.stripe_size;
    let full = size / ss;
    let rem = size % ss;
    let rows = full / k;
    let col = full % k;
    let i = i as u64;
    rows * ss + if i < col { ss } else if i == col { rem } else { 0 }
}

/// Logical file size implied by stripe object `i` having `s` bytes.
pub fn logical_from_obj(l: &Layout, i: u32, s: u64) -> u64 {
    if s == 0 {
        return 0;
    }
    let k = l.targets.len() as u64;
    let ss = l.stripe_size;
    let j = (s - 1) / ss;
    (j * k + i as u64) * ss + (s - 1) % ss + 1
}

impl Backend {
    /// Opens (creating directories if needed) a backend with namespace `<mdt>/ns` and the
    /// given `(name, dir)` targets.
    pub fn new(mdt: &Path, targets: &[(String, PathBuf)]) -> io::Result<Backend> {
        if targets.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no storage targets"));
        }
        let ns = mdt.join("ns");
        let tmp = mdt.join("tmp");
        let open_dir = mdt.join("open");
        let orphan_dir = mdt.join("orphans");
        let daemons = mdt.join("daemons");
        for d in [&ns, &tmp, &open_dir, &orphan_dir, &daemons] {
            fs::create_dir_all(d)?;
        }
        let mut ts = Vec::new();
        for (name, dir) in targets {
            fs::create_dir_all(dir)?;
            ts.push(Target { name: name.clone(), dir: dir.clone(), shm: TargetShm::open(dir)? });
        }
        // Liveness: lock a fresh file, then link it into daemons/ (never visible unlocked).
        let daemon_id = random_u64() | 1;
        let staged = tmp.join(format!("daemon-{daemon_id:016x}"));
        let alive = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&staged)?;
        flock_nb(&alive)?;
        let linked = fs::hard_link(&staged, daemons.join(format!("{daemon_id:016x}")));
        let _ = fs::remove_file(&staged);
        linked?;
        Ok(Backend {
            ns,
            tmp,
            open_dir,
            orphan_dir,
            targets: ts,
            placement: ArcSwap::from_pointee(Placement::default()),
            rr: AtomicU64::new(random_u64() % 1024),
            fds: Mutex::new(HashMap::new()),
            daemon_id,
            open_seq: AtomicU64::new(1),
            _alive: alive,
        })
    }

    fn daemons_dir(&self) -> PathBuf {
        self.open_dir.with_file_name("daemons")
    }

    fn marker_dir(&self, oid: u64) -> PathBuf {
        self.open_dir.join(format!("{oid:016x}"))
    }

    fn orphan_path(&self, oid: u64) -> PathBuf {
        self.orphan_dir.join(format!("{oid:016x}"))
    }

    /// Records one open of object `oid`; returns its handle.
    fn add_marker(&self, oid: u64) -> Res<OpenHandle> {
        let h = OpenHandle { daemon: self.daemon_id, id: self.open_seq.fetch_add(1, Relaxed) };
        let d = self.marker_dir(oid);
        let m = d.join(marker_name(h));
        for _ in 0..100 {
            match fs::create_dir(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(werr(e)),
            }
            match OpenOptions::new().write(true).create_new(true).mode(0o600).open(&m) {
                Ok(_) => return Ok(h),
                // The directory was removed by a concurrent last release: make it again.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(werr(e)),
            }
        }
        Err(eno(errno::EIO, "cannot place open marker"))
    }

    fn remove_marker(&self, oid: u64, h: OpenHandle) {
        let d = self.marker_dir(oid);
        let _ = fs::remove_file(d.join(marker_name(h)));
        let _ = fs::remove_dir(&d); // fails (ENOTEMPTY) while other opens remain
    }

    /// True when any open of `oid` is recorded (errors other than "no such dir" count as
    /// open: never delete data on doubt).
    fn has_markers(&self, oid: u64) -> bool {
        match fs::read_dir(self.marker_dir(oid)) {
            Ok(mut it) => it.next().is_some(),
            Err(e) => e.kind() != io::ErrorKind::NotFound,
        }
    }

    /// Number of recorded opens of `oid` (all daemons).
    pub fn open_markers(&self, oid: u64) -> usize {
        fs::read_dir(self.marker_dir(oid)).map(|it| it.count()).unwrap_or(0)
    }

    /// True when the objects of `oid` wait for their last close.
    pub fn is_orphan(&self, oid: u64) -> bool {
        self.orphan_path(oid).exists()
    }

    /// The name of a file with layout `l` is gone: delete its objects now, or keep them as
    /// an orphan until the last open is released.
    fn drop_file(&self, l: &Layout) {
        let rec = self.orphan_path(l.oid);
        if let Err(e) = fs::write(&rec, layout_text(l, 0)) {
            log::warn!("orphan record {}: {e}", rec.display());
        }
        if !self.has_markers(l.oid) {
            self.reap(l.oid);
        }
    }

    /// Deletes the objects of orphan `oid` and its record.
    fn reap(&self, oid: u64) -> bool {
        let rec = self.orphan_path(oid);
        let Ok(text) = fs::read_to_string(&rec) else { return false };
        match parse_layout(&text) {
            Some((l, _)) if l.oid == oid && self.check_layout(&l).is_ok() => self.remove_objects(&l),
            _ => log::warn!("corrupt orphan record {}", rec.display()),
        }
        let _ = fs::remove_file(&rec);
        let _ = fs::remove_dir(self.marker_dir(oid));
        true
    }

    /// Start-time garbage collection: markers of dead daemons, then orphans nobody holds.
    pub fn gc(&self) -> GcStats {
        let mut st = GcStats::default();
        let started = std::time::SystemTime::now();
        let mut dead = std::collections::HashSet::new();
        let mut live = std::collections::HashSet::new();
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        if let Ok(it) = fs::read_dir(self.daemons_dir()) {
            for e in it.flatten() {
                let Some(id) = e.file_name().to_str().and_then(hex) else { continue };
                if id == self.daemon_id {
                    live.insert(id);
                    continue;
                }
                match OpenOptions::new().read(true).open(e.path()) {
                    Ok(f) => match flock_nb(&f) {
                        Ok(()) => {
                            dead.insert(id);
                            let _ = fs::remove_file(e.path()); // still holding its lock
                        }
                        Err(_) => {
                            live.insert(id);
                        }
                    },
                    Err(_) => {
                        dead.insert(id);
                    }
                }
            }
        }
        st.dead_daemons = dead.len() as u64;
        if let Ok(it) = fs::read_dir(&self.open_dir) {
            for d in it.flatten() {
                let Ok(ms) = fs::read_dir(d.path()) else { continue };
                for m in ms.flatten() {
                    let name = m.file_name();
                    let owner = name.to_str().and_then(|n| n.split('.').next()).and_then(hex);
                    let stale = match owner {
                        Some(o) if live.contains(&o) => false,
                        Some(o) if dead.contains(&o) => true,
                        // Unknown owner (its lock file already gone): stale unless it was
                        // made after this scan began (a daemon that registered meanwhile).
                        _ => m.metadata().and_then(|md| md.modified()).map(|t| t < started).unwrap_or(false),
                    };
                    if stale && fs::remove_file(m.path()).is_ok() {
                        st.stale_markers += 1;
                    }
                }
                let _ = fs::remove_dir(d.path());
            }
        }
        if let Ok(it) = fs::read_dir(&self.orphan_dir) {
            for e in it.flatten() {
                let Some(oid) = e.file_name().to_str().and_then(hex) else { continue };
                if self.has_markers(oid) {
                    st.orphans_kept += 1;
                } else if self.reap(oid) {
                    st.orphans_reaped += 1;
                }
            }
        }
        st
    }

    pub fn target_index(&self, name: &str) -> Option<u32> {
        self.targets.iter().position(|t| t.name == name).map(|i| i as u32)
    }

    /// Checks a placement document against the targets (unknown names are errors).
    pub fn validate_placement(&self, p: &Placement) -> Result<(), String> {
        for (name, pool) in &p.pools {
            if pool.targets.is_empty() {
                return Err(format!("pool {name}: no targets"));
            }
            for t in pool.targets.iter().chain(pool.max_perf.keys()) {
                if self.target_index(t).is_none() {
                    return Err(format!("pool {name}: unknown target {t}"));
                }
            }
            if let Some(c) = pool.stripe_count {
                if c == 0 || c as usize > pool.targets.len() {
                    return Err(format!("pool {name}: stripe_count {c} outside 1..={}", pool.targets.len()));
                }
            }
        }
        for pool in p.default_pool.iter().chain(p.job_pools.values()) {
            if !p.pools.contains_key(pool) {
                return Err(format!("unknown pool {pool}"));
            }
        }
        if p.stripe_size == Some(0) {
            return Err("stripe_size must be > 0".into());
        }
        if let Some(c) = p.stripe_count {
            if c == 0 || c as usize > self.targets.len() {
                return Err(format!("stripe_count {c} outside 1..={}", self.targets.len()));
            }
        }
        Ok(())
    }

    /// Chooses the targets of a new file of job `job`.
    pub fn place(&self, job: &str) -> Layout {
        let p = self.placement.load();
        let stripe_size = p.stripe_size.unwrap_or(1 << 20);
        let pool = p.job_pools.get(job).or(p.default_pool.as_ref()).and_then(|n| p.pools.get(n));
        let targets = match pool {
            Some(pool) => {
                let k = pool.stripe_count.unwrap_or(1) as usize;
                let mut scored: Vec<(f64, u32)> = pool
                    .targets
                    .iter()
                    .filter_map(|n| self.target_index(n))
                    .map(|i| {
                        let t = &self.targets[i as usize];
                        let perf = pool.max_perf.get(&t.name).copied().unwrap_or_else(|| {
                            let m = t.shm.max_perf();
                            if m > 0.0 { m } else { 1.0 }
                        });
                        (perf / (t.shm.open_count() as f64 + 1.0), i)
                    })
                    .collect();
                // Highest score first; ties go to the lower open count then lower index.
                scored.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)));
                scored.into_iter().take(k.max(1)).map(|(_, i)| i).collect()
            }
            None => {
                let n = self.targets.len() as u64;
                let k = p.stripe_count.unwrap_or(1).max(1) as u64;
                let first = self.rr.fetch_add(k, Relaxed);
                (0..k).map(|j| ((first + j) % n) as u32).collect()
            }
        };
        Layout { oid: random_u64(), stripe_size, targets }
    }

    /// Resolves a request path inside the namespace.
    pub fn ns_path(&self, path: &str) -> Res<PathBuf> {
        let comps = validate_path(path)?;
        let mut p = self.ns.clone();
        for c in comps {
            p.push(c);
        }
        Ok(p)
    }

    fn obj_path(&self, l: &Layout, stripe: u32) -> Res<PathBuf> {
        let ti = *l.targets.get(stripe as usize).ok_or_else(|| eno(errno::EINVAL, "stripe outside layout"))?;
        let t = self.targets.get(ti as usize).ok_or_else(|| eno(errno::EINVAL, format!("unknown target index {ti}")))?;
        Ok(t.dir.join(format!("{:016x}.{stripe}", l.oid)))
    }

    fn check_layout(&self, l: &Layout) -> Res<()> {
        if l.stripe_size == 0 || l.targets.is_empty() || l.targets.len() > self.targets.len() {
            return Err(eno(errno::EINVAL, "invalid layout"));
        }
        if l.targets.iter().any(|&t| t as usize >= self.targets.len()) {
            return Err(eno(errno::EINVAL, "layout names an unknown target"));
        }
        Ok(())
    }

    fn obj_fd(&self, l: &Layout, stripe: u32) -> Res<Arc<File>> {
        let key = (l.targets[stripe as usize], l.oid, stripe);
        if let Some(f) = self.fds.lock().unwrap().get(&key) {
            return Ok(f.clone());
        }
        let f = Arc::new(OpenOptions::new().read(true).write(true).open(self.obj_path(l, stripe)?).map_err(werr)?);
        let mut m = self.fds.lock().unwrap();
        if m.len() >= FD_CACHE_MAX {
            m.clear();
        }
        m.insert(key, f.clone());
        Ok(f)
    }

    fn forget_fds(&self, l: &Layout) {
        let mut m = self.fds.lock().unwrap();
        for (s, &t) in l.targets.iter().enumerate() {
            m.remove(&(t, l.oid, s as u32));
        }
    }

    /// Reads the layout sidecar of a namespace file.
    pub fn read_layout(&self, p: &Path) -> Res<(Layout, u64)> {
        let s = fs::read_to_string(p).map_err(werr)?;
        parse_layout(&s).ok_or_else(|| eno(errno::EIO, format!("corrupt layout sidecar {}", p.display())))
    }

    fn attr_of(&self, p: &Path, md: &fs::Metadata) -> Res<Attr> {
        let kind = kind_of(md.file_type());
        let mut a = Attr {
            ino: md.ino(),
            kind,
            perm: md.mode() & 0o7777,
            nlink: md.nlink() as u32,
            uid: md.uid(),
            gid: md.gid(),
            size: md.size(),
            blocks: md.blocks(),
            atime: t(md.atime(), md.atime_nsec()),
            mtime: t(md.mtime(), md.mtime_nsec()),
            ctime: t(md.ctime(), md.ctime_nsec()),
        };
        if kind == Kind::File {
            let (l, _) = self.read_layout(p)?;
            let (size, blocks, mtime) = self.data_stat(&l)?;
            a.size = size;
            a.blocks = blocks;
            if (mtime.sec, mtime.nsec) > (a.mtime.sec, a.mtime.nsec) {
                a.mtime = mtime;
                a.ctime = mtime;
            }
        }
        Ok(a)
    }

    /// Logical size, blocks and newest mtime of a file's objects.
    fn data_stat(&self, l: &Layout) -> Res<(u64, u64, Time)> {
        self.check_layout(l)?;
        let (mut size, mut blocks, mut mt) = (0u64, 0u64, t(0, 0));
        for s in 0..l.targets.len() as u32 {
            let md = match self.obj_fd(l, s) {
                Ok(f) => f.metadata().map_err(werr)?,
                Err(e) if e.errno == errno::ENOENT => continue,
                Err(e) => return Err(e),
            };
            size = size.max(logical_from_obj(l, s, md.size()));
            blocks += md.blocks();
            let m = t(md.mtime(), md.mtime_nsec());
            if (m.sec, m.nsec) > (mt.sec, mt.nsec) {
                mt = m;
            }
        }
        Ok((size, blocks, mt))
    }

    pub fn getattr(&self, path: &str) -> Res<Attr> {
        let p = self.ns_path(path)?;
        let md = fs::symlink_metadata(&p).map_err(werr)?;
        self.attr_of(&p, &md)
    }

    pub fn readdir(&self, path: &str) -> Res<Vec<DirEntry>> {
        let p = self.ns_path(path)?;
        let mut out = Vec::new();
        for e in fs::read_dir(&p).map_err(werr)? {
            let e = e.map_err(werr)?;
            let name = match e.file_name().into_string() {
                Ok(n) => n,
                Err(_) => continue,
            };
            use std::os::unix::fs::DirEntryExt;
            out.push(DirEntry { name, ino: e.ino(), kind: kind_of(e.file_type().map_err(werr)?) });
        }
        Ok(out)
    }

    fn chown(p: &Path, uid: Option<u32>, gid: Option<u32>) -> Res<()> {
        if uid.is_none() && gid.is_none() {
            return Ok(());
        }
        std::os::unix::fs::lchown(p, uid, gid).map_err(werr)
    }

    pub fn mkdir(&self, path: &str, mode: u32, uid: u32, gid: u32) -> Res<Attr> {
        let p = self.ns_path(path)?;
        if p == self.ns {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        fs::create_dir(&p).map_err(werr)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode & 0o7777)).map_err(werr)?;
        Self::chown(&p, Some(uid), Some(gid))?;
        self.getattr(path)
    }

    pub fn rmdir(&self, path: &str) -> Res<()> {
        let p = self.ns_path(path)?;
        if p == self.ns {
            return Err(eno(errno::EBUSY, "namespace root"));
        }
        fs::remove_dir(&p).map_err(werr)
    }

    fn remove_objects(&self, l: &Layout) {
        self.forget_fds(l);
        for s in 0..l.targets.len() as u32 {
            if let Ok(p) = self.obj_path(l, s) {
                let _ = fs::remove_file(p);
            }
        }
    }

    pub fn unlink(&self, path: &str) -> Res<()> {
        let p = self.ns_path(path)?;
        let md = fs::symlink_metadata(&p).map_err(werr)?;
        if md.is_dir() {
            return Err(eno(errno::EISDIR, "is a directory"));
        }
        let layout = if md.is_file() { self.read_layout(&p).ok() } else { None };
        fs::remove_file(&p).map_err(werr)?;
        if let Some((l, _)) = layout {
            if md.nlink() <= 1 {
                self.drop_file(&l);
            }
        }
        Ok(())
    }

    pub fn rename(&self, from: &str, to: &str, noreplace: bool) -> Res<()> {
        let a = self.ns_path(from)?;
        let b = self.ns_path(to)?;
        if a == self.ns || b == self.ns {
            return Err(eno(errno::EBUSY, "namespace root"));
        }
        let replaced = match fs::symlink_metadata(&b) {
            Ok(md) if md.is_file() => self.read_layout(&b).ok().map(|(l, _)| l),
            _ => None,
        };
        let ca = CString::new(a.as_os_str().as_encoded_bytes()).map_err(|_| eno(errno::EINVAL, "NUL in path"))?;
        let cb = CString::new(b.as_os_str().as_encoded_bytes()).map_err(|_| eno(errno::EINVAL, "NUL in path"))?;
        let flags = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
        let r = unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), flags) };
        if r != 0 {
            return Err(werr(io::Error::last_os_error()));
        }
        if let Some(l) = replaced {
            // The replaced file's objects go, unless the rename was a no-op on one file.
            if self.read_layout(&b).map(|(nl, _)| nl.oid != l.oid).unwrap_or(true) {
                self.drop_file(&l);
            }
        }
        Ok(())
    }

    /// Creates (or, when `!excl` and it exists, opens) a regular file. Returns its attr,
    /// layout and open handle, and counts it open on its targets.
    pub fn create(&self, path: &str, mode: u32, excl: bool, token: u64, job: &str, uid: u32, gid: u32) -> Res<(Attr, Layout, OpenHandle)> {
        let p = self.ns_path(path)?;
        if p == self.ns {
            return Err(eno(errno::EISDIR, "namespace root"));
        }
        if !excl {
            match self.open(path, true, false) {
                Err(e) if e.errno == errno::ENOENT => {}
                r => return r,
            }
        }
        let l = self.place(job);
        let mut made = Vec::new();
        let cleanup = |made: &Vec<PathBuf>| {
            for m in made {
                let _ = fs::remove_file(m);
            }
        };
        for s in 0..l.targets.len() as u32 {
            let op = self.obj_path(&l, s)?;
            match OpenOptions::new().write(true).create_new(true).mode(0o600).open(&op) {
                Ok(_) => made.push(op),
                Err(e) => {
                    cleanup(&made);
                    return Err(werr(e));
                }
            }
        }
        // The open is recorded before the name appears: an unlink right after the link
        // already sees it.
        let h = match self.add_marker(l.oid) {
            Ok(h) => h,
            Err(e) => {
                cleanup(&made);
                return Err(e);
            }
        };
        let tmp = self.tmp.join(format!("{:016x}", l.oid));
        let res = (|| -> io::Result<()> {
            let mut f = OpenOptions::new().write(true).create_new(true).mode(mode & 0o7777).open(&tmp)?;
            f.write_all(layout_text(&l, token).as_bytes())?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(mode & 0o7777))?;
            std::os::unix::fs::lchown(&tmp, Some(uid), Some(gid))?;
            fs::hard_link(&tmp, &p)
        })();
        let _ = fs::remove_file(&tmp);
        if let Err(e) = res {
            self.remove_marker(l.oid, h);
            cleanup(&made);
            if e.raw_os_error() == Some(errno::EEXIST) {
                // A replay of this very create (same token) succeeded earlier: open it.
                if let Ok((old, tok)) = self.read_layout(&p) {
                    if tok == token && token != 0 {
                        let _ = old;
                        return self.open(path, true, false);
                    }
                }
                if !excl {
                    return self.open(path, true, false);
                }
            }
            return Err(werr(e));
        }
        for &ti in &l.targets {
            self.targets[ti as usize].shm.add_open(1);
        }
        match self.getattr(path) {
            Ok(a) => Ok((a, l, h)),
            Err(e) => {
                let _ = self.release(&l, h);
                Err(e)
            }
        }
    }

    /// Opens an existing regular file: returns attr, layout and open handle, and counts it
    /// open. The open is recorded (marker) before it is reported, so a later unlink keeps
    /// the data until [`Backend::release`].
    pub fn open(&self, path: &str, _write: bool, truncate: bool) -> Res<(Attr, Layout, OpenHandle)> {
        let p = self.ns_path(path)?;
        for _ in 0..16 {
            let md = fs::symlink_metadata(&p).map_err(werr)?;
            if md.is_dir() {
                return Err(eno(errno::EISDIR, "is a directory"));
            }
            if !md.is_file() {
                return Err(eno(errno::EINVAL, "not a regular file"));
            }
            let (l, _) = self.read_layout(&p)?;
            self.check_layout(&l)?;
            let h = self.add_marker(l.oid)?;
            // Still the same file under this name? Else an unlink or rename raced us: the
            // objects may already be going; drop this open and look again.
            match self.read_layout(&p) {
                Ok((now, _)) if now.oid == l.oid => {}
                Ok(_) => {
                    self.unmark(&l, h);
                    continue;
                }
                Err(e) => {
                    self.unmark(&l, h);
                    return Err(e);
                }
            }
            for &ti in &l.targets {
                self.targets[ti as usize].shm.add_open(1);
            }
            let done = (|| {
                if truncate {
                    self.truncate(&l, 0)?;
                }
                self.attr_of(&p, &md)
            })();
            return match done {
                Ok(a) => Ok((a, l, h)),
                Err(e) => {
                    let _ = self.release(&l, h);
                    Err(e)
                }
            };
        }
        Err(eno(errno::EIO, "file replaced too often during open"))
    }

    /// Drops open `h` of `l` and deletes the objects when that was the last open of an
    /// unlinked file.
    fn unmark(&self, l: &Layout, h: OpenHandle) {
        self.remove_marker(l.oid, h);
        if self.is_orphan(l.oid) && !self.has_markers(l.oid) {
            self.reap(l.oid);
        }
    }

    /// Releases open `h` (served by any daemon) of the file with layout `l`.
    pub fn release(&self, l: &Layout, h: OpenHandle) -> Res<()> {
        self.check_layout(l)?;
        for &ti in &l.targets {
            self.targets[ti as usize].shm.add_open(-1);
        }
        self.unmark(l, h);
        Ok(())
    }

    fn truncate(&self, l: &Layout, size: u64) -> Res<()> {
        for s in 0..l.targets.len() as u32 {
            self.obj_fd(l, s)?.set_len(obj_size(l, size, s)).map_err(werr)?;
        }
        Ok(())
    }

    pub fn setattr(&self, path: &str, set: &SetAttr) -> Res<Attr> {
        let p = self.ns_path(path)?;
        let md = fs::symlink_metadata(&p).map_err(werr)?;
        let layout = if md.is_file() { Some(self.read_layout(&p)?.0) } else { None };
        if let Some(size) = set.size {
            match &layout {
                Some(l) => self.truncate(l, size)?,
                None if md.is_dir() => return Err(eno(errno::EISDIR, "is a directory")),
                None => return Err(eno(errno::EINVAL, "not a regular file")),
            }
        }
        if let Some(mode) = set.mode {
            fs::set_permissions(&p, fs::Permissions::from_mode(mode & 0o7777)).map_err(werr)?;
        }
        Self::chown(&p, set.uid, set.gid)?;
        if set.atime.is_some() || set.mtime.is_some() {
            let ts = |x: &Option<Option<Time>>| match x {
                None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
                Some(None) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
                Some(Some(t)) => libc::timespec { tv_sec: t.sec, tv_nsec: t.nsec as i64 },
            };
            let times = [ts(&set.atime), ts(&set.mtime)];
            let mut paths = vec![p.clone()];
            if let Some(l) = &layout {
                for s in 0..l.targets.len() as u32 {
                    paths.push(self.obj_path(l, s)?);
                }
            }
            for q in paths {
                let c = CString::new(q.as_os_str().as_encoded_bytes()).map_err(|_| eno(errno::EINVAL, "NUL"))?;
                if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 {
                    return Err(werr(io::Error::last_os_error()));
                }
            }
        }
        self.getattr(path)
    }

    /// Applies the target's token bucket and injected latency before a piece of I/O.
    fn gate(&self, ti: u32, bytes: u64, info: &mut IoInfo) {
        let t = &self.targets[ti as usize];
        let wait = t.shm.reserve(bytes);
        if !wait.is_zero() {
            info.throttled += wait;
            std::thread::sleep(wait);
        }
        let lat = t.shm.added_latency_ns();
        if lat > 0 {
            std::thread::sleep(Duration::from_nanos(lat));
        }
    }

    /// Injected slowdown of a piece's backing I/O: its service time `took` becomes `f x took`
    /// (the token bucket applies the same factor to the rate, see `TargetShm::reserve`).
    /// The extra `(f - 1) x took` is owed per worker thread and slept once it reaches
    /// [`STRETCH_MIN_SLEEP`], minus what the sleeps overshot: sub-millisecond page-cache
    /// writes get the factor on average instead of the timer's granularity.
    pub fn stretch(&self, ti: u32, took: Duration) {
        let f = self.targets[ti as usize].shm.slowdown();
        if f > 1.0 {
            STRETCH_DEBT_NS.with(|debt| {
                let owed = debt.get() + took.as_nanos() as f64 * (f - 1.0);
                if owed >= STRETCH_MIN_SLEEP.as_nanos() as f64 {
                    let t0 = Instant::now();
                    std::thread::sleep(Duration::from_nanos(owed as u64));
                    // an overshoot is credited, bounded so that one long stall is not repaid by many fast requests
                    debt.set((owed - t0.elapsed().as_nanos() as f64).max(-(STRETCH_MIN_SLEEP.as_nanos() as f64)));
                } else {
                    debt.set(owed);
                }
            });
        }
    }

    /// A read of a single-target file served straight from its object (the caller sends
    /// the bytes with `sendfile(2)`, no copy through user space): the object's fd, offset
    /// and the byte count, clamped to the object's size now. Token bucket and injected
    /// latency are applied here; the caller applies [`Backend::stretch`] after sending.
    /// `None` for striped layouts (holes and pieces: use [`Backend::read_into`]).
    pub fn read_span(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo) -> Res<Option<FileSpan>> {
        self.check_layout(l)?;
        if l.targets.len() != 1 {
            return Ok(None);
        }
        info.oid = l.oid;
        let ti = l.targets[0];
        info.target.get_or_insert(ti);
        let file = self.obj_fd(l, 0)?;
        let osize = file.metadata().map_err(werr)?.len();
        let len = (size as u64).min(osize.saturating_sub(off));
        if len > 0 {
            self.gate(ti, len, info);
        }
        Ok(Some(FileSpan { file, off, len: len as usize, target: ti }))
    }

    pub fn read(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo) -> Res<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_into(l, off, size, info, &mut buf)?;
        Ok(buf)
    }

    /// Reads into `buf` (resized to the bytes read; a reused buffer is not zeroed again).
    pub fn read_into(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo, buf: &mut Vec<u8>) -> Res<()> {
        self.check_layout(l)?;
        info.oid = l.oid;
        let mut len = size as u64;
        if l.targets.len() > 1 {
            let (fsize, _, _) = self.data_stat(l)?;
            len = len.min(fsize.saturating_sub(off));
        }
        if buf.len() < len as usize {
            buf.resize(len as usize, 0);
        }
        if l.targets.len() > 1 {
            // Holes inside the size read as zeros: a reused buffer must not show old bytes.
            buf[..len as usize].fill(0);
        }
        let mut got_end = 0u64;
        for pc in pieces(l, off, len) {
            let ti = l.targets[pc.stripe as usize];
            info.target.get_or_insert(ti);
            self.gate(ti, pc.len, info);
            let f = self.obj_fd(l, pc.stripe)?;
            let t0 = Instant::now();
            let dst = &mut buf[pc.buf_off as usize..(pc.buf_off + pc.len) as usize];
            let mut n = 0usize;
            while n < dst.len() {
                match f.read_at(&mut dst[n..], pc.obj_off + n as u64) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(werr(e)),
                }
            }
            self.stretch(ti, t0.elapsed());
            if l.targets.len() == 1 {
                // Single object: a short read is the end of the file.
                got_end = pc.buf_off + n as u64;
                if n < pc.len as usize {
                    break;
                }
            } else {
                got_end = pc.buf_off + pc.len; // holes inside the size read as zeros
            }
        }
        buf.truncate(got_end as usize);
        Ok(())
    }

    pub fn write(&self, l: &Layout, off: u64, data: &[u8], info: &mut IoInfo) -> Res<u32> {
        self.check_layout(l)?;
        info.oid = l.oid;
        if off.checked_add(data.len() as u64).is_none_or(|e| e > i64::MAX as u64) {
            return Err(eno(errno::EFBIG, "offset too large"));
        }
        for pc in pieces(l, off, data.len() as u64) {
            let ti = l.targets[pc.stripe as usize];
            info.target.get_or_insert(ti);
            self.gate(ti, pc.len, info);
            let f = self.obj_fd(l, pc.stripe)?;
            let t0 = Instant::now();
            f.write_all_at(&data[pc.buf_off as usize..(pc.buf_off + pc.len) as usize], pc.obj_off).map_err(werr)?;
            self.stretch(ti, t0.elapsed());
        }
        Ok(data.len() as u32)
    }

    pub fn fsync(&self, l: &Layout, datasync: bool, info: &mut IoInfo) -> Res<()> {
        self.check_layout(l)?;
        info.oid = l.oid;
        for s in 0..l.targets.len() as u32 {
            let ti = l.targets[s as usize];
            info.target.get_or_insert(ti);
            let f = self.obj_fd(l, s)?;
            if datasync { f.sync_data() } else { f.sync_all() }.map_err(werr)?;
        }
        Ok(())
    }

    pub fn statfs(&self) -> Res<StatFs> {
        let mut out = StatFs { bsize: 4096, frsize: 4096, namelen: 255, ..Default::default() };
        let mut seen = Vec::new();
        let sv = |p: &Path| -> Res<libc::statvfs> {
            let c = CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| eno(errno::EINVAL, "NUL"))?;
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
                return Err(werr(io::Error::last_os_error()));
            }
            Ok(s)
        };
        // Capacity: the sum over the distinct file systems holding targets.
        for t in &self.targets {
            let s = sv(&t.dir)?;
            if seen.contains(&s.f_fsid) {
                continue;
            }
            seen.push(s.f_fsid);
            let k = s.f_frsize / 4096;
            out.blocks += s.f_blocks * k.max(1);
            out.bfree += s.f_bfree * k.max(1);
            out.bavail += s.f_bavail * k.max(1);
        }
        let m = sv(&self.ns)?;
        out.files = m.f_files;
        out.ffree = m.f_ffree;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(k: u32, ss: u64) -> Layout {
        Layout { oid: 1, stripe_size: ss, targets: (0..k).collect() }
    }

    #[test]
    fn striping_math_is_consistent() {
        let l = lay(3, 4);
        let ps = pieces(&l, 2, 12);
        assert_eq!(ps[0], Piece { stripe: 0, obj_off: 2, len: 2, buf_off: 0 });
        assert_eq!(ps[1], Piece { stripe: 1, obj_off: 0, len: 4, buf_off: 2 });
        assert_eq!(ps[3], Piece { stripe: 0, obj_off: 4, len: 2, buf_off: 10 });
        for size in 0..60u64 {
            let m = (0..3).map(|i| logical_from_obj(&l, i, obj_size(&l, size, i))).max().unwrap();
            assert_eq!(m, size, "size {size}");
        }
    }

    fn backend(n: usize) -> (tempfile::TempDir, Backend) {
        let d = tempfile::tempdir().unwrap();
        let ts: Vec<(String, PathBuf)> = (0..n).map(|i| (format!("ost{i}"), d.path().join(format!("ost{i}")))).collect();
        let b = Backend::new(&d.path().join("mdt"), &ts).unwrap();
        (d, b)
    }

    #[test]
    fn striped_file_roundtrip_and_truncate() {
        let (_d, b) = backend(4);
        b.placement.store(Arc::new(Placement { stripe_count: Some(3), stripe_size: Some(4096), ..Default::default() }));
        let (_, l, _) = b.create("f", 0o644, true, 1, "", 0, 0).unwrap();
        assert_eq!(l.targets.len(), 3);
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let mut info = IoInfo::default();
        assert_eq!(b.write(&l, 1000, &data, &mut info).unwrap(), 50_000);
        assert_eq!(b.getattr("f").unwrap().size, 51_000);
        let back = b.read(&l, 1000, 60_000, &mut info).unwrap();
        assert_eq!(back, data);
        let head = b.read(&l, 0, 1000, &mut info).unwrap();
        assert!(head.iter().all(|&x| x == 0));
        b.setattr("f", &SetAttr { size: Some(5000), ..Default::default() }).unwrap();
        assert_eq!(b.getattr("f").unwrap().size, 5000);
        b.setattr("f", &SetAttr { size: Some(20_000), ..Default::default() }).unwrap();
        assert_eq!(b.getattr("f").unwrap().size, 20_000);
        let r = b.read(&l, 0, 30_000, &mut info).unwrap();
        assert_eq!(r.len(), 20_000);
        assert_eq!(&r[1000..5000], &data[..4000]);
        assert!(r[5000..].iter().all(|&x| x == 0));
    }

    fn obj_count(d: &tempfile::TempDir) -> usize {
        (0..4)
            .map(|i| fs::read_dir(d.path().join(format!("ost{i}"))).map(|it| it.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count()).unwrap_or(0))
            .sum()
    }

    fn backend_on(d: &tempfile::TempDir, n: usize) -> Backend {
        let ts: Vec<(String, PathBuf)> = (0..n).map(|i| (format!("ost{i}"), d.path().join(format!("ost{i}")))).collect();
        Backend::new(&d.path().join("mdt"), &ts).unwrap()
    }

    #[test]
    fn unlinked_open_file_keeps_data_until_last_release_on_any_daemon() {
        let (d, a) = backend(2);
        let b = backend_on(&d, 2); // a second daemon on the same backend
        let mut info = IoInfo::default();
        let (_, l, h1) = a.create("f", 0o644, true, 1, "", 0, 0).unwrap();
        let (_, l2, h2) = b.open("f", false, false).unwrap();
        assert_eq!(l, l2);
        a.write(&l, 0, b"hello", &mut info).unwrap();
        assert_eq!(a.open_markers(l.oid), 2);
        b.unlink("f").unwrap();
        assert_eq!(a.getattr("f").unwrap_err().errno, errno::ENOENT);
        assert!(a.is_orphan(l.oid));
        // Both opens still read and write the orphan.
        a.write(&l, 5, b" world", &mut info).unwrap();
        assert_eq!(b.read(&l, 0, 100, &mut info).unwrap(), b"hello world");
        // A new file under the same name is another object.
        let (_, n, hn) = b.create("f", 0o644, true, 2, "", 0, 0).unwrap();
        assert_ne!(n.oid, l.oid);
        // Releases may come through either daemon: the last one deletes the data.
        b.release(&l, h1).unwrap();
        assert!(a.is_orphan(l.oid) && obj_count(&d) == 2);
        a.release(&l, h2).unwrap();
        assert!(!a.is_orphan(l.oid));
        assert_eq!(obj_count(&d), 1, "only the new file's object remains");
        // Rename over an open file: same rules.
        let (_, o, ho) = a.create("g", 0o644, true, 3, "", 0, 0).unwrap();
        b.rename("f", "g", false).unwrap();
        assert!(a.is_orphan(o.oid));
        a.write(&o, 0, b"still here", &mut info).unwrap();
        assert_eq!(a.read(&o, 0, 100, &mut info).unwrap(), b"still here");
        b.release(&n, hn).unwrap(); // the moved file stays: it has a name
        assert!(!a.is_orphan(n.oid) && a.getattr("g").is_ok());
        a.release(&o, ho).unwrap();
        assert!(!a.is_orphan(o.oid));
        assert_eq!(obj_count(&d), 1);
        // A closed file unlinked: objects go at once, no orphan record.
        b.unlink("g").unwrap();
        assert_eq!(obj_count(&d), 0);
        assert_eq!(fs::read_dir(d.path().join("mdt/orphans")).unwrap().count(), 0);
        assert_eq!(fs::read_dir(d.path().join("mdt/open")).unwrap().count(), 0);
    }

    #[test]
    fn start_gc_drops_opens_of_dead_daemons_only() {
        let d = tempfile::tempdir().unwrap();
        let live = backend_on(&d, 2);
        let dead = backend_on(&d, 2);
        let (_, lx, _hx) = dead.create("x", 0o644, true, 1, "", 0, 0).unwrap();
        let (_, ly, hy) = live.create("y", 0o644, true, 2, "", 0, 0).unwrap();
        let (_, lz, _hz) = dead.open("y", false, false).unwrap();
        assert_eq!(lz, ly);
        live.unlink("x").unwrap();
        live.unlink("y").unwrap();
        assert!(live.is_orphan(lx.oid) && live.is_orphan(ly.oid));
        drop(dead); // killed: its flock goes with its fd
        let fresh = backend_on(&d, 2);
        let st = fresh.gc();
        assert_eq!(st.dead_daemons, 1);
        assert_eq!(st.stale_markers, 2);
        assert_eq!(st.orphans_reaped, 1, "{st:?}");
        assert_eq!(st.orphans_kept, 1, "{st:?}");
        assert!(!fresh.is_orphan(lx.oid));
        assert!(fresh.is_orphan(ly.oid), "the live daemon's open keeps y");
        assert_eq!(obj_count(&d), 1);
        // Another gc finds nothing more; the live daemon's release ends y.
        let st = fresh.gc();
        assert_eq!((st.dead_daemons, st.stale_markers, st.orphans_reaped), (0, 0, 0));
        live.release(&ly, hy).unwrap();
        assert_eq!(obj_count(&d), 0);
    }

    #[test]
    fn open_racing_unlink_never_returns_deleted_data() {
        let (_d, b) = backend(2);
        let b = Arc::new(b);
        for i in 0..200 {
            let name = format!("r{i}");
            let (_, l, h) = b.create(&name, 0o644, true, 0, "", 0, 0).unwrap();
            b.release(&l, h).unwrap();
            let b2 = b.clone();
            let n2 = name.clone();
            let t = std::thread::spawn(move || b2.unlink(&n2));
            match b.open(&name, true, false) {
                Ok((_, l, h)) => {
                    // Opened: the data must stay readable and writable until release.
                    let mut info = IoInfo::default();
                    b.write(&l, 0, b"x", &mut info).unwrap();
                    t.join().unwrap().unwrap();
                    assert_eq!(b.read(&l, 0, 1, &mut info).unwrap(), b"x");
                    b.release(&l, h).unwrap();
                    assert!(!b.is_orphan(l.oid));
                }
                Err(e) => {
                    assert_eq!(e.errno, errno::ENOENT);
                    t.join().unwrap().unwrap();
                }
            }
        }
    }

    #[test]
    fn create_is_exclusive_and_replayable() {
        let (_d, b) = backend(2);
        b.create("f", 0o644, true, 42, "", 0, 0).unwrap();
        assert_eq!(b.create("f", 0o644, true, 43, "", 0, 0).unwrap_err().errno, errno::EEXIST);
        // Same token: the replay of a create that already happened succeeds.
        b.create("f", 0o644, true, 42, "", 0, 0).unwrap();
        assert_eq!(b.ns_path("../x").unwrap_err().errno, errno::EINVAL);
    }

    #[test]
    fn performance_aware_placement_follows_max_perf() {
        let (_d, b) = backend(3);
        let mut pools = BTreeMap::new();
        let perf: BTreeMap<String, f64> = [("ost0", 10.0), ("ost1", 30.0), ("ost2", 20.0)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
        pools.insert("p".to_string(), Pool { targets: vec!["ost0".into(), "ost1".into(), "ost2".into()], max_perf: perf, stripe_count: None });
        let p = Placement { pools, default_pool: Some("p".into()), ..Default::default() };
        b.validate_placement(&p).unwrap();
        b.placement.store(Arc::new(p));
        let mut counts = [0; 3];
        for i in 0..12 {
            let (_, l, _) = b.create(&format!("f{i}"), 0o644, true, 0, "", 0, 0).unwrap();
            counts[l.targets[0] as usize] += 1;
        }
        // D'Hondt allocation of 12 files over 10:30:20.
        assert_eq!(counts, [2, 6, 4]);
        let bad = Placement { default_pool: Some("nope".into()), ..Default::default() };
        assert!(b.validate_placement(&bad).is_err());
    }
}
