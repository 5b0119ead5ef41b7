"""`pharos run`'s hint step (agents/pharos_agents/runner.py ``job_hint``/``request_hint``) against a
real API (uvicorn on a free loopback port, real chDB store): the decision is asked with the job's
name, user and command and recorded before the ranks would start; one line says it (not with
quiet); an unreachable or refusing API is one warning and no hint (the job keeps the default
mapping); ``hint=False`` and ``PHAROS_RUN_HINT=false`` ask nothing. The whole of `pharos run` on
the real stack: test_control_dfra_live.py."""

from __future__ import annotations

import time

import control_rows as cr
import httpx
import pytest
from pharos_testkit import free_port, served

from pharos_agents.runner import hint_line, job_hint
from pharos_api.app import create_app
from pharos_core.settings import Settings

T = time.time_ns() - 3600 * cr.NS


@pytest.fixture(scope="module")
def api(store, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PHAROS_CONTROL_DFRA_MIN_BYTES", str(100 * cr.MiB))
    mp.setenv("PHAROS_CONTROL_DFRA_MIN_IO_RANKS", "8")
    mp.setenv("PHAROS_CONTROL_PLACEMENT_ENABLED", "false")
    store.insert_rows(
        "job_events", cr.job_events("rh-prev", T, T + 20 * cr.NS, "wave", ranks=8, command=["wave", "-x"])
    )
    store.insert_rows("io_requests", cr.requests("rh-prev", T, 8, 64))
    # two forwarding nodes by name whose daemons and mount do not answer (closed port 9)
    s = Settings(
        state_dir=tmp_path_factory.mktemp("rh"), fwd_nodes=2, fwd_port_base=9, mount_admin_port=9, api_auth="none"
    )
    with served(create_app(store, s)) as url:
        yield url
    mp.undo()


def settings_for(url: str, **kw) -> Settings:
    host, port = url.removeprefix("http://").split(":")
    return Settings(api_host=host, api_port=int(port), api_socket="", **kw)  # this server's TCP port, no socket


def actions(api: str, job: str) -> list[dict]:
    return httpx.get(f"{api}/v1/control/actions", params={"job": job}, timeout=10).json()["items"]


def test_hint_asked_with_identity_recorded_and_said_in_one_line(api):
    lines: list[str] = []
    t0 = time.monotonic()
    h = job_hint(settings_for(api), "rh1", "wave", "alice", ["wave", "-x"], report=lines.append)
    took = time.monotonic() - t0
    assert h is not None and h["job_id"] == "rh1" and h["new"] and h["decided"]
    # the history matched on name, user AND command: its criteria are in the evidence
    assert h["evidence"]["criteria"]["io_ranks"]["value"] == 8.0 and h["evidence"]["runs"] == 1
    assert h["evidence"]["command"] == ["wave", "-x"] and h["evidence"]["user"] == "alice"
    # no node answers: the default class, nothing usable; apply=true was asked, the mount is down
    assert h["class"] == "default" and "no healthy forwarding node" in h["reason"]
    assert lines == [hint_line("rh1", h)] and lines[0].startswith("pharos run: job rh1: forwarding default on ")
    acts = actions(api, "rh1")
    assert [a["kind"] for a in acts] == ["dfra_default"] and acts[0]["status"] == h["status"] == "failed"
    assert acts[0]["evidence"]["via"] == "hint" and acts[0]["evidence"]["name"] == "wave"
    assert "(NOT applied: " in lines[0]
    print(f"\n[run-hint] hint for rh1 in {took * 1000:.0f} ms: {lines[0]}")


def test_other_command_has_no_history_and_quiet_prints_nothing(api):
    lines: list[str] = []
    h = job_hint(settings_for(api), "rh2", "wave", "alice", ["wave", "-y"], quiet=True, report=lines.append)
    assert h is not None and h["reason"].startswith("no earlier run with this name, user and command")
    assert lines == []
    assert [a["kind"] for a in actions(api, "rh2")] == ["dfra_default"]


def test_unreachable_api_warns_once_and_gives_no_hint(api):
    lines: list[str] = []
    dead = settings_for(f"http://127.0.0.1:{free_port()}", run_hint_timeout_s=3)
    t0 = time.monotonic()
    assert job_hint(dead, "rh3", "wave", "alice", ["wave"], quiet=True, report=lines.append) is None
    assert time.monotonic() - t0 < 3
    assert len(lines) == 1 and "warning" in lines[0] and "not reachable" in lines[0] and "default mapping" in lines[0]


def test_refusing_api_warns_with_the_http_error(api):
    lines: list[str] = []
    # no start event and no name: the API cannot look up a history (404)
    assert job_hint(settings_for(api), "rh4", "", "alice", ["wave"], report=lines.append) is None
    assert len(lines) == 1 and "HTTP 404" in lines[0]
    assert actions(api, "rh4") == []


def test_no_hint_by_flag_or_environment_asks_nothing(api, monkeypatch):
    lines: list[str] = []
    assert job_hint(settings_for(api), "rh5", "wave", "alice", ["wave", "-x"], hint=False, report=lines.append) is None
    monkeypatch.setenv("PHAROS_RUN_HINT", "false")
    s = settings_for(api)
    assert s.run_hint is False
    assert job_hint(s, "rh6", "wave", "alice", ["wave", "-x"], report=lines.append) is None
    assert job_hint(s, "rh7", "wave", "alice", ["wave", "-x"], hint=True, report=lines.append) is not None  # flag wins
    assert actions(api, "rh5") == actions(api, "rh6") == [] and len(actions(api, "rh7")) == 1
    assert len(lines) == 1 and "rh7" in lines[0]
