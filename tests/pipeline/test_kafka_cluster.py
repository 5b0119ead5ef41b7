"""The embedded Kafka cluster (issue 15, item 4): N combined KRaft nodes on loopback with one
cluster id; the topics Pharos creates get replication factor 3 and min.insync.replicas 2; an
acks=all producer keeps writing with one node killed (SIGKILL), and the node comes back; two
pipelines of one consumer group share the requests topic's partitions.

The configuration tests need no broker; the others start a real 3-node cluster (module scope).
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from pharos_testkit import kafka_bootstrap, kafka_jars
from pipeline_testkit import make_batch, make_record, producer, wait_for

from pharos_analytics.liveness import detect_unreachable_brokers
from pharos_core.settings import Settings
from pharos_core.store import migrate, open_store
from pharos_pipeline.broker import BrokerError, KafkaBroker, KafkaCluster, embedded_kafka, ensure_topics
from pharos_pipeline.broker_health import BrokerProbe
from pharos_pipeline.ingest import Pipeline
from pharos_pipeline.kafka_config import node_addresses, topic_replication
from pharos_pipeline.stored import pipeline_stats


def test_one_bootstrap_address_stands_for_every_node():
    s = Settings(kafka_bootstrap="127.0.0.1:19092", kafka_brokers=3)
    assert s.kafka_bootstrap == "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096"
    # a child process gets the expanded list (stack.settings_env) and keeps it
    assert Settings(kafka_bootstrap=s.kafka_bootstrap, kafka_brokers=3).kafka_bootstrap == s.kafka_bootstrap
    assert node_addresses(s, 3) == [("127.0.0.1", 19092 + 2 * i, 19093 + 2 * i) for i in range(3)]
    assert Settings(kafka_bootstrap="h:1,h:2").kafka_bootstrap == "h:1,h:2"  # a site's list is left alone
    assert Settings().kafka_bootstrap == "127.0.0.1:19092"
    with pytest.raises(BrokerError, match="lists 2 servers for 3"):
        node_addresses(Settings(kafka_bootstrap="127.0.0.1:9000,127.0.0.1:9010"), 3)
    with pytest.raises(BrokerError, match="overlap"):
        node_addresses(Settings(kafka_bootstrap="127.0.0.1:9000,127.0.0.1:9001", kafka_brokers=2), 2)


def test_cluster_nodes_share_a_quorum_and_replicate(tmp_path):
    s = Settings(kafka_bootstrap="127.0.0.1:19092", kafka_brokers=3, state_dir=tmp_path)
    cluster = embedded_kafka(s)
    assert isinstance(cluster, KafkaCluster) and cluster.bootstrap == s.kafka_bootstrap
    props = [dict(line.split("=", 1) for line in n.server_properties().splitlines()) for n in cluster.nodes]
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert {p["controller.quorum.voters"] for p in props} == {"1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097"}
    for p in props:
        assert p["default.replication.factor"] == p["offsets.topic.replication.factor"] == "3"
        assert p["transaction.state.log.replication.factor"] == "3"
        assert p["min.insync.replicas"] == p["transaction.state.log.min.isr"] == "2"
    assert {n.cluster_id_file for n in cluster.nodes} == {tmp_path / "kafka" / "cluster.id"}
    assert [n.data_dir.name for n in cluster.nodes] == ["node1", "node2", "node3"]
    # one node stays the single broker of before: node 1, every factor 1, its own cluster id
    single = embedded_kafka(Settings(state_dir=tmp_path))
    assert isinstance(single, KafkaBroker) and "min.insync.replicas=1\n" in single.server_properties()
    assert "controller.quorum.voters=1@127.0.0.1:19093\n" in single.server_properties()


def test_topic_replication_follows_the_cluster_size():
    assert topic_replication(Settings()) == (1, {})
    assert topic_replication(Settings(kafka_brokers=2)) == (2, {})
    assert topic_replication(Settings(kafka_brokers=3)) == (3, {"min.insync.replicas": "2"})
    assert topic_replication(Settings(kafka_brokers=5)) == (3, {"min.insync.replicas": "2"})
    # a site's own cluster: kafka_brokers stays 1, the factor is set
    assert topic_replication(Settings(topic_replication_factor=3)) == (3, {"min.insync.replicas": "2"})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap(3),
        kafka_brokers=3,
        kafka_home=kafka_jars(),
        state_dir=tmp_path_factory.mktemp("kcluster"),
    )
    c = KafkaCluster(settings)
    c.start(timeout=240)
    yield c
    c.stop()


def _partitions(bootstrap: str, topic: str, timeout: float = 30) -> dict:
    """The topic's partitions once the answering broker's metadata shows each with a leader
    (a node learns of a new topic or leader a moment after the controller)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout
    while True:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if (parts and all(p.leader >= 0 for p in parts.values())) or time.monotonic() > deadline:
            return parts
        time.sleep(0.2)


def test_three_nodes_start_and_topics_get_rf3_min_isr2(cluster):
    s = cluster.settings
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    assert set(admin.list_topics(timeout=10).brokers) == {1, 2, 3}
    assert len({n.running_pid() for n in cluster.nodes}) == 3
    ids = {(n.log_dirs / "meta.properties").read_text().split("cluster.id=")[1].split()[0] for n in cluster.nodes}
    assert len(ids) == 1, "one cluster id on every node"
    topics = ensure_topics(s)
    assert topics[s.topic_requests] == s.topic_partitions
    for topic in topics:
        parts = _partitions(s.kafka_bootstrap, topic)
        assert all(sorted(p.replicas) == [1, 2, 3] for p in parts.values()), topic
        conf = admin.describe_configs([ConfigResource("topic", topic)])
        (fut,) = conf.values()
        assert fut.result()["min.insync.replicas"].value == "2", topic


