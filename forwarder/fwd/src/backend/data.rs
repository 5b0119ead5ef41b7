//! The data path ([`DataPath`]): the objects of a file on the targets (open object files
//! cached per daemon), read, write, fsync and truncate through the file's layout, and before
//! each piece of I/O the target's token bucket, added latency and slowdown (shared state,
//! [`crate::shm`], applied by [`super::Target`]). Reads go through the page cache ([`super::cache`])
//! and writes through Gather-Arrange-Scatter ([`super::gas`]) when those are on.
//!
//! The data path owns the open object files and the write counters; its methods take the
//! [`Backend`] it is part of for the targets, the component placement ([`super::Placer`]),
//! the open markers a progressive write counts in ([`super::Opens`]), the cache and GAS.
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pharos_fwd_proto::{errno, Layout, OpenHandle, Time};

use super::gas::Reason;
use super::layout::{logical_from_component, logical_from_obj, obj_size, pieces};
use super::{eno, t, werr, Backend, Res};

/// How long one piece of a data request spent where (for records and metrics).
#[derive(Default, Debug, Clone)]
pub struct IoInfo {
    /// Index of the first target touched, if any.
    pub target: Option<u32>,
    pub oid: u64,
    pub throttled: Duration,
    /// The release's part of a create-and-release request's service
    /// ([`pharos_fwd_proto::Op::CreateReleased`]): recorded as a close of its own.
    pub release: Option<Duration>,
}

const FD_CACHE_MAX: usize = 4096;

/// An object: (target, oid, stripe or component).
type ObjKey = (u32, u64, u64);

/// Bytes `[off, off+len)` of one object file (see [`Backend::read_span`]).
pub struct FileSpan {
    pub file: Arc<File>,
    pub off: u64,
    pub len: usize,
    pub target: u32,
}

/// The data path of a backend: its open object files and write counters.
#[derive(Default)]
pub struct DataPath {
    /// Open object files by (target, oid, stripe or component), with the object moves counter
    /// of the oid when opened ([`Backend::moves`]): a moved file's objects are opened again.
    fds: Mutex<HashMap<ObjKey, (Arc<File>, u64)>>,
    /// Client writes received ([`DataPath::write_from`] calls).
    pub client_writes: AtomicU64,
    /// Write requests issued to the targets (one `pwrite` of an object per piece).
    pub data_writes: AtomicU64,
}

/// Before a read of `[off, off + len)` of `oid` (see [`super::gas::Gas::settle_read`]): the
/// size the file has at least counting its writes still gathered (0 without GAS).
fn settle_read(b: &Backend, oid: u64, off: u64, len: u64) -> u64 {
    match b.gas.get() {
        Some(g) => g.settle_read(b, oid, off, off.saturating_add(len)),
        None => 0,
    }
}

/// The data of `oid` changed through this daemon and is on the targets (`range`: a write of
/// `[off, off+len)`; `None`: a truncate or removal): the site's shared data generation moves on,
/// so every daemon's page cache drops what it holds of the file, and this one's cache drops the
/// pages the change touched ([`super::cache::DataGens`]).
fn changed(b: &Backend, oid: u64, range: Option<(u64, u64)>) {
    match b.cache.get() {
        Some(c) => c.changed(oid, range, &b.gens),
        None => {
            b.gens.bump(oid);
        }
    }
}

/// Before a stat or truncate of `oid`: its gathered writes go to the targets.
fn settle(b: &Backend, oid: u64, why: Reason) {
    if let Some(g) = b.gas.get() {
        let _ = g.settle(b, oid, why, false);
    }
}

impl DataPath {
    /// The open object file `idx` of `oid` on target `ti`; `create` makes it when missing
    /// (objects are made by their first write or extending truncate, not at create), else a
    /// missing object is ENOENT.
    fn obj_fd(&self, b: &Backend, ti: u32, oid: u64, idx: u64, create: bool) -> Res<Arc<File>> {
        let key = (ti, oid, idx);
        let moves = b.moves.get(oid);
        if let Some((f, m)) = self.fds.lock().unwrap().get(&key) {
            if *m == moves {
                return Ok(f.clone());
            }
        }
        let f = Arc::new(b.targets[ti as usize].open_obj(oid, idx, create).map_err(werr)?);
        let mut m = self.fds.lock().unwrap();
        if m.len() >= FD_CACHE_MAX {
            m.clear();
        }
        m.insert(key, (f.clone(), moves));
        Ok(f)
    }

