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
//! `MAX_AGE_FACTOR x flush_after` later, or at the writer's fsync/close): off by default.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, Weak};

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pharos_fwd_proto::{Layout, OpenHandle, WireError};

use super::{Backend, IoInfo, Res};

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
}

/// Names of [`Reason`]s, in order.
pub const REASONS: [&str; 7] = ["size", "time", "fsync", "close", "read_or_stat", "overlap", "shutdown"];

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
    pub flushes: [AtomicU64; 7],
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

/// Which buffers hold writes of an object: `(compute node, open)` keys of [`NodeBuf::files`]
/// by object id, so that a write's overlap check and a flush of one file look at that file's
/// buffers only instead of every file of every node.
#[derive(Default)]
struct OidIndex(HashMap<u64, Vec<(String, OpenHandle)>>);

impl OidIndex {
    /// Notes that `node` buffers writes of `oid` through open `h` (once per pair).
    fn add(&mut self, oid: u64, node: &str, h: OpenHandle) {
        let v = self.0.entry(oid).or_default();
        if !v.iter().any(|(n, x)| n == node && *x == h) {
            v.push((node.to_string(), h));
        }
    }
    /// Forgets one pair (its buffer was taken).
    fn remove(&mut self, oid: u64, node: &str, h: OpenHandle) {
        if let Some(v) = self.0.get_mut(&oid) {
            v.retain(|(n, x)| !(n == node && *x == h));
            if v.is_empty() {
                self.0.remove(&oid);
            }
        }
    }
    /// The buffers of `oid`.
    fn get(&self, oid: u64) -> &[(String, OpenHandle)] {
        self.0.get(&oid).map_or(&[], |v| v.as_slice())
    }
    /// Takes every buffer of `oid` out of the index.
    fn take(&mut self, oid: u64) -> Vec<(String, OpenHandle)> {
        self.0.remove(&oid).unwrap_or_default()
    }
}

/// Reusable copies of gathered writes: a flushed write's buffer (its pages already faulted
/// in) takes the next gathered write, so a gather is one `memcpy` without an allocation or
/// page faults. Holds at most `max` bytes of capacity.
struct ChunkPool {
    bufs: Mutex<(Vec<Vec<u8>>, usize)>,
    max: usize,
}

