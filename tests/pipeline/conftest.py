"""Fixtures of the pipeline tests: the session's real Kafka broker (``kafka_broker`` in
tests/conftest.py) and a fresh real chDB store per test.

Each test gets its own topic names and consumer group (``pipeline_settings``), so tests
share the broker without seeing each other's messages.
"""

from __future__ import annotations

import pytest
from pharos_testkit import open_migrated_store, topic_settings

from pharos_core.settings import Settings


@pytest.fixture
def pipeline_settings(kafka_broker, tmp_path) -> Settings:
    """Settings on the session broker with this test's own topics, group and chDB dir."""
    return topic_settings(kafka_broker, tmp_path / "state", pipeline_max_messages=50, pipeline_max_wait_ms=100)


@pytest.fixture
def store(pipeline_settings):
    """A migrated chDB store in the test's state dir (one chDB dir per process at a time): per
    test, unlike tests/conftest.py's per-module ``store``, since the test's pipeline works on it."""
    s = open_migrated_store(pipeline_settings)
    yield s
    s.close()
