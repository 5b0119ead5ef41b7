use super::*;
use crate::backend::testutil::*;
use crate::backend::IoInfo;
use std::fs;

fn user(uid: u32, gid: u32, groups: &[u32]) -> Ctx {
    Ctx { uid, gid, groups: groups.to_vec(), ..Default::default() }
}

#[test]
fn hard_links_share_data_and_the_last_name_drops_it() {
    let (d, b) = backend(2);
    let c = Ctx::default();
    let (_, l, h) = b.create("f", 0o644, EXCL, 1, &c).unwrap();
    let mut info = IoInfo::default();
    b.write(&l, h, 0, b"linked", &mut info).unwrap();
    b.release(&l, h).unwrap();
    let a = b.link("f", "g", &c).unwrap();
    assert_eq!((a.nlink, a.size, a.kind), (2, 6, Kind::File));
    assert_eq!(b.getattr("f", &c).unwrap().ino, a.ino);
    assert_eq!(b.link("f", "g", &c).unwrap_err().errno, errno::EEXIST);
    // Rename of one link onto the other does nothing (POSIX).
    b.rename("f", "g", false, &c).unwrap();
    assert_eq!(b.getattr("f", &c).unwrap().nlink, 2);
    b.unlink("f", &c).unwrap();
    assert_eq!(b.getattr("g", &c).unwrap().nlink, 1);
    let (_, l2, h2) = b.open("g", libc::O_RDONLY, &c).unwrap();
    assert_eq!(b.read(&l2, 0, 100, &mut info).unwrap(), b"linked");
    b.release(&l2, h2).unwrap();
    assert_eq!(obj_count(&d), 1);
    // Rename over the last name of a file: its data goes.
    let (_, lh, hh) = b.create("h", 0o644, EXCL, 2, &c).unwrap();
    b.write(&lh, hh, 0, b"h", &mut info).unwrap();
    b.release(&lh, hh).unwrap();
    b.rename("h", "g", false, &c).unwrap();
    assert_eq!(obj_count(&d), 1);
    b.unlink("g", &c).unwrap();
    assert_eq!(obj_count(&d), 0);
    assert_eq!(b.mkdir("dir", 0o755, &c).map(|_| b.link("dir", "dir2", &c)).unwrap().unwrap_err().errno, errno::EPERM);
}

#[test]
fn symlinks_special_files_and_paged_readdir() {
    let (_d, b) = backend(1);
    let c = Ctx::default();
    let a = b.symlink("l", "../somewhere/else", &c).unwrap();
    assert_eq!((a.kind, a.size), (Kind::Symlink, 17));
    assert_eq!(b.readlink("l", &c).unwrap(), "../somewhere/else");
    assert_eq!(b.open("l", libc::O_RDONLY, &c).unwrap_err().errno, errno::ELOOP);
    b.mkdir("d", 0o755, &c).unwrap();
    b.symlink("up", "d", &c).unwrap();
    // A symlink is never followed inside a request path.
    assert_eq!(b.getattr("up/x", &c).unwrap_err().errno, errno::ELOOP);
    assert_eq!(b.mknod("p", libc::S_IFIFO | 0o640, 0, &c).unwrap().kind, Kind::Fifo);
    assert_eq!(b.mknod("s", libc::S_IFSOCK | 0o600, 0, &c).unwrap().kind, Kind::Socket);
    let dev = libc::makedev(1, 3);
    let a = b.mknod("null", libc::S_IFCHR | 0o600, dev, &c).unwrap();
    assert_eq!((a.kind, a.rdev), (Kind::CharDev, dev));
    let a = b.mknod("reg", libc::S_IFREG | 0o600, 0, &c).unwrap();
    assert_eq!((a.kind, a.perm, a.size), (Kind::File, 0o600, 0));
    b.read_layout("reg").unwrap();
    // A directory larger than one page comes in several pages, every entry once.
    let names: Vec<String> = (0..3000).map(|i| format!("{i:0>120}")).collect();
    for n in &names {
        fs::File::create(b.ns_path(&format!("d/{n}")).unwrap()).unwrap();
    }
    let (mut got, mut cookie, mut pages) = (Vec::new(), 0, 0);
    loop {
        let (es, eof) = b.readdir("d", cookie, &c).unwrap();
        pages += 1;
        if let Some(last) = es.last() {
            cookie = last.next;
        }
        got.extend(es.into_iter().map(|e| e.name).filter(|n| n != "." && n != ".."));
        if eof {
            break;
        }
    }
    assert!(pages >= 2, "{pages} pages");
    got.sort();
    assert_eq!(got, names);
}

