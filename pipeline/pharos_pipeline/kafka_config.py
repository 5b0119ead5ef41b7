"""What the embedded Kafka launcher (:mod:`pharos_pipeline.broker`) tells Kafka: the nodes'
addresses from ``settings.kafka_bootstrap``, the KRaft cluster id, the broker's
``server.properties`` and ``log4j2.properties`` texts, and the partitions, replication factor and
configs of the topics Pharos creates. Pure functions, no process or network here."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

from pharos_core.settings import Settings


class BrokerError(RuntimeError):
    """The broker cannot be started or stopped; the message says why and what to do."""


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID, base64url-encoded without padding (22 characters),
    never beginning with "-" (Kafka's ``Uuid.randomUuid`` rule: the tools' argument parser
    would read such an id as an option)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def parse_bootstrap(bootstrap: str) -> tuple[str, int]:
    """``"127.0.0.1:19092[,...]"`` -> ``("127.0.0.1", 19092)`` (the first server).

    Raises BrokerError when the port is missing or not a number.
    """
    first = bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise BrokerError(f"kafka_bootstrap {bootstrap!r} is not host:port")
    return host.strip("[]"), int(port)


def node_addresses(settings: Settings, nodes: int) -> list[tuple[str, int, int]]:
    """(host, client port, controller port) of each of ``nodes`` embedded Kafka nodes.

    ``settings.kafka_bootstrap`` lists one address per node (controller port = client port + 1),
    or one address only: node i then listens on its port + 2i. Raises BrokerError on any other
    count or when two listeners would share a port.
    """
    servers = [parse_bootstrap(a) for a in settings.kafka_bootstrap.split(",") if a.strip()]
    if len(servers) == 1 and nodes > 1:
        host, port = servers[0]
        servers = [(host, port + 2 * i) for i in range(nodes)]
    if len(servers) != nodes:
        raise BrokerError(
            f"kafka_bootstrap {settings.kafka_bootstrap!r} lists {len(servers)} servers for {nodes} Kafka "
            f"nodes: list one per node or only the first"
        )
    out = [(h, p, p + 1) for h, p in servers]
    ports = [(h, q) for h, p, c in out for q in (p, c)]
    if len(set(ports)) != len(ports):
        raise BrokerError(
            f"kafka_bootstrap {settings.kafka_bootstrap!r}: the nodes' listeners (port, port + 1) overlap"
        )
    return out


def min_insync_replicas(replication_factor: int) -> int:
    """min.insync.replicas for a replication factor: 2 from 3 replicas on (an acks=all write
    survives one lost broker and is on two), else 1."""
    return 2 if replication_factor >= 3 else 1


def server_properties(
    *,
    host: str,
    port: int,
    controller_port: int,
    node_id: int,
    quorum_voters: str,
    replication: int,
    log_dirs: Path,
) -> str:
    """The ``server.properties`` text of one combined KRaft broker+controller node: client
    listener ``host:port``, controller listener ``host:controller_port``, node id, the quorum's
    voters (``id@host:port,...``), ``log_dirs``; internal topics and defaults with ``replication``
    replicas (single node: every replication factor is 1), min.insync.replicas 2 from 3 on."""
    h = host
    rf, isr = str(replication), str(min_insync_replicas(replication))
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": quorum_voters,
        "listeners": f"PLAINTEXT://{h}:{port},CONTROLLER://{h}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{h}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dirs),
        "num.partitions": "1",
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "log.retention.hours": "168",
        "num.network.threads": "2",
        "num.io.threads": "4",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def log4j_properties(log_file: Path) -> str:
    """log4j2 configuration: INFO to ``log_file`` (kafka.log), noisy loggers at WARN."""
    return f"""\
status = warn
# Keep logging during the broker's own shutdown hook (controlled shutdown lines).
shutdownHook = disable
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
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


def topic_specs(settings: Settings) -> dict[str, int]:
    """Topic name -> partitions: requests ``settings.topic_partitions``, jobs 1, dead
    letters 1, target metrics 1."""
    return {
        settings.topic_requests: settings.topic_partitions,
        settings.topic_jobs: 1,
        settings.topic_deadletter: 1,
        settings.topic_target_metrics: 1,
    }


def topic_replication(settings: Settings) -> tuple[int, dict[str, str]]:
    """(replication factor, topic configs) of the topics Pharos creates: the larger of
    ``settings.topic_replication_factor`` and min(3, ``settings.kafka_brokers``) (the embedded
    cluster); with 3 or more replicas also ``min.insync.replicas`` = 2, so an acks=all write is
    on two brokers and the topic stays writable with one broker down."""
    rf = max(settings.topic_replication_factor, min(3, settings.kafka_brokers))
    return rf, ({"min.insync.replicas": str(min_insync_replicas(rf))} if rf >= 3 else {})
