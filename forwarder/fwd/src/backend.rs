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
//!   Striping is RAID-0 over the layout's targets in units of `stripe_size`. A create makes
//!   no object (the layout is decided then, the objects are not): the first write of a
//!   stripe (or a truncate reaching it) makes its object, and a missing object is a hole
//!   (zeros inside the size) for reads, stats, fsync, truncate and removal.
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
//! One type per concern, each owning its state, composed by [`Backend`] (whose methods are
//! the interface of the request path and the admin interface, delegating to them):
//! * [`Target`] (`backend/target.rs`): one target's directory and shared state, and the token
//!   bucket, injected latency and slowdown applied around each piece of I/O on it;
//! * `backend/layout.rs`: layout arithmetic (stripes, components) and the sidecar format,
//!   pure functions;
//! * [`Placer`] (`backend/placement.rs`): the placement document and policy, component
//!   placement and records, and the per-handle open counts that rule reads;
//! * [`Opens`] (`backend/opens.rs`): open markers, orphans, daemon liveness and start-time GC;
//! * `Namespace` (`backend/namespace.rs`, `namespace/files.rs`): name operations on the MDT
//!   with the caller's credentials (lookup, readdir, create/open/release, setattr, links,
//!   special files);
//! * [`DataPath`] (`backend/data.rs`): the data path on the targets (object files,
//!   read/write/fsync/truncate);
//! * [`cache::PageCache`] (`backend/cache.rs`): the forwarding node's page cache (FGF-LRU /
//!   LRU), hooked into the data path's reads, writes, truncates and removals;
//! * [`gas::Gas`] (`backend/gas.rs`): Gather-Arrange-Scatter of client writes per compute
//!   node, flushed before the data path's reads, stats, truncates and fsyncs of the file and
//!   at close.
//!
//! Imports go one way: `layout` and `target` use nothing of the others; `opens` uses them;
//! `placement` uses `opens`; the data path, cache, GAS and namespace take the [`Backend`]
//! they are part of as a parameter (`&Backend`), for the parts below them.
use std::ffi::CString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pharos_fwd_proto::{errno, Attr, Ctx, DirEntry, Layout, OpenHandle, SetAttr, StatFs, Time, WireError};

pub mod cache;
mod data;
pub mod gas;
mod layout;
pub mod migrate;
mod namespace;
pub mod nodelocal;
mod opens;
mod placement;
mod target;
#[cfg(test)]
mod testutil;

pub use data::{DataPath, FileSpan, IoInfo};
pub use layout::{layout_text, logical_from_component, logical_from_obj, obj_size, parse_layout, pieces, Piece};
use namespace::Namespace;
use nodelocal::{NodeLocal, Where};
pub use opens::{GcStats, Opens};

/// A READDIRPLUS page's entries: each with its attributes (None: `.`, `..`, gone since).
pub type EntriesPlus = Vec<(DirEntry, Option<Attr>)>;
pub use placement::{Placement, Placer, Pool, COMPONENT_ALIGN};
pub use target::{Target, STRETCH_MIN_SLEEP};

pub type Res<T> = Result<T, WireError>;

pub fn werr(e: io::Error) -> WireError {
    WireError { errno: e.raw_os_error().unwrap_or(errno::EIO), msg: e.to_string() }
}

