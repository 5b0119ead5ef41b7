"""Issue 27, item 2: write-back creates in node-local rank directories, with a real daemon and
real FUSE mounts.

A rank directory ``<mount>/.nodelocal/<job>/<rank>/`` is written by one compute node only, so
its mount answers a create there itself and sends it to the daemon in the background
(forwarder/README.md, "Node-local mode"; ``forwarder/mount/src/fs/writeback.rs``). Checked here:
POSIX inside the rank directory is as before (create then stat, write, read; ``O_EXCL`` on an
existing name; unlink and rename at once after the create); an fsync of the directory makes
every create the daemon's (another node's global view lists them); a create the daemon refuses
surfaces at the file's next operation and at its fsync (not at close: no FLUSH is sent), and
is counted; every create is in
the daemon's forwarder records with its job and rank, as a synchronous one (real broker).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from forwarder_testkit import consume, http, wait_for, wait_records_sent
from pharos_testkit import in_job

from pharos_pipeline.wire import IoBatch, io_pb2

JOB = "wb3"


def rank_dir(mnt: Path, rank: int) -> Path:
    d = mnt / ".nodelocal" / JOB / str(rank)
    d.mkdir(parents=True)
    return d


def create(path: Path, mode: int = 0o640) -> int:
    return os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode)


@pytest.mark.timeout(60)
def test_create_then_stat_write_read_and_exclusive_create(cluster):
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d], 0)
    rd = rank_dir(m.path, 0)
    old = os.umask(0o022)
    try:
        fd = create(rd / "a", 0o666)
    finally:
        os.umask(old)
    st = os.fstat(fd)
    assert (stat.S_IMODE(st.st_mode), st.st_size, st.st_nlink, st.st_uid, st.st_gid) == (0o644, 0, 1, 0, 0)
    assert os.stat(rd / "a").st_ino == st.st_ino
    assert os.write(fd, b"hello") == 5
    assert os.pread(fd, 5, 0) == b"hello"
    os.close(fd)
    assert (rd / "a").read_bytes() == b"hello" and os.stat(rd / "a").st_size == 5
    # O_EXCL on an existing name: EEXIST, whether its create is still pending or done.
    for name in ("a", "b"):
        if name == "b":
            os.close(create(rd / "b"))
        with pytest.raises(OSError) as e:
            create(rd / name)
        assert e.value.errno == errno.EEXIST
    s = m.status()
    assert s["deferred_creates"] >= 2 and s["deferred_create_errors"] == 0, s
    # The daemon's attributes (after the kernel's TTL: a fresh mount) are those the mount gave.
    os.fsync(os.open(rd, os.O_RDONLY | os.O_DIRECTORY))
    other = cluster.start_mount([d], 1)
    got = os.stat(other.path / ".nodelocal" / JOB / "0" / "b")
    want = os.stat(rd / "b")
    assert (got.st_mode, got.st_uid, got.st_gid, got.st_nlink, got.st_size) == (
        want.st_mode,
        want.st_uid,
        want.st_gid,
        want.st_nlink,
        want.st_size,
    )
    assert abs(got.st_mtime - want.st_mtime) < 2


@pytest.mark.timeout(60)
def test_writeback_off_creates_wait_for_the_daemon(cluster):
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d], 0, "--writeback-creates", "0")
    rd = rank_dir(m.path, 7)
    fd = create(rd / "sync")
    os.write(fd, b"sync")
    os.close(fd)
    assert (rd / "sync").read_bytes() == b"sync"
    assert m.status()["deferred_creates"] == 0


@pytest.mark.timeout(60)
def test_unlink_and_rename_right_after_create(cluster):
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d], 0)
    rd = rank_dir(m.path, 1)
    (rd / "sub").mkdir()
    for i in range(50):
        os.close(create(rd / f"gone{i}"))
        os.unlink(rd / f"gone{i}")
        fd = create(rd / f"tmp{i}")
        os.write(fd, b"x" * i)
        os.close(fd)
        os.rename(rd / f"tmp{i}", rd / ("sub" if i % 2 else "") / f"kept{i}")
    # rename over a file just made, and unlink with the file still open
    os.close(create(rd / "over"))
    os.rename(rd / "kept0", rd / "over")
    fd = create(rd / "open-unlinked")
    os.unlink(rd / "open-unlinked")
    assert os.write(fd, b"still writable") == 14
    os.close(fd)
    names = sorted(os.listdir(rd))
    assert names == sorted(["sub", "over", *(f"kept{i}" for i in range(2, 50, 2))]), names
    assert sorted(os.listdir(rd / "sub")) == sorted(f"kept{i}" for i in range(1, 50, 2))
    assert all(os.stat(rd / ("sub" if i % 2 else "") / f"kept{i}").st_size == i for i in range(1, 50))
    assert m.status()["deferred_create_errors"] == 0


@pytest.mark.timeout(90)
def test_many_creates_then_fsync_of_the_directory_are_the_daemons(cluster):
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d], 0, "--writeback-creates", "64")
    view = cluster.start_mount([d], 1)
    rd = rank_dir(m.path, 2)
    n = 600
    for i in range(n):
        os.close(create(rd / f"f{i}"))
    dfd = os.open(rd, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    s = m.status()
    assert s["pending_creates"] == 0 and s["deferred_creates"] >= n, s
    # The daemon has every name: another compute node's global view lists them.
    assert sorted(os.listdir(view.path / ".nodelocal" / JOB / "2")) == sorted(f"f{i}" for i in range(n))
    # ... and so does the unmount (SIGTERM) of a mount with creates pending.
    rd3 = rank_dir(m.path, 3)
    for i in range(200):
        os.close(create(rd3 / f"g{i}"))
    cluster._stop(m.proc)
    assert m.proc.returncode == 0
    assert len(os.listdir(view.path / ".nodelocal" / JOB / "3")) == 200


#: As the job's rank 0 (a non-root user is not needed: the directory is made immutable on the
#: target, which refuses even root): makes a file whose create the daemon refuses, then reports
#: what write, fsync and close answered (an fstat is answered from the kernel's attribute cache
#: for the TTL: it reaches no file system).
REFUSED = r"""
import errno, json, os, sys
d = sys.argv[1]
sys.stdin.readline()  # the rank directory is immutable on its target now
fd = os.open(f"{d}/refused", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
out = {}
for what, call in (("write", lambda: os.write(fd, b"x")),
                   ("fsync", lambda: os.fsync(fd)), ("close", lambda: os.close(fd))):
    try:
        call()
        out[what] = 0
    except OSError as e:
        out[what] = e.errno
print(json.dumps(out), flush=True)
"""


@pytest.mark.timeout(60)
def test_a_create_the_daemon_refuses_surfaces_at_the_next_operation(cluster):
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d], 0)
    rd = rank_dir(m.path, 4)
    fd = create(rd / "before")
    os.fsync(fd)  # the durability point: the daemon made it
    os.close(fd)
    target = {r["rank"]: r["target"] for r in http("GET", d.admin + "/nodelocal")["ranks"]}["4"]
    on_target = cluster.backend / target / ".nodelocal" / JOB / "4"
    assert (on_target / "before").exists()
    p = subprocess.Popen(
        [sys.executable, "-c", REFUSED, str(rd)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    subprocess.run(["chattr", "+i", str(on_target)], check=True, timeout=10)
    try:
        out, _ = p.communicate("go\n", timeout=30)
    finally:
        subprocess.run(["chattr", "-i", str(on_target)], check=True, timeout=10)
    got = json.loads(out)
    # The mount answered the create; the daemon's refusal (EPERM: immutable) is the answer of
    # the file's next operations. Not of its close: files are opened FOPEN_NOFLUSH (the kernel
    # sends no FLUSH; close(2) could not wait for a create in flight anyway).
    assert got == {"write": errno.EPERM, "fsync": errno.EPERM, "close": 0}, got
    assert wait_for(lambda: m.status()["deferred_create_errors"] == 1)
    assert "deferred create of" in m.log.read_text()
    assert not (on_target / "refused").exists()
    # The name was never made: it leaves the kernel's caches at once (not after the entry TTL).
    assert wait_for(lambda: not (rd / "refused").exists(), 5)

    # The directory's next fsync reports it too, once; the directory works again.
    def fsync_dir() -> int:
        dfd = os.open(rd, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
            return 0
        except OSError as e:
            return e.errno
        finally:
            os.close(dfd)

    assert fsync_dir() == errno.EPERM
    os.close(create(rd / "after"))
    os.close(create(rd / "refused"))  # the name is free
    assert fsync_dir() == 0
    assert (on_target / "refused").exists()
    assert (on_target / "after").exists()
    assert sorted(os.listdir(rd)) == ["after", "before", "refused"]


@pytest.mark.timeout(120)
def test_write_back_creates_are_in_the_forwarder_records(cluster, kafka_settings):
    s = kafka_settings
    d = cluster.start_daemon("fwd0", "--topic", s.topic_requests, kafka=s.kafka_bootstrap)
    m = cluster.start_mount([d], 0)
    rd = rank_dir(m.path, 6)
    n = 40
    code = "import os, sys\nfor i in range(int(sys.argv[2])):\n    os.close(os.open(f'{sys.argv[1]}/c{i}', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))"
    with in_job(JOB) as preexec:
        subprocess.run(
            [sys.executable, "-c", code, str(rd), str(n)],
            check=True,
            timeout=30,
            preexec_fn=preexec,
            env={**os.environ, "PHAROS_RANK": "6"},
        )
    assert m.status()["deferred_creates"] >= n
    assert wait_for(lambda: m.status()["pending_creates"] == 0)
    wait_records_sent(d)
    paths = {f"/.nodelocal/{JOB}/6/c{i}" for i in range(n)}

    def mine(got, op) -> list:
        return [r for _, b in got for r in b.records if r.path in paths and r.op == op]

    got = consume(
        s.kafka_bootstrap,
        s.topic_requests,
        IoBatch.FromString,
        lambda g: len(mine(g, io_pb2.OP_OPEN)) >= n and len(mine(g, io_pb2.OP_CLOSE)) >= n,
    )
    for op in (io_pb2.OP_OPEN, io_pb2.OP_CLOSE):
        recs = mine(got, op)
        assert sorted(r.path for r in recs) == sorted(paths), op
        for r in recs:
            assert (r.layer, r.compute_node, r.job_id, r.rank) == (io_pb2.LAYER_FORWARDER, "cn0", JOB, 6)
            assert r.forwarding_node == "fwd0" and r.duration_ns > 0
