"""The forwarding node's page cache (issue 12, item 4; forwarder/fwd/src/backend/cache.rs)
through the real daemon and mount: a read after a write, an overwrite, a truncate and an
unlink sees the file as it is, for both policies; fio verifies its data with the cache on
(small enough to evict); the counters are in GET /metrics; bad flags are refused."""

from __future__ import annotations

import os
import subprocess

import pytest
from forwarder_testkit import ADMIN_TOKEN, BIN, fio_verify, http


def metrics(d) -> str:
    import urllib.request

    req = urllib.request.Request(d.admin + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    return urllib.request.urlopen(req, timeout=10).read().decode()


def value(text: str, key: str) -> float:
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{key} not in /metrics")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["fgf-lru", "lru"])
def test_reads_through_the_cache_see_writes_truncates_and_unlinks(cluster, policy):
    d = cluster.start_daemon("fwd0", "--cache-mb", "1", "--cache-policy", policy)
    m = cluster.start_mount([d])
    p = m.path / "f"
    data = os.urandom(300_000)
    p.write_bytes(data)
    fd = os.open(p, os.O_RDWR)
    try:
        for _ in range(2):
            assert os.pread(fd, 4096, 8192) == data[8192:12288]
            assert os.pread(fd, 1 << 20, 0) == data
        # An overwrite from another open (another client) shows at once.
        with open(p, "r+b") as g:
            g.seek(10_000)
            g.write(b"overwritten")
        assert os.pread(fd, 4096, 8192)[1808:1819] == b"overwritten"
        # An extension past the partial last page: zeros, then the new bytes.
        os.pwrite(fd, b"tail", 400_000)
        back = os.pread(fd, 1 << 20, 0)
        assert len(back) == 400_004 and back[300_000:400_000] == bytes(100_000) and back[-4:] == b"tail"
        os.ftruncate(fd, 5000)
        assert os.pread(fd, 1 << 20, 0) == data[:5000]
        os.ftruncate(fd, 9000)
        assert os.pread(fd, 1 << 20, 0) == data[:5000] + bytes(4000)
    finally:
        os.close(fd)
    p.unlink()
    p.write_bytes(b"new file")
    assert p.read_bytes() == b"new file"
    text = metrics(d)
    assert value(text, f'pharos_fwd_cache_requests_total{{policy="{policy}",grain="fine",result="hit"}}') >= 1
    assert value(text, f'pharos_fwd_cache_invalidations_total{{policy="{policy}"}}') > 0
    assert value(text, f'pharos_fwd_cache_capacity_pages{{policy="{policy}"}}') == 256
    assert http("GET", d.admin + "/status")["cache"]["policy"] == policy


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rw,bs,jobs,size", [("randrw", "16k", 4, "16M"), ("rw", "256k", 2, "32M")])
def test_fio_verify_with_a_small_cache(cluster, rw, bs, jobs, size):
    d = cluster.start_daemon("fwd0", "--cache-mb", "4", "--cache-policy", "fgf-lru")
    m = cluster.start_mount([d])
    fio_verify(m.path, rw, bs, jobs, size)
    c = http("GET", d.admin + "/status")["cache"]
    assert c["evictions"] > 0 and c["page_hits"] + c["page_misses"] > 0


def test_cache_is_off_by_default_and_bad_flags_are_refused(cluster):
    d = cluster.start_daemon("fwd0")
    assert http("GET", d.admin + "/status")["cache"] is None
    assert "pharos_fwd_cache_" not in metrics(d)
    base = [str(BIN / "pharos-fwd"), "--mdt", "/nonexistent", "--target", "a=/nonexistent", "--key-file"]
    r = subprocess.run(
        [*base, str(cluster.key_file), "--cache-mb", "4", "--cache-policy", "mru"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "--cache-policy" in r.stderr, r.stderr
