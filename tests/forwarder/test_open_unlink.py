"""POSIX: a file that is unlinked (or renamed over) while open keeps its data for its
openers until the last close, across processes, mounts and forwarding daemons that share
one backend; then its objects go. And fio's N-1 pattern (several processes laying out and
writing one shared file at disjoint offsets) verifies through the mount."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from forwarder_testkit import wait_for


@pytest.fixture
def two(cluster):
    """Two daemons on one backend; mount 0 goes to fwd0, mount 1 to fwd1."""
    d0, d1 = cluster.start_daemon("fwd0"), cluster.start_daemon("fwd1")
    m0 = cluster.start_mount([d0, d1], node_index=0)
    m1 = cluster.start_mount([d0, d1], node_index=1)
    return cluster, m0.path, m1.path


def objects(c) -> set[str]:
    return {p.name for p in c.backend.glob("ost*/*.*") if not p.name.startswith(".")}


def orphans(c) -> list[str]:
    d = c.backend / "mdt" / "orphans"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def other_process(*cmd: str) -> None:
    subprocess.run(cmd, check=True, timeout=30)


def test_unlink_by_another_process_keeps_open_file_until_close(two):
    c, m0, m1 = two
    p0 = m0 / "victim"
    data = os.urandom(3 << 20)
    fd = os.open(p0, os.O_CREAT | os.O_RDWR, 0o644)
    closed = False
    try:
        assert os.pwrite(fd, data, 0) == len(data)
        before = objects(c)
        assert len(before) == 1
        # Another process, through the other mount and the other daemon, unlinks it.
        other_process("rm", str(m1 / "victim"))
        assert not p0.exists() and not (m1 / "victim").exists()
        assert len(orphans(c)) == 1 and objects(c) == before
        # The opener keeps writing and reading its data.
        tail = os.urandom(1 << 20)
        assert os.pwrite(fd, tail, len(data)) == len(tail)
        assert os.pread(fd, len(data) + len(tail) + 10, 0) == data + tail
        # A new file under the same name is a different file.
        (m1 / "victim").write_bytes(b"new")
        assert p0.read_bytes() == b"new"
        assert os.pread(fd, 16, 0) == data[:16]
        os.close(fd)
        closed = True
        # Last close: the orphan's objects go, the new file's stay.
        assert wait_for(lambda: orphans(c) == []), orphans(c)
        after = objects(c)
        assert len(after) == 1 and not (after & before)
        assert p0.read_bytes() == b"new"
    finally:
        if not closed:
            os.close(fd)


def test_rename_over_open_file_keeps_it_until_close(two):
    c, m0, m1 = two
    old = os.urandom(1 << 20)
    (m0 / "target").write_bytes(old)
    fd = os.open(m0 / "target", os.O_RDWR)
    closed = False
    try:
        before = objects(c)
        (m1 / "incoming").write_bytes(b"replacement")
        other_process("mv", str(m1 / "incoming"), str(m1 / "target"))
        assert (m0 / "target").read_bytes() == b"replacement"
        assert len(orphans(c)) == 1
        assert before <= objects(c)
        assert os.pwrite(fd, b"patched", 100) == 7
        got = os.pread(fd, len(old), 0)
        assert got == old[:100] + b"patched" + old[107:]
        os.close(fd)
        closed = True
        assert wait_for(lambda: orphans(c) == []), orphans(c)
        assert not (objects(c) & before)
        assert (m1 / "target").read_bytes() == b"replacement"
    finally:
        if not closed:
            os.close(fd)


def test_open_by_two_processes_survives_until_both_close(two):
    c, m0, m1 = two
    (m0 / "shared").write_bytes(b"x" * 5000)
    fd0 = os.open(m0 / "shared", os.O_RDWR)
    fd1 = os.open(m1 / "shared", os.O_RDWR)
    os.unlink(m0 / "shared")
    assert os.pwrite(fd1, b"from1", 0) == 5
    assert os.pread(fd0, 5, 0) == b"from1"
    os.close(fd0)
    time.sleep(0.3)
    assert len(orphans(c)) == 1  # fd1 still holds it
    assert os.pread(fd1, 10, 0) == b"from1xxxxx"
    os.close(fd1)
    assert wait_for(lambda: orphans(c) == [] and objects(c) == set())
