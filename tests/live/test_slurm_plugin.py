"""The Slurm pieces on a REAL Slurm without the Pharos stack (issue 26): the test fixture's ports,
job_submit.lua's class table, and where the SPANK plugin leaves a task when Slurm has cgroups.

* **Ports** (item 12): slurmctld and slurmd cannot bind port 0 and report the port, so
  :func:`slurm_testkit.running_slurm` chooses free ports and they may be taken before the daemons
  bind them. The test takes slurmctld's port right after it is chosen (a listening socket on it):
  the fixture still comes up, on other ports.
* **Class table** (item 4): job_submit.lua parses its table again whenever its content changes;
  the test changes a job's class without changing the file's size, first line or modification
  time, and the next submission of that job is tagged with the new class. The table's 6th
  column (issue 27, item 2: node-local mode suggested) adds ``node_local=suggested`` to the tag;
  a 5-column row (an older table) still tags.
* **Slurm's cgroups on a hybrid host** (item 5): with ``ProctrackType=proctrack/cgroup`` and
  ``TaskPlugin=task/cgroup``, Slurm's cgroup/v1 plugin keeps each task in its v1 hierarchies
  (``/slurm[_<node>]/uid_<u>/job_<id>/step_<n>/...``) while the plugin moves it into Pharos's own v2 cgroup:
  moving a process in the v2 hierarchy leaves its v1 cgroups, so Slurm's limits and accounting
  stay.
* **Slurm's cgroups on cgroup v2** (item 5): the plugin's decision (agents/slurm/pharos_cgroup.c,
  compiled here with a small driver) on real processes in a real v2 tree named like Slurm's
  cgroup/v2 plugin's (``system.slice/slurmstepd.scope/job_<id>/step_<n>/user/task_<t>``), made
  in a folder of the test's own under the v2 mount and removed afterwards: such a task stays.
  Then the plugin itself in a real slurmstepd whose tasks start in such a cgroup (Slurm 22.05's
  cgroup/v2 plugin refuses a hybrid host, ``slurmd: fatal: Hybrid mode is not supported``, so
  the test puts slurmd there): it leaves them there.

Needs root (slurmd, cgroups), Slurm and munge; gcc for the driver.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
import slurm_testkit
from pharos_testkit import REPO
from slurm_testkit import running_slurm

from pharos_agents.cgroups import cgroup2_mount

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmd and cgroups need root"),
]

CLOSED_API = {"api": "http://127.0.0.1:9", "hint": "no", "timeout": "1"}  # no Pharos API here


@pytest.mark.timeout(300)
def test_fixture_comes_up_when_its_port_is_taken(monkeypatch):
    """Another process binds slurmctld's chosen port before slurmctld starts: the fixture sees
    slurmctld's bind failure and starts both daemons again on new ports."""
    taken: list[socket.socket] = []
    chosen = slurm_testkit.free_port

    def free_port_then_taken() -> int:
        port = chosen()
        if not taken:  # the first port chosen (slurmctld's) is taken at once
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen(1)
            taken.append(s)
        return port

    monkeypatch.setattr(slurm_testkit, "free_port", free_port_then_taken)
    t0 = time.monotonic()
    try:
        with running_slurm(CLOSED_API) as cluster:
            took = time.monotonic() - t0
            port = int(re.search(r"^SlurmctldPort=(\d+)$", (cluster.dir / "slurm.conf").read_text(), re.M)[1])
            assert port != taken[0].getsockname()[1]
            asides = sorted(p.name for p in cluster.dir.glob("slurmctld.*.attempt*"))
            assert asides, "the fixture did not have to start again: the port was not taken"
            assert slurm_testkit.PORT_TAKEN in "".join((cluster.dir / a).read_text() for a in asides)
            job = cluster.run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "true").strip()
            assert cluster.wait(job, 60)["JobState"] == "COMPLETED"
            print(f"\n[slurm] port {taken[0].getsockname()[1]} taken: up on {port} in {took:.1f} s")
    finally:
        for s in taken:
            s.close()


