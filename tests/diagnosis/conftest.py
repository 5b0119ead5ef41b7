"""One real chDB store per test module (closed at its end: chDB allows one open data
directory per process); row builders live in pharos_diag_rows."""

from __future__ import annotations

import pytest

from pharos_pipeline.settings import Settings
from pharos_pipeline.store import migrate, open_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(Settings(state_dir=tmp_path_factory.mktemp("diag")))
    migrate(s)
    yield s
    s.close()
