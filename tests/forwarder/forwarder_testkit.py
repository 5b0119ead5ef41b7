"""Starts real pharos-fwd daemons and pharos-mount FUSE clients for the forwarder tests.

Everything binds to loopback on free ports, lives under a tmp dir and is stopped with
SIGTERM (then SIGKILL and a lazy unmount as a fallback) when the cluster closes. Each cluster
has its own site key (``fwd.key``) and the session's admin token (``admin.token``, sent by
:func:`http` unless told otherwise), both root-only files in its tmp dir.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pharos_testkit import in_job

REPO = Path(__file__).resolve().parents[2]
# PHAROS_FWD_BIN_DIR: run against other builds (e.g. to show a test fails on an older one).
BIN = Path(os.environ.get("PHAROS_FWD_BIN_DIR", REPO / "target" / "release"))


# The daemon built with the test-only fault hooks (cargo feature ``test-hooks``): the tests that
# inject faults run it; the release ``pharos-fwd`` has none (forwarder/README.md).
HOOKS_FWD = "pharos-fwd-hooks"


def build_binaries() -> None:
    """The release daemon and mount, and the daemon with the test hooks (same target dir: only
    the pharos-fwd crate is built a second time, with the feature)."""
    for args in (
        ["-p", "pharos-fwd", "-p", "pharos-mount"],
        ["-p", "pharos-fwd", "--features", "test-hooks", "--bin", HOOKS_FWD],
    ):
        subprocess.run(["cargo", "build", "--release", *args], cwd=REPO, check=True, timeout=1800)


def wait_file(path: Path, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before ready")
        time.sleep(0.05)
    raise TimeoutError(f"{path} not written within {timeout}s")


def wait_ready(path: Path, proc: subprocess.Popen, timeout: float = 20) -> dict:
    """The ready file's JSON (bound ``listen``/``admin`` addresses, ``pid``) once complete.

    The daemon and the mount are started on port 0 and say which ports they bound here,
    so no port is picked by the test and then lost to another process before the bind."""
    deadline = time.monotonic() + timeout
    wait_file(path, proc, timeout)
    while True:
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


# The admin token of every cluster of this test session (the daemons' and mounts'
# --admin-token-file); http() sends it unless given token=None.
ADMIN_TOKEN = secrets.token_hex(32)


def write_secret(path: Path, value: str) -> Path:
    """A root-only secret file (mode 0600 from its creation), as pharos-fwd wants its key files."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return path


def http(method: str, url: str, body: dict | None = None, token: str | None = ADMIN_TOKEN) -> dict:
    """One admin HTTP call (JSON); raises urllib.error.HTTPError on 4xx/5xx."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def http_status(method: str, url: str, body: dict | None = None, token: str | None = ADMIN_TOKEN) -> int:
    """The HTTP status of an admin call (no exception for 4xx)."""
    try:
        http(method, url, body, token)
    except urllib.error.HTTPError as e:
        return e.code
    return 200


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen
    port: int
    admin_port: int
    log: Path

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def status(self) -> dict:
        return http("GET", self.admin + "/status")


@dataclass
class Mount:
    path: Path
    proc: subprocess.Popen
    admin_port: int
    log: Path

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def status(self) -> dict:
        return http("GET", self.admin + "/status")

    def settle(self, limit: float = 30.0) -> None:
        """Waits until the creates and releases this mount answered itself (write-back) have
        all been answered by the daemons (``pending_creates`` and ``writeback_queued`` 0), so a
        daemon's request counters afterwards count only what comes next. Fails after ``limit`` s."""
        end = time.monotonic() + limit
        while True:
            st = self.status()
            if st["pending_creates"] == 0 and st["writeback_queued"] == 0:
                return
            assert time.monotonic() < end, f"write-back not drained in {limit} s: {st}"
            time.sleep(0.01)


