//! Write-back creates in node-local rank directories (issue 27, item 2; the Sunway storage
//! paper's node-local storage, §6, whose point is that a rank's directory is private to one
//! node). A rank directory is written by one compute node only (its attachment), so this mount
//! is the authority for the names there: a create in a directory whose names it knows whole
//! (`complete.rs`) is answered by the mount itself, with an inode number it assigns
//! ([`local_ino`]) and the attributes the daemon would give (mode, the caller's uid and gid,
//! size 0, times now), and the daemon's create follows in the background, in order, by the
//! [`WriteBack`] executor threads, with the caller's context (job, rank, credentials): the
//! daemon's records are those of a synchronous create. The same idea as a client write-back
//! metadata cache (BurstFS/UnifyFS's client-side namespace of a job's private files, NFSv4
//! directory delegations): the answer comes first, the server's copy follows.
//!
//! The same holds in a shared directory this mount made and *holds* (issue 29, item 2; the
//! daemons' record, `fwd/src/server/holders.rs`): another mount's first lookup, listing or name
//! change there recalls this mount, which stops answering for the directory (under
//! `Shared::wb_gate`, so no create answered here slips past) and waits for its pending creates
//! there ([`WriteBack::wait_under`]) before it acknowledges, so the other mount sees them.
//!
//! * **Waiting.** Every later operation on the file or its name (data, attributes, fsync,
//!   release, unlink, rename, link, a lookup or listing that reaches the daemon) waits until its
//!   create is done ([`WriteBack::wait_ino`], [`WriteBack::wait_under`],
//!   [`PendingCreate::wait`]); the daemon never sees an operation on a name it has not made.
//! * **Errors.** A create the daemon refused (`EACCES`, `ENOSPC`, `EDQUOT`, ...) is counted
//!   ([`WriteBack::errors`], `deferred_create_errors`), logged, and its errno is the answer of
//!   the next operation on the file (of `fsync` always, of an `fsync` of its directory once;
//!   not of `close`: files are opened `FOPEN_NOFLUSH`, so close(2) asks the mount nothing).
//! * **Bounded.** At most [`WriteBack::max`] creates are pending; a create beyond waits for
//!   room (back-pressure towards the application, as the I/O pool's queue).
//! * **Durability.** `fsync` of the file or of its directory, and the unmount (SIGTERM), wait
//!   for the pending creates: a create answered but not yet at the daemon is lost if the mount
//!   process dies, as a client write-back cache's dirty data is.
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pharos_fwd_proto::{Cap, Ctx};

/// The tag of the inode numbers this mount assigns to the files it creates itself: `0xfd` in
/// bits 56..63 (the daemon's node-local views use `0xfe`, its stores' numbers are below 2^56).
pub const LOCAL_INO_TAG: u64 = 0xfd << 56;

/// Whether `ino` is a number this mount assigned ([`LOCAL_INO_TAG`]).
pub fn is_local_ino(ino: u64) -> bool {
    ino >> 56 == LOCAL_INO_TAG >> 56
}

/// The `n`th inode number this mount assigns (`n` < 2^56).
pub fn local_ino(n: u64) -> u64 {
    LOCAL_INO_TAG | (n & ((1 << 56) - 1))
}

/// Called with (directory inode, name, file inode) of a create the daemon refused.
pub type RefusedHook = Box<dyn Fn(u64, &str, u64) + Send + Sync>;

/// Where a create answered by the mount stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Queued or being sent.
    InFlight,
    /// The daemon made the file: its capability (layout, open handle, rights, signed).
    Made(Cap),
    /// The daemon refused it: the errno.
    Failed(i32),
}

/// A release that came before its file's create was done: sent after it.
#[derive(Debug)]
pub struct DeferredRelease {
    /// The release's context (the opener's job and rank when the kernel gave no process).
    pub ctx: Ctx,
    /// The file's path at release.
    pub path: String,
}

/// One create answered by the mount: its outcome, waited for by the file's open handle.
#[derive(Debug)]
pub struct PendingCreate {
    st: Mutex<(Outcome, Option<DeferredRelease>)>,
    cv: Condvar,
}

impl PendingCreate {
    /// A create in flight.
    pub fn new() -> Arc<PendingCreate> {
        Arc::new(PendingCreate { st: Mutex::new((Outcome::InFlight, None)), cv: Condvar::new() })
    }

