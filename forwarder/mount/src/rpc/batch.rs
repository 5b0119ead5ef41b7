//! Pipelined batches: many idempotent requests to one forwarding node in one write, replies
//! matched by id (the mount's write-back creates and their releases, `fs/writeback.rs`).
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::*;

use pharos_fwd_proto::{self as proto, errno, Body, Ctx, Op, Reply, Request};

use super::{reusable, Conns, Fail, Rpc};

impl Rpc {
    /// Sends the idempotent requests `reqs` pipelined: those whose first candidate node is the
    /// same go out in one write on one connection, their replies are read as they come (any
    /// order, matched by id). One wakeup of the daemon's connection and of this thread per
    /// batch instead of per request (write-back creates and their releases, `fs/writeback.rs`).
    /// A batch whose node fails goes on request by request, as [`Rpc::call`] would (failover,
    /// replay). Returns each request's reply body or errno, in `reqs`' order.
    pub fn call_many(&self, conns: &mut Conns, reqs: Vec<(Ctx, Op)>) -> Vec<Result<Body, i32>> {
        let switch = self.switch.read().unwrap_or_else(|e| e.into_inner());
        let mut reqs: Vec<Request> = reqs
            .into_iter()
            .map(|(ctx, op)| Request { id: self.next_id.fetch_add(1, Relaxed), ctx, op, replay: false })
            .collect();
        let mut out: Vec<Option<Result<Body, i32>>> = (0..reqs.len()).map(|_| None).collect();
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (k, r) in reqs.iter().enumerate() {
            let order = self.order(&r.ctx.job_id, r.ctx.rank);
            let first = order.iter().copied().find(|&i| !self.is_down(i)).unwrap_or(order[0]);
            groups.entry(first).or_default().push(k);
        }
        for (i, ks) in groups {
            let (got, failed) = self.pipelined(conns, i, &reqs, &ks);
            for (k, rep) in got {
                out[k] = Some(rep.body.map_err(|e| e.errno));
            }
            if let Some(f) = failed {
                conns.m.remove(&i);
                let n = &self.nodes[i];
                let (sent, e) = match f {
                    Fail::NotSent(e) => (false, e),
                    Fail::Sent(e) => (true, e),
                };
                // Nothing sent (this thread's connection could not be made: it connects lazily,
                // and a short link cut can fall on that moment): each request tries the node
                // again first, as `call` would, and marks it down only if that fails too; the
                // other threads' requests keep waiting for it on their connections.
                if sent {
                    self.mark_down(i);
                }
                log::warn!("forwarding node {} ({}): {e}; the batch goes on request by request", n.name, n.addr);
                for &k in &ks {
                    if out[k].is_some() {
                        continue;
                    }
                    let req = &mut reqs[k];
                    if sent && !req.op.idempotent() {
                        out[k] = Some(Err(errno::EIO));
                        continue;
                    }
                    if sent {
                        self.replays.fetch_add(1, Relaxed);
                        req.replay = true;
                        self.failovers.fetch_add(1, Relaxed);
                    }
                    out[k] = Some(self.call_req(conns, req, None));
                }
            }
        }
        drop(switch);
        out.into_iter().map(|r| r.unwrap_or(Err(errno::EIO))).collect()
    }

    /// Sends `reqs[ks]` to node `i` in one write and reads their replies: those read, and the
    /// failure that ended the batch, if any.
    fn pipelined(
        &self,
        conns: &mut Conns,
        i: usize,
        reqs: &[Request],
        ks: &[usize],
    ) -> (Vec<(usize, Reply)>, Option<Fail>) {
        let mut got = Vec::with_capacity(ks.len());
        if conns.m.get(&i).is_some_and(|c| !reusable(c)) {
            conns.m.remove(&i);
            self.stale_connections.fetch_add(1, Relaxed);
        }
        if let std::collections::hash_map::Entry::Vacant(e) = conns.m.entry(i) {
            match self.connect(i) {
                Ok(c) => {
                    e.insert(c);
                }
                Err(e) => return (got, Some(Fail::NotSent(e))),
            }
        }
        let Conns { m, frame } = conns;
        let (r, w, _) = m.get_mut(&i).unwrap();
        let mut buf = Vec::with_capacity(ks.len() * 256);
        for &k in ks {
            if let Err(e) = proto::write_msg(&mut buf, &reqs[k]) {
                return (got, Some(Fail::NotSent(format!("encode: {e}"))));
            }
        }
        self.nodes[i].requests.fetch_add(ks.len() as u64, Relaxed);
        if let Err(e) = std::io::Write::write_all(w, &buf) {
            return (got, Some(Fail::Sent(format!("send: {e}"))));
        }
        let by_id: HashMap<u64, usize> = ks.iter().map(|&k| (reqs[k].id, k)).collect();
        if frame.data.capacity() == 0 {
            frame.data = self.bufs.take();
        }
        while got.len() < ks.len() {
            if let Err(e) = proto::read_frame_into(r, frame) {
                return (got, Some(Fail::Sent(format!("reply: {e}"))));
            }
            let rep: Reply = match proto::decode(frame) {
                Ok(rep) => rep,
                Err(e) => return (got, Some(Fail::Sent(format!("reply: {e}")))),
            };
            match by_id.get(&rep.id) {
                Some(&k) => got.push((k, rep)),
                None => return (got, Some(Fail::Sent(format!("reply id {} not in the batch", rep.id)))),
            }
        }
        (got, None)
    }
}
