//! Which request class a worker serves next (issue 12, item 5).
//!
//! Two schedulers, chosen with `--scheduler` (`PHAROS_FWD_SCHEDULER`):
//!
//! * [`SchedulerKind::Weights`] (default): a worker takes a waiting metadata request first
//!   (issue 29: a `stat` or `create` does not wait behind data requests), but after `M`
//!   metadata requests in a row (`--weights M,S,L`, metadata 4) it tries the data classes
//!   first once, so data is never starved: under a backlog of every class, data gets at
//!   least one pick in `M + 1` of each worker. Data picks follow the smooth weighted
//!   round-robin cycle of the data weights (small 2, large 1), falling back to the other
//!   classes when the preferred one is empty.
//! * [`SchedulerKind::Raas`]: request-aware thread allocation after GVDS's RAAS (request-aware
//!   adaptive scheduling of the GVDS global virtual data space's I/O service threads). Each
//!   class `c` has a minimum of workers `min[c]` that serve it only, so a class is never
//!   without a worker however busy the others are. Every cycle (`--raas-cycle-ms`, 100 ms)
//!   the controller measures each class's average queuing delay over the cycle and hands the
//!   `workers − Σ min` extra workers out in proportion to each class's relative gap
//!   `(measured − acceptable) / acceptable` (acceptable delays per class: `--raas-delay-ms`),
//!   largest remainder first ([`allocate`]). A class within its acceptable delay gets no
//!   extra; extras no class needs are *shared* (they serve every class, metadata first).
//!   Extra workers serve their class first and then the others (no worker idles while a
//!   request waits), the minimum ones only their class.
//!
//! Both keep, per class, the queuing delay since the start and over the last cycle and the
//! worker allocation, exported on `GET /metrics` ([`Scheduler::encode_metrics`]).
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::queues::{ClassQueues, ClassWaits, QueueKind, CLASSES, CLASS_NAMES};

/// How workers pick their next request's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SchedulerKind {
    /// Fixed weights, smooth weighted round-robin (the baseline).
    #[default]
    Weights,
    /// Request-aware thread allocation (GVDS RAAS).
    Raas,
}

impl std::str::FromStr for SchedulerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "weights" => Ok(SchedulerKind::Weights),
            "raas" => Ok(SchedulerKind::Raas),
            _ => Err(format!("scheduler {s:?}: expected weights or raas")),
        }
    }
}

impl SchedulerKind {
    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::Weights => "weights",
            SchedulerKind::Raas => "raas",
        }
    }
}

/// The threading settings of the request path (issue 12, items 2 and 5).
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadsConfig {
    /// Master threads (epoll; they accept and decode every connection's requests). 0: one
    /// decoder thread per connection (`crate::masters`).
    pub masters: usize,
    /// The queues between masters and workers.
    pub queue: QueueKind,
    /// With decoder threads (`masters` 0): a request that finds nothing queued and a worker
    /// of its class asleep is served by its decoder in that worker's place.
    pub serve_inline: bool,
    /// How workers pick a class.
    pub scheduler: SchedulerKind,
    /// RAAS: workers reserved to each class (metadata, small, large).
    pub raas_min: [usize; CLASSES],
    /// RAAS: acceptable average queuing delay of each class, seconds.
    pub raas_delay_s: [f64; CLASSES],
    /// RAAS: the allocation cycle.
    pub raas_cycle: Duration,
}

impl Default for ThreadsConfig {
    fn default() -> Self {
        ThreadsConfig {
            masters: 0,
            queue: QueueKind::Lockfree,
            serve_inline: true,
            scheduler: SchedulerKind::Weights,
            raas_min: [1, 1, 1],
            raas_delay_s: [0.001, 0.005, 0.050],
            raas_cycle: Duration::from_millis(100),
        }
    }
}

impl ThreadsConfig {
    /// Checks the settings against the worker count: clear errors for the command line.
    pub fn validate(&self, workers: usize) -> Result<(), String> {
        if self.scheduler == SchedulerKind::Raas {
            let need: usize = self.raas_min.iter().sum();
            if need > workers {
                return Err(format!(
                    "--raas-min {:?} reserves {need} workers, more than --workers {workers}",
                    self.raas_min
                ));
            }
            if self.raas_min.contains(&0) {
                return Err("--raas-min: every class needs at least 1 worker".into());
            }
            if self.raas_delay_s.iter().any(|d| !(d.is_finite() && *d > 0.0)) {
                return Err("--raas-delay-ms: every class needs an acceptable delay > 0".into());
            }
            if self.raas_cycle.is_zero() {
                return Err("--raas-cycle-ms must be > 0".into());
            }
        }
        Ok(())
    }
}

