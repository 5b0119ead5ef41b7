//! Gather-Arrange-Scatter (Ohta et al., "Optimization techniques at the I/O forwarding
//! layer", IEEE Cluster 2010, section IV: 34.9% faster than uncoordinated writes in BTIO),
//! issue 12, item 3.
//!
//! * **Gather**: a write through this daemon is copied into the buffer of its compute node
//!   (the request's `compute_node`; every rank of a node shares it) and answered at once. The
//!   copy is made before the buffers' lock is taken, into a reused buffer of a flushed write.
//! * **Arrange**: each node's buffer keeps its writes by file (and open, for progressive
//!   layouts) in offset order; a write that starts where a buffered extent ends (or ends where one starts) is merged
//!   into it, so the interleaved blocks of a node's ranks become contiguous runs.
//! * **Scatter**: a flush takes the node's runs and writes them to the targets, runs of
//!   different objects in parallel (at most [`SCATTER_THREADS`] threads; the runs of a file
//!   stored in one object are written by one thread, in offset order: see `object_groups`).
//!
//! A node's buffer is flushed when it holds more than `buffer_max` bytes (scattered by the
//! flusher thread while the writer is answered; by the writer itself when
//! [`QUEUED_FLUSHES`] wait already, or when all buffers hold more than [`MAX_BUFFERS`] x
//! `buffer_max`: backpressure), when the node has sent no write for `flush_after` (the burst is
//! over) or its oldest write is [`MAX_AGE_FACTOR`] x `flush_after` old (a background thread
//! checks every `flush_after / 2` while anything is buffered), and, for one file, before a
//! stat of its size, a truncate, its fsync and each release (close) of it, so that fsync/close
//! durability hold. A read flushes the file's gathered writes that overlap its range and waits
//! for the flushes under way that overlap it ([`Gas::settle_read`]; with the page cache on, the
//! whole file); the file's other gathered writes stay and give the size up to which a short
//! read is a hole: a read after a write through this daemon sees the write. A write overlapping a buffered one of the
//! same file flushes that file first (the later write lands last; the check looks at that
//! file's buffers only, found through a per-object index). A flush waits for flushes
//! of the same file already under way, so writes land in the order they were buffered.
//!
//! Cost: a gathered write is copied once into the buffer (a run keeps its writes' copies
//! and is written with one `pwritev` per object piece), then by the flush into the target:
//! one more copy than writing through. The copy is made outside the lock into a buffer of
//! a flushed write (a `ChunkPool` of at most 2 x `buffer_max` bytes: no allocation and no
//! page faults once warm), so a gathered 64 KiB write is served in ~9-13 us against ~25-30 us
//! for a write-through `pwrite` (bench/forwarder_gas.py, daemon service time); the flusher is
//! woken by a condition variable (crossbeam's blocking receive spun at every tick) and sleeps
//! while nothing is buffered. The daemon then spends about the CPU of GAS off per byte, and
//! GAS on/off is at parity where a target write is a local page-cache copy (the client's
//! FUSE round trip, ~200 us, dominates); with a per-request target latency (remote targets,
//! `bench/forwarder_gas.py --target-latency-ms 0.1`) GAS on/off is 2.2-2.5. A write
//! from a shared-memory slot (the mount's default) needs this copy (the slot is the client's
//! again at the reply). A write that came over the socket (a compute node on another host,
//! the deployed case) is not copied: the buffer its bytes were received into is kept
//! ([`Gas::keep`]) and swapped for a pooled empty one, which returns to the daemon's receive
//! pool. TODO (issue 12, item 3): gather into preallocated slabs so that the first buffer
//! after start is not faulted in write by write.
//!
//! Errors of a deferred write (ENOSPC, EIO, a file removed meanwhile) are kept per file and
//! returned by the next fsync or release of it, as the kernel reports writeback errors.
//! Writes buffered here are not seen by *other* daemons until flushed (at most
//! `MAX_AGE_FACTOR x flush_after` later, or at the writer's fsync/close): off by default. A
//! mount moving a job to another daemon has this one flush its compute node first (`remap.rs`).
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use pharos_fwd_proto::{Layout, OpenHandle, WireError};

use super::{Backend, IoInfo, Res};

