"""Faults on the rig (issue 25), the ones of ``make test``: a forwarding node cut off mid-job,
shorter and longer than the mounts' request timeout.

A reduced rig (one broker, the server, fwd0 and fwd1, cn0 and cn1; every mount with an 8 s request
timeout, ``--rpc-timeout-ms 8000``) runs two-node fio jobs (one rank per node, each writing its own
file at a fixed rate and reading every block back to check it, ``--verify=crc32c``). Each job is
pinned to fwd0 and fwd1 (``PUT /v1/control/pins``: per compute node, cn0 -> fwd0 and cn1 -> fwd1,
the mounts' defaults), so that a control cycle that finds a daemon slow to answer on a loaded
machine cannot move the job first. cn0's mount sends the job's requests to fwd0; 1 s after its
writes reach fwd0, fwd0 is cut off, then restored:

* link cut shorter than the timeout (3 s; ``ip link set eth0 down`` in fwd0's namespace: the bridge
  drops everything to and from it): cn0's requests wait and TCP resumes them (no failover, no
  replay); fwd0's records, which could not reach Kafka meanwhile, wait in its producer. The job took
  about the cut longer than its rate allows.
* link cut longer than the timeout (15 s, issue 25, item 5): cn0's mount fails over to fwd1 and
  replays the requests fwd0 did not answer (``pharos_mount_replays`` > 0 on cn0's mount); cn0 is
  served by fwd0 and fwd1. A request fwd0 had executed before the cut hid its reply is recorded by
  both daemons; the records carry the mount's request id and replay flag, and the forwarder layer
  counts it once (before: +1 MiB for 2 replays, measured with a 10 s cut and a 3 s timeout).
* fwd0's replies to cn0 dropped for 12 s (iptables in fwd0's namespace, the targets slowed to 0.5
  s per request around its start so that a write is in fwd0 then): the request runs on fwd0 and,
  replayed after the timeout, on fwd1, a double execution every time (``duplicate_requests`` > 0),
  counted once.

Checked in each: the job completes and fio verified every byte, both layers show exactly fio's
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
    FWD_PORT_BASE,
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
MiB = 1 << 20
CUT_AFTER_S, SHORT_CUT_S, LONG_CUT_S, REPLIES_LOST_S = 1.0, 3.0, 15.0, 12.0  # the cut 1 s after writes flow


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
    rig.pin(job_id, ["fwd0", "fwd1"], "issue 25: fwd0's link cut")
    want, got = {"cn0": ["fwd0"], "cn1": ["fwd1"]}, {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and got != want:
        for n in ("cn0", "cn1"):
            url = f"http://{rig.nodes[n].addr}:{MOUNT_ADMIN_PORT}/mapping"
            got[n] = api.get(url, headers=admin_headers(rig)).json()["jobs"].get(job_id)
        time.sleep(1)
    assert got == want, f"each mount's entry for {job_id}: {got}"


def fwd0_link(rig, up: bool) -> None:
    """fwd0's link up or down (``ip link set eth0``: the bridge drops everything to and from it)."""
    sh("ip", "-n", rig.nodes["fwd0"].ns, "link", "set", "eth0", "up" if up else "down")


def fwd0_bytes_written(rig) -> int:
    """Bytes fwd0 has written for its clients since it started (its admin ``/status``)."""
    url = f"http://{rig.nodes['fwd0'].addr}:{FWD_PORT_BASE + 1}/status"
    return int(rig.client("server").get(url, headers=admin_headers(rig)).json()["counters"]["bytes_written"])


def targets_latency(rig, ms: float) -> None:
    """Every storage target's added latency per request (ms), set through fwd0's admin interface
    (the targets' state is shared by the daemons)."""
    url, c = f"http://{rig.nodes['fwd0'].addr}:{FWD_PORT_BASE + 1}/targets", rig.client("server")
    for t in c.get(url, headers=admin_headers(rig)).json():
        r = c.request("PUT", f"{url}/{t['name']}", json={"added_latency_ms": ms}, headers=admin_headers(rig))
        assert r.status_code == 200, r.text


def fwd0_replies_to_cn0(rig, up: bool) -> None:
    """fwd0's packets to cn0 dropped (iptables in fwd0's namespace) or let through again: requests
    arrive and run, their replies are lost. The drop starts while a data request is in fwd0: the
    targets answer 0.5 s late around that moment (cn0's 1 MiB writes come every 0.25 s), so the
    request the drop catches is a write (or a verify read), not a getattr between two."""
    rule = ["OUTPUT", "-d", rig.nodes["cn0"].addr, "-j", "DROP"]
    if up:
        sh("ip", "netns", "exec", rig.nodes["fwd0"].ns, "iptables", "-D", *rule)
        return
    targets_latency(rig, 500)
    try:
        time.sleep(0.7)
        sh("ip", "netns", "exec", rig.nodes["fwd0"].ns, "iptables", "-A", *rule)
        time.sleep(1.0)
    finally:
        targets_latency(rig, 0)