@pytest.mark.timeout(300)
def test_job_submit_reads_a_changed_class_of_the_same_size(tmp_path: Path):
    """Same size, same first line, same modification time, another class: the new one is used."""
    with running_slurm(CLOSED_API, job_submit=True) as cluster:
        head = "# user\tname\tclass\tpattern\truns (pharos slurm classes)\n"
        before = head + "root\tjs-reload\tdedicated\tN-1\t3\n"
        after = head + "root\tjs-reload\tdefault\tN-1\t333\n"
        assert len(before) == len(after)
        cluster.classes.parent.mkdir(parents=True, exist_ok=True)
        cluster.classes.write_text(before)
        st = cluster.classes.stat()

        def tag() -> str:
            job = cluster.run("sbatch", "--parsable", "--hold", "--job-name=js-reload", "--wrap", "true").strip()
            try:
                return cluster.job(job).get("AdminComment", "")
            finally:
                cluster.run("scancel", job)

        assert tag() == "pharos:class=dedicated,pattern=N-1,runs=3"
        cluster.classes.write_text(after)
        os.utime(cluster.classes, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert cluster.classes.stat().st_size == st.st_size
        assert cluster.classes.stat().st_mtime_ns == st.st_mtime_ns
        assert tag() == "pharos:class=default,pattern=N-1,runs=333"


@pytest.mark.timeout(300)
def test_job_submit_tags_node_local_from_the_sixth_column(tmp_path: Path):
    """The table ``pharos slurm classes`` writes (6 columns: node_local yes/no) and a row of an older
    one (5 columns): a job whose row says yes is tagged ``node_local=suggested``, the others not."""
    from pharos_api.cli_slurm import classes_tsv

    items = [
        {"user": "root", "name": "js-md", "class": "dedicated", "pattern": "N-N", "runs": 3, "node_local": True},
        {"user": "root", "name": "js-data", "class": "more_nodes", "pattern": "N-N", "runs": 2, "node_local": False},
    ]
    with running_slurm(CLOSED_API, job_submit=True) as cluster:
        cluster.classes.parent.mkdir(parents=True, exist_ok=True)
        cluster.classes.write_text(classes_tsv(items) + "root\tjs-old\tdedicated\tN-1\t4\n")

        def tag(name: str) -> str:
            job = cluster.run("sbatch", "--parsable", "--hold", f"--job-name={name}", "--wrap", "true").strip()
            try:
                return cluster.job(job).get("AdminComment", "")
            finally:
                cluster.run("scancel", job)

        assert tag("js-md") == "pharos:class=dedicated,pattern=N-N,runs=3,node_local=suggested"
        assert tag("js-data") == "pharos:class=more_nodes,pattern=N-N,runs=2"
        assert tag("js-old") == "pharos:class=dedicated,pattern=N-1,runs=4"
        assert tag("js-none") == ""


# ---- Slurm's cgroups -----------------------------------------------------------------------------


def remove_tree(top: Path) -> None:
    """rmdir a cgroup tree, deepest first (cgroup folders hold only the kernel's files)."""
    if top.exists():
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            d.rmdir()
        top.rmdir()


def slurm_v1_roots() -> list[Path]:
    """Slurm's cgroup/v1 roots (``<v1 mount>/slurm*``) in the v1 hierarchies of /proc/mounts."""
    mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines() if ln.split()[2] == "cgroup"]
    return [p for m in mounts for p in Path(m).glob("slurm*") if p.is_dir()]