#[test]
fn writes_and_truncates_by_others_clear_setuid_and_setgid() {
    assert_eq!(killed_by_write(0o4777, true), 0o4000);
    assert_eq!(killed_by_write(0o2777, true), 0o2000);
    assert_eq!(killed_by_write(0o2767, true), 0, "setgid without group-execute, a member");
    assert_eq!(killed_by_write(0o2767, false), 0o2000, "setgid without group-execute, not a member");
    assert_eq!(killed_by_write(0o6777, true), 0o6000);
    assert_eq!(killed_by_write(0o1777, false), 0);
    let (_d, b) = backend(1);
    if unsafe { libc::geteuid() } != 0 {
        return; // the daemon cannot chmod others' files then
    }
    let (root, u1) = (Ctx::default(), user(65534, 65534, &[]));
    let perm = |p: &str| b.getattr(p, &root).unwrap().perm;
    for (mode, left) in [(0o4777, 0o777), (0o2777, 0o777), (0o6777, 0o777), (0o2767, 0o767), (0o777, 0o777)] {
        let (_, l, h) = b.create("f", mode, EXCL, 0, &root).unwrap();
        b.setattr("f", &SetAttr { mode: Some(mode), ..Default::default() }, None, &root).unwrap();
        b.kill_suidgid("f", &l, h, &u1).unwrap();
        assert_eq!(perm("f"), left, "{mode:o}");
        // Not an open any more (or never one): refused.
        b.release(&l, h).unwrap();
        assert_eq!(b.kill_suidgid("f", &l, h, &u1).unwrap_err().errno, errno::EBADF);
        b.unlink("f", &root).unwrap();
    }
    // Another file under the name keeps its bits.
    let (_, l, h) = b.create("f", 0o4777, EXCL, 0, &root).unwrap();
    b.rename("f", "g", false, &root).unwrap();
    b.create("f", 0o644, EXCL, 0, &root).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
    b.setattr("f", &SetAttr { mode: Some(0o4777), ..Default::default() }, None, &root).unwrap();
    b.kill_suidgid("f", &l, h, &u1).unwrap();
    assert_eq!(perm("f"), 0o4777);
    b.release(&l, h).unwrap();
    // A truncate by a non-owner with write permission: the size and the mode without the
    // bits (as the client's kernel sends them) are applied; a chmod with it is refused.
    b.setattr("g", &SetAttr { mode: Some(0o6777), ..Default::default() }, None, &root).unwrap();
    let trunc = |mode| SetAttr { size: Some(1), mode: Some(mode), ..Default::default() };
    assert_eq!(b.setattr("g", &trunc(0o6755), None, &u1).unwrap_err().errno, errno::EPERM);
    let a = b.setattr("g", &trunc(0o777), None, &u1).unwrap();
    assert_eq!((a.perm, a.size), (0o777, 1));
    // Times and sizes alone (root's truncate: no mode) keep the bits.
    b.setattr("g", &SetAttr { mode: Some(0o6777), ..Default::default() }, None, &root).unwrap();
    b.setattr("g", &SetAttr { atime: Some(None), mtime: Some(None), ..Default::default() }, None, &u1).unwrap();
    b.setattr("g", &SetAttr { size: Some(0), ..Default::default() }, None, &root).unwrap();
    assert_eq!(perm("g"), 0o6777);
}

