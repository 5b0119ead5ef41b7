"""Data integrity through the mount: fio writes and verifies (crc32c) every block it
wrote, sequential and random, 1 to 8 jobs, 4 KiB to 4 MiB blocks (≤ 256 MiB per case); the
reads must cover every written byte (forwarder_testkit.fio_verify)."""

from __future__ import annotations

import pytest
from forwarder_testkit import fio_verify

CASES = [
    # rw, bs, numjobs, size per job
    ("write", "1M", 1, "64M"),
    ("write", "4M", 2, "64M"),
    ("randwrite", "4k", 8, "8M"),
    ("randwrite", "64k", 4, "32M"),
    ("randrw", "16k", 4, "16M"),
    ("rw", "256k", 2, "32M"),
]


@pytest.fixture(scope="module")
def mounted(binaries, tmp_path_factory):
    from forwarder_testkit import Cluster

    c = Cluster(tmp_path_factory.mktemp("fio"), n_targets=4)
    d0, d1 = c.start_daemon("fwd0"), c.start_daemon("fwd1")
    m = c.start_mount([d0, d1], node_index=1)
    yield c, m
    c.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rw,bs,jobs,size", CASES)
def test_fio_verify_crc32c(mounted, rw, bs, jobs, size):
    c, m = mounted
    d = m.path / f"{rw}-{bs}-{jobs}"
    d.mkdir()
    fio_verify(d, rw, bs, jobs, size)
    # The static default mapping (node index 1 mod 2) sent the data to fwd1 only.
    s0, s1 = c.daemons[0].status(), c.daemons[1].status()
    assert s1["counters"]["bytes_written"] > 0
    assert s0["counters"]["bytes_written"] == 0
