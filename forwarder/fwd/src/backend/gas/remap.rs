//! Flushing one compute node's gathered writes before its mount moves a job to another
//! forwarding node (issue 26, item 6; [`pharos_fwd_proto::Op::Flush`]). The mount holds the job's
//! requests while it asks, so when the answer comes every write this daemon answered to that
//! compute node is on the targets, and the daemon the job moves to reads it there.
use super::super::{Backend, Res};
use super::{Gas, Reason};

impl Gas {
    /// Writes compute node `node`'s buffer to the targets and waits for it, and for every flush
    /// already under way when called (among them the node's size flushes handed to the flusher
    /// thread, whose runs left its buffer before they reached the targets). Returns a deferred
    /// write error of a file the node had buffered (kept too for its next fsync or close here).
    pub fn flush_node(&self, b: &Backend, node: &str) -> Res<()> {
        let mut g = self.inner.lock().unwrap();
        let earlier: Vec<(u64, (u64, u64))> =
            g.inflight.iter().flat_map(|(&oid, v)| v.iter().map(move |&r| (oid, r))).collect();
        let runs = Self::take_node(&mut g, node);
        let mut oids: Vec<u64> = runs.iter().map(|r| r.layout.oid).collect();
        oids.sort_unstable();
        oids.dedup();
        if !runs.is_empty() {
            Self::begin(&mut g, &runs);
            drop(g);
            self.scatter(b, runs, Reason::Remap);
            g = self.inner.lock().unwrap();
        }
        while earlier.iter().any(|(oid, r)| g.inflight.get(oid).is_some_and(|v| v.contains(r))) {
            g = self.done.wait(g).unwrap();
        }
        match oids.iter().find_map(|oid| g.errors.get(oid)) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}
