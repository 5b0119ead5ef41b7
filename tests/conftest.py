"""Fixtures shared by every test folder.

``kafka_broker``: one real Kafka broker per test session (KRaft, loopback, free ports, tmp
data dir), used by the pipeline and forwarding-layer tests; each test makes its own topics.
Skips only when Java is missing; missing jars are fetched with pipeline/kafka/fetch.sh.

Skips cannot hide in CI: under ``PHAROS_REQUIRE_ALL=1`` (``make test`` sets it unless told
otherwise, and CI runs ``make test``) every skipped test is reported as failed with its reason,
since CI's machine has root, FUSE, fio, Java and the Darshan corpus; the session always ends
with a one-line skip count.
"""

from __future__ import annotations

import os

import pytest
from pharos_testkit import free_port, kafka_jars

from pharos_pipeline.broker import KafkaBroker
from pharos_pipeline.settings import Settings


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory) -> KafkaBroker:
    kafka_home = kafka_jars()
    port, ctl = free_port(), free_port()
    while ctl == port:
        ctl = free_port()
    settings = Settings(
        kafka_bootstrap=f"127.0.0.1:{port}",
        kafka_home=kafka_home,
        state_dir=tmp_path_factory.mktemp("pharos-state"),
    )
    broker = KafkaBroker(settings, tmp_path_factory.mktemp("kafka"), controller_port=ctl)
    broker.start(timeout=90)
    yield broker
    broker.stop()


REQUIRE_ALL = os.environ.get("PHAROS_REQUIRE_ALL", "0") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under PHAROS_REQUIRE_ALL=1 a skip (marker, fixture or test body) becomes a failure."""
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE_ALL and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = (
            f"skipped under PHAROS_REQUIRE_ALL=1 (CI's setting, where every suite can run): {reason}\n"
            "Install what is missing (make setup) or run with PHAROS_REQUIRE_ALL=0 to allow skips."
        )
        rep.user_properties.append(("required_but_skipped", reason))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = len(terminalreporter.stats.get("skipped", []))
    converted = sum(
        1
        for rep in terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])
        if any(k == "required_but_skipped" for k, _ in getattr(rep, "user_properties", []))
    )
    mode = "PHAROS_REQUIRE_ALL=1: skips fail" if REQUIRE_ALL else "PHAROS_REQUIRE_ALL=0: skips allowed"
    terminalreporter.write_line(
        f"pharos skip check ({mode}): {skipped} skipped, {converted} required test(s) skipped and failed"
    )
