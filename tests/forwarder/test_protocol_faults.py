"""Hostile input to the daemon: each bad frame gets an error reply and the daemon keeps
serving (a fresh connection's ping is answered afterwards)."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from forwarder_testkit import OP_LOOKUP, OP_MKDIR, OP_PING, _s, frame, read_reply, request

MAX_FRAME = (8 << 20) + (64 << 10)


@pytest.fixture
def daemon(cluster):
    return cluster.start_daemon("fwd0")


def connect(d) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    return s


def ping_ok(d) -> None:
    with connect(d) as s:
        s.sendall(frame(request(99, OP_PING)))
        rid, e, _ = read_reply(s)
        assert (rid, e) == (99, None)


def test_valid_ping_and_lookup(daemon):
    with connect(daemon) as s:
        s.sendall(frame(request(5, OP_PING)))
        assert read_reply(s)[:2] == (5, None)
        s.sendall(frame(request(6, OP_LOOKUP, _s("missing"))))
        assert read_reply(s)[:2] == (6, errno.ENOENT)


def test_malformed_payload_gets_error_and_connection_goes_on(daemon):
    with connect(daemon) as s:
        s.sendall(frame(b"\xff" * 37))  # undecodable body
        rid, e, _ = read_reply(s)
        assert rid == 0 and e == errno.EPROTO
        s.sendall(frame(request(7, OP_PING), version=9))  # unknown version
        assert read_reply(s)[:2] == (0, errno.EPROTO)
        s.sendall(frame(request(8, OP_PING)))  # same connection still served
        assert read_reply(s)[:2] == (8, None)
    assert daemon.status()["counters"]["bad_frames"] == 2


def test_truncated_frame_gets_error(daemon):
    with connect(daemon) as s:
        f = frame(request(9, OP_LOOKUP, _s("abc")))
        s.sendall(f[:-2])
        s.shutdown(socket.SHUT_WR)
        rid, e, _ = read_reply(s)
        assert rid == 0 and e == errno.EPROTO
    ping_ok(daemon)


def test_oversized_frame_gets_error_without_reading_it(daemon):
    with connect(daemon) as s:
        s.sendall(struct.pack("<I", MAX_FRAME + 1) + b"\x01")
        rid, e, _ = read_reply(s)
        assert rid == 0 and e == errno.EMSGSIZE
    ping_ok(daemon)
    assert daemon.proc.poll() is None


@pytest.mark.parametrize("path", ["..", "../etc", "a/../../x", "/../../etc/passwd", "a//b"])
def test_path_escaping_namespace_rejected(daemon, cluster, path):
    with connect(daemon) as s:
        s.sendall(frame(request(11, OP_LOOKUP, _s(path))))
        assert read_reply(s)[:2] == (11, errno.EINVAL)
        s.sendall(frame(request(12, OP_MKDIR, _s(path + "/evil") + struct.pack("<I", 0o755))))
        assert read_reply(s)[:2] == (12, errno.EINVAL)
    assert not (cluster.backend / "evil").exists()
    assert not (cluster.root / "evil").exists()
    ping_ok(daemon)
