"""Fixtures of the forwarder tests: the release binaries (built once per session), a
cluster of real daemons and FUSE mounts per test, and settings on the session's real Kafka
broker (``kafka_broker`` in tests/conftest.py) for the tests that check shipped records.

Skips when /dev/fuse, root or fio is missing (the mount needs all three).
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from forwarder_testkit import Cluster, build_binaries


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
