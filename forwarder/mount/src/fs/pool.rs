//! The I/O pool's task queue: FUSE operations run on `--threads` threads, each with its own
//! connections ([`Conns`]), so slow requests do not serialise the mount.
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use crate::rpc::Conns;

/// One operation's work, run on an I/O thread with that thread's connections.
pub(super) type Task = Box<dyn FnOnce(&mut Conns) + Send>;

/// The I/O pool's bounded task queue: idle threads block on a condition variable (no
/// spinning or yielding while waiting, unlike a spin-then-park channel: with many idle
/// threads that burned CPU on every wakeup), one thread is woken per task.
pub struct TaskQueue {
    q: Mutex<(VecDeque<Task>, bool)>,
    ready: Condvar,
    room: Condvar,
    cap: usize,
}

impl TaskQueue {
    /// A queue that holds at most `cap` (at least 1) waiting tasks.
    pub(super) fn new(cap: usize) -> TaskQueue {
        TaskQueue {
            q: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
            room: Condvar::new(),
            cap: cap.max(1),
        }
    }

    /// Queues `t`; blocks while the queue is full (backpressure towards the kernel).
    pub(super) fn push(&self, t: Task) {
        let mut g = self.q.lock().unwrap();
        while g.0.len() >= self.cap && !g.1 {
            g = self.room.wait(g).unwrap();
        }
        g.0.push_back(t);
        drop(g);
        self.ready.notify_one();
    }

    /// Next task; `None` once closed and drained.
    pub(super) fn pop(&self) -> Option<Task> {
        let mut g = self.q.lock().unwrap();
        loop {
            if let Some(t) = g.0.pop_front() {
                drop(g);
                self.room.notify_one();
                return Some(t);
            }
            if g.1 {
                return None;
            }
            g = self.ready.wait(g).unwrap();
        }
    }

    /// Closes the queue: `pop` returns the queued tasks, then `None`; `push` no longer blocks.
    pub(super) fn close(&self) {
        self.q.lock().unwrap().1 = true;
        self.ready.notify_all();
        self.room.notify_all();
    }
}
