"""DFRA at job start: default mapping, more forwarding nodes, or dedicated forwarding nodes.

Source: Ji et al., "Automatic, Application-Aware I/O Forwarding Resource Allocation" (DFRA,
FAST'19 §3-4): at a job's dispatch, the history of the job's earlier runs
(same name, user and command) decides its forwarding resources; the classifier of Beacon
(Yang et al., NSDI'19) says which jobs benefit from more forwarding nodes: I/O pattern N-N or
N-1, ≥ 20 GB moved, ≤ 1,000 metadata operations per data operation, ≥ 32 processes doing I/O.
Metadata-heavy jobs are isolated on a dedicated node, very high volume jobs get dedicated
(reserved) nodes; the number of nodes is the predicted bandwidth over one node's measured
capacity, never more than exist. Thresholds: :class:`~.config.ControlConfig`; the metadata-heavy
rate is :class:`~pharos_analytics.diagnosis_config.DiagnosisConfig` ``metadata_rate_ops_s``
(Beacon, 1,000 ops/s), shared with the diagnosis.

Pure logic (:func:`classify`, :func:`decide`) works on :class:`JobHistory` and
:class:`NodeState`; :func:`job_history` reads the history from the store, :func:`job_histories`
that of many jobs at once (a control cycle's new jobs).

Decision classes:

* ``default``: the mount's default node, unless it is fail-slow or reserved (then the least
  loaded healthy shared node). ``nodes`` has one name.
* ``more_nodes``: ``max(dfra_more_nodes_min, ceil(predicted / capacity))`` healthy shared
  (non-reserved) nodes, least loaded first, capped by how many exist.
* ``dedicated``: ``ceil(predicted / capacity)`` (1 for metadata-heavy jobs) healthy reserved
  nodes not held by another job; they are held by this job until it ends. When none is free
  the job falls back to ``more_nodes`` (reason says so).

A job without history gets ``default``, unless the learned job-class model
(:mod:`.class_model`, ``[control] dfra_model_*``) predicts another class confidently from the
jobs it resembles. Fail-slow nodes, and nodes whose daemon does not
answer, are never chosen.

Node-local mode (:func:`node_local_suggestion`, ``node_local`` of the decision): besides the
forwarding nodes, the decision says whether the job's history suggests the forwarding layer's
node-local mode (Sunway storage paper §6: each rank a private directory
``MOUNT/.nodelocal/<job>/<rank>`` on the storage target its rank id hashes to, no metadata
operation in the shared namespace; forwarder/README.md "Node-local mode"): an N-N job that is
metadata-heavy (Beacon's rule, :func:`metadata_heavy`) or whose metadata operations dominate its
data operations. A suggestion only: the job asks for it (``srun --pharos-node-local=MOUNT``,
``pharos run --node-local MOUNT``), since only the job knows which of its paths are private.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Literal

from pharos_core.store import Store

from ..diagnosis_config import DiagnosisConfig
from ..profiles import job_metrics
from .config import ControlConfig

DfraClass = Literal["default", "more_nodes", "dedicated"]

#: The earlier runs of many keys at once, each a (name, user[, command]) given by its position k
#: (1-based) in the parallel arrays ``names``, ``users`` and ``commands``: per key, its newest
#: ``limit`` runs that started and ended (start and end events with its name and user; read FINAL,
#: a job has one of each) and, when its command is not empty, whose start event has exactly that
#: command; rows (k, job_id), newest start first within a key (ties: job id, descending).
HISTORY_SQL = """
SELECT k, job_id FROM (
    SELECT q.k AS k, e.job_id AS job_id, toUnixTimestamp64Nano(minIf(e.time, e.kind = 'start')) AS start_ns
    FROM (SELECT job_id, kind, time, name, user, command FROM job_events FINAL
          WHERE name IN {names:Array(String)} AND user IN {users:Array(String)}) AS e
    INNER JOIN (SELECT k, name, user, command FROM system.one
                ARRAY JOIN arrayEnumerate({names:Array(String)}) AS k, {names:Array(String)} AS name,
                           {users:Array(String)} AS user, {commands:Array(Array(String))} AS command) AS q
        ON e.name = q.name AND e.user = q.user
    GROUP BY k, job_id
    HAVING countIf(e.kind = 'start') > 0 AND countIf(e.kind = 'end') > 0
       AND (empty(any(q.command)) OR anyIf(e.command, e.kind = 'start') = any(q.command))
)
ORDER BY k, start_ns DESC, job_id DESC
LIMIT {limit:UInt32} BY k
"""


@dataclass
class JobHistory:
    """What the job's earlier runs did (means over ``runs``; bytes, ops, ranks, bytes/s)."""

    runs: int
    jobs: list[str]  # newest first
    pattern: str  # most frequent Beacon pattern of the runs
    bytes: float
    data_requests: float
    metadata_ops: float
    metadata_ops_s: float
    io_ranks: float
    bandwidth_b_s: float
    forwarding_nodes: float  # forwarding nodes the runs used (mean)
    span_s: float = 0.0  # first to last request of a run (mean)

    @property
    def metadata_per_data_op(self) -> float:
        return self.metadata_ops / max(self.data_requests, 1.0)


