"""Issue 27, item 2: node-local mode, with a real daemon and real FUSE mounts.

A job's rank directories ``<mount>/.nodelocal/<job>/<rank>/`` live each on the target its rank
id hashes to (forwarder/README.md, "Node-local mode"), with a namespace of their own there: no
name in the MDT. Checked here: ranks on two compute nodes create, write, read, list and remove
there; a third node's mount is the global read-only view (lists every rank and file with its
size, reads every byte, changes nothing: EROFS); a node that replaces a failed one takes over
only that node's ranks (``POST /nodelocal/attach``) and finds their data; the daemon's records of
node-local I/O carry job, rank, compute node and the rank's target (real Kafka broker).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from forwarder_testkit import consume, http, http_status, wait_records_sent
from pharos_testkit import in_job

from pharos_pipeline.wire import IoBatch, io_pb2

JOB = "nl7"


def content(rank: int, i: int) -> bytes:
    return bytes([rank * 31 + i & 0xFF]) * (1000 * i + rank)


def write_rank(mnt: Path, rank: int, n: int = 20) -> Path:
    d = mnt / ".nodelocal" / JOB / str(rank)
    (d / "sub").mkdir(parents=True)
    for i in range(n):
        (d / ("sub" if i % 2 else "") / f"f{i}").write_bytes(content(rank, i))
    return d


def rank_files(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_size for p in d.rglob("*") if p.is_file()}


def expected(rank: int, n: int = 20) -> dict[str, int]:
    return {f"{'sub/' if i % 2 else ''}f{i}": len(content(rank, i)) for i in range(n)}


def targets(d) -> dict[str, str]:
    """Rank -> target name of the job's rank directories (the daemon's GET /nodelocal)."""
    return {r["rank"]: r["target"] for r in http("GET", d.admin + "/nodelocal")["ranks"] if r["job"] == JOB}


def test_rank_directories_global_view_and_read_only(cluster):
    d = cluster.start_daemon("fwd0")
    cn0, cn1, cn2 = (cluster.start_mount([d], i) for i in range(3))
    for r in range(4):
        write_rank((cn0, cn1)[r % 2].path, r)
    # Each rank's files are on its target, in its own namespace; the MDT holds none of them.
    where = targets(d)
    assert sorted(where) == ["0", "1", "2", "3"]
    for r, t in where.items():
        assert (cluster.backend / t / ".nodelocal" / JOB / r / "sub" / "f1").is_file()
    assert not any(p.name.startswith("f") for p in cluster.ns.rglob("*")), list(cluster.ns.rglob("*"))
    # The global view from a third node: every rank, every file with its size, every byte.
    view = cn2.path / ".nodelocal"
    assert JOB in os.listdir(view)
    assert sorted(os.listdir(view / JOB)) == ["0", "1", "2", "3"]
    for r in range(4):
        assert rank_files(view / JOB / str(r)) == expected(r)
        assert all((view / JOB / str(r) / f).read_bytes() == content(r, int(f.rsplit("f", 1)[1])) for f in expected(r))
    # Read-only there, and on the other job node too.
    for bad in (lambda: (view / JOB / "0" / "x").write_bytes(b"x"), lambda: (view / JOB / "0" / "f0").unlink()):
        with pytest.raises(OSError) as e:
            bad()
        assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        (cn1.path / ".nodelocal" / JOB / "0" / "f0").write_bytes(b"overwrite")
    assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        (cn0.path / ".nodelocal" / JOB / "f").write_bytes(b"not in a rank directory")
    assert e.value.errno == errno.EPERM
    # The owner changes, renames within its rank, removes: seen by the view within the TTL.
    rd = cn0.path / ".nodelocal" / JOB / "2"
    (rd / "f0").write_bytes(b"new")
    os.rename(rd / "f2", rd / "sub" / "moved")
    with pytest.raises(OSError) as e:
        os.rename(rd / "f4", cn0.path / "out")
    assert e.value.errno == errno.EXDEV
    for f in list(rd.rglob("*")):
        if f.is_file():
            f.unlink()
    assert rank_files(rd) == {}
    objs = cluster.backend / where["2"]
    assert not [
        p for p in objs.iterdir() if p.name.endswith(".0") and p.stat().st_size in {1000 * i + 2 for i in range(20)}
    ]


def test_replacement_node_takes_over_only_the_failed_nodes_ranks(cluster):
    d = cluster.start_daemon("fwd0")
    cn0, cn1 = cluster.start_mount([d], 0), cluster.start_mount([d], 1)
    for r in range(4):
        write_rank((cn0, cn1)[r % 2].path, r)
    cluster._stop(cn0.proc)  # compute node 0 fails
    cn9 = cluster.start_mount([d], 9)
    rank0 = cn9.path / ".nodelocal" / JOB / "0"
    with pytest.raises(OSError) as e:
        (rank0 / "restart").write_bytes(b"x")
    assert e.value.errno == errno.EROFS  # not before it replaces cn0
    take_over = {"job": JOB, "node": "cn9", "replaces": "cn0"}
    assert http_status("POST", d.admin + "/nodelocal/attach", take_over, token=None) == 401
    assert http_status("POST", d.admin + "/nodelocal/attach", {**take_over, "node": "cn0"}) == 400
    got = http("POST", d.admin + "/nodelocal/attach", take_over)
    assert sorted(got["ranks"]) == ["0", "2"]
    time.sleep(1.1)  # the daemon's cached attachment (OWNER_TTL)
    # The restarted ranks find their data on the new node, and write again.
    for r in (0, 2):
        rd = cn9.path / ".nodelocal" / JOB / str(r)
        assert rank_files(rd) == expected(r)
        (rd / "restart").write_bytes(b"restarted")
        assert (rd / "restart").read_bytes() == b"restarted"
    # cn1's ranks stay cn1's.
    with pytest.raises(OSError) as e:
        (cn9.path / ".nodelocal" / JOB / "1" / "x").write_bytes(b"x")
    assert e.value.errno == errno.EROFS
    (cn1.path / ".nodelocal" / JOB / "1" / "x").write_bytes(b"still cn1's")
    owners = {r["rank"]: r["node"] for r in http("GET", d.admin + "/nodelocal")["ranks"]}
    assert owners == {"0": "cn9", "1": "cn1", "2": "cn9", "3": "cn1"}


@pytest.mark.timeout(120)
def test_node_local_records_carry_the_rank_target(cluster, kafka_settings):
    s = kafka_settings
    d = cluster.start_daemon("fwd0", "--topic", s.topic_requests, kafka=s.kafka_bootstrap)
    m = cluster.start_mount([d], 0)
    rd = m.path / ".nodelocal" / JOB / "5"
    rd.mkdir(parents=True)
    code = "import sys; open(sys.argv[1], 'wb').write(b'r' * 3 * 65536)"
    with in_job(JOB) as preexec:
        subprocess.run(
            [sys.executable, "-c", code, str(rd / "ckpt")],
            check=True,
            timeout=30,
            preexec_fn=preexec,
            env={**os.environ, "PHAROS_RANK": "5"},
        )
    target = targets(d)["5"]
    wait_records_sent(d)
    path = f"/.nodelocal/{JOB}/5/ckpt"

    def writes(got) -> list:
        return [r for _, b in got for r in b.records if r.path == path and r.op == io_pb2.OP_PWRITE]

    got = consume(
        s.kafka_bootstrap, s.topic_requests, IoBatch.FromString, lambda g: sum(x.size for x in writes(g)) >= 3 * 65536
    )
    recs = writes(got)
    assert sum(r.size for r in recs) == 3 * 65536
    for r in recs:
        assert (r.layer, r.target, r.compute_node, r.job_id, r.rank) == (io_pb2.LAYER_FORWARDER, target, "cn0", JOB, 5)
        assert r.forwarding_node == "fwd0"
    opens = [r for _, b in got for r in b.records if r.path == path and r.op == io_pb2.OP_OPEN]
    assert opens and all(r.target == target for r in opens)


class _NoEvents:
    """Stands for the jobs topic's producer (no broker in this test)."""

    def send(self, _event) -> None:
        pass