mod index;
mod pool;
mod queue;
mod remap;
#[cfg(test)]
mod tests;
mod view;

use index::OidIndex;
use pool::ChunkPool;
use queue::FlushQueue;
pub use view::{GasCollector, GasView};

/// Most threads one flush scatters its runs with.
pub const SCATTER_THREADS: usize = 8;
/// A node's buffer is flushed at the latest this many `flush_after` after its oldest write.
pub const MAX_AGE_FACTOR: u32 = 20;
/// Size flushes waiting for the flusher thread at most.
pub const QUEUED_FLUSHES: usize = 2;
/// All nodes' buffers hold at most this many `buffer_max` (past it every buffer is flushed).
pub const MAX_BUFFERS: usize = 4;
/// Most compute-node buffers held at once (a new node past it flushes every buffer first).
pub const MAX_NODES: usize = 256;
/// Most files whose deferred write error waits to be reported.
const MAX_ERRORS: usize = 4096;

/// Why a buffer was flushed (metrics label order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Size = 0,
    Time = 1,
    Fsync = 2,
    Close = 3,
    Read = 4,
    Overlap = 5,
    Shutdown = 6,
    Remap = 7,
}

/// Names of [`Reason`]s, in order.
pub const REASONS: [&str; 8] = ["size", "time", "fsync", "close", "read_or_stat", "overlap", "shutdown", "remap"];

/// Counters of Gather-Arrange-Scatter since the start (GET /metrics).
#[derive(Default)]
pub struct GasStats {
    /// Client writes gathered into a buffer.
    pub gathered: AtomicU64,
    /// Gathered writes that kept the buffer their bytes arrived in from the socket (no copy).
    pub kept: AtomicU64,
    /// Gathered writes merged into a preceding or following buffered extent.
    pub merged: AtomicU64,
    /// Runs written to the targets by flushes.
    pub runs: AtomicU64,
    /// Bytes written by flushes.
    pub bytes: AtomicU64,
    /// Flushes, by [`Reason`].
    pub flushes: [AtomicU64; 8],
    /// Runs whose write failed (the error goes to the file's next fsync or release).
    pub deferred_errors: AtomicU64,
}

struct FileBuf {
    layout: Layout,
    /// Extents by offset: non-overlapping, adjacent ones merged.
    extents: BTreeMap<u64, Extent>,
}

#[derive(Default)]
struct NodeBuf {
    bytes: usize,
    /// When the oldest write still buffered arrived.
    since: Option<Instant>,
    /// When the newest write arrived.
    last: Option<Instant>,
    files: HashMap<(u64, OpenHandle), FileBuf>,
}

#[derive(Default)]
struct Inner {
    nodes: HashMap<String, NodeBuf>,
    /// The buffers of each object (see [`OidIndex`]).
    index: OidIndex,
    total: usize,
    /// Byte ranges being written by flushes under way, by object id. Buffered extents never
    /// overlap them (a write overlapping one waits for it), so flushes of a file that run at
    /// once touch disjoint bytes and need no order between them.
    inflight: HashMap<u64, Vec<(u64, u64)>>,
    /// Deferred write errors not reported yet, by object id.
    errors: HashMap<u64, WireError>,
}

/// One run to write: a file's contiguous bytes.
/// Contiguous gathered bytes: the writes' own copies, in order (merging appends, no
/// reallocation of the bytes; a flush writes them with one `pwritev` per object piece).
#[derive(Default)]
struct Extent {
    len: usize,
    chunks: Vec<Vec<u8>>,
}

struct Run {
    layout: Layout,
    handle: OpenHandle,
    off: u64,
    data: Extent,
}

/// The gather buffers of the daemon: at most `buffer_max` bytes per compute node, flushed
/// after `flush_after` at the latest.
pub struct Gas {
    pub buffer_max: usize,
    pub flush_after: Duration,
    inner: Mutex<Inner>,
    done: Condvar,
    /// Buffers of flushed writes, reused by the next gathers (at most 2 x `buffer_max` bytes:
    /// a node's next buffer fills while its last one is scattered).
    pool: ChunkPool,
    pub stats: GasStats,
    /// Size flushes handed to the flusher thread (at most [`QUEUED_FLUSHES`] waiting; past
    /// that the writer scatters its node's runs itself).
    queue: Arc<FlushQueue>,
}

