"""What the control loop reads from the store to decide: jobs, earlier decisions, anomalies,
loads and capacity of the forwarding nodes, reservations (the SQL and the reads)."""

from __future__ import annotations

import contextlib
import threading

from pharos_core.store import ns_to_datetime64

from ..failslow_sql import ROLLUP_FWD_WINDOW
from .dfra import JobHistory, NodeState, job_histories
from .push import View

MAPPING_KINDS = ("dfra_default", "dfra_more_nodes", "dfra_dedicated", "remap")

ACTIVE_JOBS_SQL = """
SELECT job_id, anyIf(name, kind = 'start') AS name, anyIf(user, kind = 'start') AS user,
       anyIf(command, kind = 'start') AS command, toUnixTimestamp64Nano(minIf(time, kind = 'start')) AS start_ns
FROM job_events FINAL
GROUP BY job_id
HAVING countIf(kind = 'start') > 0 AND countIf(kind = 'end') = 0 AND start_ns > {since:Int64}
"""
JOB_SQL = """
SELECT job_id, anyIf(name, kind = 'start') AS name, anyIf(user, kind = 'start') AS user,
       anyIf(command, kind = 'start') AS command, countIf(kind = 'start') AS started, countIf(kind = 'end') AS ended
FROM job_events FINAL WHERE job_id = {job_id:String} GROUP BY job_id
"""
#: The compute nodes each job's requests came from so far (its agents' hosts), sorted.
JOB_NODES_SQL = (
    "SELECT job_id, arraySort(groupUniqArray(host)) AS nodes FROM io_requests "
    "WHERE job_id IN {jobs:Array(String)} AND layer = 'client' AND host != '' GROUP BY job_id"
)
ENDED_SQL = "SELECT DISTINCT job_id FROM job_events FINAL WHERE kind = 'end' AND job_id IN {jobs:Array(String)}"
STARTED_SQL = "SELECT DISTINCT job_id FROM job_events FINAL WHERE kind = 'start' AND job_id IN {jobs:Array(String)}"
DECISIONS_SQL = """
SELECT job_id, argMax(kind, time) AS d_kind, argMax(to_state, time) AS d_to, argMax(evidence, time) AS d_evidence,
       argMax(reason, time) AS d_reason, toUnixTimestamp64Nano(max(time)) AS t_ns
FROM control_actions
WHERE job_id IN {jobs:Array(String)} AND kind IN {kinds:Array(String)}
GROUP BY job_id
"""
LAST_MOVES_SQL = """
SELECT job_id, toUnixTimestamp64Nano(max(time)) AS t_ns FROM control_actions
WHERE kind = 'remap' AND job_id IN {jobs:Array(String)} AND status IN ('applied', 'recorded') GROUP BY job_id
"""
PENDING_SQL = """
SELECT DISTINCT job_id FROM control_actions
WHERE kind LIKE 'dfra_%' AND time > {since:DateTime64(9)} AND job_id != ''
  AND job_id NOT IN (SELECT job_id FROM job_events)
"""
ANOMALIES_SQL = """
SELECT kind, node, node_type, job_id, culprit_job, active, ratio, evidence, toUnixTimestamp64Nano(detected) AS t_ns
FROM anomalies WHERE detected > {since:DateTime64(9)} AND detected <= {until:DateTime64(9)}
"""
LAST_FAILSLOW_SQL = """
SELECT node, toUnixTimestamp64Nano(max(detected)) AS t_ns FROM anomalies
WHERE kind = 'fail_slow_target' AND active = 1 AND detected > {since:DateTime64(9)} AND detected <= {until:DateTime64(9)}
GROUP BY node
"""
#: Bytes forwarded per (forwarding node, job) over a window, and the capacity of a node (the
#: largest per-node p99 of forwarded bytes per second), from the per-second rollup
#: (io_rollup_1s; the seconds of the window ``(since, until]``, see failslow_sql.ROLLUP_FWD_WINDOW):
#: the cost grows with seconds x nodes x jobs, not with records.
LOAD_SQL = f"""
SELECT forwarding_node AS node, job_id, sum(bytes) AS bytes FROM io_rollup_1s
WHERE {ROLLUP_FWD_WINDOW}
GROUP BY node, job_id
"""
CAPACITY_SQL = f"""
SELECT max(p) AS cap FROM (
    SELECT node, quantileExact(0.99)(b) AS p FROM (
        SELECT forwarding_node AS node, sec, sum(bytes) AS b FROM io_rollup_1s
        WHERE {ROLLUP_FWD_WINDOW}
        GROUP BY node, sec)
    GROUP BY node)
"""
TARGETS_SEEN_SQL = "SELECT DISTINCT target FROM target_metrics WHERE time > {since:DateTime64(9)} ORDER BY target"
ALLOCATIONS_SQL = "SELECT node, job_id FROM control_allocations FINAL"


