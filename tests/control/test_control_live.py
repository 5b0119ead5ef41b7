"""The control loop against the REAL forwarding daemons and FUSE mount (forwarder_testkit):
DFRA hand-out and return of reserved nodes, failed pushes (dead mount, dead daemon) recorded and
retried while the previous mapping keeps serving, dry-run changes nothing, pins are respected."""

from __future__ import annotations

import json
import subprocess
import time

import control_rows as cr
import pharos_sysdiag_sim as sim
import pytest
from forwarder_testkit import BIN, Daemon, http, port_of, wait_ready
from pharos_testkit import free_port, in_job

from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.loop import ControlLoop
from pharos_core.settings import Settings

S = cr.NS
CAP = 100e6


def loop_on(store, cluster, mounts, daemons, **kw) -> ControlLoop:
    base = dict(
        node_capacity_b_s=CAP,
        dfra_min_bytes=100 * cr.MiB,
        dfra_min_io_ranks=8,
        dfra_dedicated_min_bytes=1e15,
        http_timeout_s=2.0,
    )
    c = ControlConfig(
        mount_admin_urls=mounts, fwd_admin_urls=daemons, admin_token_file=cluster.token_file, **(base | kw)
    )
    return ControlLoop(store, Settings(), lambda: c)


def history(store, name: str, t0: int, ranks: int = 8) -> None:
    """One finished earlier run of ``name``: N-N, 8 ranks x 64 MiB (benefits with the lowered thresholds)."""
    store.insert_rows("job_events", cr.job_events(f"{name}-prev", t0, t0 + 20 * S, name, ranks=ranks))
    store.insert_rows("io_requests", cr.requests(f"{name}-prev", t0, ranks, 64))


def start(store, job: str, name: str, t: int) -> None:
    store.insert_rows("job_events", cr.job_events(job, t, None, name))


def end(store, job: str, name: str, t: int) -> None:
    store.insert_rows("job_events", [r for r in cr.job_events(job, t - S, t, name) if r["kind"] == "end"])


def daemon_on_port(cluster, name: str, admin_port: int) -> Daemon:
    """pharos-fwd as Cluster.start_daemon starts it, on a given admin port (a daemon coming back)."""
    ready, log = cluster.root / f"{name}.ready", cluster.root / f"{name}.log"
    ready.unlink(missing_ok=True)
    args = [
        str(BIN / "pharos-fwd"),
        "--node-name",
        name,
        "--listen",
        "127.0.0.1:0",
        "--admin",
        f"127.0.0.1:{admin_port}",
        "--mdt",
        str(cluster.backend / "mdt"),
        "--targets-root",
        str(cluster.backend),
        "--target-count",
        str(cluster.n_targets),
        "--ready-file",
        str(ready),
        "--no-kafka",
        *cluster.auth_args(),
    ]
    proc = subprocess.Popen(args, stdout=log.open("a"), stderr=subprocess.STDOUT)
    d = Daemon(name, proc, port_of(wait_ready(ready, proc)["listen"]), admin_port, log)
    cluster.daemons.append(d)
    return d


def write_as(job: str, path, data: bytes = b"x" * 65536) -> None:
    with in_job(job) as preexec:
        subprocess.run(
            ["dd", "of=" + str(path), "bs=64k", "count=1", "iflag=fullblock", "status=none"],
            input=data,
            check=True,
            preexec_fn=preexec,
            timeout=30,
        )


def saturated_metrics(store, t_end: int) -> None:
    rows = sim.simulate(
        sim.Cluster(fwd_nodes=["fwd0", "fwd1"], fwd_capacity_mb_s=500),
        sim.proportionate_jobs("m", 400, ["fwd0", "fwd1"]),
        t_end - 60 * S,
        60,
        seed=5,
    )
    sim.insert(store, {"target_metrics": rows["target_metrics"]})