    /// Like [`DataPath::obj_fd`] without create, but a missing object is `None`.
    fn existing_obj(&self, b: &Backend, ti: u32, oid: u64, idx: u64) -> Res<Option<Arc<File>>> {
        match self.obj_fd(b, ti, oid, idx, false) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.errno == errno::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The object `idx` of `l` on target `ti` for a write through open `h`, made when missing
    /// (the first write of a stripe or component). A striped file's object is made only while
    /// an open of it is recorded (`h`'s marker, else any marker of the file: writes gathered
    /// by GAS carry no handle): a late write to a file unlinked and reaped meanwhile (an open
    /// the start-time GC dropped, a deferred write) must not bring its objects back; it gets
    /// ENOENT, as before objects were made lazily. A progressive file's components have that
    /// guard in their record directory.
    /// The target of object `obj` of `l` that a write of `len` bytes goes to (a progressive
    /// component is placed by its first write), counted in `info` and its gate taken, and the
    /// object's open file ([`DataPath::write_obj`]).
    fn piece_obj(
        &self,
        b: &Backend,
        l: &Layout,
        h: OpenHandle,
        obj: u64,
        len: u64,
        info: &mut IoInfo,
    ) -> Res<(u32, Arc<File>)> {
        let ti = if l.is_progressive() {
            b.placement.enter(&b.targets, &b.opens, l, h, obj)?
        } else {
            l.targets[obj as usize]
        };
        info.target.get_or_insert(ti);
        info.throttled += b.targets[ti as usize].gate(len);
        Ok((ti, self.write_obj(b, ti, l, h, obj)?))
    }

    fn write_obj(&self, b: &Backend, ti: u32, l: &Layout, h: OpenHandle, idx: u64) -> Res<Arc<File>> {
        if l.is_progressive() {
            return self.obj_fd(b, ti, l.oid, idx, true);
        }
        if let Some(f) = self.existing_obj(b, ti, l.oid, idx)? {
            return Ok(f);
        }
        // A node-local file's opens have no marker (`backend/nodelocal.rs`).
        let open = super::layout::is_local_oid(l.oid)
            || (h != OpenHandle::default() && b.opens.has_open(l.oid, h))
            || b.opens.has_markers(l.oid);
        if !open {
            return Err(eno(errno::ENOENT, "no such open: its file may be gone"));
        }
        self.obj_fd(b, ti, l.oid, idx, true)
    }

    /// Forgets the open file of object `idx` of `oid` on target `ti` (a migration removed it;
    /// another object may take its name later).
    pub(super) fn forget_obj(&self, ti: u32, oid: u64, idx: u64) {
        self.fds.lock().unwrap().remove(&(ti, oid, idx));
    }

    /// Logical size, blocks, newest mtime and newest ctime of a file's objects.
    pub(super) fn data_stat(&self, b: &Backend, l: &Layout) -> Res<(u64, u64, Time, Time)> {
        b.check_layout(l)?;
        settle(b, l.oid, Reason::Read);
        self.data_stat_now(b, l)
    }

    /// Like [`DataPath::data_stat`] of the objects as they are (gathered writes not flushed).
    fn data_stat_now(&self, b: &Backend, l: &Layout) -> Res<(u64, u64, Time, Time)> {
        let (mut size, mut blocks, mut mt, mut ct) = (0u64, 0u64, t(0, 0), t(0, 0));
        for (idx, ti) in b.placement.objects(&b.targets, l)? {
            let Some(f) = self.existing_obj(b, ti, l.oid, idx)? else { continue };
            let md = f.metadata().map_err(werr)?;
            let end = if l.is_progressive() {
                logical_from_component(l.component_size, idx, md.size())
            } else {
                logical_from_obj(l, idx as u32, md.size())
            };
            size = size.max(end);
            blocks += md.blocks();
            mt = mt.max(t(md.mtime(), md.mtime_nsec()));
            ct = ct.max(t(md.ctime(), md.ctime_nsec()));
        }
        Ok((size, blocks, mt, ct))
    }

    /// Deletes the objects of `l` (and the component records of a progressive layout).
    pub(super) fn remove_objects(&self, b: &Backend, l: &Layout) {
        let objs = b.placement.objects(&b.targets, l).unwrap_or_else(|e| {
            log::warn!("objects of {:016x}: {}", l.oid, e.msg);
            Vec::new()
        });
        let mut fds = self.fds.lock().unwrap();
        for &(idx, ti) in &objs {
            fds.remove(&(ti, l.oid, idx));
        }
        drop(fds);
        for (idx, ti) in objs {
            let _ = b.targets[ti as usize].remove_obj(l.oid, idx);
        }
        changed(b, l.oid, None);
        if l.is_progressive() {
            b.placement.forget(l.oid);
        }
    }

    pub(super) fn truncate(&self, b: &Backend, l: &Layout, size: u64) -> Res<()> {
        settle(b, l.oid, Reason::Read);
        let r = self.truncate_objects(b, l, size);
        changed(b, l.oid, None);
        r
    }

    fn truncate_objects(&self, b: &Backend, l: &Layout, size: u64) -> Res<()> {
        if !l.is_progressive() {
            for (s, ti) in b.placement.objects(&b.targets, l)? {
                // A stripe left empty needs no object; one reaching into the size is made.
                let n = obj_size(l, size, s as u32);
                let f =
                    if n > 0 { Some(self.obj_fd(b, ti, l.oid, s, true)?) } else { self.existing_obj(b, ti, l.oid, s)? };
                if let Some(f) = f {
                    f.set_len(n).map_err(werr)?;
                }
            }
            return Ok(());
        }
        // The component holding the last byte gets exactly the bytes up to the size (placed
        // now if needed, so that the size reads back); the ones after it are emptied. Their
        // records stay: components keep their targets while the file exists.
        let last = size.checked_sub(1).map(|b| b / l.component_size);
        if let Some(k) = last {
            self.obj_fd(b, b.placement.placed(&b.targets, l, k)?, l.oid, k, true)?
                .set_len(size - k * l.component_size)
                .map_err(werr)?;
        }
        for (k, ti) in b.placement.objects(&b.targets, l)? {
            if last.is_none_or(|last| k > last) {
                if let Some(f) = self.existing_obj(b, ti, l.oid, k)? {
                    f.set_len(0).map_err(werr)?;
                }
            }
        }
        Ok(())
    }

    /// A read of a single-target file served straight from its object (the caller sends
    /// the bytes with `sendfile(2)`, no copy through user space): the object's fd, offset
    /// and the byte count, clamped to the object's size now. Token bucket and injected
    /// latency are applied here; the caller applies [`super::Target::stretch`] after sending.
    /// `None` for striped and progressive layouts (holes and pieces: use
    /// [`DataPath::read_into`]).
    pub fn read_span(&self, b: &Backend, l: &Layout, off: u64, size: u32, info: &mut IoInfo) -> Res<Option<FileSpan>> {
        b.check_layout(l)?;
        if l.targets.len() != 1 || l.is_progressive() || b.cache.get().is_some() {
            return Ok(None);
        }
        let floor = settle_read(b, l.oid, off, size as u64);
        info.oid = l.oid;
        let ti = l.targets[0];
        info.target.get_or_insert(ti);
        // Never written: no object, the read_into path answers (a hole up to `floor`).
        let Some(file) = self.existing_obj(b, ti, l.oid, 0)? else { return Ok(None) };
        let osize = file.metadata().map_err(werr)?.len();
        let len = (size as u64).min(osize.saturating_sub(off));
        if len < size as u64 && floor > osize {
            return Ok(None); // gathered writes past the object's end: a hole, read_into pads it
        }
        if len > 0 {
            info.throttled += b.targets[ti as usize].gate(len);
        }
        Ok(Some(FileSpan { file, off, len: len as usize, target: ti }))
    }

    pub fn read(&self, b: &Backend, l: &Layout, off: u64, size: u32, info: &mut IoInfo) -> Res<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_into(b, l, off, size, info, &mut buf)?;
        Ok(buf)
    }