/// The command-line flags of [`ThreadsConfig`] (flattened into `pharos-fwd`'s).
#[derive(clap::Args, Debug, Clone)]
pub struct ThreadsArgs {
    /// Master threads that accept connections and decode requests (epoll, LWFS paper); 0: one
    /// decoder thread per connection; 1: the single-master baseline.
    #[arg(long, env = "PHAROS_FWD_MASTERS", default_value_t = 0)]
    pub masters: usize,
    /// Queues between masters and workers: lockfree (crossbeam) or mutex (the baseline).
    #[arg(long, env = "PHAROS_FWD_QUEUE", default_value = "lockfree")]
    pub queue: QueueKind,
    /// With one decoder thread per connection (--masters 0): a request that finds nothing
    /// queued and a worker of its class asleep is served by the decoder itself, in that
    /// worker's place (as many requests in service as if the worker had been woken; one
    /// wake-up and thread switch fewer per request). Ignored with epoll masters.
    #[arg(long, env = "PHAROS_FWD_SERVE_INLINE", default_value_t = true, action = clap::ArgAction::Set)]
    pub serve_inline: bool,
    /// How workers pick a request class: weights (fixed --weights) or raas (GVDS RAAS).
    #[arg(long, env = "PHAROS_FWD_SCHEDULER", default_value = "weights")]
    pub scheduler: SchedulerKind,
    /// RAAS: workers reserved to the metadata, small-data and large-data classes.
    #[arg(long, env = "PHAROS_FWD_RAAS_MIN", default_value = "1,1,1")]
    pub raas_min: String,
    /// RAAS: acceptable average queuing delay of the three classes, ms.
    #[arg(long, env = "PHAROS_FWD_RAAS_DELAY_MS", default_value = "1,5,50")]
    pub raas_delay_ms: String,
    /// RAAS: allocation cycle, ms.
    #[arg(long, env = "PHAROS_FWD_RAAS_CYCLE_MS", default_value_t = 100)]
    pub raas_cycle_ms: u64,
}

fn three<T: std::str::FromStr>(s: &str, flag: &str) -> Result<[T; CLASSES], String> {
    let v: Vec<T> = s
        .split(',')
        .map(|x| x.trim().parse::<T>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{flag} {s:?}: expected three numbers (metadata,small,large)"))?;
    <[T; CLASSES]>::try_from(v).map_err(|_| format!("{flag} {s:?}: expected three numbers (metadata,small,large)"))
}

impl ThreadsArgs {
    /// The settings, checked against `workers` (clear errors for the command line).
    pub fn config(&self, workers: usize) -> Result<ThreadsConfig, String> {
        let delay: [f64; CLASSES] = three(&self.raas_delay_ms, "--raas-delay-ms")?;
        let c = ThreadsConfig {
            masters: self.masters,
            queue: self.queue,
            serve_inline: self.serve_inline,
            scheduler: self.scheduler,
            raas_min: three(&self.raas_min, "--raas-min")?,
            raas_delay_s: delay.map(|d| d / 1e3),
            raas_cycle: Duration::from_millis(self.raas_cycle_ms),
        };
        if c.masters > 256 {
            return Err(format!("--masters {}: at most 256", c.masters));
        }
        c.validate(workers)?;
        Ok(c)
    }
}

/// A RAAS allocation: workers per class (the minimum plus the extras handed to it) and the
/// extras no class was given (they serve every class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alloc {
    pub class: [usize; CLASSES],
    pub shared: usize,
}

