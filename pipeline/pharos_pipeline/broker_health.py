"""The Kafka brokers as the server sees them: which are reachable, which partitions are short of
replicas. Read by the detection loop (:func:`pharos_analytics.liveness.detect_unreachable_brokers`)
every cycle.

A broker that was killed, or cut off from the network, stops answering; while the cluster's
quorum holds, the controller fences it and its partitions lose it from their in-sync replicas.
When the quorum itself is lost (two of three KRaft nodes gone), the survivor still answers
metadata requests from its cache, which keeps listing the lost nodes: so the probe does not trust
the metadata alone, it also opens a TCP connection to every broker it has ever seen listed.
A broker is *unreachable* when that connection fails within ``timeout_s``.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient


@dataclass
class BrokerState:
    """One Kafka broker (KRaft ``node.id``) at one probe.

    ``address``: host:port it advertises; ``listed``: in the cluster metadata now; ``reachable``:
    a TCP connection to it opened within the probe's timeout; ``error``: why not (empty when
    reachable); ``under_replicated``/``offline``: partitions it is a replica of whose in-sync
    replicas are fewer than their replicas / that have no leader (from the metadata, which may be
    stale without a quorum)."""

    node_id: int
    address: str
    listed: bool
    reachable: bool
    error: str = ""
    under_replicated: int = 0
    offline: int = 0

    @property
    def name(self) -> str:
        """``broker<node id>``: the node name anomalies and alerts carry."""
        return f"broker{self.node_id}"


@dataclass
class BrokerProbe:
    """Probes the brokers of ``bootstrap`` (``host:port[,...]``); call it for a list of
    :class:`BrokerState`, one per broker ever listed, by node id. An empty list when no broker
    was ever listed (Kafka never reached: nothing to compare with)."""

    bootstrap: str
    timeout_s: float = 1.0
    known: dict[int, str] = field(default_factory=dict)
    _admin: AdminClient | None = None

    def _metadata(self):
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        try:
            return self._admin.list_topics(timeout=self.timeout_s * 2)
        except KafkaException:
            return None

    def __call__(self) -> list[BrokerState]:
        md = self._metadata()
        listed = set()
        under: dict[int, int] = {}
        offline: dict[int, int] = {}
        if md is not None:
            for b in md.brokers.values():
                self.known[b.id] = f"{b.host}:{b.port}"
                listed.add(b.id)
            for t in md.topics.values():
                for p in t.partitions.values():
                    for r in p.replicas:
                        if len(p.isrs) < len(p.replicas):
                            under[r] = under.get(r, 0) + 1
                        if p.leader < 0:
                            offline[r] = offline.get(r, 0) + 1
        out = []
        for node_id, addr in sorted(self.known.items()):
            host, _, port = addr.rpartition(":")
            err = ""
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=self.timeout_s).close()
            except OSError as exc:
                err = str(exc) or type(exc).__name__
            out.append(
                BrokerState(
                    node_id, addr, node_id in listed, not err, err, under.get(node_id, 0), offline.get(node_id, 0)
                )
            )
        return out
