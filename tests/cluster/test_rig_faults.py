"""Faults on the rig (issue 25), the ones of ``make test``: a forwarding node's link cut mid-job,
shorter and longer than the mounts' request timeout.

A reduced rig (one broker, the server, fwd0 and fwd1, cn0 and cn1; every mount with an 8 s request
timeout, ``--rpc-timeout-ms 8000``) runs two-node fio jobs (one rank per node, each writing its own
file at a fixed rate and reading every block back to check it, ``--verify=crc32c``). Each job is
pinned to fwd0 and fwd1 (``PUT /v1/control/pins``: per compute node, cn0 -> fwd0 and cn1 -> fwd1,
the mounts' defaults), so that a control cycle that finds a daemon slow to answer on a loaded
machine cannot move the job first. cn0's mount sends the job's requests to fwd0; 3 s into the
job, fwd0's link is cut
(``ip link set eth0 down`` in its namespace: the bridge drops everything to and from it), then
restored.

* Cut shorter than the timeout (3 s): cn0's requests wait and TCP resumes them (no failover);
  fwd0's records, which could not reach Kafka meanwhile, wait in its producer. The job took about
  the cut longer than its rate allows.
* Cut longer than the timeout (15 s, issue 25, item 5): cn0's mount fails over to fwd1 and replays
  the requests fwd0 did not answer (``pharos_mount_replays`` > 0 on cn0's mount); fwd0 may have
  executed some before the cut hid its reply, and both daemons then recorded them. The records
  carry the mount's request id and replay flag, and the forwarder layer counts a replayed request
  once (before: +1 MiB for 2 replays, measured with a 10 s cut and a 3 s timeout). cn0 is served
  by fwd0 and fwd1.

Checked in both: the job completes and fio verified every byte, both layers show exactly fio's
bytes written and read (none lost, none twice), the pipeline has no gap, drop or dead letter.

Not here (issue 25's fault schedule, ``bench/cluster.py --faults``): brokers killed and
partitioned, packet loss and bandwidth caps, the server killed, a daemon stopped.
Needs root (namespaces, eBPF, cgroups, FUSE), MPICH and fio.
"""

from __future__ import annotations

import os
import re
import time

import pytest
from cluster_testkit import (
    MOUNT_ADMIN_PORT,
    FioJob,
    fio_results,
    rig_available,
    running_rig,
    sh,
    start_fio_job,
    wait_summary,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (namespaces, eBPF, cgroups, FUSE)"),
]

RATE_MIB_S = 4
SIZE_MIB = 40  # per rank: 10 s at the rate
RPC_TIMEOUT_S = 8.0  # every mount's --rpc-timeout-ms
CUT_AFTER_S, SHORT_CUT_S, LONG_CUT_S = 3.0, 3.0, 15.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    why = rig_available()
    if why:
        pytest.fail(why)
    mount_args = ["--rpc-timeout-ms", str(int(RPC_TIMEOUT_S * 1000))]
    with running_rig(tmp_path_factory.mktemp("rig"), compute=2, fwd=2, brokers=1, mount_args=mount_args) as r:
        yield r


def admin_headers(rig) -> dict[str, str]:
    """The mounts' admin interface's Authorization header (the site's admin token)."""
    return {"Authorization": f"Bearer {(rig.root / 'site' / 'fwd-admin.token').read_text().strip()}"}


def mount_replays(rig, node: str) -> int:
    """The ``pharos_mount_replays`` counter of ``node``'s mount (``GET /metrics`` on its admin
    port, with the site's admin token)."""
    r = rig.client("server").get(
        f"http://{rig.nodes[node].addr}:{MOUNT_ADMIN_PORT}/metrics", headers=admin_headers(rig)
    )
    r.raise_for_status()
    m = re.search(r"^pharos_mount_replays(?:_total)?(?:\{[^}]*\})? (\d+)", r.text, re.M)
    assert m, r.text
    return int(m.group(1))


