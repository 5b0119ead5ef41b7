"""Hostile input to the daemon on an authenticated connection: each bad frame gets an error
reply and the daemon keeps serving (a fresh connection's ping is answered afterwards). What
an unauthenticated client gets is in test_auth.py."""

from __future__ import annotations

import errno
import os
import socket
import struct

import pytest
from forwarder_testkit import (
    BODY_CREATED,
    CAP_READ,
    CAP_WRITE,
    OP_CREATE,
    OP_LOOKUP,
    OP_MKDIR,
    OP_PING,
    OP_READ,
    OP_RELEASE,
    OP_WRITE,
    VERSION,
    _s,
    frame,
    parse_cap,
    read_reply,
    request,
)
from forwarder_testkit import connect as raw_connect

MAX_FRAME = (8 << 20) + (64 << 10)


@pytest.fixture
def daemon(cluster):
    d = cluster.start_daemon("fwd0")
    d.key = cluster.key
    return d


def connect(d) -> socket.socket:
    """A connection past the handshake (the site key's proof)."""
    return raw_connect(d.port, d.key)


def ping_ok(d) -> None:
    with connect(d) as s:
        s.sendall(frame(request(99, OP_PING)))
        rid, e, *_ = read_reply(s)
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
        rid, e, *_ = read_reply(s)
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
        rid, e, *_ = read_reply(s)
        assert rid == 0 and e == errno.EPROTO
    ping_ok(daemon)


def test_oversized_frame_gets_error_without_reading_it(daemon):
    with connect(daemon) as s:
        s.sendall(struct.pack("<I", MAX_FRAME + 1) + b"\x01")
        rid, e, *_ = read_reply(s)
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


def test_v2_frame_faults_get_eproto_and_connection_goes_on(daemon):
    with connect(daemon) as s:
        s.sendall(frame(request(20, OP_PING), data=b"stray"))  # data on a request without data
        assert read_reply(s)[:2] == (0, errno.EPROTO)
        s.sendall(frame(request(21, OP_PING), header_len=10_000))  # header length beyond the frame
        assert read_reply(s)[:2] == (0, errno.EPROTO)
        hdr = request(22, OP_PING)
        s.sendall(struct.pack("<I", len(hdr) + 1) + b"\x01" + hdr)  # a version-1 frame
        assert read_reply(s)[:2] == (0, errno.EPROTO)
        s.sendall(struct.pack("<I", 3) + bytes([VERSION, 0, 0]))  # too short for a header length
        assert read_reply(s)[:2] == (0, errno.EPROTO)
        s.sendall(frame(request(23, OP_PING)))
        assert read_reply(s)[:2] == (23, None)
    assert daemon.status()["counters"]["bad_frames"] == 4


def test_raw_data_segment_write_then_read(daemon, cluster):
    data = bytes(range(256)) * 1024 + b"tail"  # 256 KiB + 4: a large request, unaligned end
    with connect(daemon) as s:
        excl = os.O_CREAT | os.O_EXCL | os.O_RDWR  # Create { path, mode, flags, token }
        s.sendall(frame(request(30, OP_CREATE, _s("raw") + struct.pack("<IiQ", 0o644, excl, 77))))
        rid, e, rest, seg = read_reply(s)
        assert (rid, e, seg) == (30, None, b"")
        (variant,) = struct.unpack("<I", rest[:4])
        assert variant == BODY_CREATED  # Body::Created { attr, cap, parent }
        c, tail = parse_cap(rest[4 + 88 :])  # after the Attr
        assert len(tail) == 88  # the directory's Attr
        assert c["layout"][3:] == (0, [])  # round-robin: a classic layout
        assert c["rights"] == CAP_READ | CAP_WRITE  # O_RDWR
        lo = c["raw"]  # the daemon's capability, sent back as it came
        s.sendall(frame(request(31, OP_WRITE, _s("raw") + lo + struct.pack("<Q", 4096)), data=data))
        rid, e, rest, seg = read_reply(s)
        assert (rid, e, seg) == (31, None, b"")
        assert struct.unpack("<II", rest) == (5, len(data))  # Body::Written(n)
        s.sendall(frame(request(32, OP_READ, _s("raw") + lo + struct.pack("<QI", 4096, 1 << 20))))
        rid, e, rest, seg = read_reply(s)
        assert (rid, e) == (32, None)
        assert rest == struct.pack("<I", 4)  # Body::Data: no header fields, bytes in the segment
        assert seg == data
        s.sendall(frame(request(33, OP_RELEASE, _s("raw") + lo)))
        assert read_reply(s)[:2] == (33, None)
    obj = [p for p in cluster.backend.glob("ost*/*.0") if p.stat().st_size == 4096 + len(data)]
    assert len(obj) == 1 and obj[0].read_bytes()[4096:] == data
