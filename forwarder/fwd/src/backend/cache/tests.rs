use super::*;

fn page(b: u8) -> Vec<u8> {
    vec![b; PAGE as usize]
}

fn get(c: &PageCache, oid: u64, p: u64, fine: bool) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    c.lookup(oid, p, 1, fine, &mut out).then_some(out)
}

#[test]
fn fgf_lru_evicts_coarse_pages_first() {
    // 4 pages: two fine pages stay while coarse pages stream through.
    let c = PageCache { capacity: 4, ..PageCache::new(1, Policy::FgfLru, 4096) };
    c.insert(1, 0, &page(0), true, 0, 0);
    c.insert(1, 1, &page(1), true, 0, 0);
    for p in 10..20 {
        c.insert(1, p, &page(p as u8), false, 0, 0);
    }
    assert_eq!(get(&c, 1, 0, true).unwrap(), page(0));
    assert_eq!(get(&c, 1, 1, true).unwrap(), page(1));
    assert!(get(&c, 1, 10, false).is_none());
    assert!(get(&c, 1, 19, false).is_some());
    // The coarse pages go first, then the least recently used fine page.
    for p in 30..33 {
        c.insert(1, p, &page(0), true, 0, 0);
    }
    assert!(get(&c, 1, 19, false).is_none());
    assert!(get(&c, 1, 0, true).is_none() && get(&c, 1, 1, true).is_some());
    assert_eq!(c.view().pages, 4);
}

#[test]
fn lru_baseline_streams_evict_unreferenced_fine_pages() {
    let c = PageCache { capacity: 4, ..PageCache::new(1, Policy::Lru, 4096) };
    c.insert(1, 0, &page(0), true, 0, 0);
    for p in 10..14 {
        c.insert(1, p, &page(p as u8), false, 0, 0);
    }
    assert!(get(&c, 1, 0, true).is_none(), "LRU does not favour fine pages");
    // A second reference promotes to the active list (at most half the cache).
    c.insert(1, 0, &page(0), true, 0, 0);
    assert!(get(&c, 1, 0, true).is_some());
    for p in 20..30 {
        c.insert(1, p, &page(p as u8), false, 0, 0);
    }
    assert!(get(&c, 1, 0, true).is_some(), "the active page survives a scan");
    assert_eq!(c.view().pages_high, 1);
}

#[test]
fn invalidation_and_generations() {
    let c = PageCache::new(1, Policy::FgfLru, 4096);
    let mut data = page(7);
    data.extend_from_slice(&[8; 100]); // page 1 is partial: the end of the file
    c.insert(5, 0, &data, true, c.generation(5), 0);
    let mut out = Vec::new();
    assert!(c.lookup(5, 0, 2, true, &mut out));
    assert_eq!(out, data);
    // A write past the end drops the partial page only.
    c.invalidate_range(5, 10 * PAGE, 10);
    assert!(get(&c, 5, 0, true).is_some() && get(&c, 5, 1, true).is_none());
    // A fill that started before an invalidation is not inserted.
    let g = c.generation(5);
    c.invalidate_range(5, 0, 1);
    c.insert(5, 0, &page(1), true, g, 0);
    assert!(get(&c, 5, 0, true).is_none());
    assert_eq!(c.view().stale_fills, 1);
    c.insert(5, 3, &page(3), false, c.generation(5), 0);
    c.invalidate_file(5);
    assert_eq!(c.view().pages, 0);
    let v = c.view();
    assert_eq!((v.fine_hits, v.fine_misses, v.coarse_hits), (2, 2, 0));
}

