//! The daemon's per-class request queues between the masters and the workers (issue 12,
//! item 2; the LWFS master/slave optimisation paper: wait-free queues between a
//! multi-threaded master and the workers).
//!
//! Two kinds, chosen with `--queue` (`PHAROS_FWD_QUEUE`):
//!
//! * [`QueueKind::Lockfree`] (default): one bounded crossbeam channel per class (its array
//!   flavour, a lock-free bounded MPMC ring). Push and pop take no lock on the queue; a worker
//!   with nothing to do sleeps on a condition variable (the "bell", as before this module;
//!   crossbeam's own blocking receive spins and yields before it parks, CPU a 2-core box with
//!   16 idle workers cannot spare), and a push rings the bell of its class after the push,
//!   only when a worker sleeps on it.
//! * [`QueueKind::Mutex`] (the baseline of the paper): one `std::sync::Mutex` over the three
//!   `VecDeque`s, with condition variables for "not full" and "not empty". Every push and pop
//!   takes the one lock.
//!
//! Both are bounded (capacity per class, requests): a push into a full class blocks, which is
//! the daemon's backpressure (the decoder stops reading its socket).
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

/// Number of request classes (metadata, small data, large data: `server::Class`).
pub const CLASSES: usize = 3;
/// The classes' names, in class order (metrics labels).
pub const CLASS_NAMES: [&str; CLASSES] = ["metadata", "small", "large"];

/// Which queue implementation carries requests from the masters to the workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QueueKind {
    /// Lock-free bounded rings (crossbeam-channel).
    #[default]
    Lockfree,
    /// One mutex over all classes' deques, condition variables (the baseline).
    Mutex,
}

impl std::str::FromStr for QueueKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lockfree" => Ok(QueueKind::Lockfree),
            "mutex" => Ok(QueueKind::Mutex),
            _ => Err(format!("queue kind {s:?}: expected lockfree or mutex")),
        }
    }
}

impl QueueKind {
    pub fn name(self) -> &'static str {
        match self {
            QueueKind::Lockfree => "lockfree",
            QueueKind::Mutex => "mutex",
        }
    }
}

/// Workers asleep, by what they wait for: one class (0..CLASSES) or any of several
/// (`CLASSES`). Kept under the lock that guards the wait, so a pusher wakes only condition
/// variables someone waits on, after releasing that lock (no futex call for nobody, and the
/// woken worker does not run into a held lock).
type Sleepers = [usize; CLASSES + 1];

/// Idle workers, by [`Sleepers`] slot: those asleep, and those of them lent to a decoder that
/// serves a request itself ([`ClassQueues::lend`]): a push wakes only the others.
#[derive(Default)]
struct Idle {
    asleep: Sleepers,
    lent: Sleepers,
}

impl Idle {
    /// Sleeping workers not lent, by slot.
    fn free(&self) -> Sleepers {
        std::array::from_fn(|i| self.asleep[i].saturating_sub(self.lent[i]))
    }
    /// Lends a sleeping worker able to take `class` (one of that class first, then one of any).
    fn lend(&mut self, class: usize) -> Option<usize> {
        let slot = [class, CLASSES].into_iter().find(|&s| self.asleep[s] > self.lent[s])?;
        self.lent[slot] += 1;
        Some(slot)
    }
}

/// The condition variables matching [`Sleepers`].
struct Bells {
    ready: [Condvar; CLASSES],
    any: Condvar,
}

impl Bells {
    fn new() -> Bells {
        Bells { ready: std::array::from_fn(|_| Condvar::new()), any: Condvar::new() }
    }
    /// The slot and condition variable of a worker serving `order`.
    fn slot(&self, order: &[usize]) -> (usize, &Condvar) {
        if order.iter().all(|&c| c == order[0]) {
            (order[0], &self.ready[order[0]])
        } else {
            (CLASSES, &self.any)
        }
    }
    /// Wakes one worker able to take a request of `class` (given the sleepers seen under the
    /// lock, which the caller has released since).
    fn ring(&self, class: usize, seen: Sleepers) {
        if seen[class] > 0 {
            self.ready[class].notify_one();
        }
        if seen[CLASSES] > 0 {
            self.any.notify_one();
        }
    }
    fn ring_all(&self) {
        self.any.notify_all();
        for r in &self.ready {
            r.notify_all();
        }
    }
}

