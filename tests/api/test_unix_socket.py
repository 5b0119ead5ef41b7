"""The safe default on a multi-user node (issue 26, item 11; pharos_api.unix_socket,
pharos_api.auth, docs/security.md): the API on a Unix socket whose peer credentials
(SO_PEERCRED) say who the caller is, tokens on TCP.

Real servers and real connections: uvicorn serving the app on a loopback TCP port and a Unix
socket (:func:`pharos_api.unix_socket.api_server`, the code `pharos serve` runs), clients over
httpx's ``HTTPTransport(uds=...)``; an unprivileged caller is a child process that drops to uid
65534 (``os.setresuid``) before connecting; `pharos token create` runs as its own process
while `pharos serve` runs (the stack's serve component).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from pharos_synthetic_jobs import event
from pharos_testkit import free_port
from pydantic import SecretStr

from pharos_api import stack
from pharos_api.app import create_app
from pharos_api.auth import Peer, create_token, login_name, peer_principal
from pharos_api.unix_socket import UnixSocketError, api_server, bind_unix_socket, peer_of, traversal_problem
from pharos_core import api_client
from pharos_core.settings import Settings

NOBODY = 65534


def uds(path: Path) -> httpx.Client:
    """An httpx client on the Unix socket ``path`` (a new connection: SO_PEERCRED is this process)."""
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://localhost", timeout=30)


@pytest.fixture(scope="module")
def sock_dir():
    """A directory every user may search (mode 0755), for a socket others must reach (pytest's
    tmp dirs are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="pharos-sock-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def live(store, sock_dir, tmp_path_factory):
    """The API with the DEFAULT authentication settings on a real store (alice owns mix, bob n1,
    nobody's login owns job "nob"), served on a loopback TCP port and a Unix socket."""
    store.insert_rows("job_events", [event("nob", "start", 60, name="mine", user=login_name(NOBODY), ranks=1)])
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("sock-state"), api_port=free_port(), api_socket=str(sock_dir / "api.sock")
    )
    assert settings.api_auth == "token"  # the default (unless the environment says otherwise)
    listeners = api_server(create_app(store, settings), settings)
    th = threading.Thread(target=listeners.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not listeners.server.started:
        assert time.monotonic() < deadline and th.is_alive(), "uvicorn did not start within 10 s"
        time.sleep(0.02)
    yield SimpleNamespace(tcp=settings.api_url, sock=settings.api_socket_path, store=store)
    listeners.server.should_exit = True
    th.join(10)
    assert not settings.api_socket_path.exists()  # the server removed its socket file


def test_the_default_is_tokens_on_tcp(live, monkeypatch, tmp_path):
    monkeypatch.delenv("PHAROS_API_AUTH", raising=False)
    monkeypatch.delenv("PHAROS_API_SOCKET", raising=False)
    s = Settings(state_dir=tmp_path)
    assert s.api_auth == "token" and s.api_socket_path == tmp_path / "api.sock"
    assert Settings(state_dir=tmp_path, api_socket="").api_socket_path is None
    assert httpx.get(f"{live.tcp}/v1/health", timeout=30).status_code == 200  # the one open route
    for path in ("/v1/jobs", "/v1/tokens", "/metrics"):
        r = httpx.get(live.tcp + path, timeout=30)
        assert r.status_code == 401 and "Unix socket" in r.json()["detail"], (path, r.text)


def test_the_socket_file_is_0666_and_its_directory_searchable(live):
    st = live.sock.lstat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    assert traversal_problem(live.sock) is None


def test_root_on_the_socket_is_admin_without_a_token(live):
    """This test's process (root, or the server's own uid) on the socket: admin, no token; the
    token it mints works over TCP; a token sent on the socket wins (a smaller role stays small)."""
    with uds(live.sock) as c:
        assert c.get("/v1/tokens").status_code == 200
        r = c.post("/v1/tokens", json={"role": "operator", "user": "ops", "description": "minted on the socket"})
        assert r.status_code == 201, r.text
        token = r.json()["token"]
        assert c.get("/v1/control/pins").status_code == 200
        sched = create_token(live.store, "scheduler", "slurm")["token"]
        assert c.get("/v1/jobs", headers={"Authorization": f"Bearer {sched}"}).status_code == 403
        assert c.get("/v1/jobs", headers={"Authorization": "Bearer pht_000000000000_" + "x" * 43}).status_code == 401
    r = httpx.get(f"{live.tcp}/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200 and {"mix", "n1", "nob"} <= {j["job_id"] for j in r.json()["items"]}


# A child that imports everything first (the interpreter's files may be in a root-only home), then
# drops to uid/gid 65534 and asks the API over the socket and over TCP; prints {name: status or body}.
CHILD = r"""
import json, os, sys
import httpx
sock, tcp = sys.argv[1], sys.argv[2]
with httpx.Client(timeout=30) as warm:  # load httpx's lazy imports (a TCP connection, closed)
    warm.get(tcp + "/v1/health").json()
with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://localhost", timeout=30) as warm:
    warm.get("/v1/health")
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
out = {"uid": os.getuid()}
with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://localhost", timeout=30) as c:
    out["jobs"] = sorted(j["job_id"] for j in c.get("/v1/jobs").json()["items"])
    for name, method, path in [
        ("own", "GET", "/v1/jobs/nob"), ("other", "GET", "/v1/jobs/mix"), ("orphan", "GET", "/v1/jobs/orphan"),
        ("tokens", "GET", "/v1/tokens"), ("mint", "POST", "/v1/tokens"), ("pins", "GET", "/v1/control/pins"),
        ("metrics", "GET", "/metrics"),
    ]:
        kw = {"json": {"role": "admin", "user": "root"}} if method == "POST" else {}
        out[name] = c.request(method, path, **kw).status_code
    # what a client sends cannot change who it is
    out["spoofed"] = c.get("/v1/tokens", headers={"X-Forwarded-User": "root", "X-Remote-User": "root"}).status_code
out["tcp"] = httpx.get(tcp + "/v1/jobs", timeout=30).status_code
print(json.dumps(out))
"""


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to uid 65534 needs root")
def test_an_unprivileged_peer_is_a_user_seeing_its_own_jobs(live):
    assert traversal_problem(live.sock) is None, "the socket's directory must be searchable by uid 65534"
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(live.sock), live.tcp], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["uid"] == NOBODY
    assert out["jobs"] == ["nob"]  # its own job only
    assert (out["own"], out["other"], out["orphan"]) == (200, 404, 404)
    assert (out["tokens"], out["mint"], out["pins"], out["metrics"], out["spoofed"]) == (403, 403, 403, 403, 403)
    assert out["tcp"] == 401


def test_peer_credentials_come_from_the_kernel():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_of(a) == Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    with socket.socket() as tcp:  # not a Unix socket: no peer
        assert peer_of(tcp) is None
    assert peer_principal(Peer(1, 0, 0)).role == "admin" and peer_principal(Peer(1, 0, 0)).user == "root"
    p = peer_principal(Peer(1, NOBODY, NOBODY))
    assert (p.role, p.user, p.uid, p.token_id) == ("user", login_name(NOBODY), NOBODY, None)
    assert not p.sees_all
    assert login_name(2**31 - 7) == str(2**31 - 7)  # no passwd entry: the uid as text


def test_binding_the_socket(sock_dir):
    path = sock_dir / "bind.sock"
    first = bind_unix_socket(path)
    first.listen(1)
    with pytest.raises(UnixSocketError, match="served by another process"):
        bind_unix_socket(path)
    first.close()  # its file stays: a stopped server's leftover, replaced
    bind_unix_socket(path).close()
    path.unlink()
    path.write_text("not a socket")
    with pytest.raises(UnixSocketError, match="not a socket"):
        bind_unix_socket(path)
    path.unlink()
    with pytest.raises(UnixSocketError, match=r"api_socket .* longer than"):
        bind_unix_socket(sock_dir / ("x" * 120))


def test_clients_choose_the_socket_without_a_token(sock_dir, tmp_path):
    sock = sock_dir / "choose.sock"
    s = Settings(state_dir=tmp_path, api_socket=str(sock), api_token="")
    assert api_client.client_url(s) == s.api_url  # no socket there: TCP
    srv = bind_unix_socket(sock)
    try:
        assert api_client.client_url(s) == "unix:" + str(sock)
        assert (
            api_client.client_url(s.model_copy(update={"api_token": SecretStr("pht_x")})) == s.api_url
        )  # a token: TCP
        assert api_client.client_url(s.model_copy(update={"api_socket": ""})) == s.api_url
    finally:
        srv.close()
        sock.unlink()


@pytest.fixture
def serve_stack(tmp_path):
    """`pharos serve` (the stack's serve component, its own process) on DEFAULT authentication,
    with Kafka at a closed port (the API does not need it); stopped after the test."""
    settings = Settings(
        state_dir=tmp_path / "state",
        api_port=free_port(),
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
        agent_metrics_addr="",
    )
    said: list[str] = []
    try:
        stack.start(settings, only={"serve"})
        yield settings
    finally:
        stack.stop_component(settings, "serve", grace_s=30, progress=said.append)
    assert not any("SIGKILL" in line for line in said), said  # it stopped on SIGTERM
    assert not settings.api_socket_path.exists()  # and removed its socket file


def _cli(settings: Settings, *args: str, token: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHAROS_")}
    env |= {k: v for k, v in stack.settings_env(settings).items() if k != "PHAROS_API_TOKEN"}
    if token:
        env["PHAROS_API_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "pharos_api.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_token_create_while_the_stack_runs(serve_stack):
    """Root on the API host mints the first admin token with the stack up (the store is held by
    `pharos serve`: it goes through the socket), and it works over TCP; the CLI's other commands
    work without a token through the socket."""
    s = serve_stack
    assert api_client.is_socket(s.api_socket_path)
    assert httpx.get(f"{s.api_url}/v1/jobs", timeout=30).status_code == 401
    r = _cli(s, "token", "create", "--role", "admin", "--user", "root", "--json")
    assert r.returncode == 0, r.stderr
    token = json.loads(r.stdout)["token"]
    assert (
        httpx.get(f"{s.api_url}/v1/tokens", headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code == 200
    )
    listed = _cli(s, "token", "list", "--json")
    assert listed.returncode == 0 and [t["role"] for t in json.loads(listed.stdout)["items"]] == ["admin"]
    assert _cli(s, "jobs", "--json").returncode == 0  # the socket: no token
    assert _cli(s, "jobs", "--json", token=token).returncode == 0  # a token: TCP
    bad = _cli(s, "jobs", "--api", s.api_url)  # TCP without a token: one clear line
    assert bad.returncode == 1 and "401" in bad.stderr and "Unix socket" in bad.stderr
