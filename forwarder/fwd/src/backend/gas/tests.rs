use super::*;
use crate::backend::testutil::*;
use crate::backend::{pieces, Placement};
use pharos_fwd_proto::Ctx;
use std::sync::atomic::Ordering::Relaxed;

fn gas_backend(targets: usize, buffer: usize, ms: u64) -> (tempfile::TempDir, Arc<Backend>) {
    let (d, b) = backend(targets);
    let b = Arc::new(b);
    b.enable_gas(buffer, Duration::from_millis(ms));
    (d, b)
}

#[test]
fn interleaved_writes_of_a_node_merge_and_read_back() {
    let (_d, b) = gas_backend(2, 8 << 20, 60_000);
    b.placement.store(Arc::new(Placement { stripe_count: Some(2), stripe_size: Some(1 << 20), ..Default::default() }));
    let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let mut info = IoInfo::default();
    let blk = 64 << 10;
    // 8 "ranks" write their blocks round-robin, rank-major order shuffled.
    let mut want = vec![0u8; 8 * 4 * blk];
    for round in 0..4 {
        for rank in [3usize, 0, 7, 1, 5, 2, 6, 4] {
            let off = (round * 8 + rank) * blk;
            let data = vec![(round * 8 + rank) as u8 + 1; blk];
            want[off..off + blk].copy_from_slice(&data);
            b.write_from("cn0", &l, h, off as u64, &data, &mut info).unwrap();
        }
    }
    let g = b.gas.get().unwrap();
    assert_eq!(g.buffered(), want.len());
    assert_eq!(b.data.data_writes.load(Relaxed), 0, "nothing reached the targets yet");
    assert_eq!(b.read(&l, 0, want.len() as u32, &mut info).unwrap(), want);
    assert_eq!(g.buffered(), 0);
    // One run, split at the stripe boundary: 2 pwrites for 32 client writes.
    assert_eq!(g.stats.runs.load(Relaxed), 1);
    assert_eq!(b.data.data_writes.load(Relaxed), 2);
    assert_eq!(b.data.client_writes.load(Relaxed), 32);
}

#[test]
fn a_socket_write_keeps_its_buffer_unless_it_is_much_larger() {
    let (_d, b) = gas_backend(1, 8 << 20, 60_000);
    let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let mut info = IoInfo::default();
    let g = b.gas.get().unwrap();
    let mut data = vec![7u8; 64 << 10];
    let at = data.as_ptr();
    b.write_owned("cn0", &l, h, 0, &mut data, &mut info).unwrap();
    assert!(data.is_empty(), "the caller got a pooled empty buffer back");
    assert_eq!(g.stats.kept.load(Relaxed), 1);
    {
        let inner = g.inner.lock().unwrap();
        let e = &inner.nodes["cn0"].files.values().next().unwrap().extents[&0];
        assert_eq!(e.chunks[0].as_ptr(), at, "the same allocation, not a copy");
    }
    // A 4 KiB write received into a 1 MiB buffer is copied: the buffer stays the caller's.
    let mut big = Vec::with_capacity(1 << 20);
    big.extend_from_slice(&[9u8; 4096]);
    b.write_owned("cn0", &l, h, 64 << 10, &mut big, &mut info).unwrap();
    assert_eq!((big.len(), g.stats.kept.load(Relaxed)), (4096, 1));
    let mut want = vec![7u8; 64 << 10];
    want.extend_from_slice(&[9u8; 4096]);
    assert_eq!(b.read(&l, 0, want.len() as u32, &mut info).unwrap(), want);
    // Without GAS the bytes are written through and the buffer stays.
    let (_d2, plain) = backend(1);
    let (_, l2, h2) = plain.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let mut data = vec![5u8; 8192];
    plain.write_owned("cn0", &l2, h2, 0, &mut data, &mut info).unwrap();
    assert_eq!(data.len(), 8192);
    assert_eq!(plain.read(&l2, 0, 8192, &mut info).unwrap(), vec![5u8; 8192]);
}