def test_reserved_nodes_handed_out_once_and_returned_at_job_end(store, cluster):
    ds = [cluster.start_daemon(f"fwd{i}") for i in range(4)]
    m = cluster.start_mount(ds)
    t = 1_770_000_000 * S
    history(store, "big", t)
    loop = loop_on(
        store,
        cluster,
        [m.admin],
        {d.name: d.admin for d in ds},
        reserved_nodes=["fwd2", "fwd3"],
        dfra_dedicated_min_bytes=200 * cr.MiB,
        placement_enabled=False,
    )
    h = loop.hint("b1", "big", "alice", ["big"], apply=True, now_ns=t + 100 * S)
    assert (h["class"], h["reserved"], h["status"]) == ("dedicated", ["fwd2"], "applied")
    assert http("GET", m.admin + "/mapping")["jobs"] == {"b1": ["fwd2"]}  # before its first I/O
    assert loop.hint("b1", name="big", now_ns=t + 101 * S)["new"] is False
    assert loop.hint("b2", "big", "alice", ["big"], now_ns=t + 102 * S)["reserved"] == ["fwd3"]
    h3 = loop.hint("b3", "big", "alice", ["big"], now_ns=t + 103 * S)
    assert h3["class"] == "more_nodes" and not set(h3["nodes"]) & {"fwd2", "fwd3"}
    # a reserved daemon that does not answer is never handed out
    cluster._stop(ds[3].proc)
    start(store, "b1", "big", t + 110 * S)
    end(store, "b1", "big", t + 130 * S)
    loop.cycle(now_ns=t + 140 * S)
    assert loop._holders() == {"fwd2": "", "fwd3": "b2"}  # b1 ended: fwd2 is back
    assert "b1" not in http("GET", m.admin + "/mapping")["jobs"]  # the ended job's entry is dropped
    loop.cycle(now_ns=t + 102 * S + 301 * S)  # b2 never started within the grace
    assert loop._holders() == {"fwd2": "", "fwd3": ""}
    h4 = loop.hint("b4", "big", "alice", ["big"], now_ns=t + 500 * S)
    assert h4["reserved"] == ["fwd2"] and "fwd3" in h4["evidence"]["down"]
    end(store, "b4", "big", t + 510 * S)
    loop.cycle(now_ns=t + 520 * S)


def test_dead_mount_push_recorded_failed_previous_mapping_keeps_serving(store, cluster):
    d0, d1 = cluster.start_daemon("fwd0"), cluster.start_daemon("fwd1")
    m = cluster.start_mount([d0, d1])
    http("PUT", m.admin + "/mapping", {"jobs": {"old": ["fwd1"]}})
    dead = f"http://127.0.0.1:{free_port()}"
    t = 1_771_000_000 * S
    history(store, "nn", t)
    start(store, "n1", "nn", t + 100 * S)
    loop = loop_on(store, cluster, [m.admin, dead], {"fwd0": d0.admin, "fwd1": d1.admin}, placement_enabled=False)
    loop.cycle(now_ns=t + 101 * S)
    (row,) = loop.actions(job="n1")
    assert row["kind"] == "dfra_more_nodes" and row["status"] == "failed" and dead in row["error"]
    # the live mount took the decision and kept the entry it had; I/O of 'old' is still served by fwd1
    assert http("GET", m.admin + "/mapping")["jobs"] == {"old": ["fwd1"], "n1": ["fwd0", "fwd1"]}
    before = d1.status()["counters"]
    write_as("old", m.path / "old.dat")
    assert (m.path / "old.dat").stat().st_size == 65536
    assert json.dumps(d1.status()["counters"]) != json.dumps(before)
    # nothing new: the next cycle pushes nothing and records nothing (no retry storm on a dead mount)
    loop.cycle(now_ns=t + 111 * S)
    assert len(loop.actions(job="n1")) == 1 and loop.actions(kind="sync", since_ns=t) == []
    end(store, "n1", "nn", t + 120 * S)