    /// Reads into `buf` (resized to the bytes read; a reused buffer is not zeroed again),
    /// through the page cache when one is enabled.
    pub fn read_into(
        &self,
        b: &Backend,
        l: &Layout,
        off: u64,
        size: u32,
        info: &mut IoInfo,
        buf: &mut Vec<u8>,
    ) -> Res<()> {
        match b.cache.get() {
            Some(c) if size > 0 => {
                settle(b, l.oid, Reason::Read);
                c.read_through(b, l, off, size, info, buf)
            }
            _ => {
                let floor = settle_read(b, l.oid, off, size as u64);
                if buf.len() < size as usize {
                    buf.resize(size as usize, 0);
                }
                let n = self.read_slice_direct(b, l, off, info, &mut buf[..size as usize], floor)?;
                buf.truncate(n);
                Ok(())
            }
        }
    }

    /// Reads from the targets (no cache) into `buf`, resized to the bytes read.
    pub(super) fn read_direct(
        &self,
        b: &Backend,
        l: &Layout,
        off: u64,
        size: u32,
        info: &mut IoInfo,
        buf: &mut Vec<u8>,
    ) -> Res<()> {
        if buf.len() < size as usize {
            buf.resize(size as usize, 0);
        }
        let n = self.read_slice_direct(b, l, off, info, &mut buf[..size as usize], 0)?;
        buf.truncate(n);
        Ok(())
    }

