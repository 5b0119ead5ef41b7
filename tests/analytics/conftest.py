from __future__ import annotations

import pytest
from pharos_synthetic_jobs import build_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A chDB store with the synthetic jobs, closed at the module's end (chDB allows one
    open data directory per process)."""
    s = build_store(tmp_path_factory.mktemp("analytics"))
    yield s
    s.close()
