"""POSIX conformance of the mount: each forwarded operation's result and errno."""

from __future__ import annotations

import errno
import os
import stat

import pytest


@pytest.fixture(scope="module")
def mnt(binaries, tmp_path_factory):
    from forwarder_testkit import Cluster

    c = Cluster(tmp_path_factory.mktemp("posix"), n_targets=3)
    d = c.start_daemon("fwd0", "--placement", '{"stripe_count": 2, "stripe_size": 4096}')
    m = c.start_mount([d])
    yield m.path, c
    c.close()


def err(fn, *a, **k) -> int:
    with pytest.raises(OSError) as e:
        fn(*a, **k)
    return e.value.errno


def test_create_open_exclusive_and_enoent(mnt):
    root, _ = mnt
    p = root / "f1"
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
    os.close(fd)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640
    assert err(os.open, p, os.O_CREAT | os.O_EXCL | os.O_WRONLY) == errno.EEXIST
    assert err(os.open, root / "missing", os.O_RDONLY) == errno.ENOENT
    assert err(os.stat, root / "missing") == errno.ENOENT
    assert err(os.open, root / "nodir" / "x", os.O_CREAT | os.O_WRONLY) == errno.ENOENT


def test_write_read_pread_and_striping(mnt):
    root, c = mnt
    p = root / "data"
    data = os.urandom(100_000)  # spans many 4 KiB stripe units over 2 targets
    with open(p, "wb") as f:
        f.write(data)
    assert os.stat(p).st_size == len(data)
    assert p.read_bytes() == data
    fd = os.open(p, os.O_RDWR)
    try:
        assert os.pwrite(fd, b"XYZ", 50_000) == 3
        assert os.pread(fd, 5, 49_999) == data[49_999:50_000] + b"XYZ" + data[50_003:50_004]
        assert os.pread(fd, 10, len(data)) == b""  # at EOF
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    # Objects exist on two targets.
    objs = [q for q in c.backend.glob("ost*/*.*") if not q.name.startswith(".")]
    assert len(objs) >= 2


def test_truncate_shrink_and_extend(mnt):
    root, _ = mnt
    p = root / "t"
    p.write_bytes(b"a" * 10_000)
    os.truncate(p, 3000)
    assert os.stat(p).st_size == 3000
    os.truncate(p, 20_000)
    b = p.read_bytes()
    assert len(b) == 20_000 and b[:3000] == b"a" * 3000 and b[3000:] == bytes(17_000)
    with open(p, "r+b") as f:
        f.truncate(0)
    assert os.stat(p).st_size == 0
    # O_TRUNC on open.
    p.write_bytes(b"xyz")
    with open(p, "wb") as f:
        f.write(b"1")
    assert p.read_bytes() == b"1"
    # Writing past EOF leaves a hole of zeros.
    fd = os.open(p, os.O_WRONLY)
    os.pwrite(fd, b"end", 9000)
    os.close(fd)
    assert p.read_bytes() == b"1" + bytes(8999) + b"end"


def test_mkdir_rmdir_errnos(mnt):
    root, _ = mnt
    d = root / "d"
    os.mkdir(d, 0o750)
    assert stat.S_ISDIR(os.stat(d).st_mode)
    assert err(os.mkdir, d) == errno.EEXIST
    (d / "child").write_bytes(b"x")
    assert err(os.rmdir, d) == errno.ENOTEMPTY
    assert err(os.rmdir, d / "child") == errno.ENOTDIR
    assert err(os.rmdir, root / "nope") == errno.ENOENT
    assert err(os.mkdir, d / "child" / "sub") == errno.ENOTDIR
    assert err(os.open, d, os.O_WRONLY) == errno.EISDIR
    os.unlink(d / "child")
    os.rmdir(d)
    assert not d.exists()


def test_unlink_errnos_and_object_removed(mnt):
    root, c = mnt
    p = root / "u"
    p.write_bytes(b"hello")
    before = {q.name for q in c.backend.glob("ost*/*.*")}
    os.unlink(p)
    after = {q.name for q in c.backend.glob("ost*/*.*")}
    assert len(before - after) >= 1  # the data objects went with the name
    assert err(os.unlink, p) == errno.ENOENT
    os.mkdir(root / "ud")
    assert err(os.unlink, root / "ud") in (errno.EISDIR, errno.EPERM)
    os.rmdir(root / "ud")


def test_rename_semantics(mnt):
    root, _ = mnt
    a, b = root / "ra", root / "rb"
    a.write_bytes(b"A")
    b.write_bytes(b"B")
    os.rename(a, b)  # over an existing file
    assert b.read_bytes() == b"A" and not a.exists()
    assert err(os.rename, root / "nope", root / "x") == errno.ENOENT
    os.mkdir(root / "rd1")
    os.mkdir(root / "rd2")
    (root / "rd2" / "f").write_bytes(b"f")
    assert err(os.rename, root / "rd1", root / "rd2") == errno.ENOTEMPTY
    assert err(os.rename, b, root / "rd1") == errno.EISDIR
    assert err(os.rename, root / "rd1", b) == errno.ENOTDIR
    # A directory moves with its contents; an open file survives the rename of its parent.
    fd = os.open(root / "rd2" / "f", os.O_RDWR)
    os.rename(root / "rd2", root / "rd3")
    os.pwrite(fd, b"g", 1)
    os.close(fd)
    assert (root / "rd3" / "f").read_bytes() == b"fg"


def test_readdir_contents(mnt):
    root, _ = mnt
    d = root / "ls"
    d.mkdir()
    names = {f"n{i:03d}" for i in range(300)}
    for n in names:
        (d / n).write_bytes(b"")
    (d / "sub").mkdir()
    assert set(os.listdir(d)) == names | {"sub"}
    kinds = {e.name: e.is_dir() for e in os.scandir(d)}
    assert kinds["sub"] and not kinds["n000"]


def test_ebadf_and_statfs(mnt):
    root, _ = mnt
    p = root / "bf"
    p.write_bytes(b"x")
    fd = os.open(p, os.O_RDONLY)
    os.close(fd)
    assert err(os.read, fd, 1) == errno.EBADF
    fd = os.open(p, os.O_RDONLY)
    try:
        assert err(os.write, fd, b"x") == errno.EBADF
    finally:
        os.close(fd)
    st = os.statvfs(root)
    assert st.f_blocks > 0 and st.f_bavail > 0


def test_chmod_and_utime(mnt):
    root, _ = mnt
    p = root / "m"
    p.write_bytes(b"x")
    os.chmod(p, 0o600)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    os.utime(p, (1_000_000_000, 1_000_000_000))
    assert int(os.stat(p).st_mtime) == 1_000_000_000