@dataclass
class NodeState:
    """A forwarding node as the decision sees it. ``load_b_s``: forwarded bytes/s now;
    ``holder``: the job a reserved node is handed to ('' = free); ``down``: its daemon's admin
    interface does not answer."""

    name: str
    reserved: bool = False
    fail_slow: bool = False
    load_b_s: float = 0.0
    holder: str = ""
    down: bool = False

    @property
    def usable(self) -> bool:
        return not (self.fail_slow or self.down)


@dataclass
class DfraDecision:
    """The forwarding nodes of one job. ``nodes``: primary first (the mount's mapping entry);
    ``reserved``: those of ``nodes`` held by the job until it ends; ``node_local``: node-local
    mode suggested for the job (:func:`node_local_suggestion`, its reason and criteria in
    ``evidence["node_local"]``)."""

    job_id: str
    klass: DfraClass
    nodes: list[str]
    reserved: list[str]
    reason: str
    evidence: dict = field(default_factory=dict)
    node_local: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def history_from_metrics(metrics: list) -> JobHistory | None:
    """A :class:`JobHistory` from :class:`~pharos_analytics.profiles.JobMetrics` of earlier runs
    (newest first); None when there are none."""
    if not metrics:
        return None
    n = len(metrics)

    def mean(k: str) -> float:
        return sum(m.numbers[k] for m in metrics) / n

    pats = Counter(m.pattern for m in metrics)
    return JobHistory(
        runs=n,
        jobs=[m.job_id for m in metrics],
        pattern=pats.most_common(1)[0][0],
        bytes=mean("bytes"),
        data_requests=mean("data_requests"),
        metadata_ops=mean("metadata_ops"),
        metadata_ops_s=mean("metadata_ops_s"),
        io_ranks=mean("io_ranks"),
        bandwidth_b_s=mean("bandwidth_b_s"),
        forwarding_nodes=mean("forwarding_nodes"),
        span_s=mean("span_s"),
    )


def job_histories(
    store: Store, jobs: list[tuple[str, str, str, list[str] | None]], cfg: ControlConfig
) -> list[JobHistory | None]:
    """The history of each ``(job_id, name, user, command)`` of ``jobs``, in their order: the
    newest ``cfg.dfra_history_runs`` finished runs with this name and user (and exactly this
    command when it is given and not empty: that of the run's start event), ``job_id``
    itself excluded, the runs without I/O (no bytes, no metadata op) then left out. None for a
    job whose ``name`` is empty or none of whose runs did I/O.

    The same reads whatever the number of jobs: one :data:`HISTORY_SQL` for every distinct
    (name, user, command) (its newest ``dfra_history_runs + 1`` runs, so that a job among them
    can be left out of its own history) and one :func:`~pharos_analytics.profiles.job_metrics`
    of all the runs kept (issue 28: a control cycle's 2,000 new jobs at TaihuLight's scale read
    them job by job, 11.7 s). Raises StoreError."""
    keys = sorted({(name, user, tuple(command or ())) for _, name, user, command in jobs if name})
    if not keys:
        return [None] * len(jobs)
    rows = store.query(
        HISTORY_SQL,
        {
            "names": [k[0] for k in keys],
            "users": [k[1] for k in keys],
            "commands": [list(k[2]) for k in keys],
            "limit": cfg.dfra_history_runs + 1,
        },
    )
    runs: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for r in rows:  # newest first within a key
        runs.setdefault(keys[int(r["k"]) - 1], []).append(r["job_id"])
    picked = [
        [j for j in runs.get((name, user, tuple(command or ())), []) if j != job_id][: cfg.dfra_history_runs]
        if name
        else []
        for job_id, name, user, command in jobs
    ]
    ids = sorted({j for p in picked for j in p})
    if not ids:
        return [None] * len(jobs)
    did_io = {
        m.job_id: m for m in job_metrics(store, job_ids=ids) if m.numbers["bytes"] > 0 or m.numbers["metadata_ops"] > 0
    }
    return [history_from_metrics([did_io[j] for j in p if j in did_io]) for p in picked]


