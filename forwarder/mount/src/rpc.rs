//! Client side of the forwarding protocol: routing by the job → forwarding-node mapping,
//! per-thread connections, failover with idempotent replay.
//!
//! Routing (DFRA-style mapping): a request of job `J` goes to the nodes of `jobs[J]` in
//! order when the mapping has an entry, else to the static default node
//! `node_index mod nodes.len()`; every other node follows in ring order as a failover
//! candidate. The order is chosen once per request, so a mapping change (arc-swap) never
//! moves a request already in flight. A node that fails (connect error, reset, EOF,
//! timeout) is marked down for `DOWN_FOR` and skipped while another candidate is up.
//! The failed request is replayed on the next candidate when that is safe: always when
//! it was never sent, otherwise only when [`Op::idempotent`] (reads, writes at explicit
//! offsets, attribute ops, creates with their token); else the caller gets EIO.
//!
//! Data path: a write's data goes out with one vectored write (prefix, header, data) from
//! a pooled buffer; a read reply's data segment is read straight into a pooled buffer that
//! the caller hands back with [`BufPool::put`] once the kernel has it.
use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::sync::Mutex;

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use pharos_fwd_proto::{self as proto, errno, Body, Ctx, Frame, Op, Reply, Request};
use serde::{Deserialize, Serialize};

const DOWN_FOR: Duration = Duration::from_secs(2);

pub struct Node {
    pub name: String,
    pub addr: String,
    down_until_ms: AtomicU64,
    pub requests: AtomicU64,
    pub failures: AtomicU64,
}

/// The live job → forwarding-node mapping (node names, first = primary).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Mapping {
    #[serde(default)]
    pub jobs: BTreeMap<String, Vec<String>>,
}

/// Reusable data buffers (write payloads, read replies).
pub struct BufPool {
    bufs: Mutex<Vec<Vec<u8>>>,
    max: usize,
}

impl BufPool {
    pub fn new(max: usize) -> BufPool {
        BufPool { bufs: Mutex::new(Vec::new()), max }
    }
    pub fn get(&self) -> Vec<u8> {
        self.bufs.lock().unwrap().pop().unwrap_or_default()
    }
    pub fn put(&self, b: Vec<u8>) {
        if b.capacity() < 4096 || b.capacity() > proto::MAX_FRAME {
            return;
        }
        let mut m = self.bufs.lock().unwrap();
        if m.len() < self.max {
            m.push(b);
        }
    }
}

pub struct Rpc {
    pub bufs: BufPool,
    pub nodes: Vec<Node>,
    pub default_idx: usize,
    pub mapping: ArcSwap<Mapping>,
    pub timeout: Duration,
    pub compute_node: String,
    next_id: AtomicU64,
    pub failovers: AtomicU64,
    pub replays: AtomicU64,
    epoch: Instant,
}

/// One thread's connections, by node index.
#[derive(Default)]
pub struct Conns {
    m: HashMap<usize, (BufReader<TcpStream>, TcpStream)>,
    frame: Frame,
}

enum Fail {
    /// Nothing reached the node: always safe to try elsewhere.
    NotSent(String),
    /// The request may have been executed.
    Sent(String),
}