impl ChunkPool {
    /// A copy of `data`, in a pooled buffer when there is one (grown if too small).
    fn copy(&self, data: &[u8]) -> Vec<u8> {
        let got = {
            let mut p = self.bufs.lock().unwrap();
            let b = p.0.pop();
            p.1 -= b.as_ref().map_or(0, |b| b.capacity());
            b
        };
        let mut b = got.unwrap_or_else(|| Vec::with_capacity(data.len()));
        b.clear();
        b.extend_from_slice(data);
        b
    }
    /// A pooled buffer, emptied (or a new, unallocated one).
    fn take(&self) -> Vec<u8> {
        let mut p = self.bufs.lock().unwrap();
        let b = p.0.pop();
        p.1 -= b.as_ref().map_or(0, |b| b.capacity());
        drop(p);
        let mut b = b.unwrap_or_default();
        b.clear();
        b
    }
    /// Keeps written buffers for reuse (up to the pool's capacity; the rest are freed).
    fn recycle(&self, chunks: impl IntoIterator<Item = Vec<u8>>) {
        let mut p = self.bufs.lock().unwrap();
        for b in chunks {
            if p.1 + b.capacity() > self.max {
                break;
            }
            p.1 += b.capacity();
            p.0.push(b);
        }
    }
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

/// The flusher thread's work: size flushes handed over, and whether buffers wait for a time
/// flush. A mutex and a condition variable, not a channel: crossbeam's blocking receive spins
/// and yields before it parks, at every tick, CPU a 2-core box serving the writers lacks.
#[derive(Default)]
struct FlushQueue {
    state: Mutex<FlushState>,
    bell: Condvar,
}

#[derive(Default)]
struct FlushState {
    jobs: VecDeque<(Vec<Run>, Reason)>,
    /// Something is buffered: the flusher ticks (else it sleeps until a job or a gather).
    armed: bool,
    /// The backend is gone: the flusher ends.
    closed: bool,
}

impl FlushQueue {
    /// Queues a flush unless [`QUEUED_FLUSHES`] wait already (then gives it back).
    fn offer(&self, job: (Vec<Run>, Reason)) -> Result<(), (Vec<Run>, Reason)> {
        let mut s = self.state.lock().unwrap();
        if s.jobs.len() >= QUEUED_FLUSHES || s.closed {
            return Err(job);
        }
        s.jobs.push_back(job);
        drop(s);
        self.bell.notify_one();
        Ok(())
    }
    /// Wakes the flusher to tick (buffers became non-empty).
    fn arm(&self) {
        let mut s = self.state.lock().unwrap();
        if !s.armed {
            s.armed = true;
            drop(s);
            self.bell.notify_one();
        }
    }
    /// The next job, `Ok(None)` after a tick (or at once when armed and none came), `Err` when closed.
    fn next(&self, tick: Duration) -> Result<Option<(Vec<Run>, Reason)>, ()> {
        let mut s = self.state.lock().unwrap();
        loop {
            if s.closed {
                return Err(());
            }
            if let Some(j) = s.jobs.pop_front() {
                return Ok(Some(j));
            }
            if s.armed {
                let (s2, t) = self.bell.wait_timeout(s, tick).unwrap();
                s = s2;
                if t.timed_out() && s.jobs.is_empty() && !s.closed {
                    return Ok(None);
                }
            } else {
                s = self.bell.wait(s).unwrap();
            }
        }
    }
}

impl Drop for Gas {
    fn drop(&mut self) {
        self.queue.state.lock().unwrap().closed = true;
        self.queue.bell.notify_all();
    }
}

impl Gas {
    pub fn new(buffer_max: usize, flush_after: Duration) -> Gas {
        Gas {
            buffer_max: buffer_max.max(4096),
            flush_after,
            inner: Mutex::new(Inner::default()),
            done: Condvar::new(),
            pool: ChunkPool { bufs: Mutex::new((Vec::new(), 0)), max: 2 * buffer_max.max(4096) },
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
            match b.write_through_chunks(&r.layout, r.handle, r.off, &chunks, &mut info) {
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

/// Counters of GAS and of the write path (GET /status).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GasView {
    pub enabled: bool,
    pub client_writes: u64,
    pub backend_write_requests: u64,
    pub gathered: u64,
    pub kept: u64,
    pub merged: u64,
    pub runs: u64,
    pub bytes: u64,
    pub buffered_bytes: u64,
    pub deferred_errors: u64,
    pub flushes: BTreeMap<&'static str, u64>,
}

/// Client writes received and write requests issued to the targets (always), and the GAS
/// counters (when on), in `GET /metrics`.
pub struct GasCollector(pub Arc<Backend>);

impl std::fmt::Debug for GasCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GasCollector")
    }
}

impl prometheus_client::collector::Collector for GasCollector {
    fn encode(&self, mut e: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let v = self.0.gas_view();
        let one = |e: &mut prometheus_client::encoding::DescriptorEncoder, name: &str, help: &str, x: u64| {
            let c = ConstCounter::new(x);
            c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
        };
        one(&mut e, "pharos_fwd_client_writes", "Write requests received from clients", v.client_writes)?;
        one(
            &mut e,
            "pharos_fwd_backend_write_requests",
            "Write requests issued to the targets (one pwrite of an object each)",
            v.backend_write_requests,
        )?;
        if !v.enabled {
            return Ok(());
        }
        one(
            &mut e,
            "pharos_fwd_gas_gathered_writes",
            "Client writes gathered into a compute node's buffer",
            v.gathered,
        )?;
        one(
            &mut e,
            "pharos_fwd_gas_kept_writes",
            "Gathered socket writes kept in the buffer they arrived in (no copy)",
            v.kept,
        )?;
        one(&mut e, "pharos_fwd_gas_merged_writes", "Gathered writes merged with an adjacent buffered one", v.merged)?;
        one(&mut e, "pharos_fwd_gas_runs", "Contiguous runs written to the targets by flushes", v.runs)?;
        one(&mut e, "pharos_fwd_gas_bytes", "Bytes written to the targets by flushes", v.bytes)?;
        one(&mut e, "pharos_fwd_gas_deferred_errors", "Flushed runs whose write failed", v.deferred_errors)?;
        let g = ConstGauge::new(v.buffered_bytes as i64);
        g.encode(e.encode_descriptor(
            "pharos_fwd_gas_buffered_bytes",
            "Bytes gathered, not written yet",
            None,
            g.metric_type(),
        )?)?;
        let c0 = ConstCounter::new(0u64);
        let mut f =
            e.encode_descriptor("pharos_fwd_gas_flushes", "Buffer flushes, by reason", None, c0.metric_type())?;
        for r in REASONS {
            ConstCounter::new(v.flushes.get(r).copied().unwrap_or(0)).encode(f.encode_family(&[("reason", r)])?)?;
        }
        Ok(())
    }
}

impl Backend {
    /// Enables Gather-Arrange-Scatter (see the module doc) and starts its time-based flusher,
    /// which ends with the backend.
    pub fn enable_gas(self: &Arc<Self>, buffer_max: usize, flush_after: Duration) {
        if self.gas.set(Gas::new(buffer_max, flush_after)).is_err() {
            return;
        }
        let q = self.gas.get().unwrap().queue.clone();
        let weak: Weak<Backend> = Arc::downgrade(self);
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

    /// The write path's counters and GAS's.
    pub fn gas_view(&self) -> GasView {
        let mut v = GasView {
            client_writes: self.client_writes.load(Relaxed),
            backend_write_requests: self.data_writes.load(Relaxed),
            ..Default::default()
        };
        if let Some(g) = self.gas.get() {
            let s = &g.stats;
            v.enabled = true;
            v.gathered = s.gathered.load(Relaxed);
            v.kept = s.kept.load(Relaxed);
            v.merged = s.merged.load(Relaxed);
            v.runs = s.runs.load(Relaxed);
            v.bytes = s.bytes.load(Relaxed);
            v.deferred_errors = s.deferred_errors.load(Relaxed);
            v.buffered_bytes = g.buffered() as u64;
            v.flushes = REASONS.iter().zip(&s.flushes).map(|(r, c)| (*r, c.load(Relaxed))).collect();
        }
        v
    }

    /// Writes every gathered write to the targets (shutdown); a no-op without GAS.
    pub fn gas_flush_all(&self) {
        if let Some(g) = self.gas.get() {
            g.drain(self);
        }
    }

    /// Before a close of `l` (release): flushes its gathered writes and returns a deferred
    /// write error of the file, if any; a no-op without GAS.
    pub fn gas_close(&self, l: &Layout) -> Res<()> {
        match self.gas.get() {
            Some(g) => g.settle(self, l.oid, Reason::Close, true),
            None => Ok(()),
        }
    }

    /// Before a read of `[off, off + len)` of `oid` (see [`Gas::settle_read`]): the size the
    /// file has at least counting its writes still gathered (0 without GAS).
    pub(super) fn gas_settle_read(&self, oid: u64, off: u64, len: u64) -> u64 {
        match self.gas.get() {
            Some(g) => g.settle_read(self, oid, off, off.saturating_add(len)),
            None => 0,
        }
    }

    /// Before a stat or truncate of `oid`: its gathered writes go to the targets.
    pub(super) fn gas_settle(&self, oid: u64, why: Reason) {
        if let Some(g) = self.gas.get() {
            let _ = g.settle(self, oid, why, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testutil::*;
    use crate::backend::{pieces, Placement};
    use pharos_fwd_proto::Ctx;
    use std::sync::atomic::Ordering::Relaxed;

    fn gas_backend(targets: usize, buffer: usize, ms: u64) -> (tempfile::TempDir, Arc<Backend>) {
        let (d, b) = backend(targets);
        let b = Arc::new(b);
        b.enable_gas(buffer, Duration::from_millis(ms));
        (d, b)
    }

    #[test]
    fn interleaved_writes_of_a_node_merge_and_read_back() {
        let (_d, b) = gas_backend(2, 8 << 20, 60_000);
        b.placement.store(Arc::new(Placement {
            stripe_count: Some(2),
            stripe_size: Some(1 << 20),
            ..Default::default()
        }));
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let mut info = IoInfo::default();
        let blk = 64 << 10;
        // 8 "ranks" write their blocks round-robin, rank-major order shuffled.
        let mut want = vec![0u8; 8 * 4 * blk];
        for round in 0..4 {
            for rank in [3usize, 0, 7, 1, 5, 2, 6, 4] {
                let off = (round * 8 + rank) * blk;
                let data = vec![(round * 8 + rank) as u8 + 1; blk];
                want[off..off + blk].copy_from_slice(&data);
                b.write_from("cn0", &l, h, off as u64, &data, &mut info).unwrap();
            }
        }
        let g = b.gas.get().unwrap();
        assert_eq!(g.buffered(), want.len());
        assert_eq!(b.data_writes.load(Relaxed), 0, "nothing reached the targets yet");
        assert_eq!(b.read(&l, 0, want.len() as u32, &mut info).unwrap(), want);
        assert_eq!(g.buffered(), 0);
        // One run, split at the stripe boundary: 2 pwrites for 32 client writes.
        assert_eq!(g.stats.runs.load(Relaxed), 1);
        assert_eq!(b.data_writes.load(Relaxed), 2);
        assert_eq!(b.client_writes.load(Relaxed), 32);
    }

    #[test]
    fn a_socket_write_keeps_its_buffer_unless_it_is_much_larger() {
        let (_d, b) = gas_backend(1, 8 << 20, 60_000);
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let mut info = IoInfo::default();
        let g = b.gas.get().unwrap();
        let mut data = vec![7u8; 64 << 10];
        let at = data.as_ptr();
        b.write_owned("cn0", &l, h, 0, &mut data, &mut info).unwrap();
        assert!(data.is_empty(), "the caller got a pooled empty buffer back");
        assert_eq!(g.stats.kept.load(Relaxed), 1);
        {
            let inner = g.inner.lock().unwrap();
            let e = &inner.nodes["cn0"].files.values().next().unwrap().extents[&0];
            assert_eq!(e.chunks[0].as_ptr(), at, "the same allocation, not a copy");
        }
        // A 4 KiB write received into a 1 MiB buffer is copied: the buffer stays the caller's.
        let mut big = Vec::with_capacity(1 << 20);
        big.extend_from_slice(&[9u8; 4096]);
        b.write_owned("cn0", &l, h, 64 << 10, &mut big, &mut info).unwrap();
        assert_eq!((big.len(), g.stats.kept.load(Relaxed)), (4096, 1));
        let mut want = vec![7u8; 64 << 10];
        want.extend_from_slice(&[9u8; 4096]);
        assert_eq!(b.read(&l, 0, want.len() as u32, &mut info).unwrap(), want);
        // Without GAS the bytes are written through and the buffer stays.
        let (_d2, plain) = backend(1);
        let (_, l2, h2) = plain.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let mut data = vec![5u8; 8192];
        plain.write_owned("cn0", &l2, h2, 0, &mut data, &mut info).unwrap();
        assert_eq!(data.len(), 8192);
        assert_eq!(plain.read(&l2, 0, 8192, &mut info).unwrap(), vec![5u8; 8192]);
    }

    #[test]
    fn overlap_size_time_fsync_and_deferred_errors() {
        let (_d, b) = gas_backend(1, 64 << 10, 20);
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let mut info = IoInfo::default();
        b.write_from("a", &l, h, 0, b"aaaa", &mut info).unwrap();
        b.write_from("b", &l, h, 2, b"BB", &mut info).unwrap(); // overlaps: "aaaa" lands first
        b.fsync(&l, false, &mut info).unwrap();
        assert_eq!(b.read(&l, 0, 10, &mut info).unwrap(), b"aaBB");
        let g = b.gas.get().unwrap();
        assert_eq!(g.stats.flushes[Reason::Overlap as usize].load(Relaxed), 1);
        // Size: a node past its buffer flushes.
        b.write_from("a", &l, h, 0, &vec![1u8; 70 << 10], &mut info).unwrap();
        assert_eq!(g.buffered(), 0);
        // Time: the flusher writes a small buffer within a few periods.
        b.write_from("a", &l, h, 0, b"t", &mut info).unwrap();
        let t0 = Instant::now();
        // (The counter moves just after the buffer is taken: wait for both.)
        let timed = || g.stats.flushes[Reason::Time as usize].load(Relaxed);
        while (g.buffered() > 0 || timed() == 0) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(g.buffered(), 0);
        assert!(timed() >= 1);
        // A deferred error (the objects are gone) comes back at the file's close.
        b.unlink("f", &Ctx::default()).unwrap();
        b.release(&l, h).unwrap();
        let (_, l2, h2) = b.create("g", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let mut gone = l.clone();
        gone.oid = l2.oid ^ 1;
        b.write_from("a", &gone, h2, 0, b"x", &mut info).unwrap();
        assert!(b.gas_close(&gone).is_err());
        assert!(b.gas_close(&gone).is_ok(), "reported once");
        b.release(&l2, h2).unwrap();
    }

    #[test]
    fn oid_index_tracks_buffers_per_object() {
        let h = |id| OpenHandle { daemon: 1, id };
        let mut ix = OidIndex::default();
        ix.add(7, "a", h(1));
        ix.add(7, "a", h(1)); // once per pair
        ix.add(7, "b", h(1));
        ix.add(7, "a", h(2));
        ix.add(9, "a", h(1));
        assert_eq!(ix.get(7).len(), 3);
        assert!(ix.get(8).is_empty());
        ix.remove(7, "a", h(1));
        assert_eq!(ix.get(7), &[("b".to_string(), h(1)), ("a".to_string(), h(2))]);
        ix.remove(9, "a", h(1));
        assert!(!ix.0.contains_key(&9), "an object without buffers leaves the index");
        assert_eq!(ix.take(7).len(), 2);
        assert!(ix.0.is_empty());
    }

    #[test]
    fn index_follows_the_buffers_of_nodes_files_and_opens() {
        let (_d, b) = gas_backend(2, 8 << 20, 60_000);
        let (_, l1, h1) = b.create("f1", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let (_, l2, h2) = b.create("f2", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let mut info = IoInfo::default();
        let g = b.gas.get().unwrap();
        for (i, node) in ["a", "b", "c"].into_iter().enumerate() {
            b.write_from(node, &l1, h1, i as u64 * 100, b"x", &mut info).unwrap();
            b.write_from(node, &l2, h2, 8 + i as u64 * 100, b"y", &mut info).unwrap();
        }
        {
            let inner = g.inner.lock().unwrap();
            assert_eq!(inner.index.get(l1.oid).len(), 3, "a classic layout: one buffer per node");
            assert_eq!(inner.index.get(l2.oid).len(), 3);
        }
        // A flush of one node drops its entries only; a settle of one file drops that file's.
        g.flush(&b, Some("b"), Reason::Size);
        g.settle(&b, l1.oid, Reason::Fsync, true).unwrap();
        {
            let inner = g.inner.lock().unwrap();
            assert!(inner.index.get(l1.oid).is_empty());
            let mut left: Vec<&str> = inner.index.get(l2.oid).iter().map(|(n, _)| n.as_str()).collect();
            left.sort_unstable();
            assert_eq!(left, ["a", "c"]);
            assert_eq!(inner.total, 2);
        }
        // An overlapping write of f2 (buffered by "a" and "c") flushes f2 first, found through the index.
        b.write_from("b", &l2, h2, 208, b"z", &mut info).unwrap();
        assert_eq!(g.stats.flushes[Reason::Overlap as usize].load(Relaxed), 1);
        assert_eq!(
            b.read(&l2, 8, 201, &mut info).unwrap()[..],
            [&b"y"[..], &[0; 99], b"y", &[0; 99], b"z"].concat()[..]
        );
        assert_eq!(g.buffered(), 0);
        assert!(g.inner.lock().unwrap().index.0.is_empty());
        // Flushed buffers are reused (bounded by buffer_max) and a reused one holds the new bytes only.
        let pooled = g.pool.bufs.lock().unwrap().0.len();
        assert!(pooled > 0);
        assert!(g.pool.bufs.lock().unwrap().1 <= g.pool.max);
        b.write_from("a", &l1, h1, 0, b"new", &mut info).unwrap();
        assert_eq!(g.pool.bufs.lock().unwrap().0.len(), pooled - 1);
        assert_eq!(b.read(&l1, 0, 3, &mut info).unwrap(), b"new");
    }

    #[test]
    fn a_read_flushes_the_writes_it_overlaps_and_sees_the_size_of_the_others() {
        for stripes in [1u32, 2] {
            let (_d, b) = gas_backend(2, 8 << 20, 60_000);
            b.placement.store(Arc::new(Placement {
                stripe_count: Some(stripes),
                stripe_size: Some(4096),
                ..Default::default()
            }));
            let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
            let g = b.gas.get().unwrap();
            let mut info = IoInfo::default();
            b.write_from("a", &l, h, 0, b"abc", &mut info).unwrap();
            b.fsync(&l, false, &mut info).unwrap();
            b.write_from("a", &l, h, 10_000, b"xyz", &mut info).unwrap();
            b.write_from("b", &l, h, 1, b"B", &mut info).unwrap();
            // [0, 50): "B" lands, "xyz" stays gathered, and the bytes past the objects' end read as a hole.
            let want = [&b"aBc"[..], &[0; 47]].concat();
            assert_eq!(b.read(&l, 0, 50, &mut info).unwrap(), want, "stripes {stripes}");
            assert_eq!(g.buffered(), 3, "the write elsewhere stays gathered");
            let mut slot = [7u8; 60];
            assert_eq!(b.read_into_slice(&l, 5, &mut info, &mut slot).unwrap(), 60);
            assert_eq!(slot, [0; 60]);
            if stripes == 1 {
                assert!(b.read_span(&l, 0, 50, &mut info).unwrap().is_none(), "a hole sendfile cannot send");
            }
            // The range holding it flushes it; the end of the file is then its end.
            assert_eq!(b.read(&l, 9_998, 100, &mut info).unwrap(), b"\0\0xyz");
            assert_eq!(g.buffered(), 0);
            assert_eq!(b.read(&l, 20_000, 10, &mut info).unwrap(), b"", "past the end");
            let span = if stripes == 1 { b.read_span(&l, 0, 50, &mut info).unwrap().map(|s| s.len) } else { None };
            assert!(stripes != 1 || span == Some(50));
            assert_eq!(g.stats.flushes[Reason::Read as usize].load(Relaxed), 2);
        }
    }

    #[test]
    fn chunked_runs_write_across_stripes() {
        let (_d, b) = gas_backend(3, 1 << 20, 60_000);
        b.placement.store(Arc::new(Placement { stripe_count: Some(3), stripe_size: Some(4096), ..Default::default() }));
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let parts: Vec<Vec<u8>> =
            [3usize, 5000, 70_000, 1, 4093].iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n]).collect();
        let chunks: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let mut info = IoInfo::default();
        assert_eq!(b.write_through_chunks(&l, h, 777, &chunks, &mut info).unwrap(), 79_097);
        let want: Vec<u8> = parts.concat();
        assert_eq!(b.read(&l, 777, 100_000, &mut info).unwrap(), want);
        assert_eq!(b.data_writes.load(Relaxed), pieces(&l, 777, 79_097).len() as u64);
    }
}
