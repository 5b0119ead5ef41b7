//! Attribution registry, separate from the tracer (coroot-node-agent style): cgroup id → job,
//! process → rank, and the file tables that give records their paths.
//!
//! * cgroup v2 ids equal the inode number of the cgroup's directory; on a miss the watched
//!   roots are walked and every directory seen is cached. The job id is the `job_<ID>` path
//!   component (`pharos run`: `<root>/job_<ID>`; Slurm: `.../job_<id>/step_<n>`).
//! * rank: the `rank_<r>` component of the cgroup path (`pharos run` starts rank r in
//!   `<root>/job_<ID>/rank_<r>`; Slurm: `task_<r>`), which stays readable after a short-lived
//!   rank has exited; else the first of PHAROS_RANK, SLURM_PROCID, PMI_RANK,
//!   OMPI_COMM_WORLD_RANK in /proc/<pid>/environ; -1 when unknown; cached per (pid, cgroup id).
//! * files: (dev, inode) → path from OPEN records, and (pid, fd) → (dev, inode, path).
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const RANK_VARS: [&str; 4] = ["PHAROS_RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"];
/// Bounds of the caches; a full cache is cleared (entries are re-learnt).
const MAX_FILES: usize = 1 << 20;
const MAX_PROCS: usize = 1 << 16;

#[derive(Clone, Debug, PartialEq)]
pub struct FdEntry {
    pub dev: u64,
    pub ino: u64,
    pub path: String,
}

pub struct Registry {
    /// Absolute directories of the watched root cgroups.
    roots: Vec<PathBuf>,
    /// cgroup id → job id ("" = known cgroup, no job; None = not below a watched root).
    cgroups: HashMap<u64, Option<String>>,
    ranks: HashMap<(u32, u64), i32>,
    /// cgroup id → rank from its path (`rank_<r>` / Slurm `task_<r>`), for cgroups that have one.
    cgroup_ranks: HashMap<u64, i32>,
    files: HashMap<(u64, u64), String>,
    fds: HashMap<(u32, i32), FdEntry>,
}

/// Kernel-internal dev_t ((major << 20) | minor, as `s_dev`) of a user-space st_dev.
pub fn kernel_dev(st_dev: u64) -> u64 {
    let (major, minor) = (libc::major(st_dev) as u64, libc::minor(st_dev) as u64);
    (major << 20) | minor
}

/// Job id of a cgroup path: the text after the last `job_` component, "" when none.
pub fn job_of_path(p: &Path) -> String {
    p.components().rev().find_map(|c| c.as_os_str().to_str()?.strip_prefix("job_")).unwrap_or("").to_string()
}

/// Rank from a cgroup path: the last `rank_<r>` (pharos run) or `task_<r>` (Slurm) component.
pub fn rank_of_path(p: &Path) -> Option<i32> {
    p.components().rev().find_map(|c| {
        let s = c.as_os_str().to_str()?;
        s.strip_prefix("rank_").or_else(|| s.strip_prefix("task_"))?.parse::<i32>().ok()
    })
}

/// Rank from a NUL-separated environment block.
pub fn rank_of_environ(env: &[u8]) -> i32 {
    let vars: HashMap<&[u8], &[u8]> = env
        .split(|&b| b == 0)
        .filter_map(|kv| {
            let i = kv.iter().position(|&b| b == b'=')?;
            Some((&kv[..i], &kv[i + 1..]))
        })
        .collect();
    for name in RANK_VARS {
        if let Some(v) = vars.get(name.as_bytes()) {
            if let Some(r) = std::str::from_utf8(v).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
                return r;
            }
        }
    }
    -1
}

impl Registry {
    pub fn new(roots: Vec<PathBuf>) -> Self {
        Registry {
            roots,
            cgroups: HashMap::new(),
            ranks: HashMap::new(),
            cgroup_ranks: HashMap::new(),
            files: HashMap::new(),
            fds: HashMap::new(),
        }
    }

