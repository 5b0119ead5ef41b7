"""The control loop's planning of online migrations off persistently fail-slow targets (issue 27,
item 1; analytics/pharos_analytics/control/migration.py).

1. Pure rules: the episode of a target (detections at most ``migration_episode_gap_s`` apart),
   the persistence threshold, the pool and pin guards, once per (target, episode), adopting tasks
   already under way, resuming after a daemon lost its tasks.
2. The cycle on a real chDB store against a stand-in daemon (httpx.MockTransport: its
   ``/migrations`` and ``/placement``): planned once, idempotent across cycles and a restart of
   the loop, audited, dry run posts nothing, a new episode after a break is planned again.
3. End to end (root, FUSE): real pharos-fwd daemons and mount, one target slowed through the
   admin fault interface, the fail-slow anomaly in the store; the loop's cycle plans the
   migration, every task ends done, fio verifies every byte, ``GET /v1/control/migrations``
   shows them, ``pharos control migrations`` prints them.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest

from pharos_analytics.alerts import anomaly_rows
from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.loop import ControlLoop
from pharos_analytics.control.migration import Planned, episode_start, plan_migrations
from pharos_analytics.control.push import Endpoints
from pharos_analytics.failslow import Anomaly
from pharos_core.settings import Settings

S = 1_000_000_000
T0 = 1_770_000_000 * S
CFG = ControlConfig(migration_persist_s=300, migration_episode_gap_s=60)
SLOW = {"ost3": {"ratio": 9.5, "severity": "critical"}}
POOL = {"ost0", "ost1", "ost2"}


def every(start_s: int, end_s: int, step_s: int = 10) -> list[int]:
    return [T0 + t * S for t in range(start_s, end_s + 1, step_s)]


def plan(times, planned=None, tasks=None, answered=None, pool=POOL, pin=None, now_s=400, cfg=CFG):
    return plan_migrations(
        SLOW, {"ost3": times}, planned or {}, tasks or {}, answered or set(tasks or {}), pool, pin, T0 + now_s * S, cfg
    )


# -- 1. pure rules -----------------------------------------------------------------------------


def test_episode_is_the_run_of_detections_reaching_now():
    gap = 60 * S
    assert episode_start(every(0, 400), T0 + 400 * S, gap) == T0
    # a break longer than the gap starts a new episode
    assert episode_start(every(0, 100) + every(200, 400), T0 + 400 * S, gap) == T0 + 200 * S
    # a break up to the gap does not
    assert episode_start(every(0, 100) + every(160, 400), T0 + 400 * S, gap) == T0
    # the newest detection is older than the gap: the episode ended
    assert episode_start(every(0, 300), T0 + 400 * S, gap) is None
    assert episode_start([], T0, gap) is None
    assert episode_start(list(reversed(every(0, 100))), T0 + 100 * S, gap) == T0  # any order


def test_persistence_threshold():
    (d,) = plan(every(150, 400))
    assert (d.action, d.persisted_s) == ("skip", 250.0) and "after 300 s" in d.reason
    (d,) = plan(every(100, 400))
    assert d.action == "plan" and d.persisted_s == 300.0 and d.episode_start_ns == T0 + 100 * S
    assert d.evidence["ratio"] == 9.5
    # a break in the detections restarts the clock
    (d,) = plan(every(0, 100) + every(200, 400))
    assert d.action == "skip" and d.persisted_s == 200.0
    (d,) = plan(every(0, 400), cfg=ControlConfig(migration_persist_s=0, migration_episode_gap_s=60))
    assert d.action == "plan"


def test_destinations_must_be_healthy_and_pins_win():
    (d,) = plan(every(0, 400), pool=POOL | {"ost3"})
    assert d.action == "skip" and "still in the placement pool" in d.reason
    (d,) = plan(every(0, 400), pool=None)
    assert d.action == "skip" and "no placement pool" in d.reason
    (d,) = plan(every(0, 400), pin={"ost3", "ost0"})
    assert d.action == "skip" and "admin-pinned pool" in d.reason
    (d,) = plan(every(0, 400), pin={"ost0", "ost1"})
    assert d.action == "plan"


def task(i: int, state: str, source: str = "ost3") -> dict:
    """A task as the daemons list it (``GET /migrations``)."""
    return {
        "id": i,
        "state": state,
        "source_target": source,
        "dest_target": None,
        "path": f"/f{i}",
        "pinned": False,
        "priority": 0,
        "min_mb_s": 10.0,
        "max_mb_s": None,
        "unit_bytes": 1 << 20,
        "rate_mb_s": 0.0,
        "bytes_done": 0,
        "bytes_left": 4 << 20,
        "recopies": 0,
        "deferrals": 0,
        "error": None,
        "copy_s": 0.0,
        "achieved_mb_s": 0.0,
    }


def test_once_per_episode_adopt_and_resume():
    times = every(0, 400)
    done = {"fwd0": [task(1, "done"), task(2, "done")]}
    # planned at 350 s, in this episode: nothing more, whatever the daemon lists
    p = {"ost3": Planned(T0 + 350 * S, "fwd0", 2)}
    (d,) = plan(times, p, done)
    assert d.action == "skip" and d.reason == "planned in this episode already"
    (d,) = plan(times, p, {"fwd0": [task(1, "copying"), task(2, "queued")]})
    assert d.action == "skip"
    # planned in an earlier episode (before this one began): planned again
    (d,) = plan(every(300, 400), {"ost3": Planned(T0 + 100 * S, "fwd0", 2)}, done, now_s=600)
    assert d.action == "skip"  # (only 100 s old yet)
    (d,) = plan(every(200, 600), {"ost3": Planned(T0 + 100 * S, "fwd0", 2)}, done, now_s=600)
    assert d.action == "plan"
    # tasks off the target already under way (an admin's, or posted before a crash): adopted
    (d,) = plan(times, None, {"fwd1": [task(7, "copying"), task(8, "done"), task(9, "queued", "ost1")]})
    assert d.action == "adopt" and d.evidence["under_way"] == {"fwd1": [7]}
    # only finished tasks of the target: a new episode is planned
    (d,) = plan(times, None, done)
    assert d.action == "plan"
    # the daemon that planned the episode lists none of it any more (restarted): resumed
    (d,) = plan(times, p, {"fwd0": [task(1, "queued", "ost1")]})
    assert d.action == "resume" and "restarted" in d.reason
    # ... not when it planned nothing, or did not answer
    (d,) = plan(times, {"ost3": Planned(T0 + 350 * S, "fwd0", 0)}, {"fwd0": []})
    assert d.action == "skip"
    (d,) = plan(times, p, {}, answered=set())
    assert d.action == "skip"


# -- 2. the cycle against a stand-in daemon -----------------------------------------------------


class FakeDaemon:
    """The admin interface of one pharos-fwd as far as the loop's migration step uses it."""

    def __init__(self, files: int = 3) -> None:
        self.files = files
        self.tasks: list[dict] = []
        self.settings = {"max_total_mb_s": 200.0, "max_active": 4, "retry_s": 2.0}
        self.posts: list[dict] = []
        self.puts: list[dict] = []
        self.placement = {"pools": {"pharos": {"targets": ["ost0", "ost1", "ost2"]}}, "default_pool": "pharos"}

    def __call__(self, req: httpx.Request) -> httpx.Response:
        assert req.headers["authorization"].startswith("Bearer ")
        path, m = req.url.path, req.method
        if path == "/status":
            return httpx.Response(200, json={"ok": True})
        if path == "/placement":
            return httpx.Response(200, json=self.placement)
        if path == "/migrations" and m == "GET":
            return httpx.Response(200, json={"settings": self.settings, "minimums_scaled": False, "tasks": self.tasks})
        if path == "/migrations" and m == "PUT":
            self.puts.append(json.loads(req.content))
            self.settings = json.loads(req.content)
            return httpx.Response(200, json=self.settings)
        if path == "/migrations" and m == "POST":
            body = json.loads(req.content)
            self.posts.append(body)
            base = len(self.tasks)
            new = [task(base + i + 1, "queued", body["source_target"]) for i in range(self.files)]
            self.tasks += new
            return httpx.Response(200, json={"ids": [t["id"] for t in new]})
        m_id = re.fullmatch(r"/migrations/(\d+)", path)
        t = next((t for t in self.tasks if m_id and t["id"] == int(m_id.group(1))), None)
        if m_id and t is None:
            return httpx.Response(404, json={"error": f"no migration {m_id.group(1)}"})
        if m_id and m == "PUT":
            t.update(json.loads(req.content))
            return httpx.Response(200, json=t)
        if m_id and m == "DELETE":
            if t["state"] in ("queued", "deferred"):
                t["state"] = "cancelled"
            return httpx.Response(200, json={"id": t["id"], "state": t["state"]})
        return httpx.Response(404, json={"error": "no route"})


