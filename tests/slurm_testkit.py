"""A real Slurm on loopback for tests: munged, slurmctld and slurmd from Debian's packages
(Makefile APT_PACKAGES: slurmctld slurmd slurm-client munge libslurm-dev), one node with this
machine's CPUs, started in a directory of its own under /run and stopped at the end.

:func:`running_slurm` generates slurm.conf (auth/munge through a private munged socket and key,
free loopback ports for slurmctld and slurmd, proctrack/linuxproc and task/none so Slurm itself
creates no cgroups, select/cons_tres, one partition), a plugstack.conf loading the Pharos SPANK
plugin (build/slurm/pharos_spank.so) with the given options, and, with ``job_submit``, Pharos's
job_submit.lua next to slurm.conf. Commands (sbatch, squeue, scontrol) get ``SLURM_CONF`` from
:attr:`SlurmCluster.env`. Needs root.

Its pieces (:func:`prepare_dir`, :func:`munged_argv`, :func:`conf_lines` with ``per_node`` for
several slurmd, :class:`SlurmCluster` with ``enter``: commands run in a node's namespaces) also
build the multi-node Slurm of the cluster rig (tests/cluster_slurm.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pharos_testkit import REPO, free_port

PLUGIN = REPO / "build" / "slurm" / "pharos_spank.so"
JOB_SUBMIT_LUA = REPO / "agents" / "slurm" / "job_submit.lua"
DAEMONS = ("munged", "slurmctld", "slurmd")


@dataclass
class SlurmCluster:
    dir: Path
    node: str
    env: dict[str, str]
    plugstack: Path
    plugin: Path  # the plugin's copy in ``dir``
    statedir: Path  # the plugin's statedir= (counters)
    classes: Path  # the table job_submit.lua reads ($PHAROS_SLURM_CLASSES)
    enter: list[str] = field(default_factory=list)  # where commands run (a rig node's nsenter)
    cwd: Path | None = None  # their working folder (a job's, when submitted)

    def run(self, *argv: str, timeout: float = 30) -> str:
        """A Slurm command with this cluster's SLURM_CONF; its stdout. Fails the test on error."""
        r = subprocess.run(
            [*self.enter, *argv], env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=timeout
        )
        assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}"
        return r.stdout

    def sbatch(self, script: Path) -> str:
        """Submit ``script``; the Slurm job id."""
        out = self.run("sbatch", "--parsable", str(script))
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict of its Key=Value fields."""
        text = self.run("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: str, timeout_s: float = 180) -> dict[str, str]:
        """Wait until the job has left the queue (a final state); its fields then."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.job(job_id)
            if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return info
            if time.monotonic() > deadline:
                self.run("scancel", job_id)
                pytest.fail(f"Slurm job {job_id} not done in {timeout_s:.0f} s: {info.get('JobState')} {info}")
            time.sleep(0.5)

    def set_plugin_options(self, options: dict[str, str]) -> None:
        """Rewrite plugstack.conf (statedir= is always this cluster's): the job prolog and each
        step read it when they start."""
        self.plugstack.write_text(plugstack_line(self.plugin, {**options, "statedir": str(self.statedir)}))


def plugstack_line(plugin: Path, options: dict[str, str]) -> str:
    return f"optional {plugin} " + " ".join(f"{k}={v}" for k, v in options.items()) + "\n"


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def prepare_dir(d: Path) -> tuple[Path, Path, Path]:
    """Make Slurm's folder ``d`` (state/, spool/, munge/ reachable by job users), copy the plugin
    into it and write a fresh munge key; returns (the plugin's copy, munged's socket, the key)."""
    d.mkdir(parents=True)
    plugin = d / PLUGIN.name
    shutil.copy(PLUGIN, plugin)
    for sub in ("state", "spool", "munge"):
        (d / sub).mkdir(exist_ok=True)
    os.chmod(d / "munge", 0o755)  # job processes of other users reach the socket
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    return plugin, d / "munge" / "munge.sock", key


def munged_argv(d: Path, sock: Path, key: Path) -> list[str]:
    """munged in the foreground on its private socket and key, its files in ``d``."""
    return [
        "munged",
        "-F",
        "-f",
        f"--socket={sock}",
        f"--key-file={key}",
        f"--pid-file={d / 'munged.pid'}",
        f"--seed-file={d / 'munged.seed'}",
        f"--log-file={d / 'munged.log'}",
        "--origin=127.0.0.1",
    ]


