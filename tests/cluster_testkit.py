"""A cluster in one box (issue 25): Pharos on emulated nodes, each in its own network namespace.

:func:`running_rig` builds, on this host, what a site has across machines, and removes it all at
the end:

* **the network**: a switch namespace ``<prefix>-sw`` holding a Linux bridge, and one namespace
  per node with one veth link (``eth0``) to that bridge and one address in a private /24 chosen
  for the rig (``10.<a>.<b>.0/24``). Addresses exist only inside the rig's namespaces: the
  host's own namespace gets no interface, address or route. Links can be cut (``ip link set
  down``), capped (``tc tbf``) or made lossy (iptables ``-m statistic``) per node.
* **the nodes**: ``kafka1..kafkaB`` (one KRaft broker+controller each: ``pharos broker
  --node-id``), ``server`` (``pharos serve``: pipeline, analytics, control loop and the API, on
  its address with token auth, as a site's server), ``fwd0..fwdF-1`` (``pharos fwd``, on its
  address; the storage targets are ONE shared folder every forwarding node reaches, as a
  parallel file system's OSTs are) and ``cn0..cnN-1`` (one eBPF agent tracing only the node's
  cgroup subtree ``<rig cgroup>/cn<i>`` and naming its records ``cn<i>``, and one FUSE mount
  connecting to the forwarding nodes over the emulated network).
* **per-node mounts**: each compute node also has its own mount namespace (a file under the
  rig's folder), so its FUSE mount sits at the SAME path on every compute node
  (:attr:`Rig.mount_dir`), as ``/pharos`` does on a real cluster; a process entered into node
  ``cn<i>`` (:meth:`Rig.popen`) sees cn<i>'s mount there.
* **remote launch**: :attr:`Rig.rsh` is a script MPICH's Hydra uses as its ssh (``mpiexec -hosts
  cn0,cn1 -launcher ssh -launcher-exec RSH -iface eth0``): it starts the proxy in the named
  node's namespaces and, when it runs for a job (``PHAROS_JOB_ID`` set, as ``pharos run`` sets
  it), in that job's cgroup on that node, which is what a site's ssh with ``pam_slurm_adopt``
  does. The node's agent then attributes the ranks to the job.

Every process the rig starts carries ``PHAROS_RIG=<id>`` in its environment and runs in a
session of its own; :meth:`Rig.leaks` lists what would be left behind (namespaces, mounts,
cgroups, processes) and the test asserts it is empty after the rig is gone. Needs root.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pharos_testkit import REPO

from pharos_agents.cgroups import cgroup2_mount
from pharos_api.demo import fio_totals

#: Name prefix of every rig namespace (``phr<id>-<node>``): short, since interface names are
#: at most 15 characters.
PREFIX = "phr"
FWD_PORT_BASE = 7400
KAFKA_PORT = 9092
API_PORT = 8400
MOUNT_ADMIN_PORT = 7501
FWD_TARGETS = 4  # storage targets (OSTs) ost0..ost3, shared by the forwarding nodes
NUL = b"\0"
MiB = 1 << 20


def sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a command (ip, tc, iptables, mount); raise with its stderr when ``check`` and it fails."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


@dataclass
class Node:
    """One emulated node: its name (``cn0``, ``fwd1``, ``kafka2``, ``server``), network namespace,
    address on the rig's network, and (compute nodes) mount namespace file."""

    name: str
    ns: str
    addr: str
    link: str  # the switch side of its veth link
    anchor: int | None = None  # compute nodes: the process holding the node's mount namespace

    def enter(self) -> list[str]:
        """The nsenter prefix that runs a command on this node (its network, and mount namespace)."""
        argv = ["nsenter", f"--net=/run/netns/{self.ns}"]
        if self.anchor is not None:  # a /proc link: valid from any mount namespace
            argv.append(f"--mount=/proc/{self.anchor}/ns/mnt")
        return [*argv, "--"]


CLONE_NEWNET = 0x40000000