/// The RAAS allocation rule (GVDS RAAS; pure). `workers` in all, `min[c]` reserved to class
/// `c` (`Σ min ≤ workers`), `acceptable[c]` and `measured[c]` the class's acceptable and
/// measured average queuing delays (seconds, `acceptable > 0`). The `workers − Σ min` extras
/// go in proportion to each class's relative gap `max(0, measured − acceptable) /
/// acceptable`, floors first, then one each by largest remainder (ties: the higher-priority
/// class, metadata first); none goes to a class within its acceptable delay, and when no class
/// is over, all extras are shared.
pub fn allocate(workers: usize, min: [usize; CLASSES], acceptable: [f64; CLASSES], measured: [f64; CLASSES]) -> Alloc {
    let base: usize = min.iter().sum();
    let extra = workers.saturating_sub(base);
    let gap: [f64; CLASSES] = std::array::from_fn(|c| {
        let g = (measured[c] - acceptable[c]) / acceptable[c];
        if g.is_finite() && g > 0.0 {
            g
        } else {
            0.0
        }
    });
    let total: f64 = gap.iter().sum();
    let mut class = min;
    if total <= 0.0 || extra == 0 {
        return Alloc { class, shared: extra };
    }
    let share: [f64; CLASSES] = std::array::from_fn(|c| extra as f64 * gap[c] / total);
    let mut given = 0;
    for c in 0..CLASSES {
        let f = share[c].floor() as usize;
        class[c] += f;
        given += f;
    }
    let mut by_rem: Vec<usize> = (0..CLASSES).filter(|&c| gap[c] > 0.0).collect();
    by_rem.sort_by(|&a, &b| {
        let (ra, rb) = (share[a] - share[a].floor(), share[b] - share[b].floor());
        rb.partial_cmp(&ra).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b))
    });
    for c in by_rem.into_iter().cycle().take(extra - given) {
        class[c] += 1;
    }
    Alloc { class, shared: 0 }
}

/// A worker's role under RAAS: serves one class only (the minimum), its class first then the
/// others, or every class (shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Reserved(usize),
    Extra(usize),
    Shared,
}

impl Role {
    fn code(self) -> u8 {
        match self {
            Role::Reserved(c) => c as u8,
            Role::Extra(c) => (CLASSES + c) as u8,
            Role::Shared => (2 * CLASSES) as u8,
        }
    }
    fn from_code(x: u8) -> Role {
        let x = x as usize;
        if x < CLASSES {
            Role::Reserved(x)
        } else if x < 2 * CLASSES {
            Role::Extra(x - CLASSES)
        } else {
            Role::Shared
        }
    }
}

/// Worker `i`'s role under `a` with `min` reserved workers: workers 0.. are the classes'
/// reserved ones in class order, then each class's extras in class order, then the shared.
pub fn roles(a: &Alloc, min: [usize; CLASSES]) -> Vec<Role> {
    let mut out = Vec::new();
    for (c, &m) in min.iter().enumerate() {
        out.extend(std::iter::repeat_n(Role::Reserved(c), m.min(a.class[c])));
    }
    for (c, &m) in min.iter().enumerate() {
        out.extend(std::iter::repeat_n(Role::Extra(c), a.class[c].saturating_sub(m)));
    }
    out.extend(std::iter::repeat_n(Role::Shared, a.shared));
    out
}

/// The classes a worker of `role` tries, in order.
pub fn order_of(role: Role) -> &'static [usize] {
    match role {
        Role::Reserved(0) => &[0],
        Role::Reserved(1) => &[1],
        Role::Reserved(_) => &[2],
        Role::Extra(0) | Role::Shared => &[0, 1, 2],
        Role::Extra(1) => &[1, 0, 2],
        Role::Extra(_) => &[2, 0, 1],
    }
}

/// The smooth weighted round-robin order of one cycle (nginx's algorithm).
pub fn wrr_cycle(w: [u32; CLASSES]) -> Vec<usize> {
    let total: i64 = w.iter().map(|&x| x as i64).sum();
    let mut cur = [0i64; CLASSES];
    let mut out = Vec::new();
    for _ in 0..total {
        for i in 0..CLASSES {
            cur[i] += w[i] as i64;
        }
        let best = (0..CLASSES).max_by_key(|&i| (cur[i], -(i as i64))).unwrap();
        cur[best] -= total;
        out.push(best);
    }
    out
}

/// The scheduler state shared by the workers and the controller.
pub struct Scheduler {
    pub cfg: ThreadsConfig,
    workers: usize,
    /// The data classes' weighted round-robin cycle (`Weights`).
    cycle: Vec<usize>,
    /// Metadata requests a worker takes in a row before it tries data first (`Weights`).
    meta_run: u32,
    /// Each worker's metadata requests taken in a row (`Weights`).
    streak: Vec<AtomicU32>,
    /// Each worker's [`Role`] (RAAS), as its code.
    roles: Vec<AtomicU8>,
    /// Per-class queuing delay since the start.
    pub waits: ClassWaits,
    /// Average queuing delay of each class over the last cycle, seconds (f64 bits).
    last_delay: [AtomicU64; CLASSES],
    /// Workers given to each class by the last allocation, and the shared ones (RAAS).
    alloc: [AtomicU64; CLASSES + 1],
    /// Allocation cycles run.
    pub cycles: AtomicU64,
}

