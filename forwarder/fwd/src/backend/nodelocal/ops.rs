//! The namespace operations on node-local names ([`Where`] other than `Shared`): the two views
//! answered by the daemon, everything in a rank directory by the store of its target, changes
//! only by the compute node the rank is attached to ([`NodeLocal::check_writer`]).
use pharos_fwd_proto::{errno, Attr, Ctx, DirEntry, Layout, OpenHandle, SetAttr};

use super::super::{eno, Backend, EntriesPlus, Res};
use super::{local_ino, NodeLocal, Where};

fn fix(ti: u32, mut a: Attr) -> Attr {
    a.ino = local_ino(ti, a.ino);
    a
}

fn not_here(what: &str) -> pharos_fwd_proto::WireError {
    eno(errno::EPERM, format!("{what}: only inside a rank directory of /.nodelocal/<job>"))
}

impl NodeLocal {
    /// The store and path of a rank-level name, after checking `ctx`'s compute node may change it.
    /// The rank directory itself is only made, removed or changed (`mkdir`, `rmdir`, `setattr`).
    fn writable<'a>(&self, w: Where<'a>, ctx: &Ctx) -> Res<(u32, &'a str)> {
        self.writable_as(w, ctx, false)
    }

    fn writable_as<'a>(&self, w: Where<'a>, ctx: &Ctx, rank_dir_op: bool) -> Res<(u32, &'a str)> {
        match w {
            Where::Rank { ti, job, rank, rel } => {
                let is_rank_dir = rel.matches('/').count() == 1;
                if is_rank_dir && !rank_dir_op {
                    return Err(not_here("a file or link"));
                }
                self.check_writer(job, rank, &ctx.compute_node)?;
                if is_rank_dir {
                    self.job_dir(ti, job)?; // the rank directory itself: its job's, first
                }
                Ok((ti, rel))
            }
            Where::Root | Where::Job(_) => Err(not_here("change")),
            Where::Shared => Err(eno(errno::EXDEV, "not node-local")),
        }
    }

    pub(in super::super) fn getattr(&self, b: &Backend, w: Where, ctx: &Ctx) -> Res<Attr> {
        match w {
            Where::Root => self.view_attr(None),
            Where::Job(j) => self.view_attr(Some(j)),
            Where::Rank { ti, rel, .. } => self.store(ti).getattr(b, rel, ctx).map(|a| fix(ti, a)),
            Where::Shared => unreachable!("routed"),
        }
    }

    pub(in super::super) fn readdir(&self, w: Where, cookie: u64, ctx: &Ctx) -> Res<(Vec<DirEntry>, bool)> {
        match w {
            Where::Root => Ok((self.view_entries(None, cookie), true)),
            Where::Job(j) => {
                self.view_attr(Some(j))?;
                Ok((self.view_entries(Some(j), cookie), true))
            }
            Where::Rank { ti, rel, .. } => {
                let (mut es, eof) = self.store(ti).readdir(rel, cookie, ctx)?;
                for e in &mut es {
                    e.ino = local_ino(ti, e.ino);
                }
                Ok((es, eof))
            }
            Where::Shared => unreachable!("routed"),
        }
    }

    pub(in super::super) fn readdir_plus(
        &self,
        b: &Backend,
        w: Where,
        cookie: u64,
        ctx: &Ctx,
    ) -> Res<(EntriesPlus, bool)> {
        match w {
            Where::Rank { ti, rel, .. } => {
                let (es, eof) = self.store(ti).readdir_plus(b, rel, cookie, ctx)?;
                let es = es
                    .into_iter()
                    .map(|(mut e, a)| {
                        e.ino = local_ino(ti, e.ino);
                        (e, a.map(|a| fix(ti, a)))
                    })
                    .collect();
                Ok((es, eof))
            }
            Where::Root | Where::Job(_) => {
                let (es, eof) = self.readdir(w, cookie, ctx)?;
                let job = if let Where::Job(j) = w { Some(j) } else { None };
                let es = es
                    .into_iter()
                    .map(|e| {
                        let a = match (e.name.as_str(), job) {
                            (".." | ".", _) => None,
                            (n, None) => self.view_attr(Some(n)).ok(),
                            (n, Some(j)) => {
                                let path = format!("{}/{j}/{n}", super::DIR);
                                super::route(&path, self.dirs.len()).ok().and_then(|w| self.getattr(b, w, ctx).ok())
                            }
                        };
                        (e, a)
                    })
                    .collect();
                Ok((es, eof))
            }
            Where::Shared => unreachable!("routed"),
        }
    }

    pub(in super::super) fn mkdir(&self, b: &Backend, w: Where, mode: u32, ctx: &Ctx) -> Res<Attr> {
        match w {
            Where::Root => Err(eno(errno::EEXIST, "/.nodelocal")),
            Where::Job(j) => self.make_job(j),
            _ => {
                let (ti, rel) = self.writable_as(w, ctx, true)?;
                self.store(ti).mkdir(b, rel, mode, ctx).map(|a| fix(ti, a))
            }
        }
    }

    pub(in super::super) fn rmdir(&self, w: Where, ctx: &Ctx) -> Res<()> {
        match w {
            Where::Root => Err(eno(errno::EBUSY, "/.nodelocal")),
            Where::Job(j) => self.remove_job(j),
            _ => {
                let (ti, rel) = self.writable_as(w, ctx, true)?;
                self.store(ti).rmdir(rel, ctx)
            }
        }
    }

    pub(in super::super) fn symlink(&self, b: &Backend, w: Where, target: &str, ctx: &Ctx) -> Res<Attr> {
        let (ti, rel) = self.writable(w, ctx)?;
        self.store(ti).symlink(b, rel, target, ctx).map(|a| fix(ti, a))
    }

    pub(in super::super) fn readlink(&self, w: Where, ctx: &Ctx) -> Res<String> {
        match w {
            Where::Rank { ti, rel, .. } => self.store(ti).readlink(rel, ctx),
            _ => Err(eno(errno::EINVAL, "not a symbolic link")),
        }
    }

    /// Both names in one rank directory (else `EXDEV`, as between file systems).
    fn same_rank<'a>(&self, a: Where<'a>, b: Where<'a>, ctx: &Ctx) -> Res<(u32, &'a str, &'a str)> {
        match (a, b) {
            (Where::Rank { job: j1, rank: r1, .. }, Where::Rank { job: j2, rank: r2, rel: to, .. })
                if j1 == j2 && r1 == r2 =>
            {
                let (ti, from) = self.writable(a, ctx)?;
                Ok((ti, from, to))
            }
            _ => Err(eno(errno::EXDEV, "across node-local rank directories")),
        }
    }

    pub(in super::super) fn link(&self, b: &Backend, from: Where, to: Where, ctx: &Ctx) -> Res<Attr> {
        let (ti, from, to) = self.same_rank(from, to, ctx)?;
        self.store(ti).link(b, from, to, ctx).map(|a| fix(ti, a))
    }

    pub(in super::super) fn rename(&self, b: &Backend, from: Where, to: Where, noreplace: bool, ctx: &Ctx) -> Res<()> {
        let (ti, from, to) = self.same_rank(from, to, ctx)?;
        self.store(ti).rename(b, from, to, noreplace, ctx)
    }

    pub(in super::super) fn mknod(&self, b: &Backend, w: Where, mode: u32, rdev: u64, ctx: &Ctx) -> Res<Attr> {
        let (ti, rel) = self.writable(w, ctx)?;
        self.store(ti).mknod(b, rel, mode, rdev, ctx).map(|a| fix(ti, a))
    }

    pub(in super::super) fn unlink(&self, b: &Backend, w: Where, ctx: &Ctx) -> Res<()> {
        let (ti, rel) = self.writable(w, ctx)?;
        self.store(ti).unlink(b, rel, ctx)
    }

    pub(in super::super) fn create(
        &self,
        b: &Backend,
        w: Where,
        mode: u32,
        flags: i32,
        token: u64,
        ctx: &Ctx,
    ) -> Res<(Attr, Layout, OpenHandle)> {
        let (ti, rel) = self.writable(w, ctx)?;
        let (a, l, h) = self.store(ti).create(b, rel, mode, flags, token, ctx)?;
        Ok((fix(ti, a), l, h))
    }

    /// Opens a node-local file; for writing (or truncating) only on its rank's compute node.
    pub(in super::super) fn open(
        &self,
        b: &Backend,
        w: Where,
        flags: i32,
        ctx: &Ctx,
    ) -> Res<(Attr, Layout, OpenHandle)> {
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let (ti, rel) = match w {
            Where::Rank { .. } if writes => self.writable(w, ctx)?,
            Where::Rank { ti, rel, .. } => (ti, rel),
            _ => return Err(eno(errno::EISDIR, "is a directory")),
        };
        let (a, l, h) = self.store(ti).open(b, rel, flags, ctx)?;
        Ok((fix(ti, a), l, h))
    }

    pub(in super::super) fn setattr(
        &self,
        b: &Backend,
        w: Where,
        set: &SetAttr,
        by_fd: Option<u64>,
        ctx: &Ctx,
    ) -> Res<Attr> {
        let (ti, rel) = self.writable_as(w, ctx, true)?;
        self.store(ti).setattr(b, rel, set, by_fd, ctx).map(|a| fix(ti, a))
    }

    pub(in super::super) fn kill_suidgid(
        &self,
        b: &Backend,
        w: Where,
        l: &Layout,
        h: OpenHandle,
        ctx: &Ctx,
    ) -> Res<()> {
        let (ti, rel) = self.writable(w, ctx)?;
        self.store(ti).kill_suidgid(b, rel, l, h, ctx)
    }
}
