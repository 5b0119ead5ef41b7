"""A real Slurm across the cluster rig (issue 25): slurmctld on the server node, one slurmd per
compute node, the Pharos SPANK plugin on each.

:func:`running_rig_slurm` starts, on a running rig (tests/cluster_testkit.py), what a site runs:

* **munged** on the host, with a private key and socket (tests/slurm_testkit.py): its socket is
  a file, reached from every node's namespaces (network namespaces do not separate path sockets).
* **slurmctld** in the server node's namespaces, on the server's address (``SlurmctldHost=
  HOST(ADDR)``: the nodes share the host's UTS namespace, hence its name). Its port and the
  slurmd ports are fixed (:data:`SLURMCTLD_PORT`, :data:`SLURMD_PORT_BASE`): each node has a
  network namespace of its own where the rig binds fixed ports only, so no other process can take
  them between choice and start (the one-host fixture, tests/slurm_testkit.py, retries instead).
* **one slurmd per compute node** ``cn<i>``, started through :meth:`Node.enter` (the node's
  network and mount namespaces, so its job steps and tasks see that node's FUSE mount at
  :attr:`Rig.mount_dir` and reach the others over the rig's network), as ``slurmd -N cn<i>``
  with ``NodeName=cn<i> NodeAddr=<its address> Port=<its port>``, its own spool folder, pid and
  log file (``%n`` in slurm.conf), one partition of all of them, ``MpiDefault=pmi2``.
* **the SPANK plugin** on every node (one plugstack.conf) with the rig's API, a ``scheduler``
  token in a root-only file (``token=``) and ``cgroup_parent=<rig cgroup>/%n``: the plugin
  expands ``%n`` to the Slurm node name (SLURMD_NODENAME), so each node's tasks land in THAT
  node's subtree, the one its eBPF agent traces, although all nodes share one cgroup tree here.

Slurm's folder is under /run (a system folder, as /etc/slurm and /var/spool/slurmd are on a
site: what srun and the batch shell read there is not the job's data I/O). Commands (sbatch,
scontrol) run on the server node (:class:`slurm_testkit.SlurmCluster` with the node's nsenter
prefix), with a plain environment (the job inherits it: no Pharos secret in a user's job), in the
rig's work folder. At exit everything stops and every process of this Slurm is gone (the daemons,
their steps and the plugin's delayed cgroup removal: :func:`slurm_processes`); the daemons' logs
are kept under ``<rig root>/logs/slurm``. Needs root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from cluster_testkit import Rig
from slurm_testkit import (
    SlurmCluster,
    _kill_left,
    _start,
    _stop,
    _wait_for,
    check_tools,
    conf_lines,
    munged_argv,
    plugstack_line,
    prepare_dir,
    slurm_processes,
)

SLURMCTLD_PORT = 6817
SLURMD_PORT_BASE = 6818  # cn<i>: SLURMD_PORT_BASE + i (each node has its own address anyway)


@contextlib.contextmanager
def running_rig_slurm(
    rig: Rig, cpus_per_node: int = 2, plugin_options: dict[str, str] | None = None, progress=print
) -> Iterator[SlurmCluster]:
    """Start Slurm on ``rig`` (see the module doc); yield it as a :class:`SlurmCluster` whose
    commands run on the server node; stop it all at exit. ``cpus_per_node``: each slurmd's CPUs
    (``srun -N 2 -n 4`` needs 2); ``plugin_options`` are added to the plugin's (api=, token=,
    cgroup_parent=, timeout=, statedir=). Fails the test when a daemon does not come up in 60 s."""
    check_tools()
    t0 = time.monotonic()
    d = Path("/run/pharos-test") / f"slurm-rig-{rig.id}"
    plugin, sock, key = prepare_dir(d)
    procs: list[subprocess.Popen] = []
    started: list[str] = []
    cluster: SlurmCluster | None = None
    try:
        server, compute = rig.nodes["server"], rig.compute
        # the plugin's API token: a scheduler token (job events, hints), in a file only root reads
        r = rig.client("server").request(
            "POST", f"{rig.api_url}/v1/tokens", json={"role": "scheduler", "description": "Slurm SPANK plugin (rig)"}
        )
        if r.status_code != 201:
            raise RuntimeError(f"POST /v1/tokens: HTTP {r.status_code} {r.text}")
        token = d / "pharos-api.token"
        token.touch(0o600)
        token.chmod(0o600)
        token.write_text(r.json()["token"] + "\n")
        statedir = d / "pharos-state"
        options = {
            "api": rig.api_url,
            "token": str(token),
            "cgroup_parent": f"{rig.cgroup}/%n",
            "timeout": "2",
            **(plugin_options or {}),
            "statedir": str(statedir),
        }
        plugstack = d / "plugstack.conf"
        plugstack.write_text(plugstack_line(plugin, options))
        conf = d / "slurm.conf"
        host = socket.gethostname().split(".")[0]
        ctld = f"{host}({server.addr})"
        lines = conf_lines(d, ctld, SLURMCTLD_PORT, SLURMD_PORT_BASE, sock, plugstack, per_node=True, mpi="pmi2")
        lines += [
            f"NodeName={n.name} NodeAddr={n.addr} Port={SLURMD_PORT_BASE + i} CPUs={cpus_per_node} State=UNKNOWN"
            for i, n in enumerate(compute)
        ]
        lines.append(
            f"PartitionName=rig Nodes={','.join(n.name for n in compute)} Default=YES MaxTime=INFINITE State=UP"
        )
        conf.write_text("\n".join(lines) + "\n")
        # commands' (and so the jobs') environment: plain, with the rig's mark for its leak check
        cenv = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "SLURM_CONF": str(conf),
            "PHAROS_RIG": rig.id,
        }
        cluster = SlurmCluster(
            dir=d,
            node=server.name,
            env=cenv,
            plugstack=plugstack,
            plugin=plugin,
            statedir=statedir,
            classes=statedir / "classes.tsv",
            enter=server.enter(),  # commands on the server node, in the rig's work folder
            cwd=rig.root / "work",
        )
        procs.append(_start(munged_argv(d, sock, key), d / "munged.out", {**os.environ, "PHAROS_RIG": rig.id}))
        _wait_for(sock.exists, procs, d, "munged")
        denv = {"SLURM_CONF": str(conf)}
        procs.append(rig.popen("server", ["slurmctld", "-D", "-i", "-f", str(conf)], log="slurmctld", env=denv))
        started.append("slurmctld")
        for n in compute:
            argv = ["slurmd", "-D", "-f", str(conf), "-N", n.name]
            procs.append(rig.popen(n.name, argv, log=f"{n.name}-slurmd", env=denv))
            started.append(f"{n.name}-slurmd")
        want = {n.name: "idle" for n in compute}

        def all_idle() -> bool:
            r = subprocess.run(
                [*server.enter(), "sinfo", "-h", "-N", "-o", "%N %T"],
                env=cenv,
                capture_output=True,
                text=True,
                timeout=10,
            )
            return r.returncode == 0 and dict(ln.split() for ln in r.stdout.splitlines() if ln.strip()) == want

        _wait_for(all_idle, procs, d, "slurmctld/slurmd")
        progress(
            f"[slurm {rig.id}] slurmctld on server, slurmd on {len(compute)} nodes in {time.monotonic() - t0:.1f} s"
        )
        yield cluster
    finally:
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.run("scancel", "--full", "--partition=rig", timeout=10)
        for name in reversed(started):  # slurmd first, then slurmctld
            rig.stop(name, grace_s=15)
        if procs:
            _stop(procs[0])  # munged
        _kill_left(d, grace_s=10)
        logs = rig.root / "logs" / "slurm"
        logs.mkdir(parents=True, exist_ok=True)
        for f in [*d.glob("*.log"), *d.glob("*.out")]:
            with contextlib.suppress(OSError):
                shutil.copy(f, logs / f.name)
        shutil.rmtree(d, ignore_errors=True)
        left = slurm_processes(d)
        progress(f"[slurm {rig.id}] down; processes left: {left or 'none'}")
