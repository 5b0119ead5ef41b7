//! Replacing the job mapping without leaving gathered writes behind (issue 26, item 6).
//!
//! A forwarding node with Gather-Arrange-Scatter on answers a write before it reaches the
//! targets; the node a job moves to reads the targets. So [`Rpc::remap`] takes the switch lock
//! exclusively (the requests in flight are answered first, new ones wait), asks every node that a
//! moved job leaves to write this compute node's gathered writes to the targets
//! ([`Op::Flush`]), and only then swaps the table. A node that fails to answer is marked down and
//! the switch goes on (a remap is also how jobs leave a failed node); its error is reported.
use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use pharos_fwd_proto::{Body, Ctx, Op, Reply, Request};
use serde::Serialize;

use super::{Conns, Fail, Mapping, Rpc};

/// One node's flush before a remap: its name, and the error when it did not flush.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Flushed {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Rpc {
    /// The nodes requests of `job` go to first under `m` (its entry's, else the default node).
    fn first_nodes(&self, m: &Mapping, job: &str) -> Vec<usize> {
        match m.jobs.get(job) {
            Some(ns) => ns.iter().filter_map(|n| self.node_index(n)).collect(),
            None => vec![self.default_idx],
        }
    }

    /// The nodes that jobs whose entry differs between `old` and `new` were sent to under `old`
    /// (a job given another node list may move any of its ranks).
    pub fn left_nodes(&self, old: &Mapping, new: &Mapping) -> BTreeSet<usize> {
        let jobs: BTreeSet<&String> = old.jobs.keys().chain(new.jobs.keys()).collect();
        jobs.into_iter()
            .filter(|j| old.jobs.get(*j) != new.jobs.get(*j))
            .flat_map(|j| self.first_nodes(old, j))
            .collect()
    }

    /// Replaces the job mapping by `m` (validated by the caller) once the nodes the moved jobs
    /// leave have flushed this compute node's gathered writes; returns each such node's outcome.
    /// Requests wait meanwhile (a flush writes at most the node's gather buffer).
    pub fn remap(&self, m: Mapping) -> Vec<Flushed> {
        let _switch = self.switch.write().unwrap_or_else(|e| e.into_inner());
        let left = self.left_nodes(&self.mapping.load(), &m);
        let mut conns = Conns::default();
        let ctx = Ctx { compute_node: self.compute_node.clone(), rank: -1, ..Default::default() };
        let mut out = Vec::new();
        for i in left {
            let n = &self.nodes[i];
            let error = if self.is_down(i) {
                Some("down: not asked".to_string())
            } else {
                n.requests.fetch_add(1, Relaxed);
                let req =
                    Request { id: self.next_id.fetch_add(1, Relaxed), ctx: ctx.clone(), op: Op::Flush, replay: false };
                match self.once(&mut conns, i, &req, None) {
                    Ok(Reply { body: Ok(Body::Ok), .. }) => None,
                    Ok(Reply { body: Ok(b), .. }) => Some(format!("unexpected reply {b:?}")),
                    Ok(Reply { body: Err(e), .. }) => Some(format!("errno {}: {}", e.errno, e.msg)),
                    Err(Fail::NotSent(e) | Fail::Sent(e)) => {
                        self.mark_down(i);
                        Some(e)
                    }
                }
            };
            if let Some(e) = &error {
                log::warn!("remap: forwarding node {} did not flush this compute node's writes: {e}", n.name);
            }
            out.push(Flushed { node: n.name.clone(), error });
        }
        self.mapping.store(Arc::new(m));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::rpc;
    use super::*;

    fn map(entries: &[(&str, &[&str])]) -> Mapping {
        Mapping {
            jobs: entries.iter().map(|(j, ns)| (j.to_string(), ns.iter().map(|n| n.to_string()).collect())).collect(),
        }
    }

    /// The nodes a remap flushes: those the changed jobs were on (the default node for a job
    /// without an entry), none for an unchanged table.
    #[test]
    fn a_remap_flushes_the_nodes_the_moved_jobs_leave() {
        let r = rpc(&[], 1).unwrap(); // default node fwd1
        let old = map(&[("a", &["fwd0"]), ("b", &["fwd2", "fwd3"]), ("same", &["fwd3"])]);
        assert!(r.left_nodes(&old, &old).is_empty());
        let new = map(&[("a", &["fwd2"]), ("b", &["fwd2"]), ("c", &["fwd0"]), ("same", &["fwd3"])]);
        // a leaves fwd0; b's ranks spread over fwd2 and fwd3; c was on the default node
        assert_eq!(r.left_nodes(&old, &new), BTreeSet::from([0, 1, 2, 3]));
        let dropped = map(&[("b", &["fwd2", "fwd3"]), ("same", &["fwd3"])]);
        assert_eq!(r.left_nodes(&old, &dropped), BTreeSet::from([0]));
    }
}
