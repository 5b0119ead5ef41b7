"""Fixtures of the forwarder tests: the release binaries (built once per session), a
cluster of real daemons and FUSE mounts per test, and a real Kafka broker (KRaft,
loopback, free ports) for the tests that check shipped records.

Skips when /dev/fuse, root or fio is missing (the mount needs all three).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from forwarder_testkit import Cluster, build_binaries, free_port


def _fuse_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (FUSE mount with allow_other)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse missing"
    if shutil.which("fio") is None:
        return "fio missing"
    return None


@pytest.fixture(scope="session")
def binaries() -> None:
    why = _fuse_usable()
    if why:
        pytest.skip(why)
    build_binaries()


@pytest.fixture
def cluster(binaries, tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    if shutil.which("java") is None:
        pytest.skip("Java is not installed: the real Kafka broker needs Java 17")
    from pharos_pipeline.broker import KafkaBroker
    from pharos_pipeline.settings import REPO_ROOT, Settings

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
def kafka_settings(kafka_broker, tmp_path):
    """Settings on the session broker with this test's own topics."""
    from pharos_pipeline.broker import ensure_topics
    from pharos_pipeline.settings import Settings

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
    )
    ensure_topics(settings)
    return settings
