"""Faults on the rig (issue 25), the one of ``make test``: a forwarding node's links cut mid-job.

A reduced rig (one broker, the server, fwd0 and fwd1, cn0 and cn1) runs a two-node fio job (one
rank per node, each writing its own file at a fixed rate and reading every block back to check
it, ``--verify=crc32c``). cn0's mount sends the job's requests to its default forwarding node,
fwd0; 3 s into the job, fwd0's link is cut (``ip link set eth0 down`` in its namespace: the
bridge drops everything to and from it) for 10 s, then restored. The cut is shorter than the
mounts' request timeout (60 s), so cn0's requests wait and TCP resumes them; fwd0's records,
which could not reach Kafka meanwhile, wait in its producer. Checked: the job completes and fio
verified every byte, both layers show exactly fio's bytes (none lost, none twice), the pipeline
has no gap, drop or dead letter, and the job took about the cut longer than its rate allows.

Not here yet (issue 25's fault schedule, ``bench/cluster.py --faults``): a cut longer than the
request timeout makes the mount fail over and replay on fwd1, and the forwarder layer then counts
a replayed request twice when fwd0 had executed it (measured: +1 MiB for 2 replays); brokers killed
and partitioned, packet loss and bandwidth caps, the server killed, a daemon stopped.
Needs root (namespaces, eBPF, cgroups, FUSE), MPICH and fio.
"""

from __future__ import annotations

import os
import time

import pytest
from cluster_testkit import FioJob, fio_results, rig_available, running_rig, sh, start_fio_job, wait_summary

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (namespaces, eBPF, cgroups, FUSE)"),
]

RATE_MIB_S = 4
SIZE_MIB = 40  # per rank: 10 s at the rate
CUT_AFTER_S, CUT_S = 3.0, 10.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    why = rig_available()
    if why:
        pytest.fail(why)
    with running_rig(tmp_path_factory.mktemp("rig"), compute=2, fwd=2, brokers=1) as r:
        yield r


@pytest.mark.timeout(600)
def test_forwarding_node_link_cut(rig):
    job = FioJob("cut-fwd0", "N-N", ["cn0", "cn1"], SIZE_MIB, fio_args=f"--rate={RATE_MIB_S}m")
    t0 = time.monotonic()
    start_fio_job(rig, job)
    time.sleep(CUT_AFTER_S)
    fwd0 = rig.nodes["fwd0"]
    sh("ip", "-n", fwd0.ns, "link", "set", "eth0", "down")
    try:
        time.sleep(CUT_S)
    finally:
        sh("ip", "-n", fwd0.ns, "link", "set", "eth0", "up")
    t_up = time.monotonic()
    job.exit_code = job.proc.wait(240)
    took = time.monotonic() - t0
    fio, verified = fio_results(job)
    assert job.exit_code == 0 and verified, f"fio exit {job.exit_code}, {fio}: data not verified"
    lines = []
    for layer in ("client", "forwarder"):
        s = wait_summary(rig, job.job_id, layer, fio["bytes_written"], 120)
        line = (
            f"{layer}: {s.get('bytes_written')} B written, {s.get('bytes_read')} B read on {s.get('compute_nodes')} "
            f"via {s.get('forwarding_nodes')}, complete {s.get('complete')}"
        )
        lines.append(line)
        assert (s.get("bytes_written"), s.get("bytes_read")) == (fio["bytes_written"], fio["bytes_read"]), line
        assert s["compute_nodes"] == ["cn0", "cn1"] and s["complete"], line
    assert lines and "'cn0': ['fwd0']" in lines[1], "cn0's requests should have waited for fwd0, not failed over"
    p = rig.api("pipeline")
    assert (p["gaps"], p["dropped_records"], p["dead_letters"]) == (0, 0, 0), p
    alone = SIZE_MIB / RATE_MIB_S
    print(
        f"\n[rig fault] fwd0 cut {CUT_S:.0f} s at {CUT_AFTER_S:.0f} s: job done {took - (t_up - t0):.1f} s after the "
        f"link came back, {took:.1f} s in all ({alone:.0f} s at its rate without the cut); fio wrote and verified "
        f"{fio['bytes_written']} B\n  " + "\n  ".join(lines) + f"\n  pipeline: {p['records']} records, gaps 0, drops 0"
    )
    assert took >= alone + CUT_S * 0.5, "the cut should have held cn0's rank"
