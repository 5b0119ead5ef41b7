//! Directories whose every name this mount knows (issue 29, item 3: answering what the mount
//! can answer itself). A directory this mount made (mkdir) starts empty; while its entry is
//! valid, every name made or removed in it through this mount is recorded here, so a lookup of
//! any other name is answered "no such name" without a request: the lookup the kernel sends
//! before each create in a job's own directory (mdtest's, an N-N checkpoint's) costs nothing.
//!
//! Coherence: a shared directory is known whole only while this mount *holds* it (the daemon
//! answered its mkdir with `Body::MadeDir { held: true }`, recorded in the namespace for every
//! forwarding node): a name another mount adds there first recalls this mount
//! ([`Complete::recall`], acknowledged before that mount's request is answered), so once
//! another node's create has returned, this mount no longer answers "no such name" for it.
//! A recall that arrives before the mkdir's answer is applied is remembered, so the directory
//! is not taken as whole then. Where no recall can come (a forwarding node this mount does
//! not watch), the directory's entry ends with the TTL it started with (`--attr-ttl-ms`). A
//! create through this mount after a stale "no such name" is still right: the daemon opens the
//! existing file, or answers `EEXIST` to `O_EXCL`. Node-local rank directories are one compute
//! node's and known whole without a holder record.
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

/// Recalls remembered (for a mkdir whose answer is applied after its directory's recall);
/// beyond this, those older than [`RECALL_KEPT`] are forgotten.
const RECALLS_MAX: usize = 4096;
/// How long a recall is remembered at least, once [`RECALLS_MAX`] are: longer than a mkdir's
/// answer takes to be applied.
const RECALL_KEPT: Duration = Duration::from_secs(60);

/// The table of complete directories, by kernel inode number.
#[derive(Default)]
pub struct Complete {
    dirs: Mutex<HashMap<u64, Dir>>,
    /// When each directory was last recalled (see [`Complete::made_dir`]).
    recalled: Mutex<HashMap<u64, Instant>>,
    /// Lookups answered "no such name" here.
    pub answered: AtomicU64,
    /// Directories recalled by a forwarding node (another mount added a name there).
    pub recalls: AtomicU64,
}

impl Complete {
    /// Directory `ino` was just made, empty, through this mount by a mkdir sent at `asked`;
    /// known for `ttl` (unless recalled since `asked`).
    pub fn made_dir(&self, ino: u64, ttl: Duration, asked: Instant) {
        if ttl.is_zero() {
            return;
        }
        if self.recalled.lock().unwrap().get(&ino).is_some_and(|t| *t >= asked) {
            return; // another mount added a name before this answer was applied
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

    /// Whether `name` is known present in directory `parent` (a directory known whole).
    pub fn knows_present(&self, parent: u64, name: &str) -> bool {
        let m = self.dirs.lock().unwrap();
        m.get(&parent).is_some_and(|d| d.until > Instant::now() && d.names.contains(name))
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

    /// A forwarding node recalled directory `dir` (`Change::Recall`): no longer known here,
    /// nor taken as known by a mkdir answer still on its way.
    pub fn recall(&self, dir: u64) {
        let now = Instant::now();
        {
            let mut r = self.recalled.lock().unwrap();
            if r.len() >= RECALLS_MAX {
                r.retain(|_, t| now.duration_since(*t) < RECALL_KEPT);
            }
            r.insert(dir, now);
        }
        self.drop_dir(dir);
        self.recalls.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_made_here_are_known_others_are_absent() {
        let c = Complete::default();
        assert!(!c.absent(5, "a"), "a directory not made here is never answered");
        c.made_dir(5, Duration::from_secs(10), Instant::now());
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
    fn a_recall_ends_the_directory_and_one_before_the_mkdir_answer_too() {
        let c = Complete::default();
        let asked = Instant::now();
        c.made_dir(5, Duration::from_secs(10), asked);
        c.recall(5);
        assert!(!c.absent(5, "a"), "recalled: the daemon is asked");
        let asked = Instant::now();
        c.recall(6); // another mount's name in 6 came before 6's mkdir answer was applied
        c.made_dir(6, Duration::from_secs(10), asked);
        assert!(!c.absent(6, "a"), "a recall since the mkdir was sent: not whole");
        let later = Instant::now();
        c.made_dir(6, Duration::from_secs(10), later);
        assert!(c.absent(6, "a"), "a later mkdir of the inode number (reused) is whole again");
        assert_eq!(c.recalls.load(Relaxed), 2);
    }

    #[test]
    fn the_entry_ends_with_its_ttl() {
        let c = Complete::default();
        c.made_dir(7, Duration::from_millis(1), Instant::now());
        std::thread::sleep(Duration::from_millis(5));
        assert!(!c.absent(7, "x"));
        c.made_dir(8, Duration::ZERO, Instant::now());
        assert!(!c.absent(8, "x"), "no caching, no local answers");
    }
}
