"""POSIX namespace semantics of the mount (issue 16), each case one that pjdfstest found
failing before: symlinks, hard links, special files, chown/chmod/utimensat rules, rename,
unlink and rmdir corner cases, open flags, truncate, with the permission checks done by the
daemon with the caller's uid, gid and supplementary groups (callers are forked children
that switch credentials). Plus a directory larger than one Readdir frame, listed whole, and
a worker whose request panics (answered EIO, counted, the daemon goes on).
pjdfstest itself runs outside `make test`: bench/posix_conformance.py."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

U1, G1 = 65534, 65534  # nobody
U2, G2 = 65533, 65533
GX = 4242  # a supplementary group of U2 only


@pytest.fixture(scope="module")
def mnt(binaries):
    from forwarder_testkit import Cluster

    # Other users reach the mount point by its path: not under pytest's private (0700) tmp.
    root = Path(tempfile.mkdtemp(prefix="pharos-posixns-", dir="/var/tmp"))
    root.chmod(0o755)
    c = Cluster(root, n_targets=2)
    try:
        d = c.start_daemon("fwd0")
        m = c.start_mount([d])
        yield m.path, c, d
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def work(mnt, request):
    """A fresh world-writable directory on the mount for one test."""
    root = mnt[0]
    d = root / request.node.name
    d.mkdir()
    os.chmod(d, 0o777)
    return d


def err(fn, *a, **k) -> int:
    with pytest.raises(OSError) as e:
        fn(*a, **k)
    return e.value.errno


def as_user(uid: int, gid: int, groups: list[int], fn) -> int:
    """Runs fn() in a child with these credentials; its errno (0 = success)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            fn()
        except OSError as e:
            code = e.errno or 255
        except BaseException:
            code = 254
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def u1(fn) -> int:
    return as_user(U1, G1, [], fn)


def u2(fn) -> int:
    return as_user(U2, G2, [GX], fn)


def touch(p, mode=0o644) -> None:
    """Creates p with exactly `mode` (no umask)."""
    os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
    os.chmod(p, mode)


def test_symlink_readlink_and_nofollow(work):
    link = work / "l"
    os.symlink("target/../x", link)
    assert os.readlink(link) == "target/../x"
    st = os.lstat(link)
    assert stat.S_ISLNK(st.st_mode) and st.st_size == len("target/../x")
    assert err(os.stat, link) == errno.ENOENT  # dangling
    assert err(os.symlink, "x", link) == errno.EEXIST
    (work / "x").write_bytes(b"through")
    os.symlink("x", work / "lx")
    assert (work / "lx").read_bytes() == b"through"
    assert err(os.open, work / "lx", os.O_RDONLY | os.O_NOFOLLOW) == errno.ELOOP
    os.symlink("lx", work / "loop1")
    os.symlink("loop2", work / "loop2")
    assert err(os.stat, work / "loop2") == errno.ELOOP
    assert sorted(os.listdir(work)) == ["l", "loop1", "loop2", "lx", "x"]
    os.unlink(link)
    assert (work / "x").read_bytes() == b"through"
    assert u1(lambda: os.symlink("x", work / "by_u1")) == 0
    assert os.lstat(work / "by_u1").st_uid == U1
    assert err(os.symlink, "x", work / ("n" * 256)) == errno.ENAMETOOLONG


def test_hard_links_counts_and_unlink_of_one_name(work):
    a, b = work / "a", work / "b"
    a.write_bytes(b"shared data")
    os.link(a, b)
    assert os.stat(a).st_nlink == 2 and os.stat(a).st_ino == os.stat(b).st_ino
    with open(b, "ab") as f:
        f.write(b"!")
    assert a.read_bytes() == b"shared data!"
    os.rename(a, b)  # two links of one file: nothing happens
    assert os.stat(a).st_nlink == 2
    os.unlink(a)
    assert os.stat(b).st_nlink == 1 and b.read_bytes() == b"shared data!"
    assert err(os.link, b, b) == errno.EEXIST
    assert err(os.link, work / "missing", work / "c") == errno.ENOENT
    (work / "d").mkdir()
    assert err(os.link, work / "d", work / "d2") == errno.EPERM
    # Permission: a name in a directory the caller cannot write.
    (work / "ro").mkdir(mode=0o755)
    os.chown(b, U1, G1)  # its own file (protected_hardlinks would refuse another's: EPERM)
    assert u1(lambda: os.link(b, work / "ro" / "x")) == errno.EACCES
    assert u1(lambda: os.link(b, work / "by_u1")) == 0
    os.unlink(work / "by_u1")
    # ctime of the file changes with its link count.
    before = os.stat(b).st_ctime_ns
    time.sleep(0.01)
    os.link(b, work / "c")
    assert os.stat(b).st_ctime_ns > before
    os.unlink(work / "c")
    os.unlink(b)
    assert sorted(os.listdir(work)) == ["d", "ro"]