fn eno(n: i32, m: impl Into<String>) -> WireError {
    WireError { errno: n, msg: m.into() }
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

/// The index of the target named `name`.
fn target_index(targets: &[Target], name: &str) -> Option<u32> {
    targets.iter().position(|t| t.name == name).map(|i| i as u32)
}

/// Checks a layout a client sent against the targets.
fn check_layout(targets: &[Target], l: &Layout) -> Res<()> {
    if l.stripe_size == 0 || l.targets.is_empty() || l.targets.len() > targets.len() {
        return Err(eno(errno::EINVAL, "invalid layout"));
    }
    if l.targets.iter().any(|&t| t as usize >= targets.len()) {
        return Err(eno(errno::EINVAL, "layout names an unknown target"));
    }
    if !(l.perf.is_empty() || l.perf.len() == l.targets.len()) {
        return Err(eno(errno::EINVAL, "layout perf does not match its targets"));
    }
    Ok(())
}

/// The storage backend of a daemon: its parts, one per concern (see the module doc); its
/// methods are the interface the request path and the admin interface use.
pub struct Backend {
    /// The storage targets (OSTs).
    pub targets: Vec<Target>,
    /// The placement document and policy, and the component records.
    pub placement: Placer,
    /// Open markers, orphans, this daemon's liveness lock, start-time GC.
    pub opens: Opens,
    /// The namespace tree (`<mdt>/ns`).
    ns: Namespace,
    /// The node-local stores on the targets (`backend/nodelocal.rs`): `/.nodelocal/...`.
    pub local: NodeLocal,
    /// The data path: object files, reads and writes, write counters.
    pub data: DataPath,
    /// The forwarding node's page cache (FGF-LRU or LRU), when enabled (`backend/cache.rs`).
    pub cache: OnceLock<cache::PageCache>,
    /// Gather-Arrange-Scatter buffers of client writes, when enabled (`backend/gas.rs`).
    pub gas: OnceLock<gas::Gas>,
    /// The data generations shared by the site's daemons (`<mdt>/data-gens`): page caches see
    /// other daemons' writes through them ([`cache::DataGens`]).
    pub gens: cache::DataGens,
    /// This daemon instance's id (open handles, liveness lock): [`Opens::daemon_id`].
    pub daemon_id: u64,
    /// Object moves shared by the site's daemons (`<mdt>/object-moves`, counters like
    /// [`Backend::gens`]): bumped by an online migration's switch, so every daemon reopens the
    /// objects of the file instead of using a cached open file of one that was removed
    /// ([`DataPath`]'s object-file cache).
    pub moves: cache::DataGens,
}

impl Backend {
    /// Opens (creating directories if needed) a backend with namespace `<mdt>/ns` and the
    /// given `(name, dir)` targets.
    pub fn new(mdt: &Path, targets: &[(String, PathBuf)]) -> io::Result<Backend> {
        if targets.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no storage targets"));
        }
        let (ns, tmp, comp_dir) = (mdt.join("ns"), mdt.join("tmp"), mdt.join("components"));
        for d in [&ns, &tmp, &comp_dir] {
            fs::create_dir_all(d)?;
        }
        let mut ts = Vec::new();
        for (name, dir) in targets {
            fs::create_dir_all(dir)?;
            ts.push(Target {
                name: name.clone(),
                dir: dir.clone(),
                shm: crate::shm::TargetShm::open(dir)?,
                dir_fd: crate::nsfs::open_dir(dir)?,
            });
        }
        let opens = Opens::new(mdt, &tmp)?;
        let dirs: Vec<PathBuf> = ts.iter().map(|t| t.dir.clone()).collect();
        Ok(Backend {
            ns: Namespace::new(ns)?,
            local: NodeLocal::new(&dirs)?,
            targets: ts,
            placement: Placer::new(comp_dir, tmp),
            daemon_id: opens.daemon_id,
            opens,
            data: DataPath::default(),
            cache: OnceLock::new(),
            gas: OnceLock::new(),
            gens: cache::DataGens::open(mdt)?,
            moves: cache::DataGens::open_file(mdt, "object-moves")?,
        })
    }

    /// Checks a layout a client sent against the targets.
    fn check_layout(&self, l: &Layout) -> Res<()> {
        check_layout(&self.targets, l)
    }

    pub fn target_index(&self, name: &str) -> Option<u32> {
        target_index(&self.targets, name)
    }

    /// Checks a placement document against the targets (unknown names are errors).
    pub fn validate_placement(&self, p: &Placement) -> Result<(), String> {
        Placer::validate(&self.targets, p)
    }

    /// The target of component `k` of progressive layout `l` ([`Placer::component`]).
    pub fn component(&self, l: &Layout, k: u64, place: bool) -> Res<Option<u32>> {
        self.placement.component(&self.targets, l, k, place)
    }

    /// Target of the first byte of `l`, as far as known without I/O (records, metrics).
    #[inline]
    pub fn first_target(&self, l: &Layout, off: u64) -> Option<u32> {
        self.placement.first_target(&self.targets, l, off)
    }

    // -- opens and GC (backend/opens.rs) -------------------------------------------------

    /// Deletes the objects of an orphan's recorded layout; false when it is not valid here.
    fn remove_orphan(&self, l: &Layout) -> bool {
        let ok = self.check_layout(l).is_ok();
        if ok {
            self.data.remove_objects(self, l);
        }
        ok
    }

    /// The name of a file with layout `l` is gone: delete its objects now, or keep them as
    /// an orphan until the last open is released.
    fn drop_file(&self, l: &Layout) {
        if layout::is_local_oid(l.oid) {
            // Node-local: no open markers to wait for (its opens are not recorded).
            self.remove_orphan(l);
            return;
        }
        self.opens.drop_file(l, &|l| self.remove_orphan(l))
    }

    /// Drops open `h` of `l` and deletes the objects when that was the last open of an
    /// unlinked file.
    fn unmark(&self, l: &Layout, h: OpenHandle) {
        if layout::is_local_oid(l.oid) {
            return;
        }
        self.opens.unmark(l, h, &|l| self.remove_orphan(l))
    }

    /// Records an open of `l` (its marker), but none for a node-local file (no MDT access).
    fn mark(&self, l: &Layout) -> Res<OpenHandle> {
        if layout::is_local_oid(l.oid) {
            return Ok(layout::LOCAL_HANDLE);
        }
        self.opens.add_marker(l.oid, l.is_progressive())
    }

    /// Start-time garbage collection: markers of dead daemons, then orphans nobody holds.
    pub fn gc(&self) -> GcStats {
        self.opens.gc(&self.targets, &|l| self.remove_orphan(l))
    }

    /// Number of recorded opens of `oid` (all daemons).
    pub fn open_markers(&self, oid: u64) -> usize {
        self.opens.open_markers(oid)
    }

    /// True when the objects of `oid` wait for their last close.
    pub fn is_orphan(&self, oid: u64) -> bool {
        self.opens.is_orphan(oid)
    }

    // -- the namespace (backend/namespace.rs; node-local names: backend/nodelocal.rs) -------

    /// Where a request path goes: the shared namespace or node-local storage.
    pub fn route<'a>(&self, path: &'a str) -> Res<Where<'a>> {
        nodelocal::route(path, self.targets.len())
    }

    /// Resolves a request path inside the namespace.
    pub fn ns_path(&self, path: &str) -> Res<PathBuf> {
        self.ns.path(path)
    }

    /// Reads the layout sidecar of a namespace file (request path).
    pub fn read_layout(&self, path: &str) -> Res<(Layout, u64)> {
        self.ns.read_layout(path)
    }

    /// Attributes of `path` (lookup and getattr), with the caller's search permissions.
    pub fn getattr(&self, path: &str, ctx: &Ctx) -> Res<Attr> {
        match self.route(path)? {
            Where::Shared => self.ns.getattr(self, path, ctx),
            w => self.local.getattr(self, w, ctx),
        }
    }

    /// [`Backend::readdir`] with each entry's attributes (`None` for `.`, `..` and an entry
    /// that went or cannot be read since the listing): the kernel's READDIRPLUS.
    pub fn readdir_plus(&self, path: &str, cookie: u64, ctx: &Ctx) -> Res<(EntriesPlus, bool)> {
        match self.route(path)? {
            Where::Shared => self.ns.readdir_plus(self, path, cookie, ctx),
            w => self.local.readdir_plus(self, w, cookie, ctx),
        }
    }

    /// Records mount `mount` as the holder of the shared namespace's directory `dir`
    /// ([`Namespace::set_holder`]; node-local directories are never held this way).
    pub fn set_dir_holder(&self, dir: &str, mount: u64) -> bool {
        matches!(self.route(dir), Ok(Where::Shared)) && self.ns.set_holder(dir, mount)
    }

    /// The mount holding directory `dir` if not `origin` ([`Namespace::holder_unless`]).
    pub fn dir_holder_unless(&self, dir: &str, origin: u64) -> Option<u64> {
        match self.route(dir) {
            Ok(Where::Shared) => self.ns.holder_unless(dir, origin),
            _ => None,
        }
    }

    /// Directory `dir` held by nobody from now ([`Namespace::clear_holder`]).
    pub fn clear_dir_holder(&self, dir: &str) {
        if let Ok(Where::Shared) = self.route(dir) {
            self.ns.clear_holder(dir)
        }
    }

    /// One page of the directory `path` from `cookie` ([`Namespace::readdir`]).
    pub fn readdir(&self, path: &str, cookie: u64, ctx: &Ctx) -> Res<(Vec<DirEntry>, bool)> {
        match self.route(path)? {
            Where::Shared => self.ns.readdir(path, cookie, ctx),
            w => self.local.readdir(w, cookie, ctx),
        }
    }

    pub fn mkdir(&self, path: &str, mode: u32, ctx: &Ctx) -> Res<Attr> {
        match self.route(path)? {
            Where::Shared => self.ns.mkdir(self, path, mode, ctx),
            w => self.local.mkdir(self, w, mode, ctx),
        }
    }

    pub fn rmdir(&self, path: &str, ctx: &Ctx) -> Res<()> {
        match self.route(path)? {
            Where::Shared => self.ns.rmdir(path, ctx),
            w => self.local.rmdir(w, ctx),
        }
    }

    /// A symbolic link `path` → `target`.
    pub fn symlink(&self, path: &str, target: &str, ctx: &Ctx) -> Res<Attr> {
        match self.route(path)? {
            Where::Shared => self.ns.symlink(self, path, target, ctx),
            w => self.local.symlink(self, w, target, ctx),
        }
    }

    pub fn readlink(&self, path: &str, ctx: &Ctx) -> Res<String> {
        match self.route(path)? {
            Where::Shared => self.ns.readlink(path, ctx),
            w => self.local.readlink(w, ctx),
        }
    }

    /// A hard link `to` of `from`: both names share the sidecar, hence the layout and data.
    pub fn link(&self, from: &str, to: &str, ctx: &Ctx) -> Res<Attr> {
        match (self.route(from)?, self.route(to)?) {
            (Where::Shared, Where::Shared) => self.ns.link(self, from, to, ctx),
            (a, b) => self.local.link(self, a, b, ctx),
        }
    }

    /// A FIFO, socket or device node, or a regular file ([`Namespace::mknod`]).
    pub fn mknod(&self, path: &str, mode: u32, rdev: u64, ctx: &Ctx) -> Res<Attr> {
        match self.route(path)? {
            Where::Shared => self.ns.mknod(self, path, mode, rdev, ctx),
            w => self.local.mknod(self, w, mode, rdev, ctx),
        }
    }

    pub fn unlink(&self, path: &str, ctx: &Ctx) -> Res<()> {
        match self.route(path)? {
            Where::Shared => self.ns.unlink(self, path, ctx),
            w => self.local.unlink(self, w, ctx),
        }
    }

    pub fn rename(&self, from: &str, to: &str, noreplace: bool, ctx: &Ctx) -> Res<()> {
        match (self.route(from)?, self.route(to)?) {
            (Where::Shared, Where::Shared) => self.ns.rename(self, from, to, noreplace, ctx),
            (a, b) => self.local.rename(self, a, b, noreplace, ctx),
        }
    }

    /// Creates (or opens) a regular file: its attr, layout and open handle ([`Namespace::create`]).
    pub fn create(&self, path: &str, mode: u32, flags: i32, token: u64, ctx: &Ctx) -> Res<(Attr, Layout, OpenHandle)> {
        match self.route(path)? {
            Where::Shared => self.ns.create(self, path, mode, flags, token, ctx),
            w => self.local.create(self, w, mode, flags, token, ctx),
        }
    }

    /// Opens an existing regular file: attr, layout and open handle ([`Namespace::open`]).
    pub fn open(&self, path: &str, flags: i32, ctx: &Ctx) -> Res<(Attr, Layout, OpenHandle)> {
        match self.route(path)? {
            Where::Shared => self.ns.open(self, path, flags, ctx),
            w => self.local.open(self, w, flags, ctx),
        }
    }

    /// Releases open `h` (served by any daemon) of the file with layout `l`.
    pub fn release(&self, l: &Layout, h: OpenHandle) -> Res<()> {
        self.ns.release(self, l, h)
    }

    /// Changes attributes of `path` with the caller's credentials ([`Namespace::setattr`]).
    pub fn setattr(&self, path: &str, set: &SetAttr, by_fd: Option<u64>, ctx: &Ctx) -> Res<Attr> {
        match self.route(path)? {
            Where::Shared => self.ns.setattr(self, path, set, by_fd, ctx),
            w => self.local.setattr(self, w, set, by_fd, ctx),
        }
    }

    /// Clears setuid/setgid after a write by `ctx` ([`Namespace::kill_suidgid`]).
    pub fn kill_suidgid(&self, path: &str, l: &Layout, h: OpenHandle, ctx: &Ctx) -> Res<()> {
        match self.route(path)? {
            Where::Shared => self.ns.kill_suidgid(self, path, l, h, ctx),
            w => self.local.kill_suidgid(self, w, l, h, ctx),
        }
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
        let m = sv(self.ns.root())?;
        out.files = m.f_files;
        out.ffree = m.f_ffree;
        Ok(out)
    }

    // -- the data path (backend/data.rs) ------------------------------------------------

    /// Injected slowdown of target `ti` after a piece of I/O that took `took` ([`Target::stretch`]).
    #[inline]
    pub fn stretch(&self, ti: u32, took: Duration) {
        self.targets[ti as usize].stretch(took)
    }

    /// A read of a single-target file served straight from its object ([`DataPath::read_span`]).
    #[inline]
    pub fn read_span(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo) -> Res<Option<FileSpan>> {
        self.data.read_span(self, l, off, size, info)
    }

    pub fn read(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo) -> Res<Vec<u8>> {
        self.data.read(self, l, off, size, info)
    }

    /// Reads into `buf`, resized to the bytes read ([`DataPath::read_into`]).
    #[inline]
    pub fn read_into(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo, buf: &mut Vec<u8>) -> Res<()> {
        self.data.read_into(self, l, off, size, info, buf)
    }

    /// Reads up to `buf.len()` bytes at `off` into `buf` ([`DataPath::read_into_slice`]).
    #[inline]
    pub fn read_into_slice(&self, l: &Layout, off: u64, info: &mut IoInfo, buf: &mut [u8]) -> Res<usize> {
        self.data.read_into_slice(self, l, off, info, buf)
    }

    /// Writes `data` at `off` through open `h` ([`DataPath::write`]).
    pub fn write(&self, l: &Layout, h: OpenHandle, off: u64, data: &[u8], info: &mut IoInfo) -> Res<u32> {
        self.data.write(self, l, h, off, data, info)
    }

    /// A client write from compute node `node` ([`DataPath::write_from`]).
    #[inline]
    pub fn write_from(
        &self,
        node: &str,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        data: &[u8],
        info: &mut IoInfo,
    ) -> Res<u32> {
        self.data.write_from(self, node, l, h, off, data, info)
    }

    /// A client write of a buffer the caller owns ([`DataPath::write_owned`]).
    #[inline]
    pub fn write_owned(
        &self,
        node: &str,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        data: &mut Vec<u8>,
        info: &mut IoInfo,
    ) -> Res<u32> {
        self.data.write_owned(self, node, l, h, off, data, info)
    }

    /// Flushes every object of the file ([`DataPath::fsync`]).
    pub fn fsync(&self, l: &Layout, datasync: bool, info: &mut IoInfo) -> Res<()> {
        self.data.fsync(self, l, datasync, info)
    }

    // -- Gather-Arrange-Scatter (backend/gas.rs) ----------------------------------------

    /// Enables Gather-Arrange-Scatter and starts its flusher ([`gas::Gas::enable`]).
    pub fn enable_gas(self: &Arc<Self>, buffer_max: usize, flush_after: Duration) {
        gas::Gas::enable(self, buffer_max, flush_after)
    }

    /// The write path's counters and GAS's.
    pub fn gas_view(&self) -> gas::GasView {
        gas::GasView::of(self)
    }

    /// Writes every gathered write to the targets (shutdown); a no-op without GAS.
    pub fn gas_flush_all(&self) {
        if let Some(g) = self.gas.get() {
            g.drain(self);
        }
    }

    /// Before the mount moves a job of compute node `node` to another forwarding node: the
    /// node's gathered writes go to the targets ([`gas::Gas::flush_node`]); a no-op without GAS.
    pub fn gas_flush_node(&self, node: &str) -> Res<()> {
        match self.gas.get() {
            Some(g) => g.flush_node(self, node),
            None => Ok(()),
        }
    }

    /// Before a close of `l` (release): flushes its gathered writes and returns a deferred
    /// write error of the file, if any; a no-op without GAS.
    pub fn gas_close(&self, l: &Layout) -> Res<()> {
        match self.gas.get() {
            Some(g) => g.settle(self, l.oid, gas::Reason::Close, true),
            None => Ok(()),
        }
    }
}
