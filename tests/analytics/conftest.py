"""The analytics tests' ``store`` (tests/conftest.py) starts with the synthetic jobs."""

from __future__ import annotations

import pytest
from pharos_synthetic_jobs import build_store


@pytest.fixture(scope="session")
def store_builder():
    return build_store
