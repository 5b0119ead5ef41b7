//! Client side of the forwarding protocol: routing by the job → forwarding-node mapping,
//! per-thread connections, failover with idempotent replay.
//!
//! Routing (DFRA-style mapping, Ji et al. FAST'19 §4): a request of job `J` goes to one of
//! the nodes of `jobs[J]` when the mapping has an entry — rank `r` of the job starts at node
//! `r mod k` of its `k` nodes, so a job given more forwarding nodes spreads its ranks over
//! them (rank -1, unknown, starts at the first) — else to the static default node, the
//! `node_index mod s`-th of the `s` shared (not reserved) nodes. The job's other nodes, then
//! the shared nodes in ring order, then the reserved ones follow as failover candidates:
//! reserved (dedicated) nodes serve only the jobs mapped to them unless nothing else is up.
//! The order is chosen once per request. A mapping change ([`Rpc::remap`], `remap.rs`) waits
//! for the requests in flight, has the nodes the moved jobs leave write this compute node's
//! gathered writes to the targets (`Flush`), then swaps the table: a job's next request reads,
//! on its new node, every write its old node answered. A node that fails (connect error, reset, EOF,
//! timeout) is marked down for `DOWN_FOR` and skipped while another candidate is up.
//! The failed request is replayed on the next candidate when that is safe: always when
//! it was never sent, otherwise only when [`Op::idempotent`] (reads, writes at explicit
//! offsets, attribute ops, creates with their token); else the caller gets EIO.
//!
//! Counting a replayed request once (issue 25, item 5): a request keeps its id on every try,
//! and ids are unique per mount instance (they start from a random value, so a restarted
//! mount does not reuse its predecessor's), so `(compute_node, id)` names the client request
//! on every daemon. A try that follows a try that was sent (the failed node may have
//! executed it) carries [`Request::replay`]; the daemons copy both into their records, and
//! the pipeline counts a replay record only when no other record of the request exists.
//!
//! Authentication: a new connection runs the handshake of [`pharos_fwd_proto::auth`] with the
//! site key before its first request (the daemon's challenge, this mount's proof, the daemon's
//! proof, checked here too); a node that fails it counts as failed (nothing was sent).
//!
//! Data path: a write's data goes out with one vectored write (prefix, header, data) from
//! a pooled buffer; a read reply's data segment is read straight into a pooled buffer that
//! the caller hands back with [`BufPool::put`] once the kernel has it.
//!
//! Shared-memory data path (issue 12, item 1; `--shm-slots`, [`pharos_fwd_proto::region`]):
//! the mount owns one sealed memfd region of [`Slots`]; each new connection offers it to the
//! daemon (`ShmAttach`, after the handshake). On a connection the daemon attached, a write
//! whose data the caller put in a slot goes out as `WriteShm` (header only) and a read as
//! `ReadShm` (the daemon reads into the slot); on any other connection (another host, a
//! daemon with `--shm-data false`, an older daemon) the same slot's bytes go out as the
//! frame's data segment, so failover and replay work the same either way.
use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::sync::{Mutex, RwLock};

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use pharos_fwd_proto::auth::{self, SiteKey};
use pharos_fwd_proto::region::{self, Region};
use pharos_fwd_proto::{self as proto, errno, Body, BufPool, Ctx, Frame, Op, Reply, Request};
use serde::{Deserialize, Serialize};

mod batch;
mod remap;
mod watch;

pub use watch::WatchCounters;

const DOWN_FOR: Duration = Duration::from_secs(2);

/// A forwarding node this mount sends to, with its counters and failure state.
pub struct Node {
    /// Its name (`--fwd NAME=HOST:PORT`), as the job mapping names it.
    pub name: String,
    /// Its request address, host:port.
    pub addr: String,
    /// Reserved for dedicated allocation: never a default node (`--reserved`).
    pub reserved: bool,
    down_until_ms: AtomicU64,
    /// Requests sent to it (each try of a failover counts).
    pub requests: AtomicU64,
    /// Requests it did not answer (connect, send or reply failed).
    pub failures: AtomicU64,
}

/// The live job → forwarding-node mapping (node names, first = primary).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Mapping {
    /// Job id → the names of its forwarding nodes.
    #[serde(default)]
    pub jobs: BTreeMap<String, Vec<String>>,
}

