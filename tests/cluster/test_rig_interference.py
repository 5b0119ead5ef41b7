"""Live remapping on the cluster rig (issue 25, item 4): interference detected on a forwarding node
moves the compute node of the job the control loop chose, with nothing lost.

The rig (tests/cluster_testkit.py) maps its two compute nodes to fwd0 by default (Sunway-like
blocks of two: ``compute_nodes_per_forwarding_node`` = 2); fwd2 and fwd3 are reserved. Every
forwarding daemon has 2 workers and a remote OST's latency on each target (30 ms per request), so
that a forwarding node, not a disk, is what jobs share. Two jobs, started as users start them
(``pharos run`` of ``mpiexec`` on the rig's nodes):

* **light** on cn0: one rank writing 64 KiB at 20 requests/s (fio ``--rate_iops``), checked by
  ``--verify``; alone first, so its quiet baseline is stored;
* **heavy** on cn1: 4 fio threads writing 1 MiB as fast as they can, 8 s after light started:
  both workers of fwd0 are then busy and light's requests queue behind heavy's.

The server's detection (every 5 s, 2 s windows) finds light slowed on fwd0 by heavy; the control
loop (every 2 s) moves the cheaper job (light: fewer bytes on fwd0) to the least loaded shared node,
fwd1, and pushes the move to cn0's mount. Checked from the daemons' records: light's compute node
cn0 is served by fwd0 and then fwd1, heavy's cn1 by fwd0 only; the move is an applied ``remap``
action naming the interference; light's bytes are exactly fio's on both layers and verified.
Live remapping is Pharos's step beyond DFRA (Ji et al., FAST'19), which keeps an allocation fixed
once a job runs. An evaluation (``make evaluate``): a few minutes, and load-sensitive like its
single-host twin tests/control/test_control_interference_live.py.
Needs root (namespaces, eBPF, cgroups, FUSE), MPICH and fio.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime

import pytest
from cluster_testkit import FioJob, fio_results, rig_available, running_rig, start_fio_job, wait_summary

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.evaluation,
    pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (namespaces, eBPF, cgroups, FUSE)"),
]

TARGET_LATENCY_MS = 30
SITE = {
    "PHAROS_COMPUTE_NODES_PER_FORWARDING_NODE": "2",
    "PHAROS_FWD_WORKERS": "2",
    "PHAROS_DIAGNOSIS_DETECT_PERIOD_S": "5",
    "PHAROS_DIAGNOSIS_INTERFERENCE_WINDOW_S": "2",
    "PHAROS_DIAGNOSIS_INTERFERENCE_LOOKBACK_S": "120",
    "PHAROS_DIAGNOSIS_FAILSLOW_WINDOWS_S": "[5, 20, 60]",
    "PHAROS_CONTROL_PERIOD_S": "2",
    "PHAROS_CONTROL_PLACEMENT_ENABLED": "false",  # not under test here
}
LIGHT_S = 50
HEAVY_DELAY_S = 8


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    why = rig_available()
    if why:
        pytest.fail(why)
    latency = [a for t in range(4) for a in ("--latency-ms", f"ost{t}={TARGET_LATENCY_MS}")]
    with running_rig(tmp_path_factory.mktemp("rig"), compute=2, fwd=4, brokers=1, fwd_args=latency, env=SITE) as r:
        yield r


@pytest.mark.timeout(900)
def test_interference_moves_the_chosen_jobs_compute_node(rig):
    tag = uuid.uuid4().hex[:6]
    light = FioJob(
        f"rig-light-{tag}", "N-N", ["cn0"], 20 * LIGHT_S // 16, fio_args="--bs=64k --rate_iops=20", name="light"
    )
    heavy = FioJob(
        f"rig-heavy-{tag}",
        "N-N",
        ["cn1"],
        64,
        fio_args=f"--numjobs=4 --verify=0 --time_based --runtime={LIGHT_S - HEAVY_DELAY_S - 10}",
        name="heavy",
    )
    t0 = time.monotonic()
    start_fio_job(rig, light)
    time.sleep(HEAVY_DELAY_S)
    start_fio_job(rig, heavy)
    light.exit_code = light.proc.wait(300)
    heavy.exit_code = heavy.proc.wait(300)
    took = time.monotonic() - t0
    fio, verified = fio_results(light)
    assert light.exit_code == 0 and verified, f"light: fio exit {light.exit_code}, {fio}: data not verified"
    assert heavy.exit_code == 0, f"heavy: fio exit {heavy.exit_code}"

    moves = [
        a for a in rig.api("control/actions", kind="remap")["items"] if a["job_id"] in (light.job_id, heavy.job_id)
    ]
    events = [
        a
        for a in rig.api("anomalies", kind="interference", since_s=3600)["items"]
        if light.job_id in (a.get("job_id"), a.get("culprit_job"))
    ]
    s_light = wait_summary(rig, light.job_id, "forwarder", fio["bytes_written"])
    s_heavy = wait_summary(rig, heavy.job_id, "forwarder", 1)
    c_light = wait_summary(rig, light.job_id, "client", fio["bytes_written"])

    def ts(iso: str) -> float:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()

    after = [ts(m["time"]) - ts(s_heavy["first_io"]) for m in moves if s_heavy.get("first_io")]
    print(
        f"\n[rig interference] moved {after[0] if after else float('nan'):.1f} s after heavy's first request;"
        f"\n  light {light.job_id} on cn0 + heavy {heavy.job_id} on cn1, both on fwd0, {took:.0f} s:"
        f"\n  interference events: {[(e['job_id'], e['culprit_job'], e['node'], e['ratio']) for e in events][:3]}"
        f"\n  remaps: {[(m['job_id'], m['from_state'], m['to_state'], m['status'], m['time']) for m in moves]}"
        f"\n  light served {s_light.get('forwarding_nodes')}, heavy served {s_heavy.get('forwarding_nodes')}"
    )
    assert events, "no interference detected on fwd0"
    applied = [m for m in moves if m["status"] == "applied"]
    assert applied and applied[0]["job_id"] == light.job_id, moves
    assert (applied[0]["from_state"], applied[0]["to_state"]) == ("fwd0", "fwd1"), applied[0]
    assert s_light["forwarding_nodes"] == {"cn0": ["fwd0", "fwd1"]}, s_light["forwarding_nodes"]
    assert s_heavy["forwarding_nodes"] == {"cn1": ["fwd0"]}, s_heavy["forwarding_nodes"]
    for s in (s_light, c_light):
        assert (s.get("bytes_written"), s.get("bytes_read")) == (fio["bytes_written"], fio["bytes_read"]), s
