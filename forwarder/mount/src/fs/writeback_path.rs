//! The write-back path of a create in a node-local rank directory (`writeback.rs` holds the
//! table and the sender threads): answering the kernel here, sending the daemon's creates and
//! the releases that follow them in pipelined batches, and recording the daemon's answer.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::ReplyCreate;
use pharos_fwd_proto::{errno, Attr, Body, Ctx, Kind, Op, Time};

use super::attr::fattr;
use super::writeback::{CreateJob, Outcome, PendingCreate, Task};
use super::{Grant, Open, PharosFs, Shared};

impl PharosFs {
    /// The attributes of directory `parent` when a create of `name` at `path` may be answered
    /// by the mount (`writeback.rs`): write-back on, a node-local rank directory or (with
    /// `--answer-absent-names`) a directory this mount holds, whose names it knows whole
    /// (`name` is absent, and not longer than a name may be) and whose attributes it holds
    /// (the kernel's permission check; no setgid bit, so the file's group is the caller's).
    /// Call it, and queue the create, under a read guard of [`Shared::wb_gate`].
    pub(super) fn writeback_parent(&self, parent: u64, name: &str, path: &str) -> Option<Attr> {
        if !self.sh.may_answer_at(path)
            || name.len() > super::NAME_MAX
            || !self.sh.complete.knows_absent(parent, name)
            || self.sh.wb.pending_at(path)
        {
            return None;
        }
        self.sh.dir_attrs.peek(parent).filter(|d| d.perm & libc::S_ISGID == 0)
    }

    /// Answers a create at `path` (`at`: the directory's inode, its attributes, the name) here:
    /// an inode number of the mount's, the attributes the daemon would give, an open handle
    /// whose capability comes with the daemon's answer; the daemon's create is queued (`how`:
    /// mode with the umask applied, open flags, token). Blocks while the write-back table is
    /// full (back-pressure).
    pub(super) fn create_here(
        &self,
        ctx: Ctx,
        at: (u64, Attr, String),
        path: String,
        how: (u32, i32, u64),
        reply: ReplyCreate,
    ) {
        let ((parent, dir, name), (mode, flags, token)) = (at, how);
        let now = now();
        let sh = &self.sh;
        let ino = sh.wb.new_ino();
        let attr = Attr {
            ino,
            kind: Kind::File,
            perm: mode,
            nlink: 1,
            uid: ctx.uid,
            gid: ctx.gid,
            size: 0,
            blocks: 0,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
        };
        // The directory as the kernel will ask for it next (its permission check): changed now.
        sh.dir_attrs.put(parent, Attr { mtime: now, ctime: now, ..dir }, sh.ttl);
        sh.complete.added(parent, &name);
        sh.learn(ino, &path);
        let pc = PendingCreate::new();
        let open = Open::granted(attr.clone(), ino, Grant::Pending(pc.clone()), &ctx);
        let job = CreateJob { ctx, path, mode, flags, token, ino, parent, name, pc };
        sh.wb.submit(job);
        let fh = sh.next_fh.fetch_add(1, Relaxed);
        sh.files.lock().unwrap().insert(fh, Arc::new(open));
        reply.created(&sh.ttl, &fattr(&attr, ino), 0, fh, sh.open_flags)
    }
}

impl PharosFs {
    /// Answers the unlink of `name` (`path`) in directory `parent` here when the mount may
    /// (`writeback.rs`): write-back on, a node-local rank directory or (with
    /// `--answer-absent-names`) a directory this mount holds, whose names it knows (`name` is
    /// one) and whose attributes it holds, no create or unlink of `name` pending. The kernel
    /// checked the permissions (`default_permissions`: the directory's write and search bits,
    /// its sticky bit against the file's owner). The daemon's unlink follows in a batch.
    /// Call it under a read guard of [`Shared::wb_gate`]. Whether it answered.
    pub(super) fn unlink_here(&self, ctx: &Ctx, parent: u64, name: &str, path: &str) -> bool {
        let sh = &self.sh;
        if !sh.may_answer_at(path) || !sh.complete.knows_present(parent, name) || sh.wb.pending_at(path) {
            return false;
        }
        let Some(dir) = sh.dir_attrs.peek(parent) else { return false };
        let now = now();
        sh.dir_attrs.put(parent, Attr { mtime: now, ctime: now, ..dir }, sh.ttl);
        sh.complete.removed(parent, name);
        sh.mark_stale(path, None);
        sh.wb.submit_unlink(ctx.clone(), path.to_string(), parent);
        true
    }
}

