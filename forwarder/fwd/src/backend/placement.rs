//! Placement: the placement document ([`Placement`]: pools, per-job pools, striping; its
//! schema is `proto/placement/placement.schema.json`, shared with the control loop) and the
//! [`Placer`], which owns it and applies it: the choice of targets for a new file, the
//! placement of each component of a progressive layout at its first write (component
//! records, shared by all daemons), and the open counts that rule reads.
//!
//! Placement (see [`Placement`]): round-robin over all targets by default, at create; with a
//! pool, the performance-aware rule of the Sunway lessons §5: the target maximising
//! `max_perf / (open_count + 1)` among the pool's targets, at create for the whole file, or
//! per component at its first write when the pool has a `component_size`.
//!
//! `open_count` (shared, [`crate::shm`]) counts what is being written on a target: a classic
//! file counts on each of its targets from open to release; a progressive file counts, per
//! open handle, only on the target of the component that handle is writing now. The handle
//! enters a component at its first write there (count +1), leaves it when it writes another
//! component (-1 before the next one is placed, so placement sees the other writers only)
//! or at release. The counted target is kept in the handle's open marker (so a release or a
//! write arriving through another daemon after a failover decrements the right target), and
//! start-time garbage collection decrements the target of every dead daemon's marker it
//! removes. Reads do not count.
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, Guard};
use pharos_fwd_proto::{errno, Layout, OpenHandle};
use serde::{Deserialize, Serialize};

use super::layout::pieces;
use super::opens::Opens;
use super::{check_layout, eno, random_u64, target_index, werr, Res, Target};

/// A placement pool: a set of targets and their planned performance (MB/s).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    pub targets: Vec<String>,
    /// Planned MB/s per target; a target missing here uses its token-bucket limit, or 1.
    #[serde(default)]
    pub max_perf: BTreeMap<String, f64>,
    /// Targets per file (striping), default 1.
    #[serde(default)]
    pub stripe_count: Option<u32>,
    /// Bytes per component of a progressive layout (a multiple of [`COMPONENT_ALIGN`]);
    /// none = whole-file placement at create.
    #[serde(default)]
    pub component_size: Option<u64>,
}

/// Component sizes are multiples of this (bytes): the page size, so components never share
/// a page.
pub const COMPONENT_ALIGN: u64 = 4096;

/// Placement settings, replaced as a whole (atomically) by the admin interface. Unknown
/// fields are refused (a misspelled one would otherwise be dropped without a word).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    #[serde(default)]
    pub pools: BTreeMap<String, Pool>,
    /// Pool used for jobs without an entry in `job_pools`; none = round-robin.
    #[serde(default)]
    pub default_pool: Option<String>,
    /// Job id -> pool name.
    #[serde(default)]
    pub job_pools: BTreeMap<String, String>,
    /// Stripe unit, bytes (default 1 MiB).
    #[serde(default)]
    pub stripe_size: Option<u64>,
    /// Targets per file for round-robin placement (default 1).
    #[serde(default)]
    pub stripe_count: Option<u32>,
}

/// Entries of the component cache and of the per-handle table before they are cleared.
const COMP_CACHE_MAX: usize = 1 << 16;

/// The placement state of a daemon: the document in force, the round-robin cursor, the
/// component records (`<mdt>/components`) and their cache, and which component each open
/// handle of a progressive file is counted on.
pub struct Placer {
    doc: ArcSwap<Placement>,
    rr: AtomicU64,
    /// `<mdt>/components`: one directory of records per progressive file.
    comp_root: PathBuf,
    /// `<mdt>/tmp`: records are staged here, then linked into place.
    tmp: PathBuf,
    /// Resolved components (immutable records): (oid, component) -> target.
    comps: Mutex<HashMap<(u64, u64), u32>>,
    /// Component each open handle of a progressive file wrote last through this daemon (a
    /// fast path: the handle's marker holds the counted target, see [`Placer::enter`]).
    writing: Mutex<HashMap<OpenHandle, (u64, u64)>>,
}

