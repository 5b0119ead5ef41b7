"""DFRA at job start on the REAL stack (issue 9, "DFRA at start"; Ji et al. FAST'19 §3-4).

One embedded stack of its own (``pharos up``: Kafka broker, eBPF agent, the 4 forwarding daemons
fwd0..fwd3 of which fwd2 and fwd3 are reserved, the FUSE mount, pipeline + analytics + API + the
control loop on chDB). The classifier's thresholds are lowered by configuration for this
machine's size (``PHAROS_CONTROL_*``: 64 MiB and 4 I/O ranks benefit, 64 MiB is "very high
volume" and gets dedicated nodes; one node's capacity 10 GB/s so one dedicated node is enough).
Real fio jobs (4 ranks x 32 MiB, N-N) run through ``pharos run`` on the mount:

1. the first run of a name/user/command has no history: default mapping (fwd0), its forwarder
   records are on fwd0 only;
2. once its profile is stored, the second run with the same name, user and command gets a
   dedicated reserved node before its first I/O (the decision is recorded before the job's first
   forwarder record), and the forwarding daemons' records of ALL its requests carry that node
   only, for exactly fio's bytes; the node is returned when the job ends;
3. a third job with another name keeps the default mapping.

Needs root (eBPF, cgroups, FUSE).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from pharos_testkit import dfra_live_env, forwarder_nodes, stack_settings

from pharos_agents.runner import _user
from pharos_api import stack
from pharos_api.demo import fio_totals, wait_for_summary
from pharos_core.settings import Settings

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the eBPF agent, job cgroups and FUSE need root"),
]

MiB = 1 << 20
RANKS = 4
CONTROL_ENV = dfra_live_env(RANKS)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The whole stack on free ports and its own state dir (4 daemons: the defaults), stopped at
    the module's end."""
    state = tmp_path_factory.mktemp("dfra")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CONTROL_ENV.items():
            mp.setenv(k, v)
        settings = stack_settings(state, "pharos-dfra")
        assert settings.fwd_nodes == 4
        t0 = time.monotonic()
        try:
            stack.start(settings)
            print(f"\n[dfra] stack ready in {time.monotonic() - t0:.1f} s (state {state})")
            yield settings
        finally:
            stack.stop(settings)


def pharos_run(settings: Settings, job_id: str, name: str, data_dir: Path, out: Path) -> tuple[int, str]:
    """``pharos run`` as a user runs it; the same command for every job (the history matches
    it exactly): fio N-N, each rank writing DIR/<job>.<rank>. Returns (exit code, stderr)."""
    rank = (
        "exec fio --name=dfra --ioengine=psync --rw=write --bs=1m --size=32m --end_fsync=1 "
        f"--output-format=json --disk_util=0 --filename={data_dir}/$PHAROS_JOB_ID.$PHAROS_RANK"
    )
    argv = [sys.executable, "-m", "pharos_api.cli", "run", "--job", job_id, "--ranks", str(RANKS)]
    argv += ["--name", name, "--output-dir", str(out), "--", "sh", "-c", rank]
    env = dict(os.environ, **stack.settings_env(settings))
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    return p.returncode, p.stderr.decode(errors="replace")


def dfra_action(api: str, job_id: str) -> dict:
    items = httpx.get(f"{api}/v1/control/actions", params={"job": job_id}, timeout=30).json()["items"]
    dfra = [a for a in items if a["kind"].startswith("dfra_")]
    assert len(dfra) == 1, items
    return dfra[0]


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def run_and_measure(live: Settings, job_id: str, name: str, tmp_path: Path) -> dict:
    """Run one job, wait until both layers stored all of fio's bytes; returns what was seen."""
    data_dir = live.mount_point / "dfra"
    data_dir.mkdir(exist_ok=True)
    t0 = time.monotonic()
    rc, err = pharos_run(live, job_id, name, data_dir, tmp_path / job_id)
    assert rc == 0, err[-2000:]
    fio = fio_totals(sorted((tmp_path / job_id).glob("rank_*.out")))
    assert fio["bytes_written"] == RANKS * 32 * MiB
    client = wait_for_summary(live.api_url, job_id, fio["bytes_written"], timeout_s=90)
    fwd = wait_for_summary(live.api_url, job_id, fio["bytes_written"], timeout_s=90, layer="forwarder")
    assert client is not None and client["bytes_written"] == fio["bytes_written"], client
    assert fwd is not None and fwd["bytes_written"] == fio["bytes_written"], fwd
    nodes = forwarder_nodes(live.api_url, job_id)
    lines = [ln for ln in err.splitlines() if ln.startswith("pharos run:")]
    print(f"[dfra] {job_id} ({name}) in {time.monotonic() - t0:.1f} s: {lines}; forwarder bytes per node {nodes}")
    return {"fio": fio, "client": client, "fwd": fwd, "nodes": nodes, "lines": lines, "stderr": err}


