//! Reusable data buffers, shared by the daemon (receive buffers of write data segments, read
//! replies) and the mount (write payloads, read reply data segments), so that steady-state
//! large I/O allocates nothing.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::frame::MAX_FRAME;

/// A bounded pool of byte buffers behind one mutex (cheap next to the I/O a buffer carries).
///
/// A buffer comes out with whatever length and contents its last user left (clear it, or
/// give it to [`crate::read_frame_into`], which clears it); only its capacity matters. The
/// pool keeps at most `max` buffers, and only those whose capacity is within
/// `4096..=MAX_FRAME` bytes: a smaller one is not worth keeping, a larger one would pin memory
/// beyond what any frame needs.
pub struct BufPool {
    bufs: Mutex<Vec<Vec<u8>>>,
    max: usize,
    /// Times [`BufPool::get`] found the pool empty (the caller then grows a new buffer).
    pub misses: AtomicU64,
}

impl BufPool {
    /// An empty pool that keeps at most `max` buffers.
    pub fn new(max: usize) -> BufPool {
        BufPool { bufs: Mutex::new(Vec::new()), max, misses: AtomicU64::new(0) }
    }

    /// A pooled buffer, or a new empty (unallocated) one counted in [`BufPool::misses`].
    pub fn get(&self) -> Vec<u8> {
        self.bufs.lock().unwrap().pop().unwrap_or_else(|| {
            self.misses.fetch_add(1, Relaxed);
            Vec::new()
        })
    }

    /// A pooled buffer, or a new empty (unallocated) one without counting a miss (where an
    /// empty pool is expected, or misses are not reported).
    pub fn take(&self) -> Vec<u8> {
        self.bufs.lock().unwrap().pop().unwrap_or_default()
    }

    /// Gives `b` back: kept when its capacity is within `4096..=MAX_FRAME` bytes and the pool
    /// holds fewer than `max` buffers, else dropped (freed).
    pub fn put(&self, b: Vec<u8>) {
        if b.capacity() < 4096 || b.capacity() > MAX_FRAME {
            return;
        }
        let mut m = self.bufs.lock().unwrap();
        if m.len() < self.max {
            m.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_useful_buffers_up_to_max_and_counts_misses() {
        let p = BufPool::new(2);
        assert_eq!(p.get().capacity(), 0);
        assert_eq!(p.misses.load(Relaxed), 1);
        assert_eq!(p.take().capacity(), 0);
        assert_eq!(p.misses.load(Relaxed), 1, "take never counts a miss");
        p.put(Vec::with_capacity(100)); // too small: dropped
        p.put(Vec::with_capacity(MAX_FRAME + 1)); // too large: dropped
        assert_eq!(p.take().capacity(), 0);
        let mut b = Vec::with_capacity(1 << 20);
        b.extend_from_slice(b"left over");
        let ptr = b.as_ptr();
        p.put(b);
        p.put(Vec::with_capacity(8192));
        p.put(Vec::with_capacity(8192)); // beyond max: dropped
        assert_eq!(p.get().capacity(), 8192);
        let b = p.get();
        assert_eq!((b.as_ptr(), b.as_slice()), (ptr, &b"left over"[..]), "contents are the last user's");
        assert_eq!(p.misses.load(Relaxed), 1);
        assert_eq!(p.get().capacity(), 0);
        assert_eq!(p.misses.load(Relaxed), 2);
    }
}
