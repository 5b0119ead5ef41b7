"""The fault schedule of ``bench/cluster.py --faults`` (issue 25; Jepsen's nemesis is the model).

Each fault runs over its own multi-node fio job (``--verify=crc32c``, rate-limited so that it is
still writing when the fault hits and when it heals): the job starts, the fault is injected
``LEAD_S`` seconds later, held, healed, and the job runs to its end. Every step is logged with its
time since the schedule began. Per fault, measured: whether the job's bytes written and read are
exactly fio's on the client layer (the agents) and the forwarder layer (mounts and daemons), whether
fio verified its data, the seconds from injection to the first anomaly naming the faulted node
(``GET /v1/anomalies?node=``; ``-`` when nothing names it within the hold), and the seconds from
healing until the job has ended and Pharos shows its figures complete on both layers (recover:
it includes the job's own remaining run, a few seconds at its rate). Records lost and duplicates are counted over the whole store
at the end (bench/cluster.py).

The faults (``FAULTS``, in order; the nodes hit are fixed so that a run can be compared with the
next):

* ``fwd-link-cut``: fwd0's link down (``ip link set eth0 down`` in its namespace) for 20 s, longer
  than the mounts' request timeout (``MOUNT_ARGS``: 18 s, which bench/cluster.py gives every mount
  with ``--faults``; the link goes down once fwd0 is serving the job's writes, at most 30 s after
  the injection): the mounts fail over to the next forwarding node and replay the idempotent
  requests fwd0 did not answer (``pharos_mount_replays``); a request fwd0 had executed before the
  cut hid its reply is recorded by both daemons and counted once (the records' request id and
  replay flag, :mod:`pharos_analytics.replays_sql`); fwd0's records wait in its producer.
* ``broker-kill+partition``: Kafka node 1 killed (SIGKILL to every process of the node) and node 2
  cut off by iptables DROP for 20 s; node 1 restarted after. With 3 nodes the quorum and min ISR 2 are lost meanwhile: producers
  hold their records (agents' and daemons' queues) until it is back.
* ``cn-loss+cap``: 10% packet loss each way (iptables ``-m statistic --mode random``) and a 20
  Mbit/s cap (``tc tbf``) on cn1's link for 30 s (no netem on this kernel: no delay qdisc).
* ``serve-kill``: ``pharos serve`` (pipeline, API, control loop) killed with SIGKILL mid-ingest and
  restarted 5 s later: its consumer resumes from its committed offsets, the store's exactly-once
  check drops what it had already stored.
* ``fwd-sigstop``: fwd1's daemon stopped (SIGSTOP) for 15 s, then continued: a hung node.

The two forwarding-node faults are named by the silent-forwarder detector
(:mod:`pharos_analytics.liveness`, anomaly ``forwarder_silent``), the brokers by the server's
broker probe (anomaly ``broker_unreachable``, named ``broker<node.id>``), the lossy, capped link
by the slow-network detector (:mod:`pharos_analytics.network`, ``network_slow`` cn1). The killed
server by none here: it is the detector, and a restart within 30 s is not an alert; a dead server
is Prometheus' ``PharosComponentDown`` (deploy/prometheus/rules.yml), not run on the rig.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cluster_testkit import FWD_PORT_BASE, MOUNT_ADMIN_PORT, FioJob, Rig, fio_results, sh, start_fio_job, wait_summary

LEAD_S = 4.0  # the job runs this long before the fault
#: Every mount's request timeout with ``--faults`` (bench/cluster.py): shorter than fwd-link-cut's
#: 20 s, so the mounts fail over and replay rather than wait for fwd0, and longer than fwd-sigstop's
#: 15 s, so that the stopped daemon's clients still wait for it (that fault unchanged).
MOUNT_ARGS = ["--rpc-timeout-ms", "18000"]
RATE_MIB_S = 2  # per rank: the job outlasts the fault


def _in(rig: Rig, node: str, *argv: str, check: bool = True) -> None:
    """Run a network command (ip, iptables, tc) in ``node``'s network namespace."""
    sh("nsenter", f"--net=/run/netns/{rig.nodes[node].ns}", "--", *argv, check=check)


def _fwd0_written(rig: Rig) -> int:
    """Bytes fwd0 has written for its clients (its admin ``/status``, with the site's admin token)."""
    token = (rig.root / "site" / "fwd-admin.token").read_text().strip()
    url = f"http://{rig.nodes['fwd0'].addr}:{FWD_PORT_BASE + 1}/status"
    got = rig.client("server").get(url, headers={"Authorization": f"Bearer {token}"})
    return int(got.json()["counters"]["bytes_written"])


