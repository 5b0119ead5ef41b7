//! Storage backend: a namespace directory (the MDT) and N target directories (the OSTs).
//!
//! * The namespace `<mdt>/ns` holds the directory tree. A regular file of the namespace is
//!   a small sidecar whose content is the file's layout
//!   (`pharos-layout v1 oid=<hex> stripe_size=<n> targets=<i,j,..> token=<n>`), written to
//!   an unnamed `O_TMPFILE` in its directory with the caller's credentials and `link(2)`ed
//!   into place, so creation is atomic (EEXIST races are decided by the kernel) and other
//!   daemons never see a half-written layout. Every name operation resolves from the
//!   namespace root's fd with the caller's credentials ([`crate::nsfs`]): the kernel of the
//!   forwarding node applies POSIX's permission rules. Hard links share the sidecar.
//! * The data of stripe `s` of object `oid` is the file `<target dir>/<oid:016x>.<s>`.
//!   Striping is RAID-0 over the layout's targets in units of `stripe_size`.
//! * **Progressive layouts** (a pool with `component_size` C, Lustre-PFL-like; sidecar
//!   `pharos-layout v2 .. component_size=C perf=..`): bytes `[k*C, (k+1)*C)` are component
//!   `k`, the object `<target dir>/<oid:016x>.<k>` on one target. The target is chosen at the
//!   first write (or truncate) reaching the component, among the layout's candidate targets,
//!   by the performance-aware rule below, and recorded as the file
//!   `<mdt>/components/<oid:016x>/<k>` holding the target index, staged in `<mdt>/tmp` and
//!   linked into place without replacing (several daemons may place the same component at
//!   once: the first link wins, the others read the winner's). Records are immutable while
//!   the file exists, so resolved components are cached per daemon (absence never is).
//!   An object may be missing (never written, or instantiated by a truncate): its range reads
//!   as zeros inside the file size, the size being the largest `k*C + object size` over
//!   non-empty objects. The component directory is made at create and removed with the
//!   objects; a write to a file whose directory is gone gets ENOENT.
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
//! Placement (see [`Placement`]): round-robin over all targets by default, at create; with a
//! pool, the performance-aware rule of the Sunway lessons §5: the target maximising
//! `max_perf / (open_count + 1)` among the pool's targets, at create for the whole file, or
//! per component at its first write when the pool has a `component_size`.
//!
//! `open_count` (shared, [`crate::shm`]) counts what is being written on a target: a classic
//! file counts on each of its targets from open to release; a progressive file counts, per
//! open handle, only on the target of the component that handle is writing now. The handle
//! enters a component at its first write there (count +1), leaves it when it writes another
//! component (-1 before the next one is placed, so placement sees the other writers only)
//! or at release. The counted target is kept in the handle's open marker (so a release or a
//! write arriving through another daemon after a failover decrements the right target), and
//! start-time garbage collection decrements the target of every dead daemon's marker it
//! removes. Reads do not count.
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use pharos_fwd_proto::{
    errno, validate_path, Attr, Ctx, DirEntry, Kind, Layout, OpenHandle, SetAttr, StatFs, Time, WireError,
    READDIR_PAGE_BYTES,
};
use serde::{Deserialize, Serialize};

use crate::nsfs::{self, Caller};
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
    /// Bytes per component of a progressive layout (a multiple of [`COMPONENT_ALIGN`]);
    /// none = whole-file placement at create.
    #[serde(default)]
    pub component_size: Option<u64>,
}

/// Component sizes are multiples of this (bytes): the page size, so components never share
/// a page.
pub const COMPONENT_ALIGN: u64 = 4096;

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
/// Entries of the component cache and of the per-handle table before they are cleared.
const COMP_CACHE_MAX: usize = 1 << 16;
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
    /// `O_PATH` fd of the namespace root: every name is resolved from it.
    ns_fd: OwnedFd,
    tmp: PathBuf,
    open_dir: PathBuf,
    orphan_dir: PathBuf,
    comp_dir: PathBuf,
    pub targets: Vec<Target>,
    pub placement: ArcSwap<Placement>,
    rr: AtomicU64,
    /// Open object files by (target, oid, stripe or component).
    fds: Mutex<HashMap<(u32, u64, u64), Arc<File>>>,
    /// Resolved components (immutable records): (oid, component) -> target.
    comps: Mutex<HashMap<(u64, u64), u32>>,
    /// Component each open handle of a progressive file wrote last through this daemon (a
    /// fast path: the handle's marker holds the counted target, see [`Backend::enter`]).
    writing: Mutex<HashMap<OpenHandle, (u64, u64)>>,
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

const SUIDGID: u32 = libc::S_ISUID | libc::S_ISGID;

/// The mode bits a write by a caller without `CAP_FSETID` clears (Linux's
/// `setattr_should_drop_suidgid`): setuid always, setgid when group-execute is set or the
/// caller is not in the file's group (`in_group`).
fn killed_by_write(mode: u32, in_group: bool) -> u32 {
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !in_group) {
        kill |= libc::S_ISGID;
    }
    kill
}

fn marker_name(h: OpenHandle) -> String {
    format!("{:016x}.{:016x}", h.daemon, h.id)
}

/// The counted target written in an open marker (empty: none).
fn marker_target(p: &Path) -> Option<u32> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
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

fn kind_of_mode(mode: u32) -> Kind {
    match mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        libc::S_IFIFO => Kind::Fifo,
        libc::S_IFSOCK => Kind::Socket,
        libc::S_IFCHR => Kind::CharDev,
        libc::S_IFBLK => Kind::BlockDev,
        _ => Kind::Other,
    }
}

fn t(sec: i64, nsec: i64) -> Time {
    Time { sec, nsec: nsec as u32 }
}