/// The mount's shared-memory data region, cut into fixed-size slots, and their free list.
pub struct Slots {
    /// The sealed memfd region the slots are cut from.
    pub region: Region,
    /// Bytes per slot (the largest request a slot takes: FUSE's max_write, 1 MiB).
    pub slot_size: usize,
    free: Mutex<Vec<u32>>,
    /// Slots never reused: a daemon may still read or write them (its connection failed
    /// while a request on the slot was in flight, and the request went elsewhere).
    tainted: Vec<std::sync::atomic::AtomicBool>,
    /// Requests that found no free slot (their data went through a pooled buffer instead).
    pub exhausted: AtomicU64,
}

impl Slots {
    /// A region of `n` slots of `slot_size` bytes with a fresh nonce.
    pub fn new(n: usize, slot_size: usize) -> Result<Slots, String> {
        let region = Region::create(n, slot_size, auth::random_bytes())?;
        Ok(Slots {
            region,
            slot_size,
            free: Mutex::new((0..n as u32).rev().collect()),
            tainted: (0..n).map(|_| std::sync::atomic::AtomicBool::new(false)).collect(),
            exhausted: AtomicU64::new(0),
        })
    }

    /// A free slot for `len` bytes (None: too large, or none free).
    pub fn get(&self, len: usize) -> Option<u32> {
        if len > self.slot_size {
            return None;
        }
        let s = self.free.lock().unwrap().pop();
        if s.is_none() {
            self.exhausted.fetch_add(1, Relaxed);
        }
        s
    }

    /// Gives `slot` back (a tainted one stays out of use).
    pub fn put(&self, slot: u32) {
        if !self.tainted[slot as usize].load(Relaxed) {
            self.free.lock().unwrap().push(slot);
        }
    }

    /// Slots taken out of use by [`Slots::taint`].
    pub fn tainted_count(&self) -> usize {
        self.tainted.iter().filter(|t| t.load(Relaxed)).count()
    }

    fn taint(&self, slot: u32) {
        self.tainted[slot as usize].store(true, Relaxed);
    }

    /// Byte offset of `slot` in the region.
    pub fn offset(&self, slot: u32) -> u64 {
        region::HEADER + slot as u64 * self.slot_size as u64
    }

    /// The first `len` bytes of `slot` (len ≤ slot_size).
    ///
    /// # Safety
    /// The caller holds `slot` (taken with [`Slots::get`], not yet put back) and the daemon is
    /// not writing it (no request on it in flight).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes(&self, slot: u32, len: usize) -> &mut [u8] {
        self.region.slice_mut(self.offset(slot), len).expect("slot inside the region")
    }

    /// Slots free now.
    pub fn free_count(&self) -> usize {
        self.free.lock().unwrap().len()
    }
}

/// The client side of the protocol: the forwarding nodes, the job mapping, routing and
/// failover, data buffers and the shared-memory region (see the module docs).
pub struct Rpc {
    /// Data buffers of writes sent and read replies received on the socket.
    pub bufs: BufPool,
    /// The shared-memory data region (None: `--shm-slots 0`, or no memfd here).
    pub shm: Option<Slots>,
    /// Data requests sent through the region (`WriteShm`/`ReadShm`).
    pub shm_requests: AtomicU64,
    /// Requests with a slot sent on a connection the daemon did not attach (data on the socket).
    pub shm_fallbacks: AtomicU64,
    /// The forwarding nodes, in ring order.
    pub nodes: Vec<Node>,
    /// Index in `nodes` of this mount's default node (jobs without a mapping entry).
    pub default_idx: usize,
    /// The live job mapping (replaced whole by `PUT /mapping`, through [`Rpc::remap`]).
    pub mapping: ArcSwap<Mapping>,
    /// Held shared by every request from its routing to its answer, and exclusively by a
    /// remap ([`Rpc::remap`]): while the old forwarding nodes flush, no request is in flight.
    switch: RwLock<()>,
    /// Time a node may take to answer a request.
    pub timeout: Duration,
    /// This compute node's name (in every request's context).
    pub compute_node: String,
    /// The next request id: starts at a random value in `[1, 2^63)` ([`first_request_id`]).
    next_id: AtomicU64,
    /// Requests tried on another node than their first.
    pub failovers: AtomicU64,
    /// Idempotent requests replayed after a node failed during them.
    pub replays: AtomicU64,
    /// Pooled connections found closed by their daemon before a request (replaced by a new one).
    pub stale_connections: AtomicU64,
    epoch: Instant,
    /// The site key (handshake).
    key: SiteKey,
    /// This mount instance (random): names its connections ([`Op::Watch`]).
    pub instance: u64,
    /// The watch connections' counters.
    pub watches: WatchCounters,
}