def failslow(store, target: str, times: list[int], ratio: float = 9.5) -> None:
    """Active fail-slow detections of ``target`` at ``times`` (ns), stored as the detection loop
    stores them (pharos_analytics.alerts.anomaly_rows); bench/migration.py writes its own so."""
    rows = []
    for t in times:
        a = Anomaly(
            "fail_slow_target", target, "target", "persistent", True, "critical", 60.0, [5.0, 60.0], ratio, 5.0, True,
            min(times), t, {},
        )  # fmt: skip
        rows += anomaly_rows([a], [], t)
    store.insert_rows("anomalies", rows)


def fake_loop(store, fake: FakeDaemon, tmp_path: Path, **kw) -> ControlLoop:
    tok = tmp_path / "admin.token"
    if not tok.exists():
        fd = os.open(tok, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"t" * 64)
        os.close(fd)
    cfg = ControlConfig(
        **(
            dict(
                admin_token_file=tok,
                placement_enabled=False,
                remap_enabled=False,
                anomaly_max_age_s=30,
                migration_persist_s=120,
                migration_episode_gap_s=40,
                migration_max_total_mb_s=50,
            )
            | kw
        )
    )
    return ControlLoop(
        store,
        Settings(state_dir=tmp_path),
        lambda: cfg,
        client=httpx.Client(transport=httpx.MockTransport(fake)),
        endpoints=Endpoints([], {"fwd0": "http://fwd0.test"}),
    )