@dataclass
class Cluster:
    root: Path
    n_targets: int = 8
    # The daemon binary in BIN: "pharos-fwd" (release), or HOOKS_FWD for the fault-injection tests.
    fwd_bin: str = "pharos-fwd"
    daemons: list[Daemon] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)

    @property
    def backend(self) -> Path:
        return self.root / "backend"

    @property
    def key_file(self) -> Path:
        """The cluster's site key (created on first use, 0600)."""
        f = self.root / "fwd.key"
        if not f.exists():
            write_secret(f, secrets.token_hex(32))
        return f

    @property
    def key(self) -> bytes:
        """The site key as the daemons use it (the file's text without surrounding whitespace)."""
        return self.key_file.read_bytes().strip()

    @property
    def token_file(self) -> Path:
        f = self.root / "admin.token"
        if not f.exists():
            write_secret(f, ADMIN_TOKEN)
        return f

    def auth_args(self, key_file: Path | None = None, admin_token: bool = True) -> list[str]:
        """``--key-file`` (the cluster's site key unless ``key_file``) and ``--admin-token-file``
        (unless ``admin_token`` is false: then the admin interface serves GET /status only)."""
        token = ["--admin-token-file", str(self.token_file)] if admin_token else []
        return ["--key-file", str(key_file or self.key_file), *token]

    @property
    def ns(self) -> Path:
        return self.backend / "mdt" / "ns"

    def start_daemon(self, name: str, *extra: str, kafka: str | None = None, admin_token: bool = True) -> Daemon:
        ready = self.root / f"{name}.ready"
        log = self.root / f"{name}.log"
        args = [
            str(BIN / self.fwd_bin),
            "--node-name",
            name,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--mdt",
            str(self.backend / "mdt"),
            "--targets-root",
            str(self.backend),
            "--target-count",
            str(self.n_targets),
            "--ready-file",
            str(ready),
            *(["--brokers", kafka] if kafka else ["--no-kafka"]),
            *self.auth_args(admin_token=admin_token),
            *extra,
        ]
        proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
        bound = wait_ready(ready, proc)
        d = Daemon(name, proc, port_of(bound["listen"]), port_of(bound["admin"]), log)
        self.daemons.append(d)
        return d

    def start_mount(
        self, daemons: list[Daemon], node_index: int = 0, *extra: str, key_file: Path | None = None
    ) -> Mount:
        mp = self.root / f"mnt{len(self.mounts)}"
        mp.mkdir()
        ready = self.root / f"{mp.name}.ready"
        log = self.root / f"{mp.name}.log"
        args = [
            str(BIN / "pharos-mount"),
            "--mountpoint",
            str(mp),
            "--node-index",
            str(node_index),
            "--compute-node",
            f"cn{node_index}",
            "--admin",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
            *[a for d in daemons for a in ("--fwd", f"{d.name}={d.addr}")],
            *self.auth_args(key_file),
            *extra,
        ]
        proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
        bound = wait_ready(ready, proc)
        m = Mount(mp, proc, port_of(bound["admin"]), log)
        self.mounts.append(m)
        return m

    @staticmethod
    def _stop(proc: subprocess.Popen, timeout: float = 15) -> int | None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return proc.returncode

    def close(self) -> None:
        for m in self.mounts:
            self._stop(m.proc)
            if os.path.ismount(m.path):
                subprocess.run(["umount", "-l", str(m.path)], check=False)
        for d in self.daemons:
            self._stop(d.proc)


def open_counts(backend: Path, n_targets: int) -> list[int]:
    """open_count of each target ost0..ost{n-1}: the first field (i64) of its shared state
    file `.pharos-target` (forwarder/fwd/src/shm.rs)."""
    return [struct.unpack("<q", (backend / f"ost{i}" / ".pharos-target").read_bytes()[:8])[0] for i in range(n_targets)]