impl Scheduler {
    pub fn new(cfg: ThreadsConfig, workers: usize, weights: [u32; CLASSES]) -> Scheduler {
        let workers = workers.max(1);
        let s = Scheduler {
            cycle: wrr_cycle([0, weights[1].max(1), weights[2].max(1)]),
            meta_run: weights[0].max(1),
            streak: (0..workers).map(|_| AtomicU32::new(0)).collect(),
            roles: (0..workers).map(|_| AtomicU8::new(Role::Shared.code())).collect(),
            waits: ClassWaits::default(),
            last_delay: Default::default(),
            alloc: Default::default(),
            cycles: AtomicU64::new(0),
            workers,
            cfg,
        };
        // Until the first cycle: no class is over its acceptable delay.
        s.apply(allocate(workers, s.cfg.raas_min, s.cfg.raas_delay_s, [0.0; CLASSES]));
        s
    }

    fn apply(&self, a: Alloc) {
        if self.cfg.scheduler != SchedulerKind::Raas {
            self.alloc[CLASSES].store(self.workers as u64, Relaxed);
            return;
        }
        for (r, role) in self.roles.iter().zip(roles(&a, self.cfg.raas_min)) {
            r.store(role.code(), Relaxed);
        }
        for c in 0..CLASSES {
            self.alloc[c].store(a.class[c] as u64, Relaxed);
        }
        self.alloc[CLASSES].store(a.shared as u64, Relaxed);
    }

    /// Worker `idx`'s next request and its class (`pos`: the worker's place in the data
    /// classes' cycle). Waits up to 200 ms, then `None` (the worker checks the stop flag).
    pub fn next<T>(&self, idx: usize, pos: &mut usize, q: &ClassQueues<T>) -> Option<(T, usize)> {
        const WAIT: Duration = Duration::from_millis(200);
        match self.cfg.scheduler {
            SchedulerKind::Weights => {
                let data = self.cycle[*pos % self.cycle.len()];
                let other = 3 - data; // the other data class (1 + 2 = 3)
                let Some(streak) = self.streak.get(idx) else {
                    return q.pop(&[data, 0, other], WAIT); // not a worker: no metadata run kept
                };
                let order = if streak.load(Relaxed) >= self.meta_run { [data, other, 0] } else { [0, data, other] };
                let got = q.pop(&order, WAIT);
                match got {
                    Some((_, 0)) => {
                        streak.fetch_add(1, Relaxed);
                    }
                    Some(_) => {
                        streak.store(0, Relaxed);
                        *pos += 1;
                    }
                    None => {}
                }
                got
            }
            SchedulerKind::Raas => {
                let role = self.roles.get(idx).map_or(Role::Shared, |r| Role::from_code(r.load(Relaxed)));
                // A role may change while the worker waits: wait one cycle at most.
                q.pop(order_of(role), WAIT.min(self.cfg.raas_cycle))
            }
        }
    }

    /// One controller cycle: the classes' average queuing delay since `prev` (the waits'
    /// snapshot then), with a class that had requests waiting and none dequeued counted as
    /// having waited the whole cycle; then, under RAAS, the new allocation.
    pub fn tick<T>(&self, prev: &mut [(u64, u64); CLASSES], elapsed: Duration, q: &ClassQueues<T>) -> [f64; CLASSES] {
        let now = self.waits.snapshot();
        let measured: [f64; CLASSES] = std::array::from_fn(|c| {
            let (dw, dn) = (now[c].0 - prev[c].0, now[c].1 - prev[c].1);
            if dn > 0 {
                dw as f64 / dn as f64 / 1e9
            } else if q.len(c) > 0 {
                elapsed.as_secs_f64()
            } else {
                0.0
            }
        });
        *prev = now;
        for (d, m) in self.last_delay.iter().zip(measured) {
            d.store(m.to_bits(), Relaxed);
        }
        self.apply(allocate(self.workers, self.cfg.raas_min, self.cfg.raas_delay_s, measured));
        self.cycles.fetch_add(1, Relaxed);
        measured
    }

