"""Fail-slow storage targets and forwarding nodes: peer comparison under comparable load.

Inputs are the tables only: ``target_metrics`` (per interval, per (target, forwarding node),
read with FINAL) for targets, forwarder-layer ``io_requests`` (``forwarding_node``,
``target``, ``bytes``, ``duration_ns`` = service time, ``queue_wait_ns``) for forwarding
nodes. Every window ``(now - w, now]`` of :attr:`DiagnosisConfig.failslow_windows_s` is
judged on its own; the same node flagged in every window is *persistent*, otherwise
*transient* (Beacon, NSDI'19 §5.3: widening windows separate lasting faults from bursts).

Two detectors are computed on the same windows and both are reported per node:

* **Beacon's rule** (NSDI'19 §5.3, "slow node detection"): a node is slow when its average
  AND its maximum bandwidth (bytes/s per busy interval; maximum over intervals) are below
  ``failslow_bw_ratio`` (0.5) of the peers' mean maximum bandwidth while it serves more than
  ``failslow_volume_ratio`` (0.6) of the peers' mean volume (bytes in the window). Peers are
  the other nodes of the same kind. It assumes homogeneous nodes.
* **The model** (Pharos): a robust z-score (scikit-learn ``RobustScaler``: median and IQR,
  scaled to a standard deviation) of the log of the node's *relative service time per
  byte* among its peers. For targets that is service time per byte (ns/B: the interval's
  summed service time ``service_ns_sum`` / bytes; p50 latency x ops for rows without it; the
  median over the window's intervals of each forwarding node that served the target, and of
  those the fastest, so that a slow forwarding node, whose stretched service times cover every
  target it serves, does not make them look slow, while a slow target is slow through every
  forwarding node) times the target's configured rate (``max_perf_mb_s``): 1 = served exactly at its
  configured rate, whatever that rate is,
  so a 10 MB/s target is not an outlier for being configured slow. (When some target has
  no limit, the raw ns/B is compared: homogeneous targets assumed.) For forwarding nodes it
  is, per target, the node's ns/B over the median ns/B of all forwarding nodes on the same
  target, averaged in log space weighted by bytes: the comparison is always on the same
  storage, so a slow target does not make its forwarders look slow. Both features are the
  *median over the window's intervals* (1 s, or window/600 for forwarders), not the mean, so
  a short burst does not flag a long window: that is what separates persistent from transient.

**Which decides**: the model, with a load guard taken from Beacon's idea that a node is only
judged under load (``failslow_min_ops`` requests, or fewer that kept it in service at least
``failslow_min_utilization`` of the window, as a very slow target does; and
``failslow_min_busy_share`` of the intervals busy), and effect-size guards (``failslow_min_ratio`` x the peers' median, and for targets at least
``failslow_min_added_ms`` more per request than the peers' median).
A forwarding node whose daemon is not running (CPU starved, paused, swapping) keeps short
service times: its requests wait instead, in the socket's receive buffer and its queues. Its
records' queue wait counts from the kernel's receipt of each request (the daemon's ``rx``
stamps), and :func:`_stalled` names it when its mean wait is ``failslow_stall_added_ms`` above
its loaded peers' median (and ``failslow_min_ratio`` times it) while it served no more than
they did (requests, bytes): waits that load cannot explain, as a node that keeps
serving has every worker busy whenever a request waits (after Perseus, FAST'23: latency judged
against throughput).
Beacon's rule alone misses slow nodes whose degraded bandwidth is still comparable to
slower-configured peers (a 50 MB/s target slowed 4x still moves 12.5 MB/s, more than the
10 and 20 MB/s targets), and its volume clause fails once clients block on the slow node
(closed loop): its verdict is kept as evidence (``beacon_slow``) and in the per-window table
for comparison (tests/systemdiag print both precision/recall figures).

Units: bandwidth bytes/s, service time ns, service per byte ns/B, ratios dimensionless.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np

from pharos_core.store import Store, ns_to_datetime64

from .diagnosis_config import DiagnosisConfig
from .failslow_sql import (
    FWD_BUCKETS_PER_WINDOW,
    TARGET_FWD_MEDIANS_SQL,
    TARGET_INTERVALS_SQL,
    TARGET_WINDOW_SQL,
    forwarder_window_sql,
    rollup_step,
)

NodeKind = Literal["target", "forwarder", "broker", "compute_node"]
KIND_NAME = {"target": "fail_slow_target", "forwarder": "fail_slow_forwarder"}
MIN_FWD_OPS = 3  # requests a forwarding node needs on a target in a window to speak for the target
_MIN_LOG_SCALE = (
    0.05  # floor of the robust scale (log units, ~5 %): a perfectly tight peer group is not infinitely sensitive
)


@dataclass
class NodeVerdict:
    """One node in one window: its features and both detectors' verdicts.

    Units: bandwidth bytes/s, latency ns, ``rel_service`` dimensionless (x peers' median)."""

    kind: NodeKind
    node: str
    window_s: float
    judged: bool  # passed the load guard (and enough peers)
    rel_service: float | None  # node's service time per byte / peers' median (model feature)
    z: float | None  # robust z-score of log(rel_service) among peers
    model_slow: bool
    beacon_slow: bool
    features: dict = field(default_factory=dict)

    @property
    def slow(self) -> bool:
        """The decision: the model (load- and effect-size-guarded)."""
        return self.model_slow


@dataclass
class Anomaly:
    """A fail-slow node (source: Beacon §5.3 windows; Pharos model). Times in ns since the epoch."""

    kind: str  # fail_slow_target | fail_slow_forwarder
    node: str
    node_type: NodeKind
    persistence: Literal["persistent", "transient"]
    active: bool  # flagged in the shortest window (the condition holds now)
    severity: Literal["critical", "warning"]
    window_s: float  # the longest window in which the node is flagged
    windows_flagged: list[float]
    rel_service: float  # in the shortest flagged window
    z: float
    beacon_slow: bool  # Beacon's rule agreed (shortest flagged window)
    onset_ns: int | None  # first interval of the current slow run (active anomalies)
    detected_ns: int
    evidence: dict
    rule_source: str = (
        "Pharos model (robust z of service time per byte vs peers; forwarding nodes also by waits load "
        "cannot explain, after Perseus FAST'23) + Beacon NSDI'19 §5.3 windows"
    )

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.node}"

    def to_dict(self) -> dict:
        return asdict(self) | {"key": self.key}