def cut_job(rig, job_id: str, cut_s: float, cut=fwd0_link) -> tuple[FioJob, dict, float, float]:
    """Runs a two-node fio job (pinned: :func:`pin_job`) and cuts fwd0 (``cut(rig, up)``, default its
    link) for ``cut_s`` seconds, 1 s after cn0's writes reach fwd0 (its first 2 MiB: the ranks start
    through ssh, slowly on a loaded machine): (job, fio's totals, seconds the job took, seconds from
    the end of the cut to the job's end). Fails unless fio exits 0 having verified every byte."""
    job = FioJob(job_id, "N-N", ["cn0", "cn1"], SIZE_MIB, fio_args=f"--rate={RATE_MIB_S}m")
    pin_job(rig, job_id)
    written0 = fwd0_bytes_written(rig)
    t0 = time.monotonic()
    start_fio_job(rig, job)
    while fwd0_bytes_written(rig) < written0 + 2 * MiB:
        assert time.monotonic() < t0 + 60 and job.proc.poll() is None, "cn0's writes did not reach fwd0"
        time.sleep(0.2)
    time.sleep(CUT_AFTER_S)
    cut(rig, False)
    try:
        time.sleep(cut_s)
    finally:
        cut(rig, True)
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
        f"\n[rig fault] fwd0's link cut {SHORT_CUT_S:.0f} s (< {RPC_TIMEOUT_S:.0f} s timeout) {CUT_AFTER_S:.0f} s into the "
        f"writes: job done {after:.1f} s after the link came back, {took:.1f} s in all ({alone:.0f} s at its rate "
        f"without the cut); fio wrote and verified {fio['bytes_written']} B\n  " + "\n  ".join(lines)
    )
    assert fwd["forwarding_nodes"]["cn0"] == ["fwd0"], "cn0's requests should have waited for fwd0, not failed over"
    assert mount_replays(rig, "cn0") == replays0, "no request should have been replayed"
    assert took >= alone + SHORT_CUT_S * 0.5, "the cut should have held cn0's rank"
    assert_no_loss(losses0, pipeline_losses(rig), lines)


def failover_job(rig, job_id: str, what: str, hold_s: float, cut) -> tuple[dict, list[str], int]:
    """:func:`cut_job` with a cut of fwd0 longer than the mounts' timeout, then both layers exact
    (:func:`exact_layers`); prints what happened. Returns (the forwarder layer's summary, its lines,
    the requests cn0's mount replayed meanwhile)."""
    replays0 = mount_replays(rig, "cn0")
    job, fio, took, after = cut_job(rig, job_id, hold_s, cut)
    replays = mount_replays(rig, "cn0") - replays0
    fwd, lines = exact_layers(rig, job, fio)
    print(
        f"\n[rig fault] {what} {hold_s:.0f} s (> {RPC_TIMEOUT_S:.0f} s timeout) {CUT_AFTER_S:.0f} s into the "
        f"writes: cn0's mount replayed {replays} request(s) on fwd1; job done {after:.1f} s after the cut, "
        f"{took:.1f} s in all; fio wrote and verified {fio['bytes_written']} B\n  " + "\n  ".join(lines)
    )
    assert replays > 0, "cn0's mount should have replayed the requests fwd0 did not answer"
    assert fwd["forwarding_nodes"]["cn0"] == ["fwd0", "fwd1"], "cn0 should have failed over from fwd0 to fwd1"
    assert fwd["forwarding_nodes"]["cn1"] == ["fwd1"], lines
    assert 0 < fwd["replayed_requests"] <= replays, (fwd["replayed_requests"], replays)
    return fwd, lines, replays


@pytest.mark.timeout(600)
def test_forwarding_node_link_cut_longer_than_the_timeout_replays_once(rig):
    """Issue 25, item 5: failover with replay, each request counted once on the forwarder layer."""
    losses0 = pipeline_losses(rig)
    _, lines, _ = failover_job(rig, "cut-fwd0-failover", "fwd0's link cut", LONG_CUT_S, fwd0_link)
    assert_no_loss(losses0, pipeline_losses(rig), lines)


@pytest.mark.timeout(600)
def test_forwarding_node_replies_lost_requests_executed_twice_counted_once(rig):
    """The double execution made certain: fwd0's replies to cn0 are dropped (iptables) for 12 s,
    longer than the timeout, so the write cn0 has in fwd0 then runs on fwd0 and, replayed, on fwd1;
    both daemons record it (``duplicate_requests`` > 0) and it counts once: both layers show fio's
    bytes exactly (the old counting showed the write's bytes twice on the forwarder layer)."""
    losses0 = pipeline_losses(rig)
    what = "fwd0's replies to cn0 dropped"
    fwd, lines, _ = failover_job(rig, "lost-replies-fwd0", what, REPLIES_LOST_S, fwd0_replies_to_cn0)
    assert 0 < fwd["duplicate_requests"] <= fwd["replayed_requests"], lines
    assert_no_loss(losses0, pipeline_losses(rig), lines)