    /// Waits until the daemon answered; its capability, or the errno it refused with.
    pub fn wait(&self) -> Result<Cap, i32> {
        let mut g = self.st.lock().unwrap();
        loop {
            match &g.0 {
                Outcome::InFlight => g = self.cv.wait(g).unwrap(),
                Outcome::Made(c) => return Ok(c.clone()),
                Outcome::Failed(e) => return Err(*e),
            }
        }
    }

    /// The errno of a create known to have failed (None: made, or still in flight).
    pub fn failed(&self) -> Option<i32> {
        match self.st.lock().unwrap().0 {
            Outcome::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Has the executor send `r` once the create is done; `Err(r)` back when it is done
    /// already (then the caller sends it, if the create was made).
    pub fn defer_release(&self, r: DeferredRelease) -> Result<(), DeferredRelease> {
        let mut g = self.st.lock().unwrap();
        match g.0 {
            Outcome::InFlight => {
                g.1 = Some(r);
                Ok(())
            }
            _ => Err(r),
        }
    }

    /// The release deferred so far, taken while the create is still to be sent (the executor
    /// sends both as one request, `Op::CreateReleased`); None when the file is still open.
    pub fn take_release(&self) -> Option<DeferredRelease> {
        let mut g = self.st.lock().unwrap();
        match g.0 {
            Outcome::InFlight => g.1.take(),
            _ => None,
        }
    }

    /// Records the daemon's answer, wakes the waiters; the release to send now, if any.
    pub fn finish(&self, o: Outcome) -> Option<DeferredRelease> {
        let mut g = self.st.lock().unwrap();
        g.0 = o;
        self.cv.notify_all();
        g.1.take()
    }
}

/// A create to send: the request as a synchronous create would have sent it, and where its
/// answer goes.
#[derive(Debug)]
pub struct CreateJob {
    /// The caller's context at the create (job, rank, pid, credentials).
    pub ctx: Ctx,
    /// The file's namespace path.
    pub path: String,
    /// Permission bits (umask applied).
    pub mode: u32,
    /// The open flags of the create.
    pub flags: i32,
    /// The create's idempotency token (replays after a failover).
    pub token: u64,
    /// The kernel inode number the mount gave the file ([`local_ino`]).
    pub ino: u64,
    /// The directory's kernel inode number and the file's name in it.
    pub parent: u64,
    /// The file's name in `parent`.
    pub name: String,
    /// The outcome, shared with the file's open handle.
    pub pc: Arc<PendingCreate>,
}

/// What the executor threads send: a create, or the release of a node-local file (after its
/// create: a release that came first waits in its [`PendingCreate`]).
#[derive(Debug)]
pub enum Task {
    /// A write-back create.
    Create(CreateJob),
    /// A release answered to the kernel already: context, path, the open's capability.
    Release(Ctx, String, Cap),
    /// An unlink answered to the kernel already (a directory the mount holds or a node-local
    /// rank directory): context, path, the directory's kernel inode.
    Unlink(Ctx, String, u64),
}

struct State {
    queue: VecDeque<Task>,
    /// Creates queued or being sent: kernel inode → (path, parent).
    pending: HashMap<u64, (String, u64)>,
    /// Files whose create failed: kernel inode → errno (until the kernel forgets the inode).
    failed: HashMap<u64, i32>,
    /// Directories with a failed create or unlink not yet reported by an fsync of the directory.
    dir_errors: HashMap<u64, i32>,
    /// Unlinks queued or being sent: path → directory's kernel inode.
    unlinks: HashMap<String, u64>,
    closed: bool,
}

/// The pending creates of a mount, their queue and the daemon's inode numbers of the files
/// made (the kernel keeps seeing the number the mount gave).
pub struct WriteBack {
    st: Mutex<State>,
    work: Condvar,
    done: Condvar,
    /// Most creates pending at once (`--writeback-creates`; 0 = off: creates are synchronous).
    pub max: AtomicUsize,
    next: AtomicU64,
    /// The daemon's inode number → the kernel's, and back, of files this mount made.
    aliases: Mutex<(HashMap<u64, u64>, HashMap<u64, u64>)>,
    /// Creates answered by the mount (`deferred_creates`).
    pub answered: AtomicU64,
    /// Creates the daemon refused after the mount had answered (`deferred_create_errors`).
    pub errors: AtomicU64,
    /// Told of each refused create (directory inode, name, file inode): drops the name and the
    /// inode from the kernel's caches (`main.rs`, through a thread of its own: the kernel takes
    /// the directory's lock, which a create waiting for room here may hold).
    pub on_refused: std::sync::OnceLock<RefusedHook>,
    /// Batches sent by the executor threads (`writeback_batches`: tasks per batch =
    /// (creates + releases) / batches).
    pub batches: AtomicU64,
    /// Tasks taken by the executor threads and not yet answered by the daemon.
    sending: AtomicUsize,
    /// Unlinks answered by the mount (`deferred_unlinks`), and those the daemon refused after
    /// (`deferred_unlink_errors`).
    pub unlinks_answered: AtomicU64,
    pub unlink_errors: AtomicU64,
}

impl Default for WriteBack {
    fn default() -> Self {
        WriteBack {
            st: Mutex::new(State {
                queue: VecDeque::new(),
                pending: HashMap::new(),
                failed: HashMap::new(),
                dir_errors: HashMap::new(),
                unlinks: HashMap::new(),
                closed: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            max: AtomicUsize::new(0),
            next: AtomicU64::new(1),
            aliases: Mutex::new((HashMap::new(), HashMap::new())),
            answered: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            sending: AtomicUsize::new(0),
            unlinks_answered: AtomicU64::new(0),
            unlink_errors: AtomicU64::new(0),
            on_refused: std::sync::OnceLock::new(),
        }
    }
}

impl WriteBack {
    /// Whether creates may be answered here (`--writeback-creates` > 0, not shutting down).
    pub fn enabled(&self) -> bool {
        self.max.load(Relaxed) > 0 && !self.st.lock().unwrap().closed
    }

    /// A fresh kernel inode number for a file the mount creates.
    pub fn new_ino(&self) -> u64 {
        local_ino(self.next.fetch_add(1, Relaxed))
    }

    /// Queues `job`; blocks while [`WriteBack::max`] creates are pending (back-pressure). From
    /// its return, operations on the file and its name wait for it.
    pub fn submit(&self, job: CreateJob) {
        let max = self.max.load(Relaxed).max(1);
        let mut g = self.st.lock().unwrap();
        while g.pending.len() + g.unlinks.len() >= max && !g.closed {
            g = self.done.wait(g).unwrap();
        }
        g.pending.insert(job.ino, (job.path.clone(), job.parent));
        g.queue.push_back(Task::Create(job));
        self.answered.fetch_add(1, Relaxed);
        drop(g);
        self.work.notify_one();
    }

    /// Queues the release of a file whose close the kernel was answered already (sent in a
    /// batch with others, oldest first; not counted as pending; sent before the unmount ends).
    pub fn submit_release(&self, ctx: Ctx, path: String, cap: Cap) {
        self.st.lock().unwrap().queue.push_back(Task::Release(ctx, path, cap));
        self.work.notify_one();
    }

    /// The next tasks to send, oldest first, at most `max` (at least 1; waits for one);
    /// `None` once closed and drained (executor threads).
    pub fn next_batch(&self, max: usize) -> Option<Vec<Task>> {
        let mut g = self.st.lock().unwrap();
        loop {
            if !g.queue.is_empty() {
                let n = g.queue.len().min(max.max(1));
                self.batches.fetch_add(1, Relaxed);
                self.sending.fetch_add(n, Relaxed);
                return Some(g.queue.drain(..n).collect());
            }
            if g.closed {
                return None;
            }
            g = self.work.wait(g).unwrap();
        }
    }

    /// The daemon answered `job`'s create: made as its inode `real`, or refused with `Err(errno)`
    /// (counted and logged). The waiters on its inode and name go on; then the file's handle
    /// learns the outcome (the caller's [`PendingCreate::finish`]).
    pub fn complete(&self, job: &CreateJob, made: Result<u64, i32>) {
        if let Ok(real) = made {
            let mut a = self.aliases.lock().unwrap();
            a.0.insert(real, job.ino);
            a.1.insert(job.ino, real);
        }
        let mut g = self.st.lock().unwrap();
        g.pending.remove(&job.ino);
        if let Err(e) = made {
            self.errors.fetch_add(1, Relaxed);
            log::warn!("deferred create of {:?} refused by the forwarding node: errno {e}", job.path);
            g.failed.insert(job.ino, e);
            g.dir_errors.entry(job.parent).or_insert(e);
        }
        drop(g);
        self.done.notify_all();
        if let (Err(_), Some(f)) = (made, self.on_refused.get()) {
            f(job.parent, &job.name, job.ino);
        }
    }

    /// Waits until inode `ino`'s create (if the mount made it) is done. Errors: the errno the
    /// daemon refused it with.
    pub fn wait_ino(&self, ino: u64) -> Result<(), i32> {
        if !is_local_ino(ino) {
            return Ok(());
        }
        let mut g = self.st.lock().unwrap();
        while g.pending.contains_key(&ino) {
            g = self.done.wait(g).unwrap();
        }
        g.failed.get(&ino).map_or(Ok(()), |e| Err(*e))
    }

    /// Waits until no create is pending at `path` or below it (`""`: anywhere).
    pub fn wait_under(&self, path: &str) {
        let under = |p: &str| {
            path.is_empty() || (p.starts_with(path) && (p.len() == path.len() || p.as_bytes()[path.len()] == b'/'))
        };
        let mut g = self.st.lock().unwrap();
        while g.pending.values().any(|(p, _)| under(p)) || g.unlinks.keys().any(|p| under(p)) {
            g = self.done.wait(g).unwrap();
        }
    }

    /// Whether a create or an unlink of exactly `path` is pending (then the next one of that
    /// name is not answered here: it waits for the daemon, in order).
    pub fn pending_at(&self, path: &str) -> bool {
        let g = self.st.lock().unwrap();
        g.unlinks.contains_key(path) || g.pending.values().any(|(p, _)| p == path)
    }

    /// Queues the unlink of `path` (in directory `parent`) that the kernel was answered for
    /// already; blocks while [`WriteBack::max`] creates and unlinks are pending. From its
    /// return, operations on the name wait for it.
    pub fn submit_unlink(&self, ctx: Ctx, path: String, parent: u64) {
        let max = self.max.load(Relaxed).max(1);
        let mut g = self.st.lock().unwrap();
        while g.pending.len() + g.unlinks.len() >= max && !g.closed {
            g = self.done.wait(g).unwrap();
        }
        g.unlinks.insert(path.clone(), parent);
        g.queue.push_back(Task::Unlink(ctx, path, parent));
        self.unlinks_answered.fetch_add(1, Relaxed);
        drop(g);
        self.work.notify_one();
    }

    /// The daemon answered the unlink of `path` in `parent` (`Err(errno)`: refused, counted,
    /// logged and reported by the directory's next fsync). Whether it was made.
    pub fn unlinked(&self, path: &str, parent: u64, made: Result<(), i32>) -> bool {
        let mut g = self.st.lock().unwrap();
        g.unlinks.remove(path);
        if let Err(e) = made {
            self.unlink_errors.fetch_add(1, Relaxed);
            log::warn!("deferred unlink of {path:?} refused by the forwarding node: errno {e}");
            g.dir_errors.entry(parent).or_insert(e);
        }
        drop(g);
        self.done.notify_all();
        made.is_ok()
    }

    /// Waits at most `limit` for every pending create; whether none is left.
    pub fn drain(&self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut g = self.st.lock().unwrap();
        while !g.pending.is_empty() || !g.unlinks.is_empty() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self.done.wait_timeout(g, left).unwrap().0;
        }
        true
    }

    /// The errno of a create in directory `parent` that failed since the last call (reported
    /// once, by an fsync of the directory).
    pub fn take_dir_error(&self, parent: u64) -> Option<i32> {
        self.st.lock().unwrap().dir_errors.remove(&parent)
    }

    /// An executor thread's batch of `n` tasks was answered (or failed).
    pub fn sent(&self, n: usize) {
        self.sending.fetch_sub(n, Relaxed);
    }

    /// Tasks (creates, releases) queued or being sent now (`writeback_queued`).
    pub fn queued(&self) -> usize {
        self.st.lock().unwrap().queue.len() + self.sending.load(Relaxed)
    }

    /// Creates pending now.
    pub fn pending(&self) -> usize {
        self.st.lock().unwrap().pending.len()
    }

    /// The kernel's inode number of the daemon's inode `real` (the mount's own number for a file
    /// it made, else `real`).
    pub fn kernel_ino(&self, real: u64) -> u64 {
        let a = self.aliases.lock().unwrap();
        if a.0.is_empty() {
            return real;
        }
        a.0.get(&real).copied().unwrap_or(real)
    }

    /// The kernel forgot inode `ino`: its number and any failure are no longer needed (a later
    /// lookup of the name gets the daemon's number).
    pub fn forget(&self, ino: u64) {
        if !is_local_ino(ino) {
            return;
        }
        let mut a = self.aliases.lock().unwrap();
        if let Some(real) = a.1.remove(&ino) {
            a.0.remove(&real);
        }
        drop(a);
        self.st.lock().unwrap().failed.remove(&ino);
    }

    /// Stops the executors once the queue is sent; creates are synchronous from now on.
    pub fn close(&self) {
        self.st.lock().unwrap().closed = true;
        self.work.notify_all();
        self.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(wb: &WriteBack, path: &str, parent: u64) -> CreateJob {
        CreateJob {
            ctx: Ctx::default(),
            path: path.into(),
            mode: 0o644,
            flags: libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            token: 1,
            ino: wb.new_ino(),
            parent,
            name: path.rsplit('/').next().unwrap().into(),
            pc: PendingCreate::new(),
        }
    }

    #[test]
    fn local_inode_numbers_are_tagged() {
        let wb = WriteBack::default();
        let (a, b) = (wb.new_ino(), wb.new_ino());
        assert!(a != b && is_local_ino(a) && is_local_ino(b));
        assert!(!is_local_ino(0xfe << 56 | 1) && !is_local_ino((3 << 48) | 77) && !is_local_ino(1));
    }

    /// Queued in order; waiters by inode and by name go on when the create is done, and a
    /// refused create's errno is the next operation's answer, counted once per create.
    #[test]
    fn waiters_see_the_outcome_in_order() {
        let wb = Arc::new(WriteBack::default());
        wb.max.store(8, Relaxed);
        let (j1, j2) = (job(&wb, "nl/j/0/a", 5), job(&wb, "nl/j/0/b", 5));
        let (i1, i2, pc2) = (j1.ino, j2.ino, j2.pc.clone());
        wb.submit(j1);
        wb.submit(j2);
        assert_eq!(wb.pending(), 2);
        let w = wb.clone();
        let waiter = std::thread::spawn(move || {
            w.wait_under("nl/j/0");
            w.wait_ino(i2)
        });
        let first = create_of(wb.next_batch(1));
        assert_eq!(first.ino, i1, "oldest first");
        wb.complete(&first, Ok(4242));
        assert!(first.pc.finish(Outcome::Made(cap())).is_none());
        assert_eq!(wb.kernel_ino(4242), i1);
        let second = create_of(wb.next_batch(8));
        assert!(pc2.defer_release(DeferredRelease { ctx: Ctx::default(), path: second.path.clone() }).is_ok());
        wb.complete(&second, Err(libc::EACCES));
        assert!(second.pc.finish(Outcome::Failed(libc::EACCES)).is_some(), "the deferred release");
        assert_eq!(waiter.join().unwrap(), Err(libc::EACCES));
        assert_eq!((wb.wait_ino(i1), wb.wait_ino(i2)), (Ok(()), Err(libc::EACCES)));
        assert_eq!(pc2.wait(), Err(libc::EACCES));
        assert_eq!(pc2.failed(), Some(libc::EACCES));
        assert_eq!((wb.take_dir_error(5), wb.take_dir_error(5)), (Some(libc::EACCES), None), "reported once");
        assert_eq!((wb.answered.load(Relaxed), wb.errors.load(Relaxed), wb.pending()), (2, 1, 0));
        wb.forget(i2);
        wb.forget(i1);
        assert_eq!((wb.wait_ino(i2), wb.kernel_ino(4242)), (Ok(()), 4242));
    }

    /// At most `max` creates pending: the next one waits until one is done.
    /// A queued unlink holds back the operations on its name (and the unmount's drain) until
    /// the daemon answered it; a refused one is counted and reported to the directory once.
    #[test]
    fn an_unlink_is_waited_for_and_a_refused_one_reported() {
        let wb = Arc::new(WriteBack::default());
        wb.max.store(8, Relaxed);
        wb.submit_unlink(Ctx::default(), "d/a".into(), 5);
        assert!(wb.pending_at("d/a") && !wb.pending_at("d/ab") && !wb.pending_at("d"));
        assert_eq!(wb.queued(), 1);
        assert!(!wb.drain(Duration::from_millis(5)), "the unmount waits for it");
        let w = wb.clone();
        let waiter = std::thread::spawn(move || w.wait_under("d"));
        let batch = wb.next_batch(16).unwrap();
        assert!(matches!(&batch[..], [Task::Unlink(_, p, 5)] if p == "d/a"));
        assert!(!waiter.is_finished());
        assert!(!wb.unlinked("d/a", 5, Err(libc::EPERM)));
        wb.sent(batch.len());
        waiter.join().unwrap();
        assert_eq!((wb.queued(), wb.unlink_errors.load(Relaxed), wb.unlinks_answered.load(Relaxed)), (0, 1, 1));
        assert_eq!((wb.take_dir_error(5), wb.take_dir_error(5)), (Some(libc::EPERM), None));
        assert!(!wb.pending_at("d/a") && wb.drain(Duration::from_millis(5)));
    }

    #[test]
    fn a_release_deferred_before_the_send_is_taken_once() {
        let pc = PendingCreate::new();
        assert!(pc.take_release().is_none(), "still open");
        assert!(pc.defer_release(DeferredRelease { ctx: Ctx::default(), path: "d/a".into() }).is_ok());
        assert_eq!(pc.take_release().map(|r| r.path), Some("d/a".to_string()), "sent with the create");
        assert!(pc.take_release().is_none(), "once");
        assert!(pc.finish(Outcome::Made(cap())).is_none(), "not sent again after the create");
        let done = PendingCreate::new();
        done.finish(Outcome::Failed(libc::EACCES));
        assert!(done.defer_release(DeferredRelease { ctx: Ctx::default(), path: "d/b".into() }).is_err());
        assert!(done.take_release().is_none());
    }

    #[test]
    fn a_full_table_holds_the_next_create_back() {
        let wb = Arc::new(WriteBack::default());
        wb.max.store(2, Relaxed);
        wb.submit(job(&wb, "d/a", 1));
        wb.submit(job(&wb, "d/b", 1));
        let w = wb.clone();
        let third = job(&wb, "d/c", 1);
        let t = std::thread::spawn(move || {
            let t0 = Instant::now();
            w.submit(third);
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(wb.pending(), 2, "the third waits");
        let j = create_of(wb.next_batch(1));
        wb.complete(&j, Ok(7));
        assert!(t.join().unwrap() >= Duration::from_millis(90));
        assert_eq!(wb.pending(), 2);
        assert!(!wb.drain(Duration::from_millis(20)), "two left");
        wb.submit_release(Ctx::default(), "d/a".into(), cap());
        let batch = wb.next_batch(8).unwrap();
        assert_eq!(batch.len(), 3, "the two creates left and the release, in one batch");
        for t in batch {
            if let Task::Create(j) = t {
                wb.complete(&j, Ok(j.ino & 0xff));
            }
        }
        assert!(wb.drain(Duration::from_millis(20)));
        wb.close();
        assert!(wb.next_batch(8).is_none() && !wb.enabled());
    }

    #[test]
    fn names_below_a_path_are_waited_for_not_their_neighbours() {
        let wb = WriteBack::default();
        wb.max.store(4, Relaxed);
        wb.submit(job(&wb, "nl/j/0/ab", 1));
        // Neither a sibling with a common prefix nor another directory waits.
        wb.wait_under("nl/j/0/a");
        wb.wait_under("nl/j/1");
        assert_eq!(wb.pending(), 1);
    }

    fn create_of(batch: Option<Vec<Task>>) -> CreateJob {
        match batch.unwrap().pop() {
            Some(Task::Create(j)) => j,
            other => panic!("{other:?}"),
        }
    }

    fn cap() -> Cap {
        Cap {
            layout: pharos_fwd_proto::Layout::default(),
            handle: Default::default(),
            rights: Cap::READ | Cap::WRITE,
            mac: [0; 32],
        }
    }
}
