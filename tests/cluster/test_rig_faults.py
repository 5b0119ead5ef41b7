"""Faults on the rig (issue 25), the ones of ``make test``: a forwarding node's link cut mid-job,
shorter and longer than the mounts' request timeout.

A reduced rig (one broker, the server, fwd0 and fwd1, cn0 and cn1; every mount with an 8 s request
timeout, ``--rpc-timeout-ms 8000``) runs two-node fio jobs (one rank per node, each writing its own
file at a fixed rate and reading every block back to check it, ``--verify=crc32c``). cn0's mount
sends the job's requests to its default forwarding node, fwd0; 3 s into the job, fwd0's link is cut
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


def mount_replays(rig, node: str) -> int:
    """The ``pharos_mount_replays`` counter of ``node``'s mount (``GET /metrics`` on its admin
    port, with the site's admin token)."""
    token = (rig.root / "site" / "fwd-admin.token").read_text().strip()
    c = rig.client("server")
    r = c.get(f"http://{rig.nodes[node].addr}:{MOUNT_ADMIN_PORT}/metrics", headers={"Authorization": f"Bearer {token}"})
    r.raise_for_status()
    m = re.search(r"^pharos_mount_replays(?:_total)?(?:\{[^}]*\})? (\d+)", r.text, re.M)
    assert m, r.text
    return int(m.group(1))


def cut_job(rig, job_id: str, cut_s: float) -> tuple[FioJob, dict, float, float]:
    """Runs a two-node fio job and cuts fwd0's link for ``cut_s`` seconds 3 s into it: (job, fio's
    totals, seconds the job took, seconds from the link's return to the job's end). Fails unless fio
    exits 0 having verified every byte."""
    job = FioJob(job_id, "N-N", ["cn0", "cn1"], SIZE_MIB, fio_args=f"--rate={RATE_MIB_S}m")
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
    on cn0 and cn1, and the pipeline no gap, drop or dead letter. Returns (the forwarder layer's
    summary, one line per layer)."""
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
    p = rig.api("pipeline")
    assert (p["gaps"], p["dropped_records"], p["dead_letters"]) == (0, 0, 0), p
    lines.append(f"pipeline: {p['records']} records, gaps 0, drops 0, dead letters 0")
    return s, lines


@pytest.mark.timeout(600)
def test_forwarding_node_link_cut_shorter_than_the_timeout(rig):
    replays0 = mount_replays(rig, "cn0")
    job, fio, took, after = cut_job(rig, "cut-fwd0", SHORT_CUT_S)
    fwd, lines = exact_layers(rig, job, fio)
    assert fwd["forwarding_nodes"]["cn0"] == ["fwd0"], "cn0's requests should have waited for fwd0, not failed over"
    assert mount_replays(rig, "cn0") == replays0, "no request should have been replayed"
    alone = SIZE_MIB / RATE_MIB_S
    print(
        f"\n[rig fault] fwd0 cut {SHORT_CUT_S:.0f} s (< {RPC_TIMEOUT_S:.0f} s timeout) at {CUT_AFTER_S:.0f} s: job "
        f"done {after:.1f} s after the link came back, {took:.1f} s in all ({alone:.0f} s at its rate without the "
        f"cut); fio wrote and verified {fio['bytes_written']} B\n  " + "\n  ".join(lines)
    )
    assert took >= alone + SHORT_CUT_S * 0.5, "the cut should have held cn0's rank"


@pytest.mark.timeout(600)
def test_forwarding_node_link_cut_longer_than_the_timeout_replays_once(rig):
    """Issue 25, item 5: failover with replay, each request counted once on the forwarder layer."""
    replays0 = mount_replays(rig, "cn0")
    job, fio, took, after = cut_job(rig, "cut-fwd0-failover", LONG_CUT_S)
    replays = mount_replays(rig, "cn0") - replays0
    fwd, lines = exact_layers(rig, job, fio)
    assert replays > 0, "cn0's mount should have replayed the requests fwd0 did not answer"
    assert fwd["forwarding_nodes"]["cn0"] == ["fwd0", "fwd1"], "cn0 should have failed over from fwd0 to fwd1"
    assert fwd["forwarding_nodes"]["cn1"] == ["fwd1"], lines
    assert 0 < fwd["replayed_requests"] <= replays, (fwd["replayed_requests"], replays)
    print(
        f"\n[rig fault] fwd0 cut {LONG_CUT_S:.0f} s (> {RPC_TIMEOUT_S:.0f} s timeout) at {CUT_AFTER_S:.0f} s: cn0's "
        f"mount replayed {replays} request(s) on fwd1; job done {after:.1f} s after the link came back, {took:.1f} s "
        f"in all; fio wrote and verified {fio['bytes_written']} B\n  " + "\n  ".join(lines)
    )