impl Placer {
    pub(super) fn new(comp_root: PathBuf, tmp: PathBuf) -> Placer {
        Placer {
            doc: ArcSwap::from_pointee(Placement::default()),
            rr: AtomicU64::new(random_u64() % 1024),
            comp_root,
            tmp,
            comps: Mutex::new(HashMap::new()),
            writing: Mutex::new(HashMap::new()),
        }
    }

    /// The document in force.
    pub fn load(&self) -> Guard<Arc<Placement>> {
        self.doc.load()
    }

    /// The document in force, as an `Arc`.
    pub fn load_full(&self) -> Arc<Placement> {
        self.doc.load_full()
    }

    /// Replaces the document as a whole (validated by the caller: [`Placer::validate`]).
    pub fn store(&self, p: Arc<Placement>) {
        self.doc.store(p)
    }

    /// Checks a placement document against the targets (unknown names are errors).
    pub fn validate(targets: &[Target], p: &Placement) -> Result<(), String> {
        for (name, pool) in &p.pools {
            if pool.targets.is_empty() {
                return Err(format!("pool {name}: no targets"));
            }
            for t in pool.targets.iter().chain(pool.max_perf.keys()) {
                if target_index(targets, t).is_none() {
                    return Err(format!("pool {name}: unknown target {t}"));
                }
            }
            if let Some(c) = pool.stripe_count {
                if c == 0 || c as usize > pool.targets.len() {
                    return Err(format!("pool {name}: stripe_count {c} outside 1..={}", pool.targets.len()));
                }
            }
            if let Some(cs) = pool.component_size {
                if cs == 0 || cs % COMPONENT_ALIGN != 0 {
                    return Err(format!(
                        "pool {name}: component_size {cs} must be a positive multiple of {COMPONENT_ALIGN}"
                    ));
                }
                if pool.stripe_count.is_some_and(|c| c > 1) {
                    return Err(format!("pool {name}: component_size and stripe_count > 1 exclude each other"));
                }
            }
        }
        for pool in p.default_pool.iter().chain(p.job_pools.values()) {
            if !p.pools.contains_key(pool) {
                return Err(format!("unknown pool {pool}"));
            }
        }
        if p.stripe_size == Some(0) {
            return Err("stripe_size must be > 0".into());
        }
        if let Some(c) = p.stripe_count {
            if c == 0 || c as usize > targets.len() {
                return Err(format!("stripe_count {c} outside 1..={}", targets.len()));
            }
        }
        Ok(())
    }