def job_history(
    store: Store, name: str, user: str, command: list[str] | None, cfg: ControlConfig, job_id: str = ""
) -> JobHistory | None:
    """The history of one job (:func:`job_histories` of ``(job_id, name, user, command)``): the
    newest ``cfg.dfra_history_runs`` finished runs with this name and user (and exactly this
    command when ``command`` is given), ``job_id`` itself excluded. None when ``name`` is empty
    or no earlier run did I/O. Raises StoreError."""
    return job_histories(store, [(job_id, name, user, command)], cfg)[0]


def _metadata_heavy_ops_s(diag: DiagnosisConfig | None) -> float:
    """Metadata ops/s from which a job is metadata-heavy (Beacon): ``[diagnosis] metadata_rate_ops_s``."""
    return (diag or DiagnosisConfig()).metadata_rate_ops_s


def metadata_heavy(h: JobHistory, diag: DiagnosisConfig | None = None) -> bool:
    """Whether the runs were metadata-heavy: at least ``metadata_rate_ops_s`` metadata ops/s (Beacon)
    over runs lasting at least ``metadata_sustained_s`` (the diagnosis' rule: a rate sustained that
    long). A run of a fraction of a second (a launcher's opens around a short job) has no rate."""
    d = diag or DiagnosisConfig()
    return h.metadata_ops_s >= d.metadata_rate_ops_s and h.span_s >= d.metadata_sustained_s


def classify(
    h: JobHistory | None, cfg: ControlConfig, diag: DiagnosisConfig | None = None
) -> tuple[DfraClass, str, dict]:
    """The DFRA class of a job from its history: (class, reason, the criteria and their values).
    ``diag``: the diagnosis thresholds (metadata-heavy rate); None reads ``DiagnosisConfig()``."""
    heavy_ops_s = _metadata_heavy_ops_s(diag)
    if h is None:
        return "default", "no earlier run with this name, user and command", {}
    crit = {
        "pattern": {"value": h.pattern, "need": list(cfg.dfra_patterns), "ok": h.pattern in cfg.dfra_patterns},
        "bytes": {"value": h.bytes, "need": f">= {cfg.dfra_min_bytes:g}", "ok": h.bytes >= cfg.dfra_min_bytes},
        "metadata_per_data_op": {
            "value": round(h.metadata_per_data_op, 3),
            "need": f"<= {cfg.dfra_max_metadata_per_data_op:g}",
            "ok": h.metadata_per_data_op <= cfg.dfra_max_metadata_per_data_op,
        },
        "io_ranks": {
            "value": h.io_ranks,
            "need": f">= {cfg.dfra_min_io_ranks}",
            "ok": h.io_ranks >= cfg.dfra_min_io_ranks,
        },
    }
    ev = {"runs": h.runs, "jobs": h.jobs, "criteria": crit, "metadata_ops_s": h.metadata_ops_s}
    if metadata_heavy(h, diag):
        return (
            "dedicated",
            f"metadata-heavy: {h.metadata_ops_s:.0f} metadata ops/s >= {heavy_ops_s:g} (Beacon) over "
            f"{h.span_s:.0f} s; "
            "isolated on a dedicated forwarding node (DFRA)",
            ev,
        )
    failed = [k for k, c in crit.items() if not c["ok"]]
    if failed:
        return (
            "default",
            "does not benefit from more forwarding nodes (Beacon rule): "
            + ", ".join(f"{k}={crit[k]['value']} (need {crit[k]['need']})" for k in failed),
            ev,
        )
    if h.bytes >= cfg.dfra_dedicated_min_bytes:
        return (
            "dedicated",
            f"benefits (Beacon rule) and very high volume: {h.bytes:.3g} B >= {cfg.dfra_dedicated_min_bytes:.3g} B",
            ev,
        )
    return "more_nodes", "benefits from more forwarding nodes (Beacon rule: pattern, volume, metadata, ranks)", ev


