//! Online migration of file objects off a storage target (issue 27, item 1): the Sunway
//! storage paper's remedy for anomalous storage nodes (an N-N job went from 20 to ~70 GB/s
//! once its data left them), scheduled as GVDS's multi-task data migration module (MODM)
//! does: every task is guaranteed a minimum bandwidth, the rest of a total cap goes by
//! priority ([`alloc::allocate`]), data moves in bounded units.
//!
//! A task moves the objects one file has on a source target to one destination target
//! chosen by the placement (a healthy target of the pool, not already in the layout unless
//! none is left: [`super::Placer::migration_target`]):
//! 1. a journal entry (`<mdt>/migrations/<id>.json`, fsynced, [`journal`]) names the file,
//!    its old and new sidecar texts and the objects;
//! 2. the objects are copied in units of `unit_bytes` (default 1 MiB), each unit paced by a
//!    token bucket at the task's allocated rate ([`alloc::Pacer`]), read and written through
//!    the targets' token buckets, injected latency and slowdown like client I/O, and reported
//!    as I/O records of job `migration` (the hook given to [`Migrations::start`]);
//! 3. the layout is switched: the new sidecar is renamed over the old one
//!    ([`super::namespace::SwapRefused`], `namespace/swap.rs`) under an exclusive lock of the
//!    old sidecar, and only if **no open of the file is recorded** (by any daemon) and the
//!    file's data generation ([`super::cache::DataGens`], bumped by every write and
//!    truncate) has not moved since the copy began. Writes during the copy are never lost: a
//!    moved generation means the copy is redone (up to 3 times, then the task is deferred),
//!    and an open file is never switched (an open handle carries its layout, and would go on
//!    writing to the old objects): the copy is dropped and the task is `deferred`, retried
//!    after `retry_s`. The file stays readable and writable throughout.
//! 4. the entry is marked switched (fsynced), the old objects are removed, the entry goes.
//!
//! Crash safety: a daemon killed at any point leaves the old sidecar (and objects) or the new
//! one (and its copies, complete and fsynced before the rename). At start,
//! [`Migrations::recover`] rolls each dead daemon's entry back (removes the copies) or
//! forward (removes the old objects) by the sidecar the path holds ([`journal::decide`]);
//! a rolled-back task is planned again by whoever asked for it.
//!
//! Not migrated: progressive layouts (their component records are immutable and cached by
//! every daemon), files with several hard links (one rename cannot switch all names). A
//! switch changes the sidecar's inode number (the file's `st_ino`).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::Backend;

pub mod alloc;
mod copy;
pub mod journal;
mod run;
#[cfg(test)]
mod tests;

pub use copy::Plan;

/// Reports one unit of migration I/O: (target index, plan, write?, object offset, bytes,
/// wall-clock start ns, service time).
pub type CopyIo = dyn Fn(u32, &Plan, bool, u64, u64, u64, Duration) + Send + Sync;

/// A task's state (`GET /migrations`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Queued,
    Copying,
    Switched,
    Done,
    Failed,
    Cancelled,
    Deferred,
}

impl State {
    fn finished(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }
}

/// What a running task's thread and the scheduler share.
#[derive(Default)]
pub struct Live {
    pub bytes_done: AtomicU64,
    /// Allocated rate, MB/s (f64 bits).
    rate_bits: AtomicU64,
    /// 0: run; 1: cancel (roll back); 2: pinned (roll back, stay queued).
    pub stop: AtomicU8,
}

impl Live {
    pub fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Relaxed))
    }
    fn set_rate(&self, r: f64) {
        self.rate_bits.store(r.to_bits(), Relaxed)
    }
}

/// Engine settings (`PUT /migrations`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Total cap of all migration, MB/s (10^6 bytes/s).
    pub max_total_mb_s: f64,
    /// Tasks copying at once (highest priority first).
    pub max_active: usize,
    /// Seconds before a deferred task is tried again.
    pub retry_s: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { max_total_mb_s: 200.0, max_active: 4, retry_s: 2.0 }
    }
}

/// A migration request (`POST /migrations`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Name of the target to empty.
    pub source_target: String,
    /// Request paths to consider; none: every file of the namespace.
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    /// Guaranteed MB/s per task (default 10).
    #[serde(default)]
    pub min_mb_s: Option<f64>,
    /// Ceiling MB/s per task (default none).
    #[serde(default)]
    pub max_mb_s: Option<f64>,
    #[serde(default)]
    pub priority: Option<i32>,
    /// Copy unit, bytes (default 1 MiB; 4 KiB to 64 MiB).
    #[serde(default)]
    pub unit_bytes: Option<u64>,
    /// Placement pool to choose destinations from (default: the default pool, else all).
    #[serde(default)]
    pub pool: Option<String>,
}

/// A change of a task (`PUT /migrations/{id}`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    pub pinned: Option<bool>,
    pub priority: Option<i32>,
    pub min_mb_s: Option<f64>,
    pub max_mb_s: Option<f64>,
}

