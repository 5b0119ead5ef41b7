"""No port races in the fixtures (issue 26, item 12, Kafka and API parts; Slurm's in
tests/live/test_slurm.py).

A fixture that picks a port with ``free_port()`` and lets a server bind it later loses when
another process takes the port in between (the session's other servers, a parallel run). Servers
that can bind port 0 do (uvicorn in ``served``: the socket is bound here and handed over); Kafka
cannot report a KRaft controller port it chose itself, so its fixture starts again on new ports
when the JVM reports the port taken (``start_on_free_ports``). Both are shown here with the race
forced: the port is taken after it was chosen and checked, before the server binds it.
"""

from __future__ import annotations

import contextlib
import socket

import httpx
import pharos_testkit
import pytest
from fastapi import FastAPI
from pharos_testkit import kafka_bootstrap, served, start_kafka_broker

import pharos_pipeline.broker as broker_mod
from pharos_core.settings import Settings
from pharos_pipeline.broker import BrokerError, KafkaBroker


@contextlib.contextmanager
def taken(port: int):
    """Another process's listener on 127.0.0.1:``port``."""
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    try:
        yield
    finally:
        s.close()


def test_kafka_broker_starts_again_on_new_ports_when_the_jvm_finds_its_port_taken(tmp_path, monkeypatch):
    first = kafka_bootstrap()
    port = first.rsplit(":", 1)[1]
    chosen = []

    def bootstrap():
        chosen.append(first if not chosen else kafka_bootstrap())
        return chosen[-1]

    # the port was free when checked; another process binds the controller port before the JVM does
    monkeypatch.setattr(broker_mod, "port_is_free", lambda h, p: True)
    dirs = iter(tmp_path / f"kafka{i}" for i in range(10))
    with taken(int(port) + 1):
        # what the fixture did before: one start on the chosen ports, which fails
        before = KafkaBroker(
            Settings(kafka_bootstrap=first, kafka_home=pharos_testkit.kafka_jars(), state_dir=tmp_path), next(dirs)
        )
        with pytest.raises(BrokerError, match=r"already in use|BindException"):
            before.start(timeout=90)
        broker = start_kafka_broker(lambda: next(dirs), tmp_path, bootstrap=bootstrap)
    try:
        assert len(chosen) == 2 and broker.bootstrap == chosen[1] != first
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
        assert md.brokers
    finally:
        broker.stop()


def test_served_binds_port_zero_so_a_taken_port_cannot_race_it(monkeypatch):
    app = FastAPI()
    app.get("/ping")(lambda: {"ok": True})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        monkeypatch.setattr(pharos_testkit, "free_port", lambda: busy)  # the racy pick would collide
        with served(app) as url:
            assert int(url.rsplit(":", 1)[1]) != busy
            assert httpx.get(url + "/ping", timeout=5).json() == {"ok": True}
