"""Fixtures of the pipeline tests: the session's real Kafka broker (``kafka_broker`` in
tests/conftest.py) and a fresh real chDB store per test.

Each test gets its own topic names and consumer group (``pipeline_settings``), so tests
share the broker without seeing each other's messages.
"""

from __future__ import annotations

import uuid

import pytest

from pharos_pipeline.broker import ensure_topics
from pharos_pipeline.settings import Settings
from pharos_pipeline.store import migrate, open_store


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