struct Locked<T> {
    q: [VecDeque<T>; CLASSES],
    idle: Idle,
    /// Pushers waiting for room.
    full_waiters: usize,
    closed: bool,
}

enum Inner<T> {
    Lockfree {
        txs: [Sender<T>; CLASSES],
        rxs: [Receiver<T>; CLASSES],
        /// The bell: a worker checks its classes are empty under it before it sleeps, a pusher
        /// takes it after its push, so no wakeup is lost. It guards only the sleeper counts.
        bell: Mutex<Idle>,
        bells: Bells,
    },
    Mutex {
        m: Mutex<Locked<T>>,
        cap: [usize; CLASSES],
        not_full: Condvar,
        bells: Bells,
    },
}

/// The bounded per-class queues of the daemon (see the module doc).
pub struct ClassQueues<T> {
    inner: Inner<T>,
}

impl<T> ClassQueues<T> {
    /// Queues of `kind` holding at most `cap[c]` requests of class `c` (at least 1).
    pub fn new(kind: QueueKind, cap: [usize; CLASSES]) -> ClassQueues<T> {
        let cap = cap.map(|c| c.max(1));
        let inner = match kind {
            QueueKind::Lockfree => {
                let (t0, r0) = bounded(cap[0]);
                let (t1, r1) = bounded(cap[1]);
                let (t2, r2) = bounded(cap[2]);
                Inner::Lockfree {
                    txs: [t0, t1, t2],
                    rxs: [r0, r1, r2],
                    bell: Mutex::new(Idle::default()),
                    bells: Bells::new(),
                }
            }
            QueueKind::Mutex => Inner::Mutex {
                m: Mutex::new(Locked {
                    q: std::array::from_fn(|c| VecDeque::with_capacity(cap[c])),
                    idle: Idle::default(),
                    full_waiters: 0,
                    closed: false,
                }),
                cap,
                not_full: Condvar::new(),
                bells: Bells::new(),
            },
        };
        ClassQueues { inner }
    }

    pub fn kind(&self) -> QueueKind {
        match self.inner {
            Inner::Lockfree { .. } => QueueKind::Lockfree,
            Inner::Mutex { .. } => QueueKind::Mutex,
        }
    }

    /// Queues `item` in class `class`, blocking while that class is full. `Err(item)` once the
    /// queues are closed.
    pub fn push(&self, class: usize, item: T) -> Result<(), T> {
        match &self.inner {
            Inner::Lockfree { txs, bell, bells, .. } => {
                txs[class].send(item).map_err(|e| e.into_inner())?;
                let seen = bell.lock().unwrap().free();
                bells.ring(class, seen);
                Ok(())
            }
            Inner::Mutex { m, cap, not_full, bells } => {
                let mut g = m.lock().unwrap();
                while g.q[class].len() >= cap[class] && !g.closed {
                    g.full_waiters += 1;
                    g = not_full.wait(g).unwrap();
                    g.full_waiters -= 1;
                }
                if g.closed {
                    return Err(item);
                }
                g.q[class].push_back(item);
                let seen = g.idle.free();
                drop(g);
                bells.ring(class, seen);
                Ok(())
            }
        }
    }

    /// Requests waiting in class `class` now.
    pub fn len(&self, class: usize) -> usize {
        match &self.inner {
            Inner::Lockfree { rxs, .. } => rxs[class].len(),
            Inner::Mutex { m, .. } => m.lock().unwrap().q[class].len(),
        }
    }

    /// Whether no request of any class waits.
    pub fn is_empty(&self) -> bool {
        (0..CLASSES).all(|c| self.len(c) == 0)
    }

