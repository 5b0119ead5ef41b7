//! One storage target (OST): its directory of objects and its shared state ([`crate::shm`]:
//! token bucket, injected latency and slowdown, open count), and what the data path applies
//! before and after each piece of I/O on it.
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::shm::TargetShm;

/// Shortest sleep of the injected slowdown; smaller stretches accumulate per thread.
pub const STRETCH_MIN_SLEEP: Duration = Duration::from_millis(1);

thread_local! {
    /// Slowdown owed by this worker thread, ns (negative: an overshoot credited).
    static STRETCH_DEBT_NS: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// One storage target (OST).
pub struct Target {
    pub name: String,
    pub dir: PathBuf,
    pub shm: TargetShm,
    /// The directory's `O_PATH` fd: objects are opened and removed relative to it (a short
    /// lookup, also for the objects a file never wrote).
    pub dir_fd: OwnedFd,
}

impl Target {
    /// Object `idx` (stripe or component) of `oid` on this target.
    pub(super) fn obj_path(&self, oid: u64, idx: u64) -> PathBuf {
        self.dir.join(format!("{oid:016x}.{idx}"))
    }

    /// The name of object `idx` of `oid` in the target's directory.
    fn obj_name(oid: u64, idx: u64) -> CString {
        CString::new(format!("{oid:016x}.{idx}")).expect("hex and digits")
    }

    /// Opens object `idx` of `oid` read-write (`create`: made, mode 0600, when missing).
    pub(super) fn open_obj(&self, oid: u64, idx: u64, create: bool) -> io::Result<File> {
        let flags = libc::O_RDWR | if create { libc::O_CREAT } else { 0 };
        crate::nsfs::openat(self.dir_fd.as_raw_fd(), &Self::obj_name(oid, idx), flags, 0o600)
    }

    /// Removes object `idx` of `oid` (a missing one is `NotFound`).
    pub(super) fn remove_obj(&self, oid: u64, idx: u64) -> io::Result<()> {
        let r = unsafe { libc::unlinkat(self.dir_fd.as_raw_fd(), Self::obj_name(oid, idx).as_ptr(), 0) };
        crate::nsfs::cvt(r).map(drop)
    }

    /// Applies the target's token bucket and injected latency before a piece of I/O of
    /// `bytes`; returns the time the token bucket held it (throttled).
    pub(super) fn gate(&self, bytes: u64) -> Duration {
        let wait = self.shm.reserve(bytes);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        let lat = self.shm.added_latency_ns();
        if lat > 0 {
            std::thread::sleep(Duration::from_nanos(lat));
        }
        wait
    }

    /// Injected slowdown of a piece's backing I/O: its service time `took` becomes `f x took`
    /// (the token bucket applies the same factor to the rate, see `TargetShm::reserve`).
    /// The extra `(f - 1) x took` is owed per worker thread and slept once it reaches
    /// [`STRETCH_MIN_SLEEP`], minus what the sleeps overshot: sub-millisecond page-cache
    /// writes get the factor on average instead of the timer's granularity.
    pub fn stretch(&self, took: Duration) {
        let f = self.shm.slowdown();
        if f > 1.0 {
            STRETCH_DEBT_NS.with(|debt| {
                let owed = debt.get() + took.as_nanos() as f64 * (f - 1.0);
                if owed >= STRETCH_MIN_SLEEP.as_nanos() as f64 {
                    let t0 = Instant::now();
                    std::thread::sleep(Duration::from_nanos(owed as u64));
                    // an overshoot is credited, bounded so that one long stall is not repaid by many fast requests
                    debt.set((owed - t0.elapsed().as_nanos() as f64).max(-(STRETCH_MIN_SLEEP.as_nanos() as f64)));
                } else {
                    debt.set(owed);
                }
            });
        }
    }
}
