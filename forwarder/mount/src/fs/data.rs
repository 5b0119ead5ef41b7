//! The data path of open files: read and write, through a slot of the shared-memory region
//! when one is free (the daemon reads into it or writes from it: `ReadShm`, `WriteShm`), else
//! through a pooled buffer carried as the frame's data segment. Either way the request
//! carries the open's capability, never a path the daemon would resolve.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use fuser::consts::FUSE_WRITE_KILL_PRIV;
use fuser::{ReplyData, ReplyWrite, Request};
use pharos_fwd_proto::{errno, Body, Ctx, Op};

use super::{Open, PharosFs, Shared};

/// What a read or write needs beyond its own arguments ([`PharosFs::data_args`]).
pub(super) struct DataArgs {
    /// The caller's context.
    ctx: Ctx,
    /// The open file.
    f: Arc<Open>,
    /// The file's path ("" once its last name is gone: the capability addresses the data).
    path: String,
    /// Byte offset in the file.
    offset: u64,
}

impl PharosFs {
    /// The caller's context, the open file `fh`, its path and `offset` in bytes, for a read or
    /// write of inode `ino`. Errors: `EBADF` when `fh` is not open, `EINVAL` for a negative
    /// offset.
    pub(super) fn data_args(&self, req: &Request<'_>, ino: u64, fh: u64, offset: i64) -> Result<DataArgs, i32> {
        let ctx = self.sh.ctx(req);
        let Some(f) = self.sh.files.lock().unwrap().get(&fh).cloned() else { return Err(errno::EBADF) };
        let path = self.sh.path(ino).unwrap_or_default();
        if offset < 0 {
            return Err(errno::EINVAL);
        }
        Ok(DataArgs { ctx, f, path, offset: offset as u64 })
    }

    /// FUSE read of `size` bytes at `a.offset`, answered with the bytes read (fewer at the end
    /// of the file) or an errno (the daemon's, `EIO` for an unexpected reply).
    pub(super) fn read_data(&self, a: DataArgs, size: u32, reply: ReplyData) {
        let DataArgs { ctx, f, path, offset } = a;
        self.spawn(move |sh, c| {
            let cap = match f.cap() {
                Ok(cap) => cap, // (a write-back create: once the daemon made the file)
                Err(e) => return reply.error(e),
            };
            let slot = sh.rpc.shm.as_ref().and_then(|s| s.get(size as usize)).map(|s| (s, size));
            let op = Op::Read { path, cap, offset, size };
            match sh.rpc.call_slot(c, &ctx, op, slot) {
                Ok(Body::Data { data }) => {
                    reply.data(&data);
                    sh.rpc.bufs.put(data);
                }
                Ok(Body::ShmData { len }) if slot.is_some() && len <= size => {
                    // SAFETY: the slot is ours until put back; the daemon is done with it.
                    let slots = sh.rpc.shm.as_ref().unwrap();
                    reply.data(unsafe { slots.bytes(slot.unwrap().0, len as usize) });
                }
                Ok(_) => reply.error(errno::EIO),
                Err(e) => reply.error(e),
            }
            put_slot(sh, slot);
        });
    }

    /// FUSE write of `data` at `a.offset`, answered with the bytes written or an errno (the
    /// daemon's, `EIO` for an unexpected reply). `wflags` with `FUSE_WRITE_KILL_PRIV` (a
    /// writer without `CAP_FSETID`) clears the file's setuid/setgid bits first, once per open.
    pub(super) fn write_data(&self, a: DataArgs, data: &[u8], wflags: u32, reply: ReplyWrite) {
        let DataArgs { ctx, f, path, offset } = a;
        // One copy out of the session's buffer: into a slot of the shared-memory region (the
        // daemon writes the objects from there), else into a pooled buffer (no allocation).
        let slot = self.sh.rpc.shm.as_ref().and_then(|s| s.get(data.len())).map(|s| (s, data.len() as u32));
        let data = match (slot, &self.sh.rpc.shm) {
            (Some((s, len)), Some(slots)) => {
                // SAFETY: the slot was just taken from the free list: only this request has it.
                unsafe { slots.bytes(s, len as usize) }.copy_from_slice(data);
                Vec::new()
            }
            _ => {
                let mut buf = self.sh.rpc.bufs.take();
                buf.clear();
                buf.extend_from_slice(data);
                buf
            }
        };
        // A writer without CAP_FSETID clears setuid/setgid (Linux's file_remove_privs): the
        // daemon does it once per open, before the first such write, if the file had them.
        let kill = wflags & FUSE_WRITE_KILL_PRIV != 0 && f.suidgid.swap(false, Relaxed);
        self.spawn(move |sh, c| {
            let cap = match f.cap() {
                Ok(cap) => cap, // (a write-back create: once the daemon made the file)
                Err(e) => {
                    if slot.is_none() {
                        sh.rpc.bufs.put(data);
                    }
                    put_slot(sh, slot);
                    return reply.error(e);
                }
            };
            if kill {
                let op = Op::KillSuidgid { path: path.clone(), cap: cap.clone() };
                if let Err(e) = sh.rpc.call(c, &ctx, op) {
                    log::warn!("clearing setuid/setgid of {path:?} before a write: errno {e}");
                }
            }
            let op = Op::Write { path, cap, offset, data };
            match sh.rpc.call_slot(c, &ctx, op, slot) {
                Ok(Body::Written(n)) => reply.written(n),
                Ok(_) => reply.error(errno::EIO),
                Err(e) => reply.error(e),
            }
            put_slot(sh, slot);
        });
    }
}

/// Gives the request's shared-memory slot (index, bytes), if it had one, back to the region's
/// free list once the daemon is done with it.
fn put_slot(sh: &Shared, slot: Option<(u32, u32)>) {
    if let (Some((s, _)), Some(slots)) = (slot, &sh.rpc.shm) {
        slots.put(s);
    }
}
