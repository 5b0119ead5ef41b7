"""The control loop: reads the store, decides (DFRA, remapping, placement), pushes the decisions
to the forwarding layer's admin interfaces, and records every action.

One :meth:`ControlLoop.cycle` (every ``[control] period_s`` in ``pharos serve``, beside the
detection loop of :mod:`pharos_analytics.alerts`):

1. **Jobs**: active jobs (``job_events`` start without end), and jobs hinted but not started
   yet. Reserved forwarding nodes held by ended jobs (or by hinted jobs that never started
   within ``reservation_start_grace_s``) are returned (``release`` rows).
2. **DFRA** (:mod:`.dfra`) for every active job without a decision yet: the history of its
   earlier runs decides its forwarding nodes (``dfra_*`` rows). :meth:`ControlLoop.hint`
   takes the same decision on demand, before the job's first I/O.
3. **Remapping** (:mod:`.remap`) on the detection loop's active interference events on a
   forwarding node (``remap`` rows).
4. **Mapping push**: the mount's whole job table (``GET``/``PUT /mapping`` of pharos-mount,
   ``{"jobs": {"42": ["fwd2", "fwd3"]}}``, primary first) gets each managed job's entry; pinned
   jobs get their pin. Entries of other jobs are kept; entries of ended jobs are dropped.
5. **Placement** (:mod:`.placement`): the pool document to every daemon's ``PUT /placement``.

Safety: ``dry_run`` records (status ``recorded``) and pushes nothing. A push that fails
(unreachable, timeout, HTTP error) changes nothing on that side: the mount and the daemons
swap their tables atomically only on success, so the previous mapping or placement keeps
serving; the row says ``failed`` with the error, and the loop re-pushes the same decision
later (``sync`` rows, back-off doubling up to ``retry_max_backoff_s``). Pins (``control_pins``)
always win. Nodes are those the mount reports (``GET /mapping`` ``nodes``): a decision never
names a node that does not exist, and pools are never empty.

Admin URLs come from :class:`Endpoints` (``[control] mount_admin_urls`` / ``fwd_admin_urls``,
else the processes ``pharos up`` starts: their ready files, else the Settings ports). Every call
carries the admin token (``[control] admin_token_file``, else ``fwd_admin_token_file``): the
admin interfaces answer 401 without it (a failed push, recorded and retried).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from pharos_pipeline.settings import Settings, admin_headers
from pharos_pipeline.store import Store, ns_to_datetime64

from ..diagnosis_config import DiagnosisConfig
from ..failslow import ROLLUP_FWD_WINDOW
from ..periodic import PeriodicLoop
from .config import ControlConfig
from .dfra import DfraDecision, NodeState, decide, job_history
from .placement import measure_targets, plan_placement
from .remap import InterferenceHint, plan_moves

log = logging.getLogger("pharos.control")

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
#: (io_rollup_1s; the seconds of the window ``(since, until]``, see failslow.ROLLUP_FWD_WINDOW):
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
ALLOCATIONS_SQL = "SELECT node, job_id, toUnixTimestamp64Nano(since) AS since_ns FROM control_allocations FINAL"
PINS_SQL = (
    "SELECT scope, name, value, reason, toUnixTimestamp64Nano(updated) AS updated_ns "
    "FROM control_pins FINAL WHERE deleted = 0 ORDER BY scope, name"
)
ACTIONS_SQL = """
SELECT toUnixTimestamp64Nano(time) AS time_ns, action_id, job_id, kind, resource, from_state, to_state, reason,
       evidence, dry_run, status, error, endpoints
