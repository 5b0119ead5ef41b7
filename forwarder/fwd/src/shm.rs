//! Per-target state shared by every forwarding daemon on the machine.
//!
//! Each target directory holds a 4 KiB file `.pharos-target`, mapped `MAP_SHARED` by every
//! daemon that serves the target. It carries the target's open-file count (input of the
//! performance-aware placement, Sunway lessons §5), its token-bucket limit (Lustre TBF
//! style, enforced across daemons), and its injected faults. Setting a limit or a fault on
//! any daemon therefore applies to the target everywhere, atomically, with no lock.
//!
//! The token bucket is a GCRA (generic cell rate algorithm): one atomic "theoretical
//! arrival time" `tat` on CLOCK_MONOTONIC (system-wide, so comparable across processes).
//! A request of `b` bytes advances `tat` by `b / rate`; the caller waits until
//! `tat - burst <= now`. Rates are in MB/s (10^6 bytes per second).
use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};
use std::time::Duration;

use memmap2::MmapMut;

const FILE: &str = ".pharos-target";
const SIZE: u64 = 4096;

#[repr(C)]
struct Layout {
    open_count: AtomicI64,
    tat_ns: AtomicU64,
    max_perf_bits: AtomicU64,
    added_latency_ns: AtomicU64,
    slowdown_bits: AtomicU64,
    throttle_waits: AtomicU64,
    burst_ns: AtomicU64,
}

/// The mapped state of one target.
pub struct TargetShm {
    map: MmapMut,
}

/// Monotonic clock, ns (CLOCK_MONOTONIC: the same clock in every process).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Default burst of the token bucket: 50 ms worth of the rate.
pub const DEFAULT_BURST_NS: u64 = 50_000_000;

impl TargetShm {
    /// Maps (creating if needed) the state file of the target directory `dir`.
    pub fn open(dir: &Path) -> io::Result<TargetShm> {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join(FILE))?;
        if f.metadata()?.len() < SIZE {
            f.set_len(SIZE)?;
        }
        let map = unsafe { MmapMut::map_mut(&f)? };
        Ok(TargetShm { map })
    }

    fn l(&self) -> &Layout {
        // The map is page aligned and SIZE >= size_of::<Layout>(); all fields are atomics.
        unsafe { &*(self.map.as_ptr() as *const Layout) }
    }

    pub fn open_count(&self) -> i64 {
        self.l().open_count.load(Relaxed).max(0)
    }
    pub fn add_open(&self, d: i64) {
        let c = &self.l().open_count;
        let mut cur = c.load(Relaxed);
        loop {
            let new = (cur + d).max(0);
            match c.compare_exchange_weak(cur, new, AcqRel, Relaxed) {
                Ok(_) => return,
                Err(x) => cur = x,
            }
        }
    }

    /// Token-bucket limit in MB/s, 0 = none.
    pub fn max_perf(&self) -> f64 {
        f64::from_bits(self.l().max_perf_bits.load(Relaxed))
    }
    pub fn set_max_perf(&self, mb_s: f64) {
        self.l().max_perf_bits.store(mb_s.max(0.0).to_bits(), Relaxed);
    }
    pub fn added_latency_ns(&self) -> u64 {
        self.l().added_latency_ns.load(Relaxed)
    }
    pub fn set_added_latency_ns(&self, ns: u64) {
        self.l().added_latency_ns.store(ns, Relaxed);
    }
    /// Service-time factor, >= 1 (1 = no fault).
    pub fn slowdown(&self) -> f64 {
        let s = f64::from_bits(self.l().slowdown_bits.load(Relaxed));
        if s.is_finite() && s >= 1.0 {
            s
        } else {
            1.0
        }
    }
    pub fn set_slowdown(&self, f: f64) {
        self.l().slowdown_bits.store(f.max(1.0).to_bits(), Relaxed);
    }
    pub fn burst_ns(&self) -> u64 {
        match self.l().burst_ns.load(Relaxed) {
            0 => DEFAULT_BURST_NS,
            b => b,
        }
    }
    pub fn set_burst_ns(&self, ns: u64) {
        self.l().burst_ns.store(ns, Relaxed);
    }
    /// Times any daemon had to wait for tokens on this target.
    pub fn throttle_waits(&self) -> u64 {
        self.l().throttle_waits.load(Relaxed)
    }

    /// Reserves `bytes` of the target's bandwidth; returns how long the caller must wait
    /// before doing the I/O (zero when unlimited or within the burst). An injected slowdown
    /// `f` divides the rate: a fail-slow target delivers `max_perf / f` MB/s.
    pub fn reserve(&self, bytes: u64) -> Duration {
        let mb_s = self.max_perf();
        if mb_s <= 0.0 || bytes == 0 {
            return Duration::ZERO;
        }
        // ns: bytes / (mb_s * 1e6 B/s) * 1e9, times the slowdown factor
        let cost = (bytes as f64 * 1000.0 / mb_s * self.slowdown()) as u64;
        let burst = self.burst_ns();
        let tat = &self.l().tat_ns;
        let now = mono_ns();
        let mut cur = tat.load(Relaxed);
        loop {
            let new = cur.max(now) + cost;
            match tat.compare_exchange_weak(cur, new, AcqRel, Relaxed) {
                Ok(_) => {
                    let ready = new.saturating_sub(burst);
                    if ready > now {
                        self.l().throttle_waits.fetch_add(1, Relaxed);
                        return Duration::from_nanos(ready - now);
                    }
                    return Duration::ZERO;
                }
                Err(x) => cur = x,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mappings_share_one_bucket() {
        let d = tempfile::tempdir().unwrap();
        let a = TargetShm::open(d.path()).unwrap();
        let b = TargetShm::open(d.path()).unwrap();
        a.set_max_perf(10.0); // 10 MB/s
        assert_eq!(b.max_perf(), 10.0);
        b.set_burst_ns(1);
        // 1 MB costs 100 ms; two daemons each reserving 1 MB: the second waits ~200 ms.
        let w1 = a.reserve(1_000_000);
        let w2 = b.reserve(1_000_000);
        assert!(w1 > Duration::from_millis(90) && w1 < Duration::from_millis(110), "{w1:?}");
        assert!(w2 > Duration::from_millis(190) && w2 < Duration::from_millis(210), "{w2:?}");
        assert_eq!(a.throttle_waits(), 2);
        a.add_open(3);
        b.add_open(-1);
        assert_eq!(a.open_count(), 2);
        b.add_open(-10);
        assert_eq!(a.open_count(), 0);
        a.set_slowdown(0.5);
        assert_eq!(b.slowdown(), 1.0);
    }

    #[test]
    fn slowdown_divides_the_rate() {
        let d = tempfile::tempdir().unwrap();
        let a = TargetShm::open(d.path()).unwrap();
        a.set_max_perf(10.0);
        a.set_burst_ns(1);
        a.set_slowdown(4.0);
        // 1 MB at 10 MB/s / 4 = 2.5 MB/s: 400 ms
        let w = a.reserve(1_000_000);
        assert!(w > Duration::from_millis(390) && w < Duration::from_millis(410), "{w:?}");
    }

    #[test]
    fn unlimited_never_waits() {
        let d = tempfile::tempdir().unwrap();
        let a = TargetShm::open(d.path()).unwrap();
        assert_eq!(a.reserve(1 << 30), Duration::ZERO);
    }
}