def migration_rows(loop: ControlLoop, target: str) -> list[dict]:
    return [a for a in loop.actions(kind="migration", limit=1000) if a["resource"] == f"target:{target}"]


def test_cycle_plans_once_per_episode_across_restarts(store, tmp_path):
    fake = FakeDaemon()
    base = T0 + 10_000 * S  # away from the other tests' rows of this module's store
    failslow(store, "mt1", [base + t * S for t in range(0, 301, 10)])
    loop = fake_loop(store, fake, tmp_path)
    # 100 s into the episode: not yet persistent
    s = loop.cycle(base + 100 * S)
    assert s["migrations"] == 0 and s["migrations_waiting"][0]["target"] == "mt1" and not fake.posts
    s = loop.cycle(base + 130 * S)
    assert s["migrations"] == 1
    assert fake.posts == [
        {"source_target": "mt1", "min_mb_s": 10.0, "priority": 0, "unit_bytes": 1 << 20, "pool": "pharos"}
    ]
    assert fake.settings["max_total_mb_s"] == 50 and fake.settings["max_active"] == 4  # the cap, set first
    (row,) = migration_rows(loop, "mt1")
    assert row["status"] == "applied" and row["to_state"] == "fwd0: 3 task(s)" and row["from_state"] == "mt1"
    assert row["evidence"]["ids"] == [1, 2, 3] and row["evidence"]["action"] == "plan"
    assert row["evidence"]["episode_start_ns"] == base and row["endpoints"] == ["http://fwd0.test/migrations"]
    # next cycles, and a new loop on the same store (a restart): nothing posted again
    loop.cycle(base + 200 * S)
    fake_loop(store, fake, tmp_path).cycle(base + 300 * S)
    assert len(fake.posts) == 1 and len(migration_rows(loop, "mt1")) == 1
    # the daemon restarts and forgets its tasks: the episode is planned there again, once
    fake.tasks = []
    fake_loop(store, fake, tmp_path).cycle(base + 300 * S)
    assert len(fake.posts) == 2 and migration_rows(loop, "mt1")[0]["evidence"]["action"] == "resume"
    fake_loop(store, fake, tmp_path).cycle(base + 300 * S)
    assert len(fake.posts) == 2
    # the episode ends (no detection for longer than the gap), a new one begins: planned again
    # once persistent (the tasks under way then would be adopted instead)
    for t in fake.tasks:
        t["state"] = "done"
    failslow(store, "mt1", [base + t * S for t in range(400, 601, 10)])
    for t in (420, 500):
        fake_loop(store, fake, tmp_path).cycle(base + t * S)
    assert len(fake.posts) == 2
    fake_loop(store, fake, tmp_path).cycle(base + 530 * S)
    assert len(fake.posts) == 3 and migration_rows(loop, "mt1")[0]["evidence"]["episode_start_ns"] == base + 400 * S


