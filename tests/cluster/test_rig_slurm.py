"""Multi-node Slurm jobs on the cluster rig (issue 25): ``sbatch`` of ``srun --mpi=pmi2`` across
the compute nodes, seen by Pharos as one job.

The rig (tests/cluster_testkit.py: one Kafka broker, the server, two forwarding nodes, compute
nodes each with its own eBPF agent and FUSE mount, in their own namespaces) runs a real Slurm
(tests/cluster_slurm.py): slurmctld on the server node, one slurmd per compute node with its own
address, port and spool folder, the Pharos SPANK plugin on each with a scheduler token and
``cgroup_parent=<rig cgroup>/%n``, so that each node's tasks are in the cgroup subtree its own
agent traces. A user's job script runs ``srun -N 2 -n 4 --mpi=pmi2`` of the MPI-IO writer
(tests/data/mpi_write_at.c: 4 MiB per rank at its own offset of ONE shared file on the Pharos
mount, rank 0's 4 KiB results file beside it); ``make evaluate`` also runs ``-N 4 -n 8`` on a
rig of four compute nodes.

Pharos shows the job under Slurm's job id, name and user, on the client layer (the nodes' agents)
and the forwarder layer (their mounts and the daemons): as many ranks as tasks, all of which did
I/O, on exactly the nodes Slurm allocated, pattern N-1, exactly the bytes MPI reports. Its DFRA
decision (the job's name has no history: the default mapping), asked by the plugin's prolog, was
taken before its first forwarder record, and its requests went to the allocated nodes' default
forwarding nodes (each compute node's own: cn<i> -> fwd<i mod 2>);
the plugin placed every task and the batch script, and its first node alone sent the job's start
and end events and asked its hint (one of each per job), none skipped or lost. Afterwards
no process of that Slurm and nothing of the rig is left. Needs root (namespaces, eBPF, cgroups,
FUSE, slurmd), MPICH and Slurm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from cluster_slurm import running_rig_slurm, slurm_processes
from cluster_testkit import Rig, rig_available, running_rig, wait_summary
from mpi_testkit import build_mpi_writer
from slurm_testkit import SlurmCluster

from pharos_api.cli import mount_node_index, mount_node_order
from pharos_core.settings import Settings

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (namespaces, eBPF, cgroups, FUSE, slurmd)"),
]

MiB = 1 << 20
PER_RANK = 4 * MiB
SIDE = 4096  # rank 0's results file
NAME = "rig-slurm-mpi"


@pytest.fixture(scope="module")
def writer(tmp_path_factory) -> Path:
    return build_mpi_writer(tmp_path_factory.mktemp("mpi"))


def rig_and_slurm(tmp_path_factory, compute: int, fwd: int):
    """A rig (NOT under /run: a system folder, whose files are never a job's data files) with
    Slurm on it; yields (rig, Slurm); checks that neither leaves anything behind."""
    why = rig_available()
    if why:
        pytest.fail(why)
    with running_rig(tmp_path_factory.mktemp("rig"), compute=compute, fwd=fwd, brokers=1) as rig:
        with running_rig_slurm(rig) as slurm:
            yield rig, slurm
        assert slurm_processes(slurm.dir) == [], "processes of the rig's Slurm left behind"
        assert not slurm.dir.exists()
    assert rig.leaks() == [], "the rig left things behind"


@pytest.fixture
def site(tmp_path_factory):
    """The reduced rig (two compute nodes) with Slurm; one test's (never two rigs at once)."""
    yield from rig_and_slurm(tmp_path_factory, compute=2, fwd=2)


@pytest.fixture
def site4(tmp_path_factory):
    """The rig of four compute nodes with Slurm (make evaluate); one test's."""
    yield from rig_and_slurm(tmp_path_factory, compute=4, fwd=2)


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def default_fwd(rig: Rig, node: str) -> str:
    """Compute node ``node``'s default forwarding node: what ``pharos mount`` gives its mount
    (its index mod the shared forwarding nodes)."""
    s = Settings(fwd_nodes=len(rig.of_kind("fwd")), compute_node_index=int(node[2:]))
    return mount_node_order(s)[mount_node_index(s)]


def counters(slurm: SlurmCluster) -> dict[str, int]:
    """The plugin's counters (all nodes share the statedir), through ``pharos slurm status``."""
    argv = [sys.executable, "-m", "pharos_api.cli", "slurm", "status", "--statedir", str(slurm.statedir), "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_nodes_idle(slurm: SlurmCluster, timeout_s: float = 60) -> None:
    """Until no node is completing (every node's epilog, and so the plugin's end event, done)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = set(slurm.run("sinfo", "-h", "-N", "-o", "%T").split())
        if states == {"idle"}:
            return
        time.sleep(0.5)
    pytest.fail(f"Slurm nodes not idle in {timeout_s:.0f} s: {states}")


def run_job(rig: Rig, slurm: SlurmCluster, writer: Path, nodes: int, tasks: int) -> None:
    """sbatch ``srun -N nodes -n tasks --mpi=pmi2`` of the writer; check what Pharos shows."""
    tag = f"{NAME}-{uuid.uuid4().hex[:6]}"
    d = rig.mount_dir / tag
    r = rig.run("cn0", ["mkdir", str(d)])
    assert r.returncode == 0, r.stderr
    work = rig.root / "work"
    script, out = work / f"{tag}.sbatch", work / f"{tag}.out"
    script.write_text(
        "#!/bin/sh\n"
        f"#SBATCH --job-name={NAME}\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks={tasks}\n#SBATCH --output={out}\n"
        f"srun -N {nodes} -n {tasks} --mpi=pmi2 {writer} {d / 'shared.dat'} {PER_RANK} {MiB} {d / 'results.txt'}\n"
    )
    before = counters(slurm)
    t0 = time.monotonic()
    job = slurm.sbatch(script)
    info = slurm.wait(job, timeout_s=240)
    t_job = time.monotonic() - t0
    text = out.read_text() if out.exists() else ""
    assert info["JobState"] == "COMPLETED", f"job {job}: {info.get('JobState')} {info.get('ExitCode')}\n{text}"
    printed = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert sorted(x["rank"] for x in printed) == list(range(tasks)), text
    total, side = sum(x["bytes_written"] for x in printed), sum(x["results_bytes"] for x in printed)
    assert (total, side) == (tasks * PER_RANK, SIDE), printed
    allocated = sorted(slurm.run("scontrol", "show", "hostnames", info["NodeList"]).split())
    assert len(allocated) == nodes, info["NodeList"]

    lines = []
    for layer in ("client", "forwarder"):
        s = wait_summary(rig, job, layer, total + side)
        line = (
            f"{layer}: {s.get('name')}/{s.get('user')} ranks {s.get('ranks')} ({s.get('io_ranks')} did I/O) "
            f"on {s.get('compute_nodes')}, pattern {s.get('pattern')} (writes {s.get('patterns', {}).get('write')}), "
            f"{s.get('bytes_written')} B written in {s.get('n_files')} file(s)"
        )
        lines.append(line)
        assert s.get("bytes_written") == total + side, line
        assert (s["name"], s["user"]) == (NAME, "root"), line
        assert s["ranks"] == tasks and s["io_ranks"] == tasks, line
        assert s["pattern"] == "N-1" and s["patterns"]["write"] == "N-1", line
        assert s["compute_nodes"] == allocated, line
        files = sorted((Path(f["path"]).name, f["ranks"], f["bytes_written"]) for f in s["files"])
        assert files == [("results.txt", 1, side), ("shared.dat", tasks, total)], (line, s["files"])

    # the DFRA decision: one, the default mapping, taken before the job's first forwarder record
    decided = [a for a in rig.api("control/actions", job=job)["items"] if a["kind"].startswith("dfra_")]
    assert len(decided) == 1 and decided[0]["kind"] == "dfra_default", decided
    first_io = ts(rig.api(f"jobs/{job}", layer="forwarder")["first_io"])
    lead = first_io - ts(decided[0]["time"])
    assert lead >= 0, f"the hint came {-lead:.3f} s after the job's first forwarder record"
    fwd = {
        it["node"]: j["bytes"]
        for it in rig.api("forwarders", window_s=3600)["items"]
        for j in it["jobs"]
        if j["job_id"] == job
    }
    # the default mapping is each node's own default forwarding node (its mount's), not one node
    want = {default_fwd(rig, n) for n in allocated}
    assert set(fwd) == want and sum(fwd.values()) >= total + side, (fwd, want, decided)

    # the plugin on every node: each task and the batch script placed, no hint skipped, no event lost
    wait_nodes_idle(slurm)
    after = counters(slurm)
    diff = {k: after[k] - before.get(k, 0) for k in after}
    assert diff["tasks_placed"] == tasks + 1 and diff["tasks_unplaced"] == 0, diff
    # the allocation's first node speaks for the job: one start event, one hint, one end event
    # (not one per node: a job of 1,000 nodes must not cost the API 3,000 requests)
    assert (diff["hints_applied"], diff["hints_skipped"]) == (1, 0), diff
    assert (diff["events_sent"], diff["events_failed"]) == (2, 0), diff
    starts = rig.api(f"jobs/{job}")
    assert starts.get("state") == "finished", starts.get("state")
    print(
        f"\n[rig slurm] job {job} (srun -N {nodes} -n {tasks}) on {info['NodeList']}: {t_job:.1f} s in Slurm; "
        f"decision {decided[0]['kind']} ({decided[0]['to_state']}) {lead:.2f} s before the first I/O, "
        f"bytes per forwarding node {fwd}; plugin {diff}\n  " + "\n  ".join(lines)
    )


@pytest.mark.timeout(600)
def test_sbatch_srun_across_two_nodes(site, writer: Path):
    rig, slurm = site
    run_job(rig, slurm, writer, nodes=2, tasks=4)


@pytest.mark.evaluation
@pytest.mark.timeout(900)
def test_sbatch_srun_across_four_nodes(site4, writer: Path):
    rig, slurm = site4
    run_job(rig, slurm, writer, nodes=4, tasks=8)