def test_pharos_run_node_local_gives_each_rank_its_directory(cluster):
    from pharos_agents.runner import run_job
    from pharos_core.settings import Settings

    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d], 0)
    cmd = ["sh", "-c", 'echo "rank $PHAROS_RANK" > "$PHAROS_NODELOCAL/out"']
    res = run_job(Settings(), "nlrun", cmd, ranks=3, events=_NoEvents(), hint=False, quiet=True, node_local=m.path)
    assert res.exit_code == 0
    for r in range(3):
        assert (m.path / ".nodelocal" / "nlrun" / str(r) / "out").read_text() == f"rank {r}\n"
    owners = {(x["job"], x["rank"]): x["node"] for x in http("GET", d.admin + "/nodelocal")["ranks"]}
    assert owners == {("nlrun", str(r)): "cn0" for r in range(3)}


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_slurm_spank_option_gives_each_task_its_directory(cluster, tmp_path, monkeypatch):
    """srun --pharos-node-local=MOUNT on a real Slurm (the plugin built from this tree's sources)."""
    import slurm_testkit

    plugin = tmp_path / "pharos_spank.so"
    sources = sorted(str(p) for p in (slurm_testkit.REPO / "agents" / "slurm").glob("*.c"))
    cc = ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-format-truncation", "-shared", "-fPIC"]
    subprocess.run([*cc, "-o", str(plugin), *sources, "-lcurl"], check=True, timeout=120)
    monkeypatch.setattr(slurm_testkit, "PLUGIN", plugin)
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d], 0)
    options = {"api": "http://127.0.0.1:9", "hint": "no", "timeout": "1"}  # no Pharos API here
    with slurm_testkit.running_slurm(options) as slurm:
        task = 'echo "task $SLURM_PROCID" > "$PHAROS_NODELOCAL/out"'
        slurm.run("srun", "-n", "2", "--overcommit", f"--pharos-node-local={m.path}", "sh", "-c", task, timeout=60)
    jobs = os.listdir(m.path / ".nodelocal")
    assert len(jobs) == 1, jobs
    for r in range(2):
        assert (m.path / ".nodelocal" / jobs[0] / str(r) / "out").read_text() == f"task {r}\n"
    owners = {x["rank"]: x["node"] for x in http("GET", d.admin + "/nodelocal")["ranks"]}
    assert owners == {"0": "cn0", "1": "cn0"}
