//! Invalidations pushed to mounts (issue 29, item 1): the validity of the mounts' entry and
//! attribute caches cut short by the daemon, as FUSE's `notify_inval_entry` /
//! `notify_inval_inode` let a file system do (libfuse's `notify_inval_*` examples; NFSv4
//! delegations and Lustre's LDLM locks solve the same problem with revocable leases).
//!
//! A mount names each of its connections with [`Op::Watch`] (its instance id); one connection
//! per forwarding node is its watch connection (`push`). When a request of mount A changes a
//! name or attributes (create, mkdir, unlink, rename, setattr, a write, ...), the worker that
//! served it queues the change ([`Watchers::changed`], only when some other mount watches),
//! and the notifier thread resolves the paths to inode numbers (the namespace's, which are
//! the mounts' kernel inode numbers; the namespace root is sent as 1), coalesces what is
//! queued, and pushes one [`Body::Changes`] to every watching mount but A. The mount turns
//! each into the kernel's invalidation.
//!
//! Bounds: a change is pushed after the reply to the request that made it, typically within a
//! millisecond; the mount's cache TTL (`--attr-ttl-ms`) bounds staleness where no push comes
//! (a forwarding node the mount does not watch, a full queue: counted as `dropped`, a watch
//! connection being re-made).
use std::collections::{HashMap, HashSet};
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use pharos_fwd_proto::{self as proto, Body, Change, Op, Reply};

use super::conn::Conn;
use crate::backend::Backend;

/// Changes queued before the notifier thread takes them; more are dropped (and counted).
const QUEUE: usize = 65_536;
/// Most changes in one push.
const BATCH: usize = 4096;
/// A watch connection that takes longer to accept a push is dropped (its mount re-makes it).
const SEND_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a request that changed attributes waits for the other mounts' acknowledgements.
pub(crate) const ACK_WAIT: Duration = Duration::from_millis(100);

/// What a request changed, by namespace path (resolved to inode numbers by the notifier).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum What {
    /// The name at this path now names something else or nothing; its directory's
    /// attributes changed too.
    Name(String),
    /// The attributes of the file at this path changed.
    Attrs(String),
    /// The attributes of this inode changed.
    Ino(u64),
}

struct Sub {
    mount: u64,
    conn: Arc<Conn>,
    id: u64,
}

/// The mounts watching this daemon and the queue of changes to push to them.
pub(crate) struct Watchers {
    subs: Mutex<Vec<Sub>>,
    /// Mount ids of `subs` (for the lock-free "does anyone else watch" test).
    n: AtomicUsize,
    /// The only watching mount while exactly one watches (0 otherwise).
    only: AtomicU64,
    tx: Sender<(u64, What)>,
    rx: Receiver<(u64, What)>,
    /// Changes pushed, pushes sent, changes dropped (queue full), subscriptions dropped.
    pub pushed: AtomicU64,
    pub pushes: AtomicU64,
    pub dropped: AtomicU64,
    pub lost_watchers: AtomicU64,
    /// Attribute changes pushed and waited for: the next ack id, the mounts each waits for.
    next_ack: AtomicU64,
    waiting: Mutex<HashMap<u64, HashSet<u64>>>,
    acked: Condvar,
    /// Synchronous pushes not acknowledged by every mount within [`ACK_WAIT`].
    pub late_acks: AtomicU64,
    /// Directories recalled from their holding mount ([`Watchers::recall`]).
    pub recalls: AtomicU64,
}

impl Default for Watchers {
    fn default() -> Self {
        let (tx, rx) = bounded(QUEUE);
        Watchers {
            subs: Mutex::new(Vec::new()),
            n: AtomicUsize::new(0),
            only: AtomicU64::new(0),
            tx,
            rx,
            pushed: AtomicU64::new(0),
            pushes: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            lost_watchers: AtomicU64::new(0),
            next_ack: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
            acked: Condvar::new(),
            late_acks: AtomicU64::new(0),
            recalls: AtomicU64::new(0),
        }
    }
}