def conf_lines(
    d: Path,
    ctld: str,
    ctld_port: int,
    slurmd_port: int,
    sock: Path,
    plugstack: Path,
    per_node: bool = False,
    mpi: str = "none",
) -> list[str]:
    """slurm.conf's settings but the nodes and the partition (see the module doc): slurmctld on
    ``ctld`` (``HOST(ADDR)``). ``per_node``: the slurmd files are each node's own (spool/<node>,
    slurmd-<node>.pid and .log: Slurm expands ``%n`` to the node's name), for several slurmd;
    ``mpi``: MpiDefault."""
    sd = "-%n" if per_node else ""
    return [
        "ClusterName=pharostest",
        f"SlurmctldHost={ctld}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sock}",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool' / '%n' if per_node else d / 'spool'}",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / f'slurmd{sd}.pid'}",
        f"SlurmctldLogFile={d / 'slurmctld.log'}",
        f"SlurmdLogFile={d / f'slurmd{sd}.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        f"MpiDefault={mpi}",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        f"PlugStackConfig={plugstack}",
    ]


def check_tools() -> None:
    """Fail the test when Slurm, munge or the built plugin is missing."""
    for tool in (*DAEMONS, "sbatch", "scontrol"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: apt-get install slurmctld slurmd slurm-client munge (Makefile)")
    if not PLUGIN.exists():
        pytest.fail(f"{PLUGIN} missing: `make build` builds the Pharos SPANK plugin")


#: Attempts at starting slurmctld and slurmd on fresh ports when a port was taken meanwhile.
PORT_ATTEMPTS = 4
#: What slurmctld and slurmd log when their port is taken (bind(2)'s EADDRINUSE).
PORT_TAKEN = "Address already in use"


def pick_ports() -> tuple[int, int]:
    """Two free loopback ports (slurmctld's, slurmd's). Slurm cannot bind port 0 and report the
    port, so they are free when chosen and may be taken before the daemons bind them: the
    caller retries on :data:`PORT_TAKEN`."""
    ctld = free_port()
    slurmd = free_port()
    while slurmd == ctld:
        slurmd = free_port()
    return ctld, slurmd


@contextlib.contextmanager
def running_slurm(
    plugin_options: dict[str, str],
    job_submit: bool = False,
    extra_conf: list[str] | None = None,
    cgroup_conf: list[str] | None = None,
) -> Iterator[SlurmCluster]:
    """munged + slurmctld + slurmd (see the module doc) in a fresh directory under /run, a system
    path like a site's /etc/slurm and /var/spool/slurmd, so that what Slurm's own processes in the
    job (srun, the batch shell) read there is not the job's data I/O; the plugin is copied there
    as a site installs it under Slurm's PluginDir. ``plugin_options``: the SPANK plugin's options
    (statedir= is set to the cluster's); ``extra_conf``: slurm.conf lines that override the
    generated ones with the same key (e.g. ``ProctrackType=proctrack/cgroup``); ``cgroup_conf``:
    the lines of a cgroup.conf beside slurm.conf (Slurm's cgroup plugins read it). The ports are
    chosen free; when one was taken before slurmctld or slurmd bound it (their log says
    :data:`PORT_TAKEN`), both are stopped and started again on new ports, up to
    :data:`PORT_ATTEMPTS` times. Fails the test when something is missing or a daemon does not
    come up within 60 s; stops all three and removes the directory on exit."""
    check_tools()
    d = Path("/run/pharos-test") / f"slurm-{uuid.uuid4().hex[:8]}"
    plugin, sock, key = prepare_dir(d)
    node = socket.gethostname().split(".")[0]
    plugstack = d / "plugstack.conf"
    statedir, classes = d / "pharos-state", d / "pharos-state" / "classes.tsv"
    plugstack.write_text(plugstack_line(plugin, {**plugin_options, "statedir": str(statedir)}))
    conf = d / "slurm.conf"
    if job_submit:
        shutil.copy(JOB_SUBMIT_LUA, d / "job_submit.lua")
    if cgroup_conf is not None:
        (d / "cgroup.conf").write_text("\n".join(cgroup_conf) + "\n")
    denv = dict(os.environ, SLURM_CONF=str(conf), PHAROS_SLURM_CLASSES=str(classes))
    procs: list[subprocess.Popen] = []

    def node_idle() -> bool:
        try:  # what holds a taken port may accept and never answer
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=denv, capture_output=True, text=True, timeout=5)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0 and r.stdout.strip() == "idle"

    try:
        procs.append(_start(munged_argv(d, sock, key), d / "munged.out", denv))
        _wait_for(lambda: sock.exists(), procs, d, "munged")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            ctld_port, slurmd_port = pick_ports()
            lines = [
                *conf_lines(d, f"{node}(127.0.0.1)", ctld_port, slurmd_port, sock, plugstack),
                f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
                *(["JobSubmitPlugins=lua"] if job_submit else []),
            ]
            conf.write_text("\n".join(_override(lines, extra_conf or [])) + "\n")
            daemons = [
                _start(["slurmctld", "-D", "-i", "-f", str(conf)], d / "slurmctld.out", denv),
                _start(["slurmd", "-D", "-f", str(conf), "-N", node], d / "slurmd.out", denv),
            ]
            procs += daemons
            if _wait_for(node_idle, procs, d, "slurmctld/slurmd", retry_if=PORT_TAKEN):
                break
            for p in reversed(daemons):  # a port was taken: both again on new ports
                _stop(p)
                procs.remove(p)
            _set_logs_aside(d, attempt)
            if attempt == PORT_ATTEMPTS:
                pytest.fail(f"slurmctld/slurmd: a port was taken at each of {PORT_ATTEMPTS} attempts ({d})")
        yield SlurmCluster(d, node, denv, plugstack, plugin, statedir, classes)
    finally:
        for p in reversed(procs):
            _stop(p)
        _kill_left(d, grace_s=10)  # a job's slurmstepd outlives slurmd: a test that failed mid-job
        shutil.rmtree(d, ignore_errors=True)


