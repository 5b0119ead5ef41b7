"""Placement-pool hints (Sunway storage lessons §5): the pool the forwarding daemons place new
objects by, with each target's ``max_perf`` measured, fail-slow targets out.

* **max_perf** of a target (MB/s, 10^6 B/s, the daemons' unit) is measured, not configured:
  the ``placement_quantile`` (0.9) of its bandwidth over the *loaded* intervals of
  ``target_metrics`` in the last ``placement_window_s``: intervals in which it served requests
  with a queue or under its token bucket (``queue_depth > 0`` or ``throttled``), i.e. what it
  delivers when asked for more. A slowed target delivers less, so its max_perf falls with it.
  With fewer than ``placement_min_loaded_intervals`` loaded intervals the previous value stays
  (or, never measured, the median of the measured targets).
* **Membership**: every target except those with an active fail-slow detection
  (:mod:`pharos_analytics.failslow`, ``anomalies`` table) and those detected fail-slow less
  than ``placement_quiet_s`` ago: a recovered target comes back after the quiet period.
* **Never empty**: when every target is excluded, the one with the highest max_perf stays.
* **Hysteresis**: the document changes only when a target joins or leaves, or a max_perf
  moves by more than ``placement_min_change`` (share).

Output: the daemons' whole ``PUT /placement`` document (forwarder/fwd/src/admin.rs):
``{"pools": {"pharos": {"targets": [...], "max_perf": {"ost0": 48.9}, "component_size": 2097152}},
"default_pool": "pharos", "job_pools": {...}, "stripe_size": ...}``; other pools, job pools
and stripe settings of the current document are kept. Its schema, shared with the daemons
(which refuse unknown fields), is ``proto/placement/placement.schema.json``: :class:`PlacementDoc`
and :class:`PoolDoc` are its Python form (tests/control/test_placement_schema.py checks both).
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import asdict, dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from pharos_core.store import Store, ns_to_datetime64

from .config import ControlConfig

#: Per target over a window: loaded intervals and the quantile / max of their bandwidth (B/s).
TARGET_LOAD_SQL = """
SELECT target,
       countIf(o > 0) AS busy,
       countIf(o > 0 AND (qd > 0 OR thr > 0)) AS loaded,
       quantileExactIf({q:Float64})(b / secs, o > 0 AND (qd > 0 OR thr > 0)) AS bw_q,
       maxIf(b / secs, o > 0) AS bw_max
FROM
(
    SELECT target, time, greatest(max(interval_ms), 1) / 1000 AS secs,
           sum(bytes_read + bytes_written) AS b, sum(read_ops + write_ops + metadata_ops) AS o,
           sum(queue_depth) AS qd, max(throttled) AS thr
    FROM target_metrics FINAL
    WHERE time > {since:DateTime64(9)} AND time <= {until:DateTime64(9)}
    GROUP BY target, time
)
GROUP BY target
ORDER BY target
"""


class PoolDoc(BaseModel):
    """A pool of the placement document (``$defs/pool`` of the shared schema)."""

    model_config = ConfigDict(extra="forbid")

    targets: list[str] = Field(min_length=1)
    max_perf: dict[str, float] = Field(default_factory=dict)
    stripe_count: int | None = Field(default=None, ge=1, le=2**32 - 1)
    component_size: int | None = Field(default=None, ge=4096, multiple_of=4096)


class PlacementDoc(BaseModel):
    """The daemons' ``PUT /placement`` document (``proto/placement/placement.schema.json``)."""

    model_config = ConfigDict(extra="forbid")

    pools: dict[str, PoolDoc] = Field(default_factory=dict)
    default_pool: str | None = None
    job_pools: dict[str, str] = Field(default_factory=dict)
    stripe_size: int | None = Field(default=None, ge=1)
    stripe_count: int | None = Field(default=None, ge=1, le=2**32 - 1)


@dataclass
class TargetLoad:
    """A target's measured load in one window: intervals with requests (``busy``), loaded
    intervals, and the quantile / maximum of the bandwidth (bytes/s) of those."""

    target: str
    busy: int
    loaded: int
    bw_q_b_s: float
    bw_max_b_s: float


@dataclass
class PlacementPlan:
    """The placement document to push (``doc``), whether it differs from the current one, why."""

    doc: dict
    changed: bool
    targets: list[str]
    max_perf: dict[str, float]
    left: dict[str, str]  # target -> why it is out of the pool
    reason: str
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def measure_targets(store: Store, since_ns: int, until_ns: int, quantile: float) -> dict[str, TargetLoad]:
    """Per target, its load in ``(since, until]`` (ns since the epoch) from ``target_metrics``."""
    rows = store.query(
        TARGET_LOAD_SQL, {"since": ns_to_datetime64(since_ns), "until": ns_to_datetime64(until_ns), "q": quantile}
    )
    return {
        r["target"]: TargetLoad(
            r["target"], int(r["busy"]), int(r["loaded"]), float(r["bw_q"] or 0.0), float(r["bw_max"] or 0.0)
        )
        for r in rows
    }


