//! The mount's inode table: kernel inode number → namespace path and kernel lookup count,
//! with the reverse index path → inode, so that dropping a name (unlink, rmdir, a rename
//! over it) costs one hash lookup, not a scan of every inode the kernel holds (at 200,000
//! cached inodes, a scan per unlink made removals quadratic).
use std::collections::HashMap;

use super::{ROOT, STALE};

/// What the mount knows of a kernel inode: its namespace paths (hard links: each name the
/// kernel looked up; none = stale, its names are gone) and the kernel's lookup count.
pub(super) struct Inode {
    paths: Vec<String>,
    nlookup: u64,
}

/// Inodes by number, and the inode that holds each live path.
pub(super) struct Inodes {
    by_ino: HashMap<u64, Inode>,
    by_path: HashMap<String, u64>,
}

impl Inodes {
    /// A table holding the root (path "", never forgotten).
    pub(super) fn new() -> Inodes {
        let mut by_ino = HashMap::new();
        by_ino.insert(ROOT, Inode { paths: vec![String::new()], nlookup: u64::MAX / 2 });
        Inodes { by_ino, by_path: HashMap::from([(String::new(), ROOT)]) }
    }

    /// The path of `ino` looked up last (None: unknown; [`STALE`] when its names are gone).
    pub(super) fn path(&self, ino: u64) -> Option<&str> {
        self.by_ino.get(&ino).map(|i| i.paths.first().map(String::as_str).unwrap_or(STALE))
    }

    /// `ino` is at `path` (one more kernel lookup). An inode that held `path` before lost
    /// that name (another file has it now).
    pub(super) fn learn(&mut self, ino: u64, path: &str) {
        if let Some(prev) = self.by_path.insert(path.to_string(), ino) {
            if prev != ino {
                if let Some(p) = self.by_ino.get_mut(&prev) {
                    p.paths.retain(|x| x != path);
                }
            }
        }
        let e = self.by_ino.entry(ino).or_insert(Inode { paths: Vec::new(), nlookup: 0 });
        e.nlookup += 1;
        // The name looked up last comes first: the file system reuses inode numbers, and a name
        // of an earlier file with this number may not have been dropped yet.
        e.paths.retain(|x| x != path);
        e.paths.insert(0, path.to_string());
    }

    /// The name `path` is gone: the inode holding it (but `keep` and the root) loses it.
    pub(super) fn drop_name(&mut self, path: &str, keep: Option<u64>) {
        let Some(&ino) = self.by_path.get(path) else { return };
        if Some(ino) == keep || ino == ROOT {
            return;
        }
        self.by_path.remove(path);
        if let Some(i) = self.by_ino.get_mut(&ino) {
            i.paths.retain(|x| x != path);
        }
    }

    /// The kernel forgot `n` lookups of `ino`; true when it holds none any more (removed).
    pub(super) fn forget(&mut self, ino: u64, n: u64) -> bool {
        if ino == ROOT {
            return false;
        }
        let Some(i) = self.by_ino.get_mut(&ino) else { return false };
        i.nlookup = i.nlookup.saturating_sub(n);
        if i.nlookup > 0 {
            return false;
        }
        let i = self.by_ino.remove(&ino).unwrap();
        for p in i.paths {
            if self.by_path.get(&p) == Some(&ino) {
                self.by_path.remove(&p);
            }
        }
        true
    }

    /// `from` was renamed to `to`: what was at `to` loses that name, the inode at `from` and
    /// everything below it (a directory) move. The paths below are found by a scan: a rename
    /// is rare next to creates and unlinks.
    pub(super) fn rename(&mut self, from: &str, to: &str) {
        let moved = self.by_path.get(from).copied();
        self.drop_name(to, moved);
        let pre = format!("{from}/");
        let mut re: Vec<(String, String)> = Vec::new();
        for i in self.by_ino.values_mut() {
            for p in i.paths.iter_mut() {
                let new = if p == from {
                    to.to_string()
                } else if let Some(rest) = p.strip_prefix(&pre) {
                    format!("{to}/{rest}")
                } else {
                    continue;
                };
                re.push((std::mem::replace(p, new.clone()), new));
            }
        }
        for (old, new) in re {
            if let Some(ino) = self.by_path.remove(&old) {
                self.by_path.insert(new, ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_dropped_renamed_and_replaced() {
        let mut t = Inodes::new();
        t.learn(10, "d");
        t.learn(11, "d/a");
        t.learn(12, "d/b");
        t.drop_name("d/a", None);
        assert_eq!(t.path(11), Some(STALE));
        t.rename("d", "e");
        assert_eq!((t.path(10), t.path(12)), (Some("e"), Some("e/b")));
        t.learn(13, "x");
        t.rename("e/b", "x"); // over x: 13 is stale, 12 is x
        assert_eq!((t.path(12), t.path(13)), (Some("x"), Some(STALE)));
        t.drop_name("x", Some(12));
        assert_eq!(t.path(12), Some("x"), "kept");
        // a hard link learned under a second name: dropping either name keeps the other
        t.learn(12, "y");
        assert_eq!(t.path(12), Some("y"), "the name looked up last");
        t.drop_name("y", None);
        assert_eq!(t.path(12), Some("x"));
        t.learn(12, "y");
        t.drop_name("x", None);
        assert_eq!(t.path(12), Some("y"));
        // another inode learned at a path takes the name from the previous holder
        t.learn(14, "y");
        assert_eq!(t.path(12), Some(STALE));
        assert!(!t.forget(14, 0) && t.forget(14, 1) && t.path(14).is_none());
        assert!(!t.forget(ROOT, 1) && t.path(ROOT) == Some(""));
    }
}
