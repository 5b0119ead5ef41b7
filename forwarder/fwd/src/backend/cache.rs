//! A bounded page cache of file data on the forwarding node (issue 12, item 4), with two
//! replacement policies of the same size:
//!
//! * [`Policy::FgfLru`], **fine-grained-first LRU** (Li & Sun, FGF-LRU): every page remembers
//!   the granularity of the access that brought it in (or last touched it with a
//!   fine-grained access). Two LRU lists: *coarse* and *fine*. A page brought in by a
//!   coarse-grained request (more than `fine_max` bytes) goes to the head of the coarse list;
//!   one brought in or hit by a fine-grained request goes to the head of the fine list; a
//!   coarse hit refreshes a page inside its own list. Victims come from the tail of the
//!   coarse list first and from the fine list only when no coarse page is left: pages of
//!   small requests, which are the expensive ones to fetch again (one round trip per few KiB)
//!   and the ones re-read (indexes, headers, small records), stay longer than pages streamed
//!   by large requests.
//! * [`Policy::Lru`], the baseline: Linux's two-list LRU. New pages go to the head of the
//!   *inactive* list; a hit on an inactive page promotes it to the head of the *active* list;
//!   the active list holds at most half of the pages (its tail is demoted to the head of the
//!   inactive list); victims come from the tail of the inactive list.
//!
//! Pages are [`PAGE`] = 4 KiB of a file's logical bytes (the fine-grained unit and the host's
//! page size), keyed by (object id, page index), so one cache serves every layout. The last
//! page of a file may be partial (it ends at the size the file had when it was read).
//!
//! Coherence (the mount promises "no client data cache": a read after a write sees the
//! write): a write through this daemon invalidates the pages it overlaps, and a partial last
//! page it extends; truncate and object removal invalidate every page of the file. A read
//! that fetched pages inserts them only if no invalidation of that file happened since it
//! started (a per-file generation), so a racing write never leaves stale pages. Writes that
//! reach the targets through *another* daemon (a job moved to another forwarding node, a file
//! served by two) are seen through the site's shared data generations ([`DataGens`],
//! `cache/gens.rs`): a file's pages remember the generation they were read at and are dropped
//! when a read finds it changed.
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use pharos_fwd_proto::Layout;

use super::{Backend, IoInfo, Res};

mod gens;
pub use gens::DataGens;

/// Page size of the cache, bytes.
pub const PAGE: u64 = 4096;

/// Replacement policy of the forwarding node's page cache (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Fine-grained-first LRU (Li & Sun): coarse pages are evicted first.
    FgfLru,
    /// Linux's active/inactive two-list LRU (the baseline).
    Lru,
}

impl Policy {
    /// The name used by the `--cache-policy` flag and the metrics' `policy` label.
    pub fn name(self) -> &'static str {
        match self {
            Policy::FgfLru => "fgf-lru",
            Policy::Lru => "lru",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s {
            "fgf-lru" | "fgf" => Ok(Policy::FgfLru),
            "lru" => Ok(Policy::Lru),
            _ => Err(format!("unknown cache policy {s:?}: expected fgf-lru or lru")),
        }
    }
}

/// List 0 is evicted first: the coarse list (FGF-LRU) or the inactive list (LRU).
const LOW: usize = 0;
/// List 1: the fine list (FGF-LRU) or the active list (LRU).
const HIGH: usize = 1;
const NIL: u32 = u32::MAX;
const GENS: usize = 1024;

struct Node {
    key: (u64, u64),
    data: Box<[u8]>,
    list: usize,
    prev: u32,
    next: u32,
}

#[derive(Default)]
struct Inner {
    map: HashMap<(u64, u64), u32>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    head: [u32; 2],
    tail: [u32; 2],
    len: [usize; 2],
    /// Cached page indices of each object (invalidation by file).
    by_oid: HashMap<u64, BTreeSet<u64>>,
    /// Invalidation generations, by object id modulo [`GENS`].
    gens: Vec<u64>,
    /// The shared data generation ([`DataGens`]) each cached file's pages are valid at.
    seen: HashMap<u64, u64>,
}

impl Inner {
    fn new() -> Inner {
        Inner { head: [NIL; 2], tail: [NIL; 2], gens: vec![0; GENS], ..Default::default() }
    }