def test_mkfifo_mknod_sockets_and_devices(work):
    os.mkfifo(work / "fifo", 0o640)
    st = os.stat(work / "fifo")
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    assert err(os.mkfifo, work / "fifo") == errno.EEXIST
    os.mknod(work / "sock", stat.S_IFSOCK | 0o600)
    assert stat.S_ISSOCK(os.stat(work / "sock").st_mode)
    os.mknod(work / "reg", stat.S_IFREG | 0o600)
    assert stat.S_ISREG(os.stat(work / "reg").st_mode) and (work / "reg").read_bytes() == b""
    # Device nodes: root may (CAP_MKNOD, as on a local file system); others get EPERM.
    os.mknod(work / "chr", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    st = os.stat(work / "chr")
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    os.mknod(work / "blk", stat.S_IFBLK | 0o600, os.makedev(7, 300))
    st = os.stat(work / "blk")
    assert stat.S_ISBLK(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (7, 300)
    assert u1(lambda: os.mknod(work / "chr2", stat.S_IFCHR | 0o600, os.makedev(1, 3))) == errno.EPERM
    assert u1(lambda: os.mkfifo(work / "ufifo")) == 0
    assert os.stat(work / "ufifo").st_uid == U1
    kinds = {e.name: e for e in os.scandir(work)}
    # Directory entries carry the types (d_type): none of these is a regular file.
    assert not any(kinds[n].is_file() or kinds[n].is_dir() for n in ("fifo", "sock", "chr", "blk"))
    assert kinds["reg"].is_file()
    for n in ("fifo", "sock", "chr", "blk"):
        os.unlink(work / n)


def test_chown_rules(work):
    f = work / "f"
    touch(f, 0o6755)
    os.chmod(f, 0o6755)
    os.chown(f, U1, G1)
    st = os.stat(f)
    assert (st.st_uid, st.st_gid) == (U1, G1)
    # chown clears setuid and setgid (of a group-executable file).
    assert stat.S_IMODE(st.st_mode) == 0o755
    assert u2(lambda: os.chown(f, U2, -1)) == errno.EPERM  # not the owner
    assert u1(lambda: os.chown(f, U2, -1)) == errno.EPERM  # giving away
    assert u1(lambda: os.chown(f, -1, GX)) == errno.EPERM  # a group it is not in
    assert u1(lambda: os.chown(f, -1, G1)) == 0  # its own group, unchanged owner
    os.chown(f, U2, G2)
    assert u2(lambda: os.chown(f, -1, GX)) == 0  # a supplementary group of the owner
    assert os.stat(f).st_gid == GX
    os.symlink("f", work / "l")
    os.lchown(work / "l", U1, G1)
    assert os.lstat(work / "l").st_uid == U1 and os.stat(f).st_uid == U2


def test_chmod_rules_setgid_and_sticky(work):
    f = work / "f"
    touch(f)
    os.chown(f, U1, G1)
    assert u1(lambda: os.chmod(f, 0o600)) == 0
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    assert u2(lambda: os.chmod(f, 0o666)) == errno.EPERM
    # setgid of a file whose group the caller is not in is cleared.
    os.chown(f, U1, GX)
    assert u1(lambda: os.chmod(f, 0o2755)) == 0
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o755
    os.chown(f, U2, GX)
    assert u2(lambda: os.chmod(f, 0o2755)) == 0
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o2755
    # Sticky directory: only the entry's or the directory's owner removes or renames it.
    d = work / "sticky"
    d.mkdir()
    os.chmod(d, 0o1777)
    assert u1(lambda: touch(d / "mine")) == 0
    assert u2(lambda: os.unlink(d / "mine")) == errno.EPERM
    assert u2(lambda: os.rename(d / "mine", d / "theirs")) == errno.EPERM
    assert u1(lambda: os.rename(d / "mine", d / "moved")) == 0
    assert u1(lambda: os.unlink(d / "moved")) == 0
    # setgid directory: new entries take its group, subdirectories its setgid bit.
    sg = work / "sg"
    sg.mkdir()
    os.chown(sg, 0, GX)
    os.chmod(sg, 0o2777)
    assert u1(lambda: touch(sg / "f")) == 0 and u1(lambda: os.mkdir(sg / "d")) == 0
    assert os.stat(sg / "f").st_gid == GX
    assert os.stat(sg / "d").st_gid == GX and os.stat(sg / "d").st_mode & stat.S_ISGID


def test_utimensat_now_omit_and_permissions(work):
    f = work / "f"
    touch(f, 0o666)
    os.chown(f, U1, G1)
    os.utime(f, ns=(1_000_000_000_123, 2_000_000_000_456))
    st = os.stat(f)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000_123, 2_000_000_000_456)
    # UTIME_OMIT for atime, UTIME_NOW for mtime (through the fd: futimens).
    fd = os.open(f, os.O_RDONLY)
    try:
        subprocess.run(["touch", "-m", f"/proc/self/fd/{fd}"], check=True, pass_fds=(fd,))
    finally:
        os.close(fd)
    st = os.stat(f)
    assert st.st_atime_ns == 1_000_000_000_123 and st.st_mtime_ns > 2_000_000_000_456
    # Non-owner with write permission: "now" yes, a given time no.
    assert u2(lambda: os.utime(f)) == 0
    assert u2(lambda: os.utime(f, ns=(5, 5))) == errno.EPERM
    os.chmod(f, 0o644)
    assert u2(lambda: os.utime(f)) == errno.EACCES
    assert u1(lambda: os.utime(f, ns=(7, 7))) == 0
    assert os.stat(f).st_mtime_ns == 7
    # A write after it moves mtime on: data times and name times agree.
    with open(f, "ab") as h:
        h.write(b"x")
    assert os.stat(f).st_mtime_ns > 7


def test_rename_corner_cases(work):
    (work / "d1" / "sub").mkdir(parents=True)
    (work / "d2").mkdir()
    (work / "full").mkdir()
    touch(work / "full" / "x")
    touch(work / "f")
    assert err(os.rename, work / "d1", work / "d1" / "sub" / "in") == errno.EINVAL
    assert err(os.rename, work / "d2", work / "full") == errno.ENOTEMPTY
    assert err(os.rename, work / "f", work / "d2") == errno.EISDIR
    assert err(os.rename, work / "d2", work / "f") == errno.ENOTDIR
    assert err(os.rename, work / "missing", work / "g") == errno.ENOENT
    assert err(os.rename, work / "f", work / "nodir" / "g") == errno.ENOENT
    os.rename(work / "d2", work / "d1" / "sub" / "d2")  # into another directory
    assert (work / "d1" / "sub" / "d2").is_dir()
    os.rename(work / "d1", work / "d3")  # an empty target directory is replaced
    assert os.stat(work / "d3" / "sub").st_nlink >= 2
    (work / "g").write_bytes(b"new")
    os.rename(work / "g", work / "f")  # over a file: the old one's data goes
    assert (work / "f").read_bytes() == b"new"
    # Permission: the caller must write both directories.
    (work / "ro").mkdir(mode=0o755)
    assert u1(lambda: os.rename(work / "f", work / "ro" / "f")) == errno.EACCES
    assert err(os.rename, work / "f", work / ("n" * 256)) == errno.ENAMETOOLONG


def test_unlink_rmdir_corner_cases(work):
    (work / "d" / "x").mkdir(parents=True)
    touch(work / "f")
    assert err(os.rmdir, work / "d") == errno.ENOTEMPTY
    assert err(os.rmdir, work / "f") == errno.ENOTDIR
    assert err(os.unlink, work / "d") == errno.EISDIR
    assert err(os.unlink, work / "f" / "x") == errno.ENOTDIR
    assert err(os.rmdir, work / "missing") == errno.ENOENT
    ro = work / "ro"
    ro.mkdir(mode=0o755)
    touch(ro / "f", 0o666)
    (ro / "e").mkdir()
    assert u1(lambda: os.unlink(ro / "f")) == errno.EACCES
    assert u1(lambda: os.rmdir(ro / "e")) == errno.EACCES
    os.chmod(ro, 0o700)
    assert u1(lambda: os.stat(ro / "f")) == errno.EACCES  # no search permission
    # An open file keeps its data after unlink; fstat shows no link.
    fd = os.open(work / "f", os.O_RDWR)
    try:
        os.write(fd, b"still")
        os.unlink(work / "f")
        assert os.fstat(fd).st_nlink == 0
        assert os.pread(fd, 10, 0) == b"still"
    finally:
        os.close(fd)


def test_open_flags_and_permissions(work):
    f = work / "f"
    fd = os.open(f, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
    os.write(fd, b"0123456789")
    os.close(fd)
    assert err(os.open, f, os.O_CREAT | os.O_EXCL | os.O_RDWR) == errno.EEXIST
    fd = os.open(f, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"ab")
    os.close(fd)
    assert f.read_bytes() == b"0123456789ab"
    before = os.stat(f).st_mtime_ns
    time.sleep(0.01)
    os.close(os.open(f, os.O_WRONLY | os.O_TRUNC))
    st = os.stat(f)
    assert st.st_size == 0 and st.st_mtime_ns > before
    os.chown(f, U1, G1)
    assert u2(lambda: os.close(os.open(f, os.O_RDONLY))) == errno.EACCES  # 0640, other
    assert u1(lambda: os.close(os.open(f, os.O_RDWR))) == 0
    os.chmod(f, 0o440)
    assert u1(lambda: os.close(os.open(f, os.O_WRONLY))) == errno.EACCES
    assert u1(lambda: os.close(os.open(f, os.O_RDONLY | os.O_TRUNC))) == errno.EACCES
    os.chown(f, U2, GX)
    assert u2(lambda: os.close(os.open(f, os.O_RDONLY))) == 0  # owner
    os.chown(f, 0, GX)
    assert u2(lambda: os.close(os.open(f, os.O_RDONLY))) == 0  # via a supplementary group
    assert u1(lambda: os.close(os.open(f, os.O_RDONLY))) == errno.EACCES
    assert err(os.open, work / ("n" * 256), os.O_CREAT | os.O_WRONLY) == errno.ENAMETOOLONG
    assert err(os.open, work / "f" / "x", os.O_RDONLY) == errno.ENOTDIR
    ro = work / "ro"
    ro.mkdir(mode=0o755)
    assert u1(lambda: os.close(os.open(ro / "new", os.O_CREAT | os.O_WRONLY, 0o644))) == errno.EACCES
    # Deeper than PATH_MAX below the namespace root: PATH_MAX bounds a system call's path
    # (relative to the working directory), not the depth (pjdfstest's */03.t).
    deep = work
    for _ in range(14):
        deep = deep / ("d" * 250)
        deep.mkdir()
    here = os.getcwd()
    os.chdir(deep)
    try:
        rel = "/".join(["e" * 250] * 3)
        os.makedirs(rel)
        touch(rel + "/leaf")
        assert os.stat(rel + "/leaf").st_size == 0
        assert len(str(deep.relative_to(work.parent))) + len(rel) > 4096
        os.unlink(rel + "/leaf")
    finally:
        os.chdir(here)


def test_mkdir_modes_and_errnos(work):
    os.mkdir(work / "d", 0o751)
    assert stat.S_IMODE(os.stat(work / "d").st_mode) == 0o751
    assert err(os.mkdir, work / "d") == errno.EEXIST
    assert err(os.mkdir, work / "f" / "x") == errno.ENOENT
    os.mkdir(work / "ro", 0o555)
    assert u1(lambda: os.mkdir(work / "ro" / "x")) == errno.EACCES
    assert u1(lambda: os.mkdir(work / "mine", 0o700)) == 0
    st = os.stat(work / "mine")
    assert (st.st_uid, st.st_gid) == (U1, G1)
    assert os.stat(work).st_nlink == 5  # ., .. in each of d, ro, mine


def test_truncate_and_ftruncate_permissions(work):
    f = work / "f"
    f.write_bytes(b"x" * 1000)
    os.chown(f, U1, G1)
    os.chmod(f, 0o644)
    assert u2(lambda: os.truncate(f, 10)) == errno.EACCES
    assert u1(lambda: os.truncate(f, 10)) == 0
    assert os.stat(f).st_size == 10

    # ftruncate through a descriptor open for writing needs no write permission any more.
    def through_fd():
        fd = os.open(f, os.O_RDWR)
        os.chmod(f, 0o444)
        try:
            os.ftruncate(fd, 3)
        finally:
            os.close(fd)

    assert u1(through_fd) == 0
    assert os.stat(f).st_size == 3
    fd = os.open(f, os.O_RDONLY)
    try:
        assert err(os.ftruncate, fd, 0) == errno.EINVAL
    finally:
        os.close(fd)
    assert err(os.truncate, work, 0) == errno.EISDIR
    assert err(os.truncate, f, -1) == errno.EINVAL


def test_writes_and_truncates_by_others_clear_setuid_and_setgid(work):
    """As Linux's file_remove_privs: a write or truncate by a caller without CAP_FSETID
    clears setuid, and setgid when group-execute is set or the caller is not in the file's
    group (pjdfstest chmod/12.t); root's keep them, and so do other attribute changes."""
    f = work / "f"

    def mode() -> int:
        return stat.S_IMODE(os.stat(f).st_mode)

    def make(m: int, uid: int = 0, gid: int = 0) -> None:
        if f.exists():
            f.unlink()
        touch(f, 0o600)
        os.chown(f, uid, gid)
        os.chmod(f, m)

    def through_fd(*steps, flags: int = os.O_WRONLY):
        def run() -> None:
            fd = os.open(f, flags)
            try:
                for step in steps:
                    step(fd)
            finally:
                os.close(fd)

        return run

    def write(fd: int) -> None:
        os.write(fd, b"x")

    def fstat_cleared(fd: int) -> None:
        if stat.S_IMODE(os.fstat(fd).st_mode) != 0o777:
            raise OSError(errno.EBADE, "fstat after the write")

    for m in (0o4777, 0o2777, 0o6777):  # chmod/12.t
        make(m)
        assert u1(through_fd(write, fstat_cleared, flags=os.O_RDWR)) == 0, oct(m)
        assert mode() == 0o777, oct(m)
    # setgid without group-execute: kept for a member of the group, cleared for others.
    make(0o2767, gid=G1)
    assert u1(through_fd(write)) == 0
    assert mode() == 0o2767
    assert u2(through_fd(write)) == 0
    assert mode() == 0o767
    # The owner without CAP_FSETID clears them too; root keeps them.
    make(0o6777, uid=U1, gid=G1)
    assert u1(through_fd(write)) == 0
    assert mode() == 0o777
    make(0o6777)
    through_fd(write)()
    assert mode() == 0o6777
    # Set again while open: the descriptor's next write clears them again.
    make(0o4777, uid=U1, gid=G1)
    assert u1(through_fd(write, lambda fd: os.chmod(f, 0o4777), write)) == 0
    assert mode() == 0o777
    # truncate, O_TRUNC and ftruncate by a non-owner with write permission clear them.
    for trunc in (
        lambda: os.truncate(f, 1),
        through_fd(flags=os.O_WRONLY | os.O_TRUNC),
        through_fd(lambda fd: os.ftruncate(fd, 0)),
    ):
        make(0o6777)
        assert u1(trunc) == 0
        assert mode() == 0o777
    # Root's truncate and anyone's times keep them (chown(-1, -1) is not sent: it clears).
    make(0o6777)
    os.truncate(f, 0)
    assert u1(lambda: os.utime(f)) == 0
    assert mode() == 0o6777
    assert os.stat(f).st_size == 0


@pytest.mark.timeout(600)
def test_directory_larger_than_a_frame_is_listed_whole(mnt):
    """200,000 entries with 48-byte names: one Readdir frame (8 MiB) held them all before
    and was dropped; pages of READDIR_PAGE_BYTES list every entry once, through `ls` too."""
    root, c, _ = mnt
    n = 200_000
    big = root / "big"
    big.mkdir()
    # The names are made in the namespace directly (creating 200,000 files through FUSE
    # takes minutes); what is tested is the listing through the mount.
    ns_big = c.ns / "big"
    names = [f"entry-{i:08d}-{'x' * 33}" for i in range(n)]
    for name in names:
        os.close(os.open(ns_big / name, os.O_CREAT | os.O_WRONLY, 0o644))
    touch(big / "through-the-mount")
    got = os.listdir(big)
    assert len(got) == n + 1 and set(got) == set(names) | {"through-the-mount"}
    out = subprocess.run(["ls", "-f", str(big)], capture_output=True, text=True, check=True, timeout=300).stdout
    listed = out.split()
    assert len(listed) == n + 3 and len(set(listed)) == n + 3  # with . and .., no entry twice
    os.unlink(big / "through-the-mount")


def test_a_panicking_request_is_answered_and_the_worker_goes_on(binaries, tmp_path, monkeypatch):
    from forwarder_testkit import HOOKS_FWD, Cluster

    monkeypatch.setenv("PHAROS_FWD_FAULT_PANIC_PATH", "boom")
    c = Cluster(tmp_path, n_targets=1, fwd_bin=HOOKS_FWD)  # the fault hook: a test build only
    try:
        d = c.start_daemon("fwd0", "--workers", "2")
        m = c.start_mount([d])
        for _ in range(3):  # more panics than workers
            assert err(os.stat, m.path / "boom") == errno.EIO
        (m.path / "ok").write_bytes(b"fine")
        assert (m.path / "ok").read_bytes() == b"fine"
        st = d.status()["counters"]
        assert st["worker_panics"] == 3 and st["reply_failures"] == 0
        assert "panicked" in d.log.read_text()
    finally:
        c.close()
