"""Silent forwarding nodes (issue 25: "detection names it"): a daemon whose batches stopped while its
peers' go on is an active ``forwarder_silent`` anomaly; a restarted daemon, or every daemon silent
at once (Kafka or the pipeline down), is not. Real chDB store, io_batches rows as the pipeline
stores them. The live check is bench/cluster.py --faults on the rig."""

from __future__ import annotations

import time

import pytest

from pharos_analytics.alerts import ALERTNAMES, Condition
from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.liveness import SILENT_KIND, detect_silent_forwarders
from pharos_core.settings import Settings
from pharos_core.store import migrate, ns_to_datetime64, open_store

S = 1_000_000_000
NOW = time.time_ns()


@pytest.fixture
def store(tmp_path):
    st = open_store(Settings(state_dir=tmp_path))
    migrate(st)
    yield st
    st.close()


def beats(producer: str, host: str, last_age_s: float, n: int = 20, every_s: float = 2.0) -> list[dict]:
    """``n`` heartbeat batches of ``producer`` on ``host``, every ``every_s``, the newest ``last_age_s`` old."""
    return [
        {
            "producer_id": producer,
            "seq": i,
            "host": host,
            "records": 0,
            "created": ns_to_datetime64(NOW - int((last_age_s + (n - 1 - i) * every_s) * S)),
        }
        for i in range(n)
    ]


def test_a_silent_daemon_is_named(store):
    store.insert_rows(
        "io_batches",
        beats("pharos-fwd-fwd0-11-aa", "fwd0", 30)
        + beats("pharos-fwd-fwd1-12-bb", "fwd1", 1)
        + beats("x:agent:5:1", "cn0", 1),
    )
    found = detect_silent_forwarders(store, DiagnosisConfig(), now_ns=NOW)
    assert [(a.kind, a.node, a.active) for a in found] == [(SILENT_KIND, "fwd0", True)]
    a = found[0]
    assert a.rel_service == pytest.approx(3.0, abs=0.01) and a.evidence["silence"]["peers_heard"] == ["fwd1"]
    cond = Condition.from_anomaly(a)
    assert cond.labels["alertname"] == ALERTNAMES[SILENT_KIND] and cond.labels["node"] == "fwd0"
    assert "silent" in cond.annotations["summary"]


def test_restarted_daemon_and_threshold(store):
    # fwd0's old producer went silent 100 s ago, its new one is alive; fwd1 is 8 s behind (< 10 s)
    store.insert_rows(
        "io_batches",
        beats("pharos-fwd-fwd0-11-aa", "fwd0", 100)
        + beats("pharos-fwd-fwd0-99-cc", "fwd0", 1)
        + beats("pharos-fwd-fwd1-12-bb", "fwd1", 8),
    )
    assert detect_silent_forwarders(store, DiagnosisConfig(), now_ns=NOW) == []
    assert [a.node for a in detect_silent_forwarders(store, DiagnosisConfig(forwarder_silence_s=5), now_ns=NOW)] == [
        "fwd1"
    ]


def test_every_daemon_silent_is_not_one_node(store):
    store.insert_rows(
        "io_batches", beats("pharos-fwd-fwd0-11-aa", "fwd0", 40) + beats("pharos-fwd-fwd1-12-bb", "fwd1", 40)
    )
    assert detect_silent_forwarders(store, DiagnosisConfig(), now_ns=NOW) == []


def test_unreachable_broker_is_named_only_while_another_answers():
    """A broker the probe cannot reach is an active ``broker_unreachable`` anomaly and a
    PharosBrokerUnreachable alert, with the metadata's view as evidence; when no broker answers
    (the server itself is cut off from Kafka) nothing is named."""
    from pharos_analytics.liveness import BROKER_KIND, detect_unreachable_brokers
    from pharos_pipeline.broker_health import BrokerState

    states = [
        BrokerState(1, "10.0.0.1:9092", listed=False, reachable=False, error="timed out"),
        BrokerState(2, "10.0.0.2:9092", listed=True, reachable=True, under_replicated=3),
        BrokerState(3, "10.0.0.3:9092", listed=True, reachable=True, under_replicated=3, offline=1),
    ]
    (a,) = detect_unreachable_brokers(states, now_ns=NOW)
    assert (a.kind, a.node, a.node_type, a.active, a.severity) == (BROKER_KIND, "broker1", "broker", True, "critical")
    ev = a.evidence["probe"]
    assert ev["under_replicated_partitions"] == 6 and ev["offline_partitions"] == 1
    assert ev["brokers_reachable"] == ["broker2", "broker3"] and not ev["listed"]
    cond = Condition.from_anomaly(a)
    assert cond.labels["alertname"] == ALERTNAMES[BROKER_KIND] == "PharosBrokerUnreachable"
    assert "broker1" in cond.annotations["summary"]
    down = [BrokerState(i, f"10.0.0.{i}:9092", listed=True, reachable=False, error="refused") for i in (1, 2)]
    assert detect_unreachable_brokers(down) == []
