//! Node-local mode (issue 27, item 2; the Sunway storage paper's remote node-local storage, §6):
//! a job's rank directories live each on one storage target, chosen by a hash of the rank id,
//! in a namespace of their own on that target, so creates and removals there make no
//! operation on the shared namespace (the MDT: no sidecar in `<mdt>/ns`, no open marker, no
//! orphan check, no invalidation pushed to other mounts).
//!
//! * **Names.** `/.nodelocal/<job>/<rank>/...` (below the mount: `<mount>/.nodelocal/...`).
//!   `/.nodelocal` and `/.nodelocal/<job>` are views made by the daemon (the union of every
//!   target's); `<rank>/...` is the directory `<target>/.nodelocal/<job>/<rank>/...` of target
//!   [`rank_target`]`(rank)`, a function of the rank id only, so a restarted job (same job id),
//!   on any compute node, finds its data where it left it. Files there have the shared
//!   namespace's sidecar format, on the target itself, and their one object on that target.
//! * **Attachment.** A rank directory is written by one compute node: the first node that
//!   changes anything in it attaches it (`<target>/.nodelocal-attach/<job>/<rank>` holds the
//!   node's name, made with `O_EXCL`); every other node sees it read-only (`EROFS` on a change):
//!   that is the global read-only view, which lists and reads every rank of the job. A node
//!   that replaces a failed one takes over the failed node's ranks ([`NodeLocal::take_over`],
//!   admin `POST /nodelocal/attach`); no other node's attachments change.
//! * **Consistency.** Each daemon caches an attachment for [`OWNER_TTL`]; other mounts learn of
//!   node-local changes by their attribute TTL (no pushes): eventually consistent.
//! * **Inode numbers.** A target's inode numbers get the target's index + 1 in bits 48..56
//!   ([`local_ino`]); the two views' numbers have `0xfe` in bits 56..64.
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pharos_fwd_proto::{errno, validate_path, Attr, DirEntry, Kind, Time};

use super::namespace::Namespace;
use super::{eno, werr, Res};

/// The top directory of node-local names, in the namespace and on each target.
pub const DIR: &str = ".nodelocal";
/// Where the attachments are, on each target.
const ATTACH_DIR: &str = ".nodelocal-attach";
/// How long a daemon trusts an attachment it read (a take-over through another daemon is seen
/// at the latest this much later).
pub const OWNER_TTL: Duration = Duration::from_secs(1);
const VIEW_INO: u64 = 0xfe << 56;

/// Where a request path goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Where<'a> {
    /// The shared namespace.
    Shared,
    /// `/.nodelocal`: the jobs' view.
    Root,
    /// `/.nodelocal/<job>`: the job's ranks' view.
    Job(&'a str),
    /// In the rank directory `rank` of `job`, on target `ti`; `rel`: the path from
    /// `<target>/.nodelocal` (`<job>/<rank>/...`).
    Rank { ti: u32, job: &'a str, rank: &'a str, rel: &'a str },
}

/// The target of rank `rank` among `n`: a hash of the rank id (its number, else its name).
pub fn rank_target(rank: &str, n: usize) -> u32 {
    let mut x = rank.parse::<u64>().unwrap_or_else(|_| {
        rank.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
    });
    // splitmix64's finaliser
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((x ^ (x >> 31)) % n.max(1) as u64) as u32
}

/// Where `path` goes among `n` targets (`EINVAL` for an invalid path).
pub fn route(path: &str, n: usize) -> Res<Where<'_>> {
    if !path.trim_start_matches('/').starts_with(DIR) {
        return Ok(Where::Shared); // the shared namespace validates its own paths
    }
    let comps = validate_path(path)?;
    if comps.first() != Some(&DIR) {
        return Ok(Where::Shared);
    }
    let rel = path.trim_start_matches('/')[DIR.len()..].trim_start_matches('/');
    Ok(match comps.len() {
        1 => Where::Root,
        2 => Where::Job(rel),
        _ => Where::Rank { ti: rank_target(comps[2], n), job: comps[1], rank: comps[2], rel },
    })
}

/// The inode number the mount sees for inode `ino` of target `ti`'s store.
pub fn local_ino(ti: u32, ino: u64) -> u64 {
    (ino & ((1 << 48) - 1)) | ((ti as u64 + 1) << 48)
}

fn view_ino(job: Option<&str>) -> u64 {
    match job {
        None => VIEW_INO | 1,
        Some(j) => {
            VIEW_INO
                | 2
                | (j.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
                    & ((1 << 56) - 4))
        }
    }
}

