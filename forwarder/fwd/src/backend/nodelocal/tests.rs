use super::*;
use crate::backend::testutil::*;
use crate::backend::{layout, IoInfo};
use pharos_fwd_proto::{errno, Ctx};
use std::fs;

fn on(node: &str) -> Ctx {
    Ctx { compute_node: node.into(), job_id: "42".into(), ..Default::default() }
}

fn entries(v: &[DirEntry]) -> Vec<&str> {
    v.iter().map(|e| e.name.as_str()).filter(|n| !n.starts_with('.')).collect()
}

#[test]
fn routes_and_rank_targets() {
    assert_eq!(route("a/b", 8).unwrap(), Where::Shared);
    assert_eq!(route("/.nodelocalx/1", 8).unwrap(), Where::Shared);
    assert_eq!(route("/.nodelocal", 8).unwrap(), Where::Root);
    assert_eq!(route(".nodelocal/42", 8).unwrap(), Where::Job("42"));
    let t = rank_target("3", 8);
    assert_eq!(route("/.nodelocal/42/3/d/f", 8).unwrap(), Where::Rank { ti: t, job: "42", rank: "3", rel: "42/3/d/f" });
    assert!(route("/.nodelocal//x", 8).is_err());
    // A function of the rank id only, spread over the targets.
    let used: BTreeSet<u32> = (0..64).map(|r| rank_target(&r.to_string(), 8)).collect();
    assert_eq!(used.len(), 8);
    assert_eq!(rank_target("rank.7", 8), rank_target("rank.7", 8));
    assert!((0..1000).all(|r| !layout::is_local_oid(layout::shared_oid(r << 48))));
}

#[test]
fn rank_files_live_on_their_target_and_touch_no_mdt() {
    let (d, b) = backend(4);
    let c = on("cn0");
    b.mkdir("/.nodelocal/42/5", 0o755, &c).unwrap();
    let (a, l, h) = b.create("/.nodelocal/42/5/f", 0o644, EXCL, 1, &c).unwrap();
    let ti = rank_target("5", 4);
    assert_eq!(l.targets, vec![ti]);
    assert!(layout::is_local_oid(l.oid));
    assert_eq!(a.ino >> 48, ti as u64 + 1);
    let mut info = IoInfo::default();
    b.write(&l, h, 0, b"node-local", &mut info).unwrap();
    assert_eq!(info.target, Some(ti));
    b.release(&l, h).unwrap();
    // No sidecar in the MDT's namespace, no open marker left, the sidecar and object on the target.
    assert_eq!(fs::read_dir(d.path().join("mdt/ns")).unwrap().count(), 0);
    let open = d.path().join("mdt/open");
    assert_eq!(
        fs::read_dir(&open).unwrap().flatten().map(|s| fs::read_dir(s.path()).unwrap().count()).sum::<usize>(),
        0
    );
    let tdir = d.path().join(format!("ost{ti}"));
    assert!(tdir.join(".nodelocal/42/5/f").is_file());
    assert!(tdir.join(format!("{:016x}.0", l.oid)).is_file());
    // The views list the job and the rank, with the file's size.
    let (jobs, _) = b.readdir("/.nodelocal", 0, &c).unwrap();
    assert_eq!(entries(&jobs), ["42"]);
    let (ranks, _) = b.readdir("/.nodelocal/42", 0, &c).unwrap();
    assert_eq!(entries(&ranks), ["5"]);
    assert_eq!(b.getattr("/.nodelocal/42/5/f", &on("cn1")).unwrap().size, 10);
    let (_, l2, h2) = b.open("/.nodelocal/42/5/f", libc::O_RDONLY, &on("cn1")).unwrap();
    assert_eq!(b.read(&l2, 0, 100, &mut info).unwrap(), b"node-local");
    b.release(&l2, h2).unwrap();
    // Removal takes the object with it.
    b.unlink("/.nodelocal/42/5/f", &c).unwrap();
    assert!(!tdir.join(format!("{:016x}.0", l.oid)).exists());
    // Only inside a rank directory, and no rename out of it.
    assert_eq!(b.create("/.nodelocal/42/f", 0o644, EXCL, 2, &c).unwrap_err().errno, errno::EPERM);
    b.create("/.nodelocal/42/5/g", 0o644, EXCL, 3, &c).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
    assert_eq!(b.rename("/.nodelocal/42/5/g", "/g", false, &c).unwrap_err().errno, errno::EXDEV);
    assert_eq!(b.rename("/.nodelocal/42/5/g", "/.nodelocal/42/6", false, &c).unwrap_err().errno, errno::EXDEV);
}