    /// Walks the watched roots, caching every cgroup directory's id → job; calls `f` on each.
    fn walk(&mut self, mut f: impl FnMut(&Path)) {
        let mut stack: Vec<PathBuf> = self.roots.clone();
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else { continue };
            self.cgroups.insert(meta.ino(), Some(job_of_path(&dir)));
            if let Some(r) = rank_of_path(&dir) {
                self.cgroup_ranks.insert(meta.ino(), r);
            }
            f(&dir);
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        stack.push(e.path());
                    }
                }
            }
        }
    }

    /// Job id of a cgroup id, "" when it belongs to no job.
    pub fn job(&mut self, cgroup_id: u64) -> String {
        if cgroup_id == 0 {
            return String::new();
        }
        if let Some(j) = self.cgroups.get(&cgroup_id) {
            return j.clone().unwrap_or_default();
        }
        if self.cgroups.len() > MAX_PROCS {
            self.cgroups.clear();
            self.cgroup_ranks.clear();
        }
        self.walk(|_| {});
        self.cgroups.entry(cgroup_id).or_insert(None).clone().unwrap_or_default()
    }

    /// Rank of a process (cached per (pid, cgroup id)), -1 when unknown.
    pub fn rank(&mut self, pid: u32, cgroup_id: u64) -> i32 {
        if pid == 0 {
            return -1;
        }
        if let Some(r) = self.ranks.get(&(pid, cgroup_id)) {
            return *r;
        }
        self.job(cgroup_id); // resolves (walks) the cgroup if it is new
        if let Some(r) = self.cgroup_ranks.get(&cgroup_id) {
            return *r;
        }
        let r = match std::fs::read(format!("/proc/{pid}/environ")) {
            Ok(env) if !env.is_empty() => rank_of_environ(&env),
            _ => return -1, // gone (or a zombie): do not cache
        };
        if self.ranks.len() > MAX_PROCS {
            self.ranks.clear();
        }
        self.ranks.insert((pid, cgroup_id), r);
        r
    }

    /// Records that `pid` opened `path` as `fd` (dev, ino of the file).
    pub fn opened(&mut self, pid: u32, fd: i32, dev: u64, ino: u64, path: &str) {
        if self.files.len() > MAX_FILES {
            self.files.clear();
        }
        if self.fds.len() > MAX_FILES {
            self.fds.clear();
        }
        if !path.is_empty() && (dev != 0 || ino != 0) {
            self.files.insert((dev, ino), path.to_string());
        }
        self.fds.insert((pid, fd), FdEntry { dev, ino, path: path.to_string() });
    }

    pub fn closed(&mut self, pid: u32, fd: i32) {
        self.fds.remove(&(pid, fd));
    }

    /// Path of the file (dev, ino) behind `fd` of `pid`, "" when unknown.
    pub fn path_of(&self, pid: u32, fd: i32, dev: u64, ino: u64) -> String {
        if let Some(p) = self.files.get(&(dev, ino)) {
            return p.clone();
        }
        match self.fds.get(&(pid, fd)) {
            Some(e) if (e.dev, e.ino) == (dev, ino) || (dev, ino) == (0, 0) => e.path.clone(),
            _ => String::new(),
        }
    }

    /// Makes a path argument absolute: relative to /proc/<pid>/cwd (dirfd = AT_FDCWD) or to
    /// the directory open as `dirfd`. Best effort: unchanged when the base is unknown.
    pub fn absolute(&self, pid: u32, dirfd: i32, path: &str) -> String {
        if path.starts_with('/') || path.is_empty() {
            return path.to_string();
        }
        let base = if dirfd == libc::AT_FDCWD {
            std::fs::read_link(format!("/proc/{pid}/cwd")).ok().map(|p| p.to_string_lossy().into_owned())
        } else {
            self.fds.get(&(pid, dirfd)).map(|e| e.path.clone()).filter(|p| p.starts_with('/'))
        };
        match base {
            Some(b) => format!("{}/{}", b.trim_end_matches('/'), path.trim_start_matches("./")),
            None => path.to_string(),
        }
    }

    /// Startup backfill: for every process already inside a watched cgroup, learn its open
    /// file descriptors from /proc/<pid>/fd. Returns (processes, fds) seen.
    pub fn backfill(&mut self) -> (usize, usize) {
        let mut pids = Vec::new();
        self.walk(|dir| {
            if let Ok(s) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        });
        let mut nfds = 0;
        for &pid in &pids {
            let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
            for e in rd.flatten() {
                let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
                let Ok(target) = std::fs::read_link(e.path()) else { continue };
                let Ok(meta) = std::fs::metadata(e.path()) else { continue };
                let t = target.to_string_lossy();
                let path = if t.starts_with('/') { t.into_owned() } else { String::new() };
                self.opened(pid, fd, kernel_dev(meta.dev()), meta.ino(), &path);
                nfds += 1;
            }
        }
        (pids.len(), nfds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_from_paths() {
        assert_eq!(job_of_path(Path::new("/sys/fs/cgroup/pharos/job_42")), "42");
        assert_eq!(job_of_path(Path::new("/sys/fs/cgroup/pharos/job_42/rank_1")), "42");
        assert_eq!(
            job_of_path(Path::new("/sys/fs/cgroup/system.slice/slurmstepd.scope/job_17/step_0/user/task_0")),
            "17"
        );
        assert_eq!(job_of_path(Path::new("/sys/fs/cgroup/pharos")), "");
    }

    #[test]
    fn ranks_from_paths() {
        assert_eq!(rank_of_path(Path::new("/sys/fs/cgroup/pharos/job_42/rank_3")), Some(3));
        assert_eq!(rank_of_path(Path::new("/x/slurmstepd.scope/job_17/step_0/user/task_5")), Some(5));
        assert_eq!(rank_of_path(Path::new("/sys/fs/cgroup/pharos/job_42")), None);
        assert_eq!(rank_of_path(Path::new("/sys/fs/cgroup/pharos/job_42/rank_x")), None);
    }

    #[test]
    fn ranks_from_environ() {
        assert_eq!(rank_of_environ(b"A=1\0PMI_RANK=4\0SLURM_PROCID=3\0"), 3);
        assert_eq!(rank_of_environ(b"OMPI_COMM_WORLD_RANK=7\0PHAROS_RANK=2\0"), 2);
        assert_eq!(rank_of_environ(b"PHAROS_RANK=x\0PMI_RANK=5\0"), 5);
        assert_eq!(rank_of_environ(b"HOME=/\0"), -1);
    }

    #[test]
    fn dev_encoding_matches_kernel() {
        // 8:1 (sda1) is 0x801 in user space and (8 << 20) | 1 in the kernel.
        assert_eq!(kernel_dev(libc::makedev(8, 1)), 0x800001);
        assert_eq!(kernel_dev(libc::makedev(259, 300)), (259 << 20) | 300);
    }

    #[test]
    fn paths_from_fd_tables() {
        let mut r = Registry::new(vec![]);
        r.opened(10, 3, 1, 2, "/a/b");
        r.opened(10, 4, 1, 9, "/dir");
        assert_eq!(r.path_of(10, 3, 1, 2), "/a/b");
        assert_eq!(r.path_of(11, 7, 1, 2), "/a/b"); // same file, other process
        assert_eq!(r.absolute(10, 4, "x/y"), "/dir/x/y");
        assert_eq!(r.absolute(10, 5, "/abs"), "/abs");
        r.closed(10, 3);
        assert_eq!(r.path_of(10, 5, 7, 7), "");
    }
}