def _pool(doc: dict, name: str) -> dict | None:
    return (doc.get("pools") or {}).get(name)


def _differs(cur: dict | None, targets: list[str], perf: dict[str, float], min_change: float) -> bool:
    if cur is None or sorted(cur.get("targets") or []) != sorted(targets):
        return True
    old = cur.get("max_perf") or {}
    for t in targets:
        a, b = old.get(t), perf.get(t)
        if (a is None) != (b is None):
            return True
        if a is not None and b is not None and abs(b - a) > min_change * max(abs(a), 1e-9):
            return True
    return False


def plan_placement(
    current: dict,
    all_targets: list[str],
    measured: dict[str, TargetLoad],
    failslow_active: set[str],
    last_failslow_ns: dict[str, int],
    now_ns: int,
    cfg: ControlConfig,
    pinned: dict | None = None,
) -> PlacementPlan:
    """The placement document for the current state (see the module doc). Pure.

    ``current``: the daemons' document now (``GET /placement``); ``all_targets``: every target
    name; ``measured``: :func:`measure_targets`; ``failslow_active``: targets with an active
    fail-slow anomaly; ``last_failslow_ns``: target -> newest time (ns) it was detected
    fail-slow; ``pinned``: an admin's pool pin ``{"targets": [...], "max_perf": {...}}``, used as is."""
    name = cfg.placement_pool
    cur_pool = _pool(current, name)
    old_perf = dict((cur_pool or {}).get("max_perf") or {})
    ev: dict = {"measured": {t: asdict(m) for t, m in measured.items()}, "window_s": cfg.placement_window_s}
    left: dict[str, str] = {}
    if pinned is not None:
        targets = sorted(pinned.get("targets") or [])
        perf = {k: float(v) for k, v in (pinned.get("max_perf") or {}).items()}
        reason = "pool pinned by an admin"
    else:
        perf, how = {}, {}
        for t in all_targets:
            m = measured.get(t)
            if m is not None and m.loaded >= cfg.placement_min_loaded_intervals and m.bw_q_b_s > 0:
                perf[t], how[t] = round(m.bw_q_b_s / 1e6, 3), "measured"
        med = statistics.median(perf.values()) if perf else None
        for t in all_targets:
            if t in perf:
                continue
            if t in old_perf:
                perf[t], how[t] = float(old_perf[t]), "previous"
            elif med is not None:
                perf[t], how[t] = med, "median of measured targets"
        ev["max_perf_source"] = how
        if not any(v == "measured" for v in how.values()) and cur_pool is None:
            return PlacementPlan(current, False, [], {}, {}, "no target measured under load yet", ev)
        quiet_ns = int(cfg.placement_quiet_s * 1e9)
        targets = []
        for t in all_targets:
            if t in failslow_active:
                left[t] = "fail-slow (active detection)"
            elif t in last_failslow_ns and now_ns - last_failslow_ns[t] < quiet_ns:
                left[t] = (
                    f"recovering: fail-slow {(now_ns - last_failslow_ns[t]) / 1e9:.0f} s ago "
                    f"(quiet period {cfg.placement_quiet_s:g} s)"
                )
            else:
                targets.append(t)
        reason = "measured max_perf; " + (
            "fail-slow out: " + ", ".join(f"{t} ({w})" for t, w in sorted(left.items())) if left else "all targets in"
        )
        if not targets:
            keep = max(all_targets, key=lambda t: (perf.get(t, 0.0), t))
            targets = [keep]
            left.pop(keep, None)
            reason += f"; every target excluded: kept {keep} (highest max_perf) so the pool is never empty"
        back = sorted(set(targets) - set((cur_pool or {}).get("targets") or []))
        if cur_pool is not None and back:
            reason += "; back in the pool: " + ", ".join(back)
    perf = {t: v for t, v in perf.items() if t in targets}
    changed = _differs(cur_pool, targets, perf, 0.0 if pinned is not None else cfg.placement_min_change)
    changed = changed or current.get("default_pool") != name
    doc = copy.deepcopy(current) if isinstance(current, dict) else {}
    pool = dict(cur_pool or {})
    pool["targets"] = targets
    pool["max_perf"] = perf
    if "component_size" not in pool or (cur_pool is None and cfg.placement_component_size):
        pool["component_size"] = cfg.placement_component_size or None
    if pool.get("stripe_count") and pool["stripe_count"] > len(targets):
        pool["stripe_count"] = len(targets)
    doc.setdefault("pools", {})
    doc["pools"] = dict(doc["pools"] or {}, **{name: pool})
    doc["default_pool"] = name
    if not changed:
        doc = current
    return PlacementPlan(doc, changed, targets, perf, left, reason, ev)
