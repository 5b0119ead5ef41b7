"""The Kafka broker of docker-compose.yml, for real: its KAFKA_* variables turned into
server.properties as the apache/kafka image does, run by the same Kafka version from the pinned
jars (pipeline/kafka/pom.xml) on loopback ports. A host's client at the EXTERNAL listener is told
the EXTERNAL address (never the containers' kafka:9092), `pharos topics` creates the topics
through it, a record produced there reaches a consumer on the stack's own listener, and a
replication factor the cluster cannot hold is refused."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid

import pytest
from deploy_testkit import REPO, render_compose
from pharos_testkit import free_port

from pharos_core.settings import Settings
from pharos_pipeline.broker import KafkaBroker

pytestmark = pytest.mark.e2e

#: apache/kafka's docker/resources/common-scripts/kafka-propertiesSpec.json: KAFKA_* variables that
#: are not broker properties (its list, spelling included).
IMAGE_EXCLUDES = {
    "KAFKA_VERSION",
    "KAFKA_HEAP_OPT",
    "KAFKA_LOG4J_OPTS",
    "KAFKA_OPTS",
    "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "KAFKA_GC_LOG_OPTS",
    "KAFKA_LOG4J_ROOT_LOGLEVEL",
    "KAFKA_LOG4J_LOGGERS",
    "KAFKA_TOOLS_LOG4J_LOGLEVEL",
}


def image_property(var: str) -> str:
    """The property the apache/kafka image makes of ``KAFKA_<NAME>`` (ub.go ConvertKey): prefix
    dropped, a single _ between two other characters becomes ., ___ becomes -, __ becomes _,
    lower case."""
    key = re.sub(r"[^_]_[^_]", lambda m: m.group(0).replace("_", "."), var[len("KAFKA_") :])
    return key.replace("___", "-").replace("__", "_").lower()


def test_image_property_rule():
    assert image_property("KAFKA_LOG_DIRS") == "log.dirs"
    assert image_property("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP") == "listener.security.protocol.map"
    assert image_property("KAFKA_LISTENER_NAME_EXTERNAL___X__Y") == "listener.name.external-x_y"


class ComposeBroker(KafkaBroker):
    """The embedded broker's launcher with the compose file's properties instead of its own."""

    def __init__(self, settings: Settings, data_dir, properties: dict[str, str], controller_port: int) -> None:
        super().__init__(settings, data_dir, controller_port=controller_port)
        self.properties = properties

    def server_properties(self) -> str:
        return "".join(f"{k}={v}\n" for k, v in self.properties.items())


@pytest.fixture(scope="module")
def compose_kafka(tmp_path_factory):
    if shutil.which("java") is None:
        pytest.skip("Java is not installed: the real Kafka broker needs Java 17")
    kafka_home = REPO / "build" / "kafka"
    if not any((kafka_home / "libs").glob("kafka_2.13-*.jar")):
        subprocess.run(["bash", str(REPO / "pipeline/kafka/fetch.sh"), str(kafka_home)], check=True)
    svc = render_compose(KAFKA_EXTERNAL_HOST="127.0.0.1")["services"]["kafka"]
    env = {k: str(v) for k, v in svc["environment"].items()}
    image_tag = svc["image"].rpartition(":")[2]
    assert list((kafka_home / "libs").glob(f"kafka_2.13-{image_tag}.jar")), "the image and the jars differ"
    ports = {9092: free_port(), 9093: free_port(), 9094: free_port()}
    while len(set(ports.values())) < 3:
        ports[9093], ports[9094] = free_port(), free_port()
    props = {}
    for var, value in env.items():
        if var.startswith("KAFKA_") and var not in IMAGE_EXCLUDES:
            for port, mine in ports.items():  # container addresses -> loopback ports of this test
                value = re.sub(rf"(kafka|127\.0\.0\.1|^|(?<=//)):{port}\b", f"127.0.0.1:{mine}", value)
                value = value.replace(f"://:{port}", f"://127.0.0.1:{mine}")
            assert not re.search(r":909[234]\b", value), f"{var}={value}: an address this test does not map"
            props[image_property(var)] = value
    assert props["log.dirs"] == "/var/lib/kafka/data"
    assert "kafka-data:/var/lib/kafka/data" in " ".join(str(v) for v in svc["volumes"]) or any(
        isinstance(v, dict) and v.get("target") == "/var/lib/kafka/data" for v in svc["volumes"]
    )
    data = tmp_path_factory.mktemp("compose-kafka")
    settings = Settings(
        kafka_bootstrap=f"127.0.0.1:{ports[9094]}",  # readiness through the EXTERNAL listener
        kafka_home=kafka_home,
        state_dir=tmp_path_factory.mktemp("state"),
    )
    broker = ComposeBroker(settings, data, props, controller_port=ports[9093])
    props["log.dirs"] = str(broker.log_dirs)
    (data / "cluster.id").write_text(env["CLUSTER_ID"] + "\n")  # formatted with the compose's id, as the image
    broker.start(timeout=120)
    try:
        yield {"external": f"127.0.0.1:{ports[9094]}", "internal": f"127.0.0.1:{ports[9092]}", "data": data}
    finally:
        broker.stop()


def pharos(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PHAROS_")}
    base.update(PHAROS_CONFIG="/nonexistent/pharos.toml", **env)
    return subprocess.run(
        [sys.executable, "-m", "pharos_api.cli", *args], env=base, capture_output=True, text=True, timeout=120
    )


def test_hosts_and_containers_each_get_their_listener(compose_kafka):
    from confluent_kafka.admin import AdminClient

    for listener in ("external", "internal"):
        md = AdminClient({"bootstrap.servers": compose_kafka[listener]}).list_topics(timeout=20)
        assert [f"{b.host}:{b.port}" for b in md.brokers.values()] == [compose_kafka[listener]], listener
    assert (compose_kafka["data"] / "logs" / "meta.properties").read_text().count("cluster.id=LENtBBNIRhKZfxsbVFjpyA")


def test_pharos_topics_through_the_external_listener(compose_kafka):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    res = pharos("topics", PHAROS_KAFKA_BOOTSTRAP=compose_kafka["external"])
    assert res.returncode == 0, res.stdout + res.stderr
    s = Settings()
    want = {s.topic_requests: s.topic_partitions, s.topic_jobs: 1, s.topic_deadletter: 1, s.topic_target_metrics: 1}
    for topic, n in want.items():
        assert re.search(rf"^{re.escape(topic)}\s+{n} partitions$", res.stdout, re.M), res.stdout
    md = AdminClient({"bootstrap.servers": compose_kafka["internal"]}).list_topics(timeout=20)
    assert {t: len(md.topics[t].partitions) for t in want} == want
    again = pharos("topics", PHAROS_KAFKA_BOOTSTRAP=compose_kafka["external"])  # idempotent
    assert again.returncode == 0 and again.stdout == res.stdout

    # a host's producer (agent, daemon) at EXTERNAL -> the pipeline's consumer at kafka:9092
    value = uuid.uuid4().bytes
    p = Producer({"bootstrap.servers": compose_kafka["external"], "acks": "all"})
    p.produce(s.topic_jobs, value=value, key=b"host-1")
    assert p.flush(20) == 0
    c = Consumer(
        {
            "bootstrap.servers": compose_kafka["internal"],
            "group.id": "compose-test",
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([s.topic_jobs])
    try:
        got = None
        for _ in range(30):
            m = c.poll(1.0)
            if m is not None and m.error() is None:
                got = m.value()
                break
        assert got == value
    finally:
        c.close()


def test_a_replication_factor_beyond_the_brokers_is_refused(compose_kafka):
    res = pharos(
        "topics",
        PHAROS_KAFKA_BOOTSTRAP=compose_kafka["external"],
        PHAROS_TOPIC_REPLICATION_FACTOR="3",
        PHAROS_TOPIC_JOBS="pharos.jobs.rf3",
    )
    assert res.returncode == 1
    assert "replication factor 3" in res.stderr and "pharos.jobs.rf3" not in res.stdout, res.stdout + res.stderr