def _override(lines: list[str], extra: list[str]) -> list[str]:
    """``lines`` with each ``Key=`` of ``extra`` replaced by extra's line (appended if new)."""
    keys = {x.split("=", 1)[0]: x for x in extra}
    out = [keys.pop(ln.split("=", 1)[0], ln) for ln in lines]
    return out + list(keys.values())


NUL = b"\0"


def slurm_processes(d: Path) -> list[str]:
    """Processes of the Slurm in folder ``d``: its daemons (their command lines name ``d``) and
    everything whose environment has its slurm.conf (steps, tasks, srun, the plugin's prolog,
    epilog and delayed cgroup removal: Slurm sets SLURM_CONF for all of them)."""
    conf = f"SLURM_CONF={d / 'slurm.conf'}".encode()
    out, me = [], os.getpid()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == me:
            continue
        with contextlib.suppress(OSError):
            cmd = (p / "cmdline").read_bytes()
            if str(d).encode() in cmd or conf in (p / "environ").read_bytes().split(NUL):
                out.append(f"{p.name} {cmd.replace(NUL, b' ')[:120]!r}")
    return out


def _kill_left(d: Path, grace_s: float) -> None:
    """Wait up to ``grace_s`` for the Slurm's processes to end (a job's epilog, the plugin's
    cgroup removal 5 s after it); SIGKILL what is left."""
    deadline = time.monotonic() + grace_s
    while (left := slurm_processes(d)) and time.monotonic() < deadline:
        time.sleep(0.3)
    for line in left:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def _set_logs_aside(d: Path, attempt: int) -> None:
    """Rename the daemons' logs of a failed start (so the next attempt's are read alone)."""
    for f in [*d.glob("slurm*.log"), *d.glob("slurm*.out")]:
        f.rename(f.with_name(f"{f.name}.attempt{attempt}"))


def _wait_for(ok, procs: list[subprocess.Popen], d: Path, what: str, timeout_s: float = 60, retry_if: str = "") -> bool:
    """Wait until ``ok()``; True then. Fails the test when one of ``procs`` exits or ``timeout_s``
    passes, showing the logs in ``d``, unless ``retry_if`` is given and a daemon's log in ``d``
    contains it: False then (the caller starts again)."""
    deadline = time.monotonic() + timeout_s
    while not ok():
        dead = [p.args[0] for p in procs if p.poll() is not None]
        logs = {f.name: f.read_text(errors="replace") for f in [*d.glob("*.out"), *d.glob("*.log")]}
        if retry_if and any(retry_if in text for text in logs.values()):
            return False
        if dead or time.monotonic() > deadline:
            tails = {name: text[-1500:] for name, text in logs.items()}
            pytest.fail(f"{what} did not come up ({'exited: ' + ', '.join(dead) if dead else 'timeout'}): {tails}")
        time.sleep(0.3)
    return True