/// The mount's clock as the daemon's time of a change it answered itself.
fn now() -> Time {
    let now = SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Time { sec: now.as_secs() as i64, nsec: now.subsec_nanos() }
}

impl Shared {
    /// Whether a name operation at `path` may be answered by the mount (write-back on; a
    /// node-local rank directory, or with `--answer-absent-names` a directory it holds: the
    /// caller checks that the directory is known whole).
    fn may_answer_at(&self, path: &str) -> bool {
        (super::node_local(path) || self.answer_absent) && self.wb.enabled()
    }

    /// Waits until the write-back creates at `path` or below it are done.
    pub(super) fn wait_name(&self, path: &str) {
        self.wb.wait_under(path);
    }

    /// Sends a batch of write-back tasks (an executor thread of `writeback.rs`, its own
    /// connections `c`): the creates pipelined (a create whose file was closed already, with
    /// its release, in one request), then the releases (those queued, and those of files
    /// closed while their create was in flight). A refused create is the file's errno
    /// from then on, and the name is no longer known in its directory.
    pub(super) fn send_batch(&self, c: &mut crate::rpc::Conns, batch: Vec<Task>) {
        let mut creates = Vec::new();
        let mut releases = Vec::new();
        let mut unlinks = Vec::new();
        for t in batch {
            match t {
                Task::Create(j) => creates.push(j),
                Task::Release(ctx, path, cap) => releases.push((ctx, Op::Release { path, cap })),
                Task::Unlink(ctx, path, parent) => unlinks.push((ctx, path, parent)),
            }
        }
        if !creates.is_empty() {
            let reqs = creates
                .iter()
                .map(|j| {
                    let (path, mode, flags, token) = (j.path.clone(), j.mode, j.flags, j.token);
                    // Closed already (the usual case of a create-heavy job): one request, whose
                    // open and close the daemon records in the creator's context.
                    let op = match j.pc.take_release() {
                        Some(_) => Op::CreateReleased { path, mode, flags, token },
                        None => Op::Create { path, mode, flags, token },
                    };
                    (j.ctx.clone(), op)
                })
                .collect();
            for (job, reply) in creates.into_iter().zip(self.rpc.call_many(c, reqs)) {
                if let Some(r) = self.created(job, reply) {
                    releases.push(r);
                }
            }
        }
        if !unlinks.is_empty() {
            // Names distinct from the creates' above (a create or unlink of a name with one
            // pending is not answered here): after them, in any order.
            let reqs = unlinks.iter().map(|(ctx, path, _)| (ctx.clone(), Op::Unlink { path: path.clone() })).collect();
            for ((_, path, parent), reply) in unlinks.iter().zip(self.rpc.call_many(c, reqs)) {
                let made = match reply {
                    Ok(Body::Removed { parent: pa }) => {
                        self.dir_attrs.put(*parent, pa, self.ttl);
                        Ok(())
                    }
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                };
                if !self.wb.unlinked(path, *parent, made) {
                    // The name is still there: this mount no longer answers for its directory.
                    self.complete.drop_dir(*parent);
                    self.dir_attrs.drop_ino(*parent);
                }
            }
        }
        if !releases.is_empty() {
            // close(2) does not report release errors; the daemon counts failures.
            let _ = self.rpc.call_many(c, releases);
        }
    }

    /// The daemon's `reply` to write-back create `job`: recorded; the file's release to send
    /// now, if its close came meanwhile.
    fn created(&self, job: CreateJob, reply: Result<Body, i32>) -> Option<(Ctx, Op)> {
        let outcome = match reply {
            Ok(Body::Created { attr, cap, parent }) => {
                self.dir_attrs.put(job.parent, parent, self.ttl);
                Ok((attr, cap))
            }
            Ok(Body::Opened { attr, cap }) => Ok((attr, cap)),
            Ok(_) => Err(errno::EIO),
            Err(e) => Err(e),
        };
        let outcome = match outcome {
            Ok((attr, cap)) => {
                self.wb.complete(&job, Ok(attr.ino));
                Outcome::Made(cap)
            }
            Err(e) => {
                self.complete.removed(job.parent, &job.name);
                self.dir_attrs.drop_ino(job.parent);
                self.wb.complete(&job, Err(e));
                Outcome::Failed(e)
            }
        };
        match (job.pc.finish(outcome.clone()), outcome) {
            (Some(r), Outcome::Made(cap)) => Some((r.ctx, Op::Release { path: r.path, cap })),
            _ => None,
        }
    }
}
