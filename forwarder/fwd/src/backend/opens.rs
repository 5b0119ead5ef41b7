//! Open files and live daemons:
//!
//! * **Open files survive unlink** (POSIX). Every open (create, open) leaves a marker
//!   `<mdt>/open/<shard>/<oid:016x>.<daemon:016x>.<id:016x>` named by the object and its
//!   [`OpenHandle`] (`<shard>`: the oid's first two hex digits, one of 256 directories made
//!   at start and kept); release (on any daemon) removes it. A marker is a hard link to the
//!   daemon's liveness file (one `link(2)`: no inode, no directory to make per object); the
//!   marker of an open of a progressive file is a file of its own, as it records the target
//!   the open is counted on (and so is any marker when the liveness file has too many links).
//!   When a file's name goes (unlink, rename over it) and no marker of it exists, its objects
//!   are deleted at once; otherwise its layout is written to `<mdt>/orphans/<oid:016x>` and
//!   its objects are deleted only if no marker exists then; otherwise the release that
//!   removes the last marker deletes them and the orphan record. (Name removal happens before the marker check, marker removal
//!   before the orphan check, so one of the two always sees the other.) An open re-checks
//!   after placing its marker that the name still holds the same object, so an open racing
//!   an unlink either keeps the data alive or fails with ENOENT.
//! * **Daemon liveness**: each daemon holds an exclusive `flock` on
//!   `<mdt>/daemons/<daemon:016x>` for its lifetime. At start, a daemon garbage-collects:
//!   markers of daemons whose lock can be taken (dead), then orphans left without markers.
//!
//! [`Opens`] owns this state. Deleting objects is the data path's: the methods that may
//! reap an orphan take the deletion as `remove` (false: the recorded layout is not valid here).
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::*};

use pharos_fwd_proto::{errno, Layout, OpenHandle};
use serde::Serialize;

use super::layout::{layout_text, parse_layout};
use super::{eno, random_u64, werr, Res, Target};

/// What a garbage collection found (daemon start).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct GcStats {
    pub dead_daemons: u64,
    pub stale_markers: u64,
    pub orphans_reaped: u64,
    pub orphans_kept: u64,
}

fn marker_name(oid: u64, h: OpenHandle) -> String {
    format!("{oid:016x}.{:016x}.{:016x}", h.daemon, h.id)
}

/// Directories of markers (`<mdt>/open/00` .. `ff`).
const SHARDS: u64 = 256;

