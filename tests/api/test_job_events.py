"""POST /v1/jobs/{id}/events (what the Slurm plugin calls at its job prolog and epilog) on the
real Kafka broker: the event is on the jobs topic as a JobEvent; bad bodies are 422; an
unreachable broker is 503 with the reason."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer
from fastapi.testclient import TestClient
from pharos_testkit import free_port, topic_settings

from pharos_api.app import create_app
from pharos_core.settings import Settings
from pharos_pipeline.wire import JobEvent, io_pb2


def read_events(settings, n: int, timeout_s: float = 30) -> list:
    c = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"ev-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([settings.topic_jobs])
    out: list = []
    try:
        for _ in range(int(timeout_s / 0.5)):
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                ev = JobEvent()
                ev.ParseFromString(msg.value())
                out.append((msg.key().decode(), ev))
            if len(out) >= n:
                break
    finally:
        c.close()
    return out


def test_job_events_reach_the_jobs_topic(store, kafka_broker, tmp_path):
    settings = topic_settings(kafka_broker, tmp_path, api_auth="none")
    with TestClient(create_app(store, settings)) as client:
        start = {"kind": "start", "name": "cfd", "user": "alice", "host": "cn[1-2]", "ranks": 64}
        r = client.post("/v1/jobs/4242/events", json=start)
        assert r.status_code == 202 and r.json()["delivered"], r.text
        r = client.post("/v1/jobs/4242/events", json={"kind": "end", "exit_code": 3, "time_ns": 5})
        assert r.status_code == 202 and r.json()["time_ns"] == 5, r.text
        for bad in ({"kind": "middle"}, {"kind": "start", "ranks": -1}, {"kind": "end", "exit_code": 2**40}):
            assert client.post("/v1/jobs/4242/events", json=bad).status_code == 422, bad
        assert client.post("/v1/jobs/..%2Fx/events", json=start).status_code in (404, 422)
    events = read_events(settings, 2)
    assert [k for k, _ in events] == ["4242", "4242"]
    (_, s), (_, e) = events
    assert s.kind == io_pb2.JobEvent.KIND_START and (s.name, s.user, s.host, s.ranks) == ("cfd", "alice", "cn[1-2]", 64)
    assert e.kind == io_pb2.JobEvent.KIND_END and e.exit_code == 3 and e.time_ns == 5


def test_job_event_without_kafka_is_503(store, tmp_path):
    settings = Settings(state_dir=tmp_path, kafka_bootstrap=f"127.0.0.1:{free_port()}", api_auth="none")
    with TestClient(create_app(store, settings)) as client:
        r = client.post("/v1/jobs/7/events", json={"kind": "start", "name": "x"})
    assert r.status_code == 503 and "Kafka not reachable" in r.json()["detail"], r.text