def test_dead_daemon_placement_failed_then_retried_when_it_answers(store, cluster):
    d0 = cluster.start_daemon("fwd0")
    prev = http("GET", d0.admin + "/placement")
    port = free_port()
    t = 1_772_000_000 * S
    saturated_metrics(store, t)
    loop = loop_on(store, cluster, [], {"fwd0": d0.admin, "fwd1": f"http://127.0.0.1:{port}"})
    loop.cycle(now_ns=t)
    (row,) = loop.actions(kind="placement", since_ns=t)
    assert row["status"] == "failed" and f"127.0.0.1:{port}" in row["error"]
    pool = http("GET", d0.admin + "/placement")["pools"]["pharos"]
    assert pool != prev.get("pools", {}).get("pharos") and len(pool["targets"]) == 8
    assert abs(pool["max_perf"]["ost5"] - 10) < 1.5  # measured (10 MB/s target), not configured
    d1 = daemon_on_port(cluster, "fwd1", port)
    assert http("GET", d1.admin + "/placement")["pools"] == {}
    loop.cycle(now_ns=t + 30 * S)  # after the back-off
    sync = loop.actions(kind="sync", since_ns=t)
    assert [r["status"] for r in sync] == ["applied"] and sync[0]["endpoints"] == [d1.admin]
    assert http("GET", d1.admin + "/placement") == http("GET", d0.admin + "/placement")


def test_dry_run_changes_nothing_on_the_daemons(store, cluster):
    d0, d1 = cluster.start_daemon("fwd0"), cluster.start_daemon("fwd1")
    m = cluster.start_mount([d0, d1])
    http("PUT", m.admin + "/mapping", {"jobs": {"old": ["fwd1"]}})
    t = 1_773_000_000 * S
    saturated_metrics(store, t)
    history(store, "dry", t - 1000 * S)
    start(store, "dr1", "dry", t - 5 * S)
    before = (
        http("GET", m.admin + "/mapping"),
        http("GET", d0.admin + "/placement"),
        http("GET", d1.admin + "/placement"),
    )
    loop = loop_on(store, cluster, [m.admin], {"fwd0": d0.admin, "fwd1": d1.admin}, dry_run=True)
    for k in range(3):
        loop.cycle(now_ns=t + k * 10 * S)
    after = (
        http("GET", m.admin + "/mapping"),
        http("GET", d0.admin + "/placement"),
        http("GET", d1.admin + "/placement"),
    )
    assert after == before
    rows = loop.actions(job="dr1") + loop.actions(kind="placement", since_ns=t - 3600 * S)
    kinds = sorted((r["kind"], r["status"], r["dry_run"]) for r in rows if r["time_ns"] >= t)
    assert kinds == [("dfra_more_nodes", "recorded", True), ("placement", "recorded", True)]  # once each
    end(store, "dr1", "dry", t + 40 * S)