    /// Reads up to `buf.len()` bytes at `off` into `buf` (e.g. a shared-memory slot, issue 12
    /// item 1), after the file's gathered writes and through the page cache when one is enabled;
    /// returns how many bytes the file has there (fewer at its end).
    pub fn read_into_slice(&self, b: &Backend, l: &Layout, off: u64, info: &mut IoInfo, buf: &mut [u8]) -> Res<usize> {
        match b.cache.get() {
            Some(c) if !buf.is_empty() => {
                settle(b, l.oid, Reason::Read);
                let mut v = Vec::new();
                c.read_through(b, l, off, buf.len() as u32, info, &mut v)?;
                let n = v.len().min(buf.len());
                buf[..n].copy_from_slice(&v[..n]);
                Ok(n)
            }
            _ => {
                let floor = settle_read(b, l.oid, off, buf.len() as u64);
                self.read_slice_direct(b, l, off, info, buf, floor)
            }
        }
    }

    /// Reads up to `buf.len()` bytes at `off` from the targets (no cache; the gathered writes
    /// overlapping the range were flushed by the caller). `floor`: the size the file has at
    /// least (its gathered writes elsewhere, [`super::gas::Gas::settle_read`]; 0 without):
    /// the bytes between the objects' end and it read as zeros.
    fn read_slice_direct(
        &self,
        b: &Backend,
        l: &Layout,
        off: u64,
        info: &mut IoInfo,
        buf: &mut [u8],
        floor: u64,
    ) -> Res<usize> {
        b.check_layout(l)?;
        info.oid = l.oid;
        let single = l.targets.len() == 1 && !l.is_progressive();
        let mut len = buf.len() as u64;
        if l.targets.len() > 1 && !l.is_progressive() {
            let (fsize, ..) = self.data_stat_now(b, l)?;
            len = len.min(fsize.max(floor).saturating_sub(off));
        }
        if !single {
            // Holes inside the size read as zeros: a reused buffer must not show old bytes.
            buf[..len as usize].fill(0);
        }
        let mut got_end = 0u64;
        // Progressive: a missing or short component is a hole or the end of the file; the
        // size (one stat per component) is looked at only then.
        let mut short = false;
        for pc in pieces(l, off, len) {
            let (ti, f) = if l.is_progressive() {
                let found = match b.placement.component(&b.targets, l, pc.obj, false)? {
                    Some(ti) => self.existing_obj(b, ti, l.oid, pc.obj)?.map(|f| (ti, f)),
                    None => None,
                };
                let Some(found) = found else {
                    short = true;
                    continue;
                };
                found
            } else {
                let ti = l.targets[pc.obj as usize];
                match self.existing_obj(b, ti, l.oid, pc.obj)? {
                    Some(f) => (ti, f),
                    // A stripe never written: a hole (zeros inside the size), or the end of a
                    // single-object file.
                    None if single => break,
                    None => {
                        got_end = pc.buf_off + pc.len;
                        continue;
                    }
                }
            };
            info.target.get_or_insert(ti);
            info.throttled += b.targets[ti as usize].gate(pc.len);
            let t0 = Instant::now();
            let dst = &mut buf[pc.buf_off as usize..(pc.buf_off + pc.len) as usize];
            let mut n = 0usize;
            while n < dst.len() {
                match f.read_at(&mut dst[n..], pc.obj_off + n as u64) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(werr(e)),
                }
            }
            b.targets[ti as usize].stretch(t0.elapsed());
            if single {
                // Single object: a short read is the end of the file.
                got_end = pc.buf_off + n as u64;
                if n < pc.len as usize {
                    break;
                }
            } else {
                short |= n < pc.len as usize;
                got_end = pc.buf_off + pc.len; // holes inside the size read as zeros
            }
        }
        if l.is_progressive() {
            got_end = if short { len.min(self.data_stat_now(b, l)?.0.max(floor).saturating_sub(off)) } else { len };
        }
        // A single object ending before `floor`: the rest up to it is a hole.
        let pad_end = len.min(floor.saturating_sub(off));
        if single && got_end < pad_end {
            buf[got_end as usize..pad_end as usize].fill(0);
            got_end = pad_end;
        }
        Ok(got_end as usize)
    }

    /// Writes `data` at `off` through open `h` (the default handle = none: progressive
    /// components are then placed but the write is not counted on their targets).
    pub fn write(&self, b: &Backend, l: &Layout, h: OpenHandle, off: u64, data: &[u8], info: &mut IoInfo) -> Res<u32> {
        self.write_from(b, "", l, h, off, data, info)
    }

    /// A client write from compute node `node`: gathered into the node's buffer when
    /// Gather-Arrange-Scatter is on ([`super::gas`]), else written through.
    #[allow(clippy::too_many_arguments)] // the backend and a write's own arguments
    pub fn write_from(
        &self,
        b: &Backend,
        node: &str,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        data: &[u8],
        info: &mut IoInfo,
    ) -> Res<u32> {
        self.begin_write(b, l, off, data.len(), info)?;
        if let Some(g) = b.gas.get() {
            info.target = b.placement.first_target(&b.targets, l, off);
            return g.gather(b, node, l, h, off, g.copy_of(data));
        }
        self.write_through(b, l, h, off, data, info)
    }

    /// [`DataPath::write_from`] of a buffer the caller owns (a socket write's): gathered, it
    /// moves into the node's buffer instead of being copied, and `data` gets a pooled empty
    /// buffer in exchange ([`super::gas::Gas::keep`]).
    #[allow(clippy::too_many_arguments)] // the backend and a write's own arguments
    pub fn write_owned(
        &self,
        b: &Backend,
        node: &str,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        data: &mut Vec<u8>,
        info: &mut IoInfo,
    ) -> Res<u32> {
        self.begin_write(b, l, off, data.len(), info)?;
        if let Some(g) = b.gas.get() {
            info.target = b.placement.first_target(&b.targets, l, off);
            return g.gather(b, node, l, h, off, g.keep(data));
        }
        self.write_through(b, l, h, off, data, info)
    }

    /// The checks and count every client write starts with.
    fn begin_write(&self, b: &Backend, l: &Layout, off: u64, len: usize, info: &mut IoInfo) -> Res<()> {
        b.check_layout(l)?;
        info.oid = l.oid;
        if off.checked_add(len as u64).is_none_or(|e| e > i64::MAX as u64) {
            return Err(eno(errno::EFBIG, "offset too large"));
        }
        self.client_writes.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Writes to the targets now.
    pub(super) fn write_through(
        &self,
        b: &Backend,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        data: &[u8],
        info: &mut IoInfo,
    ) -> Res<u32> {
        let r = self.write_pieces(b, l, h, off, data, info);
        // After the bytes are on the targets (or some of them, on an error): a read that
        // fetched the old bytes meanwhile sees the generation change and does not cache them.
        changed(b, l.oid, Some((off, data.len() as u64)));
        r
    }

    /// Like [`DataPath::write_through`] for bytes given as consecutive chunks (a gathered
    /// run, [`super::gas`]): one `pwritev(2)` per object piece, no copy to join them.
    pub(super) fn write_through_chunks(
        &self,
        b: &Backend,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        chunks: &[&[u8]],
        info: &mut IoInfo,
    ) -> Res<u32> {
        let len: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        let r = self.write_chunk_pieces(b, l, h, off, len, chunks, info);
        changed(b, l.oid, Some((off, len)));
        r.map(|()| len as u32)
    }

    fn write_pieces(
        &self,
        b: &Backend,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        data: &[u8],
        info: &mut IoInfo,
    ) -> Res<u32> {
        for pc in pieces(l, off, data.len() as u64) {
            let (ti, f) = self.piece_obj(b, l, h, pc.obj, pc.len, info)?;
            let t0 = Instant::now();
            self.data_writes.fetch_add(1, Relaxed);
            f.write_all_at(&data[pc.buf_off as usize..(pc.buf_off + pc.len) as usize], pc.obj_off).map_err(werr)?;
            b.targets[ti as usize].stretch(t0.elapsed());
        }
        Ok(data.len() as u32)
    }

    /// Flushes every object of the file (all stripes, or all written components).
    pub fn fsync(&self, b: &Backend, l: &Layout, datasync: bool, info: &mut IoInfo) -> Res<()> {
        b.check_layout(l)?;
        info.oid = l.oid;
        if let Some(g) = b.gas.get() {
            g.settle(b, l.oid, Reason::Fsync, true)?;
        }
        for (idx, ti) in b.placement.objects(&b.targets, l)? {
            // An object never written holds nothing to flush.
            let Some(f) = self.existing_obj(b, ti, l.oid, idx)? else { continue };
            info.target.get_or_insert(ti);
            if datasync { f.sync_data() } else { f.sync_all() }.map_err(werr)?;
        }
        Ok(())
    }
}

mod chunks;
#[cfg(test)]
mod tests;