impl Drop for Gas {
    fn drop(&mut self) {
        self.queue.state.lock().unwrap().closed = true;
        self.queue.bell.notify_all();
    }
}

impl Gas {
    /// Enables Gather-Arrange-Scatter on `b` (see the module doc) and starts its time-based
    /// flusher, which ends with the backend.
    pub fn enable(b: &Arc<Backend>, buffer_max: usize, flush_after: Duration) {
        if b.gas.set(Gas::new(buffer_max, flush_after)).is_err() {
            return;
        }
        let q = b.gas.get().unwrap().queue.clone();
        let weak: Weak<Backend> = Arc::downgrade(b);
        let tick = (flush_after / 2).max(Duration::from_micros(500));
        // Scatters the size flushes handed over, and every tick (while something is buffered)
        // the idle and old buffers; ends when the backend is gone.
        std::thread::Builder::new()
            .name("fwd-gas-flush".into())
            .spawn(move || {
                while let Ok(got) = q.next(tick) {
                    let Some(b) = weak.upgrade() else { return };
                    let Some(g) = b.gas.get() else { return };
                    match got {
                        Some((runs, why)) => g.scatter(&b, runs, why),
                        None => {
                            g.flush_due(&b);
                            // Disarmed first, then checked: a gather after the check arms again.
                            q.state.lock().unwrap().armed = false;
                            if g.buffered() > 0 {
                                q.arm();
                            }
                        }
                    }
                }
            })
            .expect("spawn gas flusher");
    }

    pub fn new(buffer_max: usize, flush_after: Duration) -> Gas {
        Gas {
            buffer_max: buffer_max.max(4096),
            flush_after,
            inner: Mutex::new(Inner::default()),
            done: Condvar::new(),
            pool: ChunkPool::new(2 * buffer_max.max(4096)),
            stats: GasStats::default(),
            queue: Arc::default(),
        }
    }

    /// Bytes buffered now (all nodes).
    pub fn buffered(&self) -> usize {
        self.inner.lock().unwrap().total
    }

    /// Takes every buffered extent of `oid` (all nodes) out of the buffers, after the
    /// flushes of it already under way; marks a flush of it under way.
    fn take_file(&self, g: &mut Inner, oid: u64) -> Vec<Run> {
        let mut runs = Vec::new();
        for (name, h) in g.index.take(oid) {
            let Some(node) = g.nodes.get_mut(&name) else { continue };
            let Some(f) = node.files.remove(&(oid, h)) else { continue };
            for (off, data) in f.extents {
                node.bytes -= data.len;
                g.total -= data.len;
                runs.push(Run { layout: f.layout.clone(), handle: h, off, data });
            }
            if node.files.is_empty() {
                node.since = None;
                node.last = None;
            }
        }
        runs
    }

    /// Takes a node's whole buffer.
    fn take_node(g: &mut Inner, node: &str) -> Vec<Run> {
        let Some(n) = g.nodes.remove(node) else { return Vec::new() };
        g.total -= n.bytes;
        let mut runs = Vec::new();
        for ((oid, h), f) in n.files {
            g.index.remove(oid, node, h);
            for (off, data) in f.extents {
                runs.push(Run { layout: f.layout.clone(), handle: h, off, data });
            }
        }
        runs
    }

    /// Marks the ranges of `runs` as being written.
    fn begin(g: &mut Inner, runs: &[Run]) {
        for r in runs {
            g.inflight.entry(r.layout.oid).or_default().push((r.off, r.off + r.data.len as u64));
        }
    }

    /// Whether a flush under way writes bytes of `[off, end)` of `oid` (any, `None`).
    fn in_flight(g: &Inner, oid: u64, range: Option<(u64, u64)>) -> bool {
        g.inflight.get(&oid).is_some_and(|v| match range {
            None => !v.is_empty(),
            Some((off, end)) => v.iter().any(|&(a, b)| a < end && off < b),
        })
    }

