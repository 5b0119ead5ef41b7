"""Live remapping on interference (Pharos; DFRA, FAST'19, keeps a job's allocation fixed once it
runs, Pharos goes further): pure decision logic.

Input: interference events of the detection loop (:mod:`pharos_analytics.interference`) that
name a slowed job (``victim``), a ``culprit`` and the forwarding node they share; the current
mapping (job -> forwarding nodes, primary first); the forwarding nodes' state
(:class:`~.dfra.NodeState`: load in bytes/s, fail-slow, reserved and held by); each job's
recent load per node (bytes/s); when each job last moved.

For each event, newest evidence first:

1. **Who moves**: the victim or the culprit, whichever costs least to move: fewer bytes on the
   shared node in the event (fewer requests in flight, less to replay), then fewer bytes/s now.
   A job that is pinned by an admin, not running or moved within ``remap_min_interval_s``
   (hysteresis) is not a candidate. An event is resolved (nothing moves) once either job has
   left the node: its windows predate that move, and moving the other job would put it back
   beside the first.
2. **Where**: the least loaded healthy node the job does not use already, shared or reserved
   and held by that job, and only if its load plus the mover's stays below
   ``(1 - remap_min_load_gain)`` x the shared node's load: a move must clearly relieve the
   node, so two nodes with near-equal loads never trade a job back and forth.
3. At most ``remap_max_moves_per_cycle`` moves; each move updates the loads the next one sees.

The move replaces the shared node in the job's list by the destination (primary stays primary
position); the mount switches new requests at once and replays failed ones (no request lost).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .config import ControlConfig
from .dfra import NodeState


@dataclass
class InterferenceHint:
    """An active interference event on a forwarding node (bytes over the event's windows)."""

    key: str
    victim: str
    culprit: str
    node: str
    victim_bytes: int
    culprit_bytes: int
    ratio: float  # victim's latency over its baseline


@dataclass
class Move:
    job_id: str
    from_node: str
    to_node: str
    nodes_before: list[str]
    nodes_after: list[str]
    reason: str
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def plan_moves(
    events: list[InterferenceHint],
    mapping: dict[str, list[str]],
    default_node: str | None,
    nodes: list[NodeState],
    job_load_b_s: dict[tuple[str, str], float],
    last_move_ns: dict[str, int],
    pinned: set[str],
    active: set[str],
    now_ns: int,
    cfg: ControlConfig,
) -> tuple[list[Move], list[dict]]:
    """The moves of one cycle and why the other candidates were not moved (see the module doc).

    ``mapping``: job -> nodes (primary first) of jobs with an entry; others use
    ``default_node``. ``job_load_b_s``: (job, node) -> bytes/s in the load window. Times ns."""
    load = {n.name: n.load_b_s for n in nodes}
    state = {n.name: n for n in nodes}
    moves: list[Move] = []
    skipped: list[dict] = []
    moved: set[str] = set()
    min_gap = int(cfg.remap_min_interval_s * 1e9)
    for ev in sorted(events, key=lambda e: (-e.ratio, e.key)):
        if len(moves) >= cfg.remap_max_moves_per_cycle:
            skipped.append({"event": ev.key, "why": f"max {cfg.remap_max_moves_per_cycle} move(s) per cycle"})
            continue
        # Resolved once either job has left the node: the windows that still show the event
        # predate that move, and moving the other job could put it back beside the first one.
        gone = [j for j in (ev.victim, ev.culprit) if ev.node not in (mapping.get(j) or [default_node])]
        if gone:
            skipped.append({"event": ev.key, "why": f"resolved: {', '.join(gone)} no longer on {ev.node}"})
            continue
        cands = []
        for job, nbytes in ((ev.victim, ev.victim_bytes), (ev.culprit, ev.culprit_bytes)):
            cur = mapping.get(job) or ([default_node] if default_node else [])
            why = None
            if job in pinned:
                why = "pinned by an admin"
            elif job not in active:
                why = "not running"
            elif job in moved:
                why = "already moved this cycle"
            elif job in last_move_ns and now_ns - last_move_ns[job] < min_gap:
                why = f"moved {(now_ns - last_move_ns[job]) / 1e9:.0f} s ago (< {cfg.remap_min_interval_s:g} s)"
            if why:
                skipped.append({"event": ev.key, "job": job, "why": why})
                continue
            cands.append((nbytes, job_load_b_s.get((job, ev.node), 0.0), job, cur))
        if not cands:
            continue
        cands.sort()
        for nbytes, jl, job, cur in cands:
            src = ev.node
            limit = (1 - cfg.remap_min_load_gain) * load.get(src, 0.0)
            dests = sorted(
                (load.get(n.name, 0.0), n.name)
                for n in nodes
                if n.usable
                and n.name not in cur
                and (not n.reserved or n.holder == job)
                and load.get(n.name, 0.0) + jl < limit
            )
            if not dests:
                skipped.append({"event": ev.key, "job": job, "why": f"no healthy node clearly less loaded than {src}"})
                continue
            dst = dests[0][1]
            after = [dst if n == src else n for n in cur]
            role = "victim" if job == ev.victim else "culprit"
            moves.append(
                Move(
                    job,
                    src,
                    dst,
                    list(cur),
                    after,
                    f"interference on {src}: job {ev.victim} slowed {ev.ratio:.1f}x by job {ev.culprit}; "
                    f"moving the {role} (cheaper: {nbytes} B on {src}) to the less loaded {dst}",
                    {
                        "event": ev.key,
                        "role": role,
                        "moved_bytes_on_node": nbytes,
                        "job_load_b_s": jl,
                        "load_b_s": {src: load.get(src, 0.0), dst: load.get(dst, 0.0)},
                        "candidates": [{"job": c[2], "bytes_on_node": c[0], "load_b_s": c[1]} for c in cands],
                        "fail_slow": sorted(n for n, s in state.items() if s.fail_slow),
                    },
                )
            )
            moved.add(job)
            load[src] = load.get(src, 0.0) - jl
            load[dst] = load.get(dst, 0.0) + jl
            break
    return moves, skipped
