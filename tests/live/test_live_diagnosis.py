"""Labelled live runs through the forwarding layer (issue #4), bounded in time.

One real embedded stack for the module (Kafka broker, eBPF agent, pharos-fwd fwd0/fwd1 on
8 storage targets, the pharos-mount FUSE client, pipeline + analytics + API on chDB) and a
real Alertmanager (Debian prometheus-alertmanager) on a free loopback port, which the
server's DetectionLoop posts to (``PHAROS_DIAGNOSIS_ALERTMANAGER_URL``). Real fio jobs run
through ``pharos run`` on the mount; faults are injected through the daemons' admin API.

1. N-N, N-1, N-M and 1-1 fio jobs are classified right on the client AND forwarder layer.
2. A target slowed 4x (``PUT /targets/ostK {"slowdown": 4}``) is flagged fail-slow and no
   healthy target is, over 5 runs with a different slow target each: precision and recall.
3. Two jobs forced onto one forwarding node (mount ``PUT /mapping``) give an interference
   event naming the heavy job; the same jobs on separate nodes give none.
4. Fault start -> Alertmanager alert, measured, <= 60 s.
5. Last, with the stack stopped: every Grafana dashboard query (dashboards/) runs on this run's
   store and shows data where the run made some (issue 11).

Configuration (scaled down so the module stays within minutes): fail-slow windows 5/20/60 s,
detection period 5 s, interference windows 2 s; 2 worker threads per forwarding daemon
(``PHAROS_FWD_WORKERS``), so that a heavy job on a node actually queues a light one. The
pattern and interference runs use unlimited targets; the fail-slow runs give every target
the same token-bucket limit (``FAILSLOW_LIMIT_MB_S``, 3x what its rank offers), so a target
slowed 4x (its rate divided by 4, its backing I/O stretched 4x) cannot keep up with its
rank while the healthy ones can: what a fail-slow OST does to a loaded system, and a signal
well above the service-time noise of 2 shared cores. Needs root (eBPF, cgroups, FUSE).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from pharos_testkit import StackAdmin, assert_one_pattern, pharos_run, running_alertmanager, stack_settings

from pharos_agents.runner import run_job
from pharos_api import stack
from pharos_api.demo import fio_totals, wait_for_summary
from pharos_core.settings import Settings

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the eBPF agent, job cgroups and FUSE need root"),
]

N_TARGETS = 8
MiB = 1 << 20
FIO = "fio --ioengine=psync --output-format=json --disk_util=0"
DIAG_ENV = {
    "PHAROS_DIAGNOSIS_FAILSLOW_WINDOWS_S": "[5, 20, 60]",
    "PHAROS_DIAGNOSIS_DETECT_PERIOD_S": "5",
    "PHAROS_DIAGNOSIS_INTERFERENCE_WINDOW_S": "2",
    "PHAROS_DIAGNOSIS_INTERFERENCE_LOOKBACK_S": "120",
    "PHAROS_FWD_WORKERS": "2",
    # These tests evaluate detection on the mappings and file layouts they set themselves; the
    # control loop would remap their jobs and re-place new files (performance-aware pool) under
    # them. It has its own live tests (tests/control/test_control_*_live.py).
    "PHAROS_CONTROL_PERIOD_S": "0",
}


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory):
    """The real Alertmanager on a free loopback port (no cluster, a receiver without sinks)."""
    d = tmp_path_factory.mktemp("alertmanager")
    with running_alertmanager(
        d,
        "route:\n  receiver: pharos-null\n  group_wait: 1s\n  group_interval: 1s\nreceivers:\n  - name: pharos-null\n",
    ) as url:
        yield url


class Live(StackAdmin):
    """The running stack (admin handles) and the files of the fail-slow workload."""

    def __init__(self, settings: Settings, am_url: str) -> None:
        super().__init__(settings)
        self.am = am_url
        self.target_files: dict[int, Path] = {}
        self.started = time.time()


@pytest.fixture(scope="module")
def live(tmp_path_factory, alertmanager):
    """A whole embedded stack on free ports and its own state dir; the server's DetectionLoop
    posts to the real Alertmanager. Stopped at the module's end."""
    state = tmp_path_factory.mktemp("live")
    settings = stack_settings(
        state,
        "pharos-live",
        fwd_nodes=2,
        fwd_targets=N_TARGETS,
        fwd_target_limits_mb_s=[],
    )
    env = dict(DIAG_ENV, PHAROS_DIAGNOSIS_ALERTMANAGER_URL=alertmanager)
    t0 = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        try:
            stack.start(settings)
            print(f"\n[live] stack ready in {time.monotonic() - t0:.1f} s (state {state})")
            yield Live(settings, alertmanager)
        finally:
            stack.stop(settings)