def node_local_suggestion(h: JobHistory | None, cfg: ControlConfig, diag: DiagnosisConfig | None = None) -> dict:
    """Whether the job's history suggests node-local mode (Sunway storage paper §6: a rank's files
    in its private directory on the target its rank id hashes to, no metadata operation in the
    shared namespace; the paper moves N-N jobs there, whose ranks share no file). Suggested when
    ``dfra_node_local_enabled``, the usual pattern is one of ``dfra_node_local_patterns`` (N-N)
    and the runs are metadata-heavy (Beacon's rule, :func:`metadata_heavy`: ``[diagnosis]
    metadata_rate_ops_s`` sustained) or their metadata operations dominate (at least
    ``dfra_node_local_min_metadata_per_data_op`` metadata ops per data op and
    ``dfra_node_local_min_metadata_ops`` metadata ops per run). A job without history is not
    suggested (nor one with a learned class only: the model predicts the class, not the pattern).

    Returns ``{"suggested": bool, "reason": str, "criteria": {name: {"value", "need", "ok"}}}``
    (criteria as :func:`classify`'s: ``pattern``; ``metadata_ops_s`` in ops/s, ok when
    metadata-heavy; ``metadata_per_data_op``; ``metadata_ops`` per run). Pure (given ``diag``)."""
    d = diag or DiagnosisConfig()
    if h is None:
        return {"suggested": False, "reason": "no earlier run with this name, user and command", "criteria": {}}
    heavy = metadata_heavy(h, d)
    ratio = h.metadata_per_data_op
    crit = {
        "pattern": {
            "value": h.pattern,
            "need": list(cfg.dfra_node_local_patterns),
            "ok": h.pattern in cfg.dfra_node_local_patterns,
        },
        "metadata_ops_s": {
            "value": round(h.metadata_ops_s, 1),
            "need": f">= {d.metadata_rate_ops_s:g} over >= {d.metadata_sustained_s} s (metadata-heavy)",
            "ok": heavy,
        },
        "metadata_per_data_op": {
            "value": round(ratio, 3),
            "need": f">= {cfg.dfra_node_local_min_metadata_per_data_op:g}",
            "ok": ratio >= cfg.dfra_node_local_min_metadata_per_data_op,
        },
        "metadata_ops": {
            "value": h.metadata_ops,
            "need": f">= {cfg.dfra_node_local_min_metadata_ops:g}",
            "ok": h.metadata_ops >= cfg.dfra_node_local_min_metadata_ops,
        },
    }
    dominated = crit["metadata_per_data_op"]["ok"] and crit["metadata_ops"]["ok"]
    if not cfg.dfra_node_local_enabled:
        why = "off ([control] dfra_node_local_enabled)"
    elif not crit["pattern"]["ok"]:
        why = f"pattern {h.pattern}, not {'/'.join(cfg.dfra_node_local_patterns)} (ranks each with files of their own)"
    elif heavy:
        why = f"{h.pattern}, {h.metadata_ops_s:.0f} metadata ops/s >= {d.metadata_rate_ops_s:g} (metadata-heavy)"
    elif dominated:
        why = (
            f"{h.pattern}, {ratio:.3g} metadata ops per data op >= "
            f"{cfg.dfra_node_local_min_metadata_per_data_op:g} ({h.metadata_ops:.0f} per run)"
        )
    else:
        why = (
            f"{h.pattern}, neither metadata-heavy ({h.metadata_ops_s:.0f} metadata ops/s) nor metadata-dominated "
            f"({ratio:.3g} metadata ops per data op, {h.metadata_ops:.0f} per run)"
        )
    ok = cfg.dfra_node_local_enabled and crit["pattern"]["ok"] and (heavy or dominated)
    return {"suggested": ok, "reason": why, "criteria": crit}


def wanted_nodes(
    h: JobHistory, klass: DfraClass, capacity_b_s: float, cfg: ControlConfig, diag: DiagnosisConfig | None = None
) -> tuple[int, dict]:
    """How many forwarding nodes the job should get: ceil(predicted bandwidth / one node's
    capacity), one more than it used when its runs saturated their nodes; at least
    ``dfra_more_nodes_min`` for ``more_nodes``, exactly 1 for metadata-heavy ``dedicated``
    (``diag`` as in :func:`classify`)."""
    cap = max(capacity_b_s, 1.0)
    used = max(1, math.ceil(h.forwarding_nodes - 1e-9)) if h.forwarding_nodes > 0 else 1
    n = max(1, math.ceil(h.bandwidth_b_s / cap - 1e-9))
    saturated = h.bandwidth_b_s >= cfg.dfra_saturation_ratio * cap * used
    if saturated:
        n = max(n, used + 1)
    if klass == "more_nodes":
        n = max(n, cfg.dfra_more_nodes_min)
    if klass == "dedicated" and metadata_heavy(h, diag):
        n = 1
    return n, {
        "predicted_bandwidth_b_s": h.bandwidth_b_s,
        "node_capacity_b_s": capacity_b_s,
        "nodes_used_before": used,
        "saturated": saturated,
        "wanted": n,
    }


