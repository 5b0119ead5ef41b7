"""Fixtures of the deployment tests (helpers in deploy_testkit.py)."""

from __future__ import annotations

import pytest
from deploy_testkit import render_compose


@pytest.fixture(scope="session")
def compose() -> dict:
    """docker-compose.yml as ``docker-compose config`` renders it with the required variables set."""
    return render_compose()
