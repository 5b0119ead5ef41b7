//! The pool of gathered writes' buffers.
use std::sync::Mutex;

/// Reusable copies of gathered writes: a flushed write's buffer (its pages already faulted
/// in) takes the next gathered write, so a gather is one `memcpy` without an allocation or
/// page faults. Holds at most `max` bytes of capacity.
pub(super) struct ChunkPool {
    pub(super) bufs: Mutex<(Vec<Vec<u8>>, usize)>,
    pub(super) max: usize,
}

impl ChunkPool {
    /// An empty pool holding at most `max` bytes of capacity.
    pub(super) fn new(max: usize) -> ChunkPool {
        ChunkPool { bufs: Mutex::new((Vec::new(), 0)), max }
    }

    /// A copy of `data`, in a pooled buffer when there is one (grown if too small).
    pub(super) fn copy(&self, data: &[u8]) -> Vec<u8> {
        let got = {
            let mut p = self.bufs.lock().unwrap();
            let b = p.0.pop();
            p.1 -= b.as_ref().map_or(0, |b| b.capacity());
            b
        };
        let mut b = got.unwrap_or_else(|| Vec::with_capacity(data.len()));
        b.clear();
        b.extend_from_slice(data);
        b
    }
    /// A pooled buffer, emptied (or a new, unallocated one).
    pub(super) fn take(&self) -> Vec<u8> {
        let mut p = self.bufs.lock().unwrap();
        let b = p.0.pop();
        p.1 -= b.as_ref().map_or(0, |b| b.capacity());
        drop(p);
        let mut b = b.unwrap_or_default();
        b.clear();
        b
    }
    /// Keeps written buffers for reuse (up to the pool's capacity; the rest are freed).
    pub(super) fn recycle(&self, chunks: impl IntoIterator<Item = Vec<u8>>) {
        let mut p = self.bufs.lock().unwrap();
        for b in chunks {
            if p.1 + b.capacity() > self.max {
                break;
            }
            p.1 += b.capacity();
            p.0.push(b);
        }
    }
}
