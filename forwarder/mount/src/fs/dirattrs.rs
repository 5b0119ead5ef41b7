//! Attributes of directories this mount just changed a name in, as the daemon answered them
//! after the change (issue 29, item 3: answering what the mount can answer itself). The kernel
//! drops a directory's attributes after every create or unlink in it and asks for them
//! (GETATTR) before its next permission check there: with these, that costs no request, so a
//! create or an unlink in a job's directory is one request, not two.
//!
//! Kept for the attribute TTL; dropped when this mount makes a change there whose answer does
//! not carry them (mkdir, rename, ...), when another mount changes the directory (a push), or
//! when the kernel forgets it.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pharos_fwd_proto::Attr;

/// Most directories kept (a full table drops its expired ones, then takes no more).
const MAX: usize = 4096;

/// Directory inode → (attributes after the last change through this mount, valid until).
#[derive(Default)]
pub struct DirAttrs {
    m: Mutex<HashMap<u64, (Attr, Instant)>>,
    /// GETATTRs answered from here.
    pub answered: AtomicU64,
}

impl DirAttrs {
    /// Directory `ino`'s attributes are `a` (answered by the daemon after a change), for `ttl`.
    /// Of two answers the one with the newer ctime stays (replies may arrive out of order).
    pub fn put(&self, ino: u64, a: Attr, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut m = self.m.lock().unwrap();
        let now = Instant::now();
        if m.len() >= MAX && !m.contains_key(&ino) {
            m.retain(|_, (_, until)| *until > now);
            if m.len() >= MAX {
                return;
            }
        }
        match m.get(&ino) {
            Some((old, until)) if *until > now && old.ctime > a.ctime => {}
            _ => {
                m.insert(ino, (a, now + ttl));
            }
        }
    }

    /// The attributes of `ino` while valid (counted when answered).
    pub fn get(&self, ino: u64) -> Option<Attr> {
        let mut m = self.m.lock().unwrap();
        match m.get(&ino) {
            Some((a, until)) if *until > Instant::now() => {
                self.answered.fetch_add(1, Relaxed);
                Some(a.clone())
            }
            Some(_) => {
                m.remove(&ino);
                None
            }
            None => None,
        }
    }

    /// The attributes of `ino` while valid, not counted (a check of the mount's own).
    pub fn peek(&self, ino: u64) -> Option<Attr> {
        let m = self.m.lock().unwrap();
        m.get(&ino).filter(|(_, until)| *until > Instant::now()).map(|(a, _)| a.clone())
    }

    /// Forget `ino`'s attributes (changed without an answer carrying them, or elsewhere).
    pub fn drop_ino(&self, ino: u64) {
        self.m.lock().unwrap().remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pharos_fwd_proto::{Kind, Time};

    fn dir(ctime: i64) -> Attr {
        let t = Time { sec: ctime, nsec: 0 };
        Attr {
            ino: 9,
            kind: Kind::Dir,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 4096,
            blocks: 8,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
        }
    }

    #[test]
    fn the_newer_answer_stays_until_dropped_or_expired() {
        let d = DirAttrs::default();
        d.put(9, dir(20), Duration::from_secs(10));
        d.put(9, dir(10), Duration::from_secs(10)); // a reply that arrived late
        assert_eq!(d.get(9).unwrap().ctime.sec, 20);
        d.drop_ino(9);
        assert!(d.get(9).is_none());
        d.put(9, dir(30), Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(d.get(9).is_none(), "expired");
        d.put(9, dir(40), Duration::ZERO);
        assert!(d.get(9).is_none(), "no caching, nothing kept");
        assert_eq!(d.answered.load(Relaxed), 1);
    }
}