def test_dry_run_disabled_adopted_and_unreachable(store, tmp_path):
    base = T0 + 20_000 * S
    failslow(store, "mt2", [base + t * S for t in range(0, 301, 10)])
    fake = FakeDaemon()
    off = fake_loop(store, fake, tmp_path, migration_enabled=False)
    assert off.cycle(base + 200 * S)["migrations"] == 0 and not fake.posts
    dry = fake_loop(store, fake, tmp_path, dry_run=True)
    assert dry.cycle(base + 200 * S)["migrations"] == 1 and dry.cycle(base + 210 * S)["migrations"] == 0
    (row,) = migration_rows(dry, "mt2")
    assert row["status"] == "recorded" and row["dry_run"] and not fake.posts and not fake.puts
    # the live loop does not take the dry run's row for a planning; tasks already under way are adopted
    fake.tasks = [task(41, "copying", "mt2"), task(42, "queued", "mt2")]
    live = fake_loop(store, fake, tmp_path)
    assert live.cycle(base + 220 * S)["migrations"] == 1 and not fake.posts
    row = migration_rows(live, "mt2")[0]
    assert row["evidence"]["action"] == "adopt" and row["evidence"]["ids"] == [41, 42] and row["status"] == "applied"
    # a POST that fails: a failed row, retried after the back-off, then applied
    failslow(store, "mt3", [base + t * S for t in range(0, 301, 10)])
    broken = FakeDaemon()
    loop = fake_loop(store, broken, tmp_path)
    real = loop.client
    loop.client = httpx.Client(
        transport=httpx.MockTransport(
            lambda r: httpx.Response(500, json={"error": "disk"}) if r.method == "POST" else broken(r)
        )
    )
    loop.cycle(base + 200 * S)
    rows = migration_rows(loop, "mt3")
    assert [r["status"] for r in rows] == ["failed"] and "HTTP 500" in rows[0]["error"]
    loop.cycle(base + 201 * S)  # in back-off: nothing recorded
    assert len(migration_rows(loop, "mt3")) == 1
    loop.client = real
    loop.cycle(base + 240 * S)
    assert [r["status"] for r in migration_rows(loop, "mt3")] == ["applied", "failed"]
    assert "mt3" in {p["source_target"] for p in broken.posts}


