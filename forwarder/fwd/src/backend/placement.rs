//! Placement policy: the placement document ([`Placement`]: pools, per-job pools, striping),
//! the choice of targets for a new file, the placement of each component of a progressive
//! layout at its first write (component records, shared by all daemons), and the open
//! counts that rule reads.
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
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::sync::atomic::Ordering::*;

use pharos_fwd_proto::{errno, Layout, OpenHandle};
use serde::{Deserialize, Serialize};

use super::{eno, random_u64, werr, Backend, Res};

/// A placement pool: a set of targets and their planned performance (MB/s).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
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

/// Placement settings, replaced as a whole (atomically) by the admin interface.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
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

impl Backend {
    pub fn target_index(&self, name: &str) -> Option<u32> {
        self.targets.iter().position(|t| t.name == name).map(|i| i as u32)
    }

    /// Checks a placement document against the targets (unknown names are errors).
    pub fn validate_placement(&self, p: &Placement) -> Result<(), String> {
        for (name, pool) in &p.pools {
            if pool.targets.is_empty() {
                return Err(format!("pool {name}: no targets"));
            }
            for t in pool.targets.iter().chain(pool.max_perf.keys()) {
                if self.target_index(t).is_none() {
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
            if c == 0 || c as usize > self.targets.len() {
                return Err(format!("stripe_count {c} outside 1..={}", self.targets.len()));
            }
        }
        Ok(())
    }

    /// The performance-aware rule (Sunway lessons §5): the `k` candidates with the highest
    /// `max_perf / (open_count + 1)`, ties to the lower index. A candidate is `(target
    /// index, planned MB/s)`; a plan of 0 means the target's token-bucket limit (or 1 when
    /// unlimited).
    fn best_targets(&self, candidates: impl Iterator<Item = (u32, f64)>, k: usize) -> Vec<u32> {
        let mut scored: Vec<(f64, u32)> = candidates
            .map(|(i, plan)| {
                let t = &self.targets[i as usize];
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
    pub fn place(&self, job: &str) -> Layout {
        let p = self.placement.load();
        let stripe_size = p.stripe_size.unwrap_or(1 << 20);
        let pool = p.job_pools.get(job).or(p.default_pool.as_ref()).and_then(|n| p.pools.get(n));
        let oid = random_u64();
        match pool {
            Some(pool) => {
                let cands: Vec<(u32, f64)> = pool
                    .targets
                    .iter()
                    .filter_map(|n| Some((self.target_index(n)?, pool.max_perf.get(n).copied().unwrap_or(0.0))))
                    .collect();
                if let Some(cs) = pool.component_size {
                    let (targets, perf) = cands.into_iter().unzip();
                    return Layout { oid, stripe_size, targets, component_size: cs, perf };
                }
                let k = pool.stripe_count.unwrap_or(1) as usize;
                Layout::striped(oid, stripe_size, self.best_targets(cands.into_iter(), k))
            }
            None => {
                let n = self.targets.len() as u64;
                let k = p.stripe_count.unwrap_or(1).max(1) as u64;
                let first = self.rr.fetch_add(k, Relaxed);
                Layout::striped(oid, stripe_size, (0..k).map(|j| ((first + j) % n) as u32).collect())
            }
        }
    }

    /// The target of component `k` of progressive layout `l`: from the cache, else from its
    /// record; when there is none and `place` is set, chosen now by the performance-aware
    /// rule over the layout's candidates and recorded (the first record linked wins; a
    /// loser returns the winner's choice). `None`: not placed yet (and `!place`).
    pub fn component(&self, l: &Layout, k: u64, place: bool) -> Res<Option<u32>> {
        if let Some(&t) = self.comps.lock().unwrap().get(&(l.oid, k)) {
            return Ok(Some(t));
        }
        let rec = self.comp_dir(l.oid).join(k.to_string());
        let t = match fs::read_to_string(&rec) {
            Ok(text) => text.trim().parse().ok().filter(|&t: &u32| (t as usize) < self.targets.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound && place => {
                let cands = l.targets.iter().enumerate().map(|(j, &t)| (t, l.perf.get(j).copied().unwrap_or(0.0)));
                let t = self.best_targets(cands, 1)[0];
                let mut staged = tempfile::Builder::new().prefix("component-").tempfile_in(&self.tmp).map_err(werr)?;
                staged.write_all(format!("{t}\n").as_bytes()).map_err(werr)?;
                match staged.persist_noclobber(&rec) {
                    Ok(_) => Some(t),
                    // Another daemon (or thread) placed it first: its choice holds.
                    Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => return self.component(l, k, false),
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
    pub(super) fn placed(&self, l: &Layout, k: u64) -> Res<u32> {
        self.component(l, k, true)?.ok_or_else(|| eno(errno::EIO, "component not placed"))
    }

    /// Targets a classic file counts as open on from open to release (progressive files
    /// count per written component instead, see [`Backend::enter`]).
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
    pub(super) fn enter(&self, l: &Layout, h: OpenHandle, k: u64) -> Res<u32> {
        if h == OpenHandle::default() {
            return self.placed(l, k);
        }
        let mut writing = self.writing.lock().unwrap();
        if writing.get(&h) == Some(&(l.oid, k)) {
            drop(writing);
            return self.placed(l, k);
        }
        if let Some(prev) = self.counted_target(l.oid, h) {
            self.targets[prev as usize].shm.add_open(-1);
            self.set_counted_target(l.oid, h, None);
        }
        let t = self.placed(l, k)?;
        if self.set_counted_target(l.oid, h, Some(t)) {
            self.targets[t as usize].shm.add_open(1);
        }
        if writing.len() >= COMP_CACHE_MAX {
            writing.clear();
        }
        writing.insert(h, (l.oid, k));
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testutil::*;
    use crate::backend::IoInfo;
    use pharos_fwd_proto::Ctx;
    use std::sync::Arc;

    #[test]
    fn performance_aware_placement_follows_max_perf() {
        let (_d, b) = backend(3);
        let mut pools = BTreeMap::new();
        let perf: BTreeMap<String, f64> =
            [("ost0", 10.0), ("ost1", 30.0), ("ost2", 20.0)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
        pools.insert(
            "p".to_string(),
            Pool {
                targets: vec!["ost0".into(), "ost1".into(), "ost2".into()],
                max_perf: perf,
                stripe_count: None,
                component_size: None,
            },
        );
        let p = Placement { pools, default_pool: Some("p".into()), ..Default::default() };
        b.validate_placement(&p).unwrap();
        b.placement.store(Arc::new(p));
        let mut counts = [0; 3];
        for i in 0..12 {
            let (_, l, _) = b.create(&format!("f{i}"), 0o644, EXCL, 0, &Ctx::default()).unwrap();
            counts[l.targets[0] as usize] += 1;
        }
        // D'Hondt allocation of 12 files over 10:30:20.
        assert_eq!(counts, [2, 6, 4]);
        let bad = Placement { default_pool: Some("nope".into()), ..Default::default() };
        assert!(b.validate_placement(&bad).is_err());
    }

    #[test]
    fn component_size_must_be_a_positive_multiple_of_the_alignment() {
        let (_d, b) = backend(2);
        let mut bad = Placement {
            pools: [(
                "p".to_string(),
                Pool {
                    targets: vec!["ost0".into()],
                    max_perf: BTreeMap::new(),
                    stripe_count: None,
                    component_size: Some(1000),
                },
            )]
            .into(),
            ..Default::default()
        };
        assert!(b.validate_placement(&bad).is_err());
        bad.pools.get_mut("p").unwrap().component_size = Some(0);
        assert!(b.validate_placement(&bad).is_err());
    }

    #[test]
    fn sequential_writers_move_their_count_and_spread_by_performance() {
        let (d, a) = backend(3);
        let b = backend_on(&d, 3); // a second daemon on the same backend
        progressive(&a, &[10.0, 30.0, 20.0], 4096);
        let mut info = IoInfo::default();
        let mut opens = Vec::new();
        for i in 0..6 {
            let (_, l, h) = a.create(&format!("f{i}"), 0o644, EXCL, 0, &Ctx::default()).unwrap();
            // Each writer holds its first component: the rule spreads them 10:30:20.
            a.write(&l, h, 0, &[1; 100], &mut info).unwrap();
            opens.push((l, h));
        }
        assert_eq!(counts(&a), vec![1, 3, 2]);
        // Moving on to the next component moves the count (through either daemon).
        let (l0, h0) = opens[0].clone();
        let t0 = a.component(&l0, 0, false).unwrap().unwrap();
        b.write(&l0, h0, 4096, &[2; 100], &mut info).unwrap();
        let t1 = b.component(&l0, 1, false).unwrap().unwrap();
        let mut want = vec![1, 3, 2];
        want[t0 as usize] -= 1;
        want[t1 as usize] += 1;
        assert_eq!(counts(&a), want);
        // A write back on the first daemon, whose memory is stale, still moves the right count.
        a.write(&l0, h0, 0, &[3; 10], &mut info).unwrap();
        want[t1 as usize] -= 1;
        want[t0 as usize] += 1;
        assert_eq!(counts(&a), want);
        // Releases through the other daemon drop every count.
        for (l, h) in &opens {
            b.release(l, *h).unwrap();
        }
        assert_eq!(counts(&a), vec![0, 0, 0]);
        // A dead daemon's open: the start-time GC drops its count with its marker.
        let dead = backend_on(&d, 3);
        progressive(&dead, &[10.0, 30.0, 20.0], 4096);
        let (_, l, h) = dead.create("g", 0o644, EXCL, 0, &Ctx::default()).unwrap();
        dead.write(&l, h, 0, &[1; 10], &mut info).unwrap();
        assert_eq!(counts(&a).iter().sum::<i64>(), 1);
        drop(dead);
        assert_eq!(a.gc().stale_markers, 1);
        assert_eq!(counts(&a), vec![0, 0, 0]);
        // The open goes on through a live daemon, uncounted, and its release drops nothing.
        a.write(&l, h, 4096, &[1; 10], &mut info).unwrap();
        a.release(&l, h).unwrap();
        assert_eq!(counts(&a), vec![0, 0, 0]);
        assert_eq!(a.read(&l, 0, 8192, &mut info).unwrap().len(), 4096 + 10);
    }

    #[test]
    fn concurrent_component_placement_has_one_winner() {
        let d = tempfile::tempdir().unwrap();
        let daemons: Vec<Arc<Backend>> = (0..2).map(|_| Arc::new(backend_on(&d, 4))).collect();
        progressive(&daemons[0], &[10.0, 10.0, 10.0, 10.0], 4096);
        let (_, l, _) = daemons[0].create("f", 0o644, EXCL, 0, &Ctx::default()).unwrap();
        for round in 0..50u64 {
            let barrier = Arc::new(std::sync::Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let (b, l, bar) = (daemons[i % 2].clone(), l.clone(), barrier.clone());
                    // Each racer sees other counts, so their choices differ.
                    b.targets[i % 4].shm.add_open(1);
                    std::thread::spawn(move || {
                        bar.wait();
                        let mut info = IoInfo::default();
                        b.write(&l, NOH, round * 4096 + i as u64 * 512, &[i as u8 + 1; 512], &mut info).unwrap();
                        b.component(&l, round, false).unwrap().unwrap()
                    })
                })
                .collect();
            let seen: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            assert!(seen.iter().all(|&t| t == seen[0]), "round {round}: {seen:?}");
            for t in &daemons[0].targets {
                t.shm.add_open(-2);
            }
            // Every racer's bytes are in the one object.
            let mut info = IoInfo::default();
            let r = daemons[1].read(&l, round * 4096, 4096, &mut info).unwrap();
            for i in 0..8 {
                assert!(r[i * 512..(i + 1) * 512].iter().all(|&x| x == i as u8 + 1), "round {round} racer {i}");
            }
        }
        assert_eq!(fs::read_dir(d.path().join(format!("mdt/components/{:016x}", l.oid))).unwrap().count(), 50);
        assert_eq!(obj_count(&d), 50);
        assert_eq!(fs::read_dir(d.path().join("mdt/tmp")).unwrap().count(), 0, "no staged records left");
    }
}
