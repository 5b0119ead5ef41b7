//! The flusher thread's queue of size flushes.
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::{Reason, Run, QUEUED_FLUSHES};

/// The flusher thread's work: size flushes handed over, and whether buffers wait for a time
/// flush. A mutex and a condition variable, not a channel: crossbeam's blocking receive spins
/// and yields before it parks, at every tick, CPU a 2-core box serving the writers lacks.
#[derive(Default)]
pub(super) struct FlushQueue {
    pub(super) state: Mutex<FlushState>,
    pub(super) bell: Condvar,
}

#[derive(Default)]
pub(super) struct FlushState {
    pub(super) jobs: VecDeque<(Vec<Run>, Reason)>,
    /// Something is buffered: the flusher ticks (else it sleeps until a job or a gather).
    pub(super) armed: bool,
    /// The backend is gone: the flusher ends.
    pub(super) closed: bool,
}

impl FlushQueue {
    /// Queues a flush unless [`QUEUED_FLUSHES`] wait already (then gives it back).
    pub(super) fn offer(&self, job: (Vec<Run>, Reason)) -> Result<(), (Vec<Run>, Reason)> {
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
    pub(super) fn arm(&self) {
        let mut s = self.state.lock().unwrap();
        if !s.armed {
            s.armed = true;
            drop(s);
            self.bell.notify_one();
        }
    }
    /// The next job, `Ok(None)` after a tick (or at once when armed and none came), `Err` when closed.
    pub(super) fn next(&self, tick: Duration) -> Result<Option<(Vec<Run>, Reason)>, ()> {
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