    /// The performance-aware rule (Sunway lessons §5): the `k` candidates with the highest
    /// `max_perf / (open_count + 1)`, ties to the lower index. A candidate is `(target
    /// index, planned MB/s)`; a plan of 0 means the target's token-bucket limit (or 1 when
    /// unlimited).
    fn best_targets(targets: &[Target], candidates: impl Iterator<Item = (u32, f64)>, k: usize) -> Vec<u32> {
        let mut scored: Vec<(f64, u32)> = candidates
            .map(|(i, plan)| {
                let t = &targets[i as usize];
                let perf = if plan > 0.0 { plan } else { Some(t.shm.max_perf()).filter(|&m| m > 0.0).unwrap_or(1.0) };
                (perf / (t.shm.open_count() as f64 + 1.0), i)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().take(k.max(1)).map(|(_, i)| i).collect()
    }

    /// Chooses the layout of a new file of job `job`: round-robin, or the pool's rule for
    /// the whole file, or (pool with `component_size`) a progressive layout whose candidate
    /// targets are the pool's.
    pub fn place(&self, targets: &[Target], job: &str) -> Layout {
        let p = self.doc.load();
        let stripe_size = p.stripe_size.unwrap_or(1 << 20);
        let pool = p.job_pools.get(job).or(p.default_pool.as_ref()).and_then(|n| p.pools.get(n));
        let oid = super::layout::shared_oid(random_u64());
        match pool {
            Some(pool) => {
                let cands: Vec<(u32, f64)> = pool
                    .targets
                    .iter()
                    .filter_map(|n| Some((target_index(targets, n)?, pool.max_perf.get(n).copied().unwrap_or(0.0))))
                    .collect();
                if let Some(cs) = pool.component_size {
                    let (targets, perf) = cands.into_iter().unzip();
                    return Layout { oid, stripe_size, targets, component_size: cs, perf };
                }
                let k = pool.stripe_count.unwrap_or(1) as usize;
                Layout::striped(oid, stripe_size, Self::best_targets(targets, cands.into_iter(), k))
            }
            None => {
                let n = targets.len() as u64;
                let k = p.stripe_count.unwrap_or(1).max(1) as u64;
                let first = self.rr.fetch_add(k, Relaxed);
                Layout::striped(oid, stripe_size, (0..k).map(|j| ((first + j) % n) as u32).collect())
            }
        }
    }

    /// The destination of objects migrating off target `source` (online migration,
    /// `backend/migrate.rs`) for a file whose layout uses `in_layout`: by the
    /// performance-aware rule among the healthy targets (no injected slowdown) of pool `pool`
    /// (else the default pool, else all targets) other than `source`, preferring targets not
    /// in the layout; `None` when no such target exists or the pool is unknown.
    pub fn migration_target(
        &self,
        targets: &[Target],
        in_layout: &[u32],
        source: u32,
        pool: Option<&str>,
    ) -> Option<u32> {
        let p = self.doc.load();
        let names: Vec<u32> = match pool.or(p.default_pool.as_deref()) {
            Some(n) => {
                let pool = p.pools.get(n)?;
                pool.targets.iter().filter_map(|t| target_index(targets, t)).collect()
            }
            None => (0..targets.len() as u32).collect(),
        };
        let plan = |i: u32| -> f64 {
            let name = &targets[i as usize].name;
            pool.or(p.default_pool.as_deref()).and_then(|n| p.pools.get(n)?.max_perf.get(name).copied()).unwrap_or(0.0)
        };
        let ok = |i: &u32| *i != source && targets[*i as usize].shm.slowdown() <= 1.0;
        let fresh: Vec<(u32, f64)> =
            names.iter().copied().filter(|i| ok(i) && !in_layout.contains(i)).map(|i| (i, plan(i))).collect();
        let cands =
            if fresh.is_empty() { names.iter().copied().filter(ok).map(|i| (i, plan(i))).collect() } else { fresh };
        if cands.is_empty() {
            return None;
        }
        Self::best_targets(targets, cands.into_iter(), 1).first().copied()
    }

    /// `<mdt>/tmp`, where records, sidecars and journal entries are staged.
    pub(super) fn tmp_dir(&self) -> &std::path::Path {
        &self.tmp
    }

    /// The directory of the component records of progressive file `oid`.
    pub(super) fn comp_dir(&self, oid: u64) -> PathBuf {
        self.comp_root.join(format!("{oid:016x}"))
    }

    /// The target of component `k` of progressive layout `l`: from the cache, else from its
    /// record; when there is none and `place` is set, chosen now by the performance-aware
    /// rule over the layout's candidates and recorded (the first record linked wins; a
    /// loser returns the winner's choice). `None`: not placed yet (and `!place`).
    pub fn component(&self, targets: &[Target], l: &Layout, k: u64, place: bool) -> Res<Option<u32>> {
        if let Some(&t) = self.comps.lock().unwrap().get(&(l.oid, k)) {
            return Ok(Some(t));
        }
        let rec = self.comp_dir(l.oid).join(k.to_string());
        let t = match fs::read_to_string(&rec) {
            Ok(text) => text.trim().parse().ok().filter(|&t: &u32| (t as usize) < targets.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound && place => {
                let cands = l.targets.iter().enumerate().map(|(j, &t)| (t, l.perf.get(j).copied().unwrap_or(0.0)));
                let t = Self::best_targets(targets, cands, 1)[0];
                let mut staged = tempfile::Builder::new().prefix("component-").tempfile_in(&self.tmp).map_err(werr)?;
                staged.write_all(format!("{t}\n").as_bytes()).map_err(werr)?;
                match staged.persist_noclobber(&rec) {
                    Ok(_) => Some(t),
                    // Another daemon (or thread) placed it first: its choice holds.
                    Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => {
                        return self.component(targets, l, k, false)
                    }
                    // No component directory: the file's objects were deleted.
                    Err(e) => return Err(werr(e.error)),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(werr(e)),
        };
        let t = t.ok_or_else(|| eno(errno::EIO, format!("corrupt component record {}", rec.display())))?;
        let mut m = self.comps.lock().unwrap();
        if m.len() >= COMP_CACHE_MAX {
            m.clear();
        }
        m.insert((l.oid, k), t);
        Ok(Some(t))
    }

    /// The target of component `k`, placing it if needed.
    pub(super) fn placed(&self, targets: &[Target], l: &Layout, k: u64) -> Res<u32> {
        self.component(targets, l, k, true)?.ok_or_else(|| eno(errno::EIO, "component not placed"))
    }

    /// The data objects a layout may have, as (object index, target): every stripe of a
    /// classic layout; the recorded components of a progressive one (whose objects may
    /// still be missing).
    pub(super) fn objects(&self, targets: &[Target], l: &Layout) -> Res<Vec<(u64, u32)>> {
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
            if let Some(t) = self.component(targets, l, k, false)? {
                out.push((k, t));
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Target of the first byte of `l`, as far as known without I/O (records, metrics).
    pub fn first_target(&self, targets: &[Target], l: &Layout, off: u64) -> Option<u32> {
        check_layout(targets, l).ok()?;
        let pc = pieces(l, off, 1).pop()?;
        if l.is_progressive() {
            self.comps.lock().unwrap().get(&(l.oid, pc.obj)).copied()
        } else {
            l.targets.get(pc.obj as usize).copied()
        }
    }

    /// The objects of progressive file `oid` are gone: its records and their cache go too.
    pub(super) fn forget(&self, oid: u64) {
        let _ = fs::remove_dir_all(self.comp_dir(oid));
        self.comps.lock().unwrap().retain(|&(o, _), _| o != oid);
    }

    /// Targets a classic file counts as open on from open to release (progressive files
    /// count per written component instead, see [`Placer::enter`]).
    pub(super) fn whole_file_targets(l: &Layout) -> &[u32] {
        if l.is_progressive() {
            &[]
        } else {
            &l.targets
        }
    }

    /// Open `h` of progressive file `l` is about to write component `k`: returns its target
    /// (placing the component if needed) and moves the handle's open count there. The count
    /// of the component it wrote before (from its marker, wherever that was) is dropped
    /// first, so the placement sees the other writers only. `h` = default (no handle):
    /// placement without counting.
    pub(super) fn enter(&self, targets: &[Target], opens: &Opens, l: &Layout, h: OpenHandle, k: u64) -> Res<u32> {
        if h == OpenHandle::default() {
            return self.placed(targets, l, k);
        }
        let mut writing = self.writing.lock().unwrap();
        if writing.get(&h) == Some(&(l.oid, k)) {
            drop(writing);
            return self.placed(targets, l, k);
        }
        if let Some(prev) = opens.counted_target(l.oid, h) {
            targets[prev as usize].shm.add_open(-1);
            opens.set_counted_target(l.oid, h, None);
        }
        let t = self.placed(targets, l, k)?;
        if opens.set_counted_target(l.oid, h, Some(t)) {
            targets[t as usize].shm.add_open(1);
        }
        if writing.len() >= COMP_CACHE_MAX {
            writing.clear();
        }
        writing.insert(h, (l.oid, k));
        Ok(t)
    }

    /// Open `h` of progressive file `l` is released (through whichever daemon served it):
    /// it leaves the component it was counted on.
    pub(super) fn leave(&self, targets: &[Target], opens: &Opens, l: &Layout, h: OpenHandle) {
        let mut writing = self.writing.lock().unwrap();
        writing.remove(&h);
        if let Some(t) = opens.counted_target(l.oid, h) {
            opens.set_counted_target(l.oid, h, None);
            targets[t as usize].shm.add_open(-1);
        }
    }
}

#[cfg(test)]
mod tests;
