"""Authenticated forwarding (issue 14, item 3) against the real daemon and FUSE mount.

* A client without the site key (what a non-root user of a compute node is: the key file is
  root's) gets an error reply and its connection closed, whatever it sends first, including a
  request claiming uid 0; a client with another key likewise. The file stays untouched.
* An authenticated client that sends a capability the daemon did not issue (a made-up MAC, or
  its own capability with another user's layout) gets EACCES and reads or changes nothing; a
  read-only capability used for a write gets EBADF.
* The admin interfaces of daemon and mount answer PUTs (and every GET but /status) only with
  the admin token.
* Through the mount, a non-root user reading a root-only file gets EACCES (and cannot read the
  site key either).
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import struct
import subprocess

import pytest
from forwarder_testkit import (
    ADMIN_TOKEN,
    ATTR_LEN,
    BODY_CREATED,
    BODY_OPENED,
    CAP_READ,
    CAP_WRITE,
    OP_AUTH,
    OP_CREATE,
    OP_FSYNC,
    OP_KILL_SUIDGID,
    OP_OPEN,
    OP_PING,
    OP_READ,
    OP_RELEASE,
    OP_SETATTR,
    OP_WRITE,
    _s,
    cap,
    connect,
    frame,
    handshake,
    http,
    http_status,
    layout,
    parse_cap,
    read_reply,
    request,
    write_secret,
)

NOBODY = 65534
SECRET = b"root's secret bytes " * 1000


def closed(s: socket.socket) -> bool:
    """True when the daemon closed the connection (EOF or reset, no more frames)."""
    try:
        s.settimeout(5)
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def objects(cluster, oid: int) -> dict:
    """Path -> bytes of every data object of ``oid`` on the targets."""
    return {p: p.read_bytes() for p in cluster.backend.glob(f"ost*/{oid:016x}.*")}


def sidecar_layout(cluster, rel: str) -> tuple[int, int, list[int]]:
    """(oid, stripe size, targets) of a namespace file, from its layout sidecar."""
    f = dict(kv.split("=", 1) for kv in (cluster.ns / rel).read_text().split()[2:])
    return int(f["oid"], 16), int(f["stripe_size"]), [int(t) for t in f["targets"].split(",")]


@pytest.fixture
def setup(cluster):
    """One daemon and a mount; root's 0600 file ``secret`` written through the mount, and a
    directory ``u`` of uid 1000."""
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d])
    (m.path / "u").mkdir()
    os.chown(m.path / "u", 1000, 1000)
    p = m.path / "secret"
    p.write_bytes(SECRET)
    os.chmod(p, 0o600)
    oid, ss, targets = sidecar_layout(cluster, "secret")
    before = objects(cluster, oid)
    assert b"".join(before.values()) == SECRET
    return cluster, d, m, oid, layout(oid, ss, targets), before


def open_file(s: socket.socket, rid: int, path: str, flags: int, uid: int = 0, create: bool = False) -> dict:
    """Create (mode 0644) or open ``path`` as ``uid``; the capability the daemon issued."""
    if create:
        s.sendall(frame(request(rid, OP_CREATE, _s(path) + struct.pack("<IiQ", 0o644, flags, rid), uid=uid, gid=uid)))
    else:
        s.sendall(frame(request(rid, OP_OPEN, _s(path) + struct.pack("<i", flags), uid=uid, gid=uid)))
    got, e, rest, _ = read_reply(s)
    assert (got, e) == (rid, None), (got, e)
    assert struct.unpack("<I", rest[:4])[0] == (BODY_CREATED if create else BODY_OPENED)
    c, tail = parse_cap(rest[4 + ATTR_LEN :])
    assert len(tail) == (ATTR_LEN if create else 0)  # a create's: its directory's attributes
    return c


def write_req(rid: int, path: str, capability: bytes, uid: int = 0) -> bytes:
    return frame(request(rid, OP_WRITE, _s(path) + capability + struct.pack("<Q", 0), uid=uid), data=b"OVERWRITTEN")


def read_req(rid: int, path: str, capability: bytes, uid: int = 0) -> bytes:
    return frame(request(rid, OP_READ, _s(path) + capability + struct.pack("<QI", 0, 4096), uid=uid))


def test_unauthenticated_client_gets_an_error_and_is_closed(setup):
    cluster, d, _, oid, victim, before = setup
    made_up = cap(victim, bytes(16), CAP_READ | CAP_WRITE, secrets.token_bytes(32))
    # A client claiming uid 0 that skips the handshake: a write, a read, a ping as its first request.
    for first in (write_req(5, "secret", made_up), read_req(6, "secret", made_up), frame(request(7, OP_PING))):
        with connect(d.port) as s:
            rid, e, rest, _ = read_reply(s)  # the daemon's challenge, unanswered
            assert (rid, e, struct.unpack("<I", rest[:4])[0]) == (0, None, 8)
            s.sendall(first)
            rid, e, _, data = read_reply(s)
            assert e == errno.EACCES and data == b"", (rid, e)
            assert closed(s)
    # Garbage or an oversized frame where Auth is expected: refused, closed, nothing buffered.
    for junk in (b"\xff" * 64, struct.pack("<I", 8 << 20) + b"\x05"):
        with connect(d.port) as s:
            read_reply(s)
            s.sendall(junk)
            assert read_reply(s)[1] in (errno.EACCES, errno.EPROTO)
            assert closed(s)
    assert objects(cluster, oid) == before
    c = d.status()["counters"]
    assert c["auth_failures"] == 5 and c["bytes_written"] == len(SECRET) and c["bytes_read"] == 0, c


def test_wrong_site_key_is_refused(setup):
    cluster, d, _, oid, victim, before = setup
    with connect(d.port) as s, pytest.raises(AssertionError):
        handshake(s, secrets.token_hex(32).encode())
    with connect(d.port) as s:
        # A proof made with another key, then a write claiming uid 0: the proof is refused, the
        # write never read.
        assert read_reply(s)[:2] == (0, None)  # the challenge
        nonce = secrets.token_bytes(32)
        s.sendall(frame(request(9, OP_AUTH, nonce + secrets.token_bytes(32))) + write_req(10, "secret", victim))
        assert read_reply(s)[:2] == (9, errno.EACCES)
        assert closed(s)
    assert objects(cluster, oid) == before
    # The right key passes (the same test client).
    with connect(d.port, cluster.key) as s:
        s.sendall(frame(request(11, OP_PING)))
        assert read_reply(s)[:2] == (11, None)


def test_mount_with_another_key_cannot_serve(cluster, tmp_path):
    d = cluster.start_daemon("fwd0")
    bad = write_secret(tmp_path / "other.key", secrets.token_hex(32))
    with pytest.raises(RuntimeError, match="exited"):
        cluster.start_mount([d], key_file=bad)
    assert d.status()["counters"]["auth_failures"] >= 1


def test_made_up_or_altered_capabilities_are_refused(setup):
    cluster, d, _, oid, victim, before = setup
    uid = 1000
    with connect(d.port, cluster.key) as s:
        # uid 1000 opening root's 0600 file: the namespace check says no.
        s.sendall(frame(request(20, OP_OPEN, _s("secret") + struct.pack("<i", os.O_RDONLY), uid=uid, gid=uid)))
        assert read_reply(s)[:2] == (20, errno.EACCES)
        own = open_file(s, 21, "u/mine", os.O_CREAT | os.O_EXCL | os.O_RDWR, uid=uid, create=True)
        assert own["rights"] == CAP_READ | CAP_WRITE
        forged = [
            # a capability made up from scratch: the victim's layout, a random MAC
            cap(victim, own["handle"], CAP_READ | CAP_WRITE, secrets.token_bytes(32)),
            # the client's own valid capability with the victim's layout put in
            cap(victim, own["handle"], own["rights"], own["mac"]),
            # ... or its own object with more rights than granted, or a flipped MAC bit
            cap(own["layout_bytes"], own["handle"], own["rights"] | 4, own["mac"]),
            cap(own["layout_bytes"], own["handle"], own["rights"], own["mac"][:-1] + bytes([own["mac"][-1] ^ 1])),
        ]
        rid = 30
        for c in forged:
            for req in (
                write_req(rid, "secret", c, uid),
                read_req(rid + 1, "secret", c, uid),
                frame(request(rid + 2, OP_FSYNC, _s("secret") + c + b"\x00", uid=uid)),
                frame(request(rid + 3, OP_KILL_SUIDGID, _s("secret") + c, uid=uid)),
                # setattr through a "file open for writing": truncate root's file to 0
                frame(request(rid + 4, OP_SETATTR, _s("secret") + setattr_size(0) + b"\x01" + c, uid=uid)),
                frame(request(rid + 5, OP_RELEASE, _s("secret") + c, uid=uid)),
            ):
                s.sendall(req)
                got, e, _, data = read_reply(s)
                assert e == errno.EACCES and data == b"", (got, e)
            rid += 10
        # The connection goes on (an authenticated mount) and the valid capability works.
        s.sendall(write_req(90, "u/mine", own["raw"], uid))
        assert read_reply(s)[:2] == (90, None)
    assert objects(cluster, oid) == before
    assert (cluster.ns / "secret").stat().st_mode & 0o7777 == 0o600
    assert d.status()["counters"]["cap_refusals"] == 6 * len(forged)


def setattr_size(size: int) -> bytes:
    """A `SetAttr` changing only the size (mode, uid, gid None; size Some; atime, mtime None)."""
    return b"\x00\x00\x00" + b"\x01" + struct.pack("<Q", size) + b"\x00\x00"


def test_read_only_capability_cannot_write(setup):
    cluster, d, m, *_ = setup
    (m.path / "pub").write_bytes(b"public data")
    os.chmod(m.path / "pub", 0o644)
    oid = sidecar_layout(cluster, "pub")[0]
    uid = 1000
    with connect(d.port, cluster.key) as s:
        ro = open_file(s, 40, "pub", os.O_RDONLY, uid=uid)
        assert ro["rights"] == CAP_READ
        s.sendall(read_req(41, "pub", ro["raw"], uid))
        rid, e, _, data = read_reply(s)
        assert (rid, e, data) == (41, None, b"public data")
        s.sendall(write_req(42, "pub", ro["raw"], uid))
        assert read_reply(s)[:2] == (42, errno.EBADF)
        s.sendall(frame(request(43, OP_KILL_SUIDGID, _s("pub") + ro["raw"], uid=uid)))
        assert read_reply(s)[:2] == (43, errno.EBADF)
        # Through a read-only open, a truncate is the caller's own (uid 1000: no write permission).
        s.sendall(frame(request(44, OP_SETATTR, _s("pub") + setattr_size(0) + b"\x01" + ro["raw"], uid=uid, gid=uid)))
        assert read_reply(s)[:2] == (44, errno.EACCES)
        # A write-only open of a file it may not write is refused at open.
        s.sendall(frame(request(45, OP_OPEN, _s("pub") + struct.pack("<i", os.O_WRONLY), uid=uid, gid=uid)))
        assert read_reply(s)[:2] == (45, errno.EACCES)
        wo = open_file(s, 46, "pub", os.O_WRONLY)  # root may
        assert wo["rights"] == CAP_WRITE
        s.sendall(read_req(47, "pub", wo["raw"]))
        assert read_reply(s)[:2] == (47, errno.EBADF)
        s.sendall(
            frame(request(48, OP_RELEASE, _s("pub") + ro["raw"]))
            + frame(request(49, OP_RELEASE, _s("pub") + wo["raw"]))
        )
        assert [read_reply(s)[:2] for _ in range(2)] == [(48, None), (49, None)]
    assert b"".join(objects(cluster, oid).values()) == b"public data"


def test_admin_interfaces_need_the_admin_token(cluster):
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d])
    placement = {"pools": {"p": {"targets": ["ost0"]}}, "default_pool": "p"}
    for url, body in (
        (d.admin + "/placement", placement),
        (d.admin + "/targets/ost0", {"slowdown": 2}),
        (m.admin + "/mapping", {"jobs": {"7": ["fwd0"]}}),
    ):
        assert http_status("PUT", url, body, token=None) == 401
        assert http_status("PUT", url, body, token=secrets.token_hex(32)) == 401
        assert http_status("PUT", url, body, token=ADMIN_TOKEN[:-1]) == 401
    # Nothing changed.
    assert http("GET", d.admin + "/placement")["pools"] == {}
    assert http("GET", d.admin + "/targets")[0]["slowdown"] == 1
    assert http("GET", m.admin + "/mapping")["jobs"] == {}
    # GETs but /status need it too (the job table names jobs); /status is open.
    for url in (d.admin + "/placement", d.admin + "/targets", m.admin + "/mapping"):
        assert http_status("GET", url, token=None) == 401
    assert http("GET", d.admin + "/status", token=None)["counters"]["auth_failures"] == 0
    assert "nodes" in http("GET", m.admin + "/status", token=None)
    # With the token: applied.
    assert http("PUT", d.admin + "/placement", placement)["default_pool"] == "p"
    assert http("PUT", d.admin + "/targets/ost0", {"slowdown": 2})["slowdown"] == 2
    assert http("PUT", m.admin + "/mapping", {"jobs": {"7": ["fwd0"]}})["jobs"] == {"7": ["fwd0"]}
    # A daemon without an admin token configured serves /status only.
    d1 = cluster.start_daemon("fwd1", admin_token=False)
    assert http_status("PUT", d1.admin + "/targets/ost0", {"slowdown": 3}) == 403
    assert http_status("GET", d1.admin + "/placement") == 403
    assert http("GET", d1.admin + "/status", token=None)["node"] == "fwd1"


def as_nobody(cwd, script: str) -> subprocess.CompletedProcess:
    """Runs the shell ``script`` as uid/gid 65534 with no supplementary groups, in ``cwd`` (entered
    as root first, so pytest's private tmp dirs above it need no search permission)."""

    def drop():
        os.chdir(cwd)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return subprocess.run(
        ["/bin/sh", "-c", script], preexec_fn=drop, capture_output=True, text=True, timeout=30, env={"LC_ALL": "C"}
    )


def test_non_root_user_cannot_read_a_root_only_file_through_the_mount(setup):
    cluster, _, m, oid, _, before = setup
    (m.path / "open").write_bytes(b"anyone may read")
    os.chmod(m.path / "open", 0o644)
    r = as_nobody(m.path, "id -u; cat open")
    assert (r.returncode, r.stdout.split()) == (0, ["65534", "anyone", "may", "read"]), r.stderr
    r = as_nobody(m.path, "cat secret")
    assert r.returncode != 0 and "Permission denied" in r.stderr and r.stdout == "", (r.stdout, r.stderr)
    r = as_nobody(m.path, "printf x >> secret")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    # Nor can the user get at the site key to talk to the daemon itself.
    r = as_nobody(cluster.root, "cat fwd.key")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    assert objects(cluster, oid) == before
    assert (m.path / "secret").read_bytes() == SECRET  # root still reads it
