"""Real Darshan logs (the Darshan project's test corpus, /work/shared/darshan-logs or
PHAROS_DARSHAN_LOGS) and helpers for the importer tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

LOGS = Path(os.environ.get("PHAROS_DARSHAN_LOGS", "/work/shared/darshan-logs"))


def log(rel: str) -> Path:
    p = LOGS / rel
    if not p.exists():
        pytest.skip(f"Darshan corpus not found: {p}")
    return p


def logs(folder: str) -> list[Path]:
    found = sorted((LOGS / folder).glob("*.darshan"))
    if not found:
        pytest.skip(f"Darshan corpus not found: {LOGS / folder}")
    return found


def count(store, sql, **params) -> int:
    return int(store.query(sql, params)[0]["n"])
