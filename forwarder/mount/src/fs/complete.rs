//! Directories whose every name this mount knows (issue 29, item 3: answering what the mount
//! can answer itself). A directory this mount made (mkdir) starts empty; while its entry is
//! valid, every name made or removed in it through this mount is recorded here, so a lookup of
//! any other name is answered "no such name" without a request: the lookup the kernel sends
//! before each create in a job's own directory (mdtest's, an N-N checkpoint's) costs nothing.
//!
//! Coherence is that of a cached negative entry: a name another mount makes in the directory
//! is pushed by the forwarding node that served it ([`crate::rpc`]'s watch), which ends the
//! directory's entry here; where no push comes, the entry ends with the TTL it started with
//! (`--attr-ttl-ms`). A create through this mount after a stale "no such name" is still right:
//! the daemon opens the existing file, or answers `EEXIST` to `O_EXCL`.
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most names recorded per directory; a directory with more is no longer answered locally.
pub const NAMES_MAX: usize = 100_000;
/// Most directories recorded at once (a full table drops its expired entries, then takes no
/// new directory until some expire).
pub const DIRS_MAX: usize = 4096;

struct Dir {
    until: Instant,
    names: HashSet<String>,
}

/// The table of complete directories, by kernel inode number.
#[derive(Default)]
pub struct Complete {
    dirs: Mutex<HashMap<u64, Dir>>,
    /// Lookups answered "no such name" here.
    pub answered: AtomicU64,
}

impl Complete {
    /// Directory `ino` was just made, empty, through this mount; known for `ttl`.
    pub fn made_dir(&self, ino: u64, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut m = self.dirs.lock().unwrap();
        let now = Instant::now();
        if m.len() >= DIRS_MAX {
            m.retain(|_, d| d.until > now);
            if m.len() >= DIRS_MAX {
                return;
            }
        }
        m.insert(ino, Dir { until: now + ttl, names: HashSet::new() });
    }

    /// Whether `name` is known absent from directory `parent` (counted when it is).
    pub fn absent(&self, parent: u64, name: &str) -> bool {
        let mut m = self.dirs.lock().unwrap();
        let Some(d) = m.get(&parent) else { return false };
        if d.until <= Instant::now() {
            m.remove(&parent);
            return false;
        }
        let absent = !d.names.contains(name);
        if absent {
            self.answered.fetch_add(1, Relaxed);
        }
        absent
    }

    /// Whether `name` is known absent from directory `parent` (not counted: a create's check).
    pub fn knows_absent(&self, parent: u64, name: &str) -> bool {
        let m = self.dirs.lock().unwrap();
        m.get(&parent).is_some_and(|d| d.until > Instant::now() && !d.names.contains(name))
    }

    /// `name` was made in `parent` through this mount.
    pub fn added(&self, parent: u64, name: &str) {
        let mut m = self.dirs.lock().unwrap();
        if let Some(d) = m.get_mut(&parent) {
            if d.names.len() >= NAMES_MAX {
                m.remove(&parent);
            } else {
                d.names.insert(name.to_string());
            }
        }
    }

    /// `name` was removed from `parent` (unlink, rmdir, renamed away) through this mount.
    pub fn removed(&self, parent: u64, name: &str) {
        if let Some(d) = self.dirs.lock().unwrap().get_mut(&parent) {
            d.names.remove(name);
        }
    }

    /// Another mount changed a name in `parent` (a push), or the kernel forgot it: no longer
    /// known here.
    pub fn drop_dir(&self, parent: u64) {
        self.dirs.lock().unwrap().remove(&parent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_made_here_are_known_others_are_absent() {
        let c = Complete::default();
        assert!(!c.absent(5, "a"), "a directory not made here is never answered");
        c.made_dir(5, Duration::from_secs(10));
        assert!(c.absent(5, "a"));
        c.added(5, "a");
        assert!(!c.absent(5, "a"), "a name made here exists");
        c.removed(5, "a");
        assert!(c.absent(5, "a"));
        c.drop_dir(5);
        assert!(!c.absent(5, "b"), "after another mount's change the daemon is asked");
        assert_eq!(c.answered.load(Relaxed), 2);
    }

    #[test]
    fn the_entry_ends_with_its_ttl() {
        let c = Complete::default();
        c.made_dir(7, Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!c.absent(7, "x"));
        c.made_dir(8, Duration::ZERO);
        assert!(!c.absent(8, "x"), "no caching, no local answers");
    }
}