/// The first request id of a mount instance: random in `[1, 2^63)`, so two instances of a mount
/// on one compute node (a restart) practically never share an id (ids rise by one per request).
pub fn first_request_id() -> u64 {
    (u64::from_le_bytes(auth::random_bytes()) >> 1).max(1)
}

/// One connection: reader, writer, and whether the daemon attached the mount's region.
type Conn = (BufReader<TcpStream>, TcpStream, bool);

/// One thread's connections, by node index.
#[derive(Default)]
pub struct Conns {
    m: HashMap<usize, Conn>,
    frame: Frame,
}

enum Fail {
    /// Nothing reached the node: always safe to try elsewhere.
    NotSent(String),
    /// The request may have been executed.
    Sent(String),
}

impl Rpc {
    /// `nodes`: (name, host:port) in ring order; `reserved`: names among them kept for
    /// dedicated allocation. Errors: no nodes, an unknown reserved name, or every node reserved.
    pub fn new(
        nodes: Vec<(String, String)>,
        reserved: &[String],
        node_index: usize,
        timeout: Duration,
        compute_node: String,
        key: SiteKey,
    ) -> Result<Rpc, String> {
        if let Some(r) = reserved.iter().find(|r| !nodes.iter().any(|(n, _)| n == *r)) {
            return Err(format!("reserved node {r} is not a forwarding node"));
        }
        let shared: Vec<usize> = (0..nodes.len()).filter(|&i| !reserved.contains(&nodes[i].0)).collect();
        if shared.is_empty() {
            return Err("every forwarding node is reserved: none left for the default mapping".into());
        }
        Ok(Rpc {
            bufs: BufPool::new(64),
            shm: None,
            shm_requests: AtomicU64::new(0),
            shm_fallbacks: AtomicU64::new(0),
            default_idx: shared[node_index % shared.len()],
            nodes: nodes
                .into_iter()
                .map(|(name, addr)| Node {
                    reserved: reserved.contains(&name),
                    name,
                    addr,
                    down_until_ms: AtomicU64::new(0),
                    requests: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                })
                .collect(),
            mapping: ArcSwap::from_pointee(Mapping::default()),
            switch: RwLock::new(()),
            timeout,
            compute_node,
            next_id: AtomicU64::new(first_request_id()),
            failovers: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            stale_connections: AtomicU64::new(0),
            instance: first_request_id(),
            watches: WatchCounters::default(),
            epoch: Instant::now(),
            key,
        })
    }

    /// Index in `nodes` of the node called `name`.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Checks a job mapping before it is used. Errors: a job with no nodes, or an unknown node.
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