def _enter_netns(ns: str) -> None:
    """setns(2) of the CALLING THREAD into network namespace ``ns`` (a worker's initializer)."""
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
    finally:
        os.close(fd)


class NodeClient:
    """HTTP from inside a rig node's network (e.g. a login node calling the API): every call runs
    in one worker thread that entered the node's network namespace, so its sockets live there."""

    def __init__(self, ns: str, token: str = "") -> None:
        self._pool = ThreadPoolExecutor(1, initializer=_enter_netns, initargs=(ns,))
        self._token = token
        self._client: httpx.Client | None = None

    def _call(self, method: str, url: str, kw: dict) -> httpx.Response:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
            self._client = httpx.Client(headers=headers, timeout=30)
        return self._client.request(method, url, **kw)

    def request(self, method: str, url: str, **kw) -> httpx.Response:
        return self._pool.submit(self._call, method, url, kw).result()

    def get(self, url: str, **kw) -> httpx.Response:
        return self.request("GET", url, **kw)

    def close(self) -> None:
        def _close():
            if self._client is not None:
                self._client.close()

        self._pool.submit(_close).result()
        self._pool.shutdown()


@dataclass
class Rig:
    """A running rig (see the module docstring); made by :func:`running_rig`."""

    id: str
    root: Path
    nodes: dict[str, Node]
    cgroup: str  # the rig's cgroup folder, relative to the cgroup2 mount
    token: str = ""
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    clients: list[NodeClient] = field(default_factory=list)
    site: dict[str, str] = field(default_factory=dict)  # more of the site's configuration (running_rig's env)

    def client(self, node: str = "server") -> NodeClient:
        """An HTTP client inside ``node``'s network, with the rig's API token."""
        c = NodeClient(self.nodes[node].ns, self.token)
        self.clients.append(c)
        return c

    def api(self, path: str, **params) -> dict:
        """``GET <api>/v1/<path>`` from the server node; its JSON (raises on an HTTP error)."""
        if not hasattr(self, "_api"):
            self._api = self.client("server")
        r = self._api.get(f"{self.api_url}/v1/{path}", params=params)
        r.raise_for_status()
        return r.json()

    def pin(self, job_id: str, nodes: list[str], reason: str) -> None:
        """An admin's pin of ``job_id`` to ``nodes`` (``PUT /v1/control/pins/jobs/{id}``; the control
        loop pushes it to the mounts at its next cycle). Raises RuntimeError when refused."""
        r = self.client("server").request(
            "PUT", f"{self.api_url}/v1/control/pins/jobs/{job_id}", json={"nodes": nodes, "reason": reason}
        )
        if r.status_code != 200:
            raise RuntimeError(f"pin {job_id}: HTTP {r.status_code} {r.text}")

    # -- names -------------------------------------------------------------------------
    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.id}-sw"

    def of_kind(self, prefix: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.name.startswith(prefix)]

    @property
    def compute(self) -> list[Node]:
        return self.of_kind("cn")

    @property
    def mount_dir(self) -> Path:
        """The forwarding layer's mount point, the same path on every compute node."""
        return self.root / "pharos"

    @property
    def rsh(self) -> Path:
        """The launcher script, under /run like a site's ssh under /usr/bin: a system folder, so the
        shell reading it in a job is not the job's data I/O."""
        return Path("/run/pharos-rig") / self.id / "rsh"

    @property
    def api_url(self) -> str:
        return f"http://{self.nodes['server'].addr}:{API_PORT}"

    def fwd_addr(self, name: str, admin: bool = False) -> str:
        """``host:port`` of forwarding node ``name``'s request listener (``admin``: its admin
        interface, GET /status and, with the admin token, /metrics)."""
        return f"{self.nodes[name].addr}:{FWD_PORT_BASE + 10 * int(name[3:]) + int(admin)}"

    def fwd_ready(self, name: str) -> Path:
        """The ready file of forwarding node ``name``'s daemon (on the shared storage)."""
        return self.root / "storage" / "run" / f"{name}.ready"

    # -- configuration -----------------------------------------------------------------
    def site_env(self) -> dict[str, str]:
        """What every node of the site is configured with (PHAROS_* variables)."""
        brokers = [n.addr for n in self.of_kind("kafka")]
        fwd = self.of_kind("fwd")
        return {
            "PHAROS_RIG": self.id,
            "PHAROS_KAFKA_BOOTSTRAP": ",".join(f"{a}:{KAFKA_PORT}" for a in brokers),
            "PHAROS_KAFKA_BROKERS": str(len(brokers)),
            "PHAROS_FWD_NODES": str(len(fwd)),
            "PHAROS_FWD_PORT_BASE": str(FWD_PORT_BASE),
            "PHAROS_FWD_TARGETS": str(FWD_TARGETS),
            "PHAROS_FWD_TARGET_LIMITS_MB_S": "[]",
            "PHAROS_FWD_KEY_FILE": str(self.root / "site" / "fwd.key"),
            "PHAROS_FWD_ADMIN_TOKEN_FILE": str(self.root / "site" / "fwd-admin.token"),
            "PHAROS_FWD_ADDRESSES": json.dumps({n.name: self.fwd_addr(n.name) for n in fwd}),
            "PHAROS_API_HOST": self.nodes["server"].addr,
            "PHAROS_API_PORT": str(API_PORT),
            "PHAROS_API_TOKEN": self.token,
            "PHAROS_MOUNT_DIR": str(self.mount_dir),
            "PHAROS_MOUNT_ADMIN_PORT": str(MOUNT_ADMIN_PORT),
            "PHAROS_HEARTBEAT_INTERVAL_S": "1",
            **self.site,
        }

    def node_env(self, name: str) -> dict[str, str]:
        """The site's configuration plus node ``name``'s own (state folder, addresses, cgroup)."""
        n = self.nodes[name]
        env = {**os.environ, **self.site_env(), "PHAROS_STATE_DIR": str(self.root / name)}
        if name.startswith("kafka"):
            env["PHAROS_STATE_DIR"] = str(self.root / "kafka")  # one cluster.id, node<i>/ each
        elif name.startswith("fwd"):
            env["PHAROS_STATE_DIR"] = str(self.root / "storage")  # the shared targets (OSTs) and MDT
            env["PHAROS_FWD_LISTEN_HOST"] = n.addr
        elif name.startswith("cn"):
            env.update(
                PHAROS_CGROUP_PARENT=f"{self.cgroup}/{name}",
                PHAROS_COMPUTE_NODE_NAME=name,
                PHAROS_COMPUTE_NODE_INDEX=name[2:],
                PHAROS_MOUNT_ADMIN_HOST=n.addr,
                PHAROS_AGENT_METRICS_ADDR=f"{n.addr}:9435",
            )
        elif name == "server":
            cns = self.compute
            env.update(
                PHAROS_API_AUTH="token",
                PHAROS_CONTROL_MOUNT_ADMIN_URLS=json.dumps([f"http://{c.addr}:{MOUNT_ADMIN_PORT}" for c in cns]),
                PHAROS_CONTROL_FWD_ADMIN_URLS=json.dumps(
                    {f.name: f"http://{self.fwd_addr(f.name, admin=True)}" for f in self.of_kind("fwd")}
                ),
                PHAROS_CONTROL_ADMIN_TOKEN_FILE=str(self.root / "site" / "fwd-admin.token"),
            )
        return env

    # -- processes ---------------------------------------------------------------------
    def popen(self, node: str, argv: list[str], log: str | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` on ``node`` (its namespaces, its configuration; ``env`` in ``kw`` is added),
        in a session of its own; output to ``<root>/logs/<log>.log`` when ``log`` is given."""
        env = {**self.node_env(node), **kw.pop("env", {})}
        out = None
        if log:
            (self.root / "logs").mkdir(exist_ok=True)
            out = open(self.root / "logs" / f"{log}.log", "ab")  # noqa: SIM115 (the child holds it)
        p = subprocess.Popen(
            [*self.nodes[node].enter(), *argv],
            env=env,
            cwd=self.root / "work",
            stdout=out or kw.pop("stdout", None),
            stderr=subprocess.STDOUT if out else kw.pop("stderr", None),
            start_new_session=True,
            **kw,
        )
        if out:
            out.close()
            self.procs[log] = p
        return p

    def run(self, node: str, argv: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``node`` to completion (bounded); its result (text output captured)."""
        env = {**self.node_env(node), **kw.pop("env", {})}
        return subprocess.run(
            [*self.nodes[node].enter(), *argv],
            env=env,
            cwd=self.root / "work",
            capture_output=True,
            text=True,
            timeout=timeout,
            **kw,
        )

    def pharos(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "pharos_api.cli", *args]

    def stop(self, name: str, grace_s: float = 20) -> None:
        """SIGTERM the process started as ``name`` (its session), SIGKILL after ``grace_s``."""
        p = self.procs.pop(name, None)
        if p is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)

    def kill_node(self, name: str) -> int:
        """SIGKILL every process in node ``name``'s network namespace, as a node crash does (a
        daemon's own children too: ``pharos broker`` runs its JVM in a session of its own, which
        killing the session ``name`` was started in would miss). Returns how many were killed."""
        pids = [int(p) for p in sh("ip", "netns", "pids", self.nodes[name].ns).stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p = self.procs.pop(name, None)
        if p is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        return len(pids)

    def start_fwd(self, name: str, fwd_args: Sequence[str] = ()) -> subprocess.Popen:
        """Start forwarding node ``name``'s daemon (``pharos fwd --index i -- FWD_ARGS``, logged as
        ``name``), its old ready file removed first: wait for it with :meth:`wait_fwd`."""
        self.fwd_ready(name).unlink(missing_ok=True)
        return self.popen(name, [*self.pharos("fwd", "--index", name[3:]), "--", *fwd_args], log=name)

    def wait_fwd(self, name: str, timeout: float = 60) -> None:
        """Wait until forwarding node ``name``'s daemon is ready (RuntimeError with its log if it
        exits or is not ready in ``timeout`` s)."""
        _wait(name, self.fwd_ready(name).exists, timeout, self, name)

    def start_mount(self, node: str, mount_args: Sequence[str] = ()) -> subprocess.Popen:
        """Start compute node ``node``'s FUSE mount (``pharos mount -- MOUNT_ARGS``, logged as
        ``<node>-mount``), its old ready file removed first: wait for it with :meth:`wait_mount`."""
        self.mount_ready(node).unlink(missing_ok=True)
        return self.popen(node, [*self.pharos("mount"), "--", *mount_args], log=f"{node}-mount")

    def mount_ready(self, node: str) -> Path:
        return self.root / node / "run" / "mount.ready"

    def wait_mount(self, node: str, timeout: float = 60) -> None:
        _wait(f"{node} mount", self.mount_ready(node).exists, timeout, self, f"{node}-mount")

    def restart_forwarding(self, fwd_args: Sequence[str] = (), mount_args: Sequence[str] = ()) -> None:
        """Restart the forwarding layer with other flags (e.g. ``--gas``, ``--masters``): every
        compute node's mount stopped, every forwarding daemon restarted with ``fwd_args``, the
        mounts started again with ``mount_args`` once the daemons are ready. (A mount whose
        forwarding node restarted under it reconnects by itself, but a request that meets a
        connection the old daemon closed fails with EIO when no other node can take its replay;
        fresh mounts have none.)"""
        for n in self.compute:
            self.stop(f"{n.name}-mount")
        for f in self.of_kind("fwd"):
            self.stop(f.name)
            self.start_fwd(f.name, fwd_args)
        for f in self.of_kind("fwd"):
            self.wait_fwd(f.name)
        for n in self.compute:
            self.start_mount(n.name, mount_args)
        for n in self.compute:
            self.wait_mount(n.name)

    def log_tail(self, name: str, lines: int = 20) -> str:
        f = self.root / "logs" / f"{name}.log"
        return "\n".join(f.read_text(errors="replace").splitlines()[-lines:]) if f.exists() else "(no log)"

    # -- what would be left behind -----------------------------------------------------
    def leaks(self) -> list[str]:
        """Namespaces, mounts, cgroups and processes of this rig that still exist (empty: clean)."""
        out = []
        names = sh("ip", "netns", "list", check=False).stdout.split()
        out += [f"netns {n}" for n in names if n.startswith(f"{PREFIX}{self.id}-")]
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = line.split()[4]
            if mp.startswith(str(self.root)) or mp.startswith(f"/run/netns/{PREFIX}{self.id}-"):
                out.append(f"mount {mp}")
        cg = cgroup2_mount() / self.cgroup
        if cg.exists():
            out.append(f"cgroup {cg}")
        if self.rsh.parent.exists():
            out.append(f"folder {self.rsh.parent}")
        me = os.getpid()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == me:
                continue
            with contextlib.suppress(OSError):
                if f"PHAROS_RIG={self.id}".encode() in (d / "environ").read_bytes().split(NUL):
                    cmd = (d / "cmdline").read_bytes().replace(NUL, b" ")[:120]
                    out.append(f"process {d.name} {cmd!r}")
        return out


def _rsh_script(rig: Rig) -> str:
    """Hydra's ``-launcher-exec``: ``RSH [-x] HOST COMMAND`` runs COMMAND on rig node HOST."""
    cases = "\n".join(
        f"  {n.name}) ENTER={shlex.quote(' '.join(n.enter()))}; PARENT={rig.cgroup}/{n.name} ;;" for n in rig.compute
    )
    return f"""#!/bin/sh
# Generated by tests/cluster_testkit.py: ssh for MPICH's Hydra inside the Pharos rig {rig.id}.
# Runs the proxy in the named node's namespaces and, for a job, in that job's cgroup there
# (what ssh + pam_slurm_adopt do on a site), so the node's eBPF agent traces its ranks.
while [ "${{1#-}}" != "$1" ]; do shift; done
HOST=$1; shift
case "$HOST" in
{cases}
  *) echo "rsh: no rig node $HOST" >&2; exit 255 ;;
esac
CG={cgroup2_mount()}/$PARENT
if [ -n "$PHAROS_JOB_ID" ]; then
  mkdir -p "$CG/job_$PHAROS_JOB_ID/rank_0"
  JOIN="echo \\$\\$ > $CG/job_$PHAROS_JOB_ID/rank_0/cgroup.procs;"
else
  JOIN=""
fi
exec $ENTER sh -c "$JOIN exec $*"
"""


def _network(rig: Rig) -> None:
    sw = rig.switch
    sh("ip", "netns", "add", sw)
    sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", sw, "link", "set", "br0", "up")
    for n in rig.nodes.values():
        sh("ip", "netns", "add", n.ns)
        sh("ip", "-n", sw, "link", "add", n.link, "type", "veth", "peer", "name", "eth0", "netns", n.ns)
        sh("ip", "-n", sw, "link", "set", n.link, "master", "br0", "up")
        sh("ip", "-n", n.ns, "addr", "add", f"{n.addr}/24", "dev", "eth0")
        sh("ip", "-n", n.ns, "link", "set", "eth0", "up")
        sh("ip", "-n", n.ns, "link", "set", "lo", "up")


def _mount_namespaces(rig: Rig) -> None:
    """A mount namespace per compute node, held by an anchor process (``sleep``) started in it
    with private propagation: the node's FUSE mount at :attr:`Rig.mount_dir` lives there, and
    every process entered into the node (``/proc/<anchor>/ns/mnt``) sees it."""
    for n in rig.compute:
        argv = ["unshare", "--mount", "--propagation", "private", "sleep", "infinity"]
        p = rig.popen(n.name, argv, log=f"{n.name}-anchor")
        n.anchor = p.pid  # nsenter and unshare exec: the pid is sleep's
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{p.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            if time.monotonic() > deadline or p.poll() is not None:
                raise RuntimeError(f"{n.name}: no mount namespace of its own\n{rig.log_tail(f'{n.name}-anchor')}")
            time.sleep(0.05)


def _teardown(rig: Rig) -> None:
    for c in rig.clients:
        with contextlib.suppress(Exception):
            c.close()
    for name in list(rig.procs)[::-1]:
        rig.stop(name)
    # processes a test started on the nodes and left (they carry PHAROS_RIG)
    for line in rig.leaks():
        if line.startswith("process "):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(line.split()[1]), signal.SIGKILL)
    time.sleep(0.5)
    for n in rig.compute:
        if n.anchor is not None and Path(f"/proc/{n.anchor}").exists():
            sh(*n.enter(), "umount", "-l", str(rig.mount_dir), check=False)
    for n in [*rig.nodes.values()]:
        sh("ip", "netns", "del", n.ns, check=False)
    sh("ip", "netns", "del", rig.switch, check=False)
    shutil.rmtree(rig.rsh.parent, ignore_errors=True)
    cg = cgroup2_mount() / rig.cgroup
    if cg.exists():
        for d in sorted(cg.rglob("*"), key=lambda p: -len(p.parts)):
            if d.is_dir():
                with contextlib.suppress(OSError):
                    d.rmdir()
        with contextlib.suppress(OSError):
            cg.rmdir()


def _wait(what: str, ok, timeout: float, rig: Rig, log: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if ok():
                return
        if log and log in rig.procs and rig.procs[log].poll() is not None:
            raise RuntimeError(f"{what}: exited {rig.procs[log].returncode}\n{rig.log_tail(log)}")
        time.sleep(0.3)
    raise RuntimeError(f"{what}: not ready in {timeout:.0f} s\n{rig.log_tail(log) if log else ''}")


@contextlib.contextmanager
def running_rig(
    root: Path,
    compute: int = 2,
    fwd: int = 2,
    brokers: int = 1,
    progress=print,
    fwd_args: Sequence[str] = (),
    mount_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Rig]:
    """Build and start a rig under ``root`` (a fresh folder); yield it; remove everything.

    ``fwd_args`` and ``mount_args``: more flags for every pharos-fwd and pharos-mount (e.g.
    ``["--gas", "on"]``, ``["--rpc-timeout-ms", "5000"]``), after those of the site's configuration;
    ``env``: more of the site's configuration (``PHAROS_*`` variables every node gets).

    Raises RuntimeError (with the failing component's log) when a component does not start."""
    rid = uuid.uuid4().hex[:6]
    rnd = random.Random(rid)
    net = f"10.{rnd.randrange(200, 250)}.{rnd.randrange(0, 250)}"
    names = [f"kafka{i + 1}" for i in range(brokers)] + ["server"]
    names += [f"fwd{i}" for i in range(fwd)] + [f"cn{i}" for i in range(compute)]
    nodes = {name: Node(name, f"{PREFIX}{rid}-{name}", f"{net}.{10 + k}", f"v{rid}{k}") for k, name in enumerate(names)}
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("site", "work", "logs", "pharos", "storage"):
        (root / sub).mkdir(exist_ok=True)
    rig = Rig(rid, root.resolve(), nodes, f"pharos-rig-{rid}", site=dict(env or {}))
    t0 = time.monotonic()
    try:
        _network(rig)
        _mount_namespaces(rig)
        (cgroup2_mount() / rig.cgroup).mkdir()
        rig.rsh.parent.mkdir(parents=True)
        rig.rsh.write_text(_rsh_script(rig))
        rig.rsh.chmod(0o755)
        # the site's secrets: one forwarding-layer key and admin token, one API admin token
        for f in ("fwd.key", "fwd-admin.token"):
            p = root / "site" / f
            p.write_text(os.urandom(32).hex() + "\n")
            p.chmod(0o600)
        r = rig.run("server", rig.pharos("token", "create", "--role", "admin", "--direct", "--json"))
        if r.returncode != 0:
            raise RuntimeError(f"pharos token create: {r.stderr}")
        rig.token = json.loads(r.stdout)["token"]
        for n in rig.of_kind("kafka"):
            rig.popen(n.name, rig.pharos("broker", "--node-id", n.name[5:]), log=n.name)
        for n in rig.of_kind("fwd"):
            rig.start_fwd(n.name, fwd_args)
        rig.popen("server", rig.pharos("serve"), log="server")
        for n in rig.compute:
            rig.popen(n.name, rig.pharos("agent"), log=f"{n.name}-agent")
        for n in rig.of_kind("fwd"):
            rig.wait_fwd(n.name)
        for n in rig.compute:
            rig.start_mount(n.name, mount_args)
        probe = rig.client("server")
        _wait("server (API)", lambda: probe.get(f"{rig.api_url}/v1/health").status_code == 200, 180, rig, "server")
        for n in rig.compute:
            _wait(f"{n.name} agent", (root / n.name / "run" / "agent.ready").exists, 90, rig, f"{n.name}-agent")
            rig.wait_mount(n.name)
        _wait("API with token", lambda: probe.get(f"{rig.api_url}/v1/jobs").status_code == 200, 30, rig)
        progress(f"[rig {rid}] {len(nodes)} nodes on {net}.0/24 up in {time.monotonic() - t0:.1f} s")
        yield rig
    finally:
        _teardown(rig)
        left = rig.leaks()
        if not left:
            shutil.rmtree(root / "pharos", ignore_errors=True)
        progress(f"[rig {rid}] down; left behind: {left or 'nothing'}")


def rig_available() -> str | None:
    """Why the rig cannot run here (None: it can): root, ip/nsenter/unshare, the built binaries."""
    if os.geteuid() != 0:
        return "the rig needs root (namespaces, eBPF, cgroups, FUSE)"
    for tool in ("ip", "nsenter", "unshare", "mpiexec.mpich"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    for b in ("pharos-agent", "pharos-fwd", "pharos-mount"):
        if not (REPO / "target" / "release" / b).exists():
            return f"target/release/{b} not built: make build"
    return None


# -- workload: multi-node fio jobs with verification ---------------------------------------------

#: fio of every rank: 1 MiB writes checked by crc32c (fio reads every block back: the job's bytes
#: read equal its bytes written); no verify state file (it would be the job's data I/O too).
FIO_VERIFY = (
    "--ioengine=psync --bs=1m --rw=write --verify=crc32c --verify_state_save=0 --end_fsync=1 "
    "--output-format=json --disk_util=0"
)


@dataclass
class FioJob:
    """A multi-node fio job: ``kind`` N-N (a file per rank) or N-1 (one shared file, a region per
    rank), ``ranks_per_node`` ranks on each node of ``nodes`` (the first starts it; placed in
    blocks, ranks 0..k-1 on the first node, as Slurm's default distribution), ``size_mib`` MiB per
    rank. ``block_kib`` (N-1 only): the ranks' regions interleave instead, in blocks of that size
    (rank r of R writes blocks r, r + R, r + 2R, ...: strided N-1, issue 12's GAS workload).
    ``name``: its job name (default ``fio-<kind>``): the runs of one name, size and nodes have the
    same command (DFRA's history matches name, user and command)."""

    job_id: str
    kind: str
    nodes: list[str]
    size_mib: int
    fio_args: str = ""  # more fio options (e.g. --rate=4m)
    name: str = ""
    proc: subprocess.Popen | None = None
    out: Path | None = None
    exit_code: int | None = None
    ranks_per_node: int = 1
    block_kib: int = 0

    @property
    def ranks(self) -> int:
        return len(self.nodes) * self.ranks_per_node


def start_fio_job(rig: Rig, job: FioJob) -> None:
    """``pharos run`` on the job's first node of ``mpiexec -hosts <its nodes>`` (the rig's ssh) of
    fio, as a batch script would: the command names the job's folder by ``$PHAROS_JOB_ID``, so it
    is the same for every run; fio's JSON reports go to the rig's folder under /run (a system
    folder, so they are not the job's data I/O). Raises RuntimeError when the job's folder cannot
    be made."""
    data = rig.mount_dir / job.job_id
    job.out = rig.rsh.parent / "out" / job.job_id
    job.out.mkdir(parents=True)
    r = rig.run(job.nodes[0], ["mkdir", "-p", str(data)])
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    if job.kind == "N-N":
        target = f"--filename={rig.mount_dir}/$PHAROS_JOB_ID/data.$PMI_RANK"
    else:  # one shared file at its final size, as an MPI collective create would make it
        size = job.ranks * job.size_mib * MiB
        r = rig.run(job.nodes[0], ["truncate", "-s", str(size), str(data / "shared")])
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        shared = f"{rig.mount_dir}/$PHAROS_JOB_ID/shared"
        target = f"--filename={shared} --offset=$((PMI_RANK*{job.size_mib}))m"
        if job.block_kib:  # rank r's blocks r, r + R, ... up to the file's end (fio lays out nothing)
            b = job.block_kib
            target = (
                f"--filename={shared} --offset=$((PMI_RANK*{b}))k --bs={b}k "
                f"--rw=write:{(job.ranks - 1) * b}k --size=$(({size}-PMI_RANK*{b * 1024})) --io_size={job.size_mib}m"
            )
    fio = (
        f"exec fio --name=rank$PMI_RANK {FIO_VERIFY} {job.fio_args} --size={job.size_mib}m {target} "
        f"--output={job.out.parent}/$PHAROS_JOB_ID/fio.$PMI_RANK.json"
    )
    hosts = ",".join(job.nodes if job.ranks_per_node == 1 else (f"{n}:{job.ranks_per_node}" for n in job.nodes))
    mpiexec = ["mpiexec.mpich", "-hosts", hosts, "-launcher", "ssh", "-launcher-exec", str(rig.rsh)]
    mpiexec += ["-iface", "eth0", "-n", str(job.ranks), "sh", "-c", fio]
    argv = rig.pharos("run", "--job", job.job_id, "--name", job.name or f"fio-{job.kind}", "--", *mpiexec)
    job.proc = rig.popen(job.nodes[0], argv)


def fio_results(job: FioJob) -> tuple[dict[str, int], bool]:
    """(fio's totals over the job's ranks: bytes and requests per direction, verified): verified when
    the job exited 0, every rank reported, no rank had an error and every byte written was read
    back and checked."""
    reports = sorted(job.out.glob("fio.*.json")) if job.out else []
    if len(reports) != job.ranks:
        return {}, False
    totals = fio_totals(reports)
    docs = [json.loads(p.read_text()[p.read_text().find("{") :]) for p in reports]
    ok = job.exit_code == 0 and all(j["error"] == 0 for d in docs for j in d["jobs"])
    return totals, ok and totals["bytes_read"] == totals["bytes_written"]


def wait_summary(rig: Rig, job_id: str, layer: str, written: int, timeout_s: float = 90) -> dict:
    """The job's summary on ``layer`` once it is finished and its bytes written reach ``written``
    (else the last one seen, ``{}`` if none)."""
    deadline = time.monotonic() + timeout_s
    s: dict = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # 404 until the first record or event is stored
            s = rig.api(f"jobs/{job_id}", layer=layer)
        if s.get("state") == "finished" and s.get("bytes_written", 0) >= written:
            return s
        time.sleep(1)
    return s
