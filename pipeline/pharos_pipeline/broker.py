"""The embedded Kafka broker: Apache Kafka 4.x, single-node KRaft (broker + controller) on
loopback, from the pinned jars that ``make kafka`` (``pipeline/kafka/fetch.sh``) puts in
``settings.kafka_home/libs``; or a cluster of N such combined nodes (:class:`KafkaCluster`,
``settings.kafka_brokers`` > 1) sharing one KRaft quorum, with replicated topics.

Data directory layout (default ``settings.state_dir / "kafka"``)::

    server.properties   written on every start from the settings
    log4j2.properties   broker logging, to kafka.log
    cluster.id          the KRaft cluster id, chosen once at the first format
    logs/               log.dirs (topic partitions, KRaft metadata log)
    kafka.log           broker stdout/stderr and log4j output
    kafka.pid           pid of the running broker, so another process (``pharos down``)
                        can stop a detached broker

Usage::

    with KafkaBroker(settings) as broker:   # start(), stop() on exit
        ensure_topics(settings)

The broker runs in its own session (not killed by the terminal's Ctrl-C); ``stop()`` from
any process sends SIGTERM (controlled shutdown), then SIGKILL after the timeout.

A cluster (``KafkaCluster(settings, data_dir, nodes=3)``) keeps ``cluster.id`` in its data dir
and one such layout per node in ``node1/`` .. ``nodeN/`` (node ids 1..N, every node a voter of
the static quorum ``controller.quorum.voters``). Node i (0-based) listens on the i-th address of
``settings.kafka_bootstrap`` (which the settings expand to N addresses: the first port + 2i),
its controller on that port + 1.

The addresses, the cluster id and the properties texts the launcher writes, and the topics'
layout: :mod:`pharos_pipeline.kafka_config`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from pharos_core.settings import Settings

from .kafka_config import (
    BrokerError,
    log4j_properties,
    new_cluster_id,
    node_addresses,
    parse_bootstrap,
    server_properties,
    topic_replication,
    topic_specs,
)

log = logging.getLogger(__name__)

#: The broker's JVM heap; the embedded stack shares 2 cores and a few GiB with chDB.
JVM_HEAP = "-Xmx512m"


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port (a bind test, SO_REUSEADDR like the JVM)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _pid_alive_kafka(pid: int) -> bool:
    """True when ``pid`` is a live (non-zombie) Kafka broker JVM (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[0]
    return state != "Z" and b"kafka.Kafka" in cmdline


class KafkaBroker:
    """A single-node KRaft Kafka broker+controller on loopback, or one node of a
    :class:`KafkaCluster`.

    ``settings.kafka_bootstrap`` gives the client port (PLAINTEXT listener; the first address);
    ``controller_port`` (default: client port + 1) is the KRaft controller listener, also on
    loopback. ``data_dir`` defaults to ``settings.state_dir / "kafka"``. A cluster's node also
    gets its ``node_id``, the cluster's ``quorum_voters`` (``id@host:port,...``), the
    ``replication`` factor of the internal topics and defaults, and the shared
    ``cluster_id_file``.
    """

    def __init__(
        self,
        settings: Settings,
        data_dir: Path | None = None,
        *,
        controller_port: int | None = None,
        node_id: int = 1,
        quorum_voters: str | None = None,
        replication: int = 1,
        cluster_id_file: Path | None = None,
    ) -> None:
        self.settings = settings
        self.host, self.port = parse_bootstrap(settings.kafka_bootstrap)
        self.controller_port = controller_port or self.port + 1
        self.data_dir = Path(data_dir or settings.state_dir / "kafka").resolve()
        self.libs = Path(settings.kafka_home) / "libs"
        self.node_id = node_id
        self.quorum_voters = quorum_voters or f"{node_id}@{self.host}:{self.controller_port}"
        self.replication = replication
        self.cluster_id_file = Path(cluster_id_file or self.data_dir / "cluster.id")
        self._proc: subprocess.Popen | None = None
        self._log_start = 0  # offset in kafka.log of this object's last launch

    # -- paths -------------------------------------------------------------------------
    @property
    def pid_file(self) -> Path:
        return self.data_dir / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "kafka.log"

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_dirs(self) -> Path:
        return self.data_dir / "logs"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    # -- configuration -----------------------------------------------------------------
    def server_properties(self) -> str:
        """The broker configuration text (single node: every replication factor is 1; a
        cluster's node: ``replication``, min.insync.replicas 2 from 3 on)."""
        return server_properties(
            host=self.host,
            port=self.port,
            controller_port=self.controller_port,
            node_id=self.node_id,
            quorum_voters=self.quorum_voters,
            replication=self.replication,
            log_dirs=self.log_dirs,
        )

    def log4j_properties(self) -> str:
        """log4j2 configuration: INFO to kafka.log, noisy loggers at WARN."""
        return log4j_properties(self.log_file)

    def _java(self) -> list[str]:
        return [
            "java",
            JVM_HEAP,
            "-Xms128m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp",
            f"{self.libs}/*",
        ]

    def _check_jars(self) -> None:
        if not any(self.libs.glob("kafka_2.13-*.jar")):
            raise BrokerError(
                f"Kafka jars not found in {self.libs}: run `make kafka` "
                f"(bash pipeline/kafka/fetch.sh {self.settings.kafka_home})"
            )

    def _format_storage(self) -> None:
        """Format log.dirs once; the cluster id is kept in ``cluster_id_file`` (default
        ``data_dir/cluster.id``; a cluster's nodes share one)."""
        if (self.log_dirs / "meta.properties").exists():
            return
        id_file = self.cluster_id_file
        if not id_file.exists():  # nodes started at once (one per host): the first link wins
            tmp = id_file.with_name(f".{id_file.name}.{os.getpid()}")
            tmp.write_text(new_cluster_id() + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(tmp, id_file)
            tmp.unlink()
        cluster_id = id_file.read_text().strip()
        cmd = [
            *self._java(),
            # "--cluster-id=ID": an id read from an older state file may still begin with "-"
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",
            "-c",
            str(self.properties_file),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise BrokerError(
                f"formatting the Kafka storage failed (exit {res.returncode}): "
                f"{(res.stderr or res.stdout).strip()[-2000:]}"
            )

    # -- life cycle --------------------------------------------------------------------
    def running_pid(self) -> int | None:
        """Pid of the broker recorded in the pid file if it is alive, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _pid_alive_kafka(pid) else None

    def is_running(self) -> bool:
        """True when this data dir's broker process is alive (it may still be starting)."""
        if self._proc is not None and self._proc.poll() is None:
            return True
        return self.running_pid() is not None

    def start(self, timeout: float = 60) -> None:
        """Start the broker and wait (up to ``timeout`` s) until its AdminClient answers.

        A no-op when this data dir's broker is already running and answering. Raises
        BrokerError when the jars are missing (run ``make kafka``), a port is taken by
        another process, the storage format fails, or the broker exits or does not answer
        in time (the message holds the tail of kafka.log).
        """
        launched = self.launch()
        try:
            self._wait_ready(timeout)
        except BrokerError:
            if launched:
                self.stop()
            raise
        log.info("kafka broker pid %s ready on %s", self.running_pid(), self.bootstrap)

    def launch(self) -> bool:
        """Start the broker process without waiting for it to answer (a cluster's nodes must
        all run before any of them answers: the quorum needs a majority). Returns False when
        this data dir's broker is already running. Raises BrokerError as :meth:`start`."""
        self._check_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.running_pid() is not None:
            return False
        for port, what in ((self.port, "client"), (self.controller_port, "controller")):
            if not port_is_free(self.host, port):
                raise BrokerError(
                    f"port {self.host}:{port} ({what} listener) is already in use by another "
                    f"process; stop it or set PHAROS_KAFKA_BOOTSTRAP to a free port"
                )
        self.properties_file.write_text(self.server_properties())
        (self.data_dir / "log4j2.properties").write_text(self.log4j_properties())
        self._format_storage()
        with open(self.log_file, "ab") as out:
            self._log_start = out.tell()  # this launch's lines start here (the log is appended to)
            self._proc = subprocess.Popen(
                [*self._java(), "kafka.Kafka", str(self.properties_file)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")
        return True

    def _log_tail(self, n: int = 30) -> str:
        """The cause (the first ERROR/FATAL lines of this launch: a JVM that cannot bind its port
        logs a BindException, then pages of shutdown and config lines) and the last ``n`` lines."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self._log_start)
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no kafka.log)"
        cause = [ln for ln in lines if " ERROR " in ln or " FATAL " in ln or "Exception" in ln][:3]
        head = "first errors:\n" + "\n".join(cause) + "\nlast lines:\n" if cause else ""
        return head + "\n".join(lines[-n:])

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        last = "no answer"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise BrokerError(f"kafka broker exited with {self._proc.returncode}; kafka.log:\n{self._log_tail()}")
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers:
                    return
            except Exception as exc:  # KafkaException while it starts
                last = str(exc)
            time.sleep(0.3)
        raise BrokerError(
            f"kafka broker on {self.bootstrap} did not answer within {timeout:.0f} s ({last}); "
            f"kafka.log:\n{self._log_tail()}"
        )

    def stop(self, timeout: float = 30) -> bool:
        """Stop the broker (ours or the one in the pid file): SIGTERM, SIGKILL after timeout.

        Returns True when a broker was running. Removes the pid file.
        """
        return self._end(signal.SIGTERM, timeout) is not None

    def kill(self) -> int | None:
        """SIGKILL the broker at once (a crash: no controlled shutdown, nothing flushed);
        returns its pid, or None when it was not running. Removes the pid file."""
        return self._end(signal.SIGKILL, 0)

    def _end(self, sig: int, timeout: float) -> int | None:
        pid = self._proc.pid if self._proc is not None and self._proc.poll() is None else self.running_pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            self._proc = None
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._alive(pid):
            time.sleep(0.1)
        if self._alive(pid):
            if sig != signal.SIGKILL:
                log.warning("kafka broker pid %d did not stop in %.0f s: SIGKILL", pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while self._alive(pid):
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        self._proc = None
        return pid

    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None  # reaps our child
        return _pid_alive_kafka(pid)

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class KafkaCluster:
    """N combined KRaft broker+controller nodes (:class:`KafkaBroker` each) on loopback with
    one cluster id and a static quorum of all N voters; internal topics and defaults with
    replication factor min(3, N) and min.insync.replicas 2 from 3 on.

    ``nodes`` defaults to ``settings.kafka_brokers``; addresses from :func:`node_addresses`;
    ``data_dir`` (default ``settings.state_dir / "kafka"``) holds ``cluster.id`` and
    ``node1/`` .. ``nodeN/``. ``nodes[i]`` is node id i + 1. Tests crash one node with
    :meth:`kill` and bring it back with :meth:`restart`.
    """

    def __init__(self, settings: Settings, data_dir: Path | None = None, *, nodes: int | None = None) -> None:
        n = nodes or settings.kafka_brokers
        if n < 1:
            raise BrokerError(f"a Kafka cluster needs at least one node, not {n}")
        self.settings = settings
        self.data_dir = Path(data_dir or settings.state_dir / "kafka").resolve()
        addrs = node_addresses(settings, n)
        voters = ",".join(f"{i + 1}@{h}:{c}" for i, (h, _p, c) in enumerate(addrs))
        self.replication = min(3, n)
        self.nodes = [
            KafkaBroker(
                settings.model_copy(update={"kafka_bootstrap": f"{h}:{p}"}),
                self.data_dir / f"node{i + 1}",
                controller_port=c,
                node_id=i + 1,
                quorum_voters=voters,
                replication=self.replication,
                cluster_id_file=self.data_dir / "cluster.id",
            )
            for i, (h, p, c) in enumerate(addrs)
        ]

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated."""
        return ",".join(node.bootstrap for node in self.nodes)

    def running_pid(self) -> int | None:
        """Pid of the first running node, or None when none runs (as KafkaBroker's)."""
        return next((pid for node in self.nodes if (pid := node.running_pid()) is not None), None)

    def is_running(self) -> bool:
        return any(node.is_running() for node in self.nodes)

    def start(self, timeout: float = 120) -> None:
        """Start every node that is not running and wait (up to ``timeout`` s) until the
        metadata shows all N brokers. On failure the nodes started here are stopped again.
        Raises BrokerError as :meth:`KafkaBroker.start`."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        launched: list[KafkaBroker] = []
        try:
            for node in self.nodes:
                if node.launch():
                    launched.append(node)
            deadline = time.monotonic() + timeout
            for node in self.nodes:
                node._wait_ready(max(1.0, deadline - time.monotonic()))
            self.wait_brokers(max(1.0, deadline - time.monotonic()))
        except BrokerError:
            self._each(lambda node: node.stop(), launched)
            raise
        log.info("kafka cluster of %d nodes ready on %s", len(self.nodes), self.bootstrap)

    def wait_brokers(self, timeout: float = 60) -> None:
        """Wait until the cluster metadata lists every node as a broker; BrokerError if not."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        want = {node.node_id for node in self.nodes}
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # KafkaException while nodes start
                seen = set(admin.list_topics(timeout=2).brokers)
                if seen >= want:
                    return
            time.sleep(0.3)
        raise BrokerError(
            f"kafka cluster on {self.bootstrap}: brokers {sorted(seen)} of {sorted(want)} after {timeout:.0f} s"
        )

    def stop(self, timeout: float = 30) -> bool:
        """Stop every node at once (SIGTERM, SIGKILL after ``timeout``); True when any ran."""
        return any(self._each(lambda node: node.stop(timeout), self.nodes))

    def kill(self, index: int) -> int | None:
        """SIGKILL node ``nodes[index]`` (a crash); its pid, or None when it was not running."""
        return self.nodes[index].kill()

    def restart(self, index: int, timeout: float = 90) -> None:
        """Start node ``nodes[index]`` again and wait until the cluster lists all N brokers."""
        deadline = time.monotonic() + timeout
        self.nodes[index].start(timeout)
        self.wait_brokers(max(1.0, deadline - time.monotonic()))

    def index_of(self, node_id: int) -> int:
        """Index in ``nodes`` of the node with Kafka node id ``node_id``."""
        return next(i for i, node in enumerate(self.nodes) if node.node_id == node_id)

    @staticmethod
    def _each(fn, nodes: list[KafkaBroker]) -> list:
        """``fn(node)`` for every node in parallel threads (a quorum stops or starts as one)."""
        from concurrent.futures import ThreadPoolExecutor

        if not nodes:
            return []
        with ThreadPoolExecutor(len(nodes)) as ex:
            return list(ex.map(fn, nodes))

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def embedded_kafka(settings: Settings, data_dir: Path | None = None) -> KafkaBroker | KafkaCluster:
    """The embedded launcher of the settings: one :class:`KafkaBroker` when
    ``settings.kafka_brokers`` is 1, else a :class:`KafkaCluster` of that many nodes."""
    if settings.kafka_brokers > 1:
        return KafkaCluster(settings, data_dir)
    return KafkaBroker(settings, data_dir)


def ensure_topics(settings: Settings, timeout: float = 30) -> dict[str, int]:
    """Create the Pharos topics that do not exist yet (replication factor and configs from
    :func:`topic_replication`).

    Idempotent. Returns topic -> partition count as the broker has it now (an existing
    topic keeps its partitions; a mismatch is logged, not changed). Raises
    confluent_kafka.KafkaException when the broker does not answer or refuses.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    specs = topic_specs(settings)
    existing = admin.list_topics(timeout=timeout).topics
    rf, configs = topic_replication(settings)
    missing = [
        NewTopic(t, num_partitions=n, replication_factor=rf, config=configs)
        for t, n in specs.items()
        if t not in existing
    ]
    if missing:
        for _topic, fut in admin.create_topics(missing, operation_timeout=timeout).items():
            try:
                fut.result(timeout)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    deadline = time.monotonic() + timeout
    while True:  # wait until the metadata shows every topic with its leaders
        md = admin.list_topics(timeout=timeout).topics
        ready = all(
            t in md
            and md[t].error is None
            and md[t].partitions
            and all(p.leader >= 0 for p in md[t].partitions.values())
            for t in specs
        )
        if ready or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    out = {t: len(md[t].partitions) for t in specs if t in md}
    for t, n in specs.items():
        if out.get(t, n) != n:
            log.warning("topic %s has %d partitions, settings say %d (left as is)", t, out[t], n)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m pharos_pipeline.broker {start,stop,status}`` with the Pharos settings.

    start: start the broker detached (pid in ``<state_dir>/kafka/kafka.pid``; a cluster of
    ``kafka_brokers`` nodes: ``<state_dir>/kafka/node<i>/kafka.pid``), create the topics, return
    when it answers. stop: stop it (from any process). status: print whether it runs. Exit
    status 1 with the reason on BrokerError.
    """
    import argparse

    from pharos_core.settings import get_settings

    ap = argparse.ArgumentParser(prog="python -m pharos_pipeline.broker", description=main.__doc__)
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("--timeout", type=float, default=60, help="seconds to wait for start/stop")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    settings = get_settings()
    try:
        broker = embedded_kafka(settings)
        if args.action == "start":
            broker.start(timeout=args.timeout)
            topics = ensure_topics(settings)
            print(
                f"kafka running on {broker.bootstrap} (pid {broker.running_pid()}, data {broker.data_dir}); "
                f"topics {topics}"
            )
        elif args.action == "stop":
            print("kafka stopped" if broker.stop(timeout=args.timeout) else "kafka was not running")
        else:
            pid = broker.running_pid()
            print(f"kafka running on {broker.bootstrap} (pid {pid})" if pid else "kafka not running")
            return 0 if pid else 3
    except BrokerError as exc:
        print(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
