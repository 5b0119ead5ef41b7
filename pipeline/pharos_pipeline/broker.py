"""The embedded Kafka broker: Apache Kafka 4.x, single-node KRaft (broker + controller) on
loopback, from the pinned jars that ``make kafka`` (``pipeline/kafka/fetch.sh``) puts in
``settings.kafka_home/libs``.

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
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from .settings import Settings

log = logging.getLogger(__name__)

#: The broker's JVM heap; the embedded stack shares 2 cores and a few GiB with chDB.
JVM_HEAP = "-Xmx512m"


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID, base64url-encoded without padding (22 characters),
    never beginning with "-" (Kafka's ``Uuid.randomUuid`` rule: the tools' argument parser
    would read such an id as an option)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class BrokerError(RuntimeError):
    """The broker cannot be started or stopped; the message says why and what to do."""


def parse_bootstrap(bootstrap: str) -> tuple[str, int]:
    """``"127.0.0.1:19092[,...]"`` -> ``("127.0.0.1", 19092)`` (the first server).

    Raises BrokerError when the port is missing or not a number.
    """
    first = bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise BrokerError(f"kafka_bootstrap {bootstrap!r} is not host:port")
    return host.strip("[]"), int(port)


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
    """A single-node KRaft Kafka broker+controller on loopback.

    ``settings.kafka_bootstrap`` gives the client port (PLAINTEXT listener);
    ``controller_port`` (default: client port + 1) is the KRaft controller listener, also on
    loopback. ``data_dir`` defaults to ``settings.state_dir / "kafka"``.
    """

    def __init__(
        self,
        settings: Settings,
        data_dir: Path | None = None,
        *,
        controller_port: int | None = None,
    ) -> None:
        self.settings = settings
        self.host, self.port = parse_bootstrap(settings.kafka_bootstrap)
        self.controller_port = controller_port or self.port + 1
        self.data_dir = Path(data_dir or settings.state_dir / "kafka").resolve()
        self.libs = Path(settings.kafka_home) / "libs"
        self._proc: subprocess.Popen | None = None

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
        """The broker configuration text (single node: every replication factor is 1)."""
        h = self.host
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{h}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{h}:{self.port},CONTROLLER://{h}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{h}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dirs),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.retention.hours": "168",
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def log4j_properties(self) -> str:
        """log4j2 configuration: INFO to kafka.log, noisy loggers at WARN."""
        return f"""\
status = warn
# Keep logging during the broker's own shutdown hook (controlled shutdown lines).
shutdownHook = disable
appender.file.type = File
appender.file.name = file
appender.file.fileName = {self.log_file}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.state.name = state.change.logger
logger.state.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
"""

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
        """Format log.dirs once; the cluster id is kept in ``data_dir/cluster.id``."""
        if (self.log_dirs / "meta.properties").exists():
            return
        id_file = self.data_dir / "cluster.id"
        if id_file.exists():
            cluster_id = id_file.read_text().strip()
        else:
            cluster_id = new_cluster_id()
            id_file.write_text(cluster_id + "\n")
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
        self._check_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.running_pid() is not None:
            self._wait_ready(timeout)
            return
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
            self._proc = subprocess.Popen(
                [*self._java(), "kafka.Kafka", str(self.properties_file)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")
        try:
            self._wait_ready(timeout)
        except BrokerError:
            self.stop()
            raise
        log.info("kafka broker pid %d ready on %s", self._proc.pid, self.bootstrap)

    def _log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no kafka.log)"

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
        pid = self._proc.pid if self._proc is not None and self._proc.poll() is None else self.running_pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            self._proc = None
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._alive(pid):
            time.sleep(0.1)
        if self._alive(pid):
            log.warning("kafka broker pid %d did not stop in %.0f s: SIGKILL", pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while self._alive(pid):
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        self._proc = None
        return True

    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None  # reaps our child
        return _pid_alive_kafka(pid)

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def topic_specs(settings: Settings) -> dict[str, int]:
    """Topic name -> partitions: requests ``settings.topic_partitions``, jobs 1, dead
    letters 1, target metrics 1."""
    return {
        settings.topic_requests: settings.topic_partitions,
        settings.topic_jobs: 1,
        settings.topic_deadletter: 1,
        settings.topic_target_metrics: 1,
    }


def ensure_topics(settings: Settings, timeout: float = 30) -> dict[str, int]:
    """Create the Pharos topics that do not exist yet (replication factor
    ``settings.topic_replication_factor``).

    Idempotent. Returns topic -> partition count as the broker has it now (an existing
    topic keeps its partitions; a mismatch is logged, not changed). Raises
    confluent_kafka.KafkaException when the broker does not answer or refuses.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    specs = topic_specs(settings)
    existing = admin.list_topics(timeout=timeout).topics
    rf = settings.topic_replication_factor
    missing = [NewTopic(t, num_partitions=n, replication_factor=rf) for t, n in specs.items() if t not in existing]
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

    start: start the broker detached (pid in ``<state_dir>/kafka/kafka.pid``), create the
    topics, return when it answers. stop: stop it (from any process). status: print
    whether it runs. Exit status 1 with the reason on BrokerError.
    """
    import argparse

    from .settings import get_settings

    ap = argparse.ArgumentParser(prog="python -m pharos_pipeline.broker", description=main.__doc__)
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("--timeout", type=float, default=60, help="seconds to wait for start/stop")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    settings = get_settings()
    broker = KafkaBroker(settings)
    try:
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