def pin_job(rig, job_id: str) -> None:
    """Pins ``job_id`` to fwd0 and fwd1 and waits until cn0's mount maps it to fwd0 and cn1's to
    fwd1 (the control loop pushes pins at its next cycle). Fails after 60 s."""
    api = rig.client("server")
    r = api.request(
        "PUT",
        f"{rig.api_url}/v1/control/pins/jobs/{job_id}",
        json={"nodes": ["fwd0", "fwd1"], "reason": "issue 25: fwd0's link cut"},
    )
    assert r.status_code == 200, r.text
    want, got = {"cn0": ["fwd0"], "cn1": ["fwd1"]}, {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and got != want:
        for n in ("cn0", "cn1"):
            url = f"http://{rig.nodes[n].addr}:{MOUNT_ADMIN_PORT}/mapping"
            got[n] = api.get(url, headers=admin_headers(rig)).json()["jobs"].get(job_id)
        time.sleep(1)
    assert got == want, f"each mount's entry for {job_id}: {got}"


def cut_job(rig, job_id: str, cut_s: float) -> tuple[FioJob, dict, float, float]:
    """Runs a two-node fio job (pinned: :func:`pin_job`) and cuts fwd0's link for ``cut_s`` seconds 3 s
    into it: (job, fio's totals, seconds the job took, seconds from the link's return to the job's
    end). Fails unless fio exits 0 having verified every byte."""
    job = FioJob(job_id, "N-N", ["cn0", "cn1"], SIZE_MIB, fio_args=f"--rate={RATE_MIB_S}m")
    pin_job(rig, job_id)
    t0 = time.monotonic()
    start_fio_job(rig, job)
    time.sleep(CUT_AFTER_S)
    fwd0 = rig.nodes["fwd0"]
    sh("ip", "-n", fwd0.ns, "link", "set", "eth0", "down")
    try:
        time.sleep(cut_s)
    finally:
        sh("ip", "-n", fwd0.ns, "link", "set", "eth0", "up")
    t_up = time.monotonic()
    job.exit_code = job.proc.wait(240)
    took = time.monotonic() - t0
    fio, verified = fio_results(job)
    assert job.exit_code == 0 and verified, f"fio exit {job.exit_code}, {fio}: data not verified"
    return job, fio, took, took - (t_up - t0)


def exact_layers(rig, job: FioJob, fio: dict) -> tuple[dict, list[str]]:
    """Both layers' summaries once complete; asserts each shows exactly fio's bytes written and read
    on cn0 and cn1. Returns (the forwarder layer's summary, one line per layer)."""
    lines, s = [], {}
    for layer in ("client", "forwarder"):
        s = wait_summary(rig, job.job_id, layer, fio["bytes_written"], 120)
        line = (
            f"{layer}: {s.get('bytes_written')} B written, {s.get('bytes_read')} B read on {s.get('compute_nodes')} "
            f"via {s.get('forwarding_nodes')}, complete {s.get('complete')}, replayed requests "
            f"{s.get('replayed_requests')} ({s.get('duplicate_requests')} executed twice, counted once)"
        )
        lines.append(line)
        assert (s.get("bytes_written"), s.get("bytes_read")) == (fio["bytes_written"], fio["bytes_read"]), line
        assert s["compute_nodes"] == ["cn0", "cn1"] and s["complete"], line
    return s, lines


def pipeline_losses(rig) -> tuple[int, int, int]:
    """The pipeline's gaps, dropped records and dead letters since the rig started."""
    p = rig.api("pipeline")
    return p["gaps"], p["dropped_records"], p["dead_letters"]


def assert_no_loss(before: tuple[int, int, int], after: tuple[int, int, int], lines: list[str]) -> None:
    """No gap, drop or dead letter in the pipeline, since the rig started (``after``), and during the
    job (``after`` - ``before``, in the printed line)."""
    during = tuple(a - b for a, b in zip(after, before, strict=True))
    print(f"  pipeline: gaps, drops, dead letters {after} since the rig started, {during} during the job")
    assert after == (0, 0, 0), "\n".join(lines)


@pytest.mark.timeout(600)
def test_forwarding_node_link_cut_shorter_than_the_timeout(rig):
    replays0, losses0 = mount_replays(rig, "cn0"), pipeline_losses(rig)
    job, fio, took, after = cut_job(rig, "cut-fwd0", SHORT_CUT_S)
    fwd, lines = exact_layers(rig, job, fio)
    alone = SIZE_MIB / RATE_MIB_S
    print(
        f"\n[rig fault] fwd0 cut {SHORT_CUT_S:.0f} s (< {RPC_TIMEOUT_S:.0f} s timeout) at {CUT_AFTER_S:.0f} s: job "
        f"done {after:.1f} s after the link came back, {took:.1f} s in all ({alone:.0f} s at its rate without the "
        f"cut); fio wrote and verified {fio['bytes_written']} B\n  " + "\n  ".join(lines)
    )
    assert fwd["forwarding_nodes"]["cn0"] == ["fwd0"], "cn0's requests should have waited for fwd0, not failed over"
    assert mount_replays(rig, "cn0") == replays0, "no request should have been replayed"
    assert took >= alone + SHORT_CUT_S * 0.5, "the cut should have held cn0's rank"
    assert_no_loss(losses0, pipeline_losses(rig), lines)


@pytest.mark.timeout(600)
def test_forwarding_node_link_cut_longer_than_the_timeout_replays_once(rig):
    """Issue 25, item 5: failover with replay, each request counted once on the forwarder layer."""
    replays0, losses0 = mount_replays(rig, "cn0"), pipeline_losses(rig)
    job, fio, took, after = cut_job(rig, "cut-fwd0-failover", LONG_CUT_S)
    replays = mount_replays(rig, "cn0") - replays0
    fwd, lines = exact_layers(rig, job, fio)
    print(
        f"\n[rig fault] fwd0 cut {LONG_CUT_S:.0f} s (> {RPC_TIMEOUT_S:.0f} s timeout) at {CUT_AFTER_S:.0f} s: cn0's "
        f"mount replayed {replays} request(s) on fwd1; job done {after:.1f} s after the link came back, {took:.1f} s "
        f"in all; fio wrote and verified {fio['bytes_written']} B\n  " + "\n  ".join(lines)
    )
    assert replays > 0, "cn0's mount should have replayed the requests fwd0 did not answer"
    assert fwd["forwarding_nodes"]["cn0"] == ["fwd0", "fwd1"], "cn0 should have failed over from fwd0 to fwd1"
    assert fwd["forwarding_nodes"]["cn1"] == ["fwd1"], lines
    assert 0 < fwd["replayed_requests"] <= replays, (fwd["replayed_requests"], replays)
    assert_no_loss(losses0, pipeline_losses(rig), lines)