fn rofs(job: &str, rank: &str, owner: &str) -> pharos_fwd_proto::WireError {
    eno(errno::EROFS, format!("rank {rank} of job {job} is attached to compute node {owner:?}: read-only here"))
}

/// The node-local stores of a daemon's targets and their attachments.
pub struct NodeLocal {
    stores: Vec<Namespace>,
    /// `<target>/.nodelocal` and `<target>/.nodelocal-attach` of each target.
    dirs: Vec<(PathBuf, PathBuf)>,
    /// (job, rank) → attached compute node, and when it was read.
    owners: Mutex<HashMap<(String, String), (String, Instant)>>,
}

impl NodeLocal {
    /// The stores of targets whose directories are `dirs` (made if missing).
    pub(super) fn new(dirs: &[PathBuf]) -> io::Result<NodeLocal> {
        let (mut stores, mut out) = (Vec::new(), Vec::new());
        for (i, d) in dirs.iter().enumerate() {
            let (s, a) = (d.join(DIR), d.join(ATTACH_DIR));
            for x in [&s, &a] {
                fs::DirBuilder::new().recursive(true).mode(0o755).create(x)?;
            }
            stores.push(Namespace::local(s.clone(), i as u32)?);
            out.push((s, a));
        }
        Ok(NodeLocal { stores, dirs: out, owners: Mutex::new(HashMap::new()) })
    }

    /// The store of target `ti`.
    pub(super) fn store(&self, ti: u32) -> &Namespace {
        &self.stores[ti as usize]
    }

    /// The compute node rank `rank` of `job` is attached to, if any (cached [`OWNER_TTL`]).
    pub fn owner(&self, job: &str, rank: &str) -> Option<String> {
        let key = (job.to_string(), rank.to_string());
        if let Some((n, at)) = self.owners.lock().unwrap().get(&key) {
            if at.elapsed() < OWNER_TTL {
                return Some(n.clone());
            }
        }
        let ti = rank_target(rank, self.dirs.len());
        let n = fs::read_to_string(self.dirs[ti as usize].1.join(job).join(rank)).ok()?;
        self.owners.lock().unwrap().insert(key, (n.clone(), Instant::now()));
        Some(n)
    }

    /// Before compute node `node` changes something in rank `rank` of `job`: allowed when the
    /// rank is attached to `node`, or attached to nobody (then it is attached to `node` now).
    pub fn check_writer(&self, job: &str, rank: &str, node: &str) -> Res<()> {
        for _ in 0..50 {
            match self.owner(job, rank) {
                Some(o) if o == node => return Ok(()),
                Some(o) if !o.is_empty() => return Err(rofs(job, rank, &o)),
                // Being written by its first writer (made, not yet filled): look again.
                Some(_) => std::thread::sleep(Duration::from_millis(1)),
                None => {
                    let ti = rank_target(rank, self.dirs.len());
                    let d = self.dirs[ti as usize].1.join(job);
                    fs::DirBuilder::new().recursive(true).mode(0o755).create(&d).map_err(werr)?;
                    let made = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(d.join(rank));
                    match made {
                        Ok(mut f) => {
                            f.write_all(node.as_bytes()).map_err(werr)?;
                            self.cache(job, rank, node);
                            return Ok(());
                        }
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(werr(e)),
                    }
                }
            }
        }
        Err(eno(errno::EIO, "attachment of the rank never written"))
    }

    fn cache(&self, job: &str, rank: &str, node: &str) {
        self.owners.lock().unwrap().insert((job.into(), rank.into()), (node.into(), Instant::now()));
    }