def test_api_and_cli_list_pin_and_cancel(store, tmp_path):
    """GET /v1/control/migrations aggregates the daemons' tasks and the loop's plannings; PUT and
    DELETE /v1/control/migrations/{daemon}/{id} reach the daemon and are recorded; the CLI prints
    the table (progress, bytes left) and calls both."""
    import typer
    from fastapi.testclient import TestClient
    from pharos_testkit import served
    from typer.testing import CliRunner

    from pharos_api.app import create_app
    from pharos_api.cli_control import register

    base = T0 + 30_000 * S
    fake = FakeDaemon(files=2)
    failslow(store, "mt4", [base + t * S for t in range(0, 301, 10)])
    loop = fake_loop(store, fake, tmp_path)
    loop.cycle(base + 200 * S)
    fake.tasks[0] |= {"state": "copying", "bytes_done": 1 << 20, "bytes_left": 3 << 20, "rate_mb_s": 10.0}
    app = create_app(store, Settings(state_dir=tmp_path, api_auth="none"))
    app.state.control_on_demand = loop
    c = TestClient(app)
    doc = c.get("/v1/control/migrations", params={"since_s": 1e9}).json()
    (d,) = doc["daemons"]
    assert d["ok"] and d["states"] == {"copying": 1, "queued": 1} and d["bytes_left"] == 7 << 20
    assert d["settings"]["max_total_mb_s"] == 50
    assert any(p["from_state"] == "mt4" and p["status"] == "applied" for p in doc["planned"])
    assert doc["enabled"] and doc["config"]["migration_persist_s"] == 120
    r = c.put("/v1/control/migrations/fwd0/2", json={"pinned": True, "reason": "keep"})
    assert r.status_code == 200 and r.json()["task"]["pinned"] and fake.tasks[1]["pinned"]
    r = c.delete("/v1/control/migrations/fwd0/2")
    assert r.status_code == 200 and r.json()["task"] == {"id": 2, "state": "cancelled"}
    assert c.put("/v1/control/migrations/fwd9/1", json={}).status_code == 404  # unknown node
    assert c.delete("/v1/control/migrations/fwd0/99").status_code == 404  # unknown task
    assert c.put("/v1/control/migrations/fwd0/1", json={"min_mb_s": -1}).status_code == 422
    kinds = [a["kind"] for a in loop.actions(limit=1000) if a["resource"] == "migration:fwd0/2"]
    assert kinds == ["migration_cancel", "migration_change"]
    app_cli = typer.Typer()
    register(app_cli)
    with served(app) as url:
        run = lambda *a: CliRunner().invoke(app_cli, [*a, "--api", url], env={"COLUMNS": "200"})  # noqa: E731
        r = run("control", "migrations", "--since", "1e9")
        assert r.exit_code == 0, r.output
        assert "mt4 → ?" in r.output and "25.0 %" in r.output and "3.0 MiB" in r.output and "cancelled" in r.output
        assert "fwd0: 2 task(s)" in r.output
        r = run("control", "migrations", "--unfinished", "--json")
        assert [t["id"] for t in json.loads(r.output)["daemons"][0]["tasks"]] == [1]
        r = run("control", "migration-set", "fwd0", "1", "--priority", "7")
        assert r.exit_code == 0 and fake.tasks[0]["priority"] == 7, r.output
        r = run("control", "migration-cancel", "fwd0", "1", "--reason", "test")
        assert r.exit_code == 0 and "applied, copying" in r.output, r.output
        r = run("control", "migration-cancel", "fwd0", "77")
        assert r.exit_code == 1 and "no migration 77" in r.output


# -- 3. end to end: real daemon, mount and fio ---------------------------------------------------

E2E_TARGETS = [f"ost{i}" for i in range(4)]
E2E_SLOW = "ost1"
E2E_FILES, E2E_SIZE = 4, 8 << 20


def fio_files(directory: Path, *extra: str) -> dict:
    """fio's crc32c-verified sequential write of E2E_FILES files (``--verify_only``: the read-back
    alone, failing on any bad block); its job summary."""
    from forwarder_testkit import fio

    job = fio(
        "--name=mig",
        f"--directory={directory}",
        "--rw=write",
        "--bs=256k",
        f"--numjobs={E2E_FILES}",
        f"--size={E2E_SIZE >> 20}M",
        "--ioengine=psync",
        "--verify=crc32c",
        "--verify_state_save=0",
        "--verify_fatal=1",
        "--group_reporting",
        *extra,
        timeout=60,
    )["jobs"][0]
    assert job["error"] == 0, job
    return job


def layout_targets(ns: Path) -> dict[str, list[int]]:
    """Namespace path -> target indexes of its layout sidecar."""
    return {
        "/" + str(p.relative_to(ns)): [
            int(t) for t in re.search(r"targets=([0-9,]+)", p.read_text()).group(1).split(",")
        ]
        for p in ns.rglob("*")
        if p.is_file()
    }


