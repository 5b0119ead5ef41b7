//! The migration engine's scheduler thread and task runs (see the module doc of
//! `backend/migrate.rs`), and the listing of the files a request concerns.
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::layout::parse_layout;
use super::super::namespace::SwapRefused;
use super::super::{random_u64, Backend};
use super::copy::{self, Stop};
use super::journal::Entry;
use super::{Live, Migrations, State};

/// Copies redone (the file was written during the copy) before a task is deferred.
const MAX_RECOPIES: u32 = 3;

/// Time between the switch and the removal of the old objects.
const SWITCH_GRACE: Duration = Duration::from_millis(100);

/// Finished tasks kept for `GET /migrations` (the oldest go first).
const KEEP_FINISHED: usize = 10_000;

/// How a run ended.
enum Outcome {
    Done,
    /// Not switched now (the file is open, or written during every copy): retry later.
    Deferred(String),
    Failed(String),
    /// Stopped by a cancel (1) or a pin (2); copies removed.
    Stopped(u8),
}

/// The regular files (request paths) with an object on `source`, with those objects' bytes,
/// most recently modified first (newest of sidecar and objects). `paths`: only these (a
/// missing or other one is an error), else the whole namespace.
pub(super) fn files_on(b: &Backend, source: u32, paths: Option<&[String]>) -> Result<Vec<(String, u64)>, String> {
    let root = b.ns.root().to_path_buf();
    let mut found = Vec::new();
    let mut consider = |rel: String, strict: bool| -> Result<(), String> {
        let bad = |m: String| if strict { Err(m) } else { Ok(()) };
        let text = match b.ns.sidecar_text(&rel) {
            Ok(Some(t)) => t,
            Ok(None) => return bad(format!("{rel}: no such file")),
            Err(e) => return bad(format!("{rel}: {}", e.msg)),
        };
        let Some((l, _)) = parse_layout(&text) else { return bad(format!("{rel}: not a regular file")) };
        if l.is_progressive() || !l.targets.contains(&source) {
            return Ok(());
        }
        let mut mtime = std::fs::symlink_metadata(root.join(rel.trim_start_matches('/'))).map_or(0, |m| m.mtime());
        let mut bytes = 0;
        for (s, &t) in l.targets.iter().enumerate() {
            if t == source {
                if let Ok(m) = b.targets[t as usize].open_obj(l.oid, s as u64, false).and_then(|f| f.metadata()) {
                    bytes += m.len();
                    mtime = mtime.max(m.mtime());
                }
            }
        }
        found.push((mtime, rel, bytes));
        Ok(())
    };
    match paths {
        Some(ps) => {
            for p in ps {
                consider(p.clone(), true)?;
            }
        }
        None => {
            let mut dirs = vec![String::new()];
            while let Some(d) = dirs.pop() {
                let Ok(it) = std::fs::read_dir(root.join(&d)) else { continue };
                for e in it.flatten() {
                    let (Ok(ft), Some(name)) = (e.file_type(), e.file_name().to_str().map(String::from)) else {
                        continue;
                    };
                    let rel = if d.is_empty() { name } else { format!("{d}/{name}") };
                    if ft.is_dir() {
                        dirs.push(rel);
                    } else if ft.is_file() {
                        consider(format!("/{rel}"), false)?;
                    }
                }
            }
        }
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    Ok(found.into_iter().map(|(_, p, n)| (p, n)).collect())
}

impl Migrations {
    /// The scheduler: starts the tasks that may run (highest priority first, then in plan
    /// order), up to `max_active` copying at once, and reallocates the cap when that set
    /// changes. Wakes on every change and at least every 200 ms (deferred tasks' retries).
    pub(super) fn schedule_loop(self: Arc<Self>) {
        loop {
            let mut started = Vec::new();
            {
                let mut g = self.inner.lock().unwrap();
                let now = Instant::now();
                let active = g.tasks.values().filter(|t| t.v.state == State::Copying).count();
                let mut ready: Vec<(i32, u64)> = g
                    .tasks
                    .values()
                    .filter(|t| matches!(t.v.state, State::Queued | State::Deferred) && !t.v.pinned)
                    .filter(|t| t.not_before.is_none_or(|nb| nb <= now))
                    .map(|t| (t.v.priority, t.v.id))
                    .collect();
                ready.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                let room = g.settings.max_active.saturating_sub(active);
                for (_, id) in ready.into_iter().take(room) {
                    let t = g.tasks.get_mut(&id).expect("listed");
                    t.v.state = State::Copying;
                    t.v.error = None;
                    t.live = Arc::new(Live::default());
                    t.started = Some(now);
                    started.push(id);
                }
            }
            if !started.is_empty() {
                self.rebalance();
            }
            for id in started {
                let me = self.clone();
                let spawned = std::thread::Builder::new().name(format!("migrate-{id}")).spawn(move || me.run(id));
                if let Err(e) = spawned {
                    self.finish(id, Outcome::Failed(format!("thread: {e}")));
                }
            }
            let g = self.inner.lock().unwrap();
            drop(self.wake.wait_timeout(g, Duration::from_millis(200)).unwrap());
        }
    }

    /// Records how task `id`'s run ended and reallocates the cap.
    fn finish(&self, id: u64, o: Outcome) {
        let mut g = self.inner.lock().unwrap();
        let retry = Duration::from_secs_f64(g.settings.retry_s);
        if let Some(t) = g.tasks.get_mut(&id) {
            let done = t.live.bytes_done.load(Relaxed);
            if let Some(s) = t.started {
                t.v.copy_s = s.elapsed().as_secs_f64();
                t.v.achieved_mb_s = if t.v.copy_s > 0.0 { done as f64 / 1e6 / t.v.copy_s } else { 0.0 };
            }
            t.v.rate_mb_s = 0.0;
            t.v.state = match o {
                Outcome::Done => {
                    t.v.bytes_done = done;
                    t.v.bytes_left = 0;
                    State::Done
                }
                Outcome::Deferred(why) => {
                    t.v.deferrals += 1;
                    t.v.error = Some(why);
                    t.not_before = Some(Instant::now() + retry);
                    State::Deferred
                }
                Outcome::Failed(why) => {
                    t.v.error = Some(why);
                    State::Failed
                }
                Outcome::Stopped(1) => State::Cancelled,
                Outcome::Stopped(_) => State::Queued,
            };
        }
        drop(g);
        self.rebalance();
        self.wake.notify_all();
    }

    fn run(self: Arc<Self>, id: u64) {
        let o = self.run_task(id);
        self.finish(id, o);
        let mut g = self.inner.lock().unwrap();
        let done: Vec<u64> = g.tasks.values().filter(|t| t.v.state.finished()).map(|t| t.v.id).collect();
        for id in &done[..done.len().saturating_sub(KEEP_FINISHED)] {
            g.tasks.remove(id);
        }
    }

    fn run_task(&self, id: u64) -> Outcome {
        let (path, source, pool, unit, live) = {
            let g = self.inner.lock().unwrap();
            let t = &g.tasks[&id];
            (t.v.path.clone(), t.source, t.pool.clone(), t.v.unit_bytes, t.live.clone())
        };
        let b = &self.b;
        let plan = match copy::plan(b, &path, source, pool.as_deref()) {
            Ok(p) => p,
            Err(e) => return Outcome::Failed(e),
        };
        {
            let mut g = self.inner.lock().unwrap();
            if let Some(t) = g.tasks.get_mut(&id) {
                let d = plan.objects.first().map(|o| b.targets[o.2 as usize].name.clone());
                t.v.dest_target = d;
                t.v.bytes_left = plan.bytes;
            }
        }
        let mut entry = Entry {
            id: random_u64(),
            path: plan.path.clone(),
            oid: plan.oid,
            old_sidecar: plan.old_text.clone(),
            new_sidecar: plan.new_text.clone(),
            objects: plan.objects.clone(),
            switched: false,
        };
        let mut held = match self.journal.begin(&entry) {
            Ok(h) => h,
            Err(e) => return Outcome::Failed(format!("journal: {e}")),
        };
        let roll_back = |held, why: Outcome| {
            copy::remove_copies(b, &entry);
            if let Err(e) = self.journal.finish(held) {
                log::warn!("migration {id}: journal: {e}");
            }
            why
        };
        let mut recopies = 0;
        loop {
            let gen = b.gens.get(plan.oid);
            match copy::copy(b, &plan, unit, &live, &*self.io) {
                Ok(()) => {}
                Err(Stop::Asked) => return roll_back(held, Outcome::Stopped(live.stop.load(Relaxed))),
                Err(Stop::Io(e)) => return roll_back(held, Outcome::Failed(e)),
            }
            let check = || {
                if b.open_markers(plan.oid) > 0 {
                    return Err("open".to_string());
                }
                if b.gens.get(plan.oid) != gen {
                    return Err("written".to_string());
                }
                Ok(())
            };
            match b.ns.swap_layout(&plan.path, &plan.old_text, &plan.new_text, &self.tmp, &check) {
                Ok(()) => break,
                Err(SwapRefused::Check(w)) if w == "written" && recopies < MAX_RECOPIES => {
                    recopies += 1;
                    if let Some(t) = self.inner.lock().unwrap().tasks.get_mut(&id) {
                        t.v.recopies += 1;
                    }
                }
                Err(SwapRefused::Check(w)) => {
                    return roll_back(held, Outcome::Deferred(format!("file {w} during the copy")))
                }
                Err(SwapRefused::Changed(e)) | Err(SwapRefused::Io(e)) => return roll_back(held, Outcome::Failed(e)),
            }
        }
        // Every daemon reopens the file's objects from now on (none uses a removed one).
        b.moves.bump(plan.oid);
        if let Some(t) = self.inner.lock().unwrap().tasks.get_mut(&id) {
            t.v.state = State::Switched;
        }
        entry.switched = true;
        if let Err(e) = self.journal.update(&mut held, &entry) {
            // The new layout is in force: recovery would roll forward from the sidecar alone.
            log::warn!("migration {id}: journal update: {e}");
        }
        // A stat that read the old sidecar just before the rename is given time to finish
        // before the old objects go (it would count them as holes).
        std::thread::sleep(SWITCH_GRACE);
        copy::remove_sources(b, &entry);
        if let Err(e) = self.journal.finish(held) {
            log::warn!("migration {id}: journal: {e}");
        }
        Outcome::Done
    }
}
