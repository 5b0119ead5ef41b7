"""Progressive (Lustre-PFL-like) layouts: a pool with `component_size` places each
component of a file at its first write, performance-aware, and records the choice in the
MDT so that every daemon agrees. Checked through real daemons and FUSE mounts: fio
verification (components crossed by blocks), holes, truncate and extend, unlink of an open
file, one file written through two daemons at once, and open counts back to zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from forwarder_testkit import fio_verify, open_counts, wait_for

COMPONENT = 1 << 20  # 1 MiB: fio's blocks below cross component boundaries
TARGETS = 4
PLACEMENT = {
    "pools": {"all": {"targets": [f"ost{i}" for i in range(TARGETS)], "component_size": COMPONENT}},
    "default_pool": "all",
}


@pytest.fixture
def two(cluster):
    """Two daemons with the progressive pool on one backend; mount 0 → fwd0, mount 1 → fwd1."""
    cluster.n_targets = TARGETS
    args = ("--placement", json.dumps(PLACEMENT))
    d0, d1 = cluster.start_daemon("fwd0", *args), cluster.start_daemon("fwd1", *args)
    m0 = cluster.start_mount([d0, d1], node_index=0)
    m1 = cluster.start_mount([d0, d1], node_index=1)
    return cluster, m0.path, m1.path


def objects(c) -> list:
    return [p for p in c.backend.glob("ost*/*.*") if not p.name.startswith(".")]


def component_records(c) -> list:
    return sorted((c.backend / "mdt" / "components").glob("*/*"))


def sidecar(c, name: str) -> str:
    return (c.ns / name).read_text()


CASES = [
    # rw, bs, numjobs, size per job
    ("write", "768k", 2, "24M"),
    ("randwrite", "12k", 4, "4M"),
    ("randrw", "192k", 3, "12M"),
    ("rw", "1536k", 2, "12M"),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rw,bs,jobs,size", CASES)
def test_fio_verify_through_progressive_layout(two, rw, bs, jobs, size):
    c, m0, _ = two
    d = m0 / "fio"
    d.mkdir()
    fio_verify(d, rw, bs, jobs, size)
    files = sorted(p.name for p in d.iterdir())
    assert len(files) == jobs
    for name in files:
        assert sidecar(c, f"fio/{name}").startswith("pharos-layout v2 ")
    # Components of a file live on several targets; each record names the target holding
    # the object, and no object lacks a record.
    recs = component_records(c)
    assert len(recs) >= jobs * 2
    where = {(r.parent.name, r.name): int(r.read_text()) for r in recs}
    for o in objects(c):
        oid, k = o.name.split(".")
        assert where[(oid, k)] == int(o.parent.name[3:]), o
    if rw in ("write", "randwrite"):
        # Concurrent writers spread (fio lays out files for reading one at a time: a lone
        # writer always finds the same best target).
        assert len(set(where.values())) > 1
    # Every open was released: no count is left on any target.
    assert wait_for(lambda: open_counts(c.backend, TARGETS) == [0] * TARGETS), open_counts(c.backend, TARGETS)


def test_holes_truncate_and_extend_agree_on_both_daemons(two):
    c, m0, m1 = two
    a, b = m0 / "f", m1 / "f"
    tail = os.urandom(300_000)
    with open(a, "wb") as f:
        f.seek(3 * COMPONENT + 900_000)
        f.write(tail)  # crosses into component 4; components 0..2 are holes
    end = 3 * COMPONENT + 900_000 + len(tail)
    assert os.stat(a).st_size == os.stat(b).st_size == end
    want = bytes(3 * COMPONENT + 900_000) + tail
    assert a.read_bytes() == want and b.read_bytes() == want
    assert len(objects(c)) == 2  # only written components have objects
    # Shrink into the middle of a hole, then extend: zeros up to the size.
    os.truncate(b, COMPONENT + 4321)
    assert os.stat(a).st_size == COMPONENT + 4321
    assert a.read_bytes() == bytes(COMPONENT + 4321)
    os.truncate(a, 5 * COMPONENT + 1)
    assert os.stat(b).st_size == 5 * COMPONENT + 1
    with open(b, "r+b") as f:
        f.seek(COMPONENT - 10)
        f.write(b"x" * 20)  # across the boundary of components 0 and 1
    got = a.read_bytes()
    assert len(got) == 5 * COMPONENT + 1
    assert got[COMPONENT - 10 : COMPONENT + 10] == b"x" * 20
    assert got.count(0) == len(got) - 20
    # Truncate to zero (O_TRUNC) and rewrite a little.
    with open(a, "wb") as f:
        f.write(b"again")
    assert b.read_bytes() == b"again"
    a.unlink()
    # b.read_bytes()'s close(2) does not wait for fwd1's RELEASE: if it is still open there,
    # the unlink leaves an orphan that the last release reaps (see the test below), so the
    # objects and records are waited for, within wait_for's bound (10 s).
    assert wait_for(lambda: objects(c) == [] and component_records(c) == []), (objects(c), component_records(c))
    assert wait_for(lambda: open_counts(c.backend, TARGETS) == [0] * TARGETS), open_counts(c.backend, TARGETS)


def test_unlinked_open_progressive_file_keeps_data_until_close(two):
    c, m0, m1 = two
    data = os.urandom(3 * COMPONENT + 1234)
    fd = os.open(m0 / "victim", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        assert os.pwrite(fd, data, 0) == len(data)
        assert len(objects(c)) == 4 and len(component_records(c)) == 4
        subprocess.run(["rm", str(m1 / "victim")], check=True, timeout=30)  # through fwd1
        assert not (m0 / "victim").exists()
        assert os.pread(fd, len(data) + 10, 0) == data
        os.pwrite(fd, b"more", 5 * COMPONENT)  # the orphan still grows new components
        assert os.pread(fd, 10, 5 * COMPONENT) == b"more"
        assert os.pread(fd, 10, 4 * COMPONENT) == bytes(10)  # a hole inside the size
        assert len(component_records(c)) == 5
    finally:
        os.close(fd)
    # close(2) does not wait for FUSE's RELEASE, and the release that drops the last open
    # reaps in a crash-safe order: objects, then component records, then the orphan record
    # (what a restarted daemon's GC would finish from). So all three are waited for together,
    # within wait_for's bound (10 s): seeing the first two gone does not mean the third is.
    orphans = c.backend / "mdt" / "orphans"
    assert wait_for(lambda: objects(c) == [] and component_records(c) == [] and list(orphans.iterdir()) == []), (
        objects(c),
        component_records(c),
        list(orphans.iterdir()),
    )
    assert wait_for(lambda: open_counts(c.backend, TARGETS) == [0] * TARGETS), open_counts(c.backend, TARGETS)


WRITER = r"""
import os, sys
path, me, n, bs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
fd = os.open(path, os.O_RDWR)
for i in range(me, n, 2):  # interleaved blocks: both writers reach every component
    os.pwrite(fd, bytes([(seed + i) % 251]) * bs, i * bs)