def _cut_fwd0_link_mid_writes(rig: Rig) -> None:
    """fwd0's link down once fwd0 is serving the job's writes (1 MiB more than when called, at most
    30 s): a mount then has a request in flight on it, which times out and is replayed on the next
    node, rather than a job mapped elsewhere before it wrote anything (its ranks start through ssh,
    slowly on a loaded machine, and the control loop does not map a job to a node it finds down).
    The wait is logged; the fault's detect s counts from the injection, so it includes the wait."""
    t0 = time.monotonic()
    start = _fwd0_written(rig)
    while _fwd0_written(rig) < start + (1 << 20) and time.monotonic() < t0 + 30:
        time.sleep(0.2)
    _in(rig, "fwd0", "ip", "link", "set", "eth0", "down")
    print(f"  fwd-link-cut: fwd0 served the job's writes {time.monotonic() - t0:.1f} s after the injection: link down")


def _heal_fwd0_link(rig: Rig) -> None:
    """fwd0's link up; logs the requests each compute node's mount failed over and replayed so far
    (``pharos_mount_failovers`` and ``pharos_mount_replays`` of its ``/metrics``)."""
    _in(rig, "fwd0", "ip", "link", "set", "eth0", "up")
    token = (rig.root / "site" / "fwd-admin.token").read_text().strip()
    got = {}
    for n in rig.compute:
        with contextlib.suppress(Exception):
            url = f"http://{n.addr}:{MOUNT_ADMIN_PORT}/metrics"
            text = rig.client("server").get(url, headers={"Authorization": f"Bearer {token}"}).text
            got[n.name] = {
                m.group(1): int(m.group(2))
                for m in re.finditer(r"^pharos_mount_(failovers|replays)_total (\d+)", text, re.M)
            }
    print(f"  fwd-link-cut: the mounts' failovers and replays so far: {got}")


