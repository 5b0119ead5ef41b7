//! Attribution registry, separate from the tracer (coroot-node-agent style): cgroup id → job,
//! process → rank, and the file tables that give records their paths.
//!
//! Job and rank follow the one rule of `pharos-attribution` (proto/attribution), which the FUSE
//! mount applies too:
//!
//! * cgroup v2 ids equal the inode number of the cgroup's directory; on a miss the watched
//!   roots are walked and every directory seen is cached with what its path says
//!   ([`JobCgroup`]: the last `job_<ID>` component, `.scope` stripped, and a `rank_<r>` /
//!   `task_<r>` component below it).
//! * rank: the innermost launcher's variable in the process's environment (PMI_RANK,
//!   PMIX_RANK, OMPI_COMM_WORLD_RANK, then PHAROS_RANK, then SLURM_PROCID), else the cgroup
//!   path's rank, else -1; -1 outside a job. The environment comes from the kernel's exec event
//!   ([`Registry::exec`]: read in the kernel when a process of a watched cgroup execs, so a
//!   rank that writes and exits before its first record is read still has it), else from
//!   /proc/<pid>/environ at the pid's first record; cached per (pid, cgroup id). A process
//!   forked without exec has its parent's rank ([`Registry::forked`], the kernel's fork event).
//!   A process gone before any of these gets the cgroup path's rank (not cached).
//! * files: (dev, inode) → path from OPEN records, and (pid, fd) → (dev, inode, path).
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use pharos_attribution::JobCgroup;

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
    /// cgroup id → what its path says (None = not below a watched root).
    cgroups: HashMap<u64, Option<JobCgroup>>,
    /// (pid, cgroup id) → rank, learnt from the process's environment.
    ranks: HashMap<(u32, u64), i32>,
    /// pid → (cgroup id, environment so far) of exec events still arriving in chunks.
    envs: HashMap<u32, (u64, Vec<u8>)>,
    files: HashMap<(u64, u64), String>,
    fds: HashMap<(u32, i32), FdEntry>,
}

/// The environment block of a live process, None when it is gone (or a zombie: empty).
fn read_environ(pid: u32) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/environ")).ok().filter(|e| !e.is_empty())
}

/// Kernel-internal dev_t ((major << 20) | minor, as `s_dev`) of a user-space st_dev.
pub fn kernel_dev(st_dev: u64) -> u64 {
    let (major, minor) = (libc::major(st_dev) as u64, libc::minor(st_dev) as u64);
    (major << 20) | minor
}

impl Registry {
    pub fn new(roots: Vec<PathBuf>) -> Self {
        Registry {
            roots,
            cgroups: HashMap::new(),
            ranks: HashMap::new(),
            envs: HashMap::new(),
            files: HashMap::new(),
            fds: HashMap::new(),
        }
    }

