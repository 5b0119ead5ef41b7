"""Fixtures shared by every test folder.

``kafka_broker``: one real Kafka broker per test session (KRaft, loopback, free ports, tmp
data dir), used by the pipeline and forwarding-layer tests; each test makes its own topics.
Skips only when Java is missing; missing jars are fetched with pipeline/kafka/fetch.sh.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from pharos_testkit import free_port

from pharos_pipeline.broker import KafkaBroker
from pharos_pipeline.settings import REPO_ROOT, Settings


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory) -> KafkaBroker:
    if shutil.which("java") is None:
        pytest.skip("Java is not installed: the real Kafka broker needs Java 17")
    kafka_home = REPO_ROOT / "build" / "kafka"
    if not any((kafka_home / "libs").glob("kafka_2.13-*.jar")):
        subprocess.run(["bash", str(REPO_ROOT / "pipeline/kafka/fetch.sh"), str(kafka_home)], check=True)
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