    /// Candidate nodes of a request of rank `rank` (-1: unknown) of `job`, primary first.
    pub fn order(&self, job: &str, rank: i32) -> Vec<usize> {
        let m = self.mapping.load();
        let mut out: Vec<usize> = match m.jobs.get(job) {
            Some(ns) => ns.iter().filter_map(|n| self.node_index(n)).collect(),
            None => vec![self.default_idx],
        };
        if out.is_empty() {
            out.push(self.default_idx);
        }
        if out.len() > 1 && rank > 0 {
            let k = out.len();
            out.rotate_left(rank as usize % k);
        }
        let first = out[0];
        let n = self.nodes.len();
        for reserved in [false, true] {
            for k in 1..=n {
                let i = (first + k) % n;
                if self.nodes[i].reserved == reserved && !out.contains(&i) {
                    out.push(i);
                }
            }
        }
        out
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Node `i` failed: one more failure counted, and tried last for `DOWN_FOR`.
    fn mark_down(&self, i: usize) {
        let n = &self.nodes[i];
        n.failures.fetch_add(1, Relaxed);
        n.down_until_ms.store(self.now_ms() + DOWN_FOR.as_millis() as u64, Relaxed);
    }

    fn is_down(&self, i: usize) -> bool {
        self.nodes[i].down_until_ms.load(Relaxed) > self.now_ms()
    }

    /// Sends `op` on behalf of `ctx` and returns the reply body or an errno. A write's data
    /// buffer goes back to [`Rpc::bufs`]; give a read's `Body::Data` buffer back there too.
    pub fn call(&self, conns: &mut Conns, ctx: &Ctx, op: Op) -> Result<Body, i32> {
        self.call_slot(conns, ctx, op, None)
    }

    /// [`Rpc::call`] whose data is in (a `Write` with empty `data` and `len` bytes in the
    /// slot) or goes to (a `Read`) shared-memory slot `slot = (slot, len)`: a read answered
    /// through the region returns `Body::ShmData`, one answered on the socket `Body::Data`.
    pub fn call_slot(&self, conns: &mut Conns, ctx: &Ctx, op: Op, slot: Option<(u32, u32)>) -> Result<Body, i32> {
        let mut req = Request { id: self.next_id.fetch_add(1, Relaxed), ctx: ctx.clone(), op, replay: false };
        let switch = self.switch.read().unwrap_or_else(|e| e.into_inner());
        let r = self.call_req(conns, &mut req, slot);
        drop(switch);
        if let Op::Write { data, .. } = req.op {
            self.bufs.put(data);
        }
        r
    }

    /// Tries `req` on its candidate nodes until one answers. Once a try failed after its request
    /// was sent, the following tries carry `req.replay` (set here).
    fn call_req(&self, conns: &mut Conns, req: &mut Request, slot: Option<(u32, u32)>) -> Result<Body, i32> {
        let order = self.order(&req.ctx.job_id, req.ctx.rank);
        // Up nodes first, in mapping order; down ones only as a last resort.
        let mut tries: Vec<usize> = order.iter().copied().filter(|&i| !self.is_down(i)).collect();
        tries.extend(order.iter().copied().filter(|&i| self.is_down(i)));
        for (k, &i) in tries.iter().enumerate() {
            if k > 0 {
                self.failovers.fetch_add(1, Relaxed);
            }
            self.nodes[i].requests.fetch_add(1, Relaxed);
            match self.once(conns, i, req, slot) {
                Ok(Reply { body: Ok(b), .. }) => return Ok(b),
                Ok(Reply { body: Err(e), .. }) => return Err(e.errno),
                Err(f) => {
                    if let (Some((s, _)), Some(slots), Fail::Sent(_), Some((_, _, true))) =
                        (slot, &self.shm, &f, conns.m.get(&i))
                    {
                        // The daemon may still touch the slot after we moved on.
                        slots.taint(s);
                    }
                    conns.m.remove(&i);
                    let n = &self.nodes[i];
                    self.mark_down(i);
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
                            req.replay = true;
                        }
                    }
                }
            }
        }
        Err(errno::EIO)
    }

    fn connect(&self, i: usize) -> Result<Conn, String> {
        let (mut r, mut w) = self.dial(i)?;
        let attached = self.attach(&mut r, &mut w, &self.nodes[i].name)?;
        self.name_conn(&mut r, &mut w, false)?;
        Ok((r, w, attached))
    }

    /// A new connection to node `i`, handshake done.
    fn dial(&self, i: usize) -> Result<(BufReader<TcpStream>, TcpStream), String> {
        let n = &self.nodes[i];
        let addr = n.addr.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("no address")?;
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| format!("connect: {e}"))?;
        pharos_fwd_proto::tune_data_socket(&s);
        s.set_read_timeout(Some(self.timeout)).ok();
        s.set_write_timeout(Some(self.timeout)).ok();
        let mut w = s.try_clone().map_err(|e| e.to_string())?;
        let mut r = BufReader::with_capacity(16 << 10, s);
        self.handshake(&mut r, &mut w)?;
        Ok((r, w))
    }

    /// Offers the region to the daemon on a new connection; Ok(true) when it attached it.
    /// A refusal (another host, shared memory off, an older daemon) is not an error: the
    /// connection carries the data itself.
    fn attach(&self, r: &mut BufReader<TcpStream>, w: &mut TcpStream, node: &str) -> Result<bool, String> {
        let Some(slots) = &self.shm else { return Ok(false) };
        let reg = &slots.region;
        let op =
            Op::ShmAttach { pid: std::process::id(), fd: reg.raw_fd(), size: reg.len() as u64, nonce: reg.nonce() };
        let ctx = Ctx { compute_node: self.compute_node.clone(), rank: -1, ..Default::default() };
        let id = self.next_id.fetch_add(1, Relaxed);
        proto::write_msg(w, &Request { id, ctx, op, replay: false }).map_err(|e| format!("shm attach: send: {e}"))?;
        match proto::read_msg::<Reply>(r).map_err(|e| format!("shm attach: {e}"))? {
            Reply { id: rid, body: Ok(Body::Ok) } if rid == id => Ok(true),
            Reply { id: rid, body: Err(e) } if rid == id || rid == 0 => {
                log::debug!("forwarding node {node}: shared-memory region not attached: {}", e.msg);
                Ok(false)
            }
            other => Err(format!("shm attach: unexpected reply {other:?}")),
        }
    }

    /// This mount's half of the handshake on a new connection: answers the daemon's challenge
    /// with its proof of the site key and checks the daemon's proof.
    fn handshake(&self, r: &mut BufReader<TcpStream>, w: &mut TcpStream) -> Result<(), String> {
        let theirs = match proto::read_msg::<Reply>(r).map_err(|e| format!("handshake: {e}"))? {
            Reply { body: Ok(Body::Challenge { nonce }), .. } => nonce,
            Reply { body: Err(e), .. } => return Err(format!("handshake: errno {}: {}", e.errno, e.msg)),
            other => return Err(format!("handshake: expected a challenge, got {other:?}")),
        };
        let ours: auth::Nonce = auth::random_bytes();
        let proof = self.key.client_proof(&theirs, &ours);
        let ctx = Ctx { compute_node: self.compute_node.clone(), rank: -1, ..Default::default() };
        let req =
            Request { id: self.next_id.fetch_add(1, Relaxed), ctx, op: Op::Auth { nonce: ours, proof }, replay: false };
        proto::write_msg(w, &req).map_err(|e| format!("handshake: send: {e}"))?;
        match proto::read_msg::<Reply>(r).map_err(|e| format!("handshake: {e}"))? {
            Reply { body: Ok(Body::Authed { proof }), .. } if self.key.check_server_proof(&theirs, &ours, &proof) => {
                Ok(())
            }
            Reply { body: Ok(Body::Authed { .. }), .. } => {
                Err("handshake: the daemon's proof is wrong (another site key)".into())
            }
            Reply { body: Err(e), .. } => Err(format!("handshake refused: errno {}: {}", e.errno, e.msg)),
            other => Err(format!("handshake: unexpected reply {other:?}")),
        }
    }

    fn once(&self, conns: &mut Conns, i: usize, req: &Request, slot: Option<(u32, u32)>) -> Result<Reply, Fail> {
        let id = req.id;
        if conns.m.get(&i).is_some_and(|c| !reusable(c)) {
            // The daemon closed it (a restart, an idle timeout): a new connection, before anything
            // is sent, so that the request is a first try on this node whatever its op.
            conns.m.remove(&i);
            self.stale_connections.fetch_add(1, Relaxed);
        }
        if let std::collections::hash_map::Entry::Vacant(e) = conns.m.entry(i) {
            e.insert(self.connect(i).map_err(Fail::NotSent)?);
        }
        let Conns { m, frame } = conns;
        let (r, w, attached) = m.get_mut(&i).unwrap();
        let sent = match (slot, &self.shm) {
            (Some((s, len)), Some(slots)) if *attached => {
                self.shm_requests.fetch_add(1, Relaxed);
                let at = slots.offset(s);
                let op = match &req.op {
                    Op::Write { path, cap, offset, .. } => {
                        Op::WriteShm { path: path.clone(), cap: cap.clone(), offset: *offset, slot: at, len }
                    }
                    Op::Read { path, cap, offset, size } => {
                        Op::ReadShm { path: path.clone(), cap: cap.clone(), offset: *offset, size: *size, slot: at }
                    }
                    other => other.clone(),
                };
                proto::write_msg(w, &Request { id, ctx: req.ctx.clone(), op, replay: req.replay })
            }
            (Some((s, len)), Some(slots)) if matches!(req.op, Op::Write { .. }) => {
                self.shm_fallbacks.fetch_add(1, Relaxed);
                // SAFETY: this request holds the slot; nothing else writes it meanwhile.
                proto::write_msg_data(w, req, unsafe { slots.bytes(s, len as usize) })
            }
            (Some(_), _) => {
                self.shm_fallbacks.fetch_add(1, Relaxed);
                proto::write_msg(w, req)
            }
            (None, _) => proto::write_msg(w, req),
        };
        sent.map_err(|e| Fail::Sent(format!("send: {e}")))?;
        if frame.data.capacity() == 0 {
            frame.data = self.bufs.take();
        }
        proto::read_frame_into(r, frame).map_err(|e| Fail::Sent(format!("reply: {e}")))?;
        let rep: Reply = proto::decode(frame).map_err(|e| Fail::Sent(format!("reply: {e}")))?;
        if rep.id != id {
            return Err(Fail::Sent(format!("reply id {} for request {id}", rep.id)));
        }
        Ok(rep)
    }

    /// The counters and nodes as JSON (`GET /status`, and the Prometheus families of
    /// `/metrics`): per node its address, role, state, requests and failures; failovers,
    /// replays and the shared-memory region's use.
    pub fn status(&self) -> serde_json::Value {
        let nodes: Vec<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                serde_json::json!({
                    "name": n.name, "addr": n.addr, "default": i == self.default_idx, "reserved": n.reserved,
                    "down": self.is_down(i), "requests": n.requests.load(Relaxed), "failures": n.failures.load(Relaxed),
                })
            })
            .collect();
        serde_json::json!({
            "compute_node": self.compute_node,
            "nodes": nodes,
            "failovers": self.failovers.load(Relaxed),
            "replays": self.replays.load(Relaxed),
            "stale_connections": self.stale_connections.load(Relaxed),
            "invalidations": self.watches.changes.load(Relaxed),
            "watch_connects": self.watches.connects.load(Relaxed),
            "shm": self.shm.as_ref().map(|s| serde_json::json!({
                "slots": (s.region.len() - region::HEADER as usize) / s.slot_size,
                "slot_size": s.slot_size,
                "free": s.free_count(),
                "exhausted": s.exhausted.load(Relaxed),
                "tainted": s.tainted_count(),
                "requests": self.shm_requests.load(Relaxed),
                "fallbacks": self.shm_fallbacks.load(Relaxed),
            })),
        })
    }
}