    /// The first request found in `order` (class indices tried in turn; repeats are allowed),
    /// with its class. When all of them are empty, waits up to `timeout` for one; `None` when
    /// none came (the caller checks its stop flag and asks again).
    pub fn pop(&self, order: &[usize], timeout: Duration) -> Option<(T, usize)> {
        let deadline = Instant::now() + timeout;
        match &self.inner {
            Inner::Lockfree { rxs, bell, bells, .. } => loop {
                for &c in order {
                    if let Ok(w) = rxs[c].try_recv() {
                        return Some((w, c));
                    }
                }
                let now = Instant::now();
                if now >= deadline {
                    return None;
                }
                // Sleep until a push of one of the classes rings (checked under the bell).
                let mut g = bell.lock().unwrap();
                if order.iter().all(|&c| rxs[c].is_empty()) {
                    let (slot, cv) = bells.slot(order);
                    g.asleep[slot] += 1;
                    g = cv.wait_timeout(g, deadline - now).unwrap().0;
                    g.asleep[slot] -= 1;
                }
            },
            Inner::Mutex { m, not_full, bells, .. } => {
                let mut g = m.lock().unwrap();
                loop {
                    for &c in order {
                        if let Some(w) = g.q[c].pop_front() {
                            let full = g.full_waiters > 0;
                            drop(g);
                            if full {
                                not_full.notify_all();
                            }
                            return Some((w, c));
                        }
                    }
                    let now = Instant::now();
                    if now >= deadline || g.closed {
                        return None;
                    }
                    let (slot, cv) = bells.slot(order);
                    g.idle.asleep[slot] += 1;
                    g = cv.wait_timeout(g, deadline - now).unwrap().0;
                    g.idle.asleep[slot] -= 1;
                }
            }
        }
    }

    /// When no request of any class waits and a worker able to take `class` sleeps, lends that
    /// worker's place to the caller (a decoder that then serves its request itself, without a
    /// wake-up and a thread switch): while the [`Lent`] lives, pushes do not wake that worker,
    /// so as many requests are served at once as if it had been woken. `None`: queue instead.
    pub fn lend(&self, class: usize) -> Option<Lent<'_, T>> {
        let slot = match &self.inner {
            Inner::Lockfree { rxs, bell, .. } => {
                if !rxs.iter().all(|r| r.is_empty()) {
                    return None;
                }
                bell.lock().unwrap().lend(class)?
            }
            Inner::Mutex { m, .. } => {
                let mut g = m.lock().unwrap();
                if g.q.iter().any(|q| !q.is_empty()) {
                    return None;
                }
                g.idle.lend(class)?
            }
        };
        Some(Lent { q: self, slot })
    }

    /// Gives a lent worker's place back; wakes it if requests it can take were queued meanwhile
    /// (their pushes did not, seeing it lent).
    fn give_back(&self, slot: usize) {
        let classes: &[usize] = if slot == CLASSES { &[0, 1, 2] } else { std::slice::from_ref(&slot) };
        let (bells, seen) = match &self.inner {
            Inner::Lockfree { rxs, bell, bells, .. } => {
                let mut g = bell.lock().unwrap();
                g.lent[slot] -= 1;
                if classes.iter().all(|&c| rxs[c].is_empty()) {
                    return;
                }
                (bells, g.free())
            }
            Inner::Mutex { m, bells, .. } => {
                let mut g = m.lock().unwrap();
                g.idle.lent[slot] -= 1;
                if classes.iter().all(|&c| g.q[c].is_empty()) {
                    return;
                }
                (bells, g.idle.free())
            }
        };
        for &c in classes {
            bells.ring(c, seen);
        }
    }

    /// Wakes every blocked pusher and popper: pushes fail from now on (shutdown).
    pub fn close(&self) {
        match &self.inner {
            Inner::Mutex { m, not_full, bells, .. } => {
                m.lock().unwrap().closed = true;
                not_full.notify_all();
                bells.ring_all();
            }
            Inner::Lockfree { bells, .. } => bells.ring_all(),
        }
    }
}

/// A sleeping worker's place, lent by [`ClassQueues::lend`]; given back when dropped.
pub struct Lent<'a, T> {
    q: &'a ClassQueues<T>,
    slot: usize,
}