@pytest.mark.timeout(120)
def test_loop_migrates_off_a_persistently_fail_slow_target_end_to_end(store, cluster, tmp_path):
    """Real pharos-fwd and FUSE mount: files striped over 4 targets in the pool ``pharos``; ost1
    slowed 10x through the admin fault interface and its fail-slow detections in the store for
    longer than ``migration_persist_s``. One control cycle drops ost1 from the pool (placement)
    and plans the migration (POST /migrations); every task ends done, no layout names ost1, fio
    verifies every byte through the mount, the next cycle plans nothing more, and ``GET
    /v1/control/migrations`` shows the tasks done and the planning applied."""
    from fastapi.testclient import TestClient
    from forwarder_testkit import http, wait_for

    from pharos_api.app import create_app

    t_start = time.monotonic()
    cluster.n_targets = len(E2E_TARGETS)
    doc = {
        "pools": {"pharos": {"targets": E2E_TARGETS, "stripe_count": 2}},
        "default_pool": "pharos",
        "stripe_size": 65536,
    }
    d = cluster.start_daemon("fwd0", "--placement", json.dumps(doc))
    m = cluster.start_mount([d], 0)
    work = m.path / "w"
    work.mkdir()
    fio_files(work, "--do_verify=1")
    before = layout_targets(cluster.ns)
    slow_i = E2E_TARGETS.index(E2E_SLOW)
    moving = [p for p, ts in before.items() if slow_i in ts]
    assert moving, before
    http("PUT", d.admin + f"/targets/{E2E_SLOW}", {"slowdown": 10})
    now = time.time_ns()
    failslow(store, E2E_SLOW, [now - t * S for t in range(60, -1, -5)])
    cfg = dict(
        mount_admin_urls=[m.admin],
        fwd_admin_urls={"fwd0": d.admin},
        admin_token_file=cluster.token_file,
        remap_enabled=False,
        placement_component_size=0,
        anomaly_max_age_s=30,
        migration_persist_s=30,
        migration_episode_gap_s=20,
        migration_max_total_mb_s=100,
        migration_min_mb_s=5,
    )
    c = ControlConfig(**cfg)
    loop = ControlLoop(store, Settings(state_dir=tmp_path), lambda: c)
    summary = loop.cycle(now)
    assert summary["migrations"] == 1, summary
    pool = http("GET", d.admin + "/placement")["pools"]["pharos"]
    assert E2E_SLOW not in pool["targets"], pool
    (row,) = migration_rows(loop, E2E_SLOW)
    assert row["status"] == "applied" and len(row["evidence"]["ids"]) == len(moving), row
    ids = set(row["evidence"]["ids"])

    def tasks() -> list[dict]:
        return [t for t in http("GET", d.admin + "/migrations")["tasks"] if t["id"] in ids]

    assert wait_for(lambda: all(t["state"] in ("done", "failed", "cancelled") for t in tasks()), timeout=60)
    assert all(t["state"] == "done" for t in tasks()), tasks()
    assert all(t["dest_target"] in pool["targets"] for t in tasks()), tasks()
    assert http("GET", d.admin + "/migrations")["settings"]["max_total_mb_s"] == 100
    after = layout_targets(cluster.ns)
    assert set(after) == set(before) and all(slow_i not in ts for ts in after.values()), after
    job = fio_files(work, "--verify_only")
    assert job["read"]["io_bytes"] == E2E_FILES * E2E_SIZE
    # the next cycle (same episode): nothing planned again
    assert loop.cycle(time.time_ns())["migrations"] == 0
    app = create_app(store, Settings(state_dir=tmp_path, api_auth="none"))
    app.state.control_on_demand = loop
    out = TestClient(app).get("/v1/control/migrations").json()
    (dm,) = out["daemons"]
    assert dm["ok"] and dm["states"] == {"done": len(moving)} and dm["bytes_left"] == 0, dm
    assert all(t["bytes_done"] > 0 and t["source_target"] == E2E_SLOW for t in dm["tasks"])
    assert [p["status"] for p in out["planned"] if p["from_state"] == E2E_SLOW] == ["applied"]
    assert time.monotonic() - t_start < 60