    fn end(&self, runs: &[Run], errors: Vec<(u64, WireError)>) {
        let mut g = self.inner.lock().unwrap();
        for r in runs {
            let range = (r.off, r.off + r.data.len as u64);
            if let Some(v) = g.inflight.get_mut(&r.layout.oid) {
                if let Some(i) = v.iter().position(|&x| x == range) {
                    v.swap_remove(i);
                }
                if v.is_empty() {
                    g.inflight.remove(&r.layout.oid);
                }
            }
        }
        for (oid, e) in errors {
            if g.errors.len() < MAX_ERRORS || g.errors.contains_key(&oid) {
                g.errors.entry(oid).or_insert(e);
            }
        }
        drop(g);
        self.done.notify_all();
    }

    /// Writes `runs` to the targets (scattered over threads when several) and records
    /// their errors; the runs were marked under way by [`Gas::begin`].
    fn scatter(&self, b: &Backend, mut runs: Vec<Run>, why: Reason) {
        self.stats.flushes[why as usize].fetch_add(1, Relaxed);
        runs.sort_unstable_by_key(|r| (r.layout.oid, r.off));
        let write = |r: &Run| -> Option<(u64, WireError)> {
            let mut info = IoInfo::default();
            self.stats.runs.fetch_add(1, Relaxed);
            self.stats.bytes.fetch_add(r.data.len as u64, Relaxed);
            let chunks: Vec<&[u8]> = r.data.chunks.iter().map(|c| c.as_slice()).collect();
            match b.data.write_through_chunks(b, &r.layout, r.handle, r.off, &chunks, &mut info) {
                Ok(_) => None,
                Err(e) => {
                    self.stats.deferred_errors.fetch_add(1, Relaxed);
                    log::warn!("deferred write of {:016x} at {}: {}", r.layout.oid, r.off, e.msg);
                    Some((r.layout.oid, e))
                }
            }
        };
        let groups = object_groups(&runs);
        let errors: Vec<(u64, WireError)> = if groups.len() <= 1 {
            runs.iter().filter_map(write).collect()
        } else {
            let k = groups.len().min(SCATTER_THREADS);
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..k)
                    .map(|i| {
                        let mine: Vec<&Run> = groups.iter().skip(i).step_by(k).flatten().copied().collect();
                        s.spawn(move || mine.into_iter().filter_map(write).collect::<Vec<_>>())
                    })
                    .collect();
                hs.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
            })
        };
        self.end(&runs, errors);
        self.pool.recycle(runs.into_iter().flat_map(|r| r.data.chunks));
    }

    /// Flushes every buffered write of `oid` (all nodes) and waits for flushes of it under
    /// way; returns (and forgets) the file's deferred write error if `report`.
    pub fn settle(&self, b: &Backend, oid: u64, why: Reason, report: bool) -> Res<()> {
        let mut g = self.inner.lock().unwrap();
        let runs = self.take_file(&mut g, oid);
        if !runs.is_empty() {
            Self::begin(&mut g, &runs);
            drop(g);
            self.scatter(b, runs, why);
            g = self.inner.lock().unwrap();
        }
        // Flushes of it under way elsewhere must be done too before a read or fsync.
        while Self::in_flight(&g, oid, None) {
            g = self.done.wait(g).unwrap();
        }
        match report {
            true => g.errors.remove(&oid).map_or(Ok(()), Err),
            false => Ok(()),
        }
    }

    /// Before a read of `[off, end)` of `oid`: flushes the buffered writes overlapping it (all
    /// nodes) and waits for the flushes under way that overlap it, so the read sees every
    /// write answered before it; the file's other buffered writes stay gathered. Returns the
    /// size the file has at least once its other gathered and flushing writes land (0 if
    /// none): the read pads a short read up to it with zeros (a hole, not the end of the file).
    pub fn settle_read(&self, b: &Backend, oid: u64, off: u64, end: u64) -> u64 {
        let mut g = self.inner.lock().unwrap();
        let mut runs = Vec::new();
        let gi = &mut *g;
        for (name, h) in gi.index.get(oid).to_vec() {
            let Some(node) = gi.nodes.get_mut(&name) else { continue };
            let Some(f) = node.files.get_mut(&(oid, h)) else { continue };
            let hit: Vec<u64> =
                f.extents.range(..end).rev().take_while(|(&o, d)| o + d.len as u64 > off).map(|(&o, _)| o).collect();
            let layout = f.layout.clone();
            for o in hit {
                let data = f.extents.remove(&o).unwrap();
                node.bytes -= data.len;
                gi.total -= data.len;
                runs.push(Run { layout: layout.clone(), handle: h, off: o, data });
            }
            if f.extents.is_empty() {
                node.files.remove(&(oid, h));
                gi.index.remove(oid, &name, h);
                if node.files.is_empty() {
                    node.since = None;
                    node.last = None;
                }
            }
        }
        if !runs.is_empty() {
            Self::begin(&mut g, &runs);
            drop(g);
            self.scatter(b, runs, Reason::Read);
            g = self.inner.lock().unwrap();
        }
        while Self::in_flight(&g, oid, Some((off, end))) {
            g = self.done.wait(g).unwrap();
        }
        let buffered = g.index.get(oid).iter().filter_map(|(n, h)| {
            let f = g.nodes.get(n)?.files.get(&(oid, *h))?;
            f.extents.iter().next_back().map(|(&o, d)| o + d.len as u64)
        });
        let flushing = g.inflight.get(&oid).into_iter().flatten().map(|&(_, e)| e);
        buffered.chain(flushing).max().unwrap_or(0)
    }

    /// Flushes one node's buffer (or all, `None`).
    pub fn flush(&self, b: &Backend, node: Option<&str>, why: Reason) {
        self.flush_to(b, node, why, false)
    }

    /// Like [`Gas::flush`]; with `background`, the runs (marked under way) go to the flusher
    /// thread when its queue has room, so the writer that filled the buffer is answered while
    /// they are scattered.
    fn flush_to(&self, b: &Backend, node: Option<&str>, why: Reason, background: bool) {
        let mut g = self.inner.lock().unwrap();
        let names: Vec<String> = match node {
            Some(n) => vec![n.to_string()],
            None => g.nodes.keys().cloned().collect(),
        };
        let mut runs = Vec::new();
        for n in &names {
            runs.extend(Self::take_node(&mut g, n));
        }
        if runs.is_empty() {
            return;
        }
        Self::begin(&mut g, &runs);
        drop(g);
        let runs = match background {
            true => match self.queue.offer((runs, why)) {
                Ok(()) => return,
                Err((runs, _)) => runs,
            },
            false => runs,
        };
        self.scatter(b, runs, why);
    }

    /// Flushes every buffer and waits for the flushes under way (shutdown).
    pub fn drain(&self, b: &Backend) {
        self.flush(b, None, Reason::Shutdown);
        let mut g = self.inner.lock().unwrap();
        while !g.inflight.is_empty() {
            g = self.done.wait(g).unwrap();
        }
    }

    /// Flushes the buffers of nodes idle for `flush_after`, or whose oldest write is
    /// [`MAX_AGE_FACTOR`] x `flush_after` old.
    pub fn flush_due(&self, b: &Backend) {
        let due: Vec<String> = {
            let g = self.inner.lock().unwrap();
            g.nodes
                .iter()
                .filter(|(_, n)| {
                    n.last.is_some_and(|t| t.elapsed() >= self.flush_after)
                        || n.since.is_some_and(|t| t.elapsed() >= self.flush_after * MAX_AGE_FACTOR)
                })
                .map(|(k, _)| k.clone())
                .collect()
        };
        for n in due {
            self.flush(b, Some(&n), Reason::Time);
        }
    }

    /// Gathers a client write of `data` at `off` of file `l` through open `h` from compute
    /// node `node` (the caller checked the layout and the range).
    pub fn gather(&self, b: &Backend, node: &str, l: &Layout, h: OpenHandle, off: u64, copy: Vec<u8>) -> Res<u32> {
        let len = copy.len();
        let end = off + len as u64;
        log::trace!("gather {node} {:016x} {off}+{len}", l.oid);
        let mut g = self.inner.lock().unwrap();
        // A write overlapping one being flushed waits for it; one overlapping a buffered
        // write flushes the file first: either way it lands last.
        while Self::in_flight(&g, l.oid, Some((off, end))) {
            g = self.done.wait(g).unwrap();
        }
        let overlaps = g.index.get(l.oid).iter().any(|(n, h)| {
            let f = g.nodes.get(n).and_then(|n| n.files.get(&(l.oid, *h)));
            f.is_some_and(|f| f.extents.range(..end).next_back().is_some_and(|(&o, d)| o + d.len as u64 > off))
        });
        if overlaps {
            drop(g);
            self.settle(b, l.oid, Reason::Overlap, false)?;
            g = self.inner.lock().unwrap();
        }
        if !g.nodes.contains_key(node) && g.nodes.len() >= MAX_NODES {
            drop(g);
            self.flush(b, None, Reason::Size);
            g = self.inner.lock().unwrap();
        }
        // Writes of every open of a classic layout merge (the handle only matters to the
        // placement accounting of progressive components).
        let key = (l.oid, if l.is_progressive() { h } else { OpenHandle { daemon: 0, id: 0 } });
        g.index.add(l.oid, node, key.1);
        let nb = g.nodes.entry(node.to_string()).or_default();
        let now = Instant::now();
        nb.since.get_or_insert(now);
        nb.last = Some(now);
        nb.bytes += len;
        let f = nb.files.entry(key).or_insert_with(|| FileBuf { layout: l.clone(), extents: BTreeMap::new() });
        // Arrange: append to the extent ending at `off`, then take in the one starting at `end`.
        let prev = f.extents.range_mut(..off).next_back().filter(|(&o, d)| o + d.len as u64 == off);
        let mut merged = false;
        let start = match prev {
            Some((&o, d)) => {
                d.len += len;
                d.chunks.push(copy);
                merged = true;
                o
            }
            None => {
                f.extents.insert(off, Extent { len, chunks: vec![copy] });
                off
            }
        };
        if let Some(next) = f.extents.remove(&end) {
            let e = f.extents.get_mut(&start).unwrap();
            e.len += next.len;
            e.chunks.extend(next.chunks);
            merged = true;
        }
        let node_bytes = nb.bytes;
        g.total += len;
        let total = g.total;
        drop(g);
        if total == len {
            self.queue.arm(); // the first bytes buffered: the flusher ticks again
        }
        self.stats.gathered.fetch_add(1, Relaxed);
        if merged {
            self.stats.merged.fetch_add(1, Relaxed);
        }
        if total >= self.buffer_max * MAX_BUFFERS {
            self.flush(b, None, Reason::Size);
        } else if node_bytes >= self.buffer_max {
            self.flush_to(b, Some(node), Reason::Size, true);
        }
        Ok(len as u32)
    }

    /// The buffer a gathered write of `data` is kept in: a pooled copy made before the lock is
    /// taken (the writes of other ranks go on meanwhile).
    pub(super) fn copy_of(&self, data: &[u8]) -> Vec<u8> {
        self.pool.copy(data)
    }

    /// The buffer a gathered socket write is kept in: the one its bytes arrived in, swapped
    /// for a pooled empty one that goes back to the daemon's receive pool (no copy), unless
    /// its capacity is over twice its length (a pooled receive buffer of a larger request:
    /// then copied, so the buffer's bytes bound its memory).
    pub(super) fn keep(&self, data: &mut Vec<u8>) -> Vec<u8> {
        if data.capacity() > 2 * data.len().max(4096) {
            return self.pool.copy(data);
        }
        self.stats.kept.fetch_add(1, Relaxed);
        std::mem::replace(data, self.pool.take())
    }
}

/// The runs of a flush (sorted by object id and offset) in groups that one scatter thread
/// writes in order: the runs of a file stored in one object share that object's inode lock,
/// so writing them from several threads only makes the threads wait on (and spin for) each
/// other; a striped or progressive file's runs reach several objects and stay one group each.
fn object_groups(runs: &[Run]) -> Vec<Vec<&Run>> {
    let mut groups: Vec<Vec<&Run>> = Vec::new();
    for r in runs {
        let one_object = !r.layout.is_progressive() && r.layout.targets.len() == 1;
        match groups.last_mut() {
            Some(g) if one_object && g[0].layout.oid == r.layout.oid => g.push(r),
            _ => groups.push(vec![r]),
        }
    }
    groups
}
