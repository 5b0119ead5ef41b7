"""A producer started before its topic exists loses nothing (issue 25: on the cluster rig, agents
and forwarding daemons start while the brokers come up and before `pharos serve` creates the
topics; librdkafka's default fails queued messages once a topic has been missing for 30 s
(``topic.metadata.propagation.max.ms``), which lost 126 batches at one rig's start-up).

A real pharos-fwd (its heartbeats every 2 s go through the shared sink, pharos_wire::sink)
starts on the real broker with topics that do not exist yet; they are created 35 s later. Every
batch it made meanwhile must arrive: sequence numbers 0, 1, 2, ... without a gap, and the daemon
counts no delivery failure."""

from __future__ import annotations

import time
import uuid

import pytest
from forwarder_testkit import consume

from pharos_core.settings import Settings
from pharos_pipeline.broker import ensure_topics
from pharos_pipeline.wire import IoBatch

LATE_S = 35.0  # more than librdkafka's default 30 s


@pytest.mark.timeout(300)
def test_batches_made_before_the_topic_exists_arrive_when_it_does(cluster, kafka_broker, tmp_path):
    tag = uuid.uuid4().hex[:8]
    s = Settings(
        kafka_bootstrap=kafka_broker.bootstrap,
        kafka_home=kafka_broker.settings.kafka_home,
        state_dir=tmp_path / "state",
        topic_requests=f"late{tag}.io.requests",
        topic_jobs=f"late{tag}.jobs",
        topic_deadletter=f"late{tag}.io.deadletter",
        topic_target_metrics=f"late{tag}.target.metrics",
        topic_partitions=1,
    )
    d = cluster.start_daemon(
        "fwd0", "--topic", s.topic_requests, "--metrics-topic", s.topic_target_metrics, kafka=s.kafka_bootstrap
    )
    time.sleep(LATE_S)
    ensure_topics(s)
    made = d.status()["records"]
    got = consume(s.kafka_bootstrap, s.topic_requests, IoBatch.FromString, lambda out: len(out) >= 15, timeout=60)
    seqs = [b.seq for _, b in got]
    after = d.status()["records"]
    print(f"\n[late topic] topic created after {LATE_S:.0f} s: {len(seqs)} batches read, seq {seqs[:3]}..{seqs[-3:]}")
    assert seqs[:15] == list(range(15)), f"batches lost before the topic existed: {seqs}"
    assert (made["delivery_failures"], after["delivery_failures"]) == (0, 0), after