    fn unlink(&mut self, i: u32) {
        let (list, prev, next) = {
            let n = &self.nodes[i as usize];
            (n.list, n.prev, n.next)
        };
        if prev == NIL {
            self.head[list] = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail[list] = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        self.len[list] -= 1;
    }

    fn push_head(&mut self, i: u32, list: usize) {
        let old = self.head[list];
        {
            let n = &mut self.nodes[i as usize];
            n.list = list;
            n.prev = NIL;
            n.next = old;
        }
        if old == NIL {
            self.tail[list] = i;
        } else {
            self.nodes[old as usize].prev = i;
        }
        self.head[list] = i;
        self.len[list] += 1;
    }

    /// Takes page `i` out of the cache; returns its buffer.
    fn remove(&mut self, i: u32) -> Box<[u8]> {
        self.unlink(i);
        let key = self.nodes[i as usize].key;
        self.map.remove(&key);
        if let Some(s) = self.by_oid.get_mut(&key.0) {
            s.remove(&key.1);
            if s.is_empty() {
                self.by_oid.remove(&key.0);
                self.seen.remove(&key.0);
            }
        }
        self.free.push(i);
        std::mem::take(&mut self.nodes[i as usize].data)
    }

    fn total(&self) -> usize {
        self.len[LOW] + self.len[HIGH]
    }
}

/// Counters of the cache since the start (GET /metrics).
#[derive(Default)]
pub struct CacheStats {
    /// Pages found in the cache / not found, over all reads.
    pub page_hits: AtomicU64,
    pub page_misses: AtomicU64,
    /// Read requests served wholly from the cache / not, by grain (0 fine, 1 coarse).
    pub req_hits: [AtomicU64; 2],
    pub req_misses: [AtomicU64; 2],
    /// Pages evicted to make room.
    pub evictions: AtomicU64,
    /// Pages dropped by writes, truncates and object removals.
    pub invalidations: AtomicU64,
    /// Pages fetched but not inserted because the file changed meanwhile.
    pub stale_fills: AtomicU64,
}

/// A snapshot of the cache's counters and occupancy.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CacheView {
    pub policy: &'static str,
    pub capacity_pages: u64,
    pub page_bytes: u64,
    pub fine_max: u64,
    pub pages: u64,
    /// Pages on the fine (FGF-LRU) or active (LRU) list.
    pub pages_high: u64,
    pub page_hits: u64,
    pub page_misses: u64,
    pub fine_hits: u64,
    pub fine_misses: u64,
    pub coarse_hits: u64,
    pub coarse_misses: u64,
    pub evictions: u64,
    pub invalidations: u64,
    pub stale_fills: u64,
}

/// The forwarding node's page cache: at most `capacity` pages of [`PAGE`] bytes, replaced by
/// `policy` (Li & Sun's FGF-LRU, or Linux's two-list LRU as the baseline); requests of at
/// most `fine_max` bytes are fine-grained.
pub struct PageCache {
    pub policy: Policy,
    pub capacity: usize,
    pub fine_max: u64,
    inner: Mutex<Inner>,
    pub stats: CacheStats,
}

impl PageCache {
    /// A cache of `mib` MiB (at least one page).
    pub fn new(mib: u64, policy: Policy, fine_max: u64) -> PageCache {
        let capacity = ((mib << 20) / PAGE).max(1) as usize;
        PageCache { policy, capacity, fine_max, inner: Mutex::new(Inner::new()), stats: CacheStats::default() }
    }

    /// Whether a request of `size` bytes is fine-grained.
    pub fn is_fine(&self, size: u64) -> bool {
        size <= self.fine_max
    }

    /// The invalidation generation of `oid` (see [`PageCache::insert`]).
    pub fn generation(&self, oid: u64) -> u64 {
        self.inner.lock().unwrap().gens[(oid % GENS as u64) as usize]
    }

    /// Before a read of `oid`, whose shared data generation is `shared` now: drops its pages
    /// when they were cached at another one (a daemon changed the file since). Returns the
    /// file's invalidation generation for [`PageCache::insert`].
    pub fn revalidate(&self, oid: u64, shared: u64) -> u64 {
        let mut g = self.inner.lock().unwrap();
        if g.seen.get(&oid).is_some_and(|&s| s != shared) {
            self.drop_file(&mut g, oid);
        }
        g.gens[(oid % GENS as u64) as usize]
    }