    /// Walks the watched roots, caching every cgroup directory's id → job; calls `f` on each.
    fn walk(&mut self, mut f: impl FnMut(&Path)) {
        let mut stack: Vec<PathBuf> = self.roots.clone();
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else { continue };
            self.cgroups.insert(meta.ino(), Some(JobCgroup::from_path(&dir.to_string_lossy())));
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

    /// What the path of a cgroup id says (default: no job, e.g. not below a watched root).
    fn cgroup(&mut self, cgroup_id: u64) -> &JobCgroup {
        static NONE: JobCgroup = JobCgroup { job: String::new(), rank: None };
        if cgroup_id == 0 {
            return &NONE;
        }
        if !self.cgroups.contains_key(&cgroup_id) {
            if self.cgroups.len() > MAX_PROCS {
                self.cgroups.clear();
            }
            self.walk(|_| {});
            self.cgroups.entry(cgroup_id).or_insert(None);
        }
        self.cgroups.get(&cgroup_id).and_then(Option::as_ref).unwrap_or(&NONE)
    }

    /// Job id of a cgroup id, "" when it belongs to no job.
    pub fn job(&mut self, cgroup_id: u64) -> String {
        self.cgroup(cgroup_id).job.clone()
    }

    /// Rank of a process (cached per (pid, cgroup id)), -1 when unknown.
    pub fn rank(&mut self, pid: u32, cgroup_id: u64) -> i32 {
        if pid == 0 {
            return -1;
        }
        if let Some(r) = self.ranks.get(&(pid, cgroup_id)) {
            return *r;
        }
        if self.cgroup(cgroup_id).job.is_empty() {
            return -1;
        }
        match read_environ(pid) {
            Some(env) => self.learn(pid, cgroup_id, &env),
            None => self.cgroup(cgroup_id).rank(None), // gone (or a zombie): not cached
        }
    }

    /// A chunk (from byte `offset`) of the environment of a process that exec'd in a watched
    /// cgroup, of which the kernel sends `sent` bytes in all (fewer than the environment has when
    /// `truncated`): once all have come, [`Registry::exec`]. A chunk out of order (one was lost)
    /// drops what came so far: the rank is then read from /proc/<pid>/environ.
    pub fn exec_chunk(&mut self, pid: u32, cgroup_id: u64, offset: u64, chunk: &[u8], sent: u64, truncated: bool) {
        if offset == 0 {
            if self.envs.len() > MAX_PROCS {
                self.envs.clear();
            }
            self.envs.insert(pid, (cgroup_id, Vec::with_capacity(sent.min(1 << 20) as usize)));
        }
        let Some((cg, env)) = self.envs.get_mut(&pid) else { return };
        if *cg != cgroup_id || env.len() as u64 != offset {
            self.envs.remove(&pid);
            return;
        }
        env.extend_from_slice(chunk);
        if env.len() as u64 >= sent {
            let (cg, env) = self.envs.remove(&pid).unwrap_or_default();
            self.exec(pid, cg, &env, truncated);
        }
    }

    /// A process of a watched cgroup exec'd with the environment `env` (read by the kernel at
    /// exec, `truncated` when the kernel sent only its beginning): learns its rank.
    pub fn exec(&mut self, pid: u32, cgroup_id: u64, env: &[u8], truncated: bool) {
        if pid == 0 || self.cgroup(cgroup_id).job.is_empty() {
            return;
        }
        let whole = if truncated { read_environ(pid) } else { None };
        let env = match &whole {
            Some(w) => w.as_slice(),
            // the last variable may be cut: keep whole ones only
            None if truncated => &env[..env.iter().rposition(|&b| b == 0).unwrap_or(0)],
            None => env,
        };
        self.learn(pid, cgroup_id, env);
    }

    /// `parent` (a process of `cgroup_id`) forked the process `child` (the kernel's fork event):
    /// the child has the parent's rank until it execs ([`Registry::exec`] then learns its own),
    /// so a child that does its I/O and exits without exec (fio's job processes) keeps the rank
    /// its parent's environment gives, not the cgroup path's.
    pub fn forked(&mut self, parent: u32, child: u32, cgroup_id: u64) {
        if child == 0 || self.cgroup(cgroup_id).job.is_empty() {
            return;
        }
        let r = self.rank(parent, cgroup_id);
        if self.ranks.len() > MAX_PROCS {
            self.ranks.clear();
        }
        self.ranks.insert((child, cgroup_id), r);
    }

    /// Applies the rule to `env` of `pid` in `cgroup_id` and caches the rank.
    fn learn(&mut self, pid: u32, cgroup_id: u64, env: &[u8]) -> i32 {
        let r = self.cgroup(cgroup_id).rank(Some(env));
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

    /// Path of the file (dev, ino) behind `fd` of `pid`, "" when unknown. Descriptors 0, 1 and 2
    /// that no traced process opened (inherited from the launcher: e.g. srun writing its tasks'
    /// output to the job's output file that slurmstepd opened) are the standard streams, named
    /// as Darshan's STDIO module names them: `<STDIN>`, `<STDOUT>`, `<STDERR>` (the analytics
    /// count them as stream I/O, not data files). A stream a job process opened itself (a shell
    /// redirection) keeps its path.
    pub fn path_of(&self, pid: u32, fd: i32, dev: u64, ino: u64) -> String {
        if let Some(p) = self.files.get(&(dev, ino)) {
            return p.clone();
        }
        match self.fds.get(&(pid, fd)) {
            Some(e) if (e.dev, e.ino) == (dev, ino) || (dev, ino) == (0, 0) => e.path.clone(),
            _ => match fd {
                0 => "<STDIN>".to_string(),
                1 => "<STDOUT>".to_string(),
                2 => "<STDERR>".to_string(),
                _ => String::new(),
            },
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

    /// The shared attribution vectors (proto/attribution/vectors.json) through the registry:
    /// each case's cgroup v2 path made a directory below a watched root, its environment given
    /// as the kernel's exec event would, or, when unreadable, a process that is gone.
    #[test]
    fn attribution_vectors() {
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(pharos_attribution::VECTORS).unwrap()).unwrap();
        const GONE: u32 = u32::MAX; // above any pid_max: /proc/<pid>/environ never exists
        for (i, c) in doc["cases"].as_array().unwrap().iter().enumerate() {
            let v2 = pharos_attribution::cgroup_v2_path(c["cgroup"].as_str().unwrap());
            let (_root, mut r, id) = registry_with(v2.unwrap_or("/"));
            let cgroup_id = if v2.is_some() { id } else { 1 }; // None: in no cgroup the agent watches
            let pid = GONE - i as u32;
            if let Some(vars) = c["environ"].as_array() {
                let env: Vec<String> = vars.iter().map(|v| format!("{}\0", v.as_str().unwrap())).collect();
                r.exec(pid, cgroup_id, env.concat().as_bytes(), false);
            }
            let want = (c["job"].as_str().unwrap().to_string(), c["rank"].as_i64().unwrap() as i32);
            assert_eq!((r.job(cgroup_id), r.rank(pid, cgroup_id)), want, "case {}", c["name"]);
        }
    }

    /// A registry watching a temporary root with the cgroup directory `rel` below it; its id.
    fn registry_with(rel: &str) -> (tempfile::TempDir, Registry, u64) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        let id = std::fs::metadata(&dir).unwrap().ino();
        let r = Registry::new(vec![root.path().to_path_buf()]);
        (root, r, id)
    }

    #[test]
    fn exec_environ_in_chunks() {
        let (_root, mut r, id) = registry_with("job_5/rank_7");
        let env = b"A=1\0PHAROS_RANK=0\0PMI_RANK=12\0";
        let (pid, n) = (u32::MAX, env.len() as u64);
        r.exec_chunk(pid, id, 0, &env[..10], n, false);
        assert_eq!(r.rank(pid, id), 7, "incomplete: the process is gone, the cgroup's rank");
        r.exec_chunk(pid, id, 10, &env[10..], n, false);
        assert_eq!(r.rank(pid, id), 12);
        // a lost chunk: nothing learnt from the rest
        r.exec_chunk(pid - 1, id, 0, &env[..4], n, false);
        r.exec_chunk(pid - 1, id, 20, &env[20..], n, false);
        assert_eq!(r.rank(pid - 1, id), 7);
        // an empty environment: one empty chunk
        r.exec_chunk(pid - 2, id, 0, b"", 0, false);
        assert_eq!(r.rank(pid - 2, id), 7);
        assert_eq!(crate::tracer::ENV_CHUNK, 16384, "iotrace.h PH_ENV_CHUNK");
    }

    #[test]
    fn forked_child_has_its_parents_rank_until_it_execs() {
        let (_root, mut r, id) = registry_with("job_5/rank_0");
        let (parent, child) = (u32::MAX, u32::MAX - 1);
        r.exec(parent, id, b"PMI_RANK=3\0", false);
        r.forked(parent, child, id);
        assert_eq!(r.rank(child, id), 3, "gone before its first record: the parent's rank, not rank_0's");
        r.exec(child, id, b"PMI_RANK=9\0", false);
        assert_eq!(r.rank(child, id), 9, "its own environment once it execs");
        r.forked(u32::MAX - 2, u32::MAX - 3, id); // parent gone, never seen: the cgroup's rank
        assert_eq!(r.rank(u32::MAX - 3, id), 0);
        r.forked(parent, u32::MAX - 4, 1); // in no job: nothing cached
        assert_eq!(r.rank(u32::MAX - 4, 1), -1);
    }

    #[test]
    fn truncated_exec_environ_keeps_whole_variables() {
        let (_root, mut r, id) = registry_with("job_5/rank_7");
        // "PMI_RANK=12" cut after "PMI_RANK=1" (the process is gone): not a rank
        r.exec(u32::MAX, id, b"A=1\0PHAROS_RANK=3\0PMI_RANK=1", true);
        assert_eq!(r.rank(u32::MAX, id), 3);
        r.exec(u32::MAX - 1, id, b"PMI_RANK=1", true);
        assert_eq!(r.rank(u32::MAX - 1, id), 7); // nothing whole: the cgroup's rank
        assert_eq!(r.job(id), "5");
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
        // inherited standard streams get Darshan's names; one the job opened keeps its path
        assert_eq!(r.path_of(10, 1, 9, 9), "<STDOUT>");
        assert_eq!(r.path_of(10, 2, 9, 9), "<STDERR>");
        assert_eq!(r.path_of(10, 0, 9, 9), "<STDIN>");
        r.opened(12, 1, 8, 8, "/home/u/out.txt");
        assert_eq!(r.path_of(12, 1, 8, 8), "/home/u/out.txt");
        assert_eq!(r.path_of(13, 1, 8, 8), "/home/u/out.txt"); // inherited by a child: same file
    }
}
