"""The dashboard tests' ``store`` (tests/conftest.py) starts with the synthetic jobs of
tests/analytics plus the rows the dashboards need (pharos_dashboard_rows). The generator
(dashboards/pharos_dashboards) and this folder's helpers are on pyproject's pythonpath."""

from __future__ import annotations

import pytest
from pharos_dashboard_rows import add_dashboard_rows
from pharos_synthetic_jobs import build_store


def _build(state_dir):
    s = build_store(state_dir)
    add_dashboard_rows(s)
    return s


@pytest.fixture(scope="session")
def store_builder():
    return _build
