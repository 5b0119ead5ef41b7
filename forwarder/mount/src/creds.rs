//! Supplementary groups of the processes calling the file system: FUSE requests carry the
//! caller's fsuid, fsgid and pid only, and the daemon checks permissions with all of the
//! caller's credentials (a member of a file's group gets the group's bits).
//!
//! Read from `/proc/<pid>/status` (`Groups:`; FUSE's pid is the calling thread) and cached
//! per (pid, uid, gid) for [`GROUPS_TTL`]: a process that changes its uid or gid gets a
//! fresh lookup at once; one that changes only its groups is seen within the TTL.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a cached group list is used.
pub const GROUPS_TTL: Duration = Duration::from_secs(1);
const GROUPS_MAX: usize = 8192;

type Key = (u32, u32, u32);

/// Supplementary groups by (pid, uid, gid), cached for [`GROUPS_TTL`] (bounded).
#[derive(Default)]
pub struct GroupsCache {
    m: Mutex<HashMap<Key, (Instant, Vec<u32>)>>,
}

/// The `Groups:` line of a /proc status text.
pub fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default()
}

impl GroupsCache {
    /// The supplementary groups of process `pid` running as `uid`/`gid` (empty for pid 0 or
    /// a process gone).
    pub fn get(&self, pid: u32, uid: u32, gid: u32) -> Vec<u32> {
        if pid == 0 {
            return Vec::new();
        }
        let key = (pid, uid, gid);
        if let Some((t, g)) = self.m.lock().unwrap().get(&key) {
            if t.elapsed() < GROUPS_TTL {
                return g.clone();
            }
        }
        let groups =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map(|s| parse_groups(&s)).unwrap_or_default();
        let mut m = self.m.lock().unwrap();
        if m.len() >= GROUPS_MAX {
            m.retain(|_, (t, _)| t.elapsed() < GROUPS_TTL);
        }
        m.insert(key, (Instant::now(), groups.clone()));
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_line_and_own_process() {
        assert_eq!(parse_groups("Name:\tx\nGroups:\t4 24 27 \nNSpid:\t1\n"), vec![4, 24, 27]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        let mine = std::fs::read_to_string("/proc/self/status").map(|s| parse_groups(&s)).unwrap();
        let c = GroupsCache::default();
        assert_eq!(c.get(std::process::id(), 0, 0), mine);
    }
}
