"""Helpers shared by test folders (importable because tests/conftest.py puts tests/ on
sys.path): paths to the shared data beside the repository, free loopback ports, settings with
a test's own Kafka topics on the session broker, the real Alertmanager and Prometheus on a free
loopback port, Prometheus expositions parsed, a job cgroup to run a command in as a job."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

log = logging.getLogger("pharos.testkit")
T = TypeVar("T")

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
PROMETHEUS = "/usr/bin/prometheus"
REPO = Path(__file__).resolve().parents[1]
#: ``pytestmark`` of a test on a whole real stack (eBPF agent, job cgroups and FUSE need root).
LIVE_STACK_MARKS = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the eBPF agent, job cgroups and FUSE need root"),
]


def shared_path(rel: str, env: str) -> Path:
    """``rel`` under the shared data folder that sits beside the repository (``../shared``, as
    CI and developers have it), or the path in environment variable ``env`` when set."""
    override = os.environ.get(env)
    return Path(override) if override else REPO.parent / "shared" / rel


# The Darshan project's real logs (``../shared/darshan-logs``; PHAROS_DARSHAN_LOGS overrides).
DARSHAN_LOGS = shared_path("darshan-logs", "PHAROS_DARSHAN_LOGS")


def need_darshan(path: Path) -> Path:
    """``path`` (a log or folder of the Darshan corpus) if it exists, else skip the test with
    where the corpus is expected (under PHAROS_REQUIRE_ALL=1 a skip is an error)."""
    if not path.exists():
        pytest.skip(
            f"Darshan corpus not found: {path} (the real logs live in ../shared/darshan-logs beside "
            "the repository; PHAROS_DARSHAN_LOGS overrides)"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kafka_jars() -> Path:
    """The Kafka home holding the pinned jars (``build/kafka``), fetched with
    pipeline/kafka/fetch.sh when missing; skips the test when Java is not installed."""
    if shutil.which("java") is None:
        pytest.skip("Java is not installed: the real Kafka broker needs Java 17")
    kafka_home = REPO / "build" / "kafka"
    if not any((kafka_home / "libs").glob("kafka_2.13-*.jar")):
        subprocess.run(["bash", str(REPO / "pipeline/kafka/fetch.sh"), str(kafka_home)], check=True)
    return kafka_home


def kafka_bootstrap(nodes: int = 1) -> str:
    """A loopback bootstrap address for a stack's own broker: port p with p + 1 (the KRaft
    controller listener, see pharos_pipeline.broker) free too, checked by binding both; for an
    embedded cluster of ``nodes`` (settings ``kafka_brokers``), p .. p + 2 * nodes - 1 all free."""
    for _ in range(100):
        with contextlib.ExitStack() as held:
            a = held.enter_context(socket.socket())
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port + 2 * nodes > 65536:
                continue
            try:
                for q in range(port + 1, port + 2 * nodes):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", q))
            except OSError:
                continue
        return f"127.0.0.1:{port}"
    raise RuntimeError(f"no {2 * nodes} consecutive free loopback ports found")


def topic_settings(kafka_broker, state_dir: Path, **overrides):
    """Settings on the session broker (``kafka_broker`` fixture) with fresh topics and consumer
    group of their own (created, 3 request partitions) and ``state_dir``; ``overrides`` are
    further Settings fields."""
    from pharos_core.settings import Settings
    from pharos_pipeline.broker import ensure_topics

    tag = uuid.uuid4().hex[:8]
    settings = Settings(
        kafka_bootstrap=kafka_broker.bootstrap,
        kafka_home=kafka_broker.settings.kafka_home,
        state_dir=state_dir,
        topic_requests=f"t{tag}.io.requests",
        topic_jobs=f"t{tag}.jobs",
        topic_deadletter=f"t{tag}.io.deadletter",
        topic_target_metrics=f"t{tag}.target.metrics",
        topic_partitions=3,
        consumer_group=f"g{tag}",
        **overrides,
    )
    ensure_topics(settings)
    return settings


def open_migrated_store(settings):
    """A real chDB store in ``settings.state_dir``, migrated to the newest schema (the caller
    closes it: chDB allows one open data directory per process at a time)."""
    from pharos_core.store import migrate, open_store

    store = open_store(settings)
    migrate(store)
    return store


#: What a server that lost the race for its port says (Kafka's pre-check, the JVM's BindException,
#: Go and Python servers): the caller picks new ports and starts again.
PORT_CLASH = ("already in use", "Address already in use", "BindException", "bind: address")


def is_port_clash(exc: BaseException) -> bool:
    """True when ``exc`` (its message, e.g. with a server's log tail) says a port was taken."""
    return any(s in str(exc) for s in PORT_CLASH)


def start_on_free_ports(start: Callable[[], T], attempts: int = 5, what: str = "server") -> T:
    """``start()`` until it does not fail with a port clash (:func:`is_port_clash`), at most
    ``attempts`` times; ``start`` picks fresh ports at each call (a server that cannot bind port 0
    and report the port, e.g. Kafka's KRaft controller: another process may take a port between
    :func:`free_port` and the server's bind). Re-raises any other error, and the last clash."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except Exception as exc:
            if not is_port_clash(exc) or attempt == attempts:
                raise
            log.warning("%s: a port was taken before it bound (attempt %d of %d), new ports", what, attempt, attempts)
    raise AssertionError("unreachable")


def loopback_listener() -> socket.socket:
    """A TCP socket bound to 127.0.0.1 port 0 (the kernel's free port, no race), not listening yet."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


@contextlib.contextmanager
def served(app) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn in a thread on a socket bound to loopback port 0 (no
    port race); yields its base URL (``http://127.0.0.1:PORT``); stops it on exit. Raises
    RuntimeError when it has not started within 10 s."""
    import uvicorn

    sock = loopback_listener()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not th.is_alive():
            sock.close()
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        th.join(10)
        sock.close()


def start_kafka_broker(data_dir: Callable[[], Path], state_dir: Path, attempts: int = 5, bootstrap=None):
    """The real Kafka broker of a test session on fresh loopback ports (client port p, KRaft
    controller p + 1: :func:`kafka_bootstrap`), started and answering; retried on new ports when
    a port was taken before the JVM bound it (:func:`start_on_free_ports`). ``data_dir()`` gives a
    fresh directory per attempt; ``bootstrap()`` picks the address (default
    :func:`kafka_bootstrap`). Returns the started KafkaBroker (the caller stops it)."""
    from pharos_core.settings import Settings
    from pharos_pipeline.broker import KafkaBroker

    kafka_home = kafka_jars()

    def start():
        settings = Settings(
            kafka_bootstrap=(bootstrap or kafka_bootstrap)(), kafka_home=kafka_home, state_dir=state_dir
        )
        broker = KafkaBroker(settings, data_dir())
        broker.start(timeout=90)
        return broker

    return start_on_free_ports(start, attempts, "kafka broker")


def stack_settings(state_dir: Path, cgroup_parent: str, **overrides):
    """Settings of a whole embedded stack (``pharos_api.stack``) of a test or benchmark: its own
    state dir and job cgroup parent, free loopback ports for the broker (with its controller
    port), API, agent metrics, daemons and mount; ``overrides`` are further Settings fields."""
    from pharos_core.settings import Settings

    fields = {
        "state_dir": state_dir,
        "api_auth": "none",  # loopback; the suite's clients send no token (tests/api test the default)
        "kafka_bootstrap": kafka_bootstrap(),
        "api_port": free_port(),
        "cgroup_parent": cgroup_parent,
        "agent_metrics_addr": f"127.0.0.1:{free_port()}",
        "fwd_port_base": 0,
        "mount_admin_port": 0,
    }
    return Settings(**{**fields, **overrides})


def pharos_run(settings, job_id: str, command: list[str], ranks: int = 1, name: str = "", output_dir=None):
    """(argv, env) of ``pharos run`` as a user types it: the CLI in a subprocess of its own, on
    the stack of ``settings`` (its settings as PHAROS_* variables): job ``job_id``, ``ranks``
    copies of ``command``, rank r's stdout in ``output_dir/rank_<r>.out`` when given."""
    from pharos_api import stack

    argv = [sys.executable, "-m", "pharos_api.cli", "run", "--job", job_id, "--ranks", str(ranks)]
    argv += ["--name", name] if name else []
    argv += ["--output-dir", str(output_dir)] if output_dir is not None else []
    return [*argv, "--", *command], dict(os.environ, **stack.settings_env(settings))


@contextlib.contextmanager
def in_job(job_id: str | None, parent: str = "pharos-test") -> Iterator[Callable[[], None] | None]:
    """A ``preexec_fn`` that moves the child into the job cgroup ``<cgroup2>/<parent>/job_<job_id>``
    before exec (created here, removed on exit): how a test runs a command as job ``job_id``,
    since the mount and the agent take a job id only from the cgroup, never from the environment
    (pharos-attribution, proto/attribution). ``job_id`` None: yields None (no job). Needs root."""
    if job_id is None:
        yield None
        return
    from pharos_agents.cgroups import job_cgroup, join_cgroup, remove_cgroup

    cg = job_cgroup(job_id, parent)
    try:
        yield lambda: join_cgroup(cg)
    finally:
        remove_cgroup(cg)


@contextlib.contextmanager
def _running_server(name: str, argv: list[str], log_path: Path, url: str, lifetime_s: float) -> Iterator[str]:
    """Run ``argv`` (a Prometheus-family server on ``url``) under coreutils ``timeout`` in a process
    group of its own, its output in ``log_path``; yields ``url`` once ``/-/ready`` answers (fails the
    test if it exits or is not ready within 30 s); stops it (SIGTERM, then SIGKILL of the group) on
    exit, and in any case after ``lifetime_s`` seconds."""
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            ["timeout", "--kill-after=10", str(int(lifetime_s)), *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{name} did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()  # timeout passes SIGTERM on to the server
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@contextlib.contextmanager
def running_alertmanager(d: Path, config_yaml: str, lifetime_s: float = 3600) -> Iterator[str]:
    """Run the real Alertmanager (Debian prometheus-alertmanager) with ``config_yaml`` on a
    free loopback port, no clustering, storage in ``d``; yields its base URL; stops it
    (SIGTERM, then SIGKILL) on exit, at the latest after ``lifetime_s`` seconds. Fails the test if
    it is missing or does not start."""
    if not Path(ALERTMANAGER).exists():
        pytest.fail(f"{ALERTMANAGER} missing: apt-get install prometheus-alertmanager")
    (d / "am.yml").write_text(config_yaml)
    port = free_port()
    argv = [
        ALERTMANAGER,
        f"--config.file={d / 'am.yml'}",
        f"--storage.path={d / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    with _running_server("alertmanager", argv, d / "am.log", f"http://127.0.0.1:{port}", lifetime_s) as url:
        yield url


@contextlib.contextmanager
def running_prometheus(d: Path, config_yaml: str, lifetime_s: float = 600) -> Iterator[str]:
    """Run the real Prometheus (Debian prometheus) with ``config_yaml`` on a free loopback port, its
    TSDB in ``d``; yields its base URL; stops it (SIGTERM, then SIGKILL) on exit, at the latest
    after ``lifetime_s`` seconds. Fails the test if it is missing or does not start."""
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"{PROMETHEUS} missing: apt-get install prometheus")
    (d / "prometheus.yml").write_text(config_yaml)
    port = free_port()
    argv = [
        PROMETHEUS,
        f"--config.file={d / 'prometheus.yml'}",
        f"--storage.tsdb.path={d / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    with _running_server("prometheus", argv, d / "prometheus.log", f"http://127.0.0.1:{port}", lifetime_s) as url:
        yield url


@contextlib.contextmanager
def running_stack(state_dir: Path, cgroup_parent: str, env: dict[str, str], **overrides) -> Iterator:
    """A whole embedded stack (``pharos_api.stack.start``) of a test or benchmark on
    :func:`stack_settings` (``overrides``: further Settings fields), its processes started with
    the environment variables ``env`` on top of this process's (e.g. ``PHAROS_CONTROL_*``,
    ``PHAROS_FWD_WORKERS``); yields the Settings; stops the stack and restores this process's
    environment on exit. Raises pharos_api.stack.StackError when a component does not start."""
    from pharos_api import stack

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    settings = None
    try:

        def start():
            nonlocal settings
            if settings is not None:  # an attempt that lost a port race: stop what it started
                stack.stop(settings)
            settings = stack_settings(state_dir, cgroup_parent, **overrides)
            stack.start(settings)
            return settings

        yield start_on_free_ports(start, 3, "embedded stack")
    finally:
        if settings is not None:
            stack.stop(settings)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def parse_metrics(text: str, content_type: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A Prometheus exposition parsed by prometheus_client's parser for its content type (the
    OpenMetrics one is strict: a malformed exposition raises): {sample name: [(labels, value)]}."""
    if content_type.startswith("application/openmetrics-text"):
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def scrape(url: str, token: str | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``GET url`` (a /metrics endpoint, with a Bearer token if given) parsed by
    :func:`parse_metrics`."""
    r = httpx.get(url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=10)
    r.raise_for_status()
    return parse_metrics(r.text, r.headers["content-type"])


def sample(metrics: dict, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(v for lab, v in metrics.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def cli_json(url: str, *args: str) -> dict:
    """``pharos <args> --api url --json`` through the real typer CLI (in process); its JSON."""
    import json

    from typer.testing import CliRunner

    from pharos_api.cli import app

    r = CliRunner().invoke(app, [*args, "--api", url, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def assert_one_pattern(url: str, job_ids: list[str], layer: str = "client") -> dict[str, dict]:
    """Issue 10's "one job pattern": for each job, `pharos job`, `pharos jobs`, `pharos diagnose`,
    ``GET /v1/jobs/{id}``, ``GET /v1/jobs`` and ``GET /v1/jobs/{id}/insights`` give the same
    pattern (Beacon's volume dominance), ``diagnose`` the same per-direction detail, and `pharos
    jobs` the same bytes as `pharos job`. Returns each job's `pharos job` JSON."""
    listed = {j["job_id"]: j for j in cli_json(url, "jobs", "--limit", "1000", "--layer", layer)["items"]}
    api_list = {
        j["job_id"]: j
        for j in httpx.get(f"{url}/v1/jobs", params={"limit": 1000, "layer": layer}, timeout=120).json()["items"]
    }
    out = {}
    for jid in job_ids:
        job = cli_json(url, "job", jid, "--layer", layer)
        diag = cli_json(url, "diagnose", jid)
        api_job = httpx.get(f"{url}/v1/jobs/{jid}", params={"layer": layer}, timeout=120).json()
        api_diag = httpx.get(f"{url}/v1/jobs/{jid}/insights", timeout=120).json()
        prof = diag["phases"]["job"]
        views = {
            "pharos job": job["pattern"],
            "pharos jobs": listed[jid]["pattern"],
            "GET /v1/jobs/{id}": api_job["pattern"],
            "GET /v1/jobs": api_list[jid]["pattern"],
        }
        if layer == "client":  # the diagnosis reads the client layer
            views["pharos diagnose"] = prof["pattern"] if prof else "none"
            views["GET /v1/jobs/{id}/insights"] = (
                api_diag["phases"]["job"]["pattern"] if api_diag["phases"]["job"] else "none"
            )
            if prof:  # the per-direction detail is the same too
                assert prof["patterns"] == job["patterns"] and prof["fan_in_pattern"] == job["fan_in_pattern"], jid
        assert len(set(views.values())) == 1, (jid, views)
        # pharos jobs shows the bytes every job moved, counter-only (no DXT) jobs included
        assert (listed[jid]["bytes_read"], listed[jid]["bytes_written"]) == (job["bytes_read"], job["bytes_written"])
        out[jid] = job
    return out


def dfra_live_env(io_ranks: int) -> dict[str, str]:
    """``PHAROS_CONTROL_*`` of live DFRA tests: the classifier's thresholds lowered for this
    machine's size (64 MiB and ``io_ranks`` I/O ranks benefit, 64 MiB is "very high volume" and
    gets dedicated nodes; one node's capacity 10 GB/s so one dedicated node is enough), placement
    off, a 2 s control period."""
    mib = 1 << 20
    return {
        "PHAROS_CONTROL_DFRA_MIN_BYTES": str(64 * mib),  # Beacon: 20 GB
        "PHAROS_CONTROL_DFRA_MIN_IO_RANKS": str(io_ranks),  # Beacon: 32
        "PHAROS_CONTROL_DFRA_DEDICATED_MIN_BYTES": str(64 * mib),  # Pharos: 1 TB
        "PHAROS_CONTROL_NODE_CAPACITY_B_S": "1e10",  # one dedicated node suffices
        "PHAROS_CONTROL_PLACEMENT_ENABLED": "false",  # not under test here
        "PHAROS_CONTROL_PERIOD_S": "2",
    }


def forwarder_nodes(api: str, job_id: str) -> dict[str, int]:
    """Forwarding node -> bytes of ``job_id``'s requests, from the forwarding daemons' records
    (io_requests, layer 'forwarder', column forwarding_node) through GET /v1/forwarders."""
    r = httpx.get(f"{api}/v1/forwarders", params={"window_s": 3600}, timeout=30)
    assert r.status_code == 200, r.text
    return {it["node"]: j["bytes"] for it in r.json()["items"] for j in it["jobs"] if j["job_id"] == job_id}


class StackAdmin:
    """Admin handles of a running stack: its API URL, the daemons' and the mount's admin URLs
    (from their ready files), target faults, the mount's mapping, a file's layout targets."""

    def __init__(self, settings) -> None:
        import json

        from pharos_api import stack

        self.settings = settings
        self.api = settings.api_url

        def admin(name: str) -> str:
            return "http://" + json.loads(stack.ready_file(settings, name).read_text())["admin"]

        self.fwd_admin = {f"fwd{i}": admin(f"fwd{i}") for i in range(settings.fwd_nodes)}
        self.mount_admin = admin("mount")
        # The admin token `pharos up` made (the admin interfaces answer 401 without it).
        self.headers = settings.fwd_admin_headers()

    def set_target(self, target: str, **fault) -> None:
        """A fault or limit of a target (``added_latency_ms``, ``slowdown``, ``max_perf_mb_s``) set
        through fwd0 and checked on every daemon (the targets' state is shared)."""
        r = httpx.put(f"{self.fwd_admin['fwd0']}/targets/{target}", json=fault, headers=self.headers, timeout=5)
        assert r.status_code == 200, r.text
        for node, url in self.fwd_admin.items():
            t = {x["name"]: x for x in httpx.get(f"{url}/targets", headers=self.headers, timeout=5).json()}
            for k, v in fault.items():
                if k == "added_latency_ms":
                    assert t[target]["added_latency_ns"] == int(v * 1e6), (node, t[target])
                elif k in t[target]:
                    assert t[target][k] == v, (node, t[target])

    def set_mapping(self, jobs: dict[str, list[str]]) -> None:
        r = httpx.put(f"{self.mount_admin}/mapping", json={"jobs": jobs}, headers=self.headers, timeout=5)
        assert r.status_code == 200, r.text

    def mapping(self) -> dict:
        return httpx.get(self.mount_admin + "/mapping", headers=self.headers, timeout=5).json()

    def layout_targets(self, path: Path) -> list[int]:
        """The targets of a file on the mount, from its layout sidecar in the MDT namespace."""
        import re

        rel = path.relative_to(self.settings.mount_point)
        # fsync through the mount first: a create the mount answered itself (a directory it
        # holds) has reached the daemon once it returns (the durability point)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        text = (self.settings.fwd_backend / "mdt" / "ns" / rel).read_text()
        m = re.search(r"targets=([0-9,]+)", text)
        assert m, text
        return [int(x) for x in m.group(1).split(",")]
