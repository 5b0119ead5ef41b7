"""A cluster in one box (issue 25), the reduced rig of ``make test``: Pharos across emulated nodes.

The rig (tests/cluster_testkit.py) puts every node in its own network namespace on one bridge:
one Kafka broker, the server (pipeline, analytics, control loop, API with token auth), two
forwarding nodes and two compute nodes, each compute node with its own eBPF agent (tracing only
its cgroup subtree, naming its records cn<i>) and its own FUSE mount at the same path, talking
to the forwarding nodes over the emulated network only.

1. A multi-node MPI job as a user starts it: ``pharos run`` on cn0 of ``mpiexec -hosts cn0,cn1
   -n 4`` (MPICH's Hydra, its ssh being the rig's launcher into the other node) of the MPI-IO
   writer (tests/data/mpi_write_at.c: 4 MiB per rank at its own offset of ONE shared file on the
   Pharos mount, rank 0's 4 KiB results file beside it). Pharos shows, on the client layer (the two
   agents) and the forwarder layer (the two mounts and the daemons): 4 ranks, all of which did
   I/O, pattern N-1, both compute nodes, and exactly the bytes the program reports.
2. DFRA per compute node: a job mapped to two forwarding nodes (an admin's pin, pushed by the
   control loop as DFRA decisions are) gets one per compute node; the daemons' records show each
   compute node served by its own forwarding node only.
3. The rig leaves nothing behind: no namespace, mount, cgroup or process, even when a process was
   left running on a node.

Needs root (namespaces, eBPF, cgroups, FUSE) and MPICH.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest
from cluster_testkit import MOUNT_ADMIN_PORT, Rig, rig_available, running_rig, sh, wait_summary
from mpi_testkit import MPIEXEC, build_mpi_writer

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (namespaces, eBPF, cgroups, FUSE)"),
]

MiB = 1 << 20
RANKS = 4
PER_RANK = 4 * MiB
SIDE = 4096


@pytest.fixture(scope="module")
def writer(tmp_path_factory) -> Path:
    return build_mpi_writer(tmp_path_factory.mktemp("mpi"))


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """The reduced rig. Its folder (and so the jobs' files on the mount) is NOT under /run: a system
    folder, whose files are never a job's data files (pharos_analytics.pattern.SYSTEM_PREFIXES)."""
    why = rig_available()
    if why:
        pytest.fail(why)
    with running_rig(tmp_path_factory.mktemp("rig"), compute=2, fwd=2, brokers=1) as r:
        yield r


def run_mpi_job(rig: Rig, writer: Path, job_id: str) -> tuple[int, int, float]:
    """``pharos run`` on cn0 of ``mpiexec -hosts cn0,cn1,... -n 4`` of the MPI-IO writer into
    ``<mount>/<job_id>/``; returns (bytes the ranks wrote to the shared file, rank 0's results file
    bytes, seconds) as the program reports them."""
    d = rig.mount_dir / job_id
    r = rig.run("cn0", ["mkdir", str(d)])
    assert r.returncode == 0, r.stderr
    out = rig.root / "work" / job_id
    mpiexec = [
        MPIEXEC,
        *("-hosts", ",".join(n.name for n in rig.compute), "-launcher", "ssh", "-launcher-exec", str(rig.rsh)),
        *("-iface", "eth0", "-n", str(RANKS)),
        *(str(writer), str(d / "shared.dat"), str(PER_RANK), str(MiB), str(d / "results.txt")),
    ]
    t0 = time.monotonic()
    argv = rig.pharos("run", "--job", job_id, "--name", "rig-mpi", "--output-dir", str(out), "--", *mpiexec)
    r = rig.run("cn0", argv, timeout=240)
    printed = (out / "rank_0.out").read_text() if (out / "rank_0.out").exists() else ""
    assert r.returncode == 0, f"pharos run exit {r.returncode}\n{printed}\n{r.stderr[-3000:]}"
    ranks = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    assert sorted(x["rank"] for x in ranks) == list(range(RANKS)), printed
    total = sum(x["bytes_written"] for x in ranks)
    side = sum(x["results_bytes"] for x in ranks)
    assert (total, side) == (RANKS * PER_RANK, SIDE), printed
    return total, side, time.monotonic() - t0


@pytest.mark.timeout(600)
def test_multinode_mpi_job(rig: Rig, writer: Path):
    job_id = f"rig-mpi-{uuid.uuid4().hex[:6]}"
    total, side, t_run = run_mpi_job(rig, writer, job_id)

    lines = []
    for layer in ("client", "forwarder"):
        s = wait_summary(rig, job_id, layer, total + side)
        line = (
            f"{layer}: ranks {s.get('ranks')} ({s.get('io_ranks')} did I/O) on {s.get('compute_nodes')}, "
            f"pattern {s.get('pattern')} (writes {s.get('patterns', {}).get('write')}), "
            f"{s.get('bytes_written')} B written in {s.get('n_files')} file(s)"
        )
        lines.append(line)
        assert s.get("bytes_written") == total + side, line
        assert s["ranks"] == RANKS and s["io_ranks"] == RANKS, line
        assert s["pattern"] == "N-1" and s["patterns"]["write"] == "N-1", line
        assert s["compute_nodes"] == ["cn0", "cn1"], line
        files = sorted((Path(f["path"]).name, f["ranks"], f["bytes_written"]) for f in s["files"])
        assert files == [("results.txt", 1, side), ("shared.dat", RANKS, total)], (line, s["files"])
    print(f"\n[rig] job {job_id}: pharos run {t_run:.1f} s\n  " + "\n  ".join(lines))


@pytest.mark.timeout(300)
def test_rig_leaves_nothing_behind(tmp_path: Path):
    why = rig_available()
    if why:
        pytest.fail(why)
    root = tmp_path / "rig"
    with running_rig(root, compute=1, fwd=1, brokers=1) as r:
        stray = r.popen("cn0", ["sleep", "600"])  # a process left on a node, in its namespaces
        names = [n.ns for n in r.nodes.values()] + [r.switch]
        assert set(names) <= set(sh("ip", "netns", "list").stdout.split()), names
        assert r.leaks(), "a running rig must show its namespaces, mounts and processes"
    assert stray.wait(10) is not None
    assert r.leaks() == []
    listed = sh("ip", "netns", "list").stdout.split()
    assert not [n for n in names if n in listed]
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(root) not in mounts
    # the host's own namespace got no address of the rig
    assert r.nodes["server"].addr.rsplit(".", 1)[0] + "." not in sh("ip", "-o", "addr").stdout


@pytest.mark.timeout(600)
def test_dfra_per_compute_node(rig: Rig, writer: Path):
    """A job mapped to two forwarding nodes gets one per compute node: each mount's entry names its
    own, and the daemons' records show cn0's requests served by fwd0 only and cn1's by fwd1 only."""
    job_id = f"rig-dfra-{uuid.uuid4().hex[:6]}"
    api = rig.client("server")
    r = api.request(
        "PUT",
        f"{rig.api_url}/v1/control/pins/jobs/{job_id}",
        json={"nodes": ["fwd0", "fwd1"], "reason": "issue 25: DFRA per compute node"},
    )
    assert r.status_code == 200, r.text
    token = (rig.root / "site" / "fwd-admin.token").read_text().strip()
    admin = {"Authorization": f"Bearer {token}"}
    want = {n.name: [f"fwd{i}"] for i, n in enumerate(rig.compute)}
    got: dict = {}
    deadline = time.monotonic() + 60  # the loop pushes pins at its next cycle
    while time.monotonic() < deadline and got != want:
        for n in rig.compute:
            m = api.get(f"http://{n.addr}:{MOUNT_ADMIN_PORT}/mapping", headers=admin).json()
            got[n.name] = m["jobs"].get(job_id)
        time.sleep(1)
    assert got == want, f"each mount's entry for the job: {got}"

    total, side, _ = run_mpi_job(rig, writer, job_id)
    s = wait_summary(rig, job_id, "forwarder", total + side)
    assert s.get("bytes_written") == total + side, s
    assert s["forwarding_nodes"] == {"cn0": ["fwd0"], "cn1": ["fwd1"]}, s["forwarding_nodes"]
    print(f"\n[rig] job {job_id} pinned to fwd0,fwd1: mounts {got}; served {s['forwarding_nodes']}")
