"""Priced insights on real traced runs (issue 24, item 2): each case runs twice through the real
stack (eBPF agent, pharos-mount FUSE client, two forwarding daemons on 8 targets, Kafka, the
pipeline and the API on chDB), once clean and once with one defect and the same bytes; the
seconds the defect's insight prices must be within 2x of the measured difference of the two
runs' times (the jobs' run time from start to end, as ``pharos run`` records them).

Cases (fio, psync, on the mount):

* small writes: 96 MiB in 4 KiB writes vs in 1 MiB writes (priced against the site's large-
  write bandwidth: the clean run's; 48 MiB's loss came to 0.89 s, under the 1 s the price needs);
* fsync per write: 96 MiB in 16 KiB writes, fsync after each vs one at the end (64 MiB's
  loss came within a hair of the 1 s the price needs, 0.99 s, on a loaded host);
* a slow storage target (system side): 16 ranks write 16 MiB each to their own file, 2 files
  per target, every target limited to 16 MB/s, one slowed 4x (the daemons' fault interface)
  vs none slowed (priced as the time of its files beyond the peers' median performance).

``pharos diagnose`` of each faulty run is printed (run with ``-s`` to see it). Needs root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pharos_testkit import StackAdmin, running_stack

from pharos_agents.runner import run_job
from pharos_api import stack
from pharos_api.cli_jobs import api_headers
from pharos_api.demo import fio_totals, wait_for_summary

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the eBPF agent, job cgroups and FUSE need root"),
]

FIO = "fio --ioengine=psync --output-format=json --disk_util=0 --name=priced"
MiB = 1 << 20

#: case -> (ranks, clean fio arguments, faulty fio arguments, the insight that prices the defect).
#: ``{d}``: the job's directory on the mount; ``$PHAROS_RANK``: the rank.
CASES = {
    "small_writes": (
        1,
        "--rw=write --bs=1m --size=96m --end_fsync=1 --filename={d}/data",
        "--rw=write --bs=4k --size=96m --end_fsync=1 --filename={d}/data",
        "small_writes",
    ),
    "fsync": (
        1,
        "--rw=write --bs=16k --size=96m --end_fsync=1 --filename={d}/data",
        "--rw=write --bs=16k --size=96m --fsync=1 --filename={d}/data",
        "fsync_storm",
    ),
}


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> StackAdmin:
    """The whole embedded stack; no control loop (it would remap the runs' jobs)."""
    env = {"PHAROS_CONTROL_PERIOD_S": "0", "PHAROS_FWD_WORKERS": "2"}
    state = tmp_path_factory.mktemp("priced")
    with running_stack(state, "pharos-priced", env, fwd_nodes=2, fwd_targets=8, fwd_target_limits_mb_s=[]) as s:
        # A warm-up job first: the stack's first job once ran 1.3 s slower than the same job's
        # faulty twin (first connections of the mount and daemons, cold caches, on a loaded host),
        # which no price can be judged against.
        run(s, "warmup", 1, "--rw=write --bs=1m --size=16m --end_fsync=1 --filename={d}/data", state / "warmup")
        yield StackAdmin(s)


def run(settings, job_id: str, ranks: int, args: str, out: Path, made: bool = False) -> tuple[float, int]:
    """Run fio as job ``job_id`` on the mount (in its directory, made here unless ``made``);
    (its run time in s, bytes written)."""
    d = settings.mount_point / job_id
    if not made:
        d.mkdir()
    sh = f"exec {FIO} {args.format(d=d)}"
    res = run_job(settings, job_id, ["sh", "-c", sh], ranks=ranks, output_dir=out)
    assert res.exit_code == 0, f"fio failed: {res.rank_exit_codes}"
    written = fio_totals(res.outputs)["bytes_written"]
    assert wait_for_summary(settings.api_url, job_id, written, timeout_s=90) is not None, job_id
    return (res.end_ns - res.start_ns) / 1e9, written


def insights(settings, job_id: str) -> dict[str, dict]:
    r = httpx.get(f"{settings.api_url}/v1/jobs/{job_id}/insights", headers=api_headers(), timeout=120)
    r.raise_for_status()
    got = r.json()["insights"]
    lost = [i["seconds_lost"] for i in got if i["seconds_lost"] is not None]
    assert lost == sorted(lost, reverse=True), "insights are not ordered by seconds lost"
    return {i["id"]: i for i in got}


def diagnose_text(settings, job_id: str) -> str:
    env = dict(os.environ, **stack.settings_env(settings), COLUMNS="200")
    p = subprocess.run(
        [sys.executable, "-m", "pharos_api.cli", "diagnose", job_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(CASES))
def test_price_within_2x_of_the_measured_loss(live, case: str, tmp_path: Path):
    ranks, clean_args, faulty_args, insight = CASES[case]
    tag = f"{case.replace('_', '')}-{os.getpid()}"
    t_clean, b_clean = run(live.settings, f"clean-{tag}", ranks, clean_args, tmp_path / "clean")
    t_faulty, b_faulty = run(live.settings, f"faulty-{tag}", ranks, faulty_args, tmp_path / "faulty")
    assert b_clean == b_faulty  # the same bytes, only the defect differs
    check_price(live.settings, case, tag, insight, t_clean, t_faulty)


def check_price(settings, case: str, tag: str, insight: str, t_clean: float, t_faulty: float) -> None:
    """The faulty run's ``insight`` prices t_faulty - t_clean within 2x; the clean run's does not."""
    measured = t_faulty - t_clean
    got = insights(settings, f"faulty-{tag}")
    assert insight in got, f"{insight} not found: {sorted(got)}"
    est = got[insight]["seconds_lost"]
    print(
        f"\n[priced] {case}: clean {t_clean:.2f} s, faulty {t_faulty:.2f} s, measured loss {measured:.2f} s, "
        f"{insight} priced {est} s ({got[insight]['evidence']['seconds_lost_basis']})"
    )
    print(diagnose_text(settings, f"faulty-{tag}"))
    assert measured > 1.0, f"the defect cost too little to judge a price ({measured:.2f} s)"
    assert est is not None and measured / 2 <= est <= 2 * measured, (est, measured)
    # the clean run has no such finding, or a much smaller one
    clean = insights(settings, f"clean-{tag}").get(insight)
    assert clean is None or (clean["seconds_lost"] or 0) < est / 4, clean


N_TARGETS, RANKS, PER_RANK_MIB, LIMIT_MB_S = 8, 16, 16, 16


@pytest.mark.timeout(600)
def test_slow_target_priced_within_2x(live: StackAdmin, tmp_path: Path):
    """16 ranks, each its own file, 2 files per target (the daemons place new files round-robin:
    checked in the layout sidecars), every target at LIMIT_MB_S; faulty: one target slowed 4x."""
    tag = f"slowtarget-{os.getpid()}"
    args = f"--rw=write --bs=1m --size={PER_RANK_MIB}m --end_fsync=1 --filename={{d}}/data.$PHAROS_RANK"
    times = {}
    for t in range(N_TARGETS):
        live.set_target(f"ost{t}", max_perf_mb_s=float(LIMIT_MB_S))
    try:
        for kind in ("clean", "faulty"):
            d = live.settings.mount_point / f"{kind}-{tag}"
            d.mkdir()
            per: dict[int, int] = {}
            for r in range(RANKS):
                (d / f"data.{r}").touch()
                (t,) = live.layout_targets(d / f"data.{r}")
                per[t] = per.get(t, 0) + 1
            assert per == dict.fromkeys(range(N_TARGETS), 2), f"not round-robin: {per}"
            slow = "ost3"
            if kind == "faulty":
                live.set_target(slow, slowdown=4.0)
            try:
                times[kind], _ = run(live.settings, f"{kind}-{tag}", RANKS, args, tmp_path / kind, made=True)
            finally:
                live.set_target(slow, slowdown=1.0)
    finally:
        for t in range(N_TARGETS):
            live.set_target(f"ost{t}", max_perf_mb_s=0.0)
    check_price(live.settings, "slow target", tag, "straggler_resource", times["clean"], times["faulty"])
