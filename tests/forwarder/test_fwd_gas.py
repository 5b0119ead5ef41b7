"""Gather-Arrange-Scatter on the forwarding daemon (issue 12, item 3;
forwarder/fwd/src/backend/gas.rs) through the real daemon and mounts: 8 fio jobs writing
interleaved 64 KiB blocks of one file verify their data and the daemon issues fewer backend
writes than it received; a write is seen at once by a read from another compute node, by a
stat of the size and, after fsync, in the target's object file; the counters are in
GET /metrics; bad flags are refused."""

from __future__ import annotations

import os
import subprocess
import urllib.request

import pytest
from forwarder_testkit import ADMIN_TOKEN, BIN, fio, http, n1_interleaved_args


def metric(d, name: str) -> float:
    req = urllib.request.Request(d.admin + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    for line in urllib.request.urlopen(req, timeout=10).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("data_path", ["shm", "socket"])
def test_interleaved_ranks_verify_and_issue_fewer_backend_writes(cluster, data_path):
    # Flushes only at the buffer limit and at close (a long idle time): the merge is certain.
    d = cluster.start_daemon("fwd0", "--gas", "on", "--gas-buffer-kb", "65536", "--gas-flush-ms", "10000")
    m = cluster.start_mount([d], 0, *(["--shm-slots", "0"] if data_path == "socket" else []))
    out = fio("--name=gas", f"--directory={m.path}", *n1_interleaved_args(8, 64 << 10, 4 << 20))
    job = out["jobs"][0]
    assert job["error"] == 0
    assert job["write"]["io_bytes"] == job["read"]["io_bytes"] == 32 << 20
    received = metric(d, "pharos_fwd_client_writes_total")
    issued = metric(d, "pharos_fwd_backend_write_requests_total")
    assert received == 512
    assert issued < received, (issued, received)
    assert metric(d, "pharos_fwd_gas_buffered_bytes") == 0
    g = http("GET", d.admin + "/status")["gas"]
    assert g["enabled"] and g["merged"] > 0 and g["bytes"] == 32 << 20
    # Over the socket, a gathered write keeps the buffer it was received in (no copy).
    assert (g["kept"] > 0) == (data_path == "socket"), g["kept"]
    assert metric(d, "pharos_fwd_gas_kept_writes_total") == g["kept"]


@pytest.mark.timeout(120)
def test_reads_stats_and_fsync_see_gathered_writes(cluster):
    d = cluster.start_daemon("fwd0", "--gas", "on", "--gas-flush-ms", "10000")
    m0 = cluster.start_mount([d], node_index=0)
    m1 = cluster.start_mount([d], node_index=1)
    p0, p1 = m0.path / "f", m1.path / "f"
    fd = os.open(p0, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"a" * 1000, 0)
        os.pwrite(fd, b"b" * 1000, 1000)
        assert http("GET", d.admin + "/status")["gas"]["buffered_bytes"] == 2000
        # Another compute node's read, and a stat of the size, see the gathered writes.
        assert p1.read_bytes() == b"a" * 1000 + b"b" * 1000
        os.pwrite(fd, b"c" * 10, 5000)
        assert os.stat(p1).st_size == 5010
        # An overwrite of buffered bytes lands after them.
        os.pwrite(fd, b"d" * 10, 100_000)
        os.pwrite(fd, b"e" * 4, 100_002)
        os.pwrite(fd, b"z" * 10, 200_000)
        os.fsync(fd)
        assert http("GET", d.admin + "/status")["gas"]["buffered_bytes"] == 0
        # After fsync the bytes are in the target's object file (single-target default layout).
        objs = [f for t in cluster.backend.glob("ost*") for f in t.glob("[0-9a-f]*.*")]
        assert sum(f.stat().st_size for f in objs) == 200_010
        with open(p1, "rb") as f:
            f.seek(100_000)
            assert f.read(10) == b"ddeeeedddd"
    finally:
        os.close(fd)
    g = http("GET", d.admin + "/status")["gas"]
    assert g["flushes"]["fsync"] >= 1 and g["flushes"]["read_or_stat"] >= 1 and g["flushes"]["overlap"] >= 1


def test_gas_off_by_default_and_bad_flags_are_refused(cluster):
    d = cluster.start_daemon("fwd0")
    assert http("GET", d.admin + "/status")["gas"]["enabled"] is False
    assert metric(d, "pharos_fwd_client_writes_total") == 0
    base = [str(BIN / "pharos-fwd"), "--mdt", "/nonexistent", "--target", "a=/nonexistent"]
    for bad, flag in [(["--gas", "maybe"], "--gas"), (["--gas", "on", "--gas-flush-ms", "0"], "--gas-flush-ms")]:
        r = subprocess.run([*base, "--key-file", str(cluster.key_file), *bad], capture_output=True, text=True)
        assert r.returncode == 2 and flag in r.stderr, r.stderr
