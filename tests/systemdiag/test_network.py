"""Slow network paths (issue 25: the lossy, capped link of a compute node is named): per compute
node, the agent's latency of data requests under the mount minus the forwarding nodes' queue wait
and service time of that node's requests, against the other compute nodes. Real chDB store, rows
as the agents and the daemons write them. The live check is bench/cluster.py --faults on the rig
(10% loss and a 20 Mbit/s cap on cn1's link)."""

from __future__ import annotations

import time

import pytest

from pharos_analytics.alerts import ALERTNAMES, Condition
from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.network import NETWORK_KIND, detect_slow_networks, node_overheads
from pharos_core.store import ns_to_datetime64

S = 1_000_000_000
MS = 1_000_000
NOW = time.time_ns()
MOUNT = "/pharos"


def rows(
    node: str, n: int, client_ms: float, service_ms: float, queue_ms: float = 0.0, path: str = "", now: int = NOW
) -> list[dict]:
    """``n`` 1 MiB writes of ``node`` in the 10 s before ``now``: the agent's (``client_ms`` each,
    under the mount unless ``path``) and the forwarding daemon's (``service_ms`` + ``queue_ms``).
    Each test has its own hour before NOW (``store`` is one per module)."""
    out = []
    for i in range(n):
        t = now - int(10 * S * (n - i) / n)
        base = {
            "start": ns_to_datetime64(t),
            "job_id": "j1",
            "rank": 0,
            "pid": 1,
            "tid": 1,
            "comm": "fio",
            "op": "pwrite",
            "file_type": "regular",
            "path": path or f"{MOUNT}/j1/data.{node}",
            "fd": 3,
            "offset": i << 20,
            "size": 1 << 20,
            "result": 1 << 20,
            "count": 1,
            "bytes": 1 << 20,
            "seq": i,
            "record_index": 0,
        }
        out.append(
            base
            | {
                "end": ns_to_datetime64(t + int(client_ms * MS)),
                "duration_ns": int(client_ms * MS),
                "layer": "client",
                "host": node,
                "producer_id": f"agent:{node}",
            }
        )
        out.append(
            base
            | {
                "end": ns_to_datetime64(t + int(service_ms * MS)),
                "duration_ns": int(service_ms * MS),
                "queue_wait_ns": int(queue_ms * MS),
                "layer": "forwarder",
                "host": "fwd0",
                "compute_node": node,
                "forwarding_node": "fwd0",
                "path": f"/j1/data.{node}",
                "producer_id": "fwd:fwd0",
            }
        )
    return out


def test_the_node_with_a_slow_link_is_named(store):
    # cn0 and cn2: 3 ms at the client, 1.5 + 0.5 ms at the forwarding node (1 ms between);
    # cn1: 250 ms at the client (TCP retransmissions), the same 2 ms at the forwarding node
    store.insert_rows("io_requests", rows("cn0", 20, 3.0, 1.5, 0.5) + rows("cn2", 20, 3.0, 1.5, 0.5))
    store.insert_rows("io_requests", rows("cn1", 20, 250.0, 1.5, 0.5))
    over = node_overheads(store, MOUNT, DiagnosisConfig(), NOW)
    assert over["cn0"]["overhead_ms"] == pytest.approx(1.0) and over["cn1"]["overhead_ms"] == pytest.approx(248.0)
    (a,) = detect_slow_networks(store, MOUNT, DiagnosisConfig(), NOW)
    assert (a.kind, a.node, a.node_type, a.active) == (NETWORK_KIND, "cn1", "compute_node", True)
    assert a.rel_service == pytest.approx(248.0)
    assert a.evidence["network"]["peers_median_overhead_ms"] == pytest.approx(1.0)
    cond = Condition.from_anomaly(a)
    assert (
        cond.labels["alertname"] == ALERTNAMES[NETWORK_KIND] == "PharosNetworkSlow"
        and "cn1" in cond.annotations["summary"]
    )


def test_a_slow_forwarding_node_or_a_quiet_window_blames_no_link(store):
    now = NOW - 3600 * S
    # every node's requests slow because the forwarding node is (queue wait and service): no link blamed
    store.insert_rows(
        "io_requests", rows("cn0", 20, 300.0, 200.0, 99.0, now=now) + rows("cn1", 20, 302.0, 200.0, 100.0, now=now)
    )
    assert detect_slow_networks(store, MOUNT, DiagnosisConfig(), now) == []
    # a node alone has no peer; a node with fewer requests than network_min_requests is not judged
    store.insert_rows(
        "io_requests", rows("cn0", 20, 250.0, 1.5, now=now + 600 * S) + rows("cn1", 5, 3.0, 1.5, now=now + 600 * S)
    )
    assert detect_slow_networks(store, MOUNT, DiagnosisConfig(), now + 600 * S) == []


def test_requests_outside_the_mount_and_old_ones_do_not_count(store):
    now = NOW - 2 * 3600 * S
    local = rows("cn1", 20, 500.0, 1.5, path="/scratch/local.dat", now=now)
    store.insert_rows("io_requests", rows("cn0", 20, 3.0, 1.5, now=now) + rows("cn2", 20, 3.0, 1.5, now=now) + local)
    over = node_overheads(store, MOUNT, DiagnosisConfig(), now)
    assert sorted(over) == ["cn0", "cn2"]  # cn1's requests were not on the forwarding layer: not judged
    assert detect_slow_networks(store, MOUNT, DiagnosisConfig(), now) == []
    assert node_overheads(store, MOUNT, DiagnosisConfig(network_window_s=5), now + 30 * S) == {}
