"""Nodes gone silent or unreachable: forwarding nodes cut off from the network, stopped or hung
(anomaly ``forwarder_silent``), and Kafka brokers the server cannot reach (``broker_unreachable``).

Every forwarding daemon's Kafka producer sends a batch at least every 2 s (a heartbeat when it
has no record: ``pharos_wire::sink``), and the pipeline stores one ``io_batches`` row per batch
with the time the daemon made it, so that table is each daemon's liveness timeline
(:func:`pharos_analytics.coverage.producers`). A daemon is *silent* when the newest batch of its
newest producer (a restarted daemon has a new producer id; the newest one stands for the node)
is older than ``forwarder_silence_s`` while another forwarding daemon's is not: what is wrong is
that node, not Kafka or the pipeline (when every daemon is silent, nothing is flagged). A cut
link, a stopped process (SIGSTOP) and a dead one look the same from here; the batches a cut-off
daemon held come in later with their own times, so the silence stays visible in the table.

This complements the fail-slow detector (:mod:`pharos_analytics.failslow`), which judges a node
that still serves, against its peers, over windows of an hour: a node serving nothing is not
slow there, it is silent here. Beacon (NSDI'19 §5.3) flags abnormal nodes from the monitoring
data itself; the heartbeat idea is the agents' coverage check (:mod:`pharos_analytics.coverage`).

The brokers are judged from the server's own probe of them (:class:`pharos_pipeline.broker_health.BrokerProbe`:
the cluster metadata and a TCP connection to each broker), not from the store: when brokers are
down, no record may reach the store at all. A broker is flagged while at least one other broker
answers (when none does, the server itself is cut off from Kafka, which the pipeline's consumer
reports); its evidence carries the partitions short of in-sync replicas and the offline ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from pharos_core.store import Store

from .coverage import Producer, producers
from .diagnosis_config import DiagnosisConfig
from .failslow import Anomaly, NodeKind

SILENT_KIND = "forwarder_silent"
BROKER_KIND = "broker_unreachable"


class BrokerLike(Protocol):
    """What :func:`detect_unreachable_brokers` reads of a broker (``pharos_pipeline.broker_health.BrokerState``)."""

    node_id: int
    address: str
    listed: bool
    reachable: bool
    error: str
    under_replicated: int
    offline: int

    @property
    def name(self) -> str: ...


def node_anomaly(
    kind: str,
    node: str,
    node_type: NodeKind,
    severity: Literal["critical", "warning"],
    *,
    now_ns: int,
    evidence: dict,
    rule: str,
    ratio: float = 0.0,
    window_s: float = 0.0,
    windows_flagged: list[float] | None = None,
    onset_ns: int | None = None,
) -> Anomaly:
    """An active, transient :class:`~pharos_analytics.failslow.Anomaly` of a node judged now by a
    rule of its own (not the fail-slow windows): silent, unreachable, slow network. ``ratio``:
    how far off the node is (stored as ``rel_service``); ``window_s``: the data it was judged
    over; ``windows_flagged``: the windows in which it was flagged (none by default)."""
    return Anomaly(
        kind=kind,
        node=node,
        node_type=node_type,
        persistence="transient",
        active=True,
        severity=severity,
        window_s=window_s,
        windows_flagged=windows_flagged or [],
        rel_service=ratio,
        z=0.0,
        beacon_slow=False,
        onset_ns=onset_ns,
        detected_ns=now_ns,
        evidence=evidence,
        rule_source=rule,
    )


def detect_silent_forwarders(
    store: Store, cfg: DiagnosisConfig | None = None, now_ns: int | None = None, since_s: float = 3600.0
) -> list[Anomaly]:
    """The forwarding nodes heard in the last ``since_s`` seconds whose daemon is silent now.

    Returns one active :class:`~pharos_analytics.failslow.Anomaly` per silent node (kind
    ``forwarder_silent``, ``node_type`` ``forwarder``, severity critical, ``rel_service`` = its
    silence in multiples of ``forwarder_silence_s``, ``onset_ns`` = its newest batch, evidence:
    producer id, last batch age in s, the peers heard); none when no daemon, or none of the others,
    is heard. Raises pharos_core.store.StoreError.
    """
    cfg = cfg or DiagnosisConfig()
    prods = [
        p
        for p in producers(store, since_s=since_s, silence_s=cfg.forwarder_silence_s, now_ns=now_ns)
        if p.kind == "fwd"
    ]
    newest: dict[str, Producer] = {}
    for p in prods:  # newest first within a host: keep the newest producer of each node
        cur = newest.get(p.host)
        if cur is None or (p.last_batch and cur.last_batch and p.last_batch > cur.last_batch):
            newest[p.host] = p
    alive = sorted(n for n, p in newest.items() if p.state == "alive")
    if not alive:
        return []
    out = []
    for node, p in sorted(newest.items()):
        if p.state == "alive":
            continue
        last_ns = int(p.last_batch.timestamp() * 1e9) if p.last_batch else None
        out.append(
            node_anomaly(
                SILENT_KIND,
                node,
                "forwarder",
                "critical",
                ratio=round(p.age_s / cfg.forwarder_silence_s, 3),
                window_s=since_s,
                onset_ns=last_ns,
                now_ns=now_ns or 0,
                evidence={"silence": {"producer": p.producer_id, "age_s": round(p.age_s, 3), "peers_heard": alive}},
                rule="Pharos: a forwarding daemon's batches (heartbeats every 2 s) stopped while its peers' go on",
            )
        )
    return out


def detect_unreachable_brokers(brokers: Sequence[BrokerLike], now_ns: int = 0) -> list[Anomaly]:
    """The Kafka brokers the server's probe could not reach while another broker answered.

    ``brokers``: one probe's states, every broker ever listed (``BrokerProbe()``). Returns one
    active :class:`~pharos_analytics.failslow.Anomaly` per unreachable broker (kind
    ``broker_unreachable``, node ``broker<node id>``, ``node_type`` ``broker``, severity critical:
    producers hold their records and, with fewer than ``min.insync.replicas`` brokers, nothing is
    stored until it is back; evidence: its address, whether the metadata still lists it, the error,
    partitions under-replicated and offline); none when no broker answered. Pure."""
    up = sorted(b.name for b in brokers if b.reachable)
    if not up:
        return []
    return [
        node_anomaly(
            BROKER_KIND,
            b.name,
            "broker",
            "critical",
            now_ns=now_ns,
            evidence={
                "probe": {
                    "address": b.address,
                    "listed": b.listed,
                    "error": b.error,
                    "under_replicated_partitions": sum(x.under_replicated for x in brokers),
                    "offline_partitions": sum(x.offline for x in brokers),
                    "brokers_reachable": up,
                }
            },
            rule="Pharos: a TCP connection to a broker the cluster metadata listed failed while another answered",
        )
        for b in brokers
        if not b.reachable
    ]