@dataclass
class FailSlowReport:
    now_ns: int
    windows_s: list[float]
    anomalies: list[Anomaly]
    verdicts: list[NodeVerdict]  # every (node, window): the comparison table of both detectors


def _robust_z(values: dict[str, float]) -> dict[str, float]:
    """Robust z-scores of log(values): (x - median) / (IQR / 1.349) via RobustScaler, scale floored."""
    from sklearn.preprocessing import RobustScaler  # here: importing this module (the CLI does) stays light

    names = list(values)
    x = np.log(np.array([max(values[n], 1e-12) for n in names])).reshape(-1, 1)
    sc = RobustScaler(unit_variance=True).fit(x)
    scale = max(float(sc.scale_[0]), _MIN_LOG_SCALE)
    return {n: float((x[i, 0] - sc.center_[0]) / scale) for i, n in enumerate(names)}


def beacon_rule(node: str, feats: dict[str, dict], cfg: DiagnosisConfig) -> bool:
    """Beacon NSDI'19 §5.3: avg AND max bandwidth < bw_ratio x peers' mean max bandwidth, while the
    node's volume > volume_ratio x the peers' mean volume. ``feats``: node -> {bw_avg, bw_max, bytes}
    (bytes/s, bytes) of every node in the window."""
    peers = [f for n, f in feats.items() if n != node]
    if not peers:
        return False
    me = feats[node]
    peer_max = sum(p["bw_max"] for p in peers) / len(peers)
    peer_vol = sum(p["bytes"] for p in peers) / len(peers)
    return (
        me["bw_avg"] < cfg.failslow_bw_ratio * peer_max
        and me["bw_max"] < cfg.failslow_bw_ratio * peer_max
        and me["bytes"] > cfg.failslow_volume_ratio * peer_vol
    )


