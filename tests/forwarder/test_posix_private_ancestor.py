"""Permissions as the kernel checks them (issue 26, item 7): a process whose working
directory (or `*at` directory fd) is inside a directory may work relative to it whatever the
ancestors' modes are. Search permission is checked at lookup on the components the lookup
walks (the last one's directory included), not re-checked over the whole path.

pjdfstest run from a root-owned 0700 directory (what `mktemp -d` gives) chdirs as root into a
directory it made there, then switches uids: each case here does the same. The same
sequence runs on the mount and on a local directory (the reference, also below a private
0700 directory: pytest's tmp dir) and must give the same errno at every step: the positive
steps succeed, and the negative ones (no write permission, not the owner, sticky directory,
no search permission on a component the lookup walks) still fail as locally.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

U1, G1 = 65534, 65534  # nobody


def touch(p: Path, mode: int) -> None:
    os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
    os.chmod(p, mode)


def make_tree(base: Path) -> Path:
    """base/priv (root's, 0700) / sub (0777) with root's file, read-only and sticky
    directories; returns sub."""
    priv = base / "priv"
    priv.mkdir()
    os.chmod(priv, 0o700)
    sub = priv / "sub"
    sub.mkdir()
    os.chmod(sub, 0o777)
    touch(sub / "rootf", 0o644)
    (sub / "rodir").mkdir()
    os.chmod(sub / "rodir", 0o755)
    (sub / "sticky").mkdir()
    os.chmod(sub / "sticky", 0o1777)
    touch(sub / "sticky" / "rf", 0o666)
    (sub / "atdir").mkdir()
    os.chmod(sub / "atdir", 0o777)
    return sub


def create(name: str, **kw) -> None:
    os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, **kw))


def rw(name: str) -> None:
    fd = os.open(name, os.O_RDWR)
    try:
        os.write(fd, b"data")
        if os.pread(fd, 4, 0) != b"data":
            raise OSError(errno.EIO, "read back")
    finally:
        os.close(fd)


def steps(at: int) -> list[tuple[str, object, int]]:
    """(what, action, errno on a local file system) in the order run; `at` is a directory
    fd of `atdir`, opened before the uid switch."""
    return [
        ("create f", lambda: create("f"), 0),
        ("write and read f", lambda: rw("f"), 0),
        ("stat f", lambda: os.stat("f"), 0),
        ("chmod f", lambda: os.chmod("f", 0o600), 0),
        ("chown f to itself", lambda: os.chown("f", U1, G1), 0),
        ("utime f", lambda: os.utime("f", (1, 2)), 0),
        ("truncate f", lambda: os.truncate("f", 3), 0),
        ("rename f g", lambda: os.rename("f", "g"), 0),
        ("link g h", lambda: os.link("g", "h"), 0),
        ("unlink h", lambda: os.unlink("h"), 0),
        ("mkdir d", lambda: os.mkdir("d", 0o755), 0),
        ("create d/x", lambda: create("d/x"), 0),
        ("rename g d/g", lambda: os.rename("g", "d/g"), 0),
        ("symlink s", lambda: os.symlink("d/g", "s"), 0),
        ("readlink s", lambda: os.readlink("s"), 0),
        ("mkfifo p", lambda: os.mkfifo("p", 0o600), 0),
        ("listdir .", lambda: os.listdir("."), 0),
        ("stat .", lambda: os.stat("."), 0),
        ("stat ..", lambda: os.stat(".."), 0),
        ("unlink s", lambda: os.unlink("s"), 0),
        ("unlink p", lambda: os.unlink("p"), 0),
        ("unlink d/x", lambda: os.unlink("d/x"), 0),
        ("unlink d/g", lambda: os.unlink("d/g"), 0),
        ("rmdir d", lambda: os.rmdir("d"), 0),
        ("create at/af", lambda: create("af", dir_fd=at), 0),
        ("chmod at/af", lambda: os.chmod("af", 0o600, dir_fd=at), 0),
        ("rename at/af at/ag", lambda: os.rename("af", "ag", src_dir_fd=at, dst_dir_fd=at), 0),
        ("mkdir at/ad", lambda: os.mkdir("ad", 0o700, dir_fd=at), 0),
        ("unlink at/ag", lambda: os.unlink("ag", dir_fd=at), 0),
        ("rmdir at/ad", lambda: os.rmdir("ad", dir_fd=at), 0),
        # Still refused: not the owner, no write permission, sticky directory, no search or
        # read permission on a directory the lookup walks or opens.
        ("chmod rootf", lambda: os.chmod("rootf", 0o666), errno.EPERM),
        ("chown rootf", lambda: os.chown("rootf", U1, G1), errno.EPERM),
        ("utime rootf given times", lambda: os.utime("rootf", (1, 2)), errno.EPERM),
        ("utime rootf now", lambda: os.utime("rootf"), errno.EACCES),
        ("open rootf for writing", lambda: os.close(os.open("rootf", os.O_WRONLY)), errno.EACCES),
        ("truncate rootf", lambda: os.truncate("rootf", 0), errno.EACCES),
        ("unlink rootf", lambda: os.unlink("rootf"), 0),
        ("create rodir/x", lambda: create("rodir/x"), errno.EACCES),
        ("mkdir rodir/x", lambda: os.mkdir("rodir/x"), errno.EACCES),
        ("create sticky/mine", lambda: create("sticky/mine"), 0),
        ("unlink sticky/rf", lambda: os.unlink("sticky/rf"), errno.EPERM),
        ("rename sticky/rf", lambda: os.rename("sticky/rf", "sticky/x"), errno.EPERM),
        ("rename sticky/mine into rodir", lambda: os.rename("sticky/mine", "rodir/mine"), errno.EACCES),
        ("link sticky/mine into rodir", lambda: os.link("sticky/mine", "rodir/l"), errno.EACCES),
        ("chmod ..", lambda: os.chmod("..", 0o777), errno.EPERM),
        ("listdir ..", lambda: os.listdir(".."), errno.EACCES),
        ("stat ../sub", lambda: os.stat("../sub"), errno.EACCES),
        ("chmod at/..", lambda: os.chmod("..", 0o777, dir_fd=at), errno.EPERM),
    ]


def run_in(sub: Path) -> dict[str, int]:
    """Runs the steps in a child that chdirs to `sub` (and opens `sub/atdir`) as root, then
    becomes U1; the errno of each step (0 = success)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            os.chdir(sub)
            at = os.open("atdir", os.O_RDONLY | os.O_DIRECTORY)
            os.setgroups([])
            os.setgid(G1)
            os.setuid(U1)
            os.umask(0o022)
            out = {}
            for what, fn, _ in steps(at):
                try:
                    fn()
                    out[what] = 0
                except OSError as e:
                    out[what] = e.errno or -1
            os.write(w, json.dumps(out).encode())
        except BaseException:
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed outside the steps"
    return json.loads(data)


def test_cwd_below_a_private_directory_works_as_on_a_local_file_system(cluster, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    os.chmod(local, 0o755)
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d])
    on_mount = m.path / "t"
    on_mount.mkdir()
    os.chmod(on_mount, 0o755)
    ref = run_in(make_tree(local))
    got = run_in(make_tree(on_mount))
    expected = {what: e for what, _, e in steps(-1)}
    name = errno.errorcode.get
    assert ref == expected, {k: (name(v), name(expected[k])) for k, v in ref.items() if v != expected[k]}
    diff = {k: f"mount {name(v, v)} local {name(ref[k], ref[k])}" for k, v in got.items() if v != ref[k]}
    assert not diff, diff
    # What the steps left is the same too (owner and mode of each name).
    for rel in ("atdir", "sticky", "sticky/mine", "rodir"):
        a, b = os.lstat(make_path(local, rel)), os.lstat(make_path(on_mount, rel))
        assert (a.st_uid, a.st_mode) == (b.st_uid, b.st_mode), rel


def make_path(base: Path, rel: str) -> Path:
    return base / "priv" / "sub" / rel