def _by_load(nodes: list[NodeState]) -> list[NodeState]:
    return sorted(nodes, key=lambda n: (n.load_b_s, n.name))


def decide(
    job_id: str,
    history: JobHistory | None,
    nodes: list[NodeState],
    default_node: str | None,
    capacity_b_s: float,
    cfg: ControlConfig,
    diag: DiagnosisConfig | None = None,
    learned: LearnedClass | None = None,
) -> DfraDecision:
    """The DFRA decision of ``job_id`` (see the module doc). ``nodes``: every forwarding node that
    exists; ``default_node``: the mount's default (None: unknown); ``diag`` as in
    :func:`classify`; ``learned``: the class model's prediction
    (:mod:`.class_model`), used only when ``history`` is None: its class (``default`` when it is
    unsure) and its estimated profile for the sizing. ``node_local``: :func:`node_local_suggestion`
    of ``history`` (never of the learned profile), in ``evidence["node_local"]``. Never names a
    fail-slow node, a reserved node held by another job, or more nodes than exist. Pure (given
    ``diag``)."""
    diag = diag or DiagnosisConfig()
    klass, reason, ev = classify(history, cfg, diag)
    local = node_local_suggestion(history, cfg, diag)  # the exact history only, not the learned one
    nl = local["suggested"]
    if history is None and learned is not None:
        klass, history = learned.klass, learned.history
        reason += "; " + learned.reason
        ev = {"runs": 0, "jobs": learned.history.jobs, "learned": learned.evidence}
    healthy = [n for n in nodes if n.usable]
    shared = _by_load([n for n in healthy if not n.reserved])
    free_reserved = _by_load([n for n in healthy if n.reserved and n.holder in ("", job_id)])
    ev = dict(
        ev,
        fail_slow=sorted(n.name for n in nodes if n.fail_slow),
        down=sorted(n.name for n in nodes if n.down),
        node_local=local,
    )

    def default(why: str) -> DfraDecision:
        by = {n.name: n for n in shared}
        if default_node in by:
            pick = [default_node]
        elif shared:
            pick = [shared[0].name]
        elif free_reserved:  # only reserved nodes are healthy: borrow one rather than a fail-slow node
            return DfraDecision(job_id, "default", [free_reserved[0].name], [free_reserved[0].name], why, ev, nl)
        else:
            pick = []
        if default_node is not None and pick and pick[0] != default_node:
            state = (
                "fail-slow" if default_node in ev["fail_slow"] else "down" if default_node in ev["down"] else "reserved"
            )
            why += f"; default node {default_node} is {state}"
        if not pick:
            why += "; no healthy forwarding node: mount default kept"
        return DfraDecision(job_id, "default", pick, [], why, ev, nl)

    if klass == "default" or history is None:
        return default(reason)
    want, sizing = wanted_nodes(history, klass, capacity_b_s, cfg, diag)
    ev["sizing"] = sizing
    if klass == "dedicated":
        if free_reserved:
            got = [n.name for n in free_reserved[:want]]
            note = "" if len(got) == want else f" (wanted {want}, {len(got)} free)"
            return DfraDecision(job_id, "dedicated", got, got, f"{reason}; {len(got)} dedicated node(s){note}", ev, nl)
        reason += "; no free reserved forwarding node: more shared nodes instead"
        klass = "more_nodes"
        want = max(want, cfg.dfra_more_nodes_min)
    if len(shared) < 2:
        return default(reason + f"; only {len(shared)} healthy shared forwarding node(s)")
    got = [n.name for n in shared[:want]]
    if default_node in got:  # keep the default node as primary: no move for what the job already has
        got.remove(default_node)
        got.insert(0, default_node)
    note = "" if len(got) == want else f" (wanted {want}, {len(got)} exist)"
    return DfraDecision(job_id, "more_nodes", got, [], f"{reason}; {len(got)} shared node(s){note}", ev, nl)


@dataclass
class LearnedClass:
    """A prediction for one job. ``klass``: the class the decision uses (``default`` when not
    ``confident``); ``predicted``: the classifier's class; ``confidence``: its probability (0-1);
    ``history``: the estimated profile (runs 0; ``jobs``: the most similar training jobs;
    bandwidth in B/s) that sizes the allocation; ``reason`` and ``evidence`` for the action row."""

    klass: DfraClass
    predicted: DfraClass
    confidence: float
    confident: bool
    probabilities: dict[str, float]
    history: JobHistory
    reason: str
    evidence: dict = field(default_factory=dict)
