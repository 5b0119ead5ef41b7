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
3. DFRA's classes per compute node, decided from the history as DFRA does (thresholds lowered for
   this machine: 16 MiB and 2 I/O ranks benefit, 96 MiB is "very high volume"). The rig maps
   compute nodes to forwarding nodes in blocks as Sunway does (``compute_nodes_per_forwarding_node``
   = 2: cn0 and cn1 both default to fwd0; fwd2 and fwd3 are reserved). A two-node fio job's first
   run keeps the default (both nodes on fwd0); its second run is "more forwarding nodes" and its
   nodes are spread, cn0 on fwd0 and cn1 on fwd1; a bigger job's second run is "dedicated" and
   gets the reserved nodes, cn0 on fwd2 and cn1 on fwd3, returned when it ends. All from the
   daemons' records, with exactly fio's bytes.
4. Live remapping moves a running job's compute nodes: an admin's pin to fwd1 mid-job is pushed
   to both mounts, and both nodes' later requests are served by fwd1 (records on fwd0 then fwd1),
   every byte verified by fio and counted once.
5. The rig leaves nothing behind: no namespace, mount, cgroup or process, even when a process was
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
from cluster_testkit import (
    MOUNT_ADMIN_PORT,
    FioJob,
    Rig,
    fio_results,
    rig_available,
    running_rig,
    sh,
    start_fio_job,
    wait_summary,
)
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
#: The site's configuration on this rig: Sunway-like blocks of compute nodes per forwarding node,
#: DFRA's thresholds lowered for this machine's size (Beacon: 20 GB and 32 I/O ranks benefit;
#: Pharos: 1 TB is very high volume), one node's capacity 1 MB/s so every benefiting job wants
#: more nodes than exist, a 2 s control period.
SITE = {
    "PHAROS_COMPUTE_NODES_PER_FORWARDING_NODE": "2",
    "PHAROS_CONTROL_DFRA_MIN_BYTES": str(16 * MiB),
    "PHAROS_CONTROL_DFRA_MIN_IO_RANKS": "2",
    "PHAROS_CONTROL_DFRA_DEDICATED_MIN_BYTES": str(96 * MiB),
    "PHAROS_CONTROL_NODE_CAPACITY_B_S": "1e6",
    "PHAROS_CONTROL_PERIOD_S": "2",
}


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
    with running_rig(tmp_path_factory.mktemp("rig"), compute=2, fwd=4, brokers=1, env=SITE) as r:
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
    rig.pin(job_id, ["fwd0", "fwd1"], "issue 25: DFRA per compute node")
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


def run_fio(rig: Rig, job: FioJob, timeout_s: float = 240) -> dict:
    """Run ``job`` to its end; its forwarder-layer summary, once both layers show fio's bytes
    (verified): the next run's DFRA decision reads this run from the history, which must be
    stored whole by then (the agents' records may come after the daemons')."""
    start_fio_job(rig, job)
    job.exit_code = job.proc.wait(timeout_s)
    fio, verified = fio_results(job)
    assert job.exit_code == 0 and verified, f"{job.job_id}: fio exit {job.exit_code}, {fio}: data not verified"
    want = (fio["bytes_written"], fio["bytes_read"])
    for layer in ("client", "forwarder"):
        s = wait_summary(rig, job.job_id, layer, fio["bytes_written"])
        deadline = time.monotonic() + 60  # the verify reads' records may still be on their way
        while (s.get("bytes_written"), s.get("bytes_read")) != want and time.monotonic() < deadline:
            time.sleep(1)
            s = rig.api(f"jobs/{job.job_id}", layer=layer)
        assert (s.get("bytes_written"), s.get("bytes_read")) == want, (job.job_id, layer, s.get("bytes_read"), fio)
    return s


@pytest.mark.timeout(600)
def test_dfra_classes_per_compute_node(rig: Rig):
    """From the history: default, then more forwarding nodes spread per compute node; dedicated
    gets the reserved nodes per compute node and returns them."""
    tag = uuid.uuid4().hex[:4]
    seen = []
    for name, size_mib, want_class, want_nodes in (
        ("ckpt", 8, "default", {"cn0": ["fwd0"], "cn1": ["fwd0"]}),
        ("ckpt", 8, "more_nodes", {"cn0": ["fwd0"], "cn1": ["fwd1"]}),
        ("big", 32, "default", {"cn0": ["fwd0"], "cn1": ["fwd0"]}),
        ("big", 32, "dedicated", {"cn0": ["fwd2"], "cn1": ["fwd3"]}),
    ):
        job = FioJob(f"rig-{name}-{uuid.uuid4().hex[:6]}", "N-N", ["cn0", "cn1"], size_mib, name=f"{name}-{tag}")
        s = run_fio(rig, job)
        hint = rig.api(f"hints/jobs/{job.job_id}")
        seen.append(f"{job.job_id}: {hint['class']} {hint['nodes']} -> served {s['forwarding_nodes']}")
        assert hint["class"] == want_class, (seen[-1], hint["reason"])
        assert s["forwarding_nodes"] == want_nodes, seen[-1]
    deadline = time.monotonic() + 30  # returned at the loop's next cycle after the end event
    while True:
        released = {a["resource"] for a in rig.api("control/actions", job=job.job_id, kind="release")["items"]}
        if released or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert released == {"node:fwd2", "node:fwd3"}, f"the dedicated job's reserved nodes returned: {released}"
    print("\n[rig] DFRA per compute node:\n  " + "\n  ".join(seen))


@pytest.mark.timeout(600)
def test_live_remap_moves_the_jobs_compute_nodes(rig: Rig):
    """A running two-node job (both nodes on fwd0 by default) is moved to fwd1 by an admin's pin:
    the loop pushes the new entry to both mounts mid-job; both nodes' requests go to fwd1 from then
    on, and fio verifies every byte."""
    job = FioJob(f"rig-move-{uuid.uuid4().hex[:6]}", "N-N", ["cn0", "cn1"], 24, fio_args="--rate=3m", name="move")
    api = rig.client("server")
    start_fio_job(rig, job)
    time.sleep(3)
    t_pin = time.monotonic()
    rig.pin(job.job_id, ["fwd1"], "issue 25: move")
    try:
        job.exit_code = job.proc.wait(240)
    finally:
        api.request("DELETE", f"{rig.api_url}/v1/control/pins/jobs/{job.job_id}")
    fio, verified = fio_results(job)
    assert job.exit_code == 0 and verified, f"fio exit {job.exit_code}, {fio}: data not verified"
    s = wait_summary(rig, job.job_id, "forwarder", fio["bytes_written"])
    assert (s.get("bytes_written"), s.get("bytes_read")) == (fio["bytes_written"], fio["bytes_read"]), (s, fio)
    assert s["forwarding_nodes"] == {"cn0": ["fwd0", "fwd1"], "cn1": ["fwd0", "fwd1"]}, s["forwarding_nodes"]
    fwd = {
        it["node"]: j["bytes"]
        for it in rig.api("forwarders", window_s=3600)["items"]
        for j in it["jobs"]
        if j["job_id"] == job.job_id
    }
    assert fwd.get("fwd1", 0) > fwd.get("fwd0", 0) > 0, fwd  # pinned 3 s into a ~16 s job
    print(
        f"\n[rig] job {job.job_id} pinned to fwd1 3 s into its run ({time.monotonic() - t_pin:.0f} s more): bytes per forwarding node {fwd}, "
        f"served {s['forwarding_nodes']}, {fio['bytes_written']} B written and verified"
    )
