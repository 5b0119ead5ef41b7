"""The shared-memory data path (issue 12, item 1): a mount and a daemon on the same host move
data through the mount's sealed memfd region instead of the socket. fio --verify must pass
whichever way the data goes: through the region (the default), on the socket because the
daemon refuses the region (--shm-data false: the slot's bytes go as the frame's data), with
too few slots (a pooled buffer instead), or with the region off (--shm-slots 0). A read after a
write through another mount sees the write (no client data cache). The counters in /status
say which path was taken."""

from __future__ import annotations

import pytest
from forwarder_testkit import Cluster, fio_verify


@pytest.fixture()
def cluster(binaries, tmp_path):
    c = Cluster(tmp_path, n_targets=4)
    yield c
    c.close()


def shm(m) -> dict:
    return m.status()["shm"]


@pytest.mark.timeout(240)
def test_data_moves_through_the_region_by_default(cluster):
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d])
    for rw, bs, jobs in [("write", "1M", 2), ("randrw", "4k", 4), ("rw", "256k", 2)]:
        work = m.path / f"{rw}-{bs}"
        work.mkdir()
        fio_verify(work, rw, bs, jobs, "16M")
    c = d.status()["counters"]
    assert c["shm_attaches"] >= 1 and c["shm_refusals"] == 0
    assert c["shm_requests"] > 0 and c["bytes_written"] > 0 and c["bytes_read"] > 0
    s = shm(m)
    assert s["requests"] > 0 and s["fallbacks"] == 0 and s["tainted"] == 0
    assert s["free"] == s["slots"] == 32  # every slot back once idle
    # Another mount (its own region) reads what this one wrote, and overwrites it.
    other = cluster.start_mount([d], node_index=1)
    f1, f2 = m.path / "shared.bin", other.path / "shared.bin"
    data = bytes(range(256)) * 8192  # 2 MiB: two 1 MiB requests
    f1.write_bytes(data)
    assert f2.read_bytes() == data
    with f2.open("r+b") as f:
        f.seek(4096)
        f.write(b"x" * 100)
    assert f1.read_bytes() == data[:4096] + b"x" * 100 + data[4196:]
    assert shm(other)["requests"] > 0


@pytest.mark.timeout(240)
def test_a_daemon_without_shared_memory_gets_the_data_on_the_socket(cluster):
    d = cluster.start_daemon("fwd0", "--shm-data", "false")
    m = cluster.start_mount([d])
    work = m.path / "w"
    work.mkdir()
    fio_verify(work, "randrw", "64k", 4, "16M")
    c = d.status()["counters"]
    assert c["shm_attaches"] == 0 and c["shm_refusals"] >= 1 and c["shm_requests"] == 0
    s = shm(m)
    assert s["requests"] == 0 and s["fallbacks"] > 0


@pytest.mark.timeout(240)
def test_too_few_slots_and_no_region(cluster):
    d = cluster.start_daemon("fwd0")
    few = cluster.start_mount([d], 0, "--shm-slots", "1")
    work = few.path / "few"
    work.mkdir()
    fio_verify(work, "write", "1M", 4, "16M")
    s = shm(few)
    assert s["slots"] == 1 and s["exhausted"] > 0 and s["requests"] > 0
    off = cluster.start_mount([d], 1, "--shm-slots", "0")
    work = off.path / "off"
    work.mkdir()
    fio_verify(work, "rw", "1M", 2, "16M")
    assert off.status()["shm"] is None
    assert d.status()["counters"]["shm_attaches"] >= 1  # the first mount's connections only