# -- helpers ----------------------------------------------------------------------------------


def start_job(live: Live, job_id: str, ranks: int, rank_cmd: str, out: Path, name: str) -> subprocess.Popen:
    """``pharos run`` as a user would run it (a subprocess: jobs can overlap)."""
    argv, env = pharos_run(live.settings, job_id, ["sh", "-c", f"exec {rank_cmd}"], ranks, name, out)
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(p: subprocess.Popen, timeout: float) -> int:
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)  # forwarded to the ranks by pharos run
        p.wait(20)
    return p.returncode


def am_target_alerts(am: str) -> list[dict]:
    return [
        a
        for a in httpx.get(am + "/api/v2/alerts", timeout=5).json()
        if a["labels"].get("source") == "pharos"
        and a["labels"].get("alertname") == "PharosFailSlowTarget"
        and a["status"]["state"] == "active"
    ]


@contextmanager
def limited_targets(live: Live, mb_s: float) -> Iterator[None]:
    """Every target limited to ``mb_s`` MB/s for the block; unlimited again after it."""
    for t in range(N_TARGETS):
        live.set_target(f"ost{t}", max_perf_mb_s=float(mb_s))
    try:
        yield
    finally:
        for t in range(N_TARGETS):
            live.set_target(f"ost{t}", max_perf_mb_s=0.0)