impl<T> Drop for Lent<'_, T> {
    fn drop(&mut self) {
        self.q.give_back(self.slot);
    }
}

/// Queuing delay of each class since the start: the sum of the waits of the requests that left
/// the queue, nanoseconds, and their count (workers add to it at dequeue).
#[derive(Default)]
pub struct ClassWaits {
    wait_ns: [AtomicU64; CLASSES],
    dequeued: [AtomicU64; CLASSES],
}

impl ClassWaits {
    /// A request of `class` left its queue after waiting `wait`.
    pub fn dequeued(&self, class: usize, wait: Duration) {
        self.wait_ns[class].fetch_add(wait.as_nanos() as u64, Relaxed);
        self.dequeued[class].fetch_add(1, Relaxed);
    }

    /// (summed wait, ns; dequeued requests) of every class.
    pub fn snapshot(&self) -> [(u64, u64); CLASSES] {
        std::array::from_fn(|c| (self.wait_ns[c].load(Relaxed), self.dequeued[c].load(Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn both() -> [QueueKind; 2] {
        [QueueKind::Lockfree, QueueKind::Mutex]
    }

    #[test]
    fn pops_follow_the_order_and_keep_fifo_within_a_class() {
        for kind in both() {
            let q = ClassQueues::new(kind, [4, 4, 4]);
            q.push(2, "l1").unwrap();
            q.push(0, "m1").unwrap();
            q.push(0, "m2").unwrap();
            assert_eq!(q.len(0), 2);
            let t = Duration::from_millis(1);
            assert_eq!(q.pop(&[2, 0, 1, 2], t), Some(("l1", 2)), "{kind:?}");
            assert_eq!(q.pop(&[2, 0, 1, 2], t), Some(("m1", 0)));
            assert_eq!(q.pop(&[1], t), None, "only class 1 asked");
            assert_eq!(q.pop(&[0], t), Some(("m2", 0)));
            assert!(q.is_empty());
            assert_eq!(q.pop(&[0, 1, 2], t), None);
        }
    }

    #[test]
    fn a_full_class_blocks_its_pusher_until_a_pop() {
        for kind in both() {
            let q = Arc::new(ClassQueues::new(kind, [1, 1, 1]));
            q.push(1, 1u32).unwrap();
            let q2 = q.clone();
            let h = std::thread::spawn(move || q2.push(1, 2u32));
            std::thread::sleep(Duration::from_millis(30));
            assert_eq!(q.len(1), 1, "{kind:?}: bounded");
            q.push(0, 9).unwrap(); // other classes are not blocked
            assert_eq!(q.pop(&[1], Duration::from_millis(10)), Some((1, 1)));
            h.join().unwrap().unwrap();
            assert_eq!(q.pop(&[1], Duration::from_secs(1)), Some((2, 1)));
        }
    }

    #[test]
    fn a_waiting_worker_wakes_on_a_push_of_its_class() {
        for kind in both() {
            let q = Arc::new(ClassQueues::new(kind, [8, 8, 8]));
            let hs: Vec<_> = (0..CLASSES)
                .map(|c| {
                    let q = q.clone();
                    std::thread::spawn(move || q.pop(&[c], Duration::from_secs(5)))
                })
                .collect();
            std::thread::sleep(Duration::from_millis(20));
            for c in (0..CLASSES).rev() {
                q.push(c, c * 10).unwrap();
            }
            let got: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(got, vec![Some((0, 0)), Some((10, 1)), Some((20, 2))], "{kind:?}");
            // a worker of several classes wakes on any of them
            let any = {
                let q = q.clone();
                std::thread::spawn(move || q.pop(&[0, 1, 2], Duration::from_secs(5)))
            };
            std::thread::sleep(Duration::from_millis(20));
            q.push(2, 7).unwrap();
            assert_eq!(any.join().unwrap(), Some((7, 2)), "{kind:?}");
        }
    }

    #[test]
    fn many_producers_and_consumers_lose_nothing() {
        for kind in both() {
            let q = Arc::new(ClassQueues::new(kind, [16, 16, 16]));
            let producers: Vec<_> = (0..4u64)
                .map(|p| {
                    let q = q.clone();
                    std::thread::spawn(move || {
                        for i in 0..2000u64 {
                            q.push((i % 3) as usize, p * 1_000_000 + i).unwrap();
                        }
                    })
                })
                .collect();
            let consumers: Vec<_> = (0..4)
                .map(|k| {
                    let q = q.clone();
                    std::thread::spawn(move || {
                        let mut got = Vec::new();
                        while let Some((v, _)) = q.pop(&[k % 3, 0, 1, 2], Duration::from_millis(200)) {
                            got.push(v);
                        }
                        got
                    })
                })
                .collect();
            for p in producers {
                p.join().unwrap();
            }
            let mut all: Vec<u64> = consumers.into_iter().flat_map(|c| c.join().unwrap()).collect();
            all.sort();
            let mut want: Vec<u64> = (0..4u64).flat_map(|p| (0..2000).map(move |i| p * 1_000_000 + i)).collect();
            want.sort();
            assert_eq!(all, want, "{kind:?}");
        }
    }

    /// Waits (bounded) until `n` workers sleep on `q`'s slot `slot`.
    fn until_asleep<T>(q: &ClassQueues<T>, slot: usize, n: usize) {
        let t0 = Instant::now();
        loop {
            let asleep = match &q.inner {
                Inner::Lockfree { bell, .. } => bell.lock().unwrap().asleep[slot],
                Inner::Mutex { m, .. } => m.lock().unwrap().idle.asleep[slot],
            };
            if asleep >= n {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "no worker asleep");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_sleeping_worker_is_lent_once_and_woken_when_given_back_with_work() {
        for kind in both() {
            let q = Arc::new(ClassQueues::new(kind, [8, 8, 8]));
            assert!(q.lend(1).is_none(), "{kind:?}: nobody sleeps");
            let w = {
                let q = q.clone();
                std::thread::spawn(move || q.pop(&[1], Duration::from_secs(5)))
            };
            until_asleep(&q, 1, 1);
            assert!(q.lend(0).is_none(), "{kind:?}: the sleeper serves class 1 only");
            let lent = q.lend(1).expect("the class-1 sleeper");
            assert!(q.lend(1).is_none(), "{kind:?}: one sleeper, lent once");
            // A push while the sleeper is lent does not wake it ...
            q.push(1, 7u32).unwrap();
            std::thread::sleep(Duration::from_millis(30));
            assert!(!w.is_finished(), "{kind:?}: a lent worker was woken");
            assert!(q.lend(1).is_none(), "{kind:?}: something is queued");
            // ... giving it back does, since a request waits.
            drop(lent);
            assert_eq!(w.join().unwrap(), Some((7, 1)), "{kind:?}");
        }
    }

    #[test]
    fn a_worker_of_any_class_is_lent_for_every_class() {
        for kind in both() {
            let q = Arc::new(ClassQueues::<u32>::new(kind, [8, 8, 8]));
            let w = {
                let q = q.clone();
                std::thread::spawn(move || q.pop(&[2, 0, 1], Duration::from_millis(300)))
            };
            until_asleep(&q, CLASSES, 1);
            let lent = q.lend(0).expect("the any-class sleeper");
            drop(lent); // nothing queued: it sleeps on
            assert_eq!(w.join().unwrap(), None, "{kind:?}");
        }
    }

    #[test]
    fn class_waits_add_up() {
        let w = ClassWaits::default();
        w.dequeued(0, Duration::from_micros(3));
        w.dequeued(0, Duration::from_micros(5));
        w.dequeued(2, Duration::from_millis(1));
        assert_eq!(w.snapshot(), [(8000, 2), (0, 0), (1_000_000, 1)]);
    }

    #[test]
    fn queue_kind_parses() {
        assert_eq!("mutex".parse::<QueueKind>(), Ok(QueueKind::Mutex));
        assert_eq!("lockfree".parse::<QueueKind>(), Ok(QueueKind::Lockfree));
        assert!("spin".parse::<QueueKind>().is_err());
    }
}