#[test]
fn only_the_attached_node_writes_until_a_replacement_takes_over() {
    let (_d, b) = backend(4);
    b.mkdir("/.nodelocal/42/1", 0o777, &on("cn0")).unwrap();
    b.mkdir("/.nodelocal/42/2", 0o777, &on("cn1")).unwrap();
    let (_, l, h) = b.create("/.nodelocal/42/1/f", 0o666, EXCL, 1, &on("cn0")).unwrap();
    b.release(&l, h).unwrap();
    // Another node reads, but changes nothing.
    let ro = |node: &str| b.create("/.nodelocal/42/1/g", 0o644, EXCL, 2, &on(node)).map(|(_, l, h)| b.release(&l, h));
    assert_eq!(ro("cn9").unwrap_err().errno, errno::EROFS);
    assert_eq!(b.open("/.nodelocal/42/1/f", libc::O_WRONLY, &on("cn9")).unwrap_err().errno, errno::EROFS);
    assert_eq!(b.unlink("/.nodelocal/42/1/f", &on("cn9")).unwrap_err().errno, errno::EROFS);
    b.open("/.nodelocal/42/1/f", libc::O_RDONLY, &on("cn9")).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
    // cn9 replaces the failed cn0: only cn0's ranks move.
    assert_eq!(b.local.take_over("42", "cn0", "cn9").unwrap(), ["1"]);
    ro("cn9").unwrap().unwrap();
    assert_eq!(ro("cn0").unwrap_err().errno, errno::EROFS);
    assert_eq!(b.local.owner("42", "2").as_deref(), Some("cn1"));
    let att = b.local.attachments();
    assert_eq!(
        att.iter().map(|(j, r, _, n)| (j.as_str(), r.as_str(), n.as_str())).collect::<Vec<_>>(),
        [("42", "1", "cn9"), ("42", "2", "cn1")]
    );
}

#[test]
fn a_sidecar_left_empty_by_a_stopped_create_is_adopted_once() {
    // A create in place whose daemon stopped between making the name and writing its layout
    // (`namespace/inplace.rs`): the name holds an empty sidecar.
    let (d, b) = backend(4);
    let c = on("cn0");
    b.mkdir("/.nodelocal/42/5", 0o755, &c).unwrap();
    let side = d.path().join(format!("ost{}/.nodelocal/42/5", rank_target("5", 4)));
    fs::write(side.join("stopped"), "").unwrap();
    // Every reader sees one layout: the first adopts it, the others read it.
    let a = b.getattr("/.nodelocal/42/5/stopped", &on("cn1")).unwrap();
    assert_eq!(a.size, 0);
    let text = fs::read_to_string(side.join("stopped")).unwrap();
    let (l, tok) = layout::parse_layout(&text).unwrap();
    assert!(layout::is_local_oid(l.oid));
    assert_eq!((l.targets.clone(), tok), (vec![rank_target("5", 4)], 0));
    let (_, l2, h2) = b.open("/.nodelocal/42/5/stopped", libc::O_RDWR, &c).unwrap();
    assert_eq!(l2, l);
    let mut info = IoInfo::default();
    b.write(&l2, h2, 0, b"data", &mut info).unwrap();
    b.release(&l2, h2).unwrap();
    assert_eq!(b.getattr("/.nodelocal/42/5/stopped", &on("cn1")).unwrap().size, 4);
    // The replay of a stopped create (same token) finds its file: adopted with its token.
    fs::write(side.join("replayed"), "").unwrap();
    let (_, l3, h3) = b.create("/.nodelocal/42/5/replayed", 0o644, EXCL, 77, &c).unwrap();
    b.release(&l3, h3).unwrap();
    let (_, tok) = layout::parse_layout(&fs::read_to_string(side.join("replayed")).unwrap()).unwrap();
    assert_eq!(tok, 77);
    // Another create of a taken name: EEXIST, the file untouched; a sidecar that is not a layout: EIO.
    assert_eq!(b.create("/.nodelocal/42/5/replayed", 0o644, EXCL, 78, &c).unwrap_err().errno, errno::EEXIST);
    fs::write(side.join("junk"), "not a layout").unwrap();
    assert_eq!(b.getattr("/.nodelocal/42/5/junk", &c).unwrap_err().errno, errno::EIO);
    assert_eq!(fs::read_to_string(side.join("junk")).unwrap(), "not a layout");
}