fn join<T: ToString>(xs: &[T]) -> String {
    xs.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// Encodes a layout sidecar: `v1` for classic layouts (unchanged format), `v2` for
/// progressive ones (`component_size=<bytes> perf=<MB/s,..>` added), which older daemons
/// refuse instead of reading them as classic.
pub fn layout_text(l: &Layout, token: u64) -> String {
    let head = format!("oid={:016x} stripe_size={} targets={} token={}", l.oid, l.stripe_size, join(&l.targets), token);
    if l.is_progressive() {
        format!("pharos-layout v2 {head} component_size={} perf={}\n", l.component_size, join(&l.perf))
    } else {
        format!("pharos-layout v1 {head}\n")
    }
}

/// Decodes a layout sidecar (v1 or v2); returns the layout and the create token.
pub fn parse_layout(s: &str) -> Option<(Layout, u64)> {
    let mut it = s.split_whitespace();
    if it.next()? != "pharos-layout" || !matches!(it.next()?, "v1" | "v2") {
        return None;
    }
    fn list<T: std::str::FromStr>(v: &str) -> Option<Vec<T>> {
        v.split(',').filter(|x| !x.is_empty()).map(|x| x.parse().ok()).collect()
    }
    let (mut oid, mut ss, mut targets, mut token, mut cs, mut perf) = (None, None, None, 0, 0, Vec::new());
    for kv in it {
        let (k, v) = kv.split_once('=')?;
        match k {
            "oid" => oid = u64::from_str_radix(v, 16).ok(),
            "stripe_size" => ss = v.parse().ok(),
            "targets" => targets = list(v),
            "token" => token = v.parse().ok()?,
            "component_size" => cs = v.parse().ok()?,
            "perf" => perf = list(v)?,
            _ => {}
        }
    }
    let l = Layout { oid: oid?, stripe_size: ss?, targets: targets?, component_size: cs, perf };
    if l.stripe_size == 0 || l.targets.is_empty() || !(l.perf.is_empty() || l.perf.len() == l.targets.len()) {
        return None;
    }
    Some((l, token))
}

/// One contiguous piece of a logical byte range inside one object.
#[derive(Debug, PartialEq)]
pub struct Piece {
    /// Object index: the stripe (classic layout) or the component (progressive layout).
    pub obj: u64,
    pub obj_off: u64,
    pub len: u64,
    /// Offset of the piece within the request buffer.
    pub buf_off: u64,
}

/// Splits `[off, off+len)` of a file with layout `l` into per-object pieces: RAID-0 over
/// the targets (classic), or one piece per component (progressive).
pub fn pieces(l: &Layout, off: u64, len: u64) -> Vec<Piece> {
    let (k, ss) = (l.targets.len() as u64, if l.is_progressive() { l.component_size } else { l.stripe_size });
    let mut out = Vec::new();
    let mut pos = off;
    let end = off + len;
    while pos < end {
        let unit = pos / ss;
        let within = pos % ss;
        let n = (ss - within).min(end - pos);
        let (obj, obj_off) = if l.is_progressive() { (unit, within) } else { (unit % k, (unit / k) * ss + within) };
        out.push(Piece { obj, obj_off, len: n, buf_off: pos - off });
        pos += n;
    }
    out
}

/// Logical file size implied by component `k` (of `component_size` bytes) holding `s`
/// bytes: 0 when empty.
pub fn logical_from_component(component_size: u64, k: u64, s: u64) -> u64 {
    if s == 0 {
        0
    } else {
        k * component_size + s
    }
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
    rows * ss
        + if i < col {
            ss
        } else if i == col {
            rem
        } else {
            0
        }
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
        let comp_dir = mdt.join("components");
        for d in [&ns, &tmp, &open_dir, &orphan_dir, &daemons, &comp_dir] {
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
            ns_fd: nsfs::open_dir(&ns)?,
            ns,
            tmp,
            open_dir,
            orphan_dir,
            comp_dir,
            targets: ts,
            placement: ArcSwap::from_pointee(Placement::default()),
            rr: AtomicU64::new(random_u64() % 1024),
            fds: Mutex::new(HashMap::new()),
            comps: Mutex::new(HashMap::new()),
            writing: Mutex::new(HashMap::new()),
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
            match fs::DirBuilder::new().mode(0o700).create(&d) {
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

    fn marker_path(&self, oid: u64, h: OpenHandle) -> PathBuf {
        self.marker_dir(oid).join(marker_name(h))
    }

    /// The target open `h` of `oid` is counted on (progressive files), from its marker.
    fn counted_target(&self, oid: u64, h: OpenHandle) -> Option<u32> {
        marker_target(&self.marker_path(oid, h))
    }

    /// Records in the marker of open `h` the target it is counted on; false when the marker
    /// is gone (a dead daemon's open removed by the start-time GC: the open is not counted).
    fn set_counted_target(&self, oid: u64, h: OpenHandle, t: Option<u32>) -> bool {
        let Ok(f) = OpenOptions::new().write(true).open(self.marker_path(oid, h)) else { return false };
        // Fixed width, written in place: a concurrent reader sees the old or the new index.
        let r = match t {
            Some(t) => f.write_all_at(format!("{t:010}\n").as_bytes(), 0),
            None => f.set_len(0),
        };
        r.is_ok()
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
        let written = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&rec)
            .and_then(|mut f| f.write_all(layout_text(l, 0).as_bytes()));
        if let Err(e) = written {
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
                    if stale {
                        let counted = marker_target(&m.path());
                        if fs::remove_file(m.path()).is_ok() {
                            st.stale_markers += 1;
                            // The dead open no longer writes its component.
                            if let Some(t) = counted.and_then(|t| self.targets.get(t as usize)) {
                                t.shm.add_open(-1);
                            }
                        }
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
            if let Some(cs) = pool.component_size {
                if cs == 0 || cs % COMPONENT_ALIGN != 0 {
                    return Err(format!(
                        "pool {name}: component_size {cs} must be a positive multiple of {COMPONENT_ALIGN}"
                    ));
                }
                if pool.stripe_count.is_some_and(|c| c > 1) {
                    return Err(format!("pool {name}: component_size and stripe_count > 1 exclude each other"));
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

    /// The performance-aware rule (Sunway lessons §5): the `k` candidates with the highest
    /// `max_perf / (open_count + 1)`, ties to the lower index. A candidate is `(target
    /// index, planned MB/s)`; a plan of 0 means the target's token-bucket limit (or 1 when
    /// unlimited).
    fn best_targets(&self, candidates: impl Iterator<Item = (u32, f64)>, k: usize) -> Vec<u32> {
        let mut scored: Vec<(f64, u32)> = candidates
            .map(|(i, plan)| {
                let t = &self.targets[i as usize];
                let perf = if plan > 0.0 { plan } else { Some(t.shm.max_perf()).filter(|&m| m > 0.0).unwrap_or(1.0) };
                (perf / (t.shm.open_count() as f64 + 1.0), i)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().take(k.max(1)).map(|(_, i)| i).collect()
    }

    /// Chooses the layout of a new file of job `job`: round-robin, or the pool's rule for
    /// the whole file, or (pool with `component_size`) a progressive layout whose candidate
    /// targets are the pool's.
    pub fn place(&self, job: &str) -> Layout {
        let p = self.placement.load();
        let stripe_size = p.stripe_size.unwrap_or(1 << 20);
        let pool = p.job_pools.get(job).or(p.default_pool.as_ref()).and_then(|n| p.pools.get(n));
        let oid = random_u64();
        match pool {
            Some(pool) => {
                let cands: Vec<(u32, f64)> = pool
                    .targets
                    .iter()
                    .filter_map(|n| Some((self.target_index(n)?, pool.max_perf.get(n).copied().unwrap_or(0.0))))
                    .collect();
                if let Some(cs) = pool.component_size {
                    let (targets, perf) = cands.into_iter().unzip();
                    return Layout { oid, stripe_size, targets, component_size: cs, perf };
                }
                let k = pool.stripe_count.unwrap_or(1) as usize;
                Layout::striped(oid, stripe_size, self.best_targets(cands.into_iter(), k))
            }
            None => {
                let n = self.targets.len() as u64;
                let k = p.stripe_count.unwrap_or(1).max(1) as u64;
                let first = self.rr.fetch_add(k, Relaxed);
                Layout::striped(oid, stripe_size, (0..k).map(|j| ((first + j) % n) as u32).collect())
            }
        }
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

    /// Object `idx` (stripe or component) of `oid` on target `ti`.
    fn obj_path(&self, ti: u32, oid: u64, idx: u64) -> PathBuf {
        self.targets[ti as usize].dir.join(format!("{oid:016x}.{idx}"))
    }

    fn check_layout(&self, l: &Layout) -> Res<()> {
        if l.stripe_size == 0 || l.targets.is_empty() || l.targets.len() > self.targets.len() {
            return Err(eno(errno::EINVAL, "invalid layout"));
        }
        if l.targets.iter().any(|&t| t as usize >= self.targets.len()) {
            return Err(eno(errno::EINVAL, "layout names an unknown target"));
        }
        if !(l.perf.is_empty() || l.perf.len() == l.targets.len()) {
            return Err(eno(errno::EINVAL, "layout perf does not match its targets"));
        }
        Ok(())
    }

    /// The open object file `idx` of `oid` on target `ti`; `create` makes it when missing
    /// (components are made by their first write), else a missing object is ENOENT.
    fn obj_fd(&self, ti: u32, oid: u64, idx: u64, create: bool) -> Res<Arc<File>> {
        let key = (ti, oid, idx);
        if let Some(f) = self.fds.lock().unwrap().get(&key) {
            return Ok(f.clone());
        }
        let f = OpenOptions::new().read(true).write(true).create(create).mode(0o600).open(self.obj_path(ti, oid, idx));
        let f = Arc::new(f.map_err(werr)?);
        let mut m = self.fds.lock().unwrap();
        if m.len() >= FD_CACHE_MAX {
            m.clear();
        }
        m.insert(key, f.clone());
        Ok(f)
    }

    /// Like [`Backend::obj_fd`] without create, but a missing object is `None`.
    fn existing_obj(&self, ti: u32, oid: u64, idx: u64) -> Res<Option<Arc<File>>> {
        match self.obj_fd(ti, oid, idx, false) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.errno == errno::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn comp_dir(&self, oid: u64) -> PathBuf {
        self.comp_dir.join(format!("{oid:016x}"))
    }

    /// The target of component `k` of progressive layout `l`: from the cache, else from its
    /// record; when there is none and `place` is set, chosen now by the performance-aware
    /// rule over the layout's candidates and recorded (the first record linked wins; a
    /// loser returns the winner's choice). `None`: not placed yet (and `!place`).
    pub fn component(&self, l: &Layout, k: u64, place: bool) -> Res<Option<u32>> {
        if let Some(&t) = self.comps.lock().unwrap().get(&(l.oid, k)) {
            return Ok(Some(t));
        }
        let rec = self.comp_dir(l.oid).join(k.to_string());
        let t = match fs::read_to_string(&rec) {
            Ok(text) => text.trim().parse().ok().filter(|&t: &u32| (t as usize) < self.targets.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound && place => {
                let cands = l.targets.iter().enumerate().map(|(j, &t)| (t, l.perf.get(j).copied().unwrap_or(0.0)));
                let t = self.best_targets(cands, 1)[0];
                let mut staged = tempfile::Builder::new().prefix("component-").tempfile_in(&self.tmp).map_err(werr)?;
                staged.write_all(format!("{t}\n").as_bytes()).map_err(werr)?;
                match staged.persist_noclobber(&rec) {
                    Ok(_) => Some(t),
                    // Another daemon (or thread) placed it first: its choice holds.
                    Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => return self.component(l, k, false),
                    // No component directory: the file's objects were deleted.
                    Err(e) => return Err(werr(e.error)),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(werr(e)),
        };
        let t = t.ok_or_else(|| eno(errno::EIO, format!("corrupt component record {}", rec.display())))?;
        let mut m = self.comps.lock().unwrap();
        if m.len() >= COMP_CACHE_MAX {
            m.clear();
        }
        m.insert((l.oid, k), t);
        Ok(Some(t))
    }

    /// The target of component `k`, placing it if needed.
    fn placed(&self, l: &Layout, k: u64) -> Res<u32> {
        self.component(l, k, true)?.ok_or_else(|| eno(errno::EIO, "component not placed"))
    }

    /// The data objects a layout may have, as (object index, target): every stripe of a
    /// classic layout; the recorded components of a progressive one (whose objects may
    /// still be missing).
    fn objects(&self, l: &Layout) -> Res<Vec<(u64, u32)>> {
        if !l.is_progressive() {
            return Ok(l.targets.iter().enumerate().map(|(s, &t)| (s as u64, t)).collect());
        }
        let it = match fs::read_dir(self.comp_dir(l.oid)) {
            Ok(it) => it,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(werr(e)),
        };
        let mut out = Vec::new();
        for e in it {
            let Some(k) = e.map_err(werr)?.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else { continue };
            if let Some(t) = self.component(l, k, false)? {
                out.push((k, t));
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Targets a classic file counts as open on from open to release (progressive files
    /// count per written component instead, see [`Backend::enter`]).
    fn whole_file_targets(l: &Layout) -> &[u32] {
        if l.is_progressive() {
            &[]
        } else {
            &l.targets
        }
    }

    /// Open `h` of progressive file `l` is about to write component `k`: returns its target
    /// (placing the component if needed) and moves the handle's open count there. The count
    /// of the component it wrote before (from its marker, wherever that was) is dropped
    /// first, so the placement sees the other writers only. `h` = default (no handle):
    /// placement without counting.
    fn enter(&self, l: &Layout, h: OpenHandle, k: u64) -> Res<u32> {
        if h == OpenHandle::default() {
            return self.placed(l, k);
        }
        let mut writing = self.writing.lock().unwrap();
        if writing.get(&h) == Some(&(l.oid, k)) {
            drop(writing);
            return self.placed(l, k);
        }
        if let Some(prev) = self.counted_target(l.oid, h) {
            self.targets[prev as usize].shm.add_open(-1);
            self.set_counted_target(l.oid, h, None);
        }
        let t = self.placed(l, k)?;
        if self.set_counted_target(l.oid, h, Some(t)) {
            self.targets[t as usize].shm.add_open(1);
        }
        if writing.len() >= COMP_CACHE_MAX {
            writing.clear();
        }
        writing.insert(h, (l.oid, k));
        Ok(t)
    }

    /// Target of the first byte of `l`, as far as known without I/O (records, metrics).
    pub fn first_target(&self, l: &Layout, off: u64) -> Option<u32> {
        self.check_layout(l).ok()?;
        let pc = pieces(l, off, 1).pop()?;
        if l.is_progressive() {
            self.comps.lock().unwrap().get(&(l.oid, pc.obj)).copied()
        } else {
            l.targets.get(pc.obj as usize).copied()
        }
    }

    /// The caller's credentials on this thread until the guard drops (see [`crate::nsfs`]).
    fn caller(&self, ctx: &Ctx) -> Caller {
        Caller::assume(ctx.uid, ctx.gid, &ctx.groups)
    }

    /// The directory holding `path` (an `O_PATH` fd; the namespace root itself for the root)
    /// and the last component (`.` for the root). Resolved with the thread's credentials
    /// (search permission), never through a symlink nor out of the namespace.
    fn parent(&self, path: &str) -> Res<(OwnedFd, CString)> {
        let comps = validate_path(path)?;
        let Some((last, dirs)) = comps.split_last() else {
            return Ok((self.ns_fd.try_clone().map_err(werr)?, c".".to_owned()));
        };
        let name = nsfs::cstr(last).map_err(werr)?;
        if dirs.is_empty() {
            return Ok((self.ns_fd.try_clone().map_err(werr)?, name));
        }
        // Directories a few thousand bytes at a time: a path below the namespace root may be
        // longer than PATH_MAX (see `pharos_fwd_proto::MAX_PATH`).
        let mut d: Option<OwnedFd> = None;
        let mut chunk = String::new();
        for (i, c) in dirs.iter().enumerate() {
            if !chunk.is_empty() {
                chunk.push('/');
            }
            chunk.push_str(c);
            if i + 1 < dirs.len() && chunk.len() + 1 + dirs[i + 1].len() < 3072 {
                continue;
            }
            let rel = nsfs::cstr(&chunk).map_err(werr)?;
            let from = d.as_ref().unwrap_or(&self.ns_fd).as_raw_fd();
            d = Some(nsfs::open_beneath(from, &rel).map_err(|e| match e.raw_os_error() {
                // A symlink on the way (RESOLVE_NO_SYMLINKS): a client never sends one.
                Some(libc::ELOOP) | Some(libc::EXDEV) => eno(errno::ELOOP, "symlink in a request path"),
                _ => werr(e),
            })?);
            chunk.clear();
        }
        Ok((d.expect("at least one directory"), name))
    }

    /// Reads the layout sidecar `name` of directory `dir` (as the daemon: sidecars may have
    /// any mode); also returns the open sidecar (its link count tells when the last name
    /// went).
    fn layout_at(&self, dir: &OwnedFd, name: &CStr) -> Res<(Layout, u64, File)> {
        // O_NOATIME: reading the layout is not an access of the file (its atime is the sidecar's).
        let ro = libc::O_RDONLY | libc::O_NOFOLLOW;
        let mut f = match nsfs::openat(dir.as_raw_fd(), name, ro | libc::O_NOATIME, 0) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => nsfs::openat(dir.as_raw_fd(), name, ro, 0),
            r => r,
        }
        .map_err(werr)?;
        let mut s = String::new();
        std::io::Read::read_to_string(&mut f, &mut s).map_err(werr)?;
        let (l, tok) = parse_layout(&s).ok_or_else(|| eno(errno::EIO, format!("corrupt layout sidecar {name:?}")))?;
        Ok((l, tok, f))
    }

    /// Reads the layout sidecar of a namespace file (request path).
    pub fn read_layout(&self, path: &str) -> Res<(Layout, u64)> {
        let (d, name) = self.parent(path)?;
        self.layout_at(&d, &name).map(|(l, t, _)| (l, t))
    }

    /// The attributes of `name` in `dir` whose `lstat` is `st`: a regular file's size,
    /// blocks and times come from its data objects too (its sidecar is read as the daemon).
    fn attr_at(&self, dir: &OwnedFd, name: &CStr, st: &libc::stat) -> Res<Attr> {
        let kind = kind_of_mode(st.st_mode);
        let mut a = Attr {
            ino: st.st_ino,
            kind,
            perm: st.st_mode & 0o7777,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            rdev: if matches!(kind, Kind::CharDev | Kind::BlockDev) { st.st_rdev } else { 0 },
            atime: t(st.st_atime, st.st_atime_nsec),
            mtime: t(st.st_mtime, st.st_mtime_nsec),
            ctime: t(st.st_ctime, st.st_ctime_nsec),
        };
        if kind == Kind::File {
            let (l, _, _) = self.layout_at(dir, name)?;
            let (size, blocks, mtime, ctime) = self.data_stat(&l)?;
            a.size = size;
            a.blocks = blocks;
            // Data writes and truncates change the objects' times, name operations the
            // sidecar's: the file's are the newer of each.
            a.mtime = a.mtime.max(mtime);
            a.ctime = a.ctime.max(ctime);
        }
        Ok(a)
    }

    /// Logical size, blocks, newest mtime and newest ctime of a file's objects.
    fn data_stat(&self, l: &Layout) -> Res<(u64, u64, Time, Time)> {
        self.check_layout(l)?;
        let (mut size, mut blocks, mut mt, mut ct) = (0u64, 0u64, t(0, 0), t(0, 0));
        for (idx, ti) in self.objects(l)? {
            let Some(f) = self.existing_obj(ti, l.oid, idx)? else { continue };
            let md = f.metadata().map_err(werr)?;
            let end = if l.is_progressive() {
                logical_from_component(l.component_size, idx, md.size())
            } else {
                logical_from_obj(l, idx as u32, md.size())
            };
            size = size.max(end);
            blocks += md.blocks();
            mt = mt.max(t(md.mtime(), md.mtime_nsec()));
            ct = ct.max(t(md.ctime(), md.ctime_nsec()));
        }
        Ok((size, blocks, mt, ct))
    }

    /// Attributes of `path` (lookup and getattr), with the caller's search permissions.
    pub fn getattr(&self, path: &str, ctx: &Ctx) -> Res<Attr> {
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        drop(g);
        self.attr_at(&d, &name, &st)
    }

    /// One page of the directory `path` from `cookie` (0 = start; else an entry's `next`),
    /// at most [`READDIR_PAGE_BYTES`] of names; `true` = the end was reached. `.` and `..`
    /// come as the file system lists them.
    pub fn readdir(&self, path: &str, cookie: u64, ctx: &Ctx) -> Res<(Vec<DirEntry>, bool)> {
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let f = nsfs::openat(d.as_raw_fd(), &name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
            .map_err(werr)?;
        drop(g);
        let dir = unsafe { libc::fdopendir(f.as_raw_fd()) };
        if dir.is_null() {
            return Err(werr(io::Error::last_os_error()));
        }
        std::mem::forget(f); // owned by the DIR stream now
        struct Closer(*mut libc::DIR);
        impl Drop for Closer {
            fn drop(&mut self) {
                unsafe { libc::closedir(self.0) };
            }
        }
        let _close = Closer(dir);
        if cookie != 0 {
            unsafe { libc::seekdir(dir, cookie as libc::c_long) };
        }
        let (mut out, mut bytes) = (Vec::new(), 0usize);
        loop {
            if bytes >= READDIR_PAGE_BYTES {
                return Ok((out, false));
            }
            unsafe { *libc::__errno_location() = 0 };
            let e = unsafe { libc::readdir64(dir) };
            if e.is_null() {
                let err = io::Error::last_os_error();
                if err.raw_os_error().unwrap_or(0) != 0 {
                    return Err(werr(err));
                }
                return Ok((out, true));
            }
            let e = unsafe { &*e };
            let cname = unsafe { CStr::from_ptr(e.d_name.as_ptr()) };
            let Ok(n) = cname.to_str() else { continue };
            let kind = match e.d_type {
                libc::DT_REG => Kind::File,
                libc::DT_DIR => Kind::Dir,
                libc::DT_LNK => Kind::Symlink,
                libc::DT_FIFO => Kind::Fifo,
                libc::DT_SOCK => Kind::Socket,
                libc::DT_CHR => Kind::CharDev,
                libc::DT_BLK => Kind::BlockDev,
                _ => nsfs::lstat(unsafe { libc::dirfd(dir) }, cname)
                    .map(|st| kind_of_mode(st.st_mode))
                    .unwrap_or(Kind::Other),
            };
            bytes += n.len() + 32;
            out.push(DirEntry { name: n.to_string(), ino: e.d_ino, kind, next: e.d_off as u64 });
        }
    }

    pub fn mkdir(&self, path: &str, mode: u32, ctx: &Ctx) -> Res<Attr> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        nsfs::private_umask();
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        nsfs::mkdirat(d.as_raw_fd(), &name, mode & 0o7777).map_err(werr)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        drop(g);
        self.attr_at(&d, &name, &st)
    }

    pub fn rmdir(&self, path: &str, ctx: &Ctx) -> Res<()> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EBUSY, "namespace root"));
        }
        let _g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        nsfs::unlinkat(d.as_raw_fd(), &name, libc::AT_REMOVEDIR).map_err(werr)
    }

    /// A symbolic link `path` → `target`.
    pub fn symlink(&self, path: &str, target: &str, ctx: &Ctx) -> Res<Attr> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        let target = nsfs::cstr(target).map_err(werr)?;
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        nsfs::symlinkat(&target, d.as_raw_fd(), &name).map_err(werr)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        drop(g);
        self.attr_at(&d, &name, &st)
    }

    pub fn readlink(&self, path: &str, ctx: &Ctx) -> Res<String> {
        let _g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let b = nsfs::readlinkat(d.as_raw_fd(), &name).map_err(werr)?;
        String::from_utf8(b).map_err(|_| eno(errno::EIO, "symlink target is not UTF-8"))
    }

    /// A hard link `to` of `from`: both names share the sidecar, hence the layout and data.
    pub fn link(&self, from: &str, to: &str, ctx: &Ctx) -> Res<Attr> {
        if validate_path(to)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        let g = self.caller(ctx);
        let (a, an) = self.parent(from)?;
        let (b, bn) = self.parent(to)?;
        nsfs::linkat(a.as_raw_fd(), &an, b.as_raw_fd(), &bn, 0).map_err(werr)?;
        let st = nsfs::lstat(b.as_raw_fd(), &bn).map_err(werr)?;
        drop(g);
        self.attr_at(&b, &bn, &st)
    }

    /// A FIFO, socket or device node (the type bits of `mode`); a regular file gets a
    /// layout like [`Backend::create`] (and is not left open).
    pub fn mknod(&self, path: &str, mode: u32, rdev: u64, ctx: &Ctx) -> Res<Attr> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 {
            let (a, l, h) = self.create(path, mode & 0o7777, libc::O_CREAT | libc::O_EXCL, 0, ctx)?;
            self.release(&l, h)?;
            return Ok(a);
        }
        nsfs::private_umask();
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        nsfs::mknodat(d.as_raw_fd(), &name, mode, rdev).map_err(werr)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        drop(g);
        self.attr_at(&d, &name, &st)
    }

    /// Deletes the objects of `l` (and the component records of a progressive layout).
    fn remove_objects(&self, l: &Layout) {
        let objs = self.objects(l).unwrap_or_else(|e| {
            log::warn!("objects of {:016x}: {}", l.oid, e.msg);
            Vec::new()
        });
        let mut fds = self.fds.lock().unwrap();
        for &(idx, ti) in &objs {
            fds.remove(&(ti, l.oid, idx));
        }
        drop(fds);
        for (idx, ti) in objs {
            let _ = fs::remove_file(self.obj_path(ti, l.oid, idx));
        }
        if l.is_progressive() {
            let _ = fs::remove_dir_all(self.comp_dir(l.oid));
            self.comps.lock().unwrap().retain(|&(oid, _), _| oid != l.oid);
        }
    }

    /// The open sidecar and layout of `name` in `dir` when it is a regular file (to tell,
    /// after a name operation, whether its last name went: link count 0).
    fn file_at(&self, dir: &OwnedFd, name: &CStr) -> Option<(Layout, File)> {
        let st = nsfs::lstat(dir.as_raw_fd(), name).ok()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        self.layout_at(dir, name).ok().map(|(l, _, f)| (l, f))
    }

    /// After a name of the file (`l`, open sidecar `f`) went: its data goes too when that was
    /// the last name (hard links share the sidecar; its link count says).
    fn name_gone(&self, l: &Layout, f: &File) {
        if nsfs::fstat(f.as_raw_fd()).map(|st| st.st_nlink == 0).unwrap_or(false) {
            self.drop_file(l);
        }
    }

    pub fn unlink(&self, path: &str, ctx: &Ctx) -> Res<()> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EISDIR, "namespace root"));
        }
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        drop(g);
        let file = self.file_at(&d, &name);
        let g = self.caller(ctx);
        nsfs::unlinkat(d.as_raw_fd(), &name, 0).map_err(werr)?;
        drop(g);
        if let Some((l, f)) = file {
            self.name_gone(&l, &f);
        }
        Ok(())
    }

    pub fn rename(&self, from: &str, to: &str, noreplace: bool, ctx: &Ctx) -> Res<()> {
        if validate_path(from)?.is_empty() || validate_path(to)?.is_empty() {
            return Err(eno(errno::EBUSY, "namespace root"));
        }
        let g = self.caller(ctx);
        let (a, an) = self.parent(from)?;
        let (b, bn) = self.parent(to)?;
        drop(g);
        let replaced = self.file_at(&b, &bn);
        let flags = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
        let g = self.caller(ctx);
        nsfs::renameat2(a.as_raw_fd(), &an, b.as_raw_fd(), &bn, flags).map_err(werr)?;
        drop(g);
        // The replaced file's data goes with its last name (not when both names were links
        // of one file: then rename does nothing).
        if let Some((l, f)) = replaced {
            self.name_gone(&l, &f);
        }
        Ok(())
    }

    /// Creates (or, without `O_EXCL` in `flags` and when it exists, opens) a regular file for
    /// the caller `ctx` (its job picks the placement pool; it owns the file, with the
    /// parent's group in a setgid directory). Returns its attr, layout and open handle, and
    /// counts it open on its targets. The sidecar is written as an unnamed file
    /// (`O_TMPFILE`, with the caller's credentials) and linked into place, so other daemons
    /// never see it half-written and the kernel decides EEXIST races.
    pub fn create(&self, path: &str, mode: u32, flags: i32, token: u64, ctx: &Ctx) -> Res<(Attr, Layout, OpenHandle)> {
        let excl = flags & libc::O_EXCL != 0;
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EISDIR, "namespace root"));
        }
        if !excl {
            match self.open(path, flags & !libc::O_TRUNC, ctx) {
                Err(e) if e.errno == errno::ENOENT => {}
                r => return r,
            }
        }
        nsfs::private_umask();
        // Permission to create there first (search and write), before anything is placed.
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let staged = nsfs::openat(d.as_raw_fd(), c".", libc::O_TMPFILE | libc::O_WRONLY, mode & 0o7777);
        drop(g);
        let mut staged = staged.map_err(werr)?;
        let l = self.place(&ctx.job_id);
        let mut made = Vec::new();
        let cleanup = |made: &Vec<PathBuf>| {
            for m in made.iter().rev() {
                let _ = if m.is_dir() { fs::remove_dir(m) } else { fs::remove_file(m) };
            }
        };
        if l.is_progressive() {
            // Components are placed by their first write; their records go here.
            let d = self.comp_dir(l.oid);
            fs::DirBuilder::new().mode(0o700).create(&d).map_err(werr)?;
            made.push(d);
        }
        for &(s, ti) in &self.objects(&l)? {
            let op = self.obj_path(ti, l.oid, s);
            if let Err(e) = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&op) {
                cleanup(&made);
                return Err(werr(e));
            }
            made.push(op);
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
        let res = staged.write_all(layout_text(&l, token).as_bytes()).and_then(|()| {
            let _g = self.caller(ctx);
            nsfs::link_tmpfile(&staged, d.as_raw_fd(), &name)
        });
        drop(staged);
        if let Err(e) = res {
            self.remove_marker(l.oid, h);
            cleanup(&made);
            if e.raw_os_error() == Some(errno::EEXIST) {
                // A replay of this very create (same token) succeeded earlier: open it.
                if let Ok((_, tok, _)) = self.layout_at(&d, &name) {
                    if tok == token && token != 0 {
                        return self.open(path, libc::O_RDWR, ctx);
                    }
                }
                if !excl {
                    return self.open(path, flags & !libc::O_TRUNC, ctx);
                }
            }
            return Err(werr(e));
        }
        for &ti in Self::whole_file_targets(&l) {
            self.targets[ti as usize].shm.add_open(1);
        }
        let attr = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr).and_then(|st| self.attr_at(&d, &name, &st));
        match attr {
            Ok(a) => Ok((a, l, h)),
            Err(e) => {
                let _ = self.release(&l, h);
                Err(e)
            }
        }
    }

    /// The access an open with `flags` needs (`O_TRUNC` needs write permission).
    fn access_mode(flags: i32) -> libc::c_int {
        let m = match flags & libc::O_ACCMODE {
            libc::O_WRONLY => libc::W_OK,
            libc::O_RDWR => libc::R_OK | libc::W_OK,
            _ => libc::R_OK,
        };
        if flags & libc::O_TRUNC != 0 {
            m | libc::W_OK
        } else {
            m
        }
    }

    /// Opens an existing regular file with open(2) `flags` (access checked with the caller's
    /// credentials; `O_TRUNC` truncates): returns attr, layout and open handle, and counts it
    /// open. The open is recorded (marker) before it is reported, so a later unlink keeps
    /// the data until [`Backend::release`].
    pub fn open(&self, path: &str, flags: i32, ctx: &Ctx) -> Res<(Attr, Layout, OpenHandle)> {
        let truncate = flags & libc::O_TRUNC != 0;
        for _ in 0..16 {
            let g = self.caller(ctx);
            let (d, name) = self.parent(path)?;
            let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
            match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => return Err(eno(errno::EISDIR, "is a directory")),
                libc::S_IFLNK => return Err(eno(errno::ELOOP, "a symbolic link")),
                libc::S_IFREG => {}
                _ => return Err(eno(errno::EINVAL, "not a regular file")),
            }
            nsfs::access(d.as_raw_fd(), &name, Self::access_mode(flags)).map_err(werr)?;
            drop(g);
            let (l, _, _) = self.layout_at(&d, &name)?;
            self.check_layout(&l)?;
            let h = self.add_marker(l.oid)?;
            // Still the same file under this name? Else an unlink or rename raced us: the
            // objects may already be going; drop this open and look again.
            match self.layout_at(&d, &name) {
                Ok((now, _, _)) if now.oid == l.oid => {}
                Ok(_) => {
                    self.unmark(&l, h);
                    continue;
                }
                Err(e) => {
                    self.unmark(&l, h);
                    return Err(e);
                }
            }
            for &ti in Self::whole_file_targets(&l) {
                self.targets[ti as usize].shm.add_open(1);
            }
            let done = (|| {
                if truncate {
                    self.truncate(&l, 0)?;
                }
                let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
                self.attr_at(&d, &name, &st)
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
        for &ti in Self::whole_file_targets(l) {
            self.targets[ti as usize].shm.add_open(-1);
        }
        if l.is_progressive() {
            // The component this open was writing (recorded by whichever daemon served it).
            let mut writing = self.writing.lock().unwrap();
            writing.remove(&h);
            if let Some(t) = self.counted_target(l.oid, h) {
                self.set_counted_target(l.oid, h, None);
                self.targets[t as usize].shm.add_open(-1);
            }
        }
        self.unmark(l, h);
        Ok(())
    }

    fn truncate(&self, l: &Layout, size: u64) -> Res<()> {
        if !l.is_progressive() {
            for (s, ti) in self.objects(l)? {
                self.obj_fd(ti, l.oid, s, false)?.set_len(obj_size(l, size, s as u32)).map_err(werr)?;
            }
            return Ok(());
        }
        // The component holding the last byte gets exactly the bytes up to the size (placed
        // now if needed, so that the size reads back); the ones after it are emptied. Their
        // records stay: components keep their targets while the file exists.
        let last = size.checked_sub(1).map(|b| b / l.component_size);
        if let Some(k) = last {
            self.obj_fd(self.placed(l, k)?, l.oid, k, true)?.set_len(size - k * l.component_size).map_err(werr)?;
        }
        for (k, ti) in self.objects(l)? {
            if last.is_none_or(|last| k > last) {
                if let Some(f) = self.existing_obj(ti, l.oid, k)? {
                    f.set_len(0).map_err(werr)?;
                }
            }
        }
        Ok(())
    }

    /// Changes attributes of `path` with the caller's credentials (chown, chmod and
    /// utimensat rules are the kernel's); a size change needs write permission unless it
    /// comes through a file open for writing (`by_fd`, ftruncate).
    ///
    /// A truncate by a caller without `CAP_FSETID` also clears setuid/setgid: the client's
    /// kernel (FUSE without `handle_killpriv`) sends the mode with those bits cleared along
    /// with the size. That mode is the truncate's side effect, not a chmod: it is applied
    /// as the daemon once the size change is allowed (the caller need not own the file), as
    /// the local kernel does (`ATTR_FORCE`). Any other mode is a chmod with the caller's
    /// rights.
    pub fn setattr(&self, path: &str, set: &SetAttr, by_fd: bool, ctx: &Ctx) -> Res<Attr> {
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        let fmt = st.st_mode & libc::S_IFMT;
        let cur = st.st_mode & 0o7777;
        let kill_mode = match (set.size, set.mode.map(|m| m & 0o7777)) {
            (Some(_), Some(m)) if m != cur && m | (cur & SUIDGID) == cur => Some(m),
            _ => None,
        };
        if set.size.is_some() {
            match fmt {
                libc::S_IFREG => {}
                libc::S_IFDIR => return Err(eno(errno::EISDIR, "is a directory")),
                _ => return Err(eno(errno::EINVAL, "not a regular file")),
            }
            if !by_fd {
                nsfs::access(d.as_raw_fd(), &name, libc::W_OK).map_err(werr)?;
            }
        }
        // Only for a chown: chown(-1, -1) is not a no-op (it clears setuid, and a non-owner
        // gets EPERM on such a file).
        if set.uid.is_some() || set.gid.is_some() {
            nsfs::fchownat(d.as_raw_fd(), &name, set.uid, set.gid).map_err(werr)?;
        }
        if let Some(mode) = set.mode.filter(|_| kill_mode.is_none()) {
            if fmt == libc::S_IFLNK {
                return Err(eno(libc::EOPNOTSUPP, "mode of a symbolic link"));
            }
            nsfs::fchmodat(d.as_raw_fd(), &name, mode & 0o7777).map_err(werr)?;
        }
        drop(g);
        if let Some(mode) = kill_mode {
            nsfs::fchmodat(d.as_raw_fd(), &name, mode).map_err(werr)?;
        }
        let layout = if fmt == libc::S_IFREG { Some(self.layout_at(&d, &name)?.0) } else { None };
        if let (Some(size), Some(l)) = (set.size, &layout) {
            self.truncate(l, size)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let ts = |x: &Option<Option<Time>>| match x {
                None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
                Some(None) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
                Some(Some(t)) => libc::timespec { tv_sec: t.sec, tv_nsec: t.nsec as i64 },
            };
            let times = [ts(&set.atime), ts(&set.mtime)];
            // Through an open file, "now" needs no permission (ftruncate's time update).
            let now_only = set.atime.is_none_or(|t| t.is_none()) && set.mtime.is_none_or(|t| t.is_none());
            let g = if by_fd && now_only { None } else { Some(self.caller(ctx)) };
            nsfs::utimensat(d.as_raw_fd(), &name, &times).map_err(werr)?;
            drop(g);
            if let Some(l) = &layout {
                for (idx, ti) in self.objects(l)? {
                    let q = nsfs::cstr(&self.obj_path(ti, l.oid, idx).to_string_lossy()).map_err(werr)?;
                    // A component placed but never written has no object yet.
                    match nsfs::utimensat(libc::AT_FDCWD, &q, &times) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(werr(e)),
                        _ => {}
                    }
                }
            }
        }
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        self.attr_at(&d, &name, &st)
    }

    /// Clears setuid, and setgid as Linux does ([`killed_by_write`]), of the regular file
    /// `path` when it still holds `l`'s object and open `h` is recorded: the side effect of
    /// a write by `ctx` without `CAP_FSETID` (see `Op::KillSuidgid`). Done as the daemon, as
    /// the local kernel does it for any writer (the writer need not own the file).
    pub fn kill_suidgid(&self, path: &str, l: &Layout, h: OpenHandle, ctx: &Ctx) -> Res<()> {
        self.check_layout(l)?;
        if !self.marker_path(l.oid, h).exists() {
            return Err(eno(errno::EBADF, "no such open"));
        }
        let (d, name) = self.parent(path)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || self.layout_at(&d, &name)?.0.oid != l.oid {
            return Ok(()); // the name holds another file now: nothing of this one to clear
        }
        let mode = st.st_mode & 0o7777;
        let in_group = st.st_gid == ctx.gid || ctx.groups.contains(&st.st_gid);
        let kill = killed_by_write(mode, in_group);
        if kill != 0 {
            nsfs::fchmodat(d.as_raw_fd(), &name, mode & !kill).map_err(werr)?;
        }
        Ok(())
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
    /// `None` for striped and progressive layouts (holes and pieces: use
    /// [`Backend::read_into`]).
    pub fn read_span(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo) -> Res<Option<FileSpan>> {
        self.check_layout(l)?;
        if l.targets.len() != 1 || l.is_progressive() {
            return Ok(None);
        }
        info.oid = l.oid;
        let ti = l.targets[0];
        info.target.get_or_insert(ti);
        let file = self.obj_fd(ti, l.oid, 0, false)?;
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
        let single = l.targets.len() == 1 && !l.is_progressive();
        let mut len = size as u64;
        if l.targets.len() > 1 && !l.is_progressive() {
            let (fsize, ..) = self.data_stat(l)?;
            len = len.min(fsize.saturating_sub(off));
        }
        if buf.len() < len as usize {
            buf.resize(len as usize, 0);
        }
        if !single {
            // Holes inside the size read as zeros: a reused buffer must not show old bytes.
            buf[..len as usize].fill(0);
        }
        let mut got_end = 0u64;
        // Progressive: a missing or short component is a hole or the end of the file; the
        // size (one stat per component) is looked at only then.
        let mut short = false;
        for pc in pieces(l, off, len) {
            let (ti, f) = if l.is_progressive() {
                let found = match self.component(l, pc.obj, false)? {
                    Some(ti) => self.existing_obj(ti, l.oid, pc.obj)?.map(|f| (ti, f)),
                    None => None,
                };
                let Some(found) = found else {
                    short = true;
                    continue;
                };
                found
            } else {
                let ti = l.targets[pc.obj as usize];
                (ti, self.obj_fd(ti, l.oid, pc.obj, false)?)
            };
            info.target.get_or_insert(ti);
            self.gate(ti, pc.len, info);
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
            if single {
                // Single object: a short read is the end of the file.
                got_end = pc.buf_off + n as u64;
                if n < pc.len as usize {
                    break;
                }
            } else {
                short |= n < pc.len as usize;
                got_end = pc.buf_off + pc.len; // holes inside the size read as zeros
            }
        }
        if l.is_progressive() {
            got_end = if short { len.min(self.data_stat(l)?.0.saturating_sub(off)) } else { len };
        }
        buf.truncate(got_end as usize);
        Ok(())
    }

    /// Writes `data` at `off` through open `h` (the default handle = none: progressive
    /// components are then placed but the write is not counted on their targets).
    pub fn write(&self, l: &Layout, h: OpenHandle, off: u64, data: &[u8], info: &mut IoInfo) -> Res<u32> {
        self.check_layout(l)?;
        info.oid = l.oid;
        if off.checked_add(data.len() as u64).is_none_or(|e| e > i64::MAX as u64) {
            return Err(eno(errno::EFBIG, "offset too large"));
        }
        for pc in pieces(l, off, data.len() as u64) {
            let ti = if l.is_progressive() { self.enter(l, h, pc.obj)? } else { l.targets[pc.obj as usize] };
            info.target.get_or_insert(ti);
            self.gate(ti, pc.len, info);
            let f = self.obj_fd(ti, l.oid, pc.obj, l.is_progressive())?;
            let t0 = Instant::now();
            f.write_all_at(&data[pc.buf_off as usize..(pc.buf_off + pc.len) as usize], pc.obj_off).map_err(werr)?;
            self.stretch(ti, t0.elapsed());
        }
        Ok(data.len() as u32)
    }

    /// Flushes every object of the file (all stripes, or all written components).
    pub fn fsync(&self, l: &Layout, datasync: bool, info: &mut IoInfo) -> Res<()> {
        self.check_layout(l)?;
        info.oid = l.oid;
        for (idx, ti) in self.objects(l)? {
            let f = if l.is_progressive() {
                match self.existing_obj(ti, l.oid, idx)? {
                    Some(f) => f,
                    None => continue,
                }
            } else {
                self.obj_fd(ti, l.oid, idx, false)?
            };
            info.target.get_or_insert(ti);
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

    const NOH: OpenHandle = OpenHandle { daemon: 0, id: 0 };
    const EXCL: i32 = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;

    fn lay(k: u32, ss: u64) -> Layout {
        Layout::striped(1, ss, (0..k).collect())
    }

    #[test]
    fn striping_math_is_consistent() {
        let l = lay(3, 4);
        let ps = pieces(&l, 2, 12);
        assert_eq!(ps[0], Piece { obj: 0, obj_off: 2, len: 2, buf_off: 0 });
        assert_eq!(ps[1], Piece { obj: 1, obj_off: 0, len: 4, buf_off: 2 });
        assert_eq!(ps[3], Piece { obj: 0, obj_off: 4, len: 2, buf_off: 10 });
        for size in 0..60u64 {
            let m = (0..3).map(|i| logical_from_obj(&l, i, obj_size(&l, size, i))).max().unwrap();
            assert_eq!(m, size, "size {size}");
        }
    }

    fn backend(n: usize) -> (tempfile::TempDir, Backend) {
        let d = tempfile::tempdir().unwrap();
        let ts: Vec<(String, PathBuf)> =
            (0..n).map(|i| (format!("ost{i}"), d.path().join(format!("ost{i}")))).collect();
        let b = Backend::new(&d.path().join("mdt"), &ts).unwrap();
        (d, b)
    }

    #[test]
    fn striped_file_roundtrip_and_truncate() {
        let (_d, b) = backend(4);
        b.placement.store(Arc::new(Placement { stripe_count: Some(3), stripe_size: Some(4096), ..Default::default() }));
        let (_, l, _) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        assert_eq!(l.targets.len(), 3);
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let mut info = IoInfo::default();
        assert_eq!(b.write(&l, NOH, 1000, &data, &mut info).unwrap(), 50_000);
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 51_000);
        let back = b.read(&l, 1000, 60_000, &mut info).unwrap();
        assert_eq!(back, data);
        let head = b.read(&l, 0, 1000, &mut info).unwrap();
        assert!(head.iter().all(|&x| x == 0));
        b.setattr("f", &SetAttr { size: Some(5000), ..Default::default() }, false, &Ctx::default()).unwrap();
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 5000);
        b.setattr("f", &SetAttr { size: Some(20_000), ..Default::default() }, false, &Ctx::default()).unwrap();
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 20_000);
        let r = b.read(&l, 0, 30_000, &mut info).unwrap();
        assert_eq!(r.len(), 20_000);
        assert_eq!(&r[1000..5000], &data[..4000]);
        assert!(r[5000..].iter().all(|&x| x == 0));
    }

    fn obj_count(d: &tempfile::TempDir) -> usize {
        (0..4)
            .map(|i| {
                fs::read_dir(d.path().join(format!("ost{i}")))
                    .map(|it| it.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count())
                    .unwrap_or(0)
            })
            .sum()
    }

    fn backend_on(d: &tempfile::TempDir, n: usize) -> Backend {
        let ts: Vec<(String, PathBuf)> =
            (0..n).map(|i| (format!("ost{i}"), d.path().join(format!("ost{i}")))).collect();
        Backend::new(&d.path().join("mdt"), &ts).unwrap()
    }

    #[test]
    fn unlinked_open_file_keeps_data_until_last_release_on_any_daemon() {
        let (d, a) = backend(2);
        let b = backend_on(&d, 2); // a second daemon on the same backend
        let mut info = IoInfo::default();
        let (_, l, h1) = a.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let (_, l2, h2) = b.open("f", libc::O_RDONLY, &Ctx::default()).unwrap();
        assert_eq!(l, l2);
        a.write(&l, NOH, 0, b"hello", &mut info).unwrap();
        assert_eq!(a.open_markers(l.oid), 2);
        b.unlink("f", &Ctx::default()).unwrap();
        assert_eq!(a.getattr("f", &Ctx::default()).unwrap_err().errno, errno::ENOENT);
        assert!(a.is_orphan(l.oid));
        // Both opens still read and write the orphan.
        a.write(&l, NOH, 5, b" world", &mut info).unwrap();
        assert_eq!(b.read(&l, 0, 100, &mut info).unwrap(), b"hello world");
        // A new file under the same name is another object.
        let (_, n, hn) = b.create("f", 0o644, EXCL, 2, &Ctx::default()).unwrap();
        assert_ne!(n.oid, l.oid);
        // Releases may come through either daemon: the last one deletes the data.
        b.release(&l, h1).unwrap();
        assert!(a.is_orphan(l.oid) && obj_count(&d) == 2);
        a.release(&l, h2).unwrap();
        assert!(!a.is_orphan(l.oid));
        assert_eq!(obj_count(&d), 1, "only the new file's object remains");
        // Rename over an open file: same rules.
        let (_, o, ho) = a.create("g", 0o644, EXCL, 3, &Ctx::default()).unwrap();
        b.rename("f", "g", false, &Ctx::default()).unwrap();
        assert!(a.is_orphan(o.oid));
        a.write(&o, NOH, 0, b"still here", &mut info).unwrap();
        assert_eq!(a.read(&o, 0, 100, &mut info).unwrap(), b"still here");
        b.release(&n, hn).unwrap(); // the moved file stays: it has a name
        assert!(!a.is_orphan(n.oid) && a.getattr("g", &Ctx::default()).is_ok());
        a.release(&o, ho).unwrap();
        assert!(!a.is_orphan(o.oid));
        assert_eq!(obj_count(&d), 1);
        // A closed file unlinked: objects go at once, no orphan record.
        b.unlink("g", &Ctx::default()).unwrap();
        assert_eq!(obj_count(&d), 0);
        assert_eq!(fs::read_dir(d.path().join("mdt/orphans")).unwrap().count(), 0);
        assert_eq!(fs::read_dir(d.path().join("mdt/open")).unwrap().count(), 0);
    }

    #[test]
    fn start_gc_drops_opens_of_dead_daemons_only() {
        let d = tempfile::tempdir().unwrap();
        let live = backend_on(&d, 2);
        let dead = backend_on(&d, 2);
        let (_, lx, _hx) = dead.create("x", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let (_, ly, hy) = live.create("y", 0o644, EXCL, 2, &Ctx::default()).unwrap();
        let (_, lz, _hz) = dead.open("y", libc::O_RDONLY, &Ctx::default()).unwrap();
        assert_eq!(lz, ly);
        live.unlink("x", &Ctx::default()).unwrap();
        live.unlink("y", &Ctx::default()).unwrap();
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

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Ctx {
        Ctx { uid, gid, groups: groups.to_vec(), ..Default::default() }
    }

    #[test]
    fn hard_links_share_data_and_the_last_name_drops_it() {
        let (d, b) = backend(2);
        let c = Ctx::default();
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &c).unwrap();
        let mut info = IoInfo::default();
        b.write(&l, h, 0, b"linked", &mut info).unwrap();
        b.release(&l, h).unwrap();
        let a = b.link("f", "g", &c).unwrap();
        assert_eq!((a.nlink, a.size, a.kind), (2, 6, Kind::File));
        assert_eq!(b.getattr("f", &c).unwrap().ino, a.ino);
        assert_eq!(b.link("f", "g", &c).unwrap_err().errno, errno::EEXIST);
        // Rename of one link onto the other does nothing (POSIX).
        b.rename("f", "g", false, &c).unwrap();
        assert_eq!(b.getattr("f", &c).unwrap().nlink, 2);
        b.unlink("f", &c).unwrap();
        assert_eq!(b.getattr("g", &c).unwrap().nlink, 1);
        let (_, l2, h2) = b.open("g", libc::O_RDONLY, &c).unwrap();
        assert_eq!(b.read(&l2, 0, 100, &mut info).unwrap(), b"linked");
        b.release(&l2, h2).unwrap();
        assert_eq!(obj_count(&d), 1);
        // Rename over the last name of a file: its data goes.
        b.create("h", 0o644, EXCL, 2, &c).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
        b.rename("h", "g", false, &c).unwrap();
        assert_eq!(obj_count(&d), 1);
        b.unlink("g", &c).unwrap();
        assert_eq!(obj_count(&d), 0);
        assert_eq!(
            b.mkdir("dir", 0o755, &c).map(|_| b.link("dir", "dir2", &c)).unwrap().unwrap_err().errno,
            errno::EPERM
        );
    }

    #[test]
    fn symlinks_special_files_and_paged_readdir() {
        let (_d, b) = backend(1);
        let c = Ctx::default();
        let a = b.symlink("l", "../somewhere/else", &c).unwrap();
        assert_eq!((a.kind, a.size), (Kind::Symlink, 17));
        assert_eq!(b.readlink("l", &c).unwrap(), "../somewhere/else");
        assert_eq!(b.open("l", libc::O_RDONLY, &c).unwrap_err().errno, errno::ELOOP);
        b.mkdir("d", 0o755, &c).unwrap();
        b.symlink("up", "d", &c).unwrap();
        // A symlink is never followed inside a request path.
        assert_eq!(b.getattr("up/x", &c).unwrap_err().errno, errno::ELOOP);
        assert_eq!(b.mknod("p", libc::S_IFIFO | 0o640, 0, &c).unwrap().kind, Kind::Fifo);
        assert_eq!(b.mknod("s", libc::S_IFSOCK | 0o600, 0, &c).unwrap().kind, Kind::Socket);
        let dev = libc::makedev(1, 3);
        let a = b.mknod("null", libc::S_IFCHR | 0o600, dev, &c).unwrap();
        assert_eq!((a.kind, a.rdev), (Kind::CharDev, dev));
        let a = b.mknod("reg", libc::S_IFREG | 0o600, 0, &c).unwrap();
        assert_eq!((a.kind, a.perm, a.size), (Kind::File, 0o600, 0));
        b.read_layout("reg").unwrap();
        // A directory larger than one page comes in several pages, every entry once.
        let names: Vec<String> = (0..3000).map(|i| format!("{i:0>120}")).collect();
        for n in &names {
            fs::File::create(b.ns_path(&format!("d/{n}")).unwrap()).unwrap();
        }
        let (mut got, mut cookie, mut pages) = (Vec::new(), 0, 0);
        loop {
            let (es, eof) = b.readdir("d", cookie, &c).unwrap();
            pages += 1;
            if let Some(last) = es.last() {
                cookie = last.next;
            }
            got.extend(es.into_iter().map(|e| e.name).filter(|n| n != "." && n != ".."));
            if eof {
                break;
            }
        }
        assert!(pages >= 2, "{pages} pages");
        got.sort();
        assert_eq!(got, names);
    }

    #[test]
    fn writes_and_truncates_by_others_clear_setuid_and_setgid() {
        assert_eq!(killed_by_write(0o4777, true), 0o4000);
        assert_eq!(killed_by_write(0o2777, true), 0o2000);
        assert_eq!(killed_by_write(0o2767, true), 0, "setgid without group-execute, a member");
        assert_eq!(killed_by_write(0o2767, false), 0o2000, "setgid without group-execute, not a member");
        assert_eq!(killed_by_write(0o6777, true), 0o6000);
        assert_eq!(killed_by_write(0o1777, false), 0);
        let (_d, b) = backend(1);
        if unsafe { libc::geteuid() } != 0 {
            return; // the daemon cannot chmod others' files then
        }
        let (root, u1) = (Ctx::default(), user(65534, 65534, &[]));
        let perm = |p: &str| b.getattr(p, &root).unwrap().perm;
        for (mode, left) in [(0o4777, 0o777), (0o2777, 0o777), (0o6777, 0o777), (0o2767, 0o767), (0o777, 0o777)] {
            let (_, l, h) = b.create("f", mode, EXCL, 0, &root).unwrap();
            b.setattr("f", &SetAttr { mode: Some(mode), ..Default::default() }, false, &root).unwrap();
            b.kill_suidgid("f", &l, h, &u1).unwrap();
            assert_eq!(perm("f"), left, "{mode:o}");
            // Not an open any more (or never one): refused.
            b.release(&l, h).unwrap();
            assert_eq!(b.kill_suidgid("f", &l, h, &u1).unwrap_err().errno, errno::EBADF);
            b.unlink("f", &root).unwrap();
        }
        // Another file under the name keeps its bits.
        let (_, l, h) = b.create("f", 0o4777, EXCL, 0, &root).unwrap();
        b.rename("f", "g", false, &root).unwrap();
        b.create("f", 0o644, EXCL, 0, &root).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
        b.setattr("f", &SetAttr { mode: Some(0o4777), ..Default::default() }, false, &root).unwrap();
        b.kill_suidgid("f", &l, h, &u1).unwrap();
        assert_eq!(perm("f"), 0o4777);
        b.release(&l, h).unwrap();
        // A truncate by a non-owner with write permission: the size and the mode without the
        // bits (as the client's kernel sends them) are applied; a chmod with it is refused.
        b.setattr("g", &SetAttr { mode: Some(0o6777), ..Default::default() }, false, &root).unwrap();
        let trunc = |mode| SetAttr { size: Some(1), mode: Some(mode), ..Default::default() };
        assert_eq!(b.setattr("g", &trunc(0o6755), false, &u1).unwrap_err().errno, errno::EPERM);
        let a = b.setattr("g", &trunc(0o777), false, &u1).unwrap();
        assert_eq!((a.perm, a.size), (0o777, 1));
        // Times and sizes alone (root's truncate: no mode) keep the bits.
        b.setattr("g", &SetAttr { mode: Some(0o6777), ..Default::default() }, false, &root).unwrap();
        b.setattr("g", &SetAttr { atime: Some(None), mtime: Some(None), ..Default::default() }, false, &u1).unwrap();
        b.setattr("g", &SetAttr { size: Some(0), ..Default::default() }, false, &root).unwrap();
        assert_eq!(perm("g"), 0o6777);
    }

    #[test]
    fn permissions_are_the_callers() {
        let (_d, b) = backend(1);
        if unsafe { libc::geteuid() } != 0 {
            return; // the checks are the daemon's own credentials then
        }
        let root = Ctx::default();
        let (u1, u2) = (user(65534, 65534, &[]), user(65533, 65533, &[4242]));
        b.mkdir("pub", 0o777, &root).unwrap();
        b.mkdir("priv", 0o755, &root).unwrap();
        assert_eq!(b.create("priv/f", 0o644, EXCL, 0, &u1).unwrap_err().errno, errno::EACCES);
        assert_eq!(b.mkdir("priv/d", 0o755, &u1).unwrap_err().errno, errno::EACCES);
        // The caller owns what it creates; others cannot open it for writing, chown or chmod it.
        let (a, l, h) = b.create("pub/f", 0o644, EXCL, 0, &u1).unwrap();
        b.release(&l, h).unwrap();
        assert_eq!((a.uid, a.gid, a.perm), (65534, 65534, 0o644));
        assert_eq!(b.open("pub/f", libc::O_WRONLY, &u2).unwrap_err().errno, errno::EACCES);
        b.open("pub/f", libc::O_RDONLY, &u2).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
        let chmod = SetAttr { mode: Some(0o600), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &chmod, false, &u2).unwrap_err().errno, errno::EPERM);
        let chown = SetAttr { uid: Some(65533), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &chown, false, &u1).unwrap_err().errno, errno::EPERM);
        let trunc = SetAttr { size: Some(0), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &trunc, false, &u2).unwrap_err().errno, errno::EACCES);
        // utimensat: "now" for both needs write permission; one of them alone, ownership.
        let now = SetAttr { atime: Some(None), mtime: Some(None), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &now, false, &u2).unwrap_err().errno, errno::EACCES);
        let mnow = SetAttr { mtime: Some(None), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &mnow, false, &u2).unwrap_err().errno, errno::EPERM);
        // Group membership through supplementary groups: 4242 may write a g+w file of group 4242.
        b.setattr("pub/f", &SetAttr { gid: Some(4242), mode: Some(0o664), ..Default::default() }, false, &root)
            .unwrap();
        b.open("pub/f", libc::O_WRONLY, &u2).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
        // Sticky directory: only the owner removes or renames its entries.
        b.setattr("pub", &SetAttr { mode: Some(0o1777), ..Default::default() }, false, &root).unwrap();
        assert_eq!(b.unlink("pub/f", &u2).unwrap_err().errno, errno::EPERM);
        assert_eq!(b.rename("pub/f", "pub/g", false, &u2).unwrap_err().errno, errno::EPERM);
        b.unlink("pub/f", &u1).unwrap();
        // setgid directory: new entries get its group; a non-member's setgid bit is cleared.
        b.setattr("pub", &SetAttr { mode: Some(0o2777), gid: Some(4242), ..Default::default() }, false, &root).unwrap();
        let a = b.mkdir("pub/sub", 0o755, &u1).unwrap();
        assert_eq!(a.gid, 4242);
        assert_eq!(a.perm & 0o2000, 0o2000, "directories inherit setgid");
        let (a, l, h) = b.create("pub/g", 0o2755, EXCL, 0, &u1).unwrap();
        b.release(&l, h).unwrap();
        assert_eq!((a.gid, a.perm & 0o2000), (4242, 0));
    }

    #[test]
    fn open_racing_unlink_never_returns_deleted_data() {
        let (_d, b) = backend(2);
        let b = Arc::new(b);
        for i in 0..200 {
            let name = format!("r{i}");
            let (_, l, h) = b.create(&name, 0o644, EXCL, 0, &Ctx::default()).unwrap();
            b.release(&l, h).unwrap();
            let b2 = b.clone();
            let n2 = name.clone();
            let t = std::thread::spawn(move || b2.unlink(&n2, &Ctx::default()));
            match b.open(&name, libc::O_RDWR, &Ctx::default()) {
                Ok((_, l, h)) => {
                    // Opened: the data must stay readable and writable until release.
                    let mut info = IoInfo::default();
                    b.write(&l, NOH, 0, b"x", &mut info).unwrap();
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
        b.create("f", 0o644, EXCL, 42, &Ctx::default()).unwrap();
        assert_eq!(b.create("f", 0o644, EXCL, 43, &Ctx::default()).unwrap_err().errno, errno::EEXIST);
        // Same token: the replay of a create that already happened succeeds.
        b.create("f", 0o644, EXCL, 42, &Ctx::default()).unwrap();
        assert_eq!(b.ns_path("../x").unwrap_err().errno, errno::EINVAL);
    }

    #[test]
    fn performance_aware_placement_follows_max_perf() {
        let (_d, b) = backend(3);
        let mut pools = BTreeMap::new();
        let perf: BTreeMap<String, f64> =
            [("ost0", 10.0), ("ost1", 30.0), ("ost2", 20.0)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
        pools.insert(
            "p".to_string(),
            Pool {
                targets: vec!["ost0".into(), "ost1".into(), "ost2".into()],
                max_perf: perf,
                stripe_count: None,
                component_size: None,
            },
        );
        let p = Placement { pools, default_pool: Some("p".into()), ..Default::default() };
        b.validate_placement(&p).unwrap();
        b.placement.store(Arc::new(p));
        let mut counts = [0; 3];
        for i in 0..12 {
            let (_, l, _) = b.create(&format!("f{i}"), 0o644, EXCL, 0, &Ctx::default()).unwrap();
            counts[l.targets[0] as usize] += 1;
        }
        // D'Hondt allocation of 12 files over 10:30:20.
        assert_eq!(counts, [2, 6, 4]);
        let bad = Placement { default_pool: Some("nope".into()), ..Default::default() };
        assert!(b.validate_placement(&bad).is_err());
    }

    fn progressive(b: &Backend, perf: &[f64], cs: u64) {
        let names: Vec<String> = (0..perf.len()).map(|i| format!("ost{i}")).collect();
        let max_perf = names.iter().cloned().zip(perf.iter().copied()).collect();
        let pool = Pool { targets: names, max_perf, stripe_count: None, component_size: Some(cs) };
        let p =
            Placement { pools: [("p".to_string(), pool)].into(), default_pool: Some("p".into()), ..Default::default() };
        b.validate_placement(&p).unwrap();
        b.placement.store(Arc::new(p));
    }

    fn counts(b: &Backend) -> Vec<i64> {
        b.targets.iter().map(|t| t.shm.open_count()).collect()
    }

    #[test]
    fn component_mapping_and_sidecar_format() {
        let l = Layout {
            oid: 0xab,
            stripe_size: 1 << 20,
            targets: vec![0, 1, 2],
            component_size: 8192,
            perf: vec![50.0, 0.0, 12.5],
        };
        let ps = pieces(&l, 8000, 10_000);
        assert_eq!(ps[0], Piece { obj: 0, obj_off: 8000, len: 192, buf_off: 0 });
        assert_eq!(ps[1], Piece { obj: 1, obj_off: 0, len: 8192, buf_off: 192 });
        assert_eq!(ps[2], Piece { obj: 2, obj_off: 0, len: 1616, buf_off: 8384 });
        assert_eq!(logical_from_component(8192, 2, 0), 0);
        assert_eq!(logical_from_component(8192, 2, 5), 16389);
        let text = layout_text(&l, 9);
        assert!(text.starts_with("pharos-layout v2 oid=00000000000000ab "), "{text}");
        assert_eq!(parse_layout(&text), Some((l, 9)));
        // Classic sidecars keep the v1 format, and old ones parse as classic.
        let c = Layout::striped(7, 4096, vec![3, 1]);
        assert_eq!(layout_text(&c, 5), "pharos-layout v1 oid=0000000000000007 stripe_size=4096 targets=3,1 token=5\n");
        assert_eq!(parse_layout("pharos-layout v1 oid=7 stripe_size=4096 targets=3,1 token=5"), Some((c, 5)));
        assert_eq!(
            parse_layout("pharos-layout v2 oid=7 stripe_size=4096 targets=3,1 component_size=4096 perf=1"),
            None
        );
        assert_eq!(parse_layout("pharos-layout v3 oid=7 stripe_size=4096 targets=3,1"), None);
        let (_d, b) = backend(2);
        let mut bad = Placement {
            pools: [(
                "p".to_string(),
                Pool {
                    targets: vec!["ost0".into()],
                    max_perf: BTreeMap::new(),
                    stripe_count: None,
                    component_size: Some(1000),
                },
            )]
            .into(),
            ..Default::default()
        };
        assert!(b.validate_placement(&bad).is_err());
        bad.pools.get_mut("p").unwrap().component_size = Some(0);
        assert!(b.validate_placement(&bad).is_err());
    }

    #[test]
    fn progressive_file_roundtrip_holes_truncate_and_unlink() {
        let (d, b) = backend(3);
        progressive(&b, &[10.0, 30.0, 20.0], 8192);
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        assert!(l.is_progressive() && l.targets == vec![0, 1, 2]);
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 0);
        assert_eq!(obj_count(&d), 0, "components are placed by their first write");
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let mut info = IoInfo::default();
        // Component 2 and 3 (bytes 16384..36384), component 0 and 1 are holes.
        assert_eq!(b.write(&l, h, 16_384, &data, &mut info).unwrap(), 20_000);
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 36_384);
        assert_eq!(b.read(&l, 16_384, 30_000, &mut info).unwrap(), data);
        let all = b.read(&l, 0, 1 << 20, &mut info).unwrap();
        assert_eq!(all.len(), 36_384);
        assert!(all[..16_384].iter().all(|&x| x == 0));
        // The open counts on the target of the component it wrote last only.
        let t3 = b.component(&l, 3, false).unwrap().unwrap();
        assert_eq!(counts(&b).iter().sum::<i64>(), 1);
        assert_eq!(counts(&b)[t3 as usize], 1);
        // Shrink into a hole: the hole's component is placed so the size holds.
        b.setattr("f", &SetAttr { size: Some(10_000), ..Default::default() }, false, &Ctx::default()).unwrap();
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 10_000);
        assert_eq!(b.read(&l, 0, 1 << 20, &mut info).unwrap(), vec![0; 10_000]);
        // Extend: zeros up to the new size; a write after it shows through.
        b.setattr("f", &SetAttr { size: Some(50_000), ..Default::default() }, false, &Ctx::default()).unwrap();
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 50_000);
        b.write(&l, h, 8000, b"abcdefghij", &mut info).unwrap();
        let r = b.read(&l, 0, 60_000, &mut info).unwrap();
        assert_eq!(r.len(), 50_000);
        assert_eq!(&r[8000..8010], b"abcdefghij");
        assert!(r[8010..].iter().all(|&x| x == 0) && r[..8000].iter().all(|&x| x == 0));
        b.fsync(&l, false, &mut info).unwrap();
        // Unlink while open: data stays until release, then objects and records go.
        b.unlink("f", &Ctx::default()).unwrap();
        assert_eq!(b.read(&l, 8000, 10, &mut info).unwrap(), b"abcdefghij");
        assert!(obj_count(&d) > 0);
        b.release(&l, h).unwrap();
        assert_eq!(counts(&b), vec![0, 0, 0]);
        assert_eq!(obj_count(&d), 0);
        assert_eq!(fs::read_dir(d.path().join("mdt/components")).unwrap().count(), 0);
        // A write after the objects are gone does not resurrect them.
        assert_eq!(b.write(&l, NOH, 1 << 20, b"x", &mut info).unwrap_err().errno, errno::ENOENT);
        assert_eq!(obj_count(&d), 0);
    }

    #[test]
    fn sequential_writers_move_their_count_and_spread_by_performance() {
        let (d, a) = backend(3);
        let b = backend_on(&d, 3); // a second daemon on the same backend
        progressive(&a, &[10.0, 30.0, 20.0], 4096);
        let mut info = IoInfo::default();
        let mut opens = Vec::new();
        for i in 0..6 {
            let (_, l, h) = a.create(&format!("f{i}"), 0o644, EXCL, 0, &Ctx::default()).unwrap();
            // Each writer holds its first component: the rule spreads them 10:30:20.
            a.write(&l, h, 0, &[1; 100], &mut info).unwrap();
            opens.push((l, h));
        }
        assert_eq!(counts(&a), vec![1, 3, 2]);
        // Moving on to the next component moves the count (through either daemon).
        let (l0, h0) = opens[0].clone();
        let t0 = a.component(&l0, 0, false).unwrap().unwrap();
        b.write(&l0, h0, 4096, &[2; 100], &mut info).unwrap();
        let t1 = b.component(&l0, 1, false).unwrap().unwrap();
        let mut want = vec![1, 3, 2];
        want[t0 as usize] -= 1;
        want[t1 as usize] += 1;
        assert_eq!(counts(&a), want);
        // A write back on the first daemon, whose memory is stale, still moves the right count.
        a.write(&l0, h0, 0, &[3; 10], &mut info).unwrap();
        want[t1 as usize] -= 1;
        want[t0 as usize] += 1;
        assert_eq!(counts(&a), want);
        // Releases through the other daemon drop every count.
        for (l, h) in &opens {
            b.release(l, *h).unwrap();
        }
        assert_eq!(counts(&a), vec![0, 0, 0]);
        // A dead daemon's open: the start-time GC drops its count with its marker.
        let dead = backend_on(&d, 3);
        progressive(&dead, &[10.0, 30.0, 20.0], 4096);
        let (_, l, h) = dead.create("g", 0o644, EXCL, 0, &Ctx::default()).unwrap();
        dead.write(&l, h, 0, &[1; 10], &mut info).unwrap();
        assert_eq!(counts(&a).iter().sum::<i64>(), 1);
        drop(dead);
        assert_eq!(a.gc().stale_markers, 1);
        assert_eq!(counts(&a), vec![0, 0, 0]);
        // The open goes on through a live daemon, uncounted, and its release drops nothing.
        a.write(&l, h, 4096, &[1; 10], &mut info).unwrap();
        a.release(&l, h).unwrap();
        assert_eq!(counts(&a), vec![0, 0, 0]);
        assert_eq!(a.read(&l, 0, 8192, &mut info).unwrap().len(), 4096 + 10);
    }

    #[test]
    fn concurrent_component_placement_has_one_winner() {
        let d = tempfile::tempdir().unwrap();
        let daemons: Vec<Arc<Backend>> = (0..2).map(|_| Arc::new(backend_on(&d, 4))).collect();
        progressive(&daemons[0], &[10.0, 10.0, 10.0, 10.0], 4096);
        let (_, l, _) = daemons[0].create("f", 0o644, EXCL, 0, &Ctx::default()).unwrap();
        for round in 0..50u64 {
            let barrier = Arc::new(std::sync::Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let (b, l, bar) = (daemons[i % 2].clone(), l.clone(), barrier.clone());
                    // Each racer sees other counts, so their choices differ.
                    b.targets[i % 4].shm.add_open(1);
                    std::thread::spawn(move || {
                        bar.wait();
                        let mut info = IoInfo::default();
                        b.write(&l, NOH, round * 4096 + i as u64 * 512, &[i as u8 + 1; 512], &mut info).unwrap();
                        b.component(&l, round, false).unwrap().unwrap()
                    })
                })
                .collect();
            let seen: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            assert!(seen.iter().all(|&t| t == seen[0]), "round {round}: {seen:?}");
            for t in &daemons[0].targets {
                t.shm.add_open(-2);
            }
            // Every racer's bytes are in the one object.
            let mut info = IoInfo::default();
            let r = daemons[1].read(&l, round * 4096, 4096, &mut info).unwrap();
            for i in 0..8 {
                assert!(r[i * 512..(i + 1) * 512].iter().all(|&x| x == i as u8 + 1), "round {round} racer {i}");
            }
        }
        assert_eq!(fs::read_dir(d.path().join(format!("mdt/components/{:016x}", l.oid))).unwrap().count(), 50);
        assert_eq!(obj_count(&d), 50);
        assert_eq!(fs::read_dir(d.path().join("mdt/tmp")).unwrap().count(), 0, "no staged records left");
    }
}