#[test]
fn overlap_size_time_fsync_and_deferred_errors() {
    let (_d, b) = gas_backend(1, 64 << 10, 20);
    let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let mut info = IoInfo::default();
    b.write_from("a", &l, h, 0, b"aaaa", &mut info).unwrap();
    b.write_from("b", &l, h, 2, b"BB", &mut info).unwrap(); // overlaps: "aaaa" lands first
    b.fsync(&l, false, &mut info).unwrap();
    assert_eq!(b.read(&l, 0, 10, &mut info).unwrap(), b"aaBB");
    let g = b.gas.get().unwrap();
    assert_eq!(g.stats.flushes[Reason::Overlap as usize].load(Relaxed), 1);
    // Size: a node past its buffer flushes.
    b.write_from("a", &l, h, 0, &vec![1u8; 70 << 10], &mut info).unwrap();
    assert_eq!(g.buffered(), 0);
    // Time: the flusher writes a small buffer within a few periods.
    b.write_from("a", &l, h, 0, b"t", &mut info).unwrap();
    let t0 = Instant::now();
    // (The counter moves just after the buffer is taken: wait for both.)
    let timed = || g.stats.flushes[Reason::Time as usize].load(Relaxed);
    while (g.buffered() > 0 || timed() == 0) && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(g.buffered(), 0);
    assert!(timed() >= 1);
    // A deferred error (the objects are gone) comes back at the file's close.
    b.unlink("f", &Ctx::default()).unwrap();
    b.release(&l, h).unwrap();
    let (_, l2, h2) = b.create("g", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let mut gone = l.clone();
    gone.oid = l2.oid ^ 1;
    b.write_from("a", &gone, h2, 0, b"x", &mut info).unwrap();
    assert!(b.gas_close(&gone).is_err());
    assert!(b.gas_close(&gone).is_ok(), "reported once");
    b.release(&l2, h2).unwrap();
}

#[test]
fn oid_index_tracks_buffers_per_object() {
    let h = |id| OpenHandle { daemon: 1, id };
    let mut ix = OidIndex::default();
    ix.add(7, "a", h(1));
    ix.add(7, "a", h(1)); // once per pair
    ix.add(7, "b", h(1));
    ix.add(7, "a", h(2));
    ix.add(9, "a", h(1));
    assert_eq!(ix.get(7).len(), 3);
    assert!(ix.get(8).is_empty());
    ix.remove(7, "a", h(1));
    assert_eq!(ix.get(7), &[("b".to_string(), h(1)), ("a".to_string(), h(2))]);
    ix.remove(9, "a", h(1));
    assert!(!ix.0.contains_key(&9), "an object without buffers leaves the index");
    assert_eq!(ix.take(7).len(), 2);
    assert!(ix.0.is_empty());
}

#[test]
fn index_follows_the_buffers_of_nodes_files_and_opens() {
    let (_d, b) = gas_backend(2, 8 << 20, 60_000);
    let (_, l1, h1) = b.create("f1", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let (_, l2, h2) = b.create("f2", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let mut info = IoInfo::default();
    let g = b.gas.get().unwrap();
    for (i, node) in ["a", "b", "c"].into_iter().enumerate() {
        b.write_from(node, &l1, h1, i as u64 * 100, b"x", &mut info).unwrap();
        b.write_from(node, &l2, h2, 8 + i as u64 * 100, b"y", &mut info).unwrap();
    }
    {
        let inner = g.inner.lock().unwrap();
        assert_eq!(inner.index.get(l1.oid).len(), 3, "a classic layout: one buffer per node");
        assert_eq!(inner.index.get(l2.oid).len(), 3);
    }
    // A flush of one node drops its entries only; a settle of one file drops that file's.
    g.flush(&b, Some("b"), Reason::Size);
    g.settle(&b, l1.oid, Reason::Fsync, true).unwrap();
    {
        let inner = g.inner.lock().unwrap();
        assert!(inner.index.get(l1.oid).is_empty());
        let mut left: Vec<&str> = inner.index.get(l2.oid).iter().map(|(n, _)| n.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["a", "c"]);
        assert_eq!(inner.total, 2);
    }
    // An overlapping write of f2 (buffered by "a" and "c") flushes f2 first, found through the index.
    b.write_from("b", &l2, h2, 208, b"z", &mut info).unwrap();
    assert_eq!(g.stats.flushes[Reason::Overlap as usize].load(Relaxed), 1);
    assert_eq!(b.read(&l2, 8, 201, &mut info).unwrap()[..], [&b"y"[..], &[0; 99], b"y", &[0; 99], b"z"].concat()[..]);
    assert_eq!(g.buffered(), 0);
    assert!(g.inner.lock().unwrap().index.0.is_empty());
    // Flushed buffers are reused (bounded by buffer_max) and a reused one holds the new bytes only.
    let pooled = g.pool.bufs.lock().unwrap().0.len();
    assert!(pooled > 0);
    assert!(g.pool.bufs.lock().unwrap().1 <= g.pool.max);
    b.write_from("a", &l1, h1, 0, b"new", &mut info).unwrap();
    assert_eq!(g.pool.bufs.lock().unwrap().0.len(), pooled - 1);
    assert_eq!(b.read(&l1, 0, 3, &mut info).unwrap(), b"new");
}

#[test]
fn a_read_flushes_the_writes_it_overlaps_and_sees_the_size_of_the_others() {
    for stripes in [1u32, 2] {
        let (_d, b) = gas_backend(2, 8 << 20, 60_000);
        b.placement.store(Arc::new(Placement {
            stripe_count: Some(stripes),
            stripe_size: Some(4096),
            ..Default::default()
        }));
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let g = b.gas.get().unwrap();
        let mut info = IoInfo::default();
        b.write_from("a", &l, h, 0, b"abc", &mut info).unwrap();
        b.fsync(&l, false, &mut info).unwrap();
        b.write_from("a", &l, h, 10_000, b"xyz", &mut info).unwrap();
        b.write_from("b", &l, h, 1, b"B", &mut info).unwrap();
        // [0, 50): "B" lands, "xyz" stays gathered, and the bytes past the objects' end read as a hole.
        let want = [&b"aBc"[..], &[0; 47]].concat();
        assert_eq!(b.read(&l, 0, 50, &mut info).unwrap(), want, "stripes {stripes}");
        assert_eq!(g.buffered(), 3, "the write elsewhere stays gathered");
        let mut slot = [7u8; 60];
        assert_eq!(b.read_into_slice(&l, 5, &mut info, &mut slot).unwrap(), 60);
        assert_eq!(slot, [0; 60]);
        if stripes == 1 {
            assert!(b.read_span(&l, 0, 50, &mut info).unwrap().is_none(), "a hole sendfile cannot send");
        }
        // The range holding it flushes it; the end of the file is then its end.
        assert_eq!(b.read(&l, 9_998, 100, &mut info).unwrap(), b"\0\0xyz");
        assert_eq!(g.buffered(), 0);
        assert_eq!(b.read(&l, 20_000, 10, &mut info).unwrap(), b"", "past the end");
        let span = if stripes == 1 { b.read_span(&l, 0, 50, &mut info).unwrap().map(|s| s.len) } else { None };
        assert!(stripes != 1 || span == Some(50));
        assert_eq!(g.stats.flushes[Reason::Read as usize].load(Relaxed), 2);
    }
}

#[test]
fn chunked_runs_write_across_stripes() {
    let (_d, b) = gas_backend(3, 1 << 20, 60_000);
    b.placement.store(Arc::new(Placement { stripe_count: Some(3), stripe_size: Some(4096), ..Default::default() }));
    let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let parts: Vec<Vec<u8>> =
        [3usize, 5000, 70_000, 1, 4093].iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n]).collect();
    let chunks: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
    let mut info = IoInfo::default();
    assert_eq!(b.data.write_through_chunks(&b, &l, h, 777, &chunks, &mut info).unwrap(), 79_097);
    let want: Vec<u8> = parts.concat();
    assert_eq!(b.read(&l, 777, 100_000, &mut info).unwrap(), want);
    assert_eq!(b.data.data_writes.load(Relaxed), pieces(&l, 777, 79_097).len() as u64);
}

/// Issue 26, item 6: before a remap, the node's gathered writes reach the targets, where
/// another daemon of the site (a second backend on the same directories) reads them; other
/// nodes' buffers stay.
#[test]
fn a_remap_flush_puts_a_nodes_writes_where_another_daemon_reads_them() {
    let (d, b0) = gas_backend(1, 8 << 20, 60_000);
    let b1 = backend_on(&d, 1);
    let (_, l, h) = b0.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let mut info = IoInfo::default();
    b0.write_from("cn0", &l, h, 0, &[1u8; 8192], &mut info).unwrap();
    b0.write_from("cn1", &l, h, 65536, &[2u8; 4096], &mut info).unwrap();
    assert!(b1.read(&l, 0, 8192, &mut info).unwrap().is_empty(), "gathered: not on the target yet");
    b0.gas_flush_node("cn9").unwrap(); // nothing of that node
    b0.gas_flush_node("cn0").unwrap();
    assert_eq!(b1.read(&l, 0, 8192, &mut info).unwrap(), vec![1u8; 8192]);
    let g = b0.gas.get().unwrap();
    assert_eq!(g.buffered(), 4096, "cn1's write stays gathered");
    assert_eq!(g.stats.flushes[Reason::Remap as usize].load(Relaxed), 1);
    assert!(backend(1).1.gas_flush_node("cn0").is_ok(), "a no-op without GAS");
}