def test_acks_all_writes_go_on_with_one_node_killed(cluster):
    """... and the server's broker probe names the killed node (anomaly broker_unreachable) until
    it is back."""
    s = cluster.settings.model_copy(update={"topic_requests": "kc.requests", "topic_partitions": 2})
    ensure_topics(s)
    probe = BrokerProbe(s.kafka_bootstrap)
    before = probe()
    assert [(b.node_id, b.listed, b.reachable) for b in before] == [(1, True, True), (2, True, True), (3, True, True)]
    assert detect_unreachable_brokers(before) == []
    leader = _partitions(s.kafka_bootstrap, s.topic_requests)[0].leader
    victim = cluster.index_of(leader)
    assert cluster.kill(victim) is not None and not cluster.nodes[victim].is_running()
    t_kill = time.monotonic()
    found = detect_unreachable_brokers(probe())
    assert [a.node for a in found] == [f"broker{leader}"], [a.to_dict() for a in found]
    assert found[0].kind == "broker_unreachable" and found[0].evidence["probe"]["error"]
    print(f"\n[kafka] broker{leader} killed: named after {time.monotonic() - t_kill:.1f} s: {found[0].evidence}")
    delivered, failed = [], []
    prod = Producer({"bootstrap.servers": s.kafka_bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(200):
        prod.produce(
            s.topic_requests,
            str(i).encode(),
            partition=0,  # the killed node led it
            on_delivery=lambda err, msg: (failed if err else delivered).append(msg),
        )
    assert prod.flush(90) == 0
    assert len(delivered) == 200 and not failed
    assert {m.partition() for m in delivered} == {0}
    new_leader = _partitions(s.kafka_bootstrap, s.topic_requests)[0].leader
    assert new_leader not in (leader, -1)
    cluster.restart(victim, timeout=180)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the restarted node catches up and rejoins the ISR
        if all(sorted(p.isrs) == [1, 2, 3] for p in _partitions(s.kafka_bootstrap, s.topic_requests).values()):
            break
        time.sleep(0.5)
    assert all(sorted(p.isrs) == [1, 2, 3] for p in _partitions(s.kafka_bootstrap, s.topic_requests).values())
    assert detect_unreachable_brokers(probe()) == []


class _AssignmentSeen(Pipeline):
    """A Pipeline that keeps the requests topic's partitions of its last assignment (set in
    the consumer's own thread: the test does not call the consumer from another)."""

    requests_partitions: frozenset[int] = frozenset()

    def _assigned(self, consumer, partitions) -> None:
        super()._assigned(consumer, partitions)
        self.requests_partitions = frozenset(
            tp.partition for tp in partitions if tp.topic == self.settings.topic_requests
        )


def test_two_pipelines_in_one_group_share_the_partitions(cluster, tmp_path):
    """Scale-out consumers: two pipelines of one group split pharos.io.requests' partitions
    between them and store every batch once (here two threads on one chDB store; across hosts,
    two processes against one ClickHouse server: chDB allows one process)."""
    s = cluster.settings.model_copy(
        update={
            "state_dir": tmp_path,
            "topic_requests": "kc2.io.requests",
            "topic_jobs": "kc2.jobs",
            "topic_deadletter": "kc2.io.deadletter",
            "topic_target_metrics": "kc2.target.metrics",
            "consumer_group": "kc2",
            "pipeline_max_wait_ms": 100,
        }
    )
    ensure_topics(s)
    store = open_store(s)
    migrate(store)
    stop = threading.Event()
    pipes = [_AssignmentSeen(s, store), _AssignmentSeen(s, store)]
    threads = [threading.Thread(target=p.run, args=(stop,), daemon=True) for p in pipes]
    for t in threads:
        t.start()
    try:

        def assigned() -> list[set[int]]:
            return [set(p.requests_partitions) for p in pipes]

        wait_for(lambda: all(assigned()) and set().union(*assigned()) == set(range(s.topic_partitions)), 90)
        parts = assigned()
        assert not parts[0] & parts[1], parts
        template = [make_record(k) for k in range(5)]
        prod = producer(s)
        n = 8
        for seq in range(10):
            for i in range(n):
                batch = make_batch(f"kc2-{i}", seq, template).SerializeToString()
                prod.produce(s.topic_requests, key=f"kc2-{i}".encode(), value=batch, partition=i % s.topic_partitions)
        assert prod.flush(60) == 0
        wait_for(lambda: sum(p.stats()["batches"] for p in pipes) >= 10 * n, 120, what="both pipelines to store")
        per_pipe = [p.stats()["batches"] for p in pipes]
        assert all(b > 0 for b in per_pipe) and sum(per_pipe) == 10 * n, per_pipe
        rows = store.query("SELECT count() AS n, uniqExact(producer_id, seq, record_index) AS u FROM io_requests")[0]
        assert int(rows["n"]) == int(rows["u"]) == 10 * n * len(template)
        assert pipeline_stats(store)["missing_batches"] == 0
        print(f"partitions per pipeline {parts}, batches per pipeline {per_pipe}")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for p in pipes:
            p.close()
        store.close()
