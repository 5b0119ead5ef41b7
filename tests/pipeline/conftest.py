"""Fixtures of the pipeline tests: the session's real Kafka broker (``kafka_broker`` in
tests/conftest.py) and a fresh real chDB store per test.

Each test gets its own topic names and consumer group (``pipeline_settings``), so tests
share the broker without seeing each other's messages.
"""

from __future__ import annotations

import pytest
from pharos_testkit import topic_settings

from pharos_pipeline.settings import Settings
from pharos_pipeline.store import migrate, open_store


@pytest.fixture
def pipeline_settings(kafka_broker, tmp_path) -> Settings:
    """Settings on the session broker with this test's own topics, group and chDB dir."""
    return topic_settings(kafka_broker, tmp_path / "state", pipeline_max_messages=50, pipeline_max_wait_ms=100)


@pytest.fixture
def store(pipeline_settings):
    """A migrated chDB store in the test's state dir (one chDB dir per process at a time)."""
    s = open_store(pipeline_settings)
    migrate(s)
    yield s
    s.close()