def _signal(rig: Rig, name: str, sig: int) -> None:
    """Send ``sig`` to the session of the rig process started as ``name``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(rig.procs[name].pid, sig)


def _drop_all(rig: Rig, node: str, on: bool) -> None:
    for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
        _in(rig, node, "iptables", "-A" if on else "-D", chain, flag, "eth0", "-j", "DROP", check=on)


def _loss_cap(rig: Rig, node: str, on: bool) -> None:
    stat = ["-m", "statistic", "--mode", "random", "--probability", "0.1", "-j", "DROP"]
    for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
        _in(rig, node, "iptables", "-A" if on else "-D", chain, flag, "eth0", *stat, check=on)
    if on:
        _in(
            rig,
            node,
            "tc",
            "qdisc",
            "add",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            "20mbit",
            "burst",
            "32kb",
            "latency",
            "400ms",
        )
    else:
        _in(rig, node, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)


def _restart_broker(rig: Rig, node: str) -> None:
    rig.stop(node, grace_s=5)
    rig.popen(node, rig.pharos("broker", "--node-id", node.removeprefix("kafka")), log=node)


def _restart_server(rig: Rig) -> None:
    rig.stop("server", grace_s=5)
    rig.popen("server", rig.pharos("serve"), log="server")


@dataclass
class Fault:
    name: str
    node: str  # the node it hits (what detection should name)
    hold_s: float
    inject: Callable[[Rig], None]
    heal: Callable[[Rig], None]
    what: str


FAULTS = [
    Fault(
        "fwd-link-cut",
        "fwd0",
        20,
        _cut_fwd0_link_mid_writes,
        _heal_fwd0_link,
        "fwd0's link down, the mounts fail over",
    ),
    Fault(
        "broker-kill+partition",
        "broker1",  # Kafka node.id 1 = rig node kafka1 (the probe names node 2 too)
        20,
        lambda r: (r.kill_node("kafka1"), _drop_all(r, "kafka2", True)),
        lambda r: (_drop_all(r, "kafka2", False), _restart_broker(r, "kafka1")),
        "Kafka node 1 killed, node 2 partitioned",
    ),
    Fault(
        "cn-loss+cap",
        "cn1",
        30,
        lambda r: _loss_cap(r, "cn1", True),
        lambda r: _loss_cap(r, "cn1", False),
        "10% loss and 20 Mbit/s on cn1's link",
    ),
    Fault(
        "serve-kill",
        "server",
        5,
        lambda r: _signal(r, "server", signal.SIGKILL),
        _restart_server,
        "pharos serve killed (SIGKILL), restarted",
    ),
    Fault(
        "fwd-sigstop",
        "fwd1",
        15,
        lambda r: _signal(r, "fwd1", signal.SIGSTOP),
        lambda r: _signal(r, "fwd1", signal.SIGCONT),
        "fwd1's daemon stopped (SIGSTOP)",
    ),
]


@dataclass
class FaultResult:
    fault: Fault
    job: FioJob
    injected: float = 0.0  # seconds since the schedule began
    healed: float = 0.0
    detect_s: float | None = None
    recover_s: float | None = None
    exact: bool = False
    verified: bool = False
    figures: dict = field(default_factory=dict)


def _named(rig: Rig, node: str) -> bool:
    """Some anomaly of the last hour names ``node``."""
    with contextlib.suppress(Exception):
        return bool(rig.api("anomalies", node=node, since_s=3600)["items"])
    return False


def run_schedule(rig: Rig, faults: list[Fault], log: Callable[[str], None] = print) -> list[FaultResult]:
    """Run ``faults`` one after the other, each over its own fio job on cn0 and cn1 (N-N)."""
    t0 = time.monotonic()
    stamp = lambda: time.monotonic() - t0  # noqa: E731
    out = []
    for k, fault in enumerate(faults):
        size = int(RATE_MIB_S * (LEAD_S + fault.hold_s + 6))
        job = FioJob(f"fault{k}-{fault.name.split('+')[0]}", "N-N", ["cn0", "cn1"], size, f"--rate={RATE_MIB_S}m")
        res = FaultResult(fault, job)
        start_fio_job(rig, job)
        log(f"[{stamp():6.1f} s] {fault.name}: job {job.job_id} started ({size} MiB per rank at {RATE_MIB_S} MiB/s)")
        time.sleep(LEAD_S)
        res.injected = stamp()
        fault.inject(rig)
        log(f"[{res.injected:6.1f} s] {fault.name}: injected ({fault.what}) for {fault.hold_s:.0f} s")
        end = time.monotonic() + fault.hold_s
        while time.monotonic() < end:
            if res.detect_s is None and fault.node != "server" and _named(rig, fault.node):
                res.detect_s = stamp() - res.injected
                log(f"[{stamp():6.1f} s] {fault.name}: an anomaly names {fault.node}")
            time.sleep(1)
        fault.heal(rig)
        res.healed = stamp()
        log(f"[{res.healed:6.1f} s] {fault.name}: healed")
        try:
            job.exit_code = job.proc.wait(300)
        except Exception:
            job.proc.kill()
            job.exit_code = job.proc.wait()
        ended = stamp() - res.healed
        totals, res.verified = fio_results(job)
        layers = {
            layer: wait_summary(rig, job.job_id, layer, totals.get("bytes_written", 1), 180)
            for layer in ("client", "forwarder")
        }
        res.recover_s = stamp() - res.healed
        res.figures = {"fio": totals} | {
            layer: (s.get("bytes_written"), s.get("bytes_read"), s.get("complete")) for layer, s in layers.items()
        }
        res.exact = bool(totals) and all(
            (s.get("bytes_written"), s.get("bytes_read")) == (totals["bytes_written"], totals["bytes_read"])
            for s in layers.values()
        )
        log(
            f"[{stamp():6.1f} s] {fault.name}: job exit {job.exit_code} {ended:.1f} s after healing, its figures "
            f"complete {res.recover_s:.1f} s after; "
            f"exact {res.exact}, verified {res.verified}; {res.figures}"
        )
        out.append(res)
    return out


def table(results: list[FaultResult], lost: int, duplicates: int) -> str:
    """One table: fault, records lost and duplicates (whole store), bytes exact, verified, detect s,
    recover s."""
    rows = [
        f"{'fault':24s} {'lost':>5s} {'dups':>5s} {'bytes exact':>11s} {'verified':>8s} {'detect s':>8s} {'recover s':>9s}"
    ]
    for r in results:
        det = f"{r.detect_s:.0f}" if r.detect_s is not None else "-"
        rows.append(
            f"{r.fault.name:24s} {lost:5d} {duplicates:5d} {'yes' if r.exact else 'NO':>11s} "
            f"{'yes' if r.verified else 'NO':>8s} {det:>8s} {r.recover_s or 0:9.1f}"
        )
    return "\n".join(rows)