def _judge(
    kind: NodeKind,
    window_s: float,
    feats: dict[str, dict],
    rel: dict[str, float],
    cfg: DiagnosisConfig,
    n_intervals: float,
) -> list[NodeVerdict]:
    """Model + rule for every node of one kind in one window."""

    def busy_enough(f: dict) -> bool:  # many requests, or few that kept it busy (a very slow node)
        if f["ops"] >= cfg.failslow_min_ops:
            return True
        util = f.get("svc_ns", 0.0) / (window_s * 1e9)
        return f["ops"] >= 2 and util >= cfg.failslow_min_utilization

    loaded = {
        n
        for n, f in feats.items()
        if n in rel and busy_enough(f) and f["busy"] >= cfg.failslow_min_busy_share * n_intervals
    }
    z = _robust_z({n: rel[n] for n in loaded}) if len(loaded) >= cfg.failslow_min_peers else {}
    med = float(np.median([rel[n] for n in loaded])) if loaded else 1.0
    # targets: the absolute effect, ms per request at the node's mean request size
    raw = [feats[n]["svc_ns_per_byte_median"] for n in loaded if "svc_ns_per_byte_median" in feats[n]]
    raw_med = float(np.median(raw)) if raw else None
    out = []
    for n, f in feats.items():
        judged = n in z
        r = rel.get(n) / med if n in rel and med > 0 else None
        model = judged and z[n] >= cfg.failslow_z and r is not None and r >= cfg.failslow_min_ratio
        if model and raw_med is not None and "svc_ns_per_byte_median" in f:
            added_ms = (f["svc_ns_per_byte_median"] - raw_med) * f.get("req_bytes", 0.0) / 1e6
            model = added_ms >= cfg.failslow_min_added_ms
        if kind == "forwarder" and not model and _stalled(n, feats, loaded, cfg):
            model, judged = True, True
        out.append(NodeVerdict(kind, n, window_s, judged, r, z.get(n), bool(model), beacon_rule(n, feats, cfg), f))
    return out


def _stalled(node: str, feats: dict[str, dict], loaded: set[str], cfg: DiagnosisConfig) -> bool:
    """A forwarding node that stalls: its requests wait (mean ``queue_wait_ns``, from the kernel's
    receipt of each request to its service) at least ``failslow_stall_added_ms`` longer than the
    median of its loaded peers (>= ``failslow_min_peers`` - 1 of them) and ``failslow_min_ratio``
    times it, while it served no more than ``failslow_stall_served_ratio`` x their median: requests
    (``ops``) and bytes (its throughput; not its service time, which a stall caught mid-request
    stretches too; the ratio, 1.2, because nodes under the same jobs serve within a few percent of
    each other and a throttled daemon catching up in bursts serves its share). A node
    that keeps serving has every worker busy whenever a request waits, so waits that come with
    load come with more served; these come with less: the daemon itself is not running (CPU
    starved, paused, swapping). Its service times stay short, so the service-time model cannot
    see it. Source: Pharos, after Perseus (Lu et al.,
    FAST'23: a node's latency judged against its throughput among its peers). Sets
    ``feats[node]["stall_wait_ms"]`` (its mean wait, ms) and ``["stall_added_ms"]`` (that minus the
    peers' median, ms) when judged. Units: ns, ms."""
    f = feats[node]
    peers = [p for p in loaded if p != node]
    if len(peers) < cfg.failslow_min_peers - 1 or f["ops"] < MIN_FWD_OPS:
        return False
    wait_ms = f["queue_wait_ns"] / 1e6
    peer_ms = float(np.median([feats[p]["queue_wait_ns"] for p in peers])) / 1e6
    f["stall_wait_ms"] = round(wait_ms, 3)
    f["stall_added_ms"] = round(wait_ms - peer_ms, 3)
    return (
        wait_ms - peer_ms >= cfg.failslow_stall_added_ms
        and wait_ms >= cfg.failslow_min_ratio * peer_ms
        and f["ops"] <= cfg.failslow_stall_served_ratio * float(np.median([feats[p]["ops"] for p in peers]))
        and f["bytes"] <= cfg.failslow_stall_served_ratio * float(np.median([feats[p]["bytes"] for p in peers]))
    )


