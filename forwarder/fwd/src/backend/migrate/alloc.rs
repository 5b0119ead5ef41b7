//! Bandwidth allocation among concurrent migration tasks: the rule of GVDS's multi-task data
//! migration module (MODM, Huo et al. 2024), and the pacing that enforces a task's share.
//!
//! MODM's rule: every task is guaranteed its minimum; what is left of the total cap goes to
//! the tasks in priority order (highest first, each up to its own maximum when it has one).
//! When the minimums alone exceed the cap, the cap wins (foreground jobs keep their
//! bandwidth): every minimum is scaled down by the same factor `cap / sum(minimums)`, and
//! [`Allocation::scaled`] says so. Pure functions, no I/O.
use std::time::{Duration, Instant};

/// What one task asks for (MB/s = 10^6 bytes per second).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Demand {
    /// Guaranteed rate, MB/s (>= 0).
    pub min_mb_s: f64,
    /// Higher is served first with the remainder.
    pub priority: i32,
    /// Ceiling, MB/s; `None`: the task takes all the remainder it is offered.
    pub max_mb_s: Option<f64>,
}

/// The rates of [`allocate`], in the order of the demands.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    /// MB/s per task.
    pub rates: Vec<f64>,
    /// True when the minimums exceeded the cap and were scaled down proportionally.
    pub scaled: bool,
}

/// MODM's allocation of `cap_mb_s` (MB/s, the total for all migration) among `tasks`: each
/// gets its minimum (capped by its maximum), the remainder goes to the tasks in priority
/// order (ties: the earlier task first), each up to its maximum. When the minimums exceed
/// the cap they are scaled by `cap / sum(minimums)` and nothing is left to share. A negative
/// or non-finite figure counts as 0; a cap of 0 gives every task 0.
pub fn allocate(tasks: &[Demand], cap_mb_s: f64) -> Allocation {
    let clean = |v: f64| if v.is_finite() && v > 0.0 { v } else { 0.0 };
    let cap = clean(cap_mb_s);
    let max_of = |d: &Demand| d.max_mb_s.map(clean).unwrap_or(f64::INFINITY);
    let mins: Vec<f64> = tasks.iter().map(|d| clean(d.min_mb_s).min(max_of(d))).collect();
    let sum: f64 = mins.iter().sum();
    if sum > cap {
        let f = if sum > 0.0 { cap / sum } else { 0.0 };
        return Allocation { rates: mins.iter().map(|m| m * f).collect(), scaled: true };
    }
    let mut rates = mins;
    let mut left = cap - sum;
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.sort_by(|&a, &b| tasks[b].priority.cmp(&tasks[a].priority).then(a.cmp(&b)));
    for i in order {
        if left <= 0.0 {
            break;
        }
        let extra = (max_of(&tasks[i]) - rates[i]).max(0.0).min(left);
        rates[i] += extra;
        left -= extra;
    }
    Allocation { rates, scaled: false }
}

/// A token bucket without burst, as a virtual clock: a unit of `n` bytes may start once the
/// units before it and its own `n / rate` have elapsed, so `k` units take at least
/// `k x n / rate` from the first call. A rate change applies from the next unit; time a
/// stalled task did not use is not saved up.
#[derive(Debug)]
pub struct Pacer {
    next: Instant,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer { next: Instant::now() }
    }
}

impl Pacer {
    /// How long to wait, from `now`, before sending `bytes` at `rate_mb_s` (MB/s); books
    /// them. `None` when the rate is 0 (the task waits for an allocation).
    pub fn wait(&mut self, now: Instant, bytes: u64, rate_mb_s: f64) -> Option<Duration> {
        if !(rate_mb_s.is_finite() && rate_mb_s > 0.0) {
            return None;
        }
        self.next = self.next.max(now) + Duration::from_secs_f64(bytes as f64 / (rate_mb_s * 1e6));
        Some(self.next - now)
    }
}
