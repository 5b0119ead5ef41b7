"""Helpers shared by test folders (importable because tests/conftest.py puts tests/ on
sys.path): the real Alertmanager started on a free loopback port."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_alertmanager(d: Path, config_yaml: str) -> Iterator[str]:
    """Run the real Alertmanager (Debian prometheus-alertmanager) with ``config_yaml`` on a
    free loopback port, no clustering, storage in ``d``; yields its base URL; stops it
    (SIGTERM, then SIGKILL) on exit. Fails the test if it is missing or does not start."""
    if not Path(ALERTMANAGER).exists():
        pytest.fail(f"{ALERTMANAGER} missing: apt-get install prometheus-alertmanager")
    (d / "am.yml").write_text(config_yaml)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(d / "am.log", "wb")
    proc = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={d / 'am.yml'}", f"--storage.path={d / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"alertmanager did not start: {(d / 'am.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