def wait_class(api: str, name: str, command: list[str], want: str, timeout_s: float = 60) -> dict:
    """Poll the preview (GET /v1/hints, nothing recorded) until the history gives ``want``."""
    deadline = time.monotonic() + timeout_s
    while True:
        p = httpx.get(f"{api}/v1/hints", params={"name": name, "user": _user(), "command": command}, timeout=30)
        assert p.status_code == 200, p.text
        if p.json()["class"] == want or time.monotonic() > deadline:
            return p.json()
        time.sleep(1.0)


@pytest.mark.timeout(900)
def test_dfra_dedicated_node_before_first_io_on_the_real_stack(live: Settings, tmp_path: Path):
    api = live.api_url
    tag = os.getpid()
    name = f"dfra-nn-{tag}"
    mount_admin = "http://" + json.loads(stack.ready_file(live, "mount").read_text())["admin"]
    mapping = httpx.get(mount_admin + "/mapping", headers=live.fwd_admin_headers(), timeout=10).json()
    assert [n["name"] for n in mapping["nodes"]] == ["fwd0", "fwd1", "fwd2", "fwd3"]
    assert mapping["default"] == "fwd0"  # the mount's default is a shared node, never fwd2/fwd3

    # 1. no history: the default mapping
    first = run_and_measure(live, f"dfra-a1-{tag}", name, tmp_path)
    a1 = dfra_action(api, f"dfra-a1-{tag}")
    assert a1["kind"] == "dfra_default" and a1["reason"].startswith("no earlier run"), a1
    assert first["lines"] == [f"pharos run: job dfra-a1-{tag}: forwarding default on fwd0 (applied)"]
    assert set(first["nodes"]) == {"fwd0"} and sum(first["nodes"].values()) == first["fio"]["bytes_written"]
    assert first["fwd"]["pattern"] == "N-N" and first["fwd"]["io_ranks"] == RANKS

    # its profile is stored: the next run of the same name/user/command is classified "dedicated"
    command = first["client"]["command"]  # as the start event of `pharos run` recorded it
    assert command[:2] == ["sh", "-c"] and "$PHAROS_JOB_ID" in command[2]
    preview = wait_class(api, name, command, "dedicated")
    assert preview["class"] == "dedicated" and preview["evidence"]["jobs"] == [f"dfra-a1-{tag}"], preview

    # 2. the same job again: a dedicated reserved node, applied before its first I/O
    second = run_and_measure(live, f"dfra-a2-{tag}", name, tmp_path)
    a2 = dfra_action(api, f"dfra-a2-{tag}")
    assert a2["kind"] == "dfra_dedicated" and a2["status"] == "applied", a2
    dedicated = a2["to_state"].split(",")
    assert dedicated == ["fwd2"] and a2["evidence"]["decision"]["reserved"] == dedicated
    assert second["lines"] == [f"pharos run: job dfra-a2-{tag}: forwarding dedicated on fwd2 (applied)"]
    assert ts(a2["time"]) < ts(second["fwd"]["first_io"]), (a2["time"], second["fwd"]["first_io"])
    # every forwarder record of the job carries the dedicated node, for all of fio's bytes
    assert set(second["nodes"]) == set(dedicated), second["nodes"]
    assert sum(second["nodes"].values()) == second["fio"]["bytes_written"]

    # the reserved node is returned once the job has ended
    deadline = time.monotonic() + 60
    released: list[dict] = []
    while not released and time.monotonic() < deadline:
        items = httpx.get(f"{api}/v1/control/actions", params={"kind": "release"}, timeout=30).json()["items"]
        released = [a for a in items if a["job_id"] == f"dfra-a2-{tag}"]
        time.sleep(1.0)
    assert [a["resource"] for a in released] == ["node:fwd2"], released

    # 3. another name: no history, the default mapping
    third = run_and_measure(live, f"dfra-b1-{tag}", f"dfra-other-{tag}", tmp_path)
    b1 = dfra_action(api, f"dfra-b1-{tag}")
    assert b1["kind"] == "dfra_default" and b1["reason"].startswith("no earlier run"), b1
    assert set(third["nodes"]) == {"fwd0"} and sum(third["nodes"].values()) == third["fio"]["bytes_written"]
