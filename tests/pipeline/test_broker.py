"""The Kafka launcher: clear errors, pid file, idempotent topics (on the session broker)."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from pharos_pipeline.broker import BrokerError, KafkaBroker, ensure_topics
from pharos_pipeline.kafka_config import new_cluster_id


def test_running_broker_is_seen_through_its_pid_file(kafka_broker):
    other = KafkaBroker(kafka_broker.settings, kafka_broker.data_dir, controller_port=kafka_broker.controller_port)
    assert other.is_running() and other.running_pid() == int(kafka_broker.pid_file.read_text())
    assert "node.id=1" in kafka_broker.properties_file.read_text()
    assert (kafka_broker.data_dir / "cluster.id").read_text().strip()


def test_port_in_use_is_a_clear_error(kafka_broker, tmp_path):
    other = KafkaBroker(kafka_broker.settings, tmp_path / "k2", controller_port=kafka_broker.controller_port)
    with pytest.raises(BrokerError, match="already in use"):
        other.start(timeout=5)
    assert not other.pid_file.exists()


def test_missing_jars_say_run_make_kafka(kafka_broker, tmp_path):
    settings = kafka_broker.settings.model_copy(update={"kafka_home": tmp_path / "nojars"})
    with pytest.raises(BrokerError, match="make kafka"):
        KafkaBroker(settings, tmp_path / "k3").start(timeout=5)


def test_ensure_topics_is_idempotent(pipeline_settings):
    s = pipeline_settings  # the fixture created the topics once already
    want = {s.topic_requests: s.topic_partitions, s.topic_jobs: 1, s.topic_deadletter: 1, s.topic_target_metrics: 1}
    assert ensure_topics(s) == want
    assert ensure_topics(s) == want
    md = AdminClient({"bootstrap.servers": s.kafka_bootstrap}).list_topics(timeout=10)
    assert {t: len(md.topics[t].partitions) for t in want} == want


def test_cluster_ids_never_begin_with_a_dash():
    # 1 in 64 random base64url ids begins with "-", which Kafka's tools read as an option
    assert not any(new_cluster_id().startswith("-") for _ in range(2000))


def test_storage_formats_with_a_cluster_id_beginning_with_a_dash(kafka_broker, tmp_path):
    """An id of an older state file may begin with "-": the real kafka-storage tool formats it."""
    b = KafkaBroker(kafka_broker.settings, tmp_path / "k4", controller_port=kafka_broker.controller_port)
    b.data_dir.mkdir(parents=True)
    b.properties_file.write_text(b.server_properties())
    (b.data_dir / "cluster.id").write_text("-8Hz1fTZRkqlZvmEcw3Q2w\n")
    b._format_storage()
    assert "cluster.id=-8Hz1fTZRkqlZvmEcw3Q2w" in (b.log_dirs / "meta.properties").read_text()