impl Rpc {
    pub fn new(nodes: Vec<(String, String)>, node_index: usize, timeout: Duration, compute_node: String) -> Rpc {
        let n = nodes.len();
        Rpc {
            bufs: BufPool::new(64),
            nodes: nodes
                .into_iter()
                .map(|(name, addr)| Node {
                    name,
                    addr,
                    down_until_ms: AtomicU64::new(0),
                    requests: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                })
                .collect(),
            default_idx: node_index % n,
            mapping: ArcSwap::from_pointee(Mapping::default()),
            timeout,
            compute_node,
            next_id: AtomicU64::new(1),
            failovers: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    pub fn validate(&self, m: &Mapping) -> Result<(), String> {
        for (job, ns) in &m.jobs {
            if ns.is_empty() {
                return Err(format!("job {job}: empty node list"));
            }
            for n in ns {
                if self.node_index(n).is_none() {
                    return Err(format!("job {job}: unknown forwarding node {n}"));
                }
            }
        }
        Ok(())
    }

    /// Candidate nodes of a request of `job`, primary first.
    pub fn order(&self, job: &str) -> Vec<usize> {
        let m = self.mapping.load();
        let mut out: Vec<usize> = match m.jobs.get(job) {
            Some(ns) => ns.iter().filter_map(|n| self.node_index(n)).collect(),
            None => vec![self.default_idx],
        };
        if out.is_empty() {
            out.push(self.default_idx);
        }
        let first = out[0];
        for k in 1..self.nodes.len() {
            let i = (first + k) % self.nodes.len();
            if !out.contains(&i) {
                out.push(i);
            }
        }
        out
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn is_down(&self, i: usize) -> bool {
        self.nodes[i].down_until_ms.load(Relaxed) > self.now_ms()
    }

    /// Sends `op` on behalf of `ctx` and returns the reply body or an errno. A write's data
    /// buffer goes back to [`Rpc::bufs`]; give a read's `Body::Data` buffer back there too.
    pub fn call(&self, conns: &mut Conns, ctx: &Ctx, op: Op) -> Result<Body, i32> {
        let req = Request { id: self.next_id.fetch_add(1, Relaxed), ctx: ctx.clone(), op };
        let r = self.call_req(conns, &req);
        if let Op::Write { data, .. } = req.op {
            self.bufs.put(data);
        }
        r
    }

    fn call_req(&self, conns: &mut Conns, req: &Request) -> Result<Body, i32> {
        let order = self.order(&req.ctx.job_id);
        // Up nodes first, in mapping order; down ones only as a last resort.
        let mut tries: Vec<usize> = order.iter().copied().filter(|&i| !self.is_down(i)).collect();
        tries.extend(order.iter().copied().filter(|&i| self.is_down(i)));
        for (k, &i) in tries.iter().enumerate() {
            if k > 0 {
                self.failovers.fetch_add(1, Relaxed);
            }
            self.nodes[i].requests.fetch_add(1, Relaxed);
            match self.once(conns, i, req) {
                Ok(Reply { body: Ok(b), .. }) => return Ok(b),
                Ok(Reply { body: Err(e), .. }) => return Err(e.errno),
                Err(f) => {
                    conns.m.remove(&i);
                    let n = &self.nodes[i];
                    n.failures.fetch_add(1, Relaxed);
                    n.down_until_ms.store(self.now_ms() + DOWN_FOR.as_millis() as u64, Relaxed);
                    match f {
                        Fail::NotSent(e) => {
                            log::warn!("forwarding node {} ({}): {e}; trying the next node", n.name, n.addr)
                        }
                        Fail::Sent(e) => {
                            if !req.op.idempotent() {
                                log::warn!(
                                    "forwarding node {} failed during non-idempotent {}: {e}",
                                    n.name,
                                    req.op.name()
                                );
                                return Err(errno::EIO);
                            }
                            log::warn!(
                                "forwarding node {} failed during {}: {e}; replaying on the next node",
                                n.name,
                                req.op.name()
                            );
                            self.replays.fetch_add(1, Relaxed);
                        }
                    }
                }
            }
        }
        Err(errno::EIO)
    }

    fn connect(&self, i: usize) -> Result<(BufReader<TcpStream>, TcpStream), String> {
        let n = &self.nodes[i];
        let addr = n.addr.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("no address")?;
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| format!("connect: {e}"))?;
        pharos_fwd_proto::tune_data_socket(&s);
        s.set_read_timeout(Some(self.timeout)).ok();
        s.set_write_timeout(Some(self.timeout)).ok();
        let w = s.try_clone().map_err(|e| e.to_string())?;
        Ok((BufReader::with_capacity(16 << 10, s), w))
    }

    fn once(&self, conns: &mut Conns, i: usize, req: &Request) -> Result<Reply, Fail> {
        let id = req.id;
        if let std::collections::hash_map::Entry::Vacant(e) = conns.m.entry(i) {
            e.insert(self.connect(i).map_err(Fail::NotSent)?);
        }
        let Conns { m, frame } = conns;
        let (r, w) = m.get_mut(&i).unwrap();
        proto::write_msg(w, req).map_err(|e| Fail::Sent(format!("send: {e}")))?;
        if frame.data.capacity() == 0 {
            frame.data = self.bufs.get();
        }
        proto::read_frame_into(r, frame).map_err(|e| Fail::Sent(format!("reply: {e}")))?;
        let rep: Reply = proto::decode(frame).map_err(|e| Fail::Sent(format!("reply: {e}")))?;
        if rep.id != id {
            return Err(Fail::Sent(format!("reply id {} for request {id}", rep.id)));
        }
        Ok(rep)
    }

    pub fn status(&self) -> serde_json::Value {
        let nodes: Vec<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                serde_json::json!({
                    "name": n.name, "addr": n.addr, "default": i == self.default_idx,
                    "down": self.is_down(i), "requests": n.requests.load(Relaxed), "failures": n.failures.load(Relaxed),
                })
            })
            .collect();
        serde_json::json!({
            "compute_node": self.compute_node,
            "nodes": nodes,
            "failovers": self.failovers.load(Relaxed),
            "replays": self.replays.load(Relaxed),
        })
    }
}