#[test]
fn permissions_are_the_callers() {
    let (_d, b) = backend(1);
    if unsafe { libc::geteuid() } != 0 {
        return; // the checks are the daemon's own credentials then
    }
    let root = Ctx::default();
    let (u1, u2) = (user(65534, 65534, &[]), user(65533, 65533, &[4242]));
    b.mkdir("pub", 0o777, &root).unwrap();
    b.mkdir("priv", 0o755, &root).unwrap();
    assert_eq!(b.create("priv/f", 0o644, EXCL, 0, &u1).unwrap_err().errno, errno::EACCES);
    assert_eq!(b.mkdir("priv/d", 0o755, &u1).unwrap_err().errno, errno::EACCES);
    // The caller owns what it creates; others cannot open it for writing, chown or chmod it.
    let (a, l, h) = b.create("pub/f", 0o644, EXCL, 0, &u1).unwrap();
    b.release(&l, h).unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (65534, 65534, 0o644));
    assert_eq!(b.open("pub/f", libc::O_WRONLY, &u2).unwrap_err().errno, errno::EACCES);
    b.open("pub/f", libc::O_RDONLY, &u2).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
    let chmod = SetAttr { mode: Some(0o600), ..Default::default() };
    assert_eq!(b.setattr("pub/f", &chmod, None, &u2).unwrap_err().errno, errno::EPERM);
    let chown = SetAttr { uid: Some(65533), ..Default::default() };
    assert_eq!(b.setattr("pub/f", &chown, None, &u1).unwrap_err().errno, errno::EPERM);
    let trunc = SetAttr { size: Some(0), ..Default::default() };
    assert_eq!(b.setattr("pub/f", &trunc, None, &u2).unwrap_err().errno, errno::EACCES);
    // utimensat: "now" for both needs write permission; one of them alone, ownership.
    let now = SetAttr { atime: Some(None), mtime: Some(None), ..Default::default() };
    assert_eq!(b.setattr("pub/f", &now, None, &u2).unwrap_err().errno, errno::EACCES);
    let mnow = SetAttr { mtime: Some(None), ..Default::default() };
    assert_eq!(b.setattr("pub/f", &mnow, None, &u2).unwrap_err().errno, errno::EPERM);
    // Group membership through supplementary groups: 4242 may write a g+w file of group 4242.
    b.setattr("pub/f", &SetAttr { gid: Some(4242), mode: Some(0o664), ..Default::default() }, None, &root).unwrap();
    b.open("pub/f", libc::O_WRONLY, &u2).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
    // Sticky directory: only the owner removes or renames its entries.
    b.setattr("pub", &SetAttr { mode: Some(0o1777), ..Default::default() }, None, &root).unwrap();
    assert_eq!(b.unlink("pub/f", &u2).unwrap_err().errno, errno::EPERM);
    assert_eq!(b.rename("pub/f", "pub/g", false, &u2).unwrap_err().errno, errno::EPERM);
    b.unlink("pub/f", &u1).unwrap();
    // setgid directory: new entries get its group; a non-member's setgid bit is cleared.
    b.setattr("pub", &SetAttr { mode: Some(0o2777), gid: Some(4242), ..Default::default() }, None, &root).unwrap();
    let a = b.mkdir("pub/sub", 0o755, &u1).unwrap();
    assert_eq!(a.gid, 4242);
    assert_eq!(a.perm & 0o2000, 0o2000, "directories inherit setgid");
    let (a, l, h) = b.create("pub/g", 0o2755, EXCL, 0, &u1).unwrap();
    b.release(&l, h).unwrap();
    assert_eq!((a.gid, a.perm & 0o2000), (4242, 0));
}

