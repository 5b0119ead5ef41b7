"""Fixtures of the dashboard tests: the synthetic jobs of tests/analytics plus the rows the
dashboards need (pharos_dashboard_rows), in one chDB store per module; the generator
(dashboards/pharos_dashboards) on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# tests/analytics (the synthetic jobs); dashboards/ and this folder are on pyproject's pythonpath
if str(HERE.parent / "analytics") not in sys.path:
    sys.path.insert(0, str(HERE.parent / "analytics"))

from pharos_dashboard_rows import add_dashboard_rows  # noqa: E402
from pharos_synthetic_jobs import build_store  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = build_store(tmp_path_factory.mktemp("dashboards"))
    add_dashboard_rows(s)
    yield s
    s.close()