def _target_window(store: Store, since_ns: int, until_ns: int) -> tuple[dict[str, dict], dict[str, float]]:
    rows = store.query(TARGET_WINDOW_SQL, {"since": ns_to_datetime64(since_ns), "until": ns_to_datetime64(until_ns)})
    feats = {
        r["node"]: {
            k: (float(v) if isinstance(v, (int, float, str)) and k not in ("node",) else v)
            for k, v in r.items()
            if k != "node"
        }
        for r in rows
    }
    # the model's feature: the fastest forwarding node's median ns/B on the target (of those with
    # MIN_FWD_OPS requests): a slow forwarding node stretches the service times it reports on
    # every target it serves, while every forwarding node sees a slow target slow
    per_fwd: dict[str, list[float]] = {}
    for r in store.query(
        TARGET_FWD_MEDIANS_SQL, {"since": ns_to_datetime64(since_ns), "until": ns_to_datetime64(until_ns)}
    ):
        if int(r["ops"]) >= MIN_FWD_OPS and float(r["med"]) > 0:
            per_fwd.setdefault(r["node"], []).append(float(r["med"]))
    for n, f in feats.items():
        if per_fwd.get(n):
            f["svc_ns_per_byte_median"] = min(per_fwd[n])
            f["forwarding_nodes_judged"] = len(per_fwd[n])
    limited = feats and all(f["max_perf_mb_s"] > 0 for f in feats.values())
    rel = {}
    for n, f in feats.items():
        if f["bytes"] <= 0:
            continue
        # ns/B x (MB/s -> B/ns): 1 = paced exactly at the configured rate
        rel[n] = f["svc_ns_per_byte_median"] * (f["max_perf_mb_s"] * 1e6 / 1e9 if limited else 1.0)
        f["norm_service"] = rel[n]
        f["normalised_by_limit"] = bool(limited)
    return feats, rel


