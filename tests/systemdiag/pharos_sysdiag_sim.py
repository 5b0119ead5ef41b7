"""A small fluid-queue simulator of forwarding nodes and storage targets that writes the rows
the real forwarding layer writes: ``target_metrics`` (per second, per (target, forwarding
node)), forwarder-layer ``io_requests`` (one row per request: start = arrival, queue_wait_ns
at the forwarding node, duration_ns = service time at the target) and ``job_events``.

Model, per simulated second:

* every job offers ``rate_mb_s`` (log-normal jitter) split evenly over its forwarding nodes
  and over its targets in proportion to their limits (performance-aware placement: the
  "proportionate load" of a slow-by-configuration target);
* a forwarding node serves ``fwd_capacity_mb_s / slowdown`` (bytes/s); what it cannot serve
  waits in its queue (requests' ``queue_wait_ns`` = backlog / rate); a ``forwarder`` fault
  stretches its service times too (a slow node's own work), a ``forwarder_stall`` fault only its
  capacity (a daemon that is not running: its requests wait, from their receipt, and the
  service of each stays as short as ever);
* a target serves ``limit / slowdown`` MB/s; service time of a request = size x slowdown /
  limit (the limit is the device's rate; the token bucket paces at it) + backlog wait,
  with log-normal jitter; backlogs are bounded (clients block: closed loop), so a slow
  target ends up serving less, as real ones do.

The detectors never read the injected ``slowdown`` column: only what a healthy system reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MB = 1_000_000
NS = 1_000_000_000
LIMITS = (50, 30, 50, 20, 30, 10, 50, 20)  # MB/s of ost0..ost7 (the heterogeneous limits)


@dataclass
class SimJob:
    job_id: str
    fwd_nodes: list[str]
    rate_mb_s: float
    req_bytes: int = 1 << 20
    targets: list[str] | None = None  # None: every target
    start_s: float = 0.0
    end_s: float = math.inf
    name: str = ""
    user: str = "alice"
    ranks: int = 4
    op: str = "write"
    # optional on/off pattern: (period_s, on_s); active when (t - start) % period < on_s
    duty: tuple[float, float] | None = None

    def active(self, t: float) -> bool:
        if not (self.start_s <= t < self.end_s):
            return False
        if self.duty is None:
            return True
        period, on = self.duty
        return (t - self.start_s) % period < on


@dataclass
class Fault:
    kind: str  # 'target' | 'forwarder' | 'forwarder_stall'
    name: str
    factor: float
    start_s: float = 0.0
    end_s: float = math.inf

    def at(self, t: float) -> float:
        return self.factor if self.start_s <= t < self.end_s else 1.0


@dataclass
class Cluster:
    targets: dict[str, float] = field(
        default_factory=lambda: {f"ost{i}": float(limit) for i, limit in enumerate(LIMITS)}
    )
    fwd_nodes: list[str] = field(default_factory=lambda: ["fwd0", "fwd1", "fwd2", "fwd3"])
    fwd_capacity_mb_s: float = 200.0
    max_backlog_s: float = 2.0  # clients block when a queue holds this many seconds of work


def simulate(
    cluster: Cluster,
    jobs: list[SimJob],
    t0_ns: int,
    duration_s: int,
    seed: int,
    faults: list[Fault] = (),
    jitter: float = 0.15,
) -> dict[str, list[dict]]:
    """Rows for ``target_metrics``, ``io_requests`` and ``job_events`` (see the module doc)."""
    rng = np.random.default_rng(seed)
    tnames = list(cluster.targets)
    q_t = {t: 0.0 for t in tnames}  # backlog bytes per target
    q_f = {f: 0.0 for f in cluster.fwd_nodes}
    tm_rows: list[dict] = []
    io_rows: list[dict] = []
    seq = 0

    def slow(kind: str, name: str, t: float) -> float:
        f = 1.0
        for x in faults:
            if x.kind == kind and x.name == name:
                f *= x.at(t)
        return f

    for s in range(duration_s):
        t = float(s)
        sec_ns = t0_ns + s * NS
        # offered bytes per flow (job, fwd, target)
        flows: list[tuple[SimJob, str, str, float]] = []
        for j in jobs:
            if not j.active(t):
                continue
            tg = j.targets or tnames
            wsum = sum(cluster.targets[x] for x in tg)
            total = j.rate_mb_s * MB * float(rng.lognormal(0, jitter))
            for f in j.fwd_nodes:
                for x in tg:
                    flows.append((j, f, x, total / len(j.fwd_nodes) * cluster.targets[x] / wsum))
        # forwarding nodes: issue what the bounded queue admits
        cap_f = {
            f: cluster.fwd_capacity_mb_s * MB / slow("forwarder", f, t) / slow("forwarder_stall", f, t)
            for f in cluster.fwd_nodes
        }
        off_f = {f: 0.0 for f in cluster.fwd_nodes}
        for _, f, _, b in flows:
            off_f[f] += b
        a_f = {}
        wait_f = {}
        for f in cluster.fwd_nodes:
            room = cap_f[f] * (1 + cluster.max_backlog_s) - q_f[f]
            issued = min(off_f[f], max(room, 0.0))
            a_f[f] = issued / off_f[f] if off_f[f] else 1.0
            q0 = q_f[f]
            q_f[f] = max(0.0, q0 + issued - cap_f[f])
            wait_f[f] = (q0 + q_f[f]) / 2 / cap_f[f] + max(0.0, issued - cap_f[f] * 0.8) / cap_f[f] * 0.5
        # targets
        cap_t = {x: cluster.targets[x] * MB / slow("target", x, t) for x in tnames}
        off_t = {x: 0.0 for x in tnames}
        for _, f, x, b in flows:
            off_t[x] += b * a_f[f]
        b_t, wait_t, served_t = {}, {}, {}
        for x in tnames:
            room = cap_t[x] * (1 + cluster.max_backlog_s) - q_t[x]
            issued = min(off_t[x], max(room, 0.0))
            b_t[x] = issued / off_t[x] if off_t[x] else 1.0
            q0 = q_t[x]
            served_t[x] = min(q0 + issued, cap_t[x])
            q_t[x] = q0 + issued - served_t[x]
            wait_t[x] = (q0 + q_t[x]) / 2 / cap_t[x]
        # requests and per-(target, fwd) metrics
        per_tf: dict[tuple[str, str], dict] = {}
        for j, f, x, b in flows:
            nbytes = b * a_f[f] * b_t[x]
            n = int(nbytes // j.req_bytes) + (1 if rng.random() < (nbytes % j.req_bytes) / j.req_bytes else 0)
            if n == 0:
                continue
            sf, st = slow("forwarder", f, t), slow("target", x, t)
            arrivals = np.sort(rng.random(n))
            svc = (j.req_bytes * st / (cluster.targets[x] * MB) * sf + 50e-6) * rng.lognormal(0, 0.2, n) + wait_t[
                x
            ] * rng.random(n) * 2
            qw = wait_f[f] * rng.random(n) * 2 + 20e-6 * rng.random(n)
            m = per_tf.setdefault((x, f), {"svc": [], "bytes": 0, "ops": 0, "w": 0, "r": 0})
            m["svc"].append(svc)
            for k in range(n):
                start = sec_ns + int(arrivals[k] * NS)
                dur = int(svc[k] * NS)
                io_rows.append(
                    {
                        "start": _dt(start),
                        "end": _dt(start + int(qw[k] * NS) + dur),
                        "duration_ns": dur,
                        "layer": "forwarder",
                        "host": f,
                        "job_id": j.job_id,
                        "rank": k % j.ranks,
                        "pid": 1000,
                        "tid": 1000,
                        "comm": "pharos-fwd",
                        "op": j.op,
                        "file_type": "regular",
                        "dev": 0,
                        "inode": 0,
                        "path": f"/pfs/{j.job_id}/data.{k % j.ranks}",
                        "fd": 3,
                        "offset": 0,
                        "size": j.req_bytes,
                        "result": j.req_bytes,
                        "count": 1,
                        "bytes": j.req_bytes,
                        "compute_node": f"cn{k % j.ranks}",
                        "forwarding_node": f,
                        "target": x,
                        "object_id": hash((j.job_id, x)) & 0xFFFF,
                        "queue_wait_ns": int(qw[k] * NS),
                        "producer_id": f"sim:{f}",
                        "seq": s,
                        "record_index": k,
                    }
                )
        for x in tnames:
            for f in cluster.fwd_nodes:
                m = per_tf.get((x, f))
                # served bytes of the target, shared among forwarders by their issued bytes
                svc = np.concatenate(m["svc"]) if m else np.array([])
                share = (
                    (len(svc) / max(1, sum(len(np.concatenate(v["svc"])) for (xx, _), v in per_tf.items() if xx == x)))
                    if m
                    else 0.0
                )
                served = served_t[x] * share
                ops = round(served / (1 << 20)) if m else 0
                pct = (lambda p, svc=svc: int(np.quantile(svc, p) * NS)) if len(svc) else (lambda p: 0)
                seq += 1
                tm_rows.append(
                    {
                        "time": _dt(sec_ns),
                        "target": x,
                        "forwarding_node": f,
                        "interval_ms": 1000,
                        "bytes_read": 0,
                        "bytes_written": int(served),
                        "read_ops": 0,
                        "write_ops": ops,
                        "metadata_ops": 0,
                        "latency_p50_ns": pct(0.5),
                        "latency_p95_ns": pct(0.95),
                        "latency_p99_ns": pct(0.99),
                        "latency_max_ns": int(svc.max() * NS) if len(svc) else 0,
                        "queue_depth": int(q_t[x] / (1 << 20) * share),
                        "throttled": int(q_t[x] > 0),
                        "max_perf_mb_s": cluster.targets[x],
                        "slowdown": slow("target", x, t),
                        "added_latency_ns": 0,
                        "service_ns_sum": int(svc.sum() * NS * share) if len(svc) else 0,
                        "producer_id": f"sim:{f}",
                        "seq": seq,
                        "host": f,
                    }
                )
    ev_rows = []
    for j in jobs:
        end_s = min(j.end_s, duration_s)
        for kind, ts in (("start", j.start_s), ("end", end_s)):
            ev_rows.append(
                {
                    "job_id": j.job_id,
                    "kind": kind,
                    "time": _dt(t0_ns + int(ts * NS)),
                    "name": j.name or j.job_id.split("-")[0],
                    "command": ["sim"],
                    "user": j.user,
                    "ranks": j.ranks,
                    "host": "cn0",
                    "exit_code": 0,
                    "cgroup": "",
                }
            )
    return {"target_metrics": tm_rows, "io_requests": io_rows, "job_events": ev_rows}


def _dt(ns: int) -> str:
    return f"{ns // NS}.{ns % NS:09d}"


def insert(store, rows: dict[str, list[dict]]) -> None:
    for table, r in rows.items():
        for i in range(0, len(r), 20000):
            store.insert_rows(table, r[i : i + 20000])


def proportionate_jobs(prefix: str, total_mb_s: float, fwd_nodes: list[str], n_jobs: int = 3) -> list[SimJob]:
    """n_jobs jobs spreading ``total_mb_s`` over every target (proportionate to the limits),
    each on all forwarding nodes."""
    return [SimJob(f"{prefix}-j{i}", fwd_nodes, total_mb_s / n_jobs, name=f"app{i}") for i in range(n_jobs)]