/// A caller working below a directory it cannot search (pjdfstest from a root-owned 0700
/// directory: it chdirs there as root, then switches uids) works as on a local file system:
/// only the checks the kernel makes on the last component's directory and on the object
/// itself apply, not search permission on every ancestor.
#[test]
fn permissions_are_not_rechecked_on_the_ancestors() {
    let (_d, b) = backend(1);
    if unsafe { libc::geteuid() } != 0 {
        return; // the checks are the daemon's own credentials then
    }
    let root = Ctx::default();
    let u1 = user(65534, 65534, &[]);
    b.mkdir("priv", 0o700, &root).unwrap();
    b.mkdir("priv/sub", 0o777, &root).unwrap();
    let (_, l, h) = b.create("priv/sub/f", 0o644, EXCL, 0, &u1).unwrap();
    b.release(&l, h).unwrap();
    b.setattr("priv/sub/f", &SetAttr { mode: Some(0o600), ..Default::default() }, None, &u1).unwrap();
    let times = SetAttr { mtime: Some(Some(Time { sec: 1, nsec: 0 })), ..Default::default() };
    b.setattr("priv/sub/f", &times, None, &u1).unwrap();
    b.setattr("priv/sub/f", &SetAttr { size: Some(3), ..Default::default() }, None, &u1).unwrap();
    b.open("priv/sub/f", libc::O_RDWR, &u1).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
    b.rename("priv/sub/f", "priv/sub/g", false, &u1).unwrap();
    b.link("priv/sub/g", "priv/sub/h", &u1).unwrap();
    b.unlink("priv/sub/h", &u1).unwrap();
    b.symlink("priv/sub/s", "g", &u1).unwrap();
    assert_eq!(b.readlink("priv/sub/s", &u1).unwrap(), "g");
    // stat and ls of its working directory, stat of "..".
    assert_eq!(b.getattr("priv/sub", &u1).unwrap().perm, 0o777);
    assert_eq!(b.getattr("priv", &u1).unwrap().perm, 0o700);
    assert!(b.readdir("priv/sub", 0, &u1).unwrap().0.iter().any(|e| e.name == "g"));
    // Still refused: what the kernel checks on the object and on the last directory.
    assert_eq!(b.readdir("priv", 0, &u1).unwrap_err().errno, errno::EACCES);
    let chmod = SetAttr { mode: Some(0o777), ..Default::default() };
    assert_eq!(b.setattr("priv", &chmod, None, &u1).unwrap_err().errno, errno::EPERM);
    b.create("priv/sub/rootf", 0o600, EXCL, 0, &root).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
    assert_eq!(b.open("priv/sub/rootf", libc::O_RDONLY, &u1).unwrap_err().errno, errno::EACCES);
    assert_eq!(b.setattr("priv/sub/rootf", &chmod, None, &u1).unwrap_err().errno, errno::EPERM);
    let chown = SetAttr { uid: Some(65534), ..Default::default() };
    assert_eq!(b.setattr("priv/sub/rootf", &chown, None, &u1).unwrap_err().errno, errno::EPERM);
    assert_eq!(b.setattr("priv/sub/rootf", &times, None, &u1).unwrap_err().errno, errno::EPERM);
    let trunc = SetAttr { size: Some(0), ..Default::default() };
    assert_eq!(b.setattr("priv/sub/rootf", &trunc, None, &u1).unwrap_err().errno, errno::EACCES);
    b.mkdir("priv/sub/ro", 0o755, &root).unwrap();
    assert_eq!(b.create("priv/sub/ro/x", 0o644, EXCL, 0, &u1).unwrap_err().errno, errno::EACCES);
    assert_eq!(b.rename("priv/sub/g", "priv/sub/ro/g", false, &u1).unwrap_err().errno, errno::EACCES);
    // The last component's directory must be searchable (writable without search: no).
    b.mkdir("priv/sub/nox", 0o776, &root).unwrap();
    b.create("priv/sub/nox/f", 0o666, EXCL, 0, &root).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
    assert_eq!(b.unlink("priv/sub/nox/f", &u1).unwrap_err().errno, errno::EACCES);
    assert_eq!(b.create("priv/sub/nox/y", 0o644, EXCL, 0, &u1).unwrap_err().errno, errno::EACCES);
}

#[test]
fn create_is_exclusive_and_replayable() {
    let (_d, b) = backend(2);
    b.create("f", 0o644, EXCL, 42, &Ctx::default()).unwrap();
    assert_eq!(b.create("f", 0o644, EXCL, 43, &Ctx::default()).unwrap_err().errno, errno::EEXIST);
    // Same token: the replay of a create that already happened succeeds.
    b.create("f", 0o644, EXCL, 42, &Ctx::default()).unwrap();
    assert_eq!(b.ns_path("../x").unwrap_err().errno, errno::EINVAL);
}