class ControlState:
    """The store-reading half of :class:`~pharos_analytics.control.loop.ControlLoop`. Uses the
    loop's ``store``, ``cfg`` and ``detector``."""

    def _q(self, sql: str, **p) -> list[dict]:
        return self.store.query(sql, p)

    def _cycle_memo(self, key: tuple, fn):
        """``fn()``, once per control cycle for ``key`` while a cycle runs (:meth:`memo_cycle`):
        the capacity, loads and holders every DFRA decision of the cycle asks for (2,000 jobs at
        TaihuLight's scale asked them 2,000 times: ~60 s of a 75 s cycle, ``bench/simulate.py``);
        outside a cycle (or in another thread than the cycle's), ``fn()`` each time."""
        memo = self._memo_here()
        if memo is None:
            return fn()
        if key not in memo:
            memo[key] = fn()
        return memo[key]

    @contextlib.contextmanager
    def memo_cycle(self):
        """The scope of one cycle's memo (:meth:`_cycle_memo`), dropped at its end."""
        self._memo = (threading.get_ident(), {})
        try:
            yield
        finally:
            self._memo = None

    def _memo_here(self) -> dict | None:
        m = getattr(self, "_memo", None)
        return m[1] if m is not None and m[0] == threading.get_ident() else None

    def _histories(self, jobs: list[tuple[str, str, str, list[str] | None]]) -> list[JobHistory | None]:
        """:func:`~.dfra.job_histories` of ``jobs`` (``(job_id, name, user, command)`` each, in
        order), kept for the cycle while one runs (:meth:`memo_cycle`): the cycle reads the
        histories of all the jobs it decides at once (one history query and one metrics read,
        not two per job: 11.7 s of 2,000 jobs at TaihuLight's scale, ``bench/simulate.py``), and
        each decision then finds its own; those not kept yet are read together. Outside a
        cycle, read each call. Raises StoreError."""
        memo = self._memo_here()
        if memo is None:
            return job_histories(self.store, jobs, self.cfg)

        def key(j: tuple) -> tuple:
            return ("history", j[0], j[1], j[2], tuple(j[3] or ()), self.cfg.dfra_history_runs)

        missing = list({key(j): j for j in jobs if key(j) not in memo}.values())
        for j, h in zip(missing, job_histories(self.store, missing, self.cfg), strict=True):
            memo[key(j)] = h
        return [memo[key(j)] for j in jobs]

    def _allocations_changed(self) -> None:
        """An allocation row was written: the cycle's holders are read again."""
        memo = self._memo_here()
        if memo:
            memo.pop(("holders",), None)

    def _active_jobs(self, now_ns: int) -> dict[str, dict]:
        """Jobs started (and not ended) no longer than ``active_job_max_age_s`` ago, not after
        ``now_ns``: job -> its start row (name, user, command, start_ns)."""
        return {
            r["job_id"]: r
            for r in self._q(ACTIVE_JOBS_SQL, since=now_ns - int(self.cfg.active_job_max_age_s * 1e9))
            if int(r["start_ns"]) <= now_ns
        }

    def _pending_jobs(self, now_ns: int) -> set[str]:
        """Jobs hinted (a DFRA decision) within ``reservation_start_grace_s`` without an event yet."""
        since = ns_to_datetime64(now_ns - int(self.cfg.reservation_start_grace_s * 1e9))
        return {r["job_id"] for r in self._q(PENDING_SQL, since=since)}

    def _job_identity(self, job_id: str) -> dict | None:
        """The job's name, user, command and start/end event counts; None without an event."""
        ev = self._q(JOB_SQL, job_id=job_id)
        return ev[0] if ev else None

    def _job_nodes(self, jobs: list[str]) -> dict[str, list[str]]:
        """job -> the compute nodes its requests came from so far (none yet: absent)."""
        return {r["job_id"]: list(r["nodes"]) for r in self._q(JOB_NODES_SQL, jobs=jobs)} if jobs else {}

    def _ended(self, jobs: list[str]) -> set[str]:
        """Those of ``jobs`` with an end event."""
        return {r["job_id"] for r in self._q(ENDED_SQL, jobs=jobs)}

    def _started(self, jobs: list[str]) -> set[str]:
        """Those of ``jobs`` with a start event."""
        return {r["job_id"] for r in self._q(STARTED_SQL, jobs=jobs)}

    def _last_moves(self, jobs: list[str]) -> dict[str, int]:
        """Job -> time (ns) of its newest remap, applied or recorded."""
        return {r["job_id"]: int(r["t_ns"]) for r in self._q(LAST_MOVES_SQL, jobs=jobs)}

    def _last_failslow(self, since_ns: int, until_ns: int) -> dict[str, int]:
        """Target -> time (ns) of its newest active fail-slow anomaly in ``(since_ns, until_ns]``."""
        rows = self._q(LAST_FAILSLOW_SQL, since=ns_to_datetime64(since_ns), until=ns_to_datetime64(until_ns))
        return {r["node"]: int(r["t_ns"]) for r in rows}

    def _targets_seen(self, since_ns: int) -> list[str]:
        """Storage targets with metrics since ``since_ns``, by name."""
        return [r["target"] for r in self._q(TARGETS_SEEN_SQL, since=ns_to_datetime64(since_ns))]

    def _holders(self) -> dict[str, str]:
        """Reserved node -> the job holding it ('' = free), every node with an allocation row."""
        return self._cycle_memo(("holders",), lambda: {r["node"]: r["job_id"] for r in self._q(ALLOCATIONS_SQL)})

    def _anomalies(self, now_ns: int) -> list[dict]:
        cfg = self.cfg
        rows = self._q(
            ANOMALIES_SQL,
            since=ns_to_datetime64(now_ns - int(cfg.anomaly_max_age_s * 1e9)),
            until=ns_to_datetime64(now_ns),
        )
        if not rows:
            return []
        newest = max(int(r["t_ns"]) for r in rows)
        det = self.detector
        if det is not None and det.cycles and int(det.last.get("time_ns", 0)) > newest:
            return []  # the detector's newest cycle found nothing
        return [r for r in rows if int(r["t_ns"]) == newest and int(r["active"])]

    def _loads(self, now_ns: int) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
        """Forwarded bytes/s over the last ``load_window_s``: per node, per (job, node)."""
        return self._cycle_memo(("loads", now_ns, self.cfg.load_window_s), lambda: self._read_loads(now_ns))

    def _read_loads(self, now_ns: int) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
        w = self.cfg.load_window_s
        rows = self._q(LOAD_SQL, since=ns_to_datetime64(now_ns - int(w * 1e9)), until=ns_to_datetime64(now_ns))
        node: dict[str, float] = {}
        job: dict[tuple[str, str], float] = {}
        for r in rows:
            b = float(r["bytes"]) / w
            node[r["node"]] = node.get(r["node"], 0.0) + b
            job[(r["job_id"], r["node"])] = b
        return node, job

    def node_capacity(self, now_ns: int) -> tuple[float, str]:
        """One forwarding node's capacity (bytes/s) and where it comes from (see ControlConfig)."""
        cfg = self.cfg
        if cfg.node_capacity_b_s > 0:
            return cfg.node_capacity_b_s, "config"
        key = ("capacity", now_ns, cfg.capacity_lookback_s, cfg.node_capacity_fallback_b_s)
        return self._cycle_memo(key, lambda: self._measured_capacity(now_ns))

    def _measured_capacity(self, now_ns: int) -> tuple[float, str]:
        cfg = self.cfg
        r = self._q(
            CAPACITY_SQL,
            since=ns_to_datetime64(now_ns - int(cfg.capacity_lookback_s * 1e9)),
            until=ns_to_datetime64(now_ns),
        )
        cap = float(r[0]["cap"] or 0) if r else 0.0
        if cap > 0:
            return cap, f"measured (max per-node p99 of forwarded bytes per second, last {cfg.capacity_lookback_s:g} s)"
        return cfg.node_capacity_fallback_b_s, "fallback (no forwarder traffic measured)"

    def _node_states(self, view: View, now_ns: int, anomalies: list[dict] | None = None) -> list[NodeState]:
        names = view.node_names
        anomalies = self._anomalies(now_ns) if anomalies is None else anomalies
        slow = {a["node"] for a in anomalies if a["kind"] == "fail_slow_forwarder"}
        loads, _ = self._loads(now_ns)
        holders = self._holders()
        res = set(self.cfg.reserved_nodes)
        return [NodeState(n, n in res, n in slow, loads.get(n, 0.0), holders.get(n, ""), n in view.down) for n in names]

    def _stored_decisions(self, jobs: list[str], kinds=MAPPING_KINDS) -> dict[str, dict]:
        if not jobs:
            return {}
        return {
            r["job_id"]: {
                "kind": r["d_kind"],
                "to_state": r["d_to"],
                "evidence": r["d_evidence"],
                "reason": r["d_reason"],
                "t_ns": int(r["t_ns"]),
            }
            for r in self._q(DECISIONS_SQL, jobs=jobs, kinds=list(kinds))
        }