    /// Runs the controller every `raas_cycle` until `stop` is set (call it on a thread of its
    /// own). Runs under both schedulers: the per-cycle delays are exported either way.
    pub fn run_controller<T>(&self, q: &ClassQueues<T>, stop: &AtomicBool) {
        let mut prev = self.waits.snapshot();
        let mut last = Instant::now();
        while !stop.load(Relaxed) {
            std::thread::sleep(self.cfg.raas_cycle);
            let now = Instant::now();
            self.tick(&mut prev, now - last, q);
            last = now;
        }
    }

    /// The settings and state for `GET /status`.
    pub fn status(&self) -> serde_json::Value {
        let snap = self.waits.snapshot();
        serde_json::json!({
            "masters": self.cfg.masters,
            "queue": self.cfg.queue.name(),
            "serve_inline": self.cfg.serve_inline && self.cfg.masters == 0,
            "scheduler": self.cfg.scheduler.name(),
            "raas_min": self.cfg.raas_min,
            "raas_delay_ms": self.cfg.raas_delay_s.map(|d| d * 1e3),
            "raas_cycle_ms": self.cfg.raas_cycle.as_millis() as u64,
            "class_workers": self.alloc.iter().map(|a| a.load(Relaxed)).collect::<Vec<_>>(),
            "class_delay_ms": self.last_delay.iter().map(|d| f64::from_bits(d.load(Relaxed)) * 1e3).collect::<Vec<_>>(),
            "class_wait_s": snap.map(|(w, _)| w as f64 / 1e9),
            "class_dequeued": snap.map(|(_, n)| n),
        })
    }

    /// The per-class metric families of `GET /metrics`: queuing delay since the start and over
    /// the last cycle, the acceptable delay, and the workers each class has now.
    pub fn encode_metrics(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        fn fam<M: EncodeMetric>(
            e: &mut DescriptorEncoder,
            name: &str,
            help: &str,
            vals: Vec<(&str, M)>,
        ) -> std::fmt::Result {
            let mut f = e.encode_descriptor(name, help, None, vals[0].1.metric_type())?;
            for (v, m) in vals {
                m.encode(f.encode_family(&[("class", v)])?)?;
            }
            Ok(())
        }
        let snap = self.waits.snapshot();
        let per = |f: &dyn Fn(usize) -> f64| -> Vec<(&str, ConstCounter<f64>)> {
            (0..CLASSES).map(|c| (CLASS_NAMES[c], ConstCounter::new(f(c)))).collect()
        };
        fam(
            e,
            "pharos_fwd_class_queue_wait_seconds",
            "Time requests waited in their class queue, summed, by class",
            per(&|c| snap[c].0 as f64 / 1e9),
        )?;
        fam(
            e,
            "pharos_fwd_class_dequeued_requests",
            "Requests that left their class queue for a worker, by class",
            per(&|c| snap[c].1 as f64),
        )?;
        let gauge = |f: &dyn Fn(usize) -> f64| -> Vec<(&str, ConstGauge<f64>)> {
            (0..CLASSES).map(|c| (CLASS_NAMES[c], ConstGauge::new(f(c)))).collect()
        };
        fam(
            e,
            "pharos_fwd_class_queue_delay_seconds",
            "Average queuing delay of a class over the last allocation cycle",
            gauge(&|c| f64::from_bits(self.last_delay[c].load(Relaxed))),
        )?;
        if self.cfg.scheduler == SchedulerKind::Raas {
            fam(
                e,
                "pharos_fwd_class_acceptable_delay_seconds",
                "Acceptable average queuing delay of a class (RAAS)",
                gauge(&|c| self.cfg.raas_delay_s[c]),
            )?;
        }
        let mut workers: Vec<(&str, ConstGauge)> =
            (0..CLASSES).map(|c| (CLASS_NAMES[c], ConstGauge::new(self.alloc[c].load(Relaxed) as i64))).collect();
        workers.push(("shared", ConstGauge::new(self.alloc[CLASSES].load(Relaxed) as i64)));
        fam(
            e,
            "pharos_fwd_class_workers",
            "Workers allocated to a class now (RAAS; shared: serve every class, all of them under fixed weights)",
            workers,
        )?;
        let info = ConstGauge::new(1i64);
        let masters = self.cfg.masters.to_string();
        let mut f = e.encode_descriptor(
            "pharos_fwd_threading",
            "Threading of the request path: masters (0: one decoder thread per connection), queue kind, scheduler",
            None,
            info.metric_type(),
        )?;
        info.encode(f.encode_family(&[
            ("masters", masters.as_str()),
            ("queue", self.cfg.queue.name()),
            ("scheduler", self.cfg.scheduler.name()),
        ])?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