def live_failslow(live: Live) -> list[dict]:
    r = httpx.get(f"{live.api}/v1/anomalies", params={"live": "true", "kind": "fail_slow_target"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["items"]


def target_mean_latency(live: Live, window_s: float) -> dict[str, float]:
    """Mean service time per request of each loaded target over the last ``window_s``, µs."""
    items = httpx.get(f"{live.api}/v1/targets", params={"window_s": window_s}, timeout=30).json()["items"]
    return {t["target"]: t["latency_mean_ns"] / 1e3 for t in items if t["ops"] > 0}


def ensure_target_files(live: Live) -> dict[int, Path]:
    """One pre-sized file per target (ost0..ost7), placed by fwd0's round-robin and checked in
    the layout sidecars; fio overwrites them (no layout step, no unlink)."""
    if live.target_files:
        return live.target_files
    d = live.settings.mount_point / "per-target"
    d.mkdir(exist_ok=True)
    found: dict[int, Path] = {}
    for i in range(3 * N_TARGETS):
        p = d / f"c{i}"
        with open(p, "wb") as f:
            f.truncate(8 * MiB)
        (t,) = live.layout_targets(p)
        if t not in found:
            final = d / f"ost{t}.dat"
            p.rename(final)
            found[t] = final
        if len(found) == N_TARGETS:
            break
    assert sorted(found) == list(range(N_TARGETS)), f"placement reached only {sorted(found)}"
    live.target_files = found
    return found


def per_target_fio(live: Live, runtime_s: int, rate: str = "8m") -> str:
    files = ensure_target_files(live)
    names = " ".join(str(files[t]) for t in range(N_TARGETS))
    # rank r writes the file on ost r, 1 MiB requests, rate-limited so 2 cores are not swamped
    return (
        f"sh -c 'set -- {names}; shift $PHAROS_RANK; exec {FIO} --name=fs --rw=write --bs=1m --size=8m "
        f"--time_based --runtime={runtime_s} --rate={rate} --filename=$1'"
    )


# -- 1. patterns ------------------------------------------------------------------------------

PATTERN_JOBS = {
    # kind: (ranks, fio args with {dir}, shared files (name, bytes) created at final size, expected files)
    "N-N": (4, "--rw=write --bs=1m --size=8m --filename={dir}/data.$PHAROS_RANK", [], 4),
    "N-1": (
        4,
        "--rw=write --bs=256k --size=4m --filename={dir}/shared --offset=$((PHAROS_RANK*4))m",
        [("shared", 16 * MiB)],
        1,
    ),
    "N-M": (
        4,
        "--rw=write --bs=256k --size=4m --filename={dir}/part.$((PHAROS_RANK/2)) --offset=$(((PHAROS_RANK%2)*4))m",
        [("part.0", 8 * MiB), ("part.1", 8 * MiB)],
        2,
    ),
    "1-1": (1, "--rw=write --bs=64k --size=8m --filename={dir}/single", [], 1),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", list(PATTERN_JOBS))
def test_pattern_through_mount(live: Live, kind: str, tmp_path: Path):
    ranks, args, shared, n_files = PATTERN_JOBS[kind]
    t0 = time.monotonic()
    job_id = f"live-{kind.lower().replace('-', '')}-{os.getpid()}"
    d = live.settings.mount_point / job_id
    d.mkdir()
    for name, size in shared:
        with open(d / name, "wb") as f:
            f.truncate(size)
    cmd = ["sh", "-c", f"exec {FIO} --name={kind} --end_fsync=1 {args.format(dir=d)}"]
    res = run_job(live.settings, job_id, cmd, ranks=ranks, output_dir=tmp_path / "out")
    assert res.exit_code == 0, f"fio failed: {res.rank_exit_codes}"
    fio = fio_totals(res.outputs)
    assert fio["bytes_written"] == ranks * (8 if kind in ("N-N", "1-1") else 4) * MiB
    c = wait_for_summary(live.api, job_id, fio["bytes_written"], timeout_s=60)
    f = wait_for_summary(live.api, job_id, fio["bytes_written"], timeout_s=60, layer="forwarder")
    assert c is not None and f is not None, "the job never reached the API"
    print(
        f"\n[live] {kind}: client pattern {c['pattern']} ({c['io_ranks']} ranks, {c['n_files']} files, "
        f"{c['bytes_written']} B), forwarder pattern {f['pattern']} ({f['io_ranks']} ranks, {f['n_files']} files, "
        f"{f['bytes_written']} B); fio {fio['bytes_written']} B; {time.monotonic() - t0:.1f} s"
    )
    for layer, s in (("client", c), ("forwarder", f)):
        assert s["pattern"] == kind, f"{layer} layer: {s['pattern']} != {kind}"
        assert s["bytes_written"] == fio["bytes_written"], layer
        assert s["io_ranks"] == ranks, layer
        assert s["n_files"] == n_files, layer
        # client: the path the application opened; forwarder: the namespace path under the mount
        root = str(d) if layer == "client" else "/" + job_id
        assert all(x["path"].startswith(root + "/") for x in s["files"]), (layer, [x["path"] for x in s["files"]])
        assert_one_pattern(live.api, [job_id], layer=layer)  # every view says the same (issue 10)


# -- 2. fail-slow targets: precision / recall over 5 runs -----------------------------------------

FAILSLOW_RUNS = [1, 4, 6, 2, 7]  # the slow target of each run (ost3 is kept for the latency test)
FAILSLOW_LIMIT_MB_S = 24  # every target's limit in the fail-slow runs; each rank offers 8 MB/s to its target


@pytest.mark.timeout(200)
def test_failslow_precision_recall(live: Live, tmp_path: Path):
    t_all = time.monotonic()
    runtime, judge_after = 17, 12.0
    tp = fp = fn = 0
    rows = []
    for run, slow in enumerate(FAILSLOW_RUNS):
        target = f"ost{slow}"
        with limited_targets(live, FAILSLOW_LIMIT_MB_S):
            p = start_job(
                live,
                f"live-fs{run}-{os.getpid()}",
                N_TARGETS,
                per_target_fio(live, runtime),
                tmp_path / f"fs{run}",
                "failslow-load",
            )
            try:
                time.sleep(2.0)  # the ranks are writing
                t_fault = time.time()
                live.set_target(target, slowdown=4.0)
                alert_s = None
                while time.time() < t_fault + judge_after:
                    if alert_s is None and any(a["labels"].get("target") == target for a in am_target_alerts(live.am)):
                        alert_s = time.time() - t_fault
                    time.sleep(0.5)
                items = live_failslow(live)
                lat = target_mean_latency(live, 5)
            finally:
                rc = finish(p, runtime + 15)
                live.set_target(target, slowdown=1.0)
        assert rc == 0, f"run {run}: pharos run exited {rc}: {p.stderr.read().decode()[-1500:]}"
        flagged = {a["node"] for a in items if a["active"]}
        tp += target in flagged
        fn += target not in flagged
        fp += len(flagged - {target})
        healthy = sorted(v for k, v in lat.items() if k != target)
        med = healthy[len(healthy) // 2] if healthy else float("nan")
        slow_a = next((a for a in items if a["node"] == target), None)
        rows.append(
            (
                run,
                target,
                sorted(flagged),
                slow_a and slow_a["rel_service"],
                lat.get(target, 0) / med,
                max(healthy) / med if healthy else float("nan"),
                len(lat),
                alert_s,
                sorted((a["node"], a["persistence"]) for a in items if not a["active"]),
            )
        )
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    print(
        f"\n[live] fail-slow targets over {len(FAILSLOW_RUNS)} runs (slowdown 4x, windows 5/20/60 s, "
        f"targets limited to {FAILSLOW_LIMIT_MB_S} MB/s, 8 MB/s offered each): precision {precision:.2f} recall {recall:.2f} (tp {tp} fp {fp} fn {fn}); "
        f"{time.monotonic() - t_all:.0f} s"
    )
    for r in rows:
        print(
            f"  run {r[0]} slow {r[1]}: active flagged {r[2]}, model ratio {r[3]}, mean latency slow/healthy-median "
            f"{r[4]:.2f}, worst healthy/median {r[5]:.2f}, loaded targets {r[6]}, "
            f"Alertmanager alert after {'-' if r[7] is None else f'{r[7]:.1f} s'}, inactive (history) {r[8]}"
        )
    assert all(r[6] == N_TARGETS for r in rows), "every target must have been loaded in every run"
    assert precision == 1.0 and recall == 1.0


# -- 4. fault -> Alertmanager latency -------------------------------------------------------------


@pytest.mark.timeout(150)
def test_fault_to_alertmanager_latency(live: Live, tmp_path: Path):
    target = "ost3"
    # an alert left for ost3 by an earlier run would not measure this fault
    deadline = time.monotonic() + 40
    while any(a["labels"].get("target") == target for a in am_target_alerts(live.am)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not any(a["labels"].get("target") == target for a in am_target_alerts(live.am))
    with limited_targets(live, FAILSLOW_LIMIT_MB_S):
        p = start_job(
            live, f"live-lat-{os.getpid()}", N_TARGETS, per_target_fio(live, 80), tmp_path / "lat", "latency-load"
        )
        try:
            time.sleep(6.0)  # healthy load first
            t_fault = time.time()
            live.set_target(target, slowdown=4.0)
            got, t_alert = None, None
            while time.time() < t_fault + 70:
                got = [a for a in am_target_alerts(live.am) if a["labels"].get("target") == target]
                if got:
                    t_alert = time.time()
                    break
                time.sleep(0.25)
            det = httpx.get(
                f"{live.api}/v1/anomalies", params={"kind": "fail_slow_target", "since_s": 120}, timeout=30
            ).json()
        finally:
            p.send_signal(signal.SIGTERM)
            finish(p, 20)
            live.set_target(target, slowdown=1.0)
    assert got, f"no Alertmanager alert for {target} within 70 s; detector {det.get('detector')}"
    latency = t_alert - t_fault
    loop_lat = (det.get("detector") or {}).get("last", {}).get("alert_latencies_s")
    print(
        f"\n[live] fault on {target} (slowdown 4x) -> alert active in Alertmanager after {latency:.1f} s "
        f"(detection period {DIAG_ENV['PHAROS_DIAGNOSIS_DETECT_PERIOD_S']} s, shortest window 5 s); alert severity "
        f"{got[0]['labels']['severity']}, startsAt {got[0]['startsAt']}; detector's onset->accepted latencies {loop_lat}"
    )
    assert latency <= 60
    stored = [a for a in det["items"] if a["node"] == target]
    assert stored and stored[0]["active"], f"the detector did not store {target}: {det['items']}"


# -- 3. interference on a shared forwarding node ----------------------------------------------------

HEAVY_LATENCY_MS = 20


def _interference_targets(live: Live) -> tuple[Path, int, list[int]]:
    """The light job's file (data written beforehand, so its first pass allocates nothing) on a
    target L, and 3 other targets for the heavy job's latency-bound ranks."""
    d = live.settings.mount_point / "intf"
    d.mkdir(exist_ok=True)
    light_f = d / "light.dat"
    if not light_f.exists():
        with open(light_f, "wb") as fh:
            fh.write(os.urandom(4 * MiB))
    (light_t,) = live.layout_targets(light_f)
    heavy_t = [t for t in (5, 6, 7, 4) if t != light_t][:3]
    return light_f, light_t, heavy_t


def _interference_scenario(live: Live, tmp_path: Path, tag: str, heavy_node: str) -> tuple[str, str, dict, dict]:
    """light (1 rank, 256 KiB writes at 4 MB/s on target L) runs alone for 5 s, then heavy joins for
    7 s: ranks 0-2 write 1 MiB requests on 3 other targets that add HEAVY_LATENCY_MS per request
    (so each holds a daemon worker), rank 3 writes at 2 MB/s on target L (a shared, unsaturated
    target in both cases). light is mapped to fwd0, heavy to ``heavy_node``."""
    files = ensure_target_files(live)
    light_f, light_t, heavy_t = _interference_targets(live)
    heavy_files = " ".join([str(files[t]) for t in heavy_t] + [str(files[light_t])])
    light_id, heavy_id = f"live-light-{tag}-{os.getpid()}", f"live-heavy-{tag}-{os.getpid()}"
    live.set_mapping({light_id: ["fwd0"], heavy_id: [heavy_node]})
    light = start_job(
        live,
        light_id,
        1,
        f"{FIO} --name=light --rw=write --bs=256k --size=4m --time_based --runtime=13 --rate=4m --filename={light_f}",
        tmp_path / f"light-{tag}",
        "live-light",
    )
    time.sleep(5.0)
    heavy = start_job(
        live,
        heavy_id,
        4,
        f"sh -c 'set -- {heavy_files}; shift $PHAROS_RANK; r=; [ $PHAROS_RANK = 3 ] && r=--rate=2m; "
        f"exec {FIO} --name=heavy --rw=write --bs=1m --size=4m --time_based --runtime=7 $r --filename=$1'",
        tmp_path / f"heavy-{tag}",
        "live-heavy",
    )
    rc_h, rc_l = finish(heavy, 40), finish(light, 40)
    assert rc_l == 0 and rc_h == 0, (light.stderr.read().decode()[-1000:], heavy.stderr.read().decode()[-1000:])
    fl = wait_for_summary(live.api, light_id, 1, timeout_s=60, layer="forwarder")
    fh = wait_for_summary(live.api, heavy_id, 1, timeout_s=60, layer="forwarder")
    assert fl and fh and fl["bytes_written"] > 0 and fh["bytes_written"] > 0
    time.sleep(2.0)  # late records of the last window settle
    r = httpx.get(f"{live.api}/v1/jobs/{light_id}/interference", timeout=60)
    assert r.status_code == 200, r.text
    return light_id, heavy_id, r.json(), {"light": fl, "heavy": fh}


@pytest.mark.timeout(180)
def test_interference_shared_vs_separate_forwarding_node(live: Live, tmp_path: Path):
    t0 = time.monotonic()
    _, _, heavy_t = _interference_targets(live)
    for t in heavy_t:
        live.set_target(f"ost{t}", added_latency_ms=HEAVY_LATENCY_MS)
    try:
        light, heavy, same, _ = _interference_scenario(live, tmp_path, "same", "fwd0")
        light2, heavy2, sep, _ = _interference_scenario(live, tmp_path, "sep", "fwd1")
    finally:
        for t in heavy_t:
            live.set_target(f"ost{t}", added_latency_ms=0)
        live.set_mapping({})

    def shared_nodes(rep):  # resources shared with the other job (not with requests of no job, "")
        return {
            (s["resource_type"], s["resource"])
            for w in rep["shared_windows"]
            for s in w["shared"]
            if set(s["jobs"]) - {""}
        }

    ev = same["events"]
    print(
        f"\n[live] same node: {len(ev)} event(s) "
        + "; ".join(
            f"{e['job_id']} slowed {e['latency_ratio']}x ({e['baseline_latency_ms']} -> {e['latency_ms']} ms, queue wait "
            f"{e['baseline_queue_wait_ms']} -> {e['queue_wait_ms']} ms) by {e['culprit_job']} on {e['resource_type']} "
            f"{e['resource']}, {e['windows']} windows, baseline {e['baseline_source']}"
            for e in ev
        )
    )
    print(
        f"[live] separate nodes: {len(sep['events'])} event(s); shared resources {sorted(shared_nodes(sep))}; "
        "light latency per window (ms) " + str([w["latency_ms"] for w in sep["shared_windows"]])
    )
    print(
        f"[live] same node: shared resources {sorted(shared_nodes(same))}; light latency per window (ms) "
        + str([w["latency_ms"] for w in same["shared_windows"]])
        + f"; both scenarios {time.monotonic() - t0:.0f} s"
    )
    # forced onto fwd0 together: an event naming the heavy job on the forwarding node
    assert ("forwarding_node", "fwd0") in shared_nodes(same)
    assert ev, "no interference event with both jobs on fwd0"
    assert {(e["culprit_job"], e["resource_type"], e["resource"]) for e in ev} == {(heavy, "forwarding_node", "fwd0")}
    # on separate nodes they still share a target, but nothing interferes
    assert not any(t == "forwarding_node" for t, _ in shared_nodes(sep)), "mapping did not separate the jobs"
    assert any(t == "target" for t, _ in shared_nodes(sep))
    assert sep["events"] == []
    # the server's periodic detection stored the shared-node event too, and none for the separate run
    deadline = time.monotonic() + 20
    while True:
        items = httpx.get(
            f"{live.api}/v1/anomalies", params={"kind": "interference", "since_s": 300}, timeout=30
        ).json()["items"]
        mine = [i for i in items if i["job_id"] == light]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert mine and {i["culprit_job"] for i in mine} == {heavy}, items
    assert not [i for i in items if i["job_id"] == light2 or i["culprit_job"] == heavy2], items


# Panels with nothing to show on this module's runs, and why. Every other panel must have rows.
EMPTY_ON_THIS_RUN = {
    "pharos-job": {"Stored findings (straggler resources)"},  # no job here has a slow resource in common
    "pharos-forwarders": {
        "Fail-slow forwarding nodes",  # the faults here are on targets
        "Reserved (dedicated) nodes",  # the control loop is off (PHAROS_CONTROL_PERIOD_S=0)
    },
    # placement (performance-aware pools) is the control loop's, off here; `pharos run`'s
    # default mappings are control actions too, so the other control panels have rows
    "pharos-targets": {"Pool membership", "annotation Control actions"},
}


@pytest.mark.timeout(300)
def test_dashboards_on_this_run(live: Live):
    """Every variable, panel and annotation query of every dashboard, expanded as Grafana and
    the ClickHouse plugin expand them, on the store of this module's real runs (agent and
    forwarder layers, fail-slow targets, interference): no query fails, every panel has the
    columns it reads, and every panel has rows but those the run gives nothing to show
    (EMPTY_ON_THIS_RUN). Runs after the other tests of the module (it stops the stack: chDB
    is one process's); the Job dashboard shows the light job of the shared-node interference
    run."""
    from dashboard_check import check_dashboard, dashboards, time_range

    from pharos_core.store import open_store

    stack.stop(live.settings)
    store = open_store(live.settings)
    try:
        light = store.query(
            "SELECT job_id FROM anomalies WHERE kind = 'interference' AND job_id LIKE 'live-light-same-%' LIMIT 1"
        )
        assert light, "no stored interference event: run the whole module (this test reads its runs)"
        make = time_range(
            datetime.fromtimestamp(live.started - 60, UTC), datetime.fromtimestamp(time.time() + 60, UTC), 5.0
        )
        errors, empty = [], {}
        for uid in sorted(dashboards()):
            out = check_dashboard(store, uid, make, {"job": light[0]["job_id"]})
            errors += out.errors
            empty[uid] = out.empty
        print("\n[live] dashboards: no rows in " + "; ".join(f"{u}: {sorted(e)}" for u, e in empty.items() if e))
        assert not errors, "\n".join(errors)
        unexpected = {u: sorted(e - EMPTY_ON_THIS_RUN.get(u, set())) for u, e in empty.items()}
        assert not any(unexpected.values()), f"panels without rows on a run that has data for them: {unexpected}"
    finally:
        store.close()
