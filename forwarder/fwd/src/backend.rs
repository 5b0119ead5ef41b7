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
//!   by the performance-aware rule (see [`Placement`]), and recorded as the file
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
//!
//! One concern per file, each adding its methods to [`Backend`]:
//! * `backend/layout.rs`: layout arithmetic (stripes, components) and the sidecar format,
//!   pure functions;
//! * `backend/placement.rs`: the placement document and policy, component placement and the
//!   open counts it reads;
//! * `backend/namespace.rs`: name operations on the MDT with the caller's credentials
//!   (lookup, readdir, create/open/release, setattr, links, special files);
//! * `backend/opens.rs`: open markers, orphans, daemon liveness and start-time GC;
//! * `backend/data.rs`: the data path on the targets (objects, read/write/fsync/truncate,
//!   token buckets, injected latency and slowdown);
//! * `backend/cache.rs`: the forwarding node's page cache (FGF-LRU / LRU), hooked into the
//!   data path's reads, writes, truncates and removals;
//! * `backend/gas.rs`: Gather-Arrange-Scatter of client writes per compute node, flushed
//!   before the data path's reads, stats, truncates and fsyncs of the file and at close.
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use pharos_fwd_proto::{errno, Layout, OpenHandle, StatFs, Time, WireError};

use crate::nsfs;
use crate::shm::TargetShm;

pub mod cache;
mod data;
pub mod gas;
mod layout;
mod namespace;
mod opens;
mod placement;
#[cfg(test)]
mod testutil;

pub use data::{FileSpan, IoInfo, STRETCH_MIN_SLEEP};
pub use layout::{layout_text, logical_from_component, logical_from_obj, obj_size, parse_layout, pieces, Piece};
use opens::flock_nb;
pub use opens::GcStats;
pub use placement::{Placement, Pool, COMPONENT_ALIGN};

/// One storage target (OST).
pub struct Target {
    pub name: String,
    pub dir: PathBuf,
    pub shm: TargetShm,
}

pub type Res<T> = Result<T, WireError>;

pub fn werr(e: io::Error) -> WireError {
    WireError { errno: e.raw_os_error().unwrap_or(errno::EIO), msg: e.to_string() }
}

fn eno(n: i32, m: impl Into<String>) -> WireError {
    WireError { errno: n, msg: m.into() }
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
    /// The forwarding node's page cache (FGF-LRU or LRU), when enabled (`backend/cache.rs`).
    pub cache: OnceLock<cache::PageCache>,
    /// Gather-Arrange-Scatter buffers of client writes, when enabled (`backend/gas.rs`).
    pub gas: OnceLock<gas::Gas>,
    /// Client writes received ([`Backend::write_from`] calls).
    pub client_writes: AtomicU64,
    /// Write requests issued to the targets (one `pwrite` of an object per piece).
    pub data_writes: AtomicU64,
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

fn t(sec: i64, nsec: i64) -> Time {
    Time { sec, nsec: nsec as u32 }
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
            cache: OnceLock::new(),
            gas: OnceLock::new(),
            client_writes: AtomicU64::new(0),
            data_writes: AtomicU64::new(0),
        })
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