    /// This daemon changed the data of `oid` (`range`: a write of `[off, off+len)`; `None`:
    /// a truncate or removal), now on the targets: bumps the shared generation and drops the
    /// pages the change touched (the file's others stay valid at the new generation, unless
    /// another daemon changed the file too).
    pub fn changed(&self, oid: u64, range: Option<(u64, u64)>, gens: &DataGens) {
        let mut g = self.inner.lock().unwrap();
        let before = gens.bump(oid);
        if let Some(s) = g.seen.get_mut(&oid).filter(|s| **s == before) {
            *s = before + 1;
        }
        match range {
            Some((off, len)) => self.drop_range(&mut g, oid, off, len),
            None => self.drop_file(&mut g, oid),
        }
    }

    /// Copies pages `first..first+n` of `oid` into `out` (appended) if every one of them is
    /// cached; a partial page ends the copy (the end of the file). Counts the pages and the
    /// request, and refreshes the pages by the policy. Returns whether it was a hit.
    pub fn lookup(&self, oid: u64, first: u64, n: u64, fine: bool, out: &mut Vec<u8>) -> bool {
        let mut g = self.inner.lock().unwrap();
        let mut idx = Vec::with_capacity(n as usize);
        let mut hits = 0u64;
        for p in first..first + n {
            if let Some(&i) = g.map.get(&(oid, p)) {
                hits += 1;
                idx.push(i);
            } else {
                break;
            }
        }
        let all = hits == n;
        // Pages after the first miss are fetched again with it: they count as misses.
        self.stats.page_hits.fetch_add(hits, Relaxed);
        self.stats.page_misses.fetch_add(n - hits, Relaxed);
        let grain = if fine { 0 } else { 1 };
        if all {
            self.stats.req_hits[grain].fetch_add(1, Relaxed);
            for &i in &idx {
                let d = &g.nodes[i as usize].data;
                out.extend_from_slice(d);
                if (d.len() as u64) < PAGE {
                    break;
                }
            }
        } else {
            self.stats.req_misses[grain].fetch_add(1, Relaxed);
        }
        for &i in &idx {
            self.touch(&mut g, i, fine);
        }
        all
    }

    fn touch(&self, g: &mut Inner, i: u32, fine: bool) {
        let list = g.nodes[i as usize].list;
        let to = match self.policy {
            Policy::FgfLru if fine => HIGH,
            Policy::FgfLru => list,
            Policy::Lru => HIGH,
        };
        g.unlink(i);
        g.push_head(i, to);
        if self.policy == Policy::Lru {
            // The active list holds at most half of the cache.
            while g.len[HIGH] > (self.capacity / 2).max(1) {
                let t = g.tail[HIGH];
                g.unlink(t);
                g.push_head(t, LOW);
            }
        }
    }

    /// Inserts the pages of `data`, which holds the bytes of `oid` from page `first` on (the
    /// last page may be partial: the end of the file; empty pages are not cached), fetched by
    /// a request of the given grain, unless the file was invalidated since generation `gen`.
    /// Pages already cached are left as they are (they were refreshed by the lookup). `shared`:
    /// the file's shared data generation before the bytes were read.
    pub fn insert(&self, oid: u64, first: u64, data: &[u8], fine: bool, gen: u64, shared: u64) {
        let mut g = self.inner.lock().unwrap();
        if g.gens[(oid % GENS as u64) as usize] != gen {
            self.stats.stale_fills.fetch_add(data.len().div_ceil(PAGE as usize) as u64, Relaxed);
            return;
        }
        g.seen.entry(oid).or_insert(shared);
        for (k, chunk) in data.chunks(PAGE as usize).enumerate() {
            let key = (oid, first + k as u64);
            if g.map.contains_key(&key) {
                continue;
            }
            let mut buf: Option<Box<[u8]>> = None;
            while g.total() >= self.capacity {
                let list = if g.tail[LOW] != NIL { LOW } else { HIGH };
                let victim = g.tail[list];
                buf = Some(g.remove(victim));
                self.stats.evictions.fetch_add(1, Relaxed);
            }
            let data: Box<[u8]> = match buf {
                Some(mut b) if b.len() == chunk.len() => {
                    b.copy_from_slice(chunk);
                    b
                }
                _ => chunk.into(),
            };
            let node = Node { key, data, list: LOW, prev: NIL, next: NIL };
            let i = match g.free.pop() {
                Some(i) => {
                    g.nodes[i as usize] = node;
                    i
                }
                None => {
                    g.nodes.push(node);
                    (g.nodes.len() - 1) as u32
                }
            };
            let list = match self.policy {
                Policy::FgfLru if fine => HIGH,
                _ => LOW,
            };
            g.push_head(i, list);
            g.map.insert(key, i);
            g.by_oid.entry(oid).or_default().insert(key.1);
        }
    }

