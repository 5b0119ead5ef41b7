"""Fixtures of the pipeline tests: one real Kafka broker per session (KRaft, loopback, free
ports, tmp data dir) and a fresh real chDB store per test.

Each test gets its own topic names and consumer group (``pipeline_settings``), so tests
share the broker without seeing each other's messages. Skips only when Java is missing;
missing jars are fetched with pipeline/kafka/fetch.sh (Maven Central).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid

import pytest

from pharos_pipeline.broker import KafkaBroker, ensure_topics
from pharos_pipeline.settings import REPO_ROOT, Settings
from pharos_pipeline.store import migrate, open_store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory) -> KafkaBroker:
    if shutil.which("java") is None:
        pytest.skip("Java is not installed: the real Kafka broker needs Java 17")
    kafka_home = REPO_ROOT / "build" / "kafka"
    if not any((kafka_home / "libs").glob("kafka_2.13-*.jar")):
        subprocess.run(["bash", str(REPO_ROOT / "pipeline/kafka/fetch.sh"), str(kafka_home)], check=True)
    port, ctl = free_port(), free_port()
    while ctl == port:
        ctl = free_port()
    settings = Settings(
        kafka_bootstrap=f"127.0.0.1:{port}",
        kafka_home=kafka_home,
        state_dir=tmp_path_factory.mktemp("pharos-state"),
    )
    broker = KafkaBroker(settings, tmp_path_factory.mktemp("kafka"), controller_port=ctl)
    broker.start(timeout=90)
    yield broker
    broker.stop()


@pytest.fixture
def pipeline_settings(kafka_broker, tmp_path) -> Settings:
    """Settings on the session broker with this test's own topics, group and chDB dir."""
    tag = uuid.uuid4().hex[:8]
    settings = Settings(
        kafka_bootstrap=kafka_broker.bootstrap,
        kafka_home=kafka_broker.settings.kafka_home,
        state_dir=tmp_path / "state",
        topic_requests=f"t{tag}.io.requests",
        topic_jobs=f"t{tag}.jobs",
        topic_deadletter=f"t{tag}.io.deadletter",
        topic_target_metrics=f"t{tag}.target.metrics",
        topic_partitions=3,
        consumer_group=f"g{tag}",
        pipeline_max_messages=50,
        pipeline_max_wait_ms=100,
    )
    ensure_topics(settings)
    return settings


@pytest.fixture
def store(pipeline_settings):
    """A migrated chDB store in the test's state dir (one chDB dir per process at a time)."""
    s = open_store(pipeline_settings)
    migrate(s)
    yield s
    s.close()