os.fsync(fd)
os.close(fd)
"""


@pytest.mark.timeout(120)
def test_n_to_1_file_through_two_daemons_at_once(two):
    """Two processes write interleaved 384 KiB blocks of one file, one through each mount
    and daemon, so both place the same components concurrently; every byte reads back
    through both mounts, and each component has one record and one object."""
    c, m0, m1 = two
    n, bs = 64, 384 << 10  # 24 MiB, blocks crossing component boundaries
    (m0 / "shared").write_bytes(b"")
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(m / "shared"), str(me), str(n), str(bs), "7"])
        for me, m in ((0, m0), (1, m1))
    ]
    for p in procs:
        assert p.wait(timeout=100) == 0
    want = b"".join(bytes([(7 + i) % 251]) * bs for i in range(n))
    assert (m0 / "shared").read_bytes() == want
    assert (m1 / "shared").read_bytes() == want
    comps = n * bs // COMPONENT
    assert len(component_records(c)) == comps
    assert sorted(int(o.name.split(".")[1]) for o in objects(c)) == list(range(comps))
    s0, s1 = c.daemons[0].status(), c.daemons[1].status()
    assert s0["counters"]["bytes_written"] > 0 and s1["counters"]["bytes_written"] > 0
    assert wait_for(lambda: open_counts(c.backend, TARGETS) == [0] * TARGETS), open_counts(c.backend, TARGETS)