FROM control_actions
WHERE time >= {since:DateTime64(9)} __WHERE__
ORDER BY time DESC
LIMIT {limit:UInt32}
"""


class ControlError(RuntimeError):
    """A request the control loop cannot serve (unknown job, invalid pin); one line for the user."""


@dataclass
class Endpoints:
    """Admin base URLs: the FUSE clients (``mounts``) and the forwarding daemons (node -> URL)."""

    mounts: list[str]
    daemons: dict[str, str]

    @classmethod
    def from_settings(cls, settings: Settings, cfg: ControlConfig) -> Endpoints:
        """``cfg``'s URLs, else those of the processes ``pharos up`` starts: the ``admin`` address in
        their ready files (``<state>/run/fwd<i>.ready``, ``mount.ready``), else the Settings ports."""

        def ready_admin(name: str) -> str | None:
            f = settings.state_dir / "run" / f"{name}.ready"
            try:
                return "http://" + json.loads(f.read_text())["admin"]
            except (OSError, ValueError, KeyError, TypeError):
                return None

        daemons = dict(cfg.fwd_admin_urls)
        if not daemons:
            for i in range(settings.fwd_nodes):
                port = settings.fwd_port_base + 10 * i + 1
                daemons[f"fwd{i}"] = ready_admin(f"fwd{i}") or f"http://127.0.0.1:{port}"
        mounts = list(cfg.mount_admin_urls)
        if not mounts and settings.fwd_nodes:
            mounts = [ready_admin("mount") or f"http://127.0.0.1:{settings.mount_admin_port}"]
        return cls([u.rstrip("/") for u in mounts], {k: v.rstrip("/") for k, v in daemons.items()})


@dataclass
class PushResult:
    url: str
    ok: bool
    error: str = ""
    changed: bool = True


@dataclass
class _Backoff:
    failures: int = 0
    next_ns: int = 0


@dataclass
class _View:
    """What one cycle knows about the forwarding layer."""

    node_names: list[str]
    default_node: str | None
    mount_maps: dict[str, dict[str, list[str]] | None]  # url -> jobs table (None: unreachable)
    mount_errors: dict[str, str] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)  # nodes whose daemon's admin interface does not answer


def _nodes_text(nodes: list[str] | None) -> str:
    return ",".join(nodes or [])


def _canon(x):
    """A JSON value without null members (the daemons print absent options as null)."""
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_canon(v) for v in x]
    return x


class ControlLoop(PeriodicLoop):
    """The control loop on one store (see the module doc); a daemon thread once started
    (:class:`~pharos_analytics.periodic.PeriodicLoop`, every ``[control] period_s``).

    ``cfg_factory`` is called every cycle (``ControlConfig`` re-reads file and environment), and
    so is ``diag_factory`` (``DiagnosisConfig``: the thresholds shared with the diagnosis, e.g.
    the metadata-heavy rate);
    ``detector``: the in-process :class:`~pharos_analytics.alerts.DetectionLoop`, whose newest
    cycle tells which anomalies are current (else the newest ``anomalies`` rows no older than
    ``anomaly_max_age_s``); ``client``: the HTTP client for the admin interfaces."""

    thread_name = "control"
    cycle_name = "control"

    def __init__(
        self,
        store: Store,
        settings: Settings,
        cfg_factory: Callable[[], ControlConfig] = ControlConfig,
        detector=None,
        client: httpx.Client | None = None,
        endpoints: Endpoints | None = None,
        diag_factory: Callable[[], DiagnosisConfig] = DiagnosisConfig,
    ) -> None:
        self.store = store
        self.settings = settings
        self.cfg_factory = cfg_factory
        self.diag_factory = diag_factory
        self.cfg = cfg_factory()
        self.diag = diag_factory()
        super().__init__(self.cfg.period_s, log)
        self.detector = detector
        self.client = client or httpx.Client(timeout=self.cfg.http_timeout_s)
        self._endpoints = endpoints
        self._lock = threading.RLock()
        self._backoff: dict[str, _Backoff] = {}
        self._dry_seen: dict[tuple[str, str], str] = {}

    # -- plumbing ---------------------------------------------------------------------------
    def _reload(self) -> None:
        """Re-read both configs (file and environment may have changed)."""
        self.cfg = self.cfg_factory()
        self.diag = self.diag_factory()

    def run_once(self) -> dict:
        """One cycle at the current time (:meth:`cycle`); what the loop's thread runs."""
        return self.cycle()

    @property
    def endpoints(self) -> Endpoints:
        return self._endpoints or Endpoints.from_settings(self.settings, self.cfg)

    def _admin_headers(self) -> dict[str, str]:
        """The admin token of the mounts' and daemons' admin interfaces (``[control]
        admin_token_file``, else the settings' ``fwd_admin_token_file``), read per call: a token
        rotated on disk is used at once."""
        if self.cfg.admin_token_file is not None:
            return admin_headers(self.cfg.admin_token_file)
        return self.settings.fwd_admin_headers()

    def _http(self, method: str, url: str, body=None) -> tuple[dict | list | None, str]:
        """(JSON reply, '') or (None, one-line error)."""
        try:
            r = self.client.request(
                method, url, json=body, timeout=self.cfg.http_timeout_s, headers=self._admin_headers()
            )
        except httpx.HTTPError as exc:
            return None, f"{method} {url}: {type(exc).__name__}: {str(exc)[:200]}"
        if r.status_code >= 400:
            return None, f"{method} {url}: HTTP {r.status_code} {r.text[:200]}"
        try:
            return r.json(), ""
        except ValueError:
            return None, f"{method} {url}: reply is not JSON"

    def _record(
        self,
        now_ns: int,
        kind: str,
        job_id: str,
        resource: str,
        before: str,
        after: str,
        reason: str,
        evidence: dict,
        status: str,
        error: str = "",
        endpoints: list[str] | None = None,
    ) -> dict:
        row = {
            "time": ns_to_datetime64(now_ns),
            "action_id": uuid.uuid4().hex,
            "job_id": job_id,
            "kind": kind,
            "resource": resource,
            "from_state": before,
            "to_state": after,
            "reason": reason,
            "evidence": json.dumps(evidence, default=str, separators=(",", ":")),
            "dry_run": int(self.cfg.dry_run),
            "status": status,
            "error": error,
            "endpoints": endpoints or [],
        }
        self.store.insert_rows("control_actions", [row])
        if status == "failed":
            log.warning("control %s %s %s failed: %s", kind, job_id or resource, after, error)
        else:
            log.info("control %s %s %s -> %s (%s): %s", kind, job_id or resource, before, after, status, reason)
        return row

    def _q(self, sql: str, **p) -> list[dict]:
        return self.store.query(sql, p)

    # -- reading the state --------------------------------------------------------------------
    def _view(self) -> _View:
        eps = self.endpoints
        maps: dict[str, dict | None] = {}
        names: list[str] = []
        default = None
        errors = {}
        for url in eps.mounts:
            got, err = self._http("GET", url + "/mapping")
            if got is None or not isinstance(got, dict):
                maps[url], errors[url] = None, err or "bad reply"
                continue
            maps[url] = {k: list(v) for k, v in (got.get("jobs") or {}).items()}
            if not names:
                names = [n["name"] for n in got.get("nodes") or []]
                default = got.get("default")
        if not names:
            names = sorted(eps.daemons)
        down = {n for n, url in eps.daemons.items() if self._http("GET", url + "/status")[0] is None}
        return _View(names, default, maps, errors, down)

    def pins(self) -> dict[str, dict[str, dict]]:
        """Active pins: {"job": {job_id: {...}}, "pool": {pool: {...}}}; value parsed from JSON."""
        out: dict[str, dict[str, dict]] = {"job": {}, "pool": {}}
        for r in self._q(PINS_SQL):
            out.setdefault(r["scope"], {})[r["name"]] = {
                "value": json.loads(r["value"]),
                "reason": r["reason"],
                "updated_ns": int(r["updated_ns"]),
            }
        return out

    def _holders(self) -> dict[str, str]:
        return {r["node"]: r["job_id"] for r in self._q(ALLOCATIONS_SQL)}

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
        r = self._q(
            CAPACITY_SQL,
            since=ns_to_datetime64(now_ns - int(cfg.capacity_lookback_s * 1e9)),
            until=ns_to_datetime64(now_ns),
        )
        cap = float(r[0]["cap"] or 0) if r else 0.0
        if cap > 0:
            return cap, f"measured (max per-node p99 of forwarded bytes per second, last {cfg.capacity_lookback_s:g} s)"
        return cfg.node_capacity_fallback_b_s, "fallback (no forwarder traffic measured)"

    def _node_states(self, view: _View, now_ns: int, anomalies: list[dict] | None = None) -> list[NodeState]:
        names = view.node_names
        anomalies = self._anomalies(now_ns) if anomalies is None else anomalies
        slow = {a["node"] for a in anomalies if a["kind"] == "fail_slow_forwarder"}
        loads, _ = self._loads(now_ns)
        holders = self._holders()
        res = set(self.cfg.reserved_nodes)
        return [NodeState(n, n in res, n in slow, loads.get(n, 0.0), holders.get(n, ""), n in view.down) for n in names]

    # -- DFRA -------------------------------------------------------------------------------------
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

    def _decide_job(
        self,
        job_id: str,
        name: str,
        user: str,
        command: list[str] | None,
        view: _View,
        now_ns: int,
        record: bool,
        anomalies: list[dict] | None = None,
    ) -> DfraDecision:
        cfg = self.cfg
        hist = job_history(self.store, name, user, command, cfg, job_id=job_id)
        nodes = self._node_states(view, now_ns, anomalies)
        cap, cap_src = self.node_capacity(now_ns)
        d = decide(job_id, hist, nodes, view.default_node, cap, cfg, self.diag)
        # A job the mount already maps (set there by an admin, the scheduler or a test, not by this
        # loop: the job has no decision yet) keeps that entry when DFRA has nothing better than the
        # default: "default" means no allocation of ours, not "undo someone else's".
        known = set(view.node_names)
        entry = next((m[job_id] for m in view.mount_maps.values() if m and m.get(job_id)), None)
        if d.klass == "default" and job_id and entry and all(n in known for n in entry) and entry != d.nodes:
            d.evidence["default_nodes"] = d.nodes
            d.nodes, d.reserved = list(entry), [n for n in entry if n in d.reserved]
            d.reason += f"; the mount already maps the job to {_nodes_text(entry)}: kept"
        d.evidence |= {
            "name": name,
            "user": user,
            "command": command or [],
            "node_capacity_source": cap_src,
            "nodes": [n.__dict__ for n in nodes],
            "decision": {"class": d.klass, "nodes": d.nodes, "reserved": d.reserved},
        }
        if record and job_id and d.reserved:
            self.store.insert_rows(
                "control_allocations",
                [
                    {
                        "node": n,
                        "job_id": job_id,
                        "since": ns_to_datetime64(now_ns),
                        "reason": f"DFRA {d.klass}",
                        "updated": ns_to_datetime64(now_ns),
                    }
                    for n in d.reserved
                ],
            )
        return d

    def _release(self, now_ns: int) -> list[dict]:
        """Return reserved nodes held by ended jobs, or by hinted jobs that never started."""
        holders = {n: j for n, j in self._holders().items() if j}
        if not holders:
            return []
        jobs = sorted(set(holders.values()))
        ended = {r["job_id"] for r in self._q(ENDED_SQL, jobs=jobs)}
        started = {r["job_id"] for r in self._q(STARTED_SQL, jobs=jobs)}
        since = {r["node"]: int(r["since_ns"]) for r in self._q(ALLOCATIONS_SQL)}
        grace = int(self.cfg.reservation_start_grace_s * 1e9)
        rows = []
        for node, job in sorted(holders.items()):
            why = None
            if job in ended:
                why = f"job {job} ended"
            elif job not in started and now_ns - since.get(node, now_ns) > grace:
                why = f"job {job} did not start within {self.cfg.reservation_start_grace_s:g} s of its hint"
            if why is None:
                continue
            self.store.insert_rows(
                "control_allocations",
                [
                    {
                        "node": node,
                        "job_id": "",
                        "since": ns_to_datetime64(now_ns),
                        "reason": why,
                        "updated": ns_to_datetime64(now_ns),
                    }
                ],
            )
            rows.append(self._record(now_ns, "release", job, f"node:{node}", node, "", why, {"node": node}, "recorded"))
        return rows

    # -- pushing ----------------------------------------------------------------------------------
    def _backoff_ok(self, key: str, now_ns: int) -> bool:
        b = self._backoff.get(key)
        return b is None or now_ns >= b.next_ns

    def _note_push(self, key: str, ok: bool, now_ns: int) -> None:
        if ok:
            self._backoff.pop(key, None)
            return
        b = self._backoff.setdefault(key, _Backoff())
        b.failures += 1
        delay_s = min(self.cfg.retry_max_backoff_s, max(self.period_s, 1.0) * 2 ** (b.failures - 1))
        b.next_ns = now_ns + int(delay_s * 1e9)

    def _desired_entries(self, jobs: list[str], pins: dict, view: _View) -> dict[str, list[str] | None]:
        """job -> nodes of its mapping entry, or None (no entry: the mount's default)."""
        known = set(view.node_names)
        out: dict[str, list[str] | None] = {}
        for job, r in self._stored_decisions(jobs).items():
            nodes = [n for n in r["to_state"].split(",") if n in known]
            out[job] = None if not nodes or nodes == [view.default_node] else nodes
        for job, p in pins["job"].items():
            nodes = [n for n in p["value"] if n in known]
            if nodes:
                out[job] = nodes
        return out

    def _push_mapping(
        self, view: _View, desired: dict[str, list[str] | None], drop: set[str], now_ns: int, force: bool
    ) -> list[PushResult]:
        """Make each mount's job table hold ``desired`` (and not ``drop``); PUT only on a change."""
        out = []
        for url, cur in view.mount_maps.items():
            if cur is None:  # a new decision fails there; otherwise it is re-pushed once the mount answers
                out.append(PushResult(url, False, view.mount_errors.get(url, "unreachable"), changed=force))
                continue
            new = {k: v for k, v in cur.items() if k not in drop}
            for job, nodes in desired.items():
                if nodes is None:
                    new.pop(job, None)
                else:
                    new[job] = nodes
            if new == cur:
                out.append(PushResult(url, True, changed=False))
                continue
            if not force and not self._backoff_ok("mount:" + url, now_ns):
                out.append(PushResult(url, False, "in back-off after a failed push"))
                continue
            _, err = self._http("PUT", url + "/mapping", {"jobs": new})
            self._note_push("mount:" + url, not err, now_ns)
            out.append(PushResult(url, not err, err))
        return out

    # -- one cycle --------------------------------------------------------------------------------
    def cycle(self, now_ns: int | None = None) -> dict:
        """One control cycle (see the module doc); returns a summary. Raises StoreError."""
        with self._lock:
            self._reload()
            return self._cycle(time.time_ns() if now_ns is None else now_ns)

    def _cycle(self, now_ns: int) -> dict:
        cfg = self.cfg
        t0 = time.monotonic()
        rows: list[dict] = []
        view = self._view()
        pins = self.pins()
        anomalies = self._anomalies(now_ns)
        rows += self._release(now_ns)
        active = {
            r["job_id"]: r
            for r in self._q(ACTIVE_JOBS_SQL, since=now_ns - int(cfg.active_job_max_age_s * 1e9))
            if int(r["start_ns"]) <= now_ns
        }
        pending = {
            r["job_id"]
            for r in self._q(PENDING_SQL, since=ns_to_datetime64(now_ns - int(cfg.reservation_start_grace_s * 1e9)))
        }
        managed = sorted(set(active) | pending)
        decided = self._stored_decisions(managed)
        new_rows: list[tuple[dict, str]] = []  # (row args, mapping entry key)
        # DFRA for active jobs without a decision
        for job in sorted(set(active) - set(decided) - set(pins["job"])):
            r = active[job]
            d = self._decide_job(job, r["name"], r["user"], list(r["command"] or []), view, now_ns, True, anomalies)
            new_rows.append(
                (
                    dict(
                        kind=f"dfra_{d.klass}",
                        job_id=job,
                        resource="mapping",
                        before=_nodes_text([view.default_node] if view.default_node else []),
                        after=_nodes_text(d.nodes),
                        reason=d.reason,
                        evidence=d.evidence,
                    ),
                    job,
                )
            )
        # live remapping
        moves, skipped = [], []
        if cfg.remap_enabled and cfg.remap_max_moves_per_cycle > 0:
            events = [
                InterferenceHint(
                    key=f"interference:{a['job_id']}:{a['culprit_job']}:{a['node_type']}:{a['node']}",
                    victim=a["job_id"],
                    culprit=a["culprit_job"],
                    node=a["node"],
                    victim_bytes=int(json.loads(a["evidence"] or "{}").get("job_bytes_on_resource", 0)),
                    culprit_bytes=int(json.loads(a["evidence"] or "{}").get("culprit_bytes", 0)),
                    ratio=float(a["ratio"]),
                )
                for a in anomalies
                if a["kind"] == "interference" and a["node_type"] == "forwarding_node"
            ]
            if events:
                cur_map = self._desired_entries(managed, pins, view)
                mount_map = next((m for m in view.mount_maps.values() if m is not None), {})
                mapping = {j: v for j, v in mount_map.items()}
                mapping.update({j: v for j, v in cur_map.items() if v is not None})
                for nr in new_rows:
                    a = nr[0]["after"].split(",") if nr[0]["after"] else []
                    if a:
                        mapping[nr[1]] = a
                jobs_ev = sorted({e.victim for e in events} | {e.culprit for e in events})
                last = {r["job_id"]: int(r["t_ns"]) for r in self._q(LAST_MOVES_SQL, jobs=jobs_ev)}
                _, job_load = self._loads(now_ns)
                moves, skipped = plan_moves(
                    events,
                    mapping,
                    view.default_node,
                    self._node_states(view, now_ns, anomalies),
                    job_load,
                    last,
                    set(pins["job"]),
                    set(active),
                    now_ns,
                    cfg,
                )
                for m in moves:
                    new_rows.append(
                        (
                            dict(
                                kind="remap",
                                job_id=m.job_id,
                                resource="mapping",
                                before=_nodes_text(m.nodes_before),
                                after=_nodes_text(m.nodes_after),
                                reason=m.reason,
                                evidence=m.evidence | {"skipped": skipped},
                            ),
                            m.job_id,
                        )
                    )
        # the mapping: new decisions are recorded first so that the desired table includes them
        status_rows = []
        if cfg.dry_run:
            for args, _ in new_rows:
                rows.append(self._record(now_ns, status="recorded", **args))
        else:
            desired = self._desired_entries(managed, pins, view)
            for args, job in new_rows:
                nodes = [n for n in args["after"].split(",") if n]
                desired[job] = None if not nodes or nodes == [view.default_node] else nodes
            ended = {
                r["job_id"]
                for r in self._q(ENDED_SQL, jobs=sorted({j for m in view.mount_maps.values() if m for j in m}))
            }
            drop = ended - set(pins["job"])
            results = self._push_mapping(view, desired, drop, now_ns, force=bool(new_rows))
            failed = [r for r in results if not r.ok]
            err = "; ".join(f"{r.url}: {r.error}" for r in failed)
            urls = [r.url for r in results]
            for args, _ in new_rows:
                status_rows.append(
                    self._record(now_ns, status="failed" if failed else "applied", error=err, endpoints=urls, **args)
                )
            if not new_rows and any(r.changed for r in results):
                pushed = [r for r in results if r.changed and r.error != "in back-off after a failed push"]
                if pushed:
                    status_rows.append(
                        self._record(
                            now_ns,
                            "sync",
                            "",
                            "mapping",
                            "",
                            json.dumps({j: v for j, v in desired.items()}, separators=(",", ":")),
                            "re-push of the decided mapping (earlier push failed, an ended job's entry dropped, "
                            "a pin changed, or a mount restarted)",
                            {"dropped": sorted(drop)},
                            "failed" if failed else "applied",
                            err,
                            [r.url for r in pushed],
                        )
                    )
            rows += status_rows
        # placement
        placement = self._placement(now_ns, pins, anomalies) if cfg.placement_enabled else None
        if placement:
            rows.append(placement)
        self.last = {
            "time_ns": now_ns,
            "duration_s": self.cycle_done(t0),
            "active_jobs": len(active),
            "pending_jobs": len(pending),
            "decisions": len([a for a, _ in new_rows if a["kind"].startswith("dfra_")]),
            "moves": len(moves),
            "skipped_moves": skipped,
            "actions": len(rows),
            "failed": sum(1 for r in rows if r["status"] == "failed"),
            "dry_run": cfg.dry_run,
        }
        return self.last

    def _placement(self, now_ns: int, pins: dict, anomalies: list[dict]) -> dict | None:
        cfg = self.cfg
        eps = self.endpoints
        if not eps.daemons:
            return None
        docs: dict[str, dict | None] = {}
        errors: dict[str, str] = {}
        targets: list[str] = []
        for node, url in sorted(eps.daemons.items()):
            got, err = self._http("GET", url + "/placement")
            docs[node] = got if isinstance(got, dict) else None
            if err:
                errors[node] = err
            if not targets and got is not None:
                t, _ = self._http("GET", url + "/targets")
                targets = [x["name"] for x in t] if isinstance(t, list) else []
        if not targets:
            targets = [
                r["target"]
                for r in self._q(TARGETS_SEEN_SQL, since=ns_to_datetime64(now_ns - int(cfg.placement_window_s * 1e9)))
            ]
        if not targets:
            return None
        base = next((d for d in docs.values() if d is not None), {})
        measured = measure_targets(
            self.store, now_ns - int(cfg.placement_window_s * 1e9), now_ns, cfg.placement_quantile
        )
        slow = {a["node"] for a in anomalies if a["kind"] == "fail_slow_target"}
        last = {
            r["node"]: int(r["t_ns"])
            for r in self._q(
                LAST_FAILSLOW_SQL,
                since=ns_to_datetime64(now_ns - int((cfg.placement_quiet_s + cfg.anomaly_max_age_s) * 1e9)),
                until=ns_to_datetime64(now_ns),
            )
        }
        pin = pins["pool"].get(cfg.placement_pool)
        plan = plan_placement(base, targets, measured, slow, last, now_ns, cfg, pin["value"] if pin else None)
        doc = plan.doc
        for pool, p in pins["pool"].items():  # other pinned pools, as the admin gave them
            if pool != cfg.placement_pool:
                doc = dict(doc, pools=dict(doc.get("pools") or {}, **{pool: p["value"]}))
        if cfg.placement_pool not in (doc.get("pools") or {}):
            return None  # nothing measured yet and no pool to keep in sync
        # unreachable daemons count only for a new decision: their state is unknown, and a restarted
        # daemon (empty placement) is reachable and out of sync, so it gets the pool then
        out_of_sync = [
            n for n, d in docs.items() if (d is None and plan.changed) or (d is not None and _canon(d) != _canon(doc))
        ]
        cur_pool = (base.get("pools") or {}).get(cfg.placement_pool)
        before = json.dumps(_canon({k: (cur_pool or {}).get(k) for k in ("targets", "max_perf")}), sort_keys=True)
        after = json.dumps({"targets": plan.targets, "max_perf": plan.max_perf}, sort_keys=True)
        resource = f"pool:{cfg.placement_pool}"
        ev = plan.evidence | {"left": plan.left, "unreachable": errors}
        if cfg.dry_run:
            if not plan.changed or self._dry_seen.get(("placement", resource)) == after:
                return None
            self._dry_seen[("placement", resource)] = after
            return self._record(now_ns, "placement", "", resource, before, after, plan.reason, ev, "recorded")
        if not out_of_sync:
            return None
        kind = "placement" if plan.changed else "sync"
        if kind == "sync" and not all(self._backoff_ok("fwd:" + n, now_ns) for n in out_of_sync):
            return None
        results = []
        for node in out_of_sync:
            url = eps.daemons[node]
            if docs[node] is None:
                err = errors.get(node, "unreachable")
            else:
                _, err = self._http("PUT", url + "/placement", doc)
            self._note_push("fwd:" + node, not err, now_ns)
            results.append(PushResult(url, not err, err))
        failed = [r for r in results if not r.ok]
        return self._record(
            now_ns,
            kind,
            "",
            resource,
            before,
            after,
            plan.reason
            if kind == "placement"
            else "re-push of the pool to daemons that lack it: " + ", ".join(out_of_sync),
            ev,
            "failed" if failed else "applied",
            "; ".join(f"{r.url}: {r.error}" for r in failed),
            [r.url for r in results],
        )

    # -- on demand (API) --------------------------------------------------------------------------
    def hint(
        self,
        job_id: str,
        name: str | None = None,
        user: str | None = None,
        command: list[str] | None = None,
        apply: bool = False,
        now_ns: int | None = None,
    ) -> dict:
        """The DFRA decision of ``job_id``, taken now if it has none (recorded, reserved nodes held),
        else the stored one (a later remap shows as ``current``). The job's name, user and command
        come from its start event, else from the arguments (a job not started yet); ``apply``
        pushes the mapping at once (before the job's first I/O). Raises ControlError when the job
        is unknown and no name is given, StoreError."""
        with self._lock:
            self._reload()
            now_ns = time.time_ns() if now_ns is None else now_ns
            ev = self._q(JOB_SQL, job_id=job_id)
            ident = ev[0] if ev else None
            if ident and int(ident["started"]):
                name, user, command = ident["name"], ident["user"], list(ident["command"] or [])
            user = user or ""
            stored = self._stored_decisions([job_id], ("dfra_default", "dfra_more_nodes", "dfra_dedicated"))
            if job_id not in stored and not name:
                raise ControlError(f"job {job_id}: no start event and no name given: cannot look up its history")
            current = self._stored_decisions([job_id]).get(job_id)
            pin = self.pins()["job"].get(job_id)
            if job_id in stored:
                r = stored[job_id]
                e = json.loads(r["evidence"] or "{}")
                out = {
                    "job_id": job_id,
                    "class": r["kind"].removeprefix("dfra_"),
                    "nodes": [n for n in r["to_state"].split(",") if n],
                    "reserved": e.get("decision", {}).get("reserved", []),
                    "reason": r["reason"],
                    "evidence": e,
                    "decided": True,
                    "new": False,
                }
            else:
                view = self._view()
                d = self._decide_job(job_id, name, user, command, view, now_ns, True)
                status = "recorded"
                err = ""
                urls: list[str] = []
                if apply and not self.cfg.dry_run and pin is None:
                    entry = None if not d.nodes or d.nodes == [view.default_node] else d.nodes
                    res = self._push_mapping(view, {job_id: entry}, set(), now_ns, force=True)
                    status = "failed" if any(not r.ok for r in res) else "applied"
                    err = "; ".join(f"{r.url}: {r.error}" for r in res if not r.ok)
                    urls = [r.url for r in res]
                self._record(
                    now_ns,
                    f"dfra_{d.klass}",
                    job_id,
                    "mapping",
                    view.default_node or "",
                    _nodes_text(d.nodes),
                    d.reason,
                    d.evidence | {"via": "hint"},
                    status,
                    err,
                    urls,
                )
                out = d.to_dict() | {"class": d.klass, "decided": True, "new": True, "status": status, "error": err}
                out.pop("klass", None)
            out["current_nodes"] = [
                n for n in (current or {}).get("to_state", _nodes_text(out["nodes"])).split(",") if n
            ]
            out["pinned"] = pin["value"] if pin else None
            out["dry_run"] = self.cfg.dry_run
            return out

    def preview(self, name: str, user: str = "", command: list[str] | None = None, now_ns: int | None = None) -> dict:
        """The decision a job not started yet would get (nothing recorded, nothing held)."""
        if not name:
            raise ControlError("name is required: the history is matched by job name, user and command")
        with self._lock:
            self._reload()
            now_ns = time.time_ns() if now_ns is None else now_ns
            d = self._decide_job("", name, user, command, self._view(), now_ns, False)
            out = d.to_dict() | {"class": d.klass, "decided": False, "new": False, "dry_run": self.cfg.dry_run}
            out.pop("klass", None)
            return out

    # -- pins -------------------------------------------------------------------------------------
    def set_pin(self, scope: str, name: str, value, reason: str = "", now_ns: int | None = None) -> dict:
        """Pin a job's forwarding nodes (``scope`` 'job', value: list of node names) or a pool
        (``scope`` 'pool', value: {"targets": [...], "max_perf": {...}}); recorded as a ``pin``
        action. Raises ControlError on an empty or unknown value."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        if scope == "job":
            nodes = list(value or [])
            if not nodes:
                raise ControlError("a job pin needs at least one forwarding node")
            known = self._view().node_names
            unknown = [n for n in nodes if known and n not in known]
            if unknown:
                raise ControlError(f"unknown forwarding node(s) {', '.join(unknown)}; known: {', '.join(known)}")
            value = nodes
        elif scope == "pool":
            if not (value or {}).get("targets"):
                raise ControlError("a pool pin needs at least one target: a pool is never empty")
        else:
            raise ControlError(f"unknown pin scope {scope!r} (job | pool)")
        with self._lock:
            self.store.insert_rows(
                "control_pins",
                [
                    {
                        "scope": scope,
                        "name": name,
                        "value": json.dumps(value),
                        "reason": reason,
                        "deleted": 0,
                        "updated": ns_to_datetime64(now_ns),
                    }
                ],
            )
            self._record(
                now_ns,
                "pin",
                name if scope == "job" else "",
                "mapping" if scope == "job" else f"pool:{name}",
                "",
                _nodes_text(value) if scope == "job" else json.dumps(value, sort_keys=True),
                reason or "pinned by an admin",
                {"scope": scope, "name": name, "value": value},
                "recorded",
            )
        return {"scope": scope, "name": name, "value": value, "reason": reason}

    def delete_pin(self, scope: str, name: str, now_ns: int | None = None) -> bool:
        """Remove a pin; False when there was none."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        with self._lock:
            if name not in self.pins().get(scope, {}):
                return False
            self.store.insert_rows(
                "control_pins",
                [
                    {
                        "scope": scope,
                        "name": name,
                        "value": "null",
                        "reason": "",
                        "deleted": 1,
                        "updated": ns_to_datetime64(now_ns),
                    }
                ],
            )
            self._record(
                now_ns,
                "unpin",
                name if scope == "job" else "",
                "mapping" if scope == "job" else f"pool:{name}",
                "",
                "",
                "pin removed by an admin",
                {"scope": scope, "name": name},
                "recorded",
            )
        return True

    def actions(
        self, job: str | None = None, kind: str | None = None, since_ns: int = 0, limit: int = 100
    ) -> list[dict]:
        """Recorded actions, newest first (evidence parsed)."""
        where, p = [], {"since": ns_to_datetime64(since_ns), "limit": limit}
        if job:
            where.append("job_id = {job:String}")
            p["job"] = job
        if kind:
            where.append("kind = {kind:String}")
            p["kind"] = kind
        sql = ACTIONS_SQL.replace("__WHERE__", "".join(" AND " + w for w in where))
        out = []
        for r in self.store.query(sql, p):
            r = dict(r)
            r["evidence"] = json.loads(r["evidence"] or "{}")
            r["dry_run"] = bool(int(r["dry_run"]))
            r["time_ns"] = int(r["time_ns"])
            out.append(r)
        return out

    def status(self) -> dict:
        return {
            "period_s": self.period_s,
            "cycles": self.cycles,
            "dry_run": self.cfg.dry_run,
            "endpoints": {"mounts": self.endpoints.mounts, "daemons": self.endpoints.daemons},
            "last": self.last,
        }
