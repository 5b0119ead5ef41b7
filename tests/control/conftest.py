"""Fixtures of the control-loop tests: a real chDB store per module (migrated), row builders for
job history, and the real forwarding daemons / FUSE mount of tests/forwarder (forwarder_testkit)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from pharos_pipeline.settings import Settings
from pharos_pipeline.store import migrate, open_store

HERE = Path(__file__).resolve().parent
for d in (HERE, HERE.parent / "forwarder", HERE.parent / "systemdiag"):
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(Settings(state_dir=tmp_path_factory.mktemp("control")))
    migrate(s)
    yield s
    s.close()


@pytest.fixture(scope="session")
def fwd_binaries() -> None:
    """The release pharos-fwd and pharos-mount (built once if missing); skips without root,
    /dev/fuse."""
    if os.geteuid() != 0:
        pytest.skip("needs root (FUSE mount with allow_other)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse missing")
    from forwarder_testkit import BIN, build_binaries

    if not ((BIN / "pharos-fwd").exists() and (BIN / "pharos-mount").exists()):
        if shutil.which("cargo") is None:
            pytest.skip("pharos-fwd / pharos-mount not built and cargo missing")
        build_binaries()


@pytest.fixture
def cluster(fwd_binaries, tmp_path):
    from forwarder_testkit import Cluster

    c = Cluster(tmp_path)
    yield c
    c.close()