    /// A write of `[off, off+len)` to `oid` went (or is going) to the targets: drops the
    /// pages it overlaps and a partial last page it extends; bumps the file's generation.
    pub fn invalidate_range(&self, oid: u64, off: u64, len: u64) {
        let mut g = self.inner.lock().unwrap();
        self.drop_range(&mut g, oid, off, len);
    }

    fn drop_range(&self, g: &mut Inner, oid: u64, off: u64, len: u64) {
        g.gens[(oid % GENS as u64) as usize] += 1;
        let Some(set) = g.by_oid.get(&oid) else { return };
        let end = off + len;
        let (a, b) = (off / PAGE, end.div_ceil(PAGE));
        let mut drop: Vec<u64> = set.range(a..b).copied().collect();
        // The last cached page ends the file when partial: a write past it changes its bytes.
        if let Some(&last) = set.iter().next_back() {
            if last < a {
                let i = g.map[&(oid, last)];
                if (g.nodes[i as usize].data.len() as u64) < PAGE {
                    drop.push(last);
                }
            }
        }
        for p in drop {
            if let Some(i) = g.map.get(&(oid, p)).copied() {
                g.remove(i);
                self.stats.invalidations.fetch_add(1, Relaxed);
            }
        }
    }

    /// Drops every page of `oid` (truncate, object removal) and bumps its generation.
    pub fn invalidate_file(&self, oid: u64) {
        let mut g = self.inner.lock().unwrap();
        self.drop_file(&mut g, oid);
    }

    fn drop_file(&self, g: &mut Inner, oid: u64) {
        g.gens[(oid % GENS as u64) as usize] += 1;
        let Some(set) = g.by_oid.get(&oid) else { return };
        let pages: Vec<u64> = set.iter().copied().collect();
        for p in pages {
            if let Some(i) = g.map.get(&(oid, p)).copied() {
                g.remove(i);
                self.stats.invalidations.fetch_add(1, Relaxed);
            }
        }
    }

    /// The counters and occupancy now.
    pub fn view(&self) -> CacheView {
        let g = self.inner.lock().unwrap();
        let s = &self.stats;
        CacheView {
            policy: self.policy.name(),
            capacity_pages: self.capacity as u64,
            page_bytes: PAGE,
            fine_max: self.fine_max,
            pages: g.total() as u64,
            pages_high: g.len[HIGH] as u64,
            page_hits: s.page_hits.load(Relaxed),
            page_misses: s.page_misses.load(Relaxed),
            fine_hits: s.req_hits[0].load(Relaxed),
            fine_misses: s.req_misses[0].load(Relaxed),
            coarse_hits: s.req_hits[1].load(Relaxed),
            coarse_misses: s.req_misses[1].load(Relaxed),
            evictions: s.evictions.load(Relaxed),
            invalidations: s.invalidations.load(Relaxed),
            stale_fills: s.stale_fills.load(Relaxed),
        }
    }
}

/// The cache's counters in `GET /metrics` (every family labelled with the policy), read at
/// each scrape; nothing is exported while the cache is off.
pub struct CacheCollector(pub std::sync::Arc<Backend>);

impl std::fmt::Debug for CacheCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheCollector")
    }
}