    /// A compute node `to` replaces the failed `from` in `job`: every rank of the job attached
    /// to `from` is attached to `to` (staged and renamed over); returns those ranks.
    pub fn take_over(&self, job: &str, from: &str, to: &str) -> io::Result<Vec<String>> {
        validate_path(job).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.msg))?;
        let mut moved = Vec::new();
        for (_, a) in &self.dirs {
            let Ok(rd) = fs::read_dir(a.join(job)) else { continue };
            for e in rd.flatten() {
                let rank = e.file_name().to_string_lossy().into_owned();
                if rank.starts_with(".tmp.") || fs::read_to_string(e.path())? != from {
                    continue;
                }
                let tmp = a.join(job).join(format!(".tmp.{rank}"));
                fs::write(&tmp, to)?;
                fs::rename(&tmp, e.path())?;
                self.cache(job, &rank, to);
                moved.push(rank);
            }
        }
        moved.sort();
        Ok(moved)
    }

    /// Every job's ranks: (job, rank, target index, attached node).
    pub fn attachments(&self) -> Vec<(String, String, u32, String)> {
        let mut out = Vec::new();
        for (ti, (_, a)) in self.dirs.iter().enumerate() {
            for j in fs::read_dir(a).into_iter().flatten().flatten() {
                for r in fs::read_dir(j.path()).into_iter().flatten().flatten() {
                    let rank = r.file_name().to_string_lossy().into_owned();
                    if !rank.starts_with(".tmp.") {
                        let node = fs::read_to_string(r.path()).unwrap_or_default();
                        out.push((j.file_name().to_string_lossy().into_owned(), rank, ti as u32, node));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// The directory `<target ti>/.nodelocal/<job>` (made as the daemon, mode 1777 as /tmp:
    /// any caller makes its rank directories there).
    pub(super) fn job_dir(&self, ti: u32, job: &str) -> Res<()> {
        let d = self.dirs[ti as usize].0.join(job);
        match fs::DirBuilder::new().mode(0o755).create(&d) {
            Ok(()) => fs::set_permissions(&d, fs::Permissions::from_mode(0o1777)).map_err(werr),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(werr(e)),
        }
    }

    /// `/.nodelocal/<job>` on every target (mkdir).
    pub(super) fn make_job(&self, job: &str) -> Res<Attr> {
        for ti in 0..self.dirs.len() {
            self.job_dir(ti as u32, job)?;
        }
        self.view_attr(Some(job))
    }

    /// Removes `/.nodelocal/<job>` from every target (rmdir: `ENOTEMPTY` while a rank is left).
    pub(super) fn remove_job(&self, job: &str) -> Res<()> {
        let mut found = false;
        for (s, _) in &self.dirs {
            match fs::remove_dir(s.join(job)) {
                Ok(()) => found = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(werr(e)),
            }
        }
        if !found {
            return Err(eno(errno::ENOENT, "no such job"));
        }
        for (_, a) in &self.dirs {
            let _ = fs::remove_dir_all(a.join(job));
        }
        self.owners.lock().unwrap().retain(|(j, _), _| j != job);
        Ok(())
    }

    /// The attributes of a view: `/.nodelocal` (None) or `/.nodelocal/<job>` (`ENOENT` when no
    /// target has the job).
    pub(super) fn view_attr(&self, job: Option<&str>) -> Res<Attr> {
        let dirs = self.dirs.iter().map(|(s, _)| match job {
            Some(j) => s.join(j),
            None => s.clone(),
        });
        let md = dirs.filter_map(|d| fs::symlink_metadata(d).ok()).find(|m| m.is_dir());
        let m = md.ok_or_else(|| eno(errno::ENOENT, "no such node-local job"))?;
        use std::os::unix::fs::MetadataExt;
        let tm = |s: i64, n: i64| Time { sec: s, nsec: n as u32 };
        Ok(Attr {
            ino: view_ino(job),
            kind: Kind::Dir,
            perm: if job.is_some() { m.mode() & 0o7777 } else { 0o555 },
            nlink: 2,
            uid: m.uid(),
            gid: m.gid(),
            size: 4096,
            blocks: 8,
            rdev: 0,
            atime: tm(m.atime(), m.atime_nsec()),
            mtime: tm(m.mtime(), m.mtime_nsec()),
            ctime: tm(m.ctime(), m.ctime_nsec()),
        })
    }

    /// The entries of a view (all in one page): the jobs of every target, or the ranks of
    /// `job` (each from its own target: strays on another target are left out).
    pub(super) fn view_entries(&self, job: Option<&str>, cookie: u64) -> Vec<DirEntry> {
        let mut names = BTreeSet::new();
        for (ti, (s, _)) in self.dirs.iter().enumerate() {
            let d = job.map(|j| s.join(j)).unwrap_or_else(|| s.clone());
            for e in fs::read_dir(d).into_iter().flatten().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                let ino = match job {
                    None => view_ino(Some(&n)),
                    Some(_) if rank_target(&n, self.dirs.len()) as usize == ti => {
                        use std::os::unix::fs::DirEntryExt;
                        local_ino(ti as u32, e.ino())
                    }
                    Some(_) => continue,
                };
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    names.insert((n, ino));
                }
            }
        }
        let dots = [(".".to_string(), view_ino(job)), ("..".to_string(), view_ino(None))];
        dots.into_iter()
            .chain(names)
            .enumerate()
            .skip(cookie as usize)
            .map(|(i, (name, ino))| DirEntry { name, ino, kind: Kind::Dir, next: i as u64 + 1 })
            .collect()
    }
}

mod ops;

#[cfg(test)]
mod tests;