/// Through a backend: reads see writes, truncates and extensions with the cache on, for
/// a striped file, for both policies.
#[test]
fn backend_reads_through_the_cache_see_writes_and_truncates() {
    use crate::backend::testutil::*;
    use crate::backend::Placement;
    use pharos_fwd_proto::{Ctx, SetAttr};
    use std::sync::Arc;
    for policy in [Policy::FgfLru, Policy::Lru] {
        let (_d, b) = backend(3);
        let _ = b.cache.set(PageCache::new(1, policy, 8192));
        b.placement.store(Arc::new(Placement { stripe_count: Some(3), stripe_size: Some(8192), ..Default::default() }));
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
        let mut info = IoInfo::default();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        b.write(&l, h, 0, &data, &mut info).unwrap();
        for _ in 0..2 {
            assert_eq!(b.read(&l, 0, 200_000, &mut info).unwrap(), data);
            assert_eq!(b.read(&l, 5000, 100, &mut info).unwrap(), &data[5000..5100]);
        }
        assert!(b.cache.get().unwrap().view().page_hits > 0);
        // Overwrite inside cached pages, then extend past the partial last page.
        b.write(&l, h, 5050, b"XYZ", &mut info).unwrap();
        assert_eq!(&b.read(&l, 5040, 20, &mut info).unwrap()[10..13], b"XYZ");
        b.write(&l, h, 120_000, b"end", &mut info).unwrap();
        let all = b.read(&l, 0, 200_000, &mut info).unwrap();
        assert_eq!(all.len(), 120_003);
        assert!(all[100_000..120_000].iter().all(|&x| x == 0));
        // Truncate drops the file's pages.
        b.setattr("f", &SetAttr { size: Some(4000), ..Default::default() }, None, &Ctx::default()).unwrap();
        assert_eq!(b.read(&l, 0, 200_000, &mut info).unwrap(), &data[..4000]);
        b.setattr("f", &SetAttr { size: Some(9000), ..Default::default() }, None, &Ctx::default()).unwrap();
        let r = b.read(&l, 0, 200_000, &mut info).unwrap();
        assert_eq!(r.len(), 9000);
        assert!(r[4000..].iter().all(|&x| x == 0));
        b.unlink("f", &Ctx::default()).unwrap();
        b.release(&l, h).unwrap();
        assert_eq!(b.cache.get().unwrap().view().pages, 0, "{policy:?}: removal drops the pages");
    }
}

/// Issue 26, item 6: two daemons of a site (two backends on the same directories), both with a
/// page cache: a read through one sees what the other wrote since it cached the file (the shared
/// data generations), while its own writes leave its other pages of the file cached.
#[test]
fn a_cache_sees_writes_through_another_daemon() {
    use crate::backend::testutil::*;
    use pharos_fwd_proto::{Ctx, SetAttr};
    let (d, b0) = backend(1);
    let b1 = backend_on(&d, 1);
    for b in [&b0, &b1] {
        let _ = b.cache.set(PageCache::new(1, Policy::FgfLru, 65536));
    }
    let (_, l, h) = b0.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let mut info = IoInfo::default();
    b0.write(&l, h, 0, &[1u8; 4 * PAGE as usize], &mut info).unwrap();
    let hits = |b: &Backend| b.cache.get().unwrap().view().page_hits;
    for _ in 0..2 {
        assert_eq!(b0.read(&l, 0, 4096, &mut info).unwrap(), vec![1u8; 4096]);
        assert_eq!(b0.read(&l, 8192, 4096, &mut info).unwrap(), vec![1u8; 4096]);
    }
    assert_eq!(hits(&b0), 2);
    // Its own write: the page written is dropped, the others still hit.
    b0.write(&l, h, 0, &[3u8; 4096], &mut info).unwrap();
    assert_eq!(b0.read(&l, 8192, 4096, &mut info).unwrap(), vec![1u8; 4096]);
    assert_eq!(hits(&b0), 3);
    // Another daemon's write, truncate: the next read through b0 sees them.
    b1.write(&l, h, 8192, &[2u8; 4096], &mut info).unwrap();
    assert_eq!(b0.read(&l, 8192, 4096, &mut info).unwrap(), vec![2u8; 4096]);
    b1.setattr("f", &SetAttr { size: Some(4096), ..Default::default() }, None, &Ctx::default()).unwrap();
    assert_eq!(b0.read(&l, 0, 16384, &mut info).unwrap(), vec![3u8; 4096]);
}
