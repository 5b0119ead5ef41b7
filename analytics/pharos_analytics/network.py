"""A compute node whose network path to its forwarding nodes is slow: lossy, capped or congested
(anomaly ``network_slow``).

Pharos traces each request on both sides of the network: the compute node's eBPF agent sees a
read or write on the forwarding layer's mount take its whole latency (FUSE, the mount, the network
both ways, the forwarding node), and the forwarding daemon's record of the same request carries
its queue wait and service time (``queue_wait_ns``, ``duration_ns``) and the compute node it came
from. Over the last ``network_window_s`` seconds, per compute node,

    overhead = mean client latency of data requests under the mount
             - mean (queue wait + service time) of its data requests at the forwarding nodes,

the time a request spends between the two: the mount and the network. A node whose overhead is
at least ``network_slow_ms`` and at least ``network_slow_ratio`` times the median overhead of the
other compute nodes (each with ``network_min_requests`` requests or more on both layers) is
flagged: what is slow is that node's path, not the forwarding nodes (their service time is taken
out) nor the network as a whole (its peers are fine). Packet loss makes TCP wait for
retransmissions (200 ms at least on Linux), a bandwidth cap stretches each 1 MiB request to its
transfer time: both stand out by orders of magnitude. A Darshan log cannot show this: it has the
client side only.

A node's own mount saturated by many ranks raises its overhead too (requests wait in FUSE's
queue); the evidence gives the requests and both means, so the two can be told apart.
"""

from __future__ import annotations

import statistics

from pharos_core.store import Store, ns_to_datetime64

from .diagnosis_config import DiagnosisConfig
from .failslow import Anomaly
from .liveness import node_anomaly
from .summary_sql import DATA_OPS, sql_list

NETWORK_KIND = "network_slow"

#: Per compute node: data requests under the mount seen by its agent (client layer: ``host`` is
#: the compute node), their summed latency; and the same node's requests at the forwarding nodes
#: (forwarder layer: ``compute_node``), their summed queue wait + service time.
NETWORK_SQL = f"""
SELECT node, sum(client_n) AS client_n, sum(client_ns) AS client_ns, sum(fwd_n) AS fwd_n, sum(fwd_ns) AS fwd_ns
FROM (
    SELECT host AS node, sum(count) AS client_n, sum(duration_ns) AS client_ns, 0 AS fwd_n, 0 AS fwd_ns
    FROM io_requests
    WHERE layer = 'client' AND start >= {{since:DateTime64(9)}} AND start < {{until:DateTime64(9)}}
      AND op IN {sql_list(DATA_OPS)} AND startsWith(path, {{mount:String}})
    GROUP BY node
    UNION ALL
    SELECT compute_node AS node, 0, 0, sum(count), sum(duration_ns + queue_wait_ns)
    FROM io_requests
    WHERE layer = 'forwarder' AND start >= {{since:DateTime64(9)}} AND start < {{until:DateTime64(9)}}
      AND op IN {sql_list(DATA_OPS)} AND compute_node != ''
    GROUP BY node
)
GROUP BY node
"""


def node_overheads(store: Store, mount_dir: str, cfg: DiagnosisConfig, now_ns: int) -> dict[str, dict]:
    """Per compute node with at least ``network_min_requests`` data requests on both layers in the
    window ending at ``now_ns``: ``{"overhead_ms", "client_ms", "forwarder_ms", "client_requests",
    "forwarder_requests"}`` (ms per request). ``mount_dir``: the forwarding layer's mount point on
    the compute nodes (``Settings.mount_point``). Raises pharos_core.store.StoreError."""
    mount = mount_dir.rstrip("/") + "/"
    rows = store.query(
        NETWORK_SQL,
        {
            "since": ns_to_datetime64(now_ns - int(cfg.network_window_s * 1e9)),
            "until": ns_to_datetime64(now_ns),
            "mount": mount,
        },
    )
    out = {}
    for r in rows:
        cn, fn = int(r["client_n"]), int(r["fwd_n"])
        if min(cn, fn) < cfg.network_min_requests:
            continue
        client_ms = int(r["client_ns"]) / cn / 1e6
        fwd_ms = int(r["fwd_ns"]) / fn / 1e6
        out[r["node"]] = {
            "overhead_ms": round(max(0.0, client_ms - fwd_ms), 3),
            "client_ms": round(client_ms, 3),
            "forwarder_ms": round(fwd_ms, 3),
            "client_requests": cn,
            "forwarder_requests": fn,
        }
    return out


def detect_slow_networks(
    store: Store, mount_dir: str, cfg: DiagnosisConfig | None = None, now_ns: int = 0
) -> list[Anomaly]:
    """The compute nodes whose network path to their forwarding nodes is slow now (module doc).

    Returns one active :class:`~pharos_analytics.failslow.Anomaly` per such node (kind
    ``network_slow``, ``node_type`` ``compute_node``, severity warning, ``rel_service`` = its
    overhead over the peers' median, evidence: its figures and the peers' median in ms); none
    without at least one peer to compare with. Raises pharos_core.store.StoreError."""
    cfg = cfg or DiagnosisConfig()
    nodes = node_overheads(store, mount_dir, cfg, now_ns)
    out = []
    for node, x in sorted(nodes.items()):
        peers = [y["overhead_ms"] for n, y in nodes.items() if n != node]
        if not peers:
            continue
        median = statistics.median(peers)
        ratio = x["overhead_ms"] / max(median, 0.001)
        if x["overhead_ms"] < cfg.network_slow_ms or ratio < cfg.network_slow_ratio:
            continue
        out.append(
            node_anomaly(
                NETWORK_KIND,
                node,
                "compute_node",
                "warning",
                ratio=round(ratio, 3),
                window_s=cfg.network_window_s,
                windows_flagged=[cfg.network_window_s],
                now_ns=now_ns,
                evidence={"network": x | {"peers_median_overhead_ms": round(median, 3), "peers": len(peers)}},
                rule="Pharos: client latency minus forwarding-node queue wait and service, against peer compute nodes",
            )
        )
    return out
