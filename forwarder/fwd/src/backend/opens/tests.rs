use super::*;
use crate::backend::testutil::*;
use crate::backend::IoInfo;
use pharos_fwd_proto::Ctx;
use std::sync::Arc;

#[test]
fn unlinked_open_file_keeps_data_until_last_release_on_any_daemon() {
    let (d, a) = backend(2);
    let b = backend_on(&d, 2); // a second daemon on the same backend
    let mut info = IoInfo::default();
    let (_, l, h1) = a.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let (_, l2, h2) = b.open("f", libc::O_RDONLY, &Ctx::default()).unwrap();
    assert_eq!(l, l2);
    a.write(&l, NOH, 0, b"hello", &mut info).unwrap();
    assert_eq!(a.open_markers(l.oid), 2);
    b.unlink("f", &Ctx::default()).unwrap();
    assert_eq!(a.getattr("f", &Ctx::default()).unwrap_err().errno, errno::ENOENT);
    assert!(a.is_orphan(l.oid));
    // Both opens still read and write the orphan.
    a.write(&l, NOH, 5, b" world", &mut info).unwrap();
    assert_eq!(b.read(&l, 0, 100, &mut info).unwrap(), b"hello world");
    // A new file under the same name is another object.
    let (_, n, hn) = b.create("f", 0o644, EXCL, 2, &Ctx::default()).unwrap();
    b.write(&n, hn, 0, b"new", &mut info).unwrap();
    assert_ne!(n.oid, l.oid);
    // Releases may come through either daemon: the last one deletes the data.
    b.release(&l, h1).unwrap();
    assert!(a.is_orphan(l.oid) && obj_count(&d) == 2);
    a.release(&l, h2).unwrap();
    assert!(!a.is_orphan(l.oid));
    assert_eq!(obj_count(&d), 1, "only the new file's object remains");
    // Rename over an open file: same rules.
    let (_, o, ho) = a.create("g", 0o644, EXCL, 3, &Ctx::default()).unwrap();
    b.rename("f", "g", false, &Ctx::default()).unwrap();
    assert!(a.is_orphan(o.oid));
    a.write(&o, NOH, 0, b"still here", &mut info).unwrap();
    assert_eq!(a.read(&o, 0, 100, &mut info).unwrap(), b"still here");
    b.release(&n, hn).unwrap(); // the moved file stays: it has a name
    assert!(!a.is_orphan(n.oid) && a.getattr("g", &Ctx::default()).is_ok());
    a.release(&o, ho).unwrap();
    assert!(!a.is_orphan(o.oid));
    assert_eq!(obj_count(&d), 1);
    // A closed file unlinked: objects go at once, no orphan record.
    b.unlink("g", &Ctx::default()).unwrap();
    assert_eq!(obj_count(&d), 0);
    assert_eq!(fs::read_dir(d.path().join("mdt/orphans")).unwrap().count(), 0);
    assert_eq!(a.open_markers(l.oid) + a.open_markers(n.oid) + a.open_markers(o.oid), 0);
}

#[test]
fn start_gc_drops_opens_of_dead_daemons_only() {
    let d = tempfile::tempdir().unwrap();
    let live = backend_on(&d, 2);
    let dead = backend_on(&d, 2);
    let (_, lx, _hx) = dead.create("x", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    let (_, ly, hy) = live.create("y", 0o644, EXCL, 2, &Ctx::default()).unwrap();
    let (_, lz, _hz) = dead.open("y", libc::O_RDONLY, &Ctx::default()).unwrap();
    let mut info = IoInfo::default();
    live.write(&lx, NOH, 0, b"x", &mut info).unwrap();
    live.write(&ly, hy, 0, b"y", &mut info).unwrap();
    assert_eq!(lz, ly);
    live.unlink("x", &Ctx::default()).unwrap();
    live.unlink("y", &Ctx::default()).unwrap();
    assert!(live.is_orphan(lx.oid) && live.is_orphan(ly.oid));
    drop(dead); // killed: its flock goes with its fd
    let fresh = backend_on(&d, 2);
    let st = fresh.gc();
    assert_eq!(st.dead_daemons, 1);
    assert_eq!(st.stale_markers, 2);
    assert_eq!(st.orphans_reaped, 1, "{st:?}");
    assert_eq!(st.orphans_kept, 1, "{st:?}");
    assert!(!fresh.is_orphan(lx.oid));
    assert!(fresh.is_orphan(ly.oid), "the live daemon's open keeps y");
    assert_eq!(obj_count(&d), 1);
    // Another gc finds nothing more; the live daemon's release ends y.
    let st = fresh.gc();
    assert_eq!((st.dead_daemons, st.stale_markers, st.orphans_reaped), (0, 0, 0));
    live.release(&ly, hy).unwrap();
    assert_eq!(obj_count(&d), 0);
}

#[test]
fn open_racing_unlink_never_returns_deleted_data() {
    let (_d, b) = backend(2);
    let b = Arc::new(b);
    for i in 0..200 {
        let name = format!("r{i}");
        let (_, l, h) = b.create(&name, 0o644, EXCL, 0, &Ctx::default()).unwrap();
        b.release(&l, h).unwrap();
        let b2 = b.clone();
        let n2 = name.clone();
        let t = std::thread::spawn(move || b2.unlink(&n2, &Ctx::default()));
        match b.open(&name, libc::O_RDWR, &Ctx::default()) {
            Ok((_, l, h)) => {
                // Opened: the data must stay readable and writable until release.
                let mut info = IoInfo::default();
                b.write(&l, NOH, 0, b"x", &mut info).unwrap();
                t.join().unwrap().unwrap();
                assert_eq!(b.read(&l, 0, 1, &mut info).unwrap(), b"x");
                b.release(&l, h).unwrap();
                assert!(!b.is_orphan(l.oid));
            }
            Err(e) => {
                assert_eq!(e.errno, errno::ENOENT);
                t.join().unwrap().unwrap();
            }
        }
    }
}