impl prometheus_client::collector::Collector for CacheCollector {
    fn encode(&self, mut e: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some(c) = self.0.cache.get() else { return Ok(()) };
        let v = c.view();
        let p = v.policy;
        let n = ConstCounter::new;
        let fam = |e: &mut prometheus_client::encoding::DescriptorEncoder,
                   name: &str,
                   help: &str,
                   rows: &[(&[(&str, &str)], u64)],
                   gauge: bool|
         -> std::fmt::Result {
            let ty = if gauge { ConstGauge::new(0i64).metric_type() } else { n(0u64).metric_type() };
            let mut f = e.encode_descriptor(name, help, None, ty)?;
            for (labels, x) in rows {
                let mut l: Vec<(&str, &str)> = vec![("policy", p)];
                l.extend_from_slice(labels);
                let enc = f.encode_family(&l)?;
                if gauge {
                    ConstGauge::new(*x as i64).encode(enc)?;
                } else {
                    n(*x).encode(enc)?;
                }
            }
            Ok(())
        };
        fam(
            &mut e,
            "pharos_fwd_cache_page_lookups",
            "Page-cache page lookups of reads, by result (pages after a request's first miss count as misses)",
            &[(&[("result", "hit")], v.page_hits), (&[("result", "miss")], v.page_misses)],
            false,
        )?;
        fam(
            &mut e,
            "pharos_fwd_cache_requests",
            "Reads through the page cache by grain (fine: at most fine_max bytes) and result (hit: every page cached)",
            &[
                (&[("grain", "fine"), ("result", "hit")], v.fine_hits),
                (&[("grain", "fine"), ("result", "miss")], v.fine_misses),
                (&[("grain", "coarse"), ("result", "hit")], v.coarse_hits),
                (&[("grain", "coarse"), ("result", "miss")], v.coarse_misses),
            ],
            false,
        )?;
        fam(&mut e, "pharos_fwd_cache_evictions", "Pages evicted to make room", &[(&[], v.evictions)], false)?;
        fam(
            &mut e,
            "pharos_fwd_cache_invalidations",
            "Pages dropped by writes, truncates and removals",
            &[(&[], v.invalidations)],
            false,
        )?;
        fam(
            &mut e,
            "pharos_fwd_cache_stale_fills",
            "Fetched pages not cached because the file changed meanwhile",
            &[(&[], v.stale_fills)],
            false,
        )?;
        fam(
            &mut e,
            "pharos_fwd_cache_pages",
            "Pages cached now, by list (high: fine for fgf-lru, active for lru)",
            &[(&[("list", "high")], v.pages_high), (&[("list", "low")], v.pages - v.pages_high)],
            true,
        )?;
        fam(
            &mut e,
            "pharos_fwd_cache_capacity_pages",
            "Capacity of the page cache, 4 KiB pages",
            &[(&[], v.capacity_pages)],
            true,
        )
    }
}

thread_local! {
    /// Page-aligned bytes fetched for a cache miss (reused by the worker thread).
    static FILL: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl PageCache {
    /// A read of backend `b` through this cache: the pages covering `[off, off+size)` come
    /// from the cache when all are there; otherwise the page-aligned range is read from the
    /// targets ([`super::DataPath::read_direct`]) once, its missing pages are inserted (fine
    /// or coarse by the request's size) and the requested bytes are copied out.
    pub(super) fn read_through(
        &self,
        b: &Backend,
        l: &Layout,
        off: u64,
        size: u32,
        info: &mut IoInfo,
        buf: &mut Vec<u8>,
    ) -> Res<()> {
        let end = off.checked_add(size as u64).ok_or_else(|| super::eno(pharos_fwd_proto::errno::EINVAL, "offset"))?;
        let (first, last) = (off / PAGE, end.div_ceil(PAGE));
        let fine = self.is_fine(size as u64);
        let skip = (off - first * PAGE) as usize;
        let shared = b.gens.get(l.oid);
        let gen = self.revalidate(l.oid, shared);
        info.oid = l.oid;
        FILL.with(|fill| {
            let mut fill = fill.borrow_mut();
            fill.clear();
            if !self.lookup(l.oid, first, last - first, fine, &mut fill) {
                fill.clear();
                let span = ((last - first) * PAGE).min(u32::MAX as u64) as u32;
                b.data.read_direct(b, l, first * PAGE, span, info, &mut fill)?;
                self.insert(l.oid, first, &fill, fine, gen, shared);
            }
            // A hit touches no target: the request's record names none, and the targets'
            // metrics (which placement reads) do not count it.
            let have = fill.len().saturating_sub(skip).min(size as usize);
            buf.clear();
            buf.extend_from_slice(&fill[skip.min(fill.len())..skip.min(fill.len()) + have]);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests;
