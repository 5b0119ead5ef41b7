"""Rows the dashboards need beyond tests/analytics' synthetic jobs: forwarder-layer requests with
forwarding nodes, targets and queue waits, target metrics with one slow target, anomalies of every
kind, control actions, pins, allocations and an alert notification. Anomalies and control actions
are dated in the minutes before the store is built (the alert rules look 10 minutes back; the rows
are made when add_dashboard_rows runs, not at import, which in the whole suite is many minutes
earlier); I/O an hour ago (T0)."""

from __future__ import annotations

import json
import time

from pharos_synthetic_jobs import T0, MiB, S, rec

from pharos_core.store import Store, ns_to_datetime64

_now = [int(time.time()) * S]


def ago(seconds: float) -> str:
    """`seconds` before the time add_dashboard_rows started."""
    return ns_to_datetime64(_now[0] - int(seconds * S))


def at(seconds: float) -> str:
    return ns_to_datetime64(T0 + int(seconds * S))


def forwarder_requests() -> list[dict]:
    rows = []
    for i in range(8):
        for rank, node, target in ((0, "fwd0", "ost0"), (1, "fwd1", "ost3")):
            r = rec(
                "mix",
                rank,
                "write",
                f"/scratch/a.{rank}",
                MiB,
                MiB,
                2,
                layer="forwarder",
                start=2 + i,
                end=2.5 + i,
                dur=0.01 * (1 + 3 * rank),
            )
            r.update(
                forwarding_node=node,
                target=target,
                compute_node="cn01",
                queue_wait_ns=(1 + rank) * 200_000 * (1 + i % 3),
            )
            rows.append(r)
    meta = rec("mix", 0, "open", "/scratch/a.0", 0, 3, 1, layer="forwarder", start=1.9)
    meta.update(forwarding_node="fwd0", queue_wait_ns=50_000)
    return [*rows, meta]


def target_metrics() -> list[dict]:
    rows = []
    for i in range(30):
        for t, target in enumerate(("ost0", "ost1", "ost2", "ost3")):
            for node in ("fwd0", "fwd1"):
                slow = 4.0 if target == "ost3" else 1.0
                b = (8 - t) * MiB
                rows.append(
                    {
                        "time": at(i),
                        "target": target,
                        "forwarding_node": node,
                        "interval_ms": 1000,
                        "bytes_read": b // 4,
                        "bytes_written": b,
                        "read_ops": 2,
                        "write_ops": 8,
                        "metadata_ops": 1,
                        "latency_p50_ns": int(1_000_000 * slow),
                        "latency_p95_ns": int(3_000_000 * slow),
                        "latency_p99_ns": int(5_000_000 * slow),
                        "latency_max_ns": int(9_000_000 * slow),
                        "queue_depth": 1 + t,
                        "throttled": int(t == 1),
                        "max_perf_mb_s": 100.0,
                        "slowdown": slow,
                        "added_latency_ns": 0,
                        "service_ns_sum": int(10_000_000 * slow),
                        "producer_id": f"fwd:{node}",
                        "seq": i,
                        "host": node,
                    }
                )
    return rows


def anomaly(kind, node, node_type, detected_ago, *, active=1, job="", culprit="", persistence="", ratio=3.0, span=None):
    start, end = (ago(span[0]), ago(span[1])) if span else (None, None)
    return {
        "detected": ago(detected_ago),
        "key": f"{kind}:{node}" if kind.startswith("fail_slow") else f"{kind}:{job}:{culprit}:{node_type}:{node}",
        "kind": kind,
        "node": node,
        "node_type": node_type,
        "job_id": job,
        "culprit_job": culprit,
        "persistence": persistence,
        "active": active,
        "severity": "critical" if ratio >= 4 else "warning",
        "ratio": ratio,
        "onset": ago(detected_ago + 30),
        "start": start,
        "end": end,
        "evidence": json.dumps({"method": "synthetic", "ratio": ratio}),
    }


def anomalies() -> list[dict]:
    return [
        anomaly("fail_slow_target", "ost3", "target", 180, persistence="transient", ratio=3.2),
        anomaly("fail_slow_target", "ost3", "target", 120, persistence="persistent", ratio=4.1),
        anomaly("fail_slow_target", "ost2", "target", 300, active=0, persistence="transient", ratio=1.1),
        anomaly("fail_slow_forwarder", "fwd1", "forwarder", 120, persistence="persistent", ratio=2.5),
        anomaly("interference", "fwd0", "forwarding_node", 150, job="mix", culprit="n1", ratio=5.0, span=(400, 200)),
        anomaly("straggler_resource", "ost3", "target", 100, active=0, job="mix", ratio=3.9, span=(700, 600)),
    ]


def action(kind, job, resource, before, after, status, seconds_ago, reason="synthetic"):
    return {
        "time": ago(seconds_ago),
        "action_id": f"{kind}-{job}-{seconds_ago}",
        "job_id": job,
        "kind": kind,
        "resource": resource,
        "from_state": before,
        "to_state": after,
        "reason": reason,
        "evidence": "{}",
        "dry_run": 0,
        "status": status,
        "error": "refused" if status == "failed" else "",
        "endpoints": ["http://127.0.0.1:7401"],
    }


POOL = {"max_perf": {"ost0": 48.9, "ost1": 51.0, "ost2": 47.5}, "targets": ["ost0", "ost1", "ost2"]}


def actions() -> list[dict]:
    return [
        action("dfra_default", "mix", "mapping", "", "fwd0,fwd1", "applied", 500),
        action("remap", "mix", "mapping", "fwd0,fwd1", "fwd2,fwd1", "applied", 140, reason="interference from n1"),
        action("placement", "", "pool:pharos", "{}", json.dumps(POOL, sort_keys=True), "applied", 110),
        action("sync", "n1", "mapping", "fwd0", "fwd0", "failed", 60),
    ]


def pins() -> list[dict]:
    pool = {"targets": ["ost0", "ost3"], "max_perf": {"ost0": 50.0}}
    return [
        {
            "scope": "pool",
            "name": "scratch",
            "value": json.dumps(pool),
            "reason": "admin",
            "deleted": 0,
            "updated": ago(400),
        }
    ]


def allocations() -> list[dict]:
    return [{"node": "fwd2", "job_id": "mix", "since": ago(140), "reason": "remap", "updated": ago(140)}]


def alerts() -> list[dict]:
    return [
        {
            "time": ago(119),
            "key": "fail_slow_target:ost3",
            "alertname": "PharosFailSlowTarget",
            "state": "firing",
            "sink": "alertmanager",
            "accepted": 1,
            "status_code": 200,
            "onset": ago(150),
            "latency_s": 31.0,
            "labels": "{}",
            "error": "",
        }
    ]


def add_dashboard_rows(store: Store) -> None:
    """Insert the rows; everything dated "ago" is relative to now, the time of this call."""
    _now[0] = int(time.time()) * S
    store.insert_rows("io_requests", forwarder_requests())
    store.insert_rows("target_metrics", target_metrics())
    store.insert_rows("anomalies", anomalies())
    store.insert_rows("control_actions", actions())
    store.insert_rows("control_pins", pins())
    store.insert_rows("control_allocations", allocations())
    store.insert_rows("alert_log", alerts())