impl Watchers {
    /// Registers `conn` as mount `mount`'s watch connection, pushes under request id `id`.
    pub(crate) fn add(&self, mount: u64, conn: Arc<Conn>, id: u64) {
        let _ = conn.w.lock().unwrap().set_write_timeout(Some(SEND_TIMEOUT));
        let mut s = self.subs.lock().unwrap();
        s.push(Sub { mount, conn, id });
        self.publish(&s);
    }

    fn publish(&self, s: &[Sub]) {
        let mounts: HashSet<u64> = s.iter().map(|x| x.mount).collect();
        self.n.store(mounts.len(), Relaxed);
        self.only.store(if mounts.len() == 1 { *mounts.iter().next().unwrap() } else { 0 }, Relaxed);
    }

    /// Mounts watching now.
    pub(crate) fn mounts(&self) -> usize {
        self.n.load(Relaxed)
    }

    /// Whether a mount other than `origin` watches.
    fn others(&self, origin: u64) -> bool {
        match self.n.load(Relaxed) {
            0 => false,
            1 => self.only.load(Relaxed) != origin,
            _ => true,
        }
    }

    /// Queues what a request of mount `origin` (0: unnamed) changed, when another mount
    /// watches. Never blocks: a full queue drops the change (counted; TTL-bounded).
    pub(crate) fn changed(&self, origin: u64, what: impl FnOnce() -> Vec<What>) {
        if !self.others(origin) {
            return;
        }
        for w in what() {
            if let Err(TrySendError::Full(_)) = self.tx.try_send((origin, w)) {
                self.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// The notifier thread's loop: takes queued changes, resolves them against `b`'s
    /// namespace and pushes them; returns when `stop` says so.
    pub(crate) fn run(&self, b: &Backend, stop: &std::sync::atomic::AtomicBool) {
        while !stop.load(Relaxed) {
            let Ok(first) = self.rx.recv_timeout(Duration::from_millis(200)) else { continue };
            let mut batch = vec![first];
            batch.extend(self.rx.try_iter().take(BATCH - 1));
            let out = resolve(b, batch);
            self.push(&out, 0);
        }
    }

    /// Pushes what a request of mount `origin` changed in attributes now, and waits until
    /// every other watching mount acknowledged it, at most [`ACK_WAIT`] (then counted late):
    /// the request's reply follows, so the change is seen everywhere once the call returns.
    /// (Attribute invalidations take no directory lock in the kernel; name changes go through
    /// the queue: an entry invalidation waits for the directory's lock, which a mount's own
    /// request in that directory may hold while its reply waits here.)
    pub(crate) fn changed_now(&self, b: &Backend, origin: u64, what: Vec<What>) {
        if !self.others(origin) {
            return;
        }
        let out = resolve(b, what.into_iter().map(|w| (origin, w)).collect());
        if out.is_empty() {
            return;
        }
        let ack = self.next_ack.fetch_add(1, Relaxed);
        let mounts: HashSet<u64> = self.subs.lock().unwrap().iter().map(|s| s.mount).filter(|m| *m != origin).collect();
        self.waiting.lock().unwrap().insert(ack, mounts);
        self.push(&out, ack);
        self.wait_acks(ack, ACK_WAIT);
    }

    /// Recalls directory `dir` (the namespace's inode number, the root as 1) from mount
    /// `holder` ([`Change::Recall`]) and waits for its acknowledgement, at most `wait` (then
    /// counted late). False when `holder` does not watch this daemon (nothing sent: its cache
    /// TTL bounds what it answers).
    pub(crate) fn recall(&self, holder: u64, dir: u64, wait: Duration) -> bool {
        let ack = self.next_ack.fetch_add(1, Relaxed);
        self.waiting.lock().unwrap().insert(ack, HashSet::from([holder]));
        let body = Body::Changes { ack, changes: vec![Change::Recall { dir }] };
        let mut sent = false;
        let mut subs = self.subs.lock().unwrap();
        let before = subs.len();
        subs.retain(|s| {
            if s.mount != holder {
                return true;
            }
            let w = s.conn.w.lock().unwrap();
            match proto::write_msg(&mut &*w, &Reply { id: s.id, body: Ok(body.clone()) }) {
                Ok(()) => {
                    sent = true;
                    self.recalls.fetch_add(1, Relaxed);
                    true
                }
                Err(e) => {
                    log::warn!("watch of mount {holder:016x}: recall failed: {e}; dropped");
                    let _ = w.shutdown(std::net::Shutdown::Both);
                    false
                }
            }
        });
        if subs.len() != before {
            self.lost_watchers.fetch_add((before - subs.len()) as u64, Relaxed);
            self.publish(&subs);
        }
        drop(subs);
        match sent {
            true => self.wait_acks(ack, wait),
            false => {
                self.waiting.lock().unwrap().remove(&ack);
            }
        }
        sent
    }

    /// Waits until every mount push `ack` went to acknowledged it, at most `wait`.
    fn wait_acks(&self, ack: u64, wait: Duration) {
        let w = self.waiting.lock().unwrap();
        let (mut w, t) =
            self.acked.wait_timeout_while(w, wait, |w| w.get(&ack).is_some_and(|m| !m.is_empty())).unwrap();
        if t.timed_out() {
            self.late_acks.fetch_add(1, Relaxed);
        }
        w.remove(&ack);
    }

    /// Mount `mount` acknowledged the push `ack`.
    pub(crate) fn ack(&self, mount: u64, ack: u64) {
        if let Some(m) = self.waiting.lock().unwrap().get_mut(&ack) {
            m.remove(&mount);
        }
        self.acked.notify_all();
    }

    /// Sends each watching mount the changes of `out` that other mounts made.
    fn push(&self, out: &[(u64, Change)], ack: u64) {
        let mut subs = self.subs.lock().unwrap();
        let before = subs.len();
        subs.retain(|s| {
            let changes: Vec<Change> = out.iter().filter(|(o, _)| *o != s.mount).map(|(_, c)| c.clone()).collect();
            if changes.is_empty() {
                return true;
            }
            let n = changes.len() as u64;
            let w = s.conn.w.lock().unwrap();
            match proto::write_msg(&mut &*w, &Reply { id: s.id, body: Ok(Body::Changes { ack, changes }) }) {
                Ok(()) => {
                    self.pushed.fetch_add(n, Relaxed);
                    self.pushes.fetch_add(1, Relaxed);
                    true
                }
                Err(e) => {
                    if e.kind() != ErrorKind::BrokenPipe {
                        log::warn!("watch of mount {:016x}: push failed: {e}; dropped", s.mount);
                    }
                    let _ = w.shutdown(std::net::Shutdown::Both);
                    false
                }
            }
        });
        if subs.len() != before {
            self.lost_watchers.fetch_add((before - subs.len()) as u64, Relaxed);
            self.publish(&subs);
        }
    }
}

/// The changes of `batch` ((origin, what), in the order served) as inode numbers of `b`'s
/// namespace (the root as 1), each distinct change once; a path gone since is skipped.
fn resolve(b: &Backend, batch: Vec<(u64, What)>) -> Vec<(u64, Change)> {
    let root_ino = b.ns_path("").ok().and_then(|p| std::fs::metadata(p).ok()).map(|m| m.ino());
    let as_sent = |ino: u64| if Some(ino) == root_ino { 1 } else { ino };
    let ino_of = |p: &str| -> Option<u64> { Some(as_sent(std::fs::symlink_metadata(b.ns_path(p).ok()?).ok()?.ino())) };
    let mut seen = HashSet::new();
    let mut out: Vec<(u64, Change)> = Vec::with_capacity(batch.len() * 2);
    for (origin, w) in batch {
        if !seen.insert((origin, w.clone())) {
            continue;
        }
        match w {
            What::Name(p) => {
                let (dir, name) = p.rsplit_once('/').unwrap_or(("", p.as_str()));
                if let Some(parent) = ino_of(dir) {
                    out.push((origin, Change::Entry { parent, name: name.to_string() }));
                    out.push((origin, Change::Inode { ino: parent }));
                }
            }
            What::Attrs(p) => {
                if let Some(ino) = ino_of(&p) {
                    out.push((origin, Change::Inode { ino }));
                }
            }
            What::Ino(ino) => out.push((origin, Change::Inode { ino: as_sent(ino) })),
        }
    }
    out
}

/// Whether the reply to `op` waits for the other mounts ([`Watchers::changed_now`]): changes
/// of attributes but writes' (size and times of a write are pushed without waiting).
pub(crate) fn waits_for_acks(op: &Op) -> bool {
    matches!(op, Op::Setattr { .. } | Op::Open { .. } | Op::KillSuidgid { .. })
}

/// What `op` changed when it succeeded with `body` (nothing for reads and failures).
pub(crate) fn changes_of(op: &Op, body: &Result<Body, proto::WireError>) -> Vec<What> {
    let Ok(body) = body else { return Vec::new() };
    // Node-local rank directories are one compute node's: other nodes' view of them is
    // eventually consistent (their attribute TTL), nothing is pushed (`backend/nodelocal.rs`).
    let local = |p: &str| {
        p.trim_start_matches('/').strip_prefix(crate::backend::nodelocal::DIR).is_some_and(|r| r.starts_with('/'))
    };
    match op {
        Op::Create { path, .. }
        | Op::CreateReleased { path, .. }
        | Op::Mkdir { path, .. }
        | Op::Unlink { path }
        | Op::Rmdir { path }
        | Op::Setattr { path, .. }
        | Op::Write { path, .. }
        | Op::Open { path, .. }
            if local(path) =>
        {
            return Vec::new()
        }
        Op::Rename { from: path, .. } | Op::Link { from: path, .. } if local(path) => return Vec::new(),
        _ => {}
    }
    let name = |p: &str| What::Name(p.trim_start_matches('/').to_string());
    let attrs = |p: &str| What::Attrs(p.trim_start_matches('/').to_string());
    match op {
        Op::Create { path, .. }
        | Op::CreateReleased { path, .. }
        | Op::Mkdir { path, .. }
        | Op::Symlink { path, .. }
        | Op::Mknod { path, .. } => {
            vec![name(path)]
        }
        Op::Unlink { path } | Op::Rmdir { path } => vec![name(path)],
        Op::Link { from, to } => vec![name(to), attrs(from)],
        Op::Rename { from, to, .. } => vec![name(from), name(to), attrs(to)],
        Op::Setattr { .. } => match body {
            Body::Attr(a) => vec![What::Ino(a.ino)],
            _ => Vec::new(),
        },
        Op::Open { path, flags } if flags & libc::O_TRUNC != 0 => vec![attrs(path)],
        Op::Write { path, .. } | Op::KillSuidgid { path, .. } if !path.is_empty() => vec![attrs(path)],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_other_mounts_count() {
        let w = Watchers::default();
        assert!(!w.others(7));
        w.n.store(1, Relaxed);
        w.only.store(7, Relaxed);
        assert!(!w.others(7), "a mount's own changes are not queued for itself");
        assert!(w.others(8));
        w.n.store(2, Relaxed);
        w.only.store(0, Relaxed);
        assert!(w.others(7));
    }

    #[test]
    fn what_each_op_changes() {
        let ok = Ok(Body::Ok);
        assert_eq!(changes_of(&Op::Unlink { path: "/d/f".into() }, &ok), vec![What::Name("d/f".into())]);
        let r = changes_of(&Op::Rename { from: "a/x".into(), to: "b/y".into(), noreplace: false }, &ok);
        assert_eq!(r, vec![What::Name("a/x".into()), What::Name("b/y".into()), What::Attrs("b/y".into())]);
        let err = Err(proto::WireError { errno: 2, msg: String::new() });
        assert!(changes_of(&Op::Unlink { path: "f".into() }, &err).is_empty(), "a failed op changed nothing");
        assert!(changes_of(&Op::Lookup { path: "f".into() }, &ok).is_empty());
        assert!(changes_of(&Op::Open { path: "f".into(), flags: 0 }, &ok).is_empty());
        assert_eq!(
            changes_of(&Op::Open { path: "f".into(), flags: libc::O_TRUNC }, &ok),
            vec![What::Attrs("f".into())]
        );
    }
}
