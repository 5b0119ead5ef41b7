"""Fixtures of the forwarder tests: the release binaries (built once per session), a
cluster of real daemons and FUSE mounts per test, and settings on the session's real Kafka
broker (``kafka_broker`` in tests/conftest.py) for the tests that check shipped records.

Skips when /dev/fuse, root or fio is missing (the mount needs all three).
"""

from __future__ import annotations

import os
import shutil

import pytest
from forwarder_testkit import Cluster, build_binaries
from pharos_testkit import topic_settings


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
    return topic_settings(kafka_broker, tmp_path / "state")