def _fwd_window(store: Store, since_ns: int, until_ns: int, cfg: DiagnosisConfig) -> tuple[dict, dict, dict]:
    """Per forwarding node over one window: its features (``window`` of
    :func:`~pharos_analytics.failslow_sql.forwarder_window_sql`, with ``svc_ns_per_byte`` and
    ``rel_service_raw``), its relative service time and the per-target medians (``relative``),
    read in intervals of :func:`~pharos_analytics.failslow_sql.rollup_step` (``busy``: intervals)."""
    step = rollup_step((until_ns - since_ns) / 1e9, cfg.failslow_min_intervals)
    q = forwarder_window_sql(since_ns, until_ns, step)
    step_ns = step * 1_000_000_000
    bucket_ns = max(step_ns, (until_ns - since_ns) // FWD_BUCKETS_PER_WINDOW // step_ns * step_ns)
    p = {"bucket_ns": bucket_ns, "min_ops": max(3, cfg.failslow_min_ops // 10)}
    feats = {r["node"]: {k: float(v) for k, v in r.items() if k != "node"} for r in store.query(q.window)}
    rel = {}
    for r in store.query(q.relative, p):
        if int(r["intervals"]):
            rel[r["node"]] = float(r["rel"])
        if r["node"] in feats:
            feats[r["node"]]["svc_ns_per_byte"] = float(r["svc_ns"]) / max(1.0, float(r["bytes"]))
    med = {r["target"]: float(r["med"]) for r in store.query(q.target_medians, p)}
    for n, f in feats.items():
        f.setdefault("svc_ns_per_byte", 0.0)
        if n in rel:
            f["rel_service_raw"] = rel[n]
    return feats, rel, med


def _onset_target(
    store: Store, node: str, since_ns: int, until_ns: int, cfg: DiagnosisConfig, limited: bool
) -> int | None:
    rows = store.query(TARGET_INTERVALS_SQL, {"since": ns_to_datetime64(since_ns), "until": ns_to_datetime64(until_ns)})
    by_t: dict[int, dict[str, float]] = {}
    for r in rows:
        if float(r["ops"]) <= 0:
            continue
        v = float(r["ns_per_byte"]) * (float(r["perf"]) * 1e-3 if limited else 1.0)
        by_t.setdefault(int(r["t_ns"]), {})[r["node"]] = v
    return _onset(by_t, node, cfg)


def _onset(by_t: dict[int, dict[str, float]], node: str, cfg: DiagnosisConfig) -> int | None:
    """Start of the last run of intervals in which ``node`` was >= min_ratio x the other nodes'
    median (idle intervals of the node do not break the run), also when that run has ended
    (the window still judges the node slow while its newest intervals are not): None only when
    no interval was slow."""
    onset = run = None
    for t in sorted(by_t):
        vals = by_t[t]
        if node not in vals:
            continue
        others = [v for n, v in vals.items() if n != node]
        if not others:
            continue
        if vals[node] >= cfg.failslow_min_ratio * float(np.median(others)):
            run = t if run is None else run
            onset = run
        else:
            run = None
    return onset


def _onset_forwarder(
    store: Store, node: str, since_ns: int, until_ns: int, med: dict[str, float], cfg: DiagnosisConfig
) -> int | None:
    step = rollup_step((until_ns - since_ns) / 1e9, cfg.failslow_min_intervals)
    rows = store.query(forwarder_window_sql(since_ns, until_ns, step).intervals, {"node": node})
    onset = run = None  # as _onset: the start of the last run of slow intervals, ended or not
    per_t: dict[int, list[float]] = {}
    for r in rows:
        if r["target"] in med and med[r["target"]] > 0:
            per_t.setdefault(int(r["t_ns"]), []).append(float(r["ns_per_byte"]) / med[r["target"]])
    for t in sorted(per_t):
        if float(np.median(per_t[t])) >= cfg.failslow_min_ratio:
            run = t if run is None else run
            onset = run
        else:
            run = None
    return onset


@dataclass
class WindowCache:
    """Verdicts of the fail-slow windows kept between the periodic detection's cycles: a window
    but the shortest is re-judged once ``failslow_refresh_share`` of its length has passed since it
    was judged, the shortest once ``failslow_shortest_refresh_share`` has (see those settings).
    Key (kind, window s) -> (judged at ns, verdicts, ctx)."""

    entries: dict[tuple[str, float], tuple[int, list[NodeVerdict], object]] = field(default_factory=dict)

    def get(
        self,
        kind: str,
        w: float,
        now_ns: int,
        shortest: float,
        share: float,
        stale: bool = False,
        shortest_share: float = 0.0,
    ):
        """The cached (verdicts, ctx) of a window, None when it must be judged again: a long one
        after ``share`` of its length, the shortest after ``shortest_share`` (0: every call); with
        ``stale`` any cached entry of a long window (when the cycle has no budget left to re-judge it)."""
        hit = self.entries.get((kind, w))
        if hit is None or (w == shortest and (stale or shortest_share <= 0)):
            return None
        if w == shortest:
            share = shortest_share
        if not stale and (share <= 0 or not 0 <= now_ns - hit[0] < w * share * 1e9):
            return None
        return hit[1], hit[2]


def detect_failslow(
    store: Store,
    cfg: DiagnosisConfig | None = None,
    now_ns: int | None = None,
    kinds: tuple[NodeKind, ...] = ("target", "forwarder"),
    cache: WindowCache | None = None,
) -> FailSlowReport:
    """Judge every target and forwarding node in each window ``(now - w, now]`` of
    ``cfg.failslow_windows_s`` (s); ``now_ns`` defaults to the wall clock. With ``cache`` (the
    periodic detection's), a long window judged less than ``failslow_refresh_share`` of its
    length ago keeps its verdicts, and at most ``failslow_windows_per_cycle`` long windows are
    judged per call, shortest first: one due beyond that keeps its previous verdicts, one never
    judged has none yet (after a start the long windows are judged over the first cycles; a node
    is persistent only once flagged in all of them).

    Returns the anomalies (one per flagged node: persistent when flagged in every window,
    active when flagged in the shortest) and every (node, window) verdict of both detectors.
    """
    cfg = cfg or DiagnosisConfig()
    now_ns = time.time_ns() if now_ns is None else now_ns
    windows = sorted(cfg.failslow_windows_s)
    verdicts: list[NodeVerdict] = []
    ctx: dict = {}
    budget = cfg.failslow_windows_per_cycle
    for w in windows:
        since = now_ns - int(w * 1e9)
        judged = False
        for kind in ("target", "forwarder"):
            if kind not in kinds:
                continue
            hit = (
                cache.get(
                    kind,
                    w,
                    now_ns,
                    windows[0],
                    cfg.failslow_refresh_share,
                    shortest_share=cfg.failslow_shortest_refresh_share,
                )
                if cache
                else None
            )
            if hit is None and cache is not None and w != windows[0] and budget <= 0:
                hit = cache.get(kind, w, now_ns, windows[0], cfg.failslow_refresh_share, stale=True)
                if hit is None:
                    continue  # not judged yet: a later cycle judges it
            if hit is not None:
                verdicts += hit[0]
                ctx[(kind, w)] = hit[1]
                continue
            judged = True
            if kind == "target":
                feats, rel = _target_window(store, since, now_ns)
                n_int = max((f["intervals"] for f in feats.values()), default=0.0)
                vs = _judge("target", w, feats, rel, cfg, n_int)
                ctx[(kind, w)] = any(f.get("normalised_by_limit") for f in feats.values())
            else:
                feats, rel, med = _fwd_window(store, since, now_ns, cfg)
                n_int = min(w, max((f["busy"] for f in feats.values()), default=0.0))
                vs = _judge("forwarder", w, feats, rel, cfg, n_int)
                ctx[(kind, w)] = med
            verdicts += vs
            if cache is not None:
                cache.entries[(kind, w)] = (now_ns, vs, ctx[(kind, w)])
        if judged and cache is not None and w != windows[0]:
            budget -= 1
    anomalies = []
    nodes = {(v.kind, v.node) for v in verdicts}
    for kind, node in sorted(nodes):
        vs = {v.window_s: v for v in verdicts if v.kind == kind and v.node == node}
        flagged = [w for w in windows if w in vs and vs[w].slow]
        if not flagged:
            continue
        first = vs[flagged[0]]
        active = flagged[0] == windows[0]
        # when its slowness began (also for a node flagged only in the longer windows: when a
        # fault is named late, its onset still places it); it may predate the longest window
        longest = max(w for w in windows if (kind, w) in ctx)
        since = now_ns - int(longest * 1e9)
        if kind == "target":
            onset = _onset_target(store, node, since, now_ns, cfg, ctx[("target", longest)])
        else:
            onset = _onset_forwarder(store, node, since, now_ns, ctx[("forwarder", longest)], cfg)
        anomalies.append(
            Anomaly(
                kind=KIND_NAME[kind],
                node=node,
                node_type=kind,
                persistence="persistent" if flagged == windows else "transient",
                active=active,
                severity=_severity(first, cfg),
                window_s=flagged[-1],
                windows_flagged=flagged,
                rel_service=round(first.rel_service or 0.0, 3),
                z=round(first.z or 0.0, 2),
                beacon_slow=first.beacon_slow,
                onset_ns=onset,
                detected_ns=now_ns,
                evidence={str(int(w) if float(w).is_integer() else w): _evidence(vs[w]) for w in windows if w in vs},
            )
        )
    return FailSlowReport(now_ns, windows, anomalies, verdicts)


def stall_added_ms(evidence: dict) -> float | None:
    """The added wait (ms over the peers' median) of a forwarding node named by its waits
    (:func:`_stalled`), from an anomaly's ``evidence`` (window s as text -> that window's
    evidence, as :class:`Anomaly` and the ``anomalies`` table hold it): the shortest window that
    flagged it that way; None when no window did (a node slow by its service time, or evidence
    of another kind)."""
    windows = []
    for w, e in evidence.items():
        try:
            windows.append((float(w), e))
        except ValueError:
            continue
    for _, e in sorted(windows, key=lambda we: we[0]):
        if isinstance(e, dict) and e.get("model_slow") and e.get("stall_added_ms") is not None:
            return float(e["stall_added_ms"])
    return None


def _severity(v: NodeVerdict, cfg: DiagnosisConfig) -> Literal["critical", "warning"]:
    """``critical`` when the node's service is ``failslow_critical_ratio`` x its peers' median, or,
    for a forwarding node named by its waits (:func:`_stalled`, its service as short as its peers'),
    when its requests wait ``failslow_critical_ratio`` x ``failslow_stall_added_ms`` longer than
    theirs (80 ms by default); else ``warning``."""
    if (v.rel_service or 0.0) >= cfg.failslow_critical_ratio:
        return "critical"
    stalled = v.model_slow and v.features.get("stall_added_ms") is not None
    if stalled and v.features["stall_added_ms"] >= cfg.failslow_critical_ratio * cfg.failslow_stall_added_ms:
        return "critical"
    return "warning"


def _evidence(v: NodeVerdict) -> dict:
    f = v.features
    keep = (
        "bytes",
        "ops",
        "bw_avg",
        "bw_max",
        "svc_ns_per_byte",
        "svc_ns_per_byte_median",
        "p99_ns",
        "p99_max_ns",
        "queue_depth",
        "queue_wait_ns",
        "max_perf_mb_s",
        "throttled_share",
        "busy",
        "stall_wait_ms",
        "stall_added_ms",
    )
    out = {k: round(float(f[k]), 3) for k in keep if k in f and f[k] is not None}
    out |= {
        "rel_service": None if v.rel_service is None else round(v.rel_service, 3),
        "z": None if v.z is None else round(v.z, 2),
        "model_slow": v.model_slow,
        "beacon_slow": v.beacon_slow,
        "judged": v.judged,
    }
    return out
