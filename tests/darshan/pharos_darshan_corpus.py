"""Real Darshan logs (the Darshan project's test corpus, ``../shared/darshan-logs`` beside the
repository or PHAROS_DARSHAN_LOGS) and helpers for the importer tests."""

from __future__ import annotations

from pathlib import Path

from pharos_testkit import DARSHAN_LOGS as LOGS
from pharos_testkit import need_darshan


def log(rel: str) -> Path:
    return need_darshan(LOGS / rel)


def logs(folder: str) -> list[Path]:
    found = sorted(need_darshan(LOGS / folder).glob("*.darshan"))
    assert found, f"no *.darshan logs in {LOGS / folder}"
    return found


def count(store, sql, **params) -> int:
    return int(store.query(sql, params)[0]["n"])
