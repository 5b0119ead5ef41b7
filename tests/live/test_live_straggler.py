"""Straggler attribution on the real stack (issue 10, "what it must show", live).

One real embedded stack (Kafka, eBPF agent, pharos-fwd fwd0/fwd1 on 8 storage targets, the
pharos-mount FUSE client, pipeline + analytics + API on chDB), the control loop off
(``PHAROS_CONTROL_PERIOD_S=0``: it would re-place files). Per run: an N-N fio job of 16 ranks
whose 16 files are placed round-robin on the 8 targets (2 files per target, checked in the
layout sidecars), every target limited to the same rate, one target slowed 4x through the
daemons' fault interface (``PUT /targets/{name} {"slowdown": 4}``) before the job starts.
``GET /v1/jobs/{id}/insights`` must name that target (``straggler_resource``) and no other;
5 runs with a different slow target each; precision and recall printed. The detection loop
stores the finding in ``anomalies`` (kind ``straggler_resource``), checked on the last run.
Bounded: 4 MiB per rank at 1 MiB requests, ~3-6 s of I/O per run. Needs root (eBPF, FUSE).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from pharos_testkit import StackAdmin, assert_one_pattern, running_stack

from pharos_agents.runner import run_job
from pharos_api.demo import wait_for_summary

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the eBPF agent, job cgroups and FUSE need root"),
]

N_TARGETS = 8
RANKS = 16
MiB = 1 << 20
PER_RANK_MIB = 4
LIMIT_MB_S = 16  # every target's token-bucket limit; the slow one gets 16 / 4
SLOW_RUNS = [2, 5, 0, 7, 3]  # the slow target of each run
FIO = "fio --ioengine=psync --output-format=json --disk_util=0"
ENV = {
    "PHAROS_DIAGNOSIS_DETECT_PERIOD_S": "2",
    "PHAROS_FWD_WORKERS": "2",
    "PHAROS_CONTROL_PERIOD_S": "0",
}


class Live(StackAdmin):
    """The running stack's admin handles (faults set through fwd0, checked on every daemon)."""


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    t0 = time.monotonic()
    with running_stack(
        tmp_path_factory.mktemp("live-straggler"),
        "pharos-strag",
        ENV,
        fwd_nodes=2,
        fwd_targets=N_TARGETS,
        fwd_target_limits_mb_s=[],
    ) as settings:
        print(f"\n[straggler] stack ready in {time.monotonic() - t0:.1f} s")
        yield Live(settings)


def round_robin_files(live: Live, d: Path) -> list[Path]:
    """16 files created empty in rank order: the daemon's round-robin puts file r on target
    (first + r) mod 8; the layout sidecars say which, and every target gets exactly 2."""
    d.mkdir()
    files = []
    for r in range(RANKS):
        p = d / f"data.{r}"
        p.touch()
        files.append(p)
    per: dict[int, int] = {}
    for p in files:
        (t,) = live.layout_targets(p)
        per[t] = per.get(t, 0) + 1
    assert per == dict.fromkeys(range(N_TARGETS), 2), f"not round-robin: {per}"
    return files


@pytest.mark.timeout(240)
def test_straggler_names_the_slowed_target(live: Live, tmp_path: Path):
    t_all = time.monotonic()
    tp = fp = fn = 0
    lines = []
    for t in range(N_TARGETS):
        live.set_target(f"ost{t}", max_perf_mb_s=float(LIMIT_MB_S))
    try:
        for run, slow in enumerate(SLOW_RUNS):
            t0 = time.monotonic()
            target = f"ost{slow}"
            job_id = f"strag{run}-{os.getpid()}"
            d = live.settings.mount_point / job_id
            files = round_robin_files(live, d)
            live.set_target(target, slowdown=4.0)
            try:
                cmd = [
                    "sh",
                    "-c",
                    f"exec {FIO} --name=nn --rw=write --bs=1m --size={PER_RANK_MIB}m --end_fsync=1 "
                    f"--filename={d}/data.$PHAROS_RANK",
                ]
                res = run_job(live.settings, job_id, cmd, ranks=RANKS, output_dir=tmp_path / job_id)
            finally:
                live.set_target(target, slowdown=1.0)
            assert res.exit_code == 0, res.rank_exit_codes
            # where the data went (fio may re-create a file, which places it anew)
            placed = {str(p): live.layout_targets(p)[0] for p in files}
            total = RANKS * PER_RANK_MIB * MiB
            s = wait_for_summary(live.api, job_id, total, timeout_s=60, layer="forwarder")
            assert s is not None and s["bytes_written"] >= total, s
            assert_one_pattern(live.api, [job_id], layer="forwarder")  # one pattern in every view (issue 10)
            body = httpx.get(f"{live.api}/v1/jobs/{job_id}/insights", timeout=60).json()
            named = {
                i["evidence"]["resource"]
                for i in body["insights"]
                if i["id"] == "straggler_resource" and i["evidence"]["resource_type"] == "target"
            }
            tp += target in named
            fn += target not in named
            fp += len(named - {target})
            strag = [i for i in body["insights"] if i["id"] == "straggler_resource"]
            ins = next((i for i in strag if i["evidence"]["resource"] == target), strag[0] if strag else None)
            on_slow = sorted(p for p, t in placed.items() if t == slow)
            lines.append(
                f"  run {run} slow {target} (files {[Path(p).name for p in on_slow]}): named {sorted(named)}"
                + f" (all: {[(i['evidence']['resource_type'], i['evidence']['resource']) for i in strag]})"
                + (
                    f", ratio {ins['evidence']['ratio']:.1f}x, r {ins['evidence']['coefficient']:.2f}, "
                    f"p {ins['evidence']['p_value']:.2g}, severity {ins['severity']}"
                    if ins
                    else ""
                )
                + f"; {time.monotonic() - t0:.1f} s"
            )
            if ins and ins["evidence"]["resource"] == target:
                assert sorted(Path(f).name for f in ins["evidence"]["files"]) == sorted(Path(p).name for p in on_slow)
    finally:
        for t in range(N_TARGETS):
            live.set_target(f"ost{t}", max_perf_mb_s=0.0)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    print(
        f"\n[straggler] slow target named over {len(SLOW_RUNS)} runs (16 ranks N-N, 2 files per target, "
        f"targets at {LIMIT_MB_S} MB/s, one slowed 4x): precision {precision:.2f} recall {recall:.2f} "
        f"(tp {tp} fp {fp} fn {fn}); {time.monotonic() - t_all:.0f} s"
    )
    print("\n".join(lines))
    # the detection loop stored the last run's finding as evidence from that job
    last = f"strag{len(SLOW_RUNS) - 1}-{os.getpid()}"
    deadline = time.monotonic() + 20
    items: list[dict] = []
    while time.monotonic() < deadline:
        items = httpx.get(
            f"{live.api}/v1/anomalies", params={"kind": "straggler_resource", "since_s": 600}, timeout=30
        ).json()["items"]
        if any(i["job_id"] == last for i in items):
            break
        time.sleep(1)
    print(f"[straggler] anomalies rows: {[(i['node'], i['job_id']) for i in items]}")
    assert precision == 1.0 and recall == 1.0
    assert [(i["node"], i["node_type"]) for i in items if i["job_id"] == last] == [(f"ost{SLOW_RUNS[-1]}", "target")]
