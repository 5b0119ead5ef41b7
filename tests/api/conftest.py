"""The API tests' ``store`` (tests/conftest.py) starts with the synthetic jobs of tests/analytics;
``app``, ``client`` and ``api_url`` on it come from tests/conftest.py."""

from __future__ import annotations

import pytest
from pharos_synthetic_jobs import build_store
from pharos_testkit import free_port


@pytest.fixture(scope="session")
def store_builder():
    return build_store


@pytest.fixture
def dead_url():
    """A loopback URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"