def wait_for(pred, timeout: float = 10.0) -> bool:
    """Polls `pred` until it holds (True) or `timeout` seconds pass (its last value)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def fio(*args: str, timeout: float = 300, env: dict | None = None, job: str | None = None) -> dict:
    """Runs fio with JSON output, as job ``job`` (in its cgroup, :func:`in_job`) when given;
    raises with fio's output when it fails."""
    cmd = ["fio", "--output-format=json", *args]
    with in_job(job) as preexec:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, preexec_fn=preexec)
    if r.returncode != 0:
        raise AssertionError(f"fio failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    out = r.stdout[r.stdout.index("{") :]
    return json.loads(out)


def n1_interleaved_args(ranks: int, block: int, per_rank: int) -> list[str]:
    """fio arguments of an N-1 job whose ``ranks`` jobs write interleaved ``block``-byte blocks
    of one shared file ``shared`` (job j writes blocks j, j + ranks, ...), ``per_rank`` bytes
    each, psync, then read every block back and check its crc32c (GAS, parallel writes)."""
    return [
        "--filename=shared",
        "--ioengine=psync",
        f"--bs={block >> 10}k",
        f"--numjobs={ranks}",
        f"--offset_increment={block >> 10}k",
        f"--rw=write:{(ranks - 1) * block >> 10}k",
        f"--size={ranks * per_rank >> 20}M",
        f"--io_size={per_rank >> 20}M",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--group_reporting",
    ]


def wait_records_sent(d: Daemon, timeout: float = 60) -> int:
    """Waits until the daemon's broker acknowledged every record it produced; their number."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = d.status()["records"]
        if r["records_sent"] >= r["produced"] > 0:
            break
        time.sleep(0.2)
    return d.status()["records"]["produced"]


def consume(bootstrap: str, topic: str, decode, until, timeout: float = 60) -> list:
    """(key, decode(value)) of the messages of ``topic`` from the start, until ``until(got)``
    holds or ``timeout`` seconds pass (the real broker; a group of its own per topic)."""
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fwd-test-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not until(out):
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append((msg.key(), decode(msg.value())))
    finally:
        c.close()
    return out


_UNITS = {"k": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def fio_verify(directory: Path, rw: str, bs: str, jobs: int, size: str, timeout: float = 200) -> dict:
    """fio writes ``jobs`` x ``size`` (e.g. "64M") in ``bs`` blocks with mode ``rw`` into
    ``directory``, then reads every written block back and checks its crc32c; returns fio's job
    summary (group_reporting). Fails unless fio reports no error and the reads cover every
    verified byte: for write modes the verify pass reads back exactly what was written; for mixed
    modes (rw, randrw) the workload's own reads plus the verify pass add up to jobs x size."""
    out = fio(
        "--name=v",
        f"--directory={directory}",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--numjobs={jobs}",
        f"--size={size}",
        "--ioengine=psync",
        "--verify=crc32c",
        "--verify_state_save=0",
        "--do_verify=1",
        "--verify_fatal=1",
        "--group_reporting",
        timeout=timeout,
    )
    job = out["jobs"][0]
    block, per_job = (int(x[:-1]) * _UNITS[x[-1]] for x in (bs, size))
    total = jobs * (per_job // block) * block  # fio does whole blocks only
    assert job["error"] == 0, job
    written, read = job["write"]["io_bytes"], job["read"]["io_bytes"]
    assert 0 < written <= total, (written, total)
    # every written byte was read back once by the verify pass (mixed modes also read the rest)
    assert read == total, f"{rw}: {read} bytes read for {written} written, expected {total}"
    return job


# --- raw protocol frames (v7: bincode 1 header, fixint, little endian, then a raw data
# segment; see forwarder/fwd-proto) ---

VERSION = 8


def _s(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def request(
    req_id: int, op_variant: int, fields: bytes = b"", job: str = "", uid: int = 0, gid: int = 0, replay: bool = False
) -> bytes:
    """A `Request` header: id, Ctx (job, rank, pid, uid, gid, compute node, no supplementary
    groups), then `Op` variant index and its fields, then the replay flag (v6, one byte)."""
    ctx = _s(job) + struct.pack("<iIII", -1, 0, uid, gid) + _s("test") + struct.pack("<Q", 0)
    return struct.pack("<Q", req_id) + ctx + struct.pack("<I", op_variant) + fields + bytes([replay])


def frame(header: bytes, data: bytes = b"", version: int = VERSION, header_len: int | None = None) -> bytes:
    """[u32 L][u8 version][u32 header length][header][data]."""
    hl = len(header) if header_len is None else header_len
    return struct.pack("<I", 1 + 4 + len(header) + len(data)) + bytes([version]) + struct.pack("<I", hl) + header + data


OP_PING, OP_LOOKUP, OP_GETATTR, OP_SETATTR = 0, 1, 2, 3
OP_MKDIR = 5
OP_CREATE, OP_OPEN, OP_RELEASE, OP_READ, OP_WRITE, OP_FSYNC = 9, 10, 11, 12, 13, 14
OP_KILL_SUIDGID, OP_AUTH = 20, 21
BODY_OPENED, BODY_CHALLENGE, BODY_AUTHED = 3, 8, 9
# v7: a create's answer also carries its directory's attributes (`Body::Created { attr, cap, parent }`).
BODY_CREATED = 12
CAP_READ, CAP_WRITE = 1, 2
ATTR_LEN = 88  # bytes of an encoded `Attr`


def layout(oid: int, stripe_size: int, targets: list[int], component_size: int = 0, perf: list[float] = ()) -> bytes:
    """A `Layout`: oid, stripe_size, targets, component_size (0 = classic), perf (MB/s)."""
    return (
        struct.pack("<QQQ", oid, stripe_size, len(targets))
        + b"".join(struct.pack("<I", t) for t in targets)
        + struct.pack("<QQ", component_size, len(perf))
        + b"".join(struct.pack("<d", p) for p in perf)
    )


def cap(layout_bytes: bytes, handle: bytes, rights: int, mac: bytes) -> bytes:
    """A `Cap`: layout, open handle (16 bytes), rights (u8), MAC (32 bytes)."""
    assert len(handle) == 16 and len(mac) == 32
    return layout_bytes + handle + bytes([rights]) + mac


def parse_cap(b: bytes) -> tuple[dict, bytes]:
    """Decodes a `Cap` at the start of `b`: ({layout, layout_bytes, handle, rights, mac, raw}, rest)."""
    lo, rest = parse_layout(b)
    layout_bytes = b[: len(b) - len(rest)]
    handle, rights, mac, rest2 = rest[:16], rest[16], rest[17:49], rest[49:]
    return {
        "layout": lo,
        "layout_bytes": layout_bytes,
        "handle": handle,
        "rights": rights,
        "mac": mac,
        "raw": b[: len(b) - len(rest2)],
    }, rest2


def _hmac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def conn_key(site_key: bytes) -> bytes:
    """The handshake key derived from the site key (forwarder/fwd-proto/src/auth.rs)."""
    return _hmac(site_key, b"pharos-fwd v5 connection")


def handshake(sock: socket.socket, site_key: bytes, req_id: int = 1) -> None:
    """The client's half of the handshake: reads the daemon's challenge, answers with the proof
    of ``site_key``, checks the daemon's proof. Raises AssertionError when refused."""
    rid, e, rest, _ = read_reply(sock)
    assert (rid, e) == (0, None), (rid, e)
    (variant,) = struct.unpack("<I", rest[:4])
    assert variant == BODY_CHALLENGE, variant
    theirs, ours = rest[4:36], secrets.token_bytes(32)
    k = conn_key(site_key)
    sock.sendall(frame(request(req_id, OP_AUTH, ours + _hmac(k, b"client", theirs, ours))))
    rid, e, rest, _ = read_reply(sock)
    assert (rid, e) == (req_id, None), (rid, e)
    assert struct.unpack("<I", rest[:4])[0] == BODY_AUTHED
    assert rest[4:36] == _hmac(k, b"server", theirs, ours), "the daemon does not hold the site key"


def connect(port: int, site_key: bytes | None = None) -> socket.socket:
    """A raw connection to a daemon's data port, authenticated with ``site_key`` when given (the
    daemon's challenge is then consumed)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if site_key is not None:
        handshake(s, site_key)
    return s


def parse_layout(b: bytes) -> tuple[tuple[int, int, list[int], int, list[float]], bytes]:
    """Decodes a `Layout` at the start of `b`: ((oid, stripe_size, targets, component_size, perf), rest)."""
    oid, ss, n = struct.unpack("<QQQ", b[:24])
    targets = list(struct.unpack(f"<{n}I", b[24 : 24 + 4 * n]))
    b = b[24 + 4 * n :]
    cs, m = struct.unpack("<QQ", b[:16])
    perf = list(struct.unpack(f"<{m}d", b[16 : 16 + 8 * m]))
    return (oid, ss, targets, cs, perf), b[16 + 8 * m :]


def read_reply(sock: socket.socket) -> tuple[int, int | None, bytes, bytes]:
    """Reads one reply frame: (id, errno or None when Ok, rest of the header, data segment)."""

    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return buf

    (n,) = struct.unpack("<I", exact(4))
    body = exact(n)
    assert body[0] == VERSION
    (hl,) = struct.unpack("<I", body[1:5])
    hdr, data = body[5 : 5 + hl], body[5 + hl :]
    rid, variant = struct.unpack("<QI", hdr[:12])
    if variant == 1:
        (err,) = struct.unpack("<i", hdr[12:16])
        return rid, err, hdr[16:], data
    return rid, None, hdr[12:], data
