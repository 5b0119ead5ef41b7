"""Fixtures of the control-loop tests: the real forwarding daemons / FUSE mount of tests/forwarder
(forwarder_testkit). ``store`` (a real migrated chDB store per module) is tests/conftest.py's; row
builders for job history live in control_rows."""

from __future__ import annotations

import os
import shutil

import pytest


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