def cgroup_lines(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup as {controllers: path} ("" for the v2 line, name=systemd kept)."""
    return {ln.split(":", 2)[1]: ln.split(":", 2)[2] for ln in text.splitlines() if ln.count(":") >= 2}


@pytest.mark.timeout(300)
def test_slurm_cgroup_v1_plugins_keep_their_cgroups_and_pharos_places_the_task(tmp_path: Path):
    """Slurm with proctrack/cgroup and task/cgroup on this hybrid host (its cgroup/v1 plugin):
    each task is in Slurm's v1 cgroups of its job and step AND in Pharos's v2 cgroup."""
    cg2 = cgroup2_mount()
    if cg2 == Path("/sys/fs/cgroup"):
        pytest.skip("a unified-only host: Slurm's cgroup/v2 plugin applies (test_v2_* below)")
    parent = f"pharos-test-{uuid.uuid4().hex[:8]}"
    options = {**CLOSED_API, "cgroup_parent": parent}
    conf = ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup", "JobAcctGatherType=jobacct_gather/cgroup"]
    cgroup_conf = ["CgroupPlugin=cgroup/v1", "ConstrainCores=yes", "ConstrainRAMSpace=no", "ConstrainDevices=no"]
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(tmp_path, 0o755)
    v1_before = set(slurm_v1_roots())
    try:
        with running_slurm(options, extra_conf=conf, cgroup_conf=cgroup_conf) as cluster:
            job = cluster.run(
                "sbatch",
                "--parsable",
                "-n",
                "2",
                "--overcommit",
                f"--output={out / 'job.out'}",
                "--wrap",
                f"srun -n 2 --overcommit sh -c 'cat /proc/self/cgroup > {out}/task.$SLURM_PROCID'",
            ).strip()
            info = cluster.wait(job, 120)
            assert info["JobState"] == "COMPLETED", (info, (out / "job.out").read_text())
            counters = dict(ln.split() for ln in (cluster.statedir / "counters").read_text().splitlines())
            for r in (0, 1):
                lines = cgroup_lines((out / f"task.{r}").read_text())
                print(f"\n[slurm] task {r}: {lines}")
                assert lines[""] == f"/{parent}/job_{job}/step_0/rank_{r}", lines  # Pharos's (v2)
                # Slurm's cgroup/v1 root: /slurm, or /slurm_<node> (Debian builds multiple-slurmd)
                step = rf"^/slurm(_{cluster.node})?/uid_0/job_{job}/step_0"
                assert re.search(rf"{step}$", lines["freezer"]), lines  # proctrack/cgroup
                assert re.search(rf"{step}$", lines["cpuset"]), lines  # task/cgroup (ConstrainCores)
                for acct in ("memory", "cpu,cpuacct" if "cpu,cpuacct" in lines else "cpuacct"):
                    assert re.search(rf"{step}/task_{r}$", lines[acct]), lines  # jobacct_gather/cgroup
            assert counters["tasks_placed"] == "3" and counters["tasks_in_slurm_cgroup"] == "0", counters
    finally:
        deadline = time.monotonic() + 15  # the plugin's own removal runs 5 s after the epilog
        while (cg2 / parent).exists() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                remove_tree(cg2 / parent)
            time.sleep(0.5)
        for root in set(slurm_v1_roots()) - v1_before:  # Slurm's cgroup/v1 roots, left empty by it
            with contextlib.suppress(OSError):
                remove_tree(root)
    assert not (cg2 / parent).exists()
    assert set(slurm_v1_roots()) <= v1_before, "Slurm's v1 cgroups left behind"


DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pharos_cgroup.h"
/* driver JOB PARENT (pid:N | path:P)...: one line per argument, "stay|place<TAB>v2 path" */
int main(int argc, char **argv) {
    char mount[4096], path[4096];
    printf("mount\t%s\n", ph_cgroup2_mount(mount, sizeof mount) ? "" : mount);
    for (int i = 3; i < argc; i++) {
        if (!strncmp(argv[i], "pid:", 4)) {
            if (ph_proc_cgroup_v2(atoi(argv[i] + 4), path, sizeof path)) { printf("none\t\n"); continue; }
        } else {
            snprintf(path, sizeof path, "%s", argv[i] + 5);
        }
        printf("%s\t%s\n", ph_in_slurm_cgroup(path, strtoul(argv[1], 0, 10), argv[2]) ? "stay" : "place", path);
    }
    return 0;
}
"""


def build_driver(d: Path) -> Path:
    """The plugin's cgroup decision (agents/slurm/pharos_cgroup.c) behind a small main."""
    src = d / "driver.c"
    src.write_text(DRIVER)
    exe = d / "driver"
    slurm_dir = REPO / "agents" / "slurm"
    subprocess.run(
        ["gcc", "-Wall", "-Werror", "-I", str(slurm_dir), "-o", str(exe), str(src), str(slurm_dir / "pharos_cgroup.c")],
        check=True,
        timeout=60,
    )
    return exe


@pytest.mark.timeout(120)
def test_v2_task_in_slurms_job_cgroup_stays_there(tmp_path: Path):
    """Real processes in a real v2 tree laid out as Slurm's cgroup/v2 plugin does: a task of the
    job in its step's cgroup stays; one in Pharos's tree, in another job's or in none is placed."""
    exe = build_driver(tmp_path)
    cg2 = cgroup2_mount()
    top = f"pharos-test-{uuid.uuid4().hex[:8]}"
    stepd = f"{top}/system.slice/slurmstepd.scope"
    job = 4242
    cases = {  # cgroup relative to the v2 mount -> the decision for a task of job 4242
        f"{stepd}/job_{job}/step_0/user/task_1": "stay",
        f"{stepd}/job_{job}/step_batch/user/task_0": "stay",
        f"{stepd}/job_{job}/step_0/user/task_special": "stay",
        f"{stepd}/job_{job}/step_0/slurm": "stay",  # slurmstepd's own, before Slurm moves the task
        f"{stepd}/job_{job}1/step_0/user/task_1": "place",  # another job
        f"{stepd}/job_{job}/user": "place",  # not a step
        f"{top}/pharos/job_{job}/step_0/rank_1": "place",  # Pharos's own layout, same components
    }
    procs: list[subprocess.Popen] = []
    try:
        args = []
        for rel in cases:
            (cg2 / rel).mkdir(parents=True)
            p = subprocess.Popen(["sleep", "120"])
            procs.append(p)
            (cg2 / rel / "cgroup.procs").write_text(str(p.pid))
            args.append(f"pid:{p.pid}")
        r = subprocess.run(
            [str(exe), str(job), f"{top}/pharos", *args, f"pid:{os.getpid()}", "path:/job_4242.scope/x"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        lines = r.stdout.splitlines()
        assert lines[0] == f"mount\t{cg2}", lines  # found in /proc/mounts, not assumed
        got = {ln.split("\t")[1].lstrip("/"): ln.split("\t")[0] for ln in lines[1 : 1 + len(cases)]}
        print(f"\n[slurm] v2 decisions under {cg2}: {got}")
        assert got == cases
        assert lines[-2].startswith("place\t") and lines[-1].startswith("place\t"), lines  # this test; a unit
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        remove_tree(cg2 / top)
    assert not (cg2 / top).exists()


@pytest.mark.timeout(300)
def test_v2_task_in_slurms_job_cgroup_stays_there_live(tmp_path: Path):
    """The plugin in a real slurmstepd: the job's tasks start in a v2 cgroup named as Slurm's
    cgroup/v2 plugin names its job's (slurmd, hence every slurmstepd and task it forks, is put in
    ``<top>/system.slice/slurmstepd.scope/job_<id>/step_0/slurm`` of the job id Slurm will give);
    the plugin leaves every task there and counts it, and makes no cgroup of its own."""
    cg2 = cgroup2_mount()
    top = f"pharos-test-{uuid.uuid4().hex[:8]}"
    job = 40000 + int.from_bytes(os.urandom(2), "big") % 20000
    slurm_cg = cg2 / top / "system.slice" / "slurmstepd.scope" / f"job_{job}" / "step_0" / "slurm"
    options = {**CLOSED_API, "cgroup_parent": f"{top}/pharos"}
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(tmp_path, 0o755)
    slurm_cg.mkdir(parents=True)
    try:
        with running_slurm(options, extra_conf=[f"FirstJobId={job}"]) as cluster:
            slurmd = int((cluster.dir / "slurmd.pid").read_text())
            (slurm_cg / "cgroup.procs").write_text(str(slurmd))
            got = cluster.run(
                "sbatch",
                "--parsable",
                "-n",
                "2",
                "--overcommit",
                f"--output={out / 'job.out'}",
                "--wrap",
                f"cat /proc/self/cgroup > {out}/batch; "
                f"srun -n 2 --overcommit sh -c 'cat /proc/self/cgroup > {out}/task.$SLURM_PROCID'",
            ).strip()
            assert got == str(job)
            info = cluster.wait(got, 120)
            assert info["JobState"] == "COMPLETED", (info, (out / "job.out").read_text())
            counters = dict(ln.split() for ln in (cluster.statedir / "counters").read_text().splitlines())
            where = {f.name: cgroup_lines(f.read_text())[""] for f in sorted(out.glob("[bt]*"))}
            print(f"\n[slurm] job {job}: {where}; counters {counters}")
            assert where == dict.fromkeys(["batch", "task.0", "task.1"], f"/{slurm_cg.relative_to(cg2)}"), where
            assert counters["tasks_in_slurm_cgroup"] == "3" and counters["tasks_placed"] == "0", counters
            assert not (cg2 / top / "pharos").exists(), "the plugin made a cgroup of its own"
    finally:
        # what is left in the tree is this Slurm's: the plugin's delayed cgroup removal (5 s)
        procs = slurm_cg / "cgroup.procs"
        deadline = time.monotonic() + 15
        while procs.exists() and procs.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in procs.read_text().split() if procs.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        while procs.exists() and procs.read_text().split() and time.monotonic() < deadline + 5:
            time.sleep(0.2)
        remove_tree(cg2 / top)
    assert not (cg2 / top).exists()


@pytest.mark.timeout(300)
def test_plugin_reaches_the_api_over_its_unix_socket_and_claims_the_hint_with_post(store, tmp_path: Path):
    """``socket=PATH``: the plugin's requests reach the Pharos API served on a Unix socket (the
    URL's host, which does not resolve, is ignored), and it claims the hint with
    ``POST /v1/hints/jobs/{id}`` and the query of the former GET. The API's Kafka is a closed
    port here, so the events are not accepted (and spooled): what is checked is what arrived."""
    import uvicorn

    from pharos_api.app import create_app
    from pharos_core.settings import Settings

    with socket.socket() as s:  # a closed port for the API's Kafka: nothing is produced anywhere
        s.bind(("127.0.0.1", 0))
        kafka = f"127.0.0.1:{s.getsockname()[1]}"
    api = create_app(store, Settings(state_dir=tmp_path, kafka_bootstrap=kafka))
    seen: list[tuple[str, str, str]] = []

    async def recorded(scope, receive, send):  # what reached the API, as its ASGI server saw it
        if scope["type"] == "http":
            seen.append((scope["method"], scope["path"], scope["query_string"].decode()))
        await api(scope, receive, send)

    sock = Path("/run/pharos-test") / f"api-{uuid.uuid4().hex[:8]}.sock"
    server = uvicorn.Server(uvicorn.Config(recorded, uds=str(sock), log_level="warning", lifespan="off"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and th.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        options = {"api": "http://pharos-api.invalid", "socket": str(sock), "timeout": "2", "hint": "yes"}
        with running_slurm(options) as cluster:
            job = cluster.run(
                "sbatch", "--parsable", "--job-name=over-socket", "--output=/dev/null", "--wrap", "true"
            ).strip()
            assert cluster.wait(job, 90)["JobState"] == "COMPLETED"
        print(f"\n[slurm] over {sock}: {seen}")
        assert ("POST", f"/v1/jobs/{job}/events", "") in seen, seen
        hints = [(m, dict(parse_qsl(q))) for m, path, q in seen if path == f"/v1/hints/jobs/{job}"]
        want = {"apply": "true", "name": "over-socket", "user": "root"}
        assert len(hints) == 1 and hints[0][0] == "POST", seen
        assert {k: hints[0][1].get(k) for k in want} == want and hints[0][1].get("ranks", "1") == "1", seen
    finally:
        server.should_exit = True
        th.join(10)
        sock.unlink(missing_ok=True)
        producer = getattr(api.state, "job_events", None)
        if producer is not None:
            producer.close()


def test_counters_listed_by_pharos_slurm_status(tmp_path: Path):
    """`pharos slurm status` reads every counter the plugin writes (the two lists agree)."""
    text = (REPO / "agents" / "slurm" / "pharos_spank.c").read_text()
    block = re.search(r"COUNTERS\[\] = \{(.*?)NULL\}", text, re.S)[1]
    from pharos_api.cli_slurm import COUNTERS

    assert tuple(re.findall(r'"(\w+)"', block)) == COUNTERS
