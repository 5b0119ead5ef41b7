//! The data path: the objects of a file on the targets (open object files cached per
//! daemon), read, write, fsync and truncate through the file's layout, and before each
//! piece of I/O the target's token bucket, added latency and slowdown (shared state,
//! [`crate::shm`]).
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
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
}

const FD_CACHE_MAX: usize = 4096;

/// Shortest sleep of the injected slowdown; smaller stretches accumulate per thread.
pub const STRETCH_MIN_SLEEP: Duration = Duration::from_millis(1);

thread_local! {
    /// Slowdown owed by this worker thread, ns (negative: an overshoot credited).
    static STRETCH_DEBT_NS: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// Bytes `[off, off+len)` of one object file (see [`Backend::read_span`]).
pub struct FileSpan {
    pub file: Arc<File>,
    pub off: u64,
    pub len: usize,
    pub target: u32,
}

impl Backend {
    /// Object `idx` (stripe or component) of `oid` on target `ti`.
    pub(super) fn obj_path(&self, ti: u32, oid: u64, idx: u64) -> PathBuf {
        self.targets[ti as usize].dir.join(format!("{oid:016x}.{idx}"))
    }

    /// The open object file `idx` of `oid` on target `ti`; `create` makes it when missing
    /// (components are made by their first write), else a missing object is ENOENT.
    fn obj_fd(&self, ti: u32, oid: u64, idx: u64, create: bool) -> Res<Arc<File>> {
        let key = (ti, oid, idx);
        if let Some(f) = self.fds.lock().unwrap().get(&key) {
            return Ok(f.clone());
        }
        let f = OpenOptions::new().read(true).write(true).create(create).mode(0o600).open(self.obj_path(ti, oid, idx));
        let f = Arc::new(f.map_err(werr)?);
        let mut m = self.fds.lock().unwrap();
        if m.len() >= FD_CACHE_MAX {
            m.clear();
        }
        m.insert(key, f.clone());
        Ok(f)
    }

    /// Like [`Backend::obj_fd`] without create, but a missing object is `None`.
    fn existing_obj(&self, ti: u32, oid: u64, idx: u64) -> Res<Option<Arc<File>>> {
        match self.obj_fd(ti, oid, idx, false) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.errno == errno::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn comp_dir(&self, oid: u64) -> PathBuf {
        self.comp_dir.join(format!("{oid:016x}"))
    }

    /// The data objects a layout may have, as (object index, target): every stripe of a
    /// classic layout; the recorded components of a progressive one (whose objects may
    /// still be missing).
    pub(super) fn objects(&self, l: &Layout) -> Res<Vec<(u64, u32)>> {
        if !l.is_progressive() {
            return Ok(l.targets.iter().enumerate().map(|(s, &t)| (s as u64, t)).collect());
        }
        let it = match fs::read_dir(self.comp_dir(l.oid)) {
            Ok(it) => it,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(werr(e)),
        };
        let mut out = Vec::new();
        for e in it {
            let Some(k) = e.map_err(werr)?.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else { continue };
            if let Some(t) = self.component(l, k, false)? {
                out.push((k, t));
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Target of the first byte of `l`, as far as known without I/O (records, metrics).
    pub fn first_target(&self, l: &Layout, off: u64) -> Option<u32> {
        self.check_layout(l).ok()?;
        let pc = pieces(l, off, 1).pop()?;
        if l.is_progressive() {
            self.comps.lock().unwrap().get(&(l.oid, pc.obj)).copied()
        } else {
            l.targets.get(pc.obj as usize).copied()
        }
    }

    /// Logical size, blocks, newest mtime and newest ctime of a file's objects.
    pub(super) fn data_stat(&self, l: &Layout) -> Res<(u64, u64, Time, Time)> {
        self.check_layout(l)?;
        self.gas_settle(l.oid, Reason::Read);
        self.data_stat_now(l)
    }

    /// Like [`Backend::data_stat`] of the objects as they are (gathered writes not flushed).
    fn data_stat_now(&self, l: &Layout) -> Res<(u64, u64, Time, Time)> {
        let (mut size, mut blocks, mut mt, mut ct) = (0u64, 0u64, t(0, 0), t(0, 0));
        for (idx, ti) in self.objects(l)? {
            let Some(f) = self.existing_obj(ti, l.oid, idx)? else { continue };
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
    pub(super) fn remove_objects(&self, l: &Layout) {
        let objs = self.objects(l).unwrap_or_else(|e| {
            log::warn!("objects of {:016x}: {}", l.oid, e.msg);
            Vec::new()
        });
        if let Some(c) = self.cache.get() {
            c.invalidate_file(l.oid);
        }
        let mut fds = self.fds.lock().unwrap();
        for &(idx, ti) in &objs {
            fds.remove(&(ti, l.oid, idx));
        }
        drop(fds);
        for (idx, ti) in objs {
            let _ = fs::remove_file(self.obj_path(ti, l.oid, idx));
        }
        if l.is_progressive() {
            let _ = fs::remove_dir_all(self.comp_dir(l.oid));
            self.comps.lock().unwrap().retain(|&(oid, _), _| oid != l.oid);
        }
    }

    pub(super) fn truncate(&self, l: &Layout, size: u64) -> Res<()> {
        self.gas_settle(l.oid, Reason::Read);
        let r = self.truncate_objects(l, size);
        if let Some(c) = self.cache.get() {
            c.invalidate_file(l.oid);
        }
        r
    }

    fn truncate_objects(&self, l: &Layout, size: u64) -> Res<()> {
        if !l.is_progressive() {
            for (s, ti) in self.objects(l)? {
                self.obj_fd(ti, l.oid, s, false)?.set_len(obj_size(l, size, s as u32)).map_err(werr)?;
            }
            return Ok(());
        }
        // The component holding the last byte gets exactly the bytes up to the size (placed
        // now if needed, so that the size reads back); the ones after it are emptied. Their
        // records stay: components keep their targets while the file exists.
        let last = size.checked_sub(1).map(|b| b / l.component_size);
        if let Some(k) = last {
            self.obj_fd(self.placed(l, k)?, l.oid, k, true)?.set_len(size - k * l.component_size).map_err(werr)?;
        }
        for (k, ti) in self.objects(l)? {
            if last.is_none_or(|last| k > last) {
                if let Some(f) = self.existing_obj(ti, l.oid, k)? {
                    f.set_len(0).map_err(werr)?;
                }
            }
        }
        Ok(())
    }

    /// Applies the target's token bucket and injected latency before a piece of I/O.
    fn gate(&self, ti: u32, bytes: u64, info: &mut IoInfo) {
        let t = &self.targets[ti as usize];
        let wait = t.shm.reserve(bytes);
        if !wait.is_zero() {
            info.throttled += wait;
            std::thread::sleep(wait);
        }
        let lat = t.shm.added_latency_ns();
        if lat > 0 {
            std::thread::sleep(Duration::from_nanos(lat));
        }
    }

    /// Injected slowdown of a piece's backing I/O: its service time `took` becomes `f x took`
    /// (the token bucket applies the same factor to the rate, see `TargetShm::reserve`).
    /// The extra `(f - 1) x took` is owed per worker thread and slept once it reaches
    /// [`STRETCH_MIN_SLEEP`], minus what the sleeps overshot: sub-millisecond page-cache
    /// writes get the factor on average instead of the timer's granularity.
    pub fn stretch(&self, ti: u32, took: Duration) {
        let f = self.targets[ti as usize].shm.slowdown();
        if f > 1.0 {
            STRETCH_DEBT_NS.with(|debt| {
                let owed = debt.get() + took.as_nanos() as f64 * (f - 1.0);
                if owed >= STRETCH_MIN_SLEEP.as_nanos() as f64 {
                    let t0 = Instant::now();
                    std::thread::sleep(Duration::from_nanos(owed as u64));
                    // an overshoot is credited, bounded so that one long stall is not repaid by many fast requests
                    debt.set((owed - t0.elapsed().as_nanos() as f64).max(-(STRETCH_MIN_SLEEP.as_nanos() as f64)));
                } else {
                    debt.set(owed);
                }
            });
        }
    }

    /// A read of a single-target file served straight from its object (the caller sends
    /// the bytes with `sendfile(2)`, no copy through user space): the object's fd, offset
    /// and the byte count, clamped to the object's size now. Token bucket and injected
    /// latency are applied here; the caller applies [`Backend::stretch`] after sending.
    /// `None` for striped and progressive layouts (holes and pieces: use
    /// [`Backend::read_into`]).
    pub fn read_span(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo) -> Res<Option<FileSpan>> {
        self.check_layout(l)?;
        if l.targets.len() != 1 || l.is_progressive() || self.cache.get().is_some() {
            return Ok(None);
        }
        let floor = self.gas_settle_read(l.oid, off, size as u64);
        info.oid = l.oid;
        let ti = l.targets[0];
        info.target.get_or_insert(ti);
        let file = self.obj_fd(ti, l.oid, 0, false)?;
        let osize = file.metadata().map_err(werr)?.len();
        let len = (size as u64).min(osize.saturating_sub(off));
        if len < size as u64 && floor > osize {
            return Ok(None); // gathered writes past the object's end: a hole, read_into pads it
        }
        if len > 0 {
            self.gate(ti, len, info);
        }
        Ok(Some(FileSpan { file, off, len: len as usize, target: ti }))
    }

    pub fn read(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo) -> Res<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_into(l, off, size, info, &mut buf)?;
        Ok(buf)
    }

    /// Reads into `buf` (resized to the bytes read; a reused buffer is not zeroed again),
    /// through the page cache when one is enabled.
    pub fn read_into(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo, buf: &mut Vec<u8>) -> Res<()> {
        match self.cache.get() {
            Some(c) if size > 0 => {
                self.gas_settle(l.oid, Reason::Read);
                self.read_cached(c, l, off, size, info, buf)
            }
            _ => {
                let floor = self.gas_settle_read(l.oid, off, size as u64);
                if buf.len() < size as usize {
                    buf.resize(size as usize, 0);
                }
                let n = self.read_slice_direct(l, off, info, &mut buf[..size as usize], floor)?;
                buf.truncate(n);
                Ok(())
            }
        }
    }

    /// Reads from the targets (no cache) into `buf`, resized to the bytes read.
    pub(super) fn read_direct(&self, l: &Layout, off: u64, size: u32, info: &mut IoInfo, buf: &mut Vec<u8>) -> Res<()> {
        if buf.len() < size as usize {
            buf.resize(size as usize, 0);
        }
        let n = self.read_slice_direct(l, off, info, &mut buf[..size as usize], 0)?;
        buf.truncate(n);
        Ok(())
    }

    /// Reads up to `buf.len()` bytes at `off` into `buf` (e.g. a shared-memory slot, issue 12
    /// item 1), after the file's gathered writes and through the page cache when one is enabled;
    /// returns how many bytes the file has there (fewer at its end).
    pub fn read_into_slice(&self, l: &Layout, off: u64, info: &mut IoInfo, buf: &mut [u8]) -> Res<usize> {
        match self.cache.get() {
            Some(c) if !buf.is_empty() => {
                self.gas_settle(l.oid, Reason::Read);
                let mut v = Vec::new();
                self.read_cached(c, l, off, buf.len() as u32, info, &mut v)?;
                let n = v.len().min(buf.len());
                buf[..n].copy_from_slice(&v[..n]);
                Ok(n)
            }
            _ => {
                let floor = self.gas_settle_read(l.oid, off, buf.len() as u64);
                self.read_slice_direct(l, off, info, buf, floor)
            }
        }
    }

    /// Reads up to `buf.len()` bytes at `off` from the targets (no cache; the gathered writes
    /// overlapping the range were flushed by the caller). `floor`: the size the file has at
    /// least (its gathered writes elsewhere, [`super::gas::Gas::settle_read`]; 0 without):
    /// the bytes between the objects' end and it read as zeros.
    fn read_slice_direct(&self, l: &Layout, off: u64, info: &mut IoInfo, buf: &mut [u8], floor: u64) -> Res<usize> {
        self.check_layout(l)?;
        info.oid = l.oid;
        let single = l.targets.len() == 1 && !l.is_progressive();
        let mut len = buf.len() as u64;
        if l.targets.len() > 1 && !l.is_progressive() {
            let (fsize, ..) = self.data_stat_now(l)?;
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
                let found = match self.component(l, pc.obj, false)? {
                    Some(ti) => self.existing_obj(ti, l.oid, pc.obj)?.map(|f| (ti, f)),
                    None => None,
                };
                let Some(found) = found else {
                    short = true;
                    continue;
                };
                found
            } else {
                let ti = l.targets[pc.obj as usize];
                (ti, self.obj_fd(ti, l.oid, pc.obj, false)?)
            };
            info.target.get_or_insert(ti);
            self.gate(ti, pc.len, info);
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
            self.stretch(ti, t0.elapsed());
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
            got_end = if short { len.min(self.data_stat_now(l)?.0.max(floor).saturating_sub(off)) } else { len };
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
    pub fn write(&self, l: &Layout, h: OpenHandle, off: u64, data: &[u8], info: &mut IoInfo) -> Res<u32> {
        self.write_from("", l, h, off, data, info)
    }

    /// A client write from compute node `node`: gathered into the node's buffer when
    /// Gather-Arrange-Scatter is on ([`super::gas`]), else written through.
    pub fn write_from(
        &self,
        node: &str,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        data: &[u8],
        info: &mut IoInfo,
    ) -> Res<u32> {
        self.begin_write(l, off, data.len(), info)?;
        if let Some(g) = self.gas.get() {
            info.target = self.first_target(l, off);
            return g.gather(self, node, l, h, off, g.copy_of(data));
        }
        self.write_through(l, h, off, data, info)
    }

    /// [`Backend::write_from`] of a buffer the caller owns (a socket write's): gathered, it
    /// moves into the node's buffer instead of being copied, and `data` gets a pooled empty
    /// buffer in exchange ([`super::gas::Gas::keep`]).
    pub fn write_owned(
        &self,
        node: &str,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        data: &mut Vec<u8>,
        info: &mut IoInfo,
    ) -> Res<u32> {
        self.begin_write(l, off, data.len(), info)?;
        if let Some(g) = self.gas.get() {
            info.target = self.first_target(l, off);
            return g.gather(self, node, l, h, off, g.keep(data));
        }
        self.write_through(l, h, off, data, info)
    }

    /// The checks and count every client write starts with.
    fn begin_write(&self, l: &Layout, off: u64, len: usize, info: &mut IoInfo) -> Res<()> {
        self.check_layout(l)?;
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
        l: &Layout,
        h: OpenHandle,
        off: u64,
        data: &[u8],
        info: &mut IoInfo,
    ) -> Res<u32> {
        let r = self.write_pieces(l, h, off, data, info);
        // After the bytes are on the targets (or some of them, on an error): a read that
        // fetched the old bytes meanwhile sees the generation change and does not cache them.
        if let Some(c) = self.cache.get() {
            c.invalidate_range(l.oid, off, data.len() as u64);
        }
        r
    }

    /// Like [`Backend::write_through`] for bytes given as consecutive chunks (a gathered
    /// run, [`super::gas`]): one `pwritev(2)` per object piece, no copy to join them.
    pub(super) fn write_through_chunks(
        &self,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        chunks: &[&[u8]],
        info: &mut IoInfo,
    ) -> Res<u32> {
        let len: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        let r = self.write_chunk_pieces(l, h, off, len, chunks, info);
        if let Some(c) = self.cache.get() {
            c.invalidate_range(l.oid, off, len);
        }
        r.map(|()| len as u32)
    }

    fn write_chunk_pieces(
        &self,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        len: u64,
        chunks: &[&[u8]],
        info: &mut IoInfo,
    ) -> Res<()> {
        use std::os::fd::AsRawFd;
        // (chunk index, offset in it) of the run's byte `pos`, advanced piece by piece.
        let (mut ci, mut co) = (0usize, 0usize);
        for pc in pieces(l, off, len) {
            let ti = if l.is_progressive() { self.enter(l, h, pc.obj)? } else { l.targets[pc.obj as usize] };
            info.target.get_or_insert(ti);
            self.gate(ti, pc.len, info);
            let f = self.obj_fd(ti, l.oid, pc.obj, l.is_progressive())?;
            let mut iov: Vec<libc::iovec> = Vec::new();
            let mut need = pc.len as usize;
            while need > 0 {
                let c = &chunks[ci][co..];
                let k = c.len().min(need);
                iov.push(libc::iovec { iov_base: c.as_ptr() as *mut libc::c_void, iov_len: k });
                need -= k;
                co += k;
                if co == chunks[ci].len() {
                    ci += 1;
                    co = 0;
                }
            }
            let t0 = Instant::now();
            self.data_writes.fetch_add(1, Relaxed);
            let (mut done, mut first, mut at) = (0usize, 0usize, pc.obj_off);
            while done < pc.len as usize {
                let cnt = (iov.len() - first).min(libc::UIO_MAXIOV as usize) as i32;
                let n = unsafe { libc::pwritev(f.as_raw_fd(), iov[first..].as_ptr(), cnt, at as libc::off_t) };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(werr(e));
                }
                if n == 0 {
                    return Err(eno(errno::EIO, "pwritev wrote nothing"));
                }
                let mut n = n as usize;
                done += n;
                at += n as u64;
                // Skip the iovecs written, trim a partly written one.
                while n > 0 && first < iov.len() {
                    if n >= iov[first].iov_len {
                        n -= iov[first].iov_len;
                        first += 1;
                    } else {
                        iov[first].iov_base = unsafe { (iov[first].iov_base as *mut u8).add(n) } as *mut libc::c_void;
                        iov[first].iov_len -= n;
                        n = 0;
                    }
                }
            }
            self.stretch(ti, t0.elapsed());
        }
        Ok(())
    }

    fn write_pieces(&self, l: &Layout, h: OpenHandle, off: u64, data: &[u8], info: &mut IoInfo) -> Res<u32> {
        for pc in pieces(l, off, data.len() as u64) {
            let ti = if l.is_progressive() { self.enter(l, h, pc.obj)? } else { l.targets[pc.obj as usize] };
            info.target.get_or_insert(ti);
            self.gate(ti, pc.len, info);
            let f = self.obj_fd(ti, l.oid, pc.obj, l.is_progressive())?;
            let t0 = Instant::now();
            self.data_writes.fetch_add(1, Relaxed);
            f.write_all_at(&data[pc.buf_off as usize..(pc.buf_off + pc.len) as usize], pc.obj_off).map_err(werr)?;
            self.stretch(ti, t0.elapsed());
        }
        Ok(data.len() as u32)
    }

    /// Flushes every object of the file (all stripes, or all written components).
    pub fn fsync(&self, l: &Layout, datasync: bool, info: &mut IoInfo) -> Res<()> {
        self.check_layout(l)?;
        info.oid = l.oid;
        if let Some(g) = self.gas.get() {
            g.settle(self, l.oid, Reason::Fsync, true)?;
        }
        for (idx, ti) in self.objects(l)? {
            let f = if l.is_progressive() {
                match self.existing_obj(ti, l.oid, idx)? {
                    Some(f) => f,
                    None => continue,
                }
            } else {
                self.obj_fd(ti, l.oid, idx, false)?
            };
            info.target.get_or_insert(ti);
            if datasync { f.sync_data() } else { f.sync_all() }.map_err(werr)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testutil::*;
    use crate::backend::Placement;
    use pharos_fwd_proto::{Ctx, SetAttr};
    use std::sync::Arc;

    #[test]
    fn striped_file_roundtrip_and_truncate() {
        let (_d, b) = backend(4);
        b.placement.store(Arc::new(Placement { stripe_count: Some(3), stripe_size: Some(4096), ..Default::default() }));
        let (_, l, _) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        assert_eq!(l.targets.len(), 3);
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let mut info = IoInfo::default();
        assert_eq!(b.write(&l, NOH, 1000, &data, &mut info).unwrap(), 50_000);
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 51_000);
        let back = b.read(&l, 1000, 60_000, &mut info).unwrap();
        assert_eq!(back, data);
        let head = b.read(&l, 0, 1000, &mut info).unwrap();
        assert!(head.iter().all(|&x| x == 0));
        b.setattr("f", &SetAttr { size: Some(5000), ..Default::default() }, None, &Ctx::default()).unwrap();
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 5000);
        b.setattr("f", &SetAttr { size: Some(20_000), ..Default::default() }, None, &Ctx::default()).unwrap();
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 20_000);
        let r = b.read(&l, 0, 30_000, &mut info).unwrap();
        assert_eq!(r.len(), 20_000);
        assert_eq!(&r[1000..5000], &data[..4000]);
        assert!(r[5000..].iter().all(|&x| x == 0));
    }

    #[test]
    fn progressive_file_roundtrip_holes_truncate_and_unlink() {
        let (d, b) = backend(3);
        progressive(&b, &[10.0, 30.0, 20.0], 8192);
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        assert!(l.is_progressive() && l.targets == vec![0, 1, 2]);
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 0);
        assert_eq!(obj_count(&d), 0, "components are placed by their first write");
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let mut info = IoInfo::default();
        // Component 2 and 3 (bytes 16384..36384), component 0 and 1 are holes.
        assert_eq!(b.write(&l, h, 16_384, &data, &mut info).unwrap(), 20_000);
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 36_384);
        assert_eq!(b.read(&l, 16_384, 30_000, &mut info).unwrap(), data);
        let all = b.read(&l, 0, 1 << 20, &mut info).unwrap();
        assert_eq!(all.len(), 36_384);
        assert!(all[..16_384].iter().all(|&x| x == 0));
        // The open counts on the target of the component it wrote last only.
        let t3 = b.component(&l, 3, false).unwrap().unwrap();
        assert_eq!(counts(&b).iter().sum::<i64>(), 1);
        assert_eq!(counts(&b)[t3 as usize], 1);
        // Shrink into a hole: the hole's component is placed so the size holds.
        b.setattr("f", &SetAttr { size: Some(10_000), ..Default::default() }, None, &Ctx::default()).unwrap();
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 10_000);
        assert_eq!(b.read(&l, 0, 1 << 20, &mut info).unwrap(), vec![0; 10_000]);
        // Extend: zeros up to the new size; a write after it shows through.
        b.setattr("f", &SetAttr { size: Some(50_000), ..Default::default() }, None, &Ctx::default()).unwrap();
        assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 50_000);
        b.write(&l, h, 8000, b"abcdefghij", &mut info).unwrap();
        let r = b.read(&l, 0, 60_000, &mut info).unwrap();
        assert_eq!(r.len(), 50_000);
        assert_eq!(&r[8000..8010], b"abcdefghij");
        assert!(r[8010..].iter().all(|&x| x == 0) && r[..8000].iter().all(|&x| x == 0));
        b.fsync(&l, false, &mut info).unwrap();
        // Unlink while open: data stays until release, then objects and records go.
        b.unlink("f", &Ctx::default()).unwrap();
        assert_eq!(b.read(&l, 8000, 10, &mut info).unwrap(), b"abcdefghij");
        assert!(obj_count(&d) > 0);
        b.release(&l, h).unwrap();
        assert_eq!(counts(&b), vec![0, 0, 0]);
        assert_eq!(obj_count(&d), 0);
        assert_eq!(fs::read_dir(d.path().join("mdt/components")).unwrap().count(), 0);
        // A write after the objects are gone does not resurrect them.
        assert_eq!(b.write(&l, NOH, 1 << 20, b"x", &mut info).unwrap_err().errno, errno::ENOENT);
        assert_eq!(obj_count(&d), 0);
    }
}
