"""``GET /metrics`` of the API (pharos_api.routers.metrics; self-monitoring, docs/dashboards.md) on
a real chDB store with the synthetic jobs: the families are there in the Prometheus text format
(parsed by prometheus_client's parser), and they move: a request is counted under its route
template and status, an insert under its table, a detection cycle under its loop. Who may read
it is in test_auth.py's matrix (operator and admin)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from pharos_testkit import parse_metrics, sample

from pharos_analytics.alerts import DetectionLoop
from pharos_analytics.periodic import PeriodicLoop


def metrics(client) -> dict:
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse_metrics(r.text, r.headers["content-type"])


def test_families_are_there(client):
    m = metrics(client)
    (build,) = m["pharos_build_info"]
    assert build[0]["service"] == "server" and build[0]["version"] and build[1] == 1
    # the store was written while the synthetic jobs were loaded
    assert sample(m, "pharos_store_insert_seconds_count", table="io_requests") > 0
    assert "process_cpu_seconds_total" in m  # prometheus_client's process collector
    # no pipeline in this app: its families are absent, not zero
    assert not [n for n in m if n.startswith("pharos_pipeline_")]


def test_a_request_is_counted_under_its_route_template_and_status(client):
    route = {"method": "GET", "route": "/v1/jobs/{job_id}", "status": "200"}
    missing = {"method": "GET", "route": "/v1/jobs/{job_id}", "status": "404"}
    before = metrics(client)
    assert client.get("/v1/jobs/mix").status_code == 200
    assert client.get("/v1/jobs/mix").status_code == 200
    assert client.get("/v1/jobs/no-such-job").status_code == 404
    assert client.get("/no/such/route").status_code == 404
    after = metrics(client)
    name = "pharos_api_request_duration_seconds_count"
    assert sample(after, name, **route) - sample(before, name, **route) == 2
    assert sample(after, name, **missing) - sample(before, name, **missing) == 1
    unmatched = {"route": "(unmatched)", "status": "404"}
    assert sample(after, name, **unmatched) - sample(before, name, **unmatched) == 1
    assert sample(after, "pharos_api_request_duration_seconds_sum", **route) > sample(
        before, "pharos_api_request_duration_seconds_sum", **route
    )
    # concrete paths never become labels
    assert not [lab for lab, _ in after[name] if "mix" in lab["route"] or "no-such" in lab["route"]]


def test_inserts_and_detection_cycles_move(client, store):
    before = metrics(client)
    loop = DetectionLoop(store)
    loop.run_once()
    after = metrics(client)
    name = "pharos_loop_cycle_seconds_count"
    assert sample(after, name, loop="detection") - sample(before, name, loop="detection") == 1 == loop.cycles
    assert sample(after, "pharos_loop_cycle_seconds_sum", loop="detection") >= loop.last["duration_s"] - 0.001
    store.insert_rows("job_events", [{"job_id": "metrics-probe", "kind": "start", "time": "1700000000.0"}])
    again = metrics(client)
    ins = "pharos_store_insert_seconds_count"
    assert sample(again, ins, table="job_events") - sample(after, ins, table="job_events") == 1


class _Failing(PeriodicLoop):
    cycle_name = "probe"

    def __init__(self) -> None:
        super().__init__(0.05, logging.getLogger("probe"))
        self.done = threading.Event()
        self.calls = 0

    def run_once(self) -> dict:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("injected")
        t0 = time.monotonic()
        self.last = {"duration_s": self.cycle_done(t0)}
        self.done.set()
        return self.last


@pytest.mark.timeout(30)
def test_a_failed_cycle_is_counted_and_the_loop_goes_on(client):
    loop = _Failing().start()
    try:
        assert loop.done.wait(10)
    finally:
        loop.stop()
    m = metrics(client)
    assert sample(m, "pharos_loop_cycle_failures_total", loop="probe") == 1
    assert sample(m, "pharos_loop_cycle_seconds_count", loop="probe") == loop.cycles >= 1