/// Whether a pooled connection can carry a request: nothing is waiting on it (no reply is due
/// between requests) and the daemon has not closed it. A restarted daemon's old connections are
/// closed: a request sent on one fails only after it was sent, and then only an idempotent one
/// may be replayed (and only on another node). One non-blocking peek, `MSG_PEEK | MSG_DONTWAIT`:
/// EAGAIN means open and idle.
fn reusable(c: &Conn) -> bool {
    use std::os::fd::AsRawFd;
    let (r, _, _) = c;
    if !r.buffer().is_empty() {
        return false;
    }
    let mut b = 0u8;
    // SAFETY: a one-byte buffer we own, on the connection's open socket.
    let n = unsafe {
        libc::recv(r.get_ref().as_raw_fd(), (&mut b as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    pub(super) fn rpc(reserved: &[&str], node_index: usize) -> Result<Rpc, String> {
        let nodes = (0..4).map(|i| (format!("fwd{i}"), format!("127.0.0.1:{}", 9000 + i))).collect();
        let reserved: Vec<String> = reserved.iter().map(|s| s.to_string()).collect();
        Rpc::new(nodes, &reserved, node_index, Duration::from_secs(1), "cn".into(), SiteKey::new(&[1; 32]))
    }

    fn names<'a>(r: &'a Rpc, job: &str, rank: i32) -> Vec<&'a str> {
        r.order(job, rank).into_iter().map(|i| r.nodes[i].name.as_str()).collect()
    }

    #[test]
    fn default_node_is_never_reserved_and_reserved_nodes_come_last() {
        let r = rpc(&["fwd2", "fwd3"], 0).unwrap();
        assert_eq!(names(&r, "j", 0), ["fwd0", "fwd1", "fwd2", "fwd3"]);
        let r = rpc(&["fwd2", "fwd3"], 1).unwrap();
        assert_eq!(names(&r, "j", 0), ["fwd1", "fwd0", "fwd2", "fwd3"]);
        // node index 2 of 2 shared nodes wraps to fwd0, not to the reserved fwd2
        let r = rpc(&["fwd2", "fwd3"], 2).unwrap();
        assert_eq!(names(&r, "j", 5), ["fwd0", "fwd1", "fwd2", "fwd3"]);
        // no reservation: the ring as before
        let r = rpc(&[], 2).unwrap();
        assert_eq!(names(&r, "j", 0), ["fwd2", "fwd3", "fwd0", "fwd1"]);
    }

    #[test]
    fn a_job_on_more_nodes_spreads_its_ranks() {
        let r = rpc(&["fwd2", "fwd3"], 0).unwrap();
        r.mapping.store(Arc::new(Mapping { jobs: [("big".to_string(), vec!["fwd2".into(), "fwd3".into()])].into() }));
        assert_eq!(names(&r, "big", 0), ["fwd2", "fwd3", "fwd0", "fwd1"]);
        assert_eq!(names(&r, "big", 1), ["fwd3", "fwd2", "fwd0", "fwd1"]);
        assert_eq!(names(&r, "big", 2), ["fwd2", "fwd3", "fwd0", "fwd1"]);
        assert_eq!(names(&r, "big", -1), ["fwd2", "fwd3", "fwd0", "fwd1"]);
        // other jobs keep the default
        assert_eq!(names(&r, "small", 1), ["fwd0", "fwd1", "fwd2", "fwd3"]);
    }

    /// Slots: bounded, too-large requests get none, a tainted slot is never handed out again.
    #[test]
    fn slots_are_bounded_and_tainted_ones_stay_out() {
        let s = Slots::new(2, 4096).unwrap();
        assert_eq!(s.get(4097), None);
        let (a, b) = (s.get(4096).unwrap(), s.get(1).unwrap());
        assert_ne!(a, b);
        assert_eq!(s.get(1), None);
        assert_eq!(s.exhausted.load(Relaxed), 1);
        assert_eq!(s.offset(a).max(s.offset(b)), region::HEADER + 4096);
        unsafe { s.bytes(a, 3).copy_from_slice(b"abc") };
        assert_eq!(unsafe { s.region.slice(s.offset(a), 3).unwrap() }, b"abc");
        s.taint(b);
        s.put(b);
        s.put(a);
        assert_eq!((s.free_count(), s.tainted_count()), (1, 1));
        assert_eq!(s.get(1), Some(a));
        assert_eq!(s.get(1), None);
    }

    /// A node's side of one connection: the handshake with `key` and the connection's naming
    /// (`Watch`, answered), then every request it reads goes to `seen`; it answers `Ok` only when `answer`, else keeps the connection silent.
    fn node(key: SiteKey, answer: bool, seen: std::sync::mpsc::Sender<Request>) -> String {
        node_closing(key, answer, seen, usize::MAX)
    }

    /// [`node`] that closes each connection after answering `per_conn` requests on it, as a
    /// restarted daemon's old connections are closed.
    fn node_closing(key: SiteKey, answer: bool, seen: std::sync::mpsc::Sender<Request>, per_conn: usize) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let mut w = s.unwrap();
                let mut r = BufReader::new(w.try_clone().unwrap());
                let theirs: auth::Nonce = auth::random_bytes();
                proto::write_msg(&mut w, &Reply { id: 0, body: Ok(Body::Challenge { nonce: theirs }) }).unwrap();
                let Request { id, op: Op::Auth { nonce, .. }, .. } = proto::read_msg::<Request>(&mut r).unwrap() else {
                    panic!("no handshake")
                };
                let proof = key.server_proof(&theirs, &nonce);
                proto::write_msg(&mut w, &Reply { id, body: Ok(Body::Authed { proof }) }).unwrap();
                let mut served = 0;
                while let Ok(req) = proto::read_msg::<Request>(&mut r) {
                    let id = req.id;
                    if let Op::Watch { .. } = req.op {
                        // A daemon's decoder names every connection at once, hung or not.
                        proto::write_msg(&mut w, &Reply { id, body: Ok(Body::Ok) }).unwrap();
                        continue;
                    }
                    seen.send(req).unwrap();
                    if answer {
                        proto::write_msg(&mut w, &Reply { id, body: Ok(Body::Ok) }).unwrap();
                    }
                    served += 1;
                    if served == per_conn {
                        break; // r and w dropped: the connection closed
                    }
                }
            }
        });
        addr
    }

    /// Issue 25, item 5: a request that timed out on its node after being sent is replayed on
    /// the next node with the same id and `replay` set; the next request is a first try again.
    #[test]
    fn a_replayed_try_keeps_the_id_and_carries_the_replay_flag() {
        let key = SiteKey::new(&[7; 32]);
        let (tx, rx) = std::sync::mpsc::channel();
        let silent = node(key.clone(), false, tx.clone());
        let answering = node(key.clone(), true, tx);
        let nodes = vec![("fwd0".to_string(), silent), ("fwd1".to_string(), answering)];
        let r = Rpc::new(nodes, &[], 0, Duration::from_millis(300), "cn0".into(), key).unwrap();
        let mut conns = Conns::default();
        let ctx = Ctx { compute_node: "cn0".into(), job_id: "j".into(), ..Default::default() };
        assert_eq!(r.call(&mut conns, &ctx, Op::Getattr { path: "f".into() }), Ok(Body::Ok));
        let (first, second) = (rx.recv().unwrap(), rx.recv().unwrap());
        assert_eq!((first.id, first.replay), (second.id, false));
        assert!(second.replay, "the try on fwd1 replays the one fwd0 may have executed");
        assert_eq!((r.replays.load(Relaxed), r.failovers.load(Relaxed)), (1, 1));
        // fwd0 is down now: the next request goes to fwd1 first, as an original.
        assert_eq!(r.call(&mut conns, &ctx, Op::Getattr { path: "g".into() }), Ok(Body::Ok));
        let third = rx.recv().unwrap();
        assert!(third.id > second.id && !third.replay, "{third:?}"); // (handshakes take ids too)
    }

    /// A node whose daemon restarted closed the mount's pooled connections: the next request,
    /// even a non-idempotent one that could never be replayed, goes out on a new connection
    /// (before, it was sent on the closed one and failed with EIO: 15 of 32 opens after a restart).
    #[test]
    fn a_connection_the_daemon_closed_is_replaced_before_sending() {
        let key = SiteKey::new(&[9; 32]);
        let (tx, rx) = std::sync::mpsc::channel();
        let addr = node_closing(key.clone(), true, tx, 1);
        let r = Rpc::new(vec![("fwd0".to_string(), addr)], &[], 0, Duration::from_secs(2), "cn0".into(), key).unwrap();
        let mut conns = Conns::default();
        let ctx = Ctx { compute_node: "cn0".into(), job_id: "j".into(), ..Default::default() };
        let mkdir = |p: &str| Op::Mkdir { path: p.into(), mode: 0o755 };
        assert!(!mkdir("a").idempotent(), "the case that matters: no replay possible");
        assert_eq!(r.call(&mut conns, &ctx, mkdir("a")), Ok(Body::Ok));
        rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(100)); // the daemon's close reaches the mount
        assert_eq!(r.call(&mut conns, &ctx, mkdir("b")), Ok(Body::Ok));
        assert_eq!(rx.recv().unwrap().op.name(), "mkdir");
        assert_eq!((r.stale_connections.load(Relaxed), r.replays.load(Relaxed)), (1, 0));
    }

    /// A pipelined batch: one write, every reply matched to its request; on a node that goes
    /// silent mid-batch, the batch goes on request by request on the next node, as replays.
    #[test]
    fn a_pipelined_batch_is_answered_and_fails_over_as_replays() {
        let key = SiteKey::new(&[5; 32]);
        let (tx, rx) = std::sync::mpsc::channel();
        let answering = node(key.clone(), true, tx.clone());
        let r = Rpc::new(
            vec![("fwd0".to_string(), answering.clone())],
            &[],
            0,
            Duration::from_secs(2),
            "cn0".into(),
            key.clone(),
        )
        .unwrap();
        let mut conns = Conns::default();
        let ctx = Ctx { compute_node: "cn0".into(), job_id: "j".into(), ..Default::default() };
        let reqs = |n: usize| (0..n).map(|i| (ctx.clone(), Op::Getattr { path: format!("f{i}") })).collect::<Vec<_>>();
        assert_eq!(r.call_many(&mut conns, reqs(5)), vec![Ok(Body::Ok); 5]);
        let seen: Vec<Request> = (0..5).map(|_| rx.recv().unwrap()).collect();
        assert!(seen.windows(2).all(|w| w[1].id == w[0].id + 1) && seen.iter().all(|q| !q.replay));
        let silent = node(key.clone(), false, tx);
        let nodes = vec![("fwd0".to_string(), silent), ("fwd1".to_string(), answering)];
        let r = Rpc::new(nodes, &[], 0, Duration::from_millis(300), "cn0".into(), key).unwrap();
        drop(conns); // (the test node serves one connection at a time)
        let mut conns = Conns::default();
        assert_eq!(r.call_many(&mut conns, reqs(3)), vec![Ok(Body::Ok); 3]);
        let seen: Vec<Request> = (0..6).map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        assert_eq!(seen.iter().filter(|q| q.replay).count(), 3, "{seen:?}");
        assert_eq!((r.replays.load(Relaxed), r.nodes[0].failures.load(Relaxed)), (3, 1));
    }

    /// Request ids start at a random value per mount instance (a restarted mount does not reuse them).
    #[test]
    fn request_ids_start_at_random() {
        let ids: Vec<u64> = (0..8).map(|_| first_request_id()).collect();
        assert!(ids.iter().all(|&i| (1..1 << 63).contains(&i)));
        let mut u = ids.clone();
        u.sort();
        u.dedup();
        assert_eq!(u.len(), ids.len());
    }

    #[test]
    fn bad_reservations_are_refused() {
        assert!(rpc(&["fwd9"], 0).err().unwrap().contains("fwd9"));
        assert!(rpc(&["fwd0", "fwd1", "fwd2", "fwd3"], 0).err().unwrap().contains("every forwarding node"));
    }
}
