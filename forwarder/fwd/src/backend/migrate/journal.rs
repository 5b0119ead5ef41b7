//! The migration journal: one small JSON file per task in `<mdt>/migrations`, written and
//! fsynced (file and directory) before the task's first byte is copied, updated (same way)
//! once the new layout sidecar is renamed in, and removed when the task is finished.
//!
//! An entry is staged in `<mdt>/tmp`, locked (`flock`, exclusive) and only then renamed into
//! the journal directory, and its owner keeps the lock while the task lives: an entry whose
//! lock can be taken belongs to a dead daemon, and only those are recovered
//! ([`Journal::orphans`]), so several daemons sharing an MDT never recover each other's live
//! tasks.
//!
//! Recovery of an entry ([`Decision`]): the sidecar at the entry's path holds the new layout
//! (the rename happened): roll forward, remove the old objects left on the source target; it
//! holds the old layout: roll back, remove the partial copies on the destination target;
//! anything else (the file was renamed or removed meanwhile): remove nothing (a leftover
//! object is garbage, a wrong removal would be data loss) and report it.
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One task's journal record.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub id: u64,
    /// Request path of the file (namespace-relative).
    pub path: String,
    pub oid: u64,
    /// The sidecar text before the migration and the one replacing it.
    pub old_sidecar: String,
    pub new_sidecar: String,
    /// Objects moved: (object index, source target index, destination target index).
    pub objects: Vec<(u64, u32, u32)>,
    /// True once the new sidecar was renamed in (the old objects are then leftovers).
    pub switched: bool,
}

/// What recovery does with an entry left by a dead daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The old layout is in force: remove the destination copies.
    RollBack,
    /// The new layout is in force: remove the source objects.
    RollForward,
    /// The path holds neither layout: remove nothing.
    Keep,
}

/// Recovery's decision for `e` given the sidecar text now at its path (`None`: no file
/// there). Layouts are compared by their text, token and all (the sidecar is immutable and
/// written whole, see `backend/layout.rs`).
pub fn decide(e: &Entry, now: Option<&str>) -> Decision {
    match now {
        Some(s) if s == e.new_sidecar => Decision::RollForward,
        Some(s) if s == e.old_sidecar => Decision::RollBack,
        _ => Decision::Keep,
    }
}

fn fsync_dir(d: &Path) -> io::Result<()> {
    File::open(d)?.sync_all()
}

/// The journal directory and the staging directory (same file system).
pub struct Journal {
    dir: PathBuf,
    tmp: PathBuf,
}

/// A live entry: its file, locked while the task runs (dropping it releases the lock).
pub struct Held {
    path: PathBuf,
    file: File,
}

impl Journal {
    /// Opens (creating) `<mdt>/migrations`; entries are staged in `tmp`.
    pub fn open(mdt: &Path, tmp: &Path) -> io::Result<Journal> {
        let dir = mdt.join("migrations");
        fs::create_dir_all(&dir)?;
        Ok(Journal { dir, tmp: tmp.to_path_buf() })
    }

    fn name(id: u64) -> String {
        format!("{id:016x}.json")
    }

    /// Writes entry `e`, durable (file and directory fsynced) and locked by the caller when
    /// this returns.
    pub fn begin(&self, e: &Entry) -> io::Result<Held> {
        let staged = self.tmp.join(format!("migration-{:016x}", e.id));
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&staged)?;
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::last_os_error());
        }
        f.write_all(&serde_json::to_vec(e)?)?;
        f.sync_all()?;
        let path = self.dir.join(Self::name(e.id));
        fs::rename(&staged, &path)?;
        fsync_dir(&self.dir)?;
        Ok(Held { path, file: f })
    }

    /// Rewrites a held entry (e.g. `switched` set): staged, fsynced, renamed over it; the new
    /// file is locked before it replaces the old one.
    pub fn update(&self, h: &mut Held, e: &Entry) -> io::Result<()> {
        *h = self.begin(e)?;
        Ok(())
    }

    /// Removes a finished task's entry.
    pub fn finish(&self, h: Held) -> io::Result<()> {
        fs::remove_file(&h.path)?;
        drop(h.file);
        fsync_dir(&self.dir)
    }

    /// Entries whose owner is gone (their lock could be taken), each with its lock now held
    /// by the caller; unreadable entries are reported by path and left alone.
    pub fn orphans(&self) -> (Vec<(Entry, Held)>, Vec<String>) {
        let (mut out, mut bad) = (Vec::new(), Vec::new());
        let Ok(it) = fs::read_dir(&self.dir) else { return (out, bad) };
        for d in it.flatten() {
            let path = d.path();
            let Ok(file) = OpenOptions::new().read(true).open(&path) else { continue };
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                continue; // a live daemon's task
            }
            match fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Entry>(&b).ok()) {
                Some(e) => out.push((e, Held { path, file })),
                None => bad.push(path.display().to_string()),
            }
        }
        out.sort_by_key(|(e, _)| e.id);
        (out, bad)
    }
}
