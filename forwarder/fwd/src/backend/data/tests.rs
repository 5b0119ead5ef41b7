use super::*;
use crate::backend::testutil::*;
use crate::backend::Placement;
use pharos_fwd_proto::{Ctx, SetAttr};
use std::fs;
use std::sync::Arc;

#[test]
fn striped_file_roundtrip_and_truncate() {
    let (_d, b) = backend(4);
    b.placement.store(Arc::new(Placement { stripe_count: Some(3), stripe_size: Some(4096), ..Default::default() }));
    let (_, l, _) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    assert_eq!(l.targets.len(), 3);
    let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    let mut info = IoInfo::default();
    assert_eq!(b.write(&l, NOH, 1000, &data, &mut info).unwrap(), 50_000);
    assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 51_000);
    let back = b.read(&l, 1000, 60_000, &mut info).unwrap();
    assert_eq!(back, data);
    let head = b.read(&l, 0, 1000, &mut info).unwrap();
    assert!(head.iter().all(|&x| x == 0));
    b.setattr("f", &SetAttr { size: Some(5000), ..Default::default() }, None, &Ctx::default()).unwrap();
    assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 5000);
    b.setattr("f", &SetAttr { size: Some(20_000), ..Default::default() }, None, &Ctx::default()).unwrap();
    assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 20_000);
    let r = b.read(&l, 0, 30_000, &mut info).unwrap();
    assert_eq!(r.len(), 20_000);
    assert_eq!(&r[1000..5000], &data[..4000]);
    assert!(r[5000..].iter().all(|&x| x == 0));
}

#[test]
fn progressive_file_roundtrip_holes_truncate_and_unlink() {
    let (d, b) = backend(3);
    progressive(&b, &[10.0, 30.0, 20.0], 8192);
    let (_, l, h) = b.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    assert!(l.is_progressive() && l.targets == vec![0, 1, 2]);
    assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 0);
    assert_eq!(obj_count(&d), 0, "components are placed by their first write");
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let mut info = IoInfo::default();
    // Component 2 and 3 (bytes 16384..36384), component 0 and 1 are holes.
    assert_eq!(b.write(&l, h, 16_384, &data, &mut info).unwrap(), 20_000);
    assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 36_384);
    assert_eq!(b.read(&l, 16_384, 30_000, &mut info).unwrap(), data);
    let all = b.read(&l, 0, 1 << 20, &mut info).unwrap();
    assert_eq!(all.len(), 36_384);
    assert!(all[..16_384].iter().all(|&x| x == 0));
    // The open counts on the target of the component it wrote last only.
    let t3 = b.component(&l, 3, false).unwrap().unwrap();
    assert_eq!(counts(&b).iter().sum::<i64>(), 1);
    assert_eq!(counts(&b)[t3 as usize], 1);
    // Shrink into a hole: the hole's component is placed so the size holds.
    b.setattr("f", &SetAttr { size: Some(10_000), ..Default::default() }, None, &Ctx::default()).unwrap();
    assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 10_000);
    assert_eq!(b.read(&l, 0, 1 << 20, &mut info).unwrap(), vec![0; 10_000]);
    // Extend: zeros up to the new size; a write after it shows through.
    b.setattr("f", &SetAttr { size: Some(50_000), ..Default::default() }, None, &Ctx::default()).unwrap();
    assert_eq!(b.getattr("f", &Ctx::default()).unwrap().size, 50_000);
    b.write(&l, h, 8000, b"abcdefghij", &mut info).unwrap();
    let r = b.read(&l, 0, 60_000, &mut info).unwrap();
    assert_eq!(r.len(), 50_000);
    assert_eq!(&r[8000..8010], b"abcdefghij");
    assert!(r[8010..].iter().all(|&x| x == 0) && r[..8000].iter().all(|&x| x == 0));
    b.fsync(&l, false, &mut info).unwrap();
    // Unlink while open: data stays until release, then objects and records go.
    b.unlink("f", &Ctx::default()).unwrap();
    assert_eq!(b.read(&l, 8000, 10, &mut info).unwrap(), b"abcdefghij");
    assert!(obj_count(&d) > 0);
    b.release(&l, h).unwrap();
    assert_eq!(counts(&b), vec![0, 0, 0]);
    assert_eq!(obj_count(&d), 0);
    assert_eq!(fs::read_dir(d.path().join("mdt/components")).unwrap().count(), 0);
    // A write after the objects are gone does not resurrect them.
    assert_eq!(b.write(&l, NOH, 1 << 20, b"x", &mut info).unwrap_err().errno, errno::ENOENT);
    assert_eq!(obj_count(&d), 0);
}

/// Issue 29: a create makes no object; the first write of a stripe makes it, a stripe never
/// written reads as a hole, and every path that looks at objects takes a missing one as empty.
#[test]
fn objects_are_made_by_the_first_write_and_missing_ones_are_holes() {
    let (d, b) = backend(4);
    b.placement.store(Arc::new(Placement { stripe_count: Some(3), stripe_size: Some(4096), ..Default::default() }));
    let c = Ctx::default();
    let (_, l, h) = b.create("f", 0o644, EXCL, 1, &c).unwrap();
    assert_eq!(obj_count(&d), 0, "create makes no object");
    let mut info = IoInfo::default();
    // Never written: size 0, empty reads, fsync and stat work.
    assert_eq!((b.getattr("f", &c).unwrap().size, b.getattr("f", &c).unwrap().blocks), (0, 0));
    assert!(b.read(&l, 0, 100, &mut info).unwrap().is_empty());
    b.fsync(&l, false, &mut info).unwrap();
    // Only the second stripe written: the first reads as zeros, the third is past the end.
    b.write(&l, h, 4096, b"second", &mut info).unwrap();
    assert_eq!(obj_count(&d), 1);
    assert_eq!(b.getattr("f", &c).unwrap().size, 4102);
    let r = b.read(&l, 0, 10_000, &mut info).unwrap();
    assert_eq!(r.len(), 4102);
    assert!(r[..4096].iter().all(|&x| x == 0) && &r[4096..] == b"second");
    b.fsync(&l, true, &mut info).unwrap();
    // An extending truncate makes the objects the size reaches; O_TRUNC to 0 makes none.
    b.setattr("f", &SetAttr { size: Some(3 * 4096 + 1), ..Default::default() }, None, &c).unwrap();
    assert_eq!(b.getattr("f", &c).unwrap().size, 3 * 4096 + 1);
    b.release(&l, h).unwrap();
    let (_, l1, h1) = b.create("one", 0o644, EXCL, 2, &c).unwrap();
    b.open("one", libc::O_RDWR | libc::O_TRUNC, &c).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
    // A single-object file never written: an empty read (no sendfile span).
    assert!(b.read_span(&l1, 0, 10, &mut info).unwrap().is_none());
    assert!(b.read(&l1, 0, 10, &mut info).unwrap().is_empty());
    b.release(&l1, h1).unwrap();
    let n = obj_count(&d);
    b.unlink("one", &c).unwrap();
    assert_eq!(obj_count(&d), n, "a file never written had no object");
    b.unlink("f", &c).unwrap();
    assert_eq!(obj_count(&d), 0);
    // A late write to the unlinked, reaped file (its open released) makes no object again.
    assert_eq!(b.write(&l, h, 0, b"late", &mut info).unwrap_err().errno, errno::ENOENT);
    assert_eq!(obj_count(&d), 0);
}
