"""Job coverage by the agents' heartbeats (pharos_analytics.coverage) on synthetic io_batches rows
in real chDB: a job that ran while the agent on its host was dead, missing, hung or restarted
is incomplete, with the gap where it was; one the agents watched all along is complete; jobs on
hosts that never had an agent (or an agent without heartbeats), and Darshan imports, are not
checked. Also the producers' liveness list, the summary, the API, `pharos job` and the report."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from pharos_analytics.coverage import gap_lines, job_coverage, producer_kind, producer_pid, producers
from pharos_analytics.summary import job_summary
from pharos_api.app import create_app
from pharos_api.cli import app as cli_app
from pharos_api.report import render_report
from pharos_core.settings import Settings
from pharos_core.store import migrate, ns_to_datetime64, open_store

S = 1_000_000_000
#: Synthetic time zero, far enough in the past that every job has ended "now".
T0 = (time.time_ns() // S - 600) * S
W = 6.0  # silence_s: 3 missed heartbeats of 2 s
A, B = "cn1:agent:100:1", "cn1:agent:200:2"  # cn1's agent, killed at +3 s; its restart at +30 s
C = "cn2:agent:300:3"  # cn2's agent, first started at +10 s
D = "cn3:agent:400:4"  # cn3's agent, hung from +10 s to +20 s
E = "cn4:agent:500:5"  # cn4's agent, a 5 s pause (within the allowance)
OLD = "cn5:agent:600:6"  # cn5's agent of an older version: records only, no heartbeats


def at(s: float) -> int:
    return T0 + int(s * S)


def batches(producer: str, host: str, times: list[float], records: int = 0) -> list[dict]:
    return [
        {"producer_id": producer, "seq": i, "host": host, "records": records, "created": ns_to_datetime64(at(t))}
        for i, t in enumerate(times)
    ]


def beats(start: float, end: float, every: float = 2.0) -> list[float]:
    n = int((end - start) / every) + 1
    return [start + i * every for i in range(n)]


def event(job: str, kind: str, t: float, host: str = "cn1") -> dict:
    return {
        "job_id": job,
        "kind": kind,
        "time": ns_to_datetime64(at(t)),
        "name": job,
        "command": ["fio"],
        "user": "u",
        "ranks": 2,
        "host": host if kind == "start" else "",
        "exit_code": 0,
        "cgroup": "",
    }


def job(name: str, start: float, end: float | None, host: str = "cn1") -> list[dict]:
    return [event(name, "start", start, host)] + ([event(name, "end", end, host)] if end is not None else [])


def record(job_id: str, t: float, layer: str = "client", host: str = "cn1", compute_node: str = "") -> dict:
    return {
        "start": ns_to_datetime64(at(t)),
        "end": ns_to_datetime64(at(t) + 1000),
        "duration_ns": 1000,
        "layer": layer,
        "host": host,
        "job_id": job_id,
        "rank": 0,
        "op": "pwrite",
        "file_type": "regular",
        "path": "/scratch/f",
        "size": 4096,
        "result": 4096,
        "count": 1,
        "bytes": 4096,
        "compute_node": compute_node,
        "producer_id": "x",
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(Settings(state_dir=tmp_path_factory.mktemp("coverage")))
    migrate(s)
    rows = (
        batches(A, "cn1", beats(-60, 0))  # heartbeats before the job
        + [
            {**r, "seq": r["seq"] + 100, "records": 50}
            for r in batches(A, "cn1", [0.2 * k for k in range(1, 15)])  # data while the job writes
        ]
        + batches(B, "cn1", beats(30, 60))
        + batches(C, "cn2", beats(10, 60))
        + batches(D, "cn3", beats(-20, 10) + beats(20, 60))
        + batches(E, "cn4", beats(-20, 10) + beats(15, 60))
        + batches(OLD, "cn5", [0, 20, 40], records=10)
        + batches("pharos-fwd-fwd0-700-abc", "fwd0", beats(-60, 60))  # a daemon: not an agent
    )
    s.insert_rows("io_batches", rows)
    s.insert_rows(
        "job_events",
        job("killed", 0, 8)  # the agent died at +2.8 s, back at +30 s
        + job("through-restart", 1, 40)
        + job("after-restart", 35, 45)
        + job("before-agent", 5, 20, host="cn2")
        + job("no-agent", 5, 20, host="cn9")
        + job("hung", 5, 25, host="cn3")
        + job("short-pause", 5, 25, host="cn4")
        + job("old-agent", 5, 25, host="cn5")
        + job("running", 50, None)
        + job("darshan", 0, 8)
        + job("cn2-records", 5, 20, host="login1")  # started elsewhere, its records name cn2
        + job("via-mount", 0, 8, host=""),  # no host in the event: the forwarder records name cn1
    )
    s.insert_rows(
        "io_requests",
        [
            record("killed", 1),
            record("cn2-records", 6, host="cn2"),
            record("via-mount", 1, layer="forwarder", host="fwd0", compute_node="cn1"),
        ],
    )
    s.insert_rows(
        "darshan_logs",
        [{"log_sha256": "ab" * 32, "log_id": "darshan:abab", "job_id": "darshan", "file_name": "x.darshan"}],
    )
    yield s
    s.close()


def cov(store, job_id: str, now: float = 500.0):
    return job_coverage(store, job_id, silence_s=W, now_ns=at(now))


def span(g) -> tuple[float, float]:
    return round((g.start.timestamp() * S - T0) / S, 1), round((g.end.timestamp() * S - T0) / S, 1)


def test_agent_killed_during_the_job_leaves_a_gap_to_the_job_end(store):
    c = cov(store, "killed")
    assert not c.complete and c.checked == "agents" and c.hosts == ["cn1"]
    (g,) = c.gaps
    assert (g.host, g.producer, g.next_producer) == ("cn1", A, B)
    assert span(g) == (2.8, 8.0)  # from the dead agent's last batch to the job's end


def test_restart_during_the_job_ends_the_gap(store):
    (g,) = cov(store, "through-restart").gaps
    assert span(g) == (2.8, 30.0) and (g.producer, g.next_producer) == (A, B)


def test_job_after_the_restart_is_complete(store):
    c = cov(store, "after-restart")
    assert c.complete and c.gaps == [] and c.hosts == ["cn1"]


def test_no_agent_yet_when_the_job_started(store):
    (g,) = cov(store, "before-agent").gaps
    assert (g.host, g.producer, g.next_producer) == ("cn2", "", C)
    assert span(g) == (5.0, 10.0)


def test_hung_agent_gap_between_its_batches(store):
    (g,) = cov(store, "hung").gaps
    assert (g.producer, g.next_producer) == (D, D) and span(g) == (10.0, 20.0)


def test_a_pause_within_the_allowance_is_no_gap(store):
    assert cov(store, "short-pause").complete
    # the same pause is a gap with a stricter allowance (2 missed heartbeats: 4 s)
    c = job_coverage(store, "short-pause", silence_s=4.0, now_ns=at(500))
    assert [span(g) for g in c.gaps] == [(10.0, 15.0)]


def test_hosts_without_a_heartbeating_agent_are_not_checked(store):
    c = cov(store, "no-agent")
    assert (c.complete, c.checked, c.hosts, c.unmonitored_hosts) == (True, "no-agent", [], ["cn9"])
    c = cov(store, "old-agent")  # an agent without heartbeats: its silences say nothing
    assert (c.complete, c.checked, c.unmonitored_hosts) == (True, "no-agent", ["cn5"])


def test_darshan_imports_are_not_checked(store):
    c = cov(store, "darshan")
    assert (c.complete, c.checked, c.gaps) == (True, "darshan", [])


def test_running_job_gap_up_to_now_only_once_the_silence_is_long_enough(store):
    (g,) = cov(store, "running", now=70).gaps  # B's last batch at +60 s, 10 s ago
    assert (g.producer, g.next_producer) == (B, "") and span(g) == (60.0, 70.0)
    assert cov(store, "running", now=61).complete  # silent for 1 s: no gap yet


def test_hosts_from_records_and_forwarder_compute_nodes(store):
    c = cov(store, "cn2-records")  # its event names login1 (no agent), its records cn2
    assert c.hosts == ["cn2"] and c.unmonitored_hosts == ["login1"]
    assert [span(g) for g in c.gaps] == [(5.0, 10.0)]
    (g,) = cov(store, "via-mount").gaps
    assert g.host == "cn1" and span(g) == (2.8, 8.0)


def test_gap_lines_from_objects_and_json(store, client):
    c = cov(store, "killed")
    lines = gap_lines(c.gaps)
    assert lines == gap_lines(client.get("/v1/jobs/killed").json()["gaps"])
    assert lines[0].startswith(f"host cn1: agent {A} silent from ") and f"next heard: {B}" in lines[0]
    assert "(5.2 s of the job)" in lines[0]


def test_producer_ids():
    assert (producer_kind(A), producer_pid(A)) == ("agent", 100)
    assert (producer_kind("pharos-fwd-fwd-a-77-ff"), producer_pid("pharos-fwd-fwd-a-77-ff")) == ("fwd", 77)
    assert (producer_kind("darshan:ab"), producer_pid("darshan:ab")) == ("other", None)


def test_producers_liveness(store):
    ps = {p.producer_id: p for p in producers(store, since_s=10_000, silence_s=W, now_ns=at(64))}
    assert ps[B].state == "alive" and ps[B].age_s == pytest.approx(4.0) and ps[B].pid == 200
    assert ps[A].state == "silent" and ps[A].heartbeats == 31 and ps[A].records == 14 * 50
    assert ps["pharos-fwd-fwd0-700-abc"].kind == "fwd" and ps["pharos-fwd-fwd0-700-abc"].host == "fwd0"
    assert A not in {p.producer_id for p in producers(store, since_s=30, silence_s=W, now_ns=at(64))}


def test_summary_carries_the_coverage(store):
    s = job_summary(store, "killed", silence_s=W)
    assert s.complete is False and s.gaps[0].host == "cn1" and s.coverage.checked == "agents"
    assert job_summary(store, "after-restart", silence_s=W).complete
    assert job_summary(store, "killed", coverage=False).complete  # not checked when asked not to


@pytest.fixture(scope="module")
def client(store, tmp_path_factory):
    app = create_app(
        store, Settings(state_dir=tmp_path_factory.mktemp("api"), heartbeat_interval_s=2.0, api_auth="none")
    )
    with TestClient(app) as c:
        yield c


def test_api_job_and_producers(client):
    j = client.get("/v1/jobs/killed").json()
    assert j["complete"] is False
    (g,) = j["gaps"]
    assert (g["host"], g["producer"], g["next_producer"]) == ("cn1", A, B)
    assert g["duration_s"] == pytest.approx(5.2)
    assert j["coverage"] == {"checked": "agents", "hosts": ["cn1"], "unmonitored_hosts": [], "silence_s": W}
    ok = client.get("/v1/jobs/after-restart").json()
    assert ok["complete"] is True and ok["gaps"] == []
    p = client.get("/v1/producers", params={"since_s": 10_000}).json()
    assert p["silence_s"] == W and {x["producer_id"] for x in p["items"]} >= {A, B, C, D}
    assert all(x["state"] == "silent" for x in p["items"])  # the synthetic agents stopped minutes ago


def test_pharos_job_warns_and_report_says_incomplete(client, store, monkeypatch):
    import pharos_api.cli_jobs as cli_jobs

    def fake_get(url, path, params=None, timeout=10.0):
        return client.get(path, params=params)

    monkeypatch.setattr(cli_jobs, "api_get", fake_get)
    out = CliRunner().invoke(cli_app, ["job", "killed", "--api", "http://test"]).output
    assert "WARNING: INCOMPLETE" in out and f"agent {A} silent from" in out, out
    assert "INCOMPLETE" not in CliRunner().invoke(cli_app, ["job", "after-restart", "--api", "http://test"]).output
    page = render_report(store, "killed", silence_s=W)
    assert "Incomplete: the eBPF agent was not watching" in page and "INCOMPLETE: 1 gap(s)" in page
    assert "Incomplete" not in render_report(store, "after-restart", silence_s=W)
