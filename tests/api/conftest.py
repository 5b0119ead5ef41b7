from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

# The synthetic jobs live with the analytics tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analytics"))

from pharos_synthetic_jobs import build_store
from pharos_testkit import free_port, served

from pharos_api.app import create_app
from pharos_pipeline.settings import Settings


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A chDB store with the synthetic jobs, closed at the module's end (chDB allows one
    open data directory per process)."""
    s = build_store(tmp_path_factory.mktemp("api"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def app(store, tmp_path_factory):
    return create_app(store, Settings(state_dir=tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as c:
        yield c


@pytest.fixture
def dead_url():
    """A loopback URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def api_url(app):
    """The app served by uvicorn on a free loopback port, in a thread."""
    with served(app) as url:
        yield url