/// The daemon owning a marker, from its name (`<oid>.<daemon>.<id>`; an older daemon's
/// `<oid>/<daemon>.<id>` is read too).
fn marker_owner(name: &str) -> Option<u64> {
    let mut it = name.split('.');
    let (a, b, c) = (it.next()?, it.next(), it.next());
    let owner = match (b, c) {
        (Some(d), Some(_)) => d,
        _ => a,
    };
    u64::from_str_radix(owner, 16).ok()
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

/// The open markers, orphan records and liveness lock of this daemon (`<mdt>/open`,
/// `<mdt>/orphans`, `<mdt>/daemons`).
pub struct Opens {
    open_dir: PathBuf,
    orphan_dir: PathBuf,
    daemons_dir: PathBuf,
    /// This daemon instance's id (open handles, liveness lock).
    pub daemon_id: u64,
    open_seq: AtomicU64,
    /// This daemon's liveness file `<mdt>/daemons/<daemon_id>`: markers are hard links to it.
    alive_path: PathBuf,
    /// Holds the exclusive flock on `<mdt>/daemons/<daemon_id>` while the daemon lives.
    _alive: File,
}

impl Opens {
    /// Registers a live daemon: a fresh id whose lock file, locked first in `tmp`, is then
    /// linked into `<mdt>/daemons` (never visible unlocked).
    pub(super) fn new(mdt: &Path, tmp: &Path) -> io::Result<Opens> {
        let (open_dir, orphan_dir, daemons_dir) = (mdt.join("open"), mdt.join("orphans"), mdt.join("daemons"));
        for d in [&open_dir, &orphan_dir, &daemons_dir] {
            fs::create_dir_all(d)?;
        }
        for i in 0..SHARDS {
            match fs::DirBuilder::new().mode(0o700).create(open_dir.join(format!("{i:02x}"))) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        let daemon_id = random_u64() | 1;
        let staged = tmp.join(format!("daemon-{daemon_id:016x}"));
        let alive = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&staged)?;
        flock_nb(&alive)?;
        let alive_path = daemons_dir.join(format!("{daemon_id:016x}"));
        let linked = fs::hard_link(&staged, &alive_path);
        let _ = fs::remove_file(&staged);
        linked?;
        Ok(Opens {
            open_dir,
            orphan_dir,
            daemons_dir,
            daemon_id,
            open_seq: AtomicU64::new(1),
            alive_path,
            _alive: alive,
        })
    }

    /// The directory of the markers of `oid` (shared with other objects).
    fn shard_dir(&self, oid: u64) -> PathBuf {
        self.open_dir.join(format!("{:02x}", oid >> 56))
    }

    fn orphan_path(&self, oid: u64) -> PathBuf {
        self.orphan_dir.join(format!("{oid:016x}"))
    }

    /// Records one open of object `oid`; returns its handle. `own`: the marker is a file of
    /// its own (it will record a counted target, [`Opens::set_counted_target`]), else a hard
    /// link to the liveness file.
    pub(super) fn add_marker(&self, oid: u64, own: bool) -> Res<OpenHandle> {
        let h = OpenHandle { daemon: self.daemon_id, id: self.open_seq.fetch_add(1, Relaxed) };
        let m = self.marker_path(oid, h);
        for _ in 0..100 {
            let made = match own {
                false => fs::hard_link(&self.alive_path, &m),
                true => OpenOptions::new().write(true).create_new(true).mode(0o600).open(&m).map(drop),
            };
            match made {
                Ok(()) => return Ok(h),
                // The liveness file has the most links the file system allows: a file of its own.
                Err(e) if e.raw_os_error() == Some(libc::EMLINK) && !own => {
                    return OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&m)
                        .map(|_| h)
                        .map_err(werr)
                }
                // The shard directory was removed (by hand, or a start-time GC of an older
                // daemon): make it again.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match fs::DirBuilder::new().mode(0o700).create(self.shard_dir(oid)) {
                        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(werr(e)),
                        _ => {}
                    }
                }
                Err(e) => return Err(werr(e)),
            }
        }
        Err(eno(errno::EIO, "cannot place open marker"))
    }

    pub(super) fn marker_path(&self, oid: u64, h: OpenHandle) -> PathBuf {
        self.shard_dir(oid).join(marker_name(oid, h))
    }

    /// True while open `h` of `oid` is recorded (its marker exists).
    pub(super) fn has_open(&self, oid: u64, h: OpenHandle) -> bool {
        self.marker_path(oid, h).symlink_metadata().is_ok()
    }

    /// The target open `h` of `oid` is counted on (progressive files), from its marker.
    pub(super) fn counted_target(&self, oid: u64, h: OpenHandle) -> Option<u32> {
        marker_target(&self.marker_path(oid, h))
    }

    /// Records in the marker of open `h` the target it is counted on; false when the marker
    /// is gone (a dead daemon's open removed by the start-time GC: the open is not counted).
    pub(super) fn set_counted_target(&self, oid: u64, h: OpenHandle, t: Option<u32>) -> bool {
        let Ok(f) = OpenOptions::new().write(true).open(self.marker_path(oid, h)) else { return false };
        // Fixed width, written in place: a concurrent reader sees the old or the new index.
        let r = match t {
            Some(t) => f.write_all_at(format!("{t:010}\n").as_bytes(), 0),
            None => f.set_len(0),
        };
        r.is_ok()
    }

    pub(super) fn remove_marker(&self, oid: u64, h: OpenHandle) {
        let _ = fs::remove_file(self.marker_path(oid, h));
    }

    /// The markers of `oid` (all daemons), from a scan of its shard directory.
    fn markers_of(&self, oid: u64) -> io::Result<usize> {
        let prefix = format!("{oid:016x}.");
        let mut n = 0;
        for e in fs::read_dir(self.shard_dir(oid))? {
            n += e?.file_name().as_encoded_bytes().starts_with(prefix.as_bytes()) as usize;
        }
        Ok(n)
    }

    /// True when any open of `oid` is recorded (errors other than "no such dir" count as
    /// open: never delete data on doubt).
    pub(super) fn has_markers(&self, oid: u64) -> bool {
        match self.markers_of(oid) {
            Ok(n) => n > 0,
            Err(e) => e.kind() != io::ErrorKind::NotFound,
        }
    }

    /// Number of recorded opens of `oid` (all daemons).
    pub fn open_markers(&self, oid: u64) -> usize {
        self.markers_of(oid).unwrap_or(0)
    }

    /// True when the objects of `oid` wait for their last close.
    pub fn is_orphan(&self, oid: u64) -> bool {
        self.orphan_path(oid).exists()
    }

    /// The name of a file with layout `l` is gone: delete its objects now, or keep them as
    /// an orphan until the last open is released. A file no open is recorded for (the usual
    /// case) has its objects deleted at once, without an orphan record: an open that places
    /// its marker after this check finds the name gone at its re-check and fails (`ENOENT`),
    /// and a release that removed the last marker before it finds no record and leaves the
    /// deletion here. Otherwise the record is written first, then the markers are looked at
    /// again (the protocol of the module doc).
    pub(super) fn drop_file(&self, l: &Layout, remove: &dyn Fn(&Layout) -> bool) {
        if !self.has_markers(l.oid) {
            if !remove(l) {
                log::warn!("objects of {:016x}: layout not valid here", l.oid);
            }
            return;
        }
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
            self.reap(l.oid, remove);
        }
    }

    /// Deletes the objects of orphan `oid` (`remove`) and its record.
    fn reap(&self, oid: u64, remove: &dyn Fn(&Layout) -> bool) -> bool {
        let rec = self.orphan_path(oid);
        let Ok(text) = fs::read_to_string(&rec) else { return false };
        let removed = match parse_layout(&text) {
            Some((l, _)) if l.oid == oid => remove(&l),
            _ => false,
        };
        if !removed {
            log::warn!("corrupt orphan record {}", rec.display());
        }
        let _ = fs::remove_file(&rec);
        true
    }

    /// Start-time garbage collection: markers of dead daemons, then orphans nobody holds.
    /// `targets`: the open counts of dead opens are dropped there.
    pub fn gc(&self, targets: &[Target], remove: &dyn Fn(&Layout) -> bool) -> GcStats {
        let mut st = GcStats::default();
        let started = std::time::SystemTime::now();
        let mut dead = std::collections::HashSet::new();
        let mut live = std::collections::HashSet::new();
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        if let Ok(it) = fs::read_dir(&self.daemons_dir) {
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
                    let owner = name.to_str().and_then(marker_owner);
                    let stale = match owner {
                        Some(o) if live.contains(&o) => false,
                        Some(o) if dead.contains(&o) => true,
                        // A daemon that registered after the scan above (its lock file is
                        // linked before it serves, and held while it lives), or one whose lock
                        // file is already gone (dead).
                        Some(o) => {
                            let alive = self.is_alive(o);
                            if alive { &mut live } else { &mut dead }.insert(o);
                            !alive
                        }
                        // Not a marker's name: left alone unless it is older than this scan.
                        None => m.metadata().and_then(|md| md.modified()).map(|t| t < started).unwrap_or(false),
                    };
                    if stale {
                        let counted = marker_target(&m.path());
                        if fs::remove_file(m.path()).is_ok() {
                            st.stale_markers += 1;
                            // The dead open no longer writes its component.
                            if let Some(t) = counted.and_then(|t| targets.get(t as usize)) {
                                t.shm.add_open(-1);
                            }
                        }
                    }
                }
                // An older daemon's directory per object; the shards stay.
                if d.file_name().len() > 2 {
                    let _ = fs::remove_dir(d.path());
                }
            }
        }
        if let Ok(it) = fs::read_dir(&self.orphan_dir) {
            for e in it.flatten() {
                let Some(oid) = e.file_name().to_str().and_then(hex) else { continue };
                if self.has_markers(oid) {
                    st.orphans_kept += 1;
                } else if self.reap(oid, remove) {
                    st.orphans_reaped += 1;
                }
            }
        }
        st
    }

    /// True when daemon `id` holds its liveness lock (its file exists and cannot be locked).
    fn is_alive(&self, id: u64) -> bool {
        match File::open(self.daemons_dir.join(format!("{id:016x}"))) {
            Ok(f) => flock_nb(&f).is_err(),
            Err(_) => false,
        }
    }

    /// Drops open `h` of `l` and deletes the objects when that was the last open of an
    /// unlinked file.
    pub(super) fn unmark(&self, l: &Layout, h: OpenHandle, remove: &dyn Fn(&Layout) -> bool) {
        self.remove_marker(l.oid, h);
        if self.is_orphan(l.oid) && !self.has_markers(l.oid) {
            self.reap(l.oid, remove);
        }
    }
}

#[cfg(test)]
mod tests;