def test_pins_are_respected(store, cluster):
    d0, d1 = cluster.start_daemon("fwd0"), cluster.start_daemon("fwd1")
    m = cluster.start_mount([d0, d1], 1)  # default forwarding node: fwd1
    t = 1_774_000_000 * S
    saturated_metrics(store, t)
    history(store, "pinapp", t - 1000 * S)
    for job in ("pinned", "hog"):
        start(store, job, "pinapp" if job == "pinned" else "hog", t - 30 * S)
    # the last 30 s on fwd1: hog 100 MB/s, pinned 50 MB/s; the detector saw pinned slowed by hog there
    store.insert_rows("io_requests", cr.requests("hog", t - 29 * S, 10, 300, fwd="fwd1", span_s=28))
    store.insert_rows("io_requests", cr.requests("pinned", t - 29 * S, 5, 300, fwd="fwd1", span_s=28))
    store.insert_rows(
        "anomalies",
        [
            {
                "detected": cr.dt(t),
                "key": "interference:pinned:hog:forwarding_node:fwd1",
                "kind": "interference",
                "node": "fwd1",
                "node_type": "forwarding_node",
                "job_id": "pinned",
                "culprit_job": "hog",
                "persistence": "",
                "active": 1,
                "severity": "critical",
                "ratio": 4.0,
                "onset": cr.dt(t - 20 * S),
                "start": cr.dt(t - 20 * S),
                "end": cr.dt(t),
                "evidence": json.dumps({"culprit_bytes": 3000 << 20, "job_bytes_on_resource": 1 << 20}),
            }
        ],
    )
    loop = loop_on(store, cluster, [m.admin], {"fwd0": d0.admin, "fwd1": d1.admin})
    loop.set_pin("job", "pinned", ["fwd1"], "keep it", now_ns=t - S)
    loop.set_pin("pool", "pharos", {"targets": ["ost0", "ost1"], "max_perf": {"ost0": 5.0}}, now_ns=t - S)
    out = loop.cycle(now_ns=t)
    # the pinned victim is cheaper to move but pinned: the culprit moves off fwd1
    assert any(s.get("job") == "pinned" and s["why"] == "pinned by an admin" for s in out["skipped_moves"])
    assert http("GET", m.admin + "/mapping")["jobs"] == {"pinned": ["fwd1"], "hog": ["fwd0"]}
    assert loop.actions(job="pinned", kind="dfra_more_nodes") == [] and loop.actions(job="pinned", kind="remap") == []
    (mv,) = loop.actions(job="hog", kind="remap")
    assert mv["status"] == "applied" and (mv["from_state"], mv["to_state"]) == ("fwd1", "fwd0")
    for d in (d0, d1):
        assert http("GET", d.admin + "/placement")["pools"]["pharos"]["targets"] == ["ost0", "ost1"]
    # unpinned, the pool follows the measurements again
    assert loop.delete_pin("pool", "pharos", now_ns=t + S)
    loop.cycle(now_ns=t + 10 * S)
    assert len(http("GET", d0.admin + "/placement")["pools"]["pharos"]["targets"]) == 8
    for job in ("pinned", "hog"):
        end(store, job, "x", t + 20 * S)


def test_mapping_set_outside_the_loop_is_kept_by_a_default_decision(store, cluster):
    """An admin (or a test, or the scheduler) mapped a job on the mount before it started: DFRA's
    "default" (no history) does not undo it, neither at the hint (pharos run) nor in a cycle."""
    d0, d1 = cluster.start_daemon("fwd0"), cluster.start_daemon("fwd1")
    m = cluster.start_mount([d0, d1])  # default forwarding node: fwd0
    http("PUT", m.admin + "/mapping", {"jobs": {"ext": ["fwd1"]}})
    t = 1_775_000_000 * S
    loop = loop_on(store, cluster, [m.admin], {"fwd0": d0.admin, "fwd1": d1.admin}, placement_enabled=False)
    h = loop.hint("ext", "never-ran", "alice", ["never-ran"], apply=True, now_ns=t)
    assert (h["class"], h["nodes"], h["status"]) == ("default", ["fwd1"], "applied")
    assert "already maps the job to fwd1: kept" in h["reason"] and h["evidence"]["default_nodes"] == ["fwd0"]
    start(store, "ext", "never-ran", t + S)
    start(store, "plain", "never-ran", t + S)  # not mapped before: the default node, no entry
    loop.cycle(now_ns=t + 2 * S)
    jobs = http("GET", m.admin + "/mapping")["jobs"]  # (a pin of an earlier test is there too)
    assert jobs["ext"] == ["fwd1"] and "plain" not in jobs
    write_as("ext", m.path / "ext.dat")
    assert (m.path / "ext.dat").stat().st_size == 65536
    end(store, "ext", "never-ran", t + 10 * S)
    end(store, "plain", "never-ran", t + 10 * S)
    loop.cycle(now_ns=t + 11 * S)
    assert "ext" not in http("GET", m.admin + "/mapping")["jobs"]  # the ended job's entry is dropped


@pytest.fixture(autouse=True)
def _slow_guard():
    t = time.monotonic()
    yield
    assert time.monotonic() - t < 120