/// One task as listed.
#[derive(Clone, Debug, Serialize)]
pub struct View {
    pub id: u64,
    pub path: String,
    pub source_target: String,
    pub dest_target: Option<String>,
    pub state: State,
    pub pinned: bool,
    pub priority: i32,
    pub min_mb_s: f64,
    pub max_mb_s: Option<f64>,
    pub unit_bytes: u64,
    /// Rate allocated now, MB/s (0 unless copying).
    pub rate_mb_s: f64,
    pub bytes_done: u64,
    pub bytes_left: u64,
    /// Copies redone because the file was written during them, and deferrals.
    pub recopies: u32,
    pub deferrals: u32,
    pub error: Option<String>,
    /// Seconds spent copying (the last attempt) and MB/s achieved over it.
    pub copy_s: f64,
    pub achieved_mb_s: f64,
}

struct Task {
    v: View,
    source: u32,
    pool: Option<String>,
    live: Arc<Live>,
    not_before: Option<Instant>,
    started: Option<Instant>,
}

struct Inner {
    tasks: BTreeMap<u64, Task>,
    settings: Settings,
    next_id: u64,
    /// The minimums of the copying tasks exceeded the cap at the last allocation.
    scaled: bool,
}

/// The migration engine of a daemon: its tasks, scheduler thread and journal.
pub struct Migrations {
    b: Arc<Backend>,
    inner: Mutex<Inner>,
    wake: Condvar,
    journal: journal::Journal,
    tmp: PathBuf,
    io: Box<CopyIo>,
}

impl Migrations {
    /// The engine of backend `b` (journal in `<mdt>/migrations`), its scheduler thread
    /// started; `io` receives every unit of migration I/O. Run [`Migrations::recover`] first.
    pub fn start(b: Arc<Backend>, settings: Settings, io: Box<CopyIo>) -> std::io::Result<Arc<Migrations>> {
        let tmp = b.placement.tmp_dir().to_path_buf();
        let mdt = tmp.parent().map(PathBuf::from).unwrap_or_default();
        let m = Arc::new(Migrations {
            journal: journal::Journal::open(&mdt, &tmp)?,
            b,
            inner: Mutex::new(Inner { tasks: BTreeMap::new(), settings, next_id: 1, scaled: false }),
            wake: Condvar::new(),
            tmp,
            io,
        });
        let me = m.clone();
        std::thread::Builder::new().name("migrate".into()).spawn(move || me.schedule_loop())?;
        Ok(m)
    }

    /// Recovers the journal entries of dead daemons (see the module doc); returns
    /// (rolled back, rolled forward, kept: the path holds neither layout).
    pub fn recover(b: &Backend) -> std::io::Result<(usize, usize, usize)> {
        let tmp = b.placement.tmp_dir();
        let mdt = tmp.parent().map(PathBuf::from).unwrap_or_default();
        let j = journal::Journal::open(&mdt, tmp)?;
        let (entries, bad) = j.orphans();
        for p in bad {
            log::warn!("migration journal: unreadable entry {p} left alone");
        }
        let mut n = (0, 0, 0);
        for (e, held) in entries {
            let now = b.ns.sidecar_text(&e.path).ok().flatten();
            match journal::decide(&e, now.as_deref()) {
                journal::Decision::RollBack => {
                    copy::remove_copies(b, &e);
                    n.0 += 1;
                }
                journal::Decision::RollForward => {
                    copy::remove_sources(b, &e);
                    n.1 += 1;
                }
                journal::Decision::Keep => {
                    log::warn!("migration {:016x}: {} holds neither layout; objects kept", e.id, e.path);
                    n.2 += 1;
                }
            }
            j.finish(held)?;
        }
        Ok(n)
    }

    /// Plans tasks for the files with objects on `r.source_target` (the given paths, else the
    /// whole namespace), most recently modified first; returns their ids. Errors: unknown
    /// target, bad figures.
    pub fn submit(&self, r: &Request) -> Result<Vec<u64>, String> {
        let b = &self.b;
        let source = b.target_index(&r.source_target).ok_or_else(|| format!("unknown target {}", r.source_target))?;
        let min = r.min_mb_s.unwrap_or(10.0);
        if !(min.is_finite() && min >= 0.0) || r.max_mb_s.is_some_and(|m| !(m.is_finite() && m > 0.0)) {
            return Err("min_mb_s must be >= 0 and max_mb_s > 0".into());
        }
        let unit = r.unit_bytes.unwrap_or(1 << 20);
        if !(4096..=64 << 20).contains(&unit) {
            return Err("unit_bytes must be in 4096..=67108864".into());
        }
        if let Some(p) = &r.pool {
            if !b.placement.load().pools.contains_key(p) {
                return Err(format!("unknown pool {p}"));
            }
        }
        let files = run::files_on(b, source, r.paths.as_deref())?;
        let mut g = self.inner.lock().unwrap();
        let mut ids = Vec::new();
        for (path, bytes) in files {
            let busy = g.tasks.values().any(|t| t.v.path == path && !t.v.state.finished());
            if busy {
                continue; // already being moved
            }
            let id = g.next_id;
            g.next_id += 1;
            let v = View {
                id,
                path,
                source_target: r.source_target.clone(),
                dest_target: None,
                state: State::Queued,
                pinned: false,
                priority: r.priority.unwrap_or(0),
                min_mb_s: min,
                max_mb_s: r.max_mb_s,
                unit_bytes: unit,
                rate_mb_s: 0.0,
                bytes_done: 0,
                bytes_left: bytes,
                recopies: 0,
                deferrals: 0,
                error: None,
                copy_s: 0.0,
                achieved_mb_s: 0.0,
            };
            let t = Task { v, source, pool: r.pool.clone(), live: Arc::default(), not_before: None, started: None };
            g.tasks.insert(id, t);
            ids.push(id);
        }
        drop(g);
        self.wake.notify_all();
        Ok(ids)
    }

    /// Every task, with the engine's settings and whether minimums were scaled down.
    pub fn list(&self) -> (Vec<View>, Settings, bool) {
        let g = self.inner.lock().unwrap();
        let views = g
            .tasks
            .values()
            .map(|t| {
                let mut v = t.v.clone();
                if matches!(v.state, State::Copying | State::Switched) {
                    let done = t.live.bytes_done.load(Relaxed);
                    v.bytes_done = done;
                    v.bytes_left = v.bytes_left.saturating_sub(done);
                    v.rate_mb_s = t.live.rate();
                }
                v
            })
            .collect();
        (views, g.settings.clone(), g.scaled)
    }

    /// Replaces the engine's settings.
    pub fn set_settings(&self, s: Settings) -> Result<(), String> {
        if !(s.max_total_mb_s.is_finite() && s.max_total_mb_s >= 0.0)
            || s.max_active == 0
            || s.retry_s.is_nan()
            || s.retry_s < 0.0
        {
            return Err("max_total_mb_s >= 0, max_active >= 1, retry_s >= 0".into());
        }
        self.inner.lock().unwrap().settings = s;
        self.rebalance();
        Ok(())
    }

    /// Cancels task `id`: a copying task stops at its next unit and its copies are removed;
    /// a queued or deferred one never starts. `None`: no such task; finished tasks stay.
    pub fn cancel(&self, id: u64) -> Option<State> {
        let mut g = self.inner.lock().unwrap();
        let t = g.tasks.get_mut(&id)?;
        match t.v.state {
            State::Queued | State::Deferred => t.v.state = State::Cancelled,
            State::Copying => t.live.stop.store(1, Relaxed),
            _ => {}
        }
        let s = t.v.state;
        drop(g);
        self.wake.notify_all();
        Some(s)
    }

    /// Changes task `id` (`pinned`: the file stays where it is; a copying task stops and rolls
    /// back, and the task waits, queued, until unpinned). `None`: no such task.
    pub fn change(&self, id: u64, c: &Change) -> Option<Result<View, String>> {
        let mut g = self.inner.lock().unwrap();
        let t = g.tasks.get_mut(&id)?;
        if c.min_mb_s.is_some_and(|m| !(m.is_finite() && m >= 0.0))
            || c.max_mb_s.is_some_and(|m| m.is_nan() || m <= 0.0)
        {
            return Some(Err("min_mb_s must be >= 0 and max_mb_s > 0".into()));
        }
        if let Some(p) = c.pinned {
            t.v.pinned = p;
            if p && t.v.state == State::Copying {
                t.live.stop.store(2, Relaxed);
            }
        }
        t.v.priority = c.priority.unwrap_or(t.v.priority);
        t.v.min_mb_s = c.min_mb_s.unwrap_or(t.v.min_mb_s);
        t.v.max_mb_s = c.max_mb_s.or(t.v.max_mb_s);
        let v = t.v.clone();
        drop(g);
        self.rebalance();
        self.wake.notify_all();
        Some(Ok(v))
    }

    /// Allocates the cap among the copying tasks (MODM, [`alloc::allocate`]).
    fn rebalance(&self) {
        let mut g = self.inner.lock().unwrap();
        let active: Vec<u64> = g.tasks.iter().filter(|(_, t)| t.v.state == State::Copying).map(|(&id, _)| id).collect();
        let demands: Vec<alloc::Demand> = active
            .iter()
            .map(|id| {
                let v = &g.tasks[id].v;
                alloc::Demand { min_mb_s: v.min_mb_s, priority: v.priority, max_mb_s: v.max_mb_s }
            })
            .collect();
        let a = alloc::allocate(&demands, g.settings.max_total_mb_s);
        g.scaled = a.scaled;
        for (id, r) in active.iter().zip(a.rates) {
            g.tasks[id].live.set_rate(r);
        }
    }
}
