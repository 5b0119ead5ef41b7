"""Online migration off persistently fail-slow targets: when to ask the forwarding layer to move
the data (issue 27, item 1, the control loop's half).

Sources: the Sunway storage paper migrates the data of an N-N application off the anomalous
storage nodes Beacon found (20 -> about 70 GB/s); GVDS's multi-task data migration module (MODM)
schedules such migrations online (a minimum bandwidth per task, the rest of a total cap by
priority, bounded units). The copy, the atomic layout switch, the journal and MODM's allocation
are the daemons' (forwarder/README.md, "Online migration": admin ``/migrations``); this module
decides when, where and with which figures.

* **Episode**: the run of active ``fail_slow_target`` detections of a target in ``anomalies``
  (:mod:`pharos_analytics.failslow`) whose consecutive detections are at most
  ``migration_episode_gap_s`` apart, the newest one current (the loop's current anomalies).
* **Persistence**: a target is migrated off once its episode is ``migration_persist_s`` old
  (default 300 s): a transient slowdown moves no data.
* **Healthy destinations**: the target must be out of the loop's placement pool (``[control]
  placement_pool``, dropped by :mod:`.placement` while fail-slow) on the migrating daemon; the
  request names that pool, from which the daemon picks each file's destination
  (``max_perf / (open_count + 1)``). A target an admin's pool pin keeps in the pool is not
  migrated off (the pin says it is fine); without the pool on the daemons nothing is planned.
* **Once per (target, episode)**, across cycles and restarts of the loop: a planning is a
  ``migration`` row of ``control_actions`` (resource ``target:<name>``); an episode with one at
  or after its start is planned. Tasks already queued or copying off the target on a daemon (an
  admin's, or the loop's before a crash between the POST and its row) are adopted: recorded,
  nothing posted. A daemon restarted since it planned the episode lists none of its tasks any
  more (its journal rolled back or forward the files it was moving): the episode is planned
  again there (``resume``: the rolled-back files are planned anew, the moved ones have no
  object left on the target).
* **One daemon** plans (``migration_daemon``, else the first daemon by name that answers): the
  daemons share the namespace, so each would plan every file; that daemon's cap
  (``migration_max_total_mb_s``, else its own ``--migration-max-mb-s``) bounds all migration.
* **Gating**: ``migration_enabled``; ``dry_run`` records the decision (status ``recorded``) and
  posts nothing; a failed POST is recorded ``failed`` and retried with the loop's back-off.

Admins list the tasks, pin (keep a file where it is), re-prioritise and cancel them through the
API (``/v1/control/migrations``), each call recorded (``migration_change``,
``migration_cancel``) and forwarded to the daemon (dry run: recorded only).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from pharos_core.store import ns_to_datetime64

from .audit import ControlError
from .config import ControlConfig
from .push import View, concurrently

log = logging.getLogger("pharos.control")

#: Tasks in these states are over (the daemons keep the last 10,000 of them listed).
FINISHED = frozenset({"done", "failed", "cancelled"})
MIGRATION_KINDS = ("migration", "migration_change", "migration_cancel")

FAILSLOW_TIMES_SQL = """
SELECT node, arraySort(groupArray(toUnixTimestamp64Nano(detected))) AS times,
       argMax(ratio, detected) AS ratio, argMax(severity, detected) AS severity
FROM anomalies
WHERE kind = 'fail_slow_target' AND active = 1 AND node IN {nodes:Array(String)}
  AND detected > {since:DateTime64(9)} AND detected <= {until:DateTime64(9)}
GROUP BY node
"""
#: The newest planning of each target (live rows, or those of a dry run while dry).
PLANNED_SQL = """
SELECT resource, toUnixTimestamp64Nano(max(time)) AS t_ns, argMax(evidence, time) AS evidence
FROM control_actions
WHERE kind = 'migration' AND resource IN {resources:Array(String)} AND dry_run = {dry:UInt8}
  AND status IN ('applied', 'recorded')
GROUP BY resource
"""


class MigrationCallError(ControlError):
    """An admin call on a daemon's migration that did not succeed: ``status`` is the HTTP status
    to answer (404 unknown daemon or task, 400 refused by the daemon, 502 unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Planned:
    """The newest planning row of a target: when (ns), on which daemon, how many tasks."""

    t_ns: int
    daemon: str
    tasks: int


@dataclass
class MigrationDecision:
    """What the loop does about one currently fail-slow target this cycle.

    ``action``: ``plan`` (POST), ``resume`` (POST again: the daemon lost the episode's tasks),
    ``adopt`` (tasks already under way: recorded, nothing posted) or ``skip`` (``reason``)."""

    target: str
    action: Literal["plan", "resume", "adopt", "skip"]
    reason: str
    episode_start_ns: int
    persisted_s: float
    evidence: dict = field(default_factory=dict)


def episode_start(times: list[int], now_ns: int, gap_ns: int) -> int | None:
    """Start (ns) of the run of detections ``times`` (ns, any order) that reaches ``now_ns``:
    consecutive detections at most ``gap_ns`` apart, the newest at most ``gap_ns`` before now.
    None: no detection, or the newest is older (the episode ended). The start is at least as old
    as the first time given (the caller's window may cut a longer run)."""
    ts = sorted(t for t in times if t <= now_ns)
    if not ts or now_ns - ts[-1] > gap_ns:
        return None
    start = ts[-1]
    for t in reversed(ts[:-1]):
        if start - t > gap_ns:
            break
        start = t
    return start


def plan_migrations(
    current: dict[str, dict],
    times: dict[str, list[int]],
    planned: dict[str, Planned],
    tasks: dict[str, list[dict]],
    answered: set[str],
    pool_targets: set[str] | None,
    pinned_pool: set[str] | None,
    now_ns: int,
    cfg: ControlConfig,
) -> list[MigrationDecision]:
    """The decision of each currently fail-slow target (see the module doc). Pure.

    Args:
        current: target -> its current active fail-slow anomaly (``ratio``, ``severity``).
        times: target -> times (ns) of its active fail-slow detections stored in the window.
        planned: target -> its newest planning (:class:`Planned`).
        tasks: daemon -> its tasks (``GET /migrations`` ``tasks``) of the daemons that answered.
        answered: the daemons whose ``GET /migrations`` answered.
        pool_targets: the targets of the loop's placement pool on the migrating daemon (None:
            no such pool there).
        pinned_pool: the targets of an admin's pin of that pool (None: not pinned).
    Returns:
        One :class:`MigrationDecision` per target of ``current``, by name.
    """
    gap_ns = int(cfg.migration_episode_gap_s * 1e9)
    out: list[MigrationDecision] = []
    for target in sorted(current):
        a = current[target]
        start = episode_start(times.get(target, []), now_ns, gap_ns)
        start = now_ns if start is None else start
        age_s = (now_ns - start) / 1e9
        ev = {"ratio": float(a.get("ratio") or 0.0), "severity": a.get("severity", ""), "episode_start_ns": start}

        def decide(action: str, reason: str, **more) -> None:
            out.append(MigrationDecision(target, action, reason, start, round(age_s, 3), ev | more))  # noqa: B023

        if age_s < cfg.migration_persist_s:
            decide("skip", f"fail-slow for {age_s:.0f} s; migrated off after {cfg.migration_persist_s:g} s")
            continue
        if pinned_pool is not None and target in pinned_pool:
            decide("skip", f"kept in the admin-pinned pool {cfg.placement_pool}: not migrated off")
            continue
        if pool_targets is None:
            decide("skip", f"no placement pool {cfg.placement_pool} on the daemons: no healthy destinations known")
            continue
        if target in pool_targets:
            decide("skip", f"still in the placement pool {cfg.placement_pool} (the placement push drops it)")
            continue
        p = planned.get(target)
        of_target = {d: [t for t in ts if t.get("source_target") == target] for d, ts in tasks.items()}
        if p is not None and p.t_ns >= start:
            if p.tasks > 0 and p.daemon in answered and not of_target.get(p.daemon):
                decide(
                    "resume",
                    f"{p.daemon} lists none of the {p.tasks} task(s) planned at this episode "
                    "(restarted: its journal rolled the copies back or forward): planned again",
                    planned_ns=p.t_ns,
                )
            else:
                decide("skip", "planned in this episode already", planned_ns=p.t_ns)
            continue
        under_way = {d: [t["id"] for t in ts if t.get("state") not in FINISHED] for d, ts in of_target.items()}
        under_way = {d: ids for d, ids in under_way.items() if ids}
        if under_way:
            what = ", ".join(f"{len(ids)} on {d}" for d, ids in sorted(under_way.items()))
            decide("adopt", f"tasks already under way ({what}): adopted, nothing posted", under_way=under_way)
            continue
        decide(
            "plan",
            f"fail-slow for {age_s:.0f} s (>= {cfg.migration_persist_s:g} s, x{ev['ratio']:.1f} its peers' "
            f"service time): its files' objects move to the pool {cfg.placement_pool}",
        )
    return out


def request_body(target: str, pool: str | None, cfg: ControlConfig) -> dict[str, Any]:
    """The ``POST /migrations`` body of a planning (MODM figures from ``cfg``)."""
    body: dict[str, Any] = {
        "source_target": target,
        "min_mb_s": cfg.migration_min_mb_s,
        "priority": cfg.migration_priority,
        "unit_bytes": cfg.migration_unit_bytes,
    }
    if cfg.migration_max_mb_s > 0:
        body["max_mb_s"] = cfg.migration_max_mb_s
    if pool:
        body["pool"] = pool
    return body


class Migration:
    """The migration half of :class:`~pharos_analytics.control.loop.ControlLoop`: the cycle's
    planning (:meth:`_migrations`) and the admin calls of the API. Uses the loop's ``store``,
    ``cfg``, ``client``, ``endpoints``, ``_http``, ``_record``, ``_backoff_ok``, ``_note_push``."""

    # -- reads ------------------------------------------------------------------------------------
    def _daemon_migrations(self, daemons: dict[str, str], down: set[str]) -> dict[str, tuple[dict | None, str]]:
        """node -> (its ``GET /migrations`` document or None, error), every daemon not ``down`` at once."""
        up = sorted(n for n in daemons if n not in down)
        got = concurrently(lambda n: self._http("GET", daemons[n] + "/migrations"), up)
        out: dict[str, tuple[dict | None, str]] = {n: (None, "no answer to the liveness check") for n in daemons}
        for n, (doc, err) in zip(up, got, strict=True):
            out[n] = (
                doc if isinstance(doc, dict) else None,
                err or ("" if isinstance(doc, dict) else "not a document"),
            )
        return out

    def _planned(self, targets: list[str]) -> dict[str, Planned]:
        """Target -> its newest planning row (live rows; while in dry run, the dry run's)."""
        rows = self.store.query(
            PLANNED_SQL, {"resources": [f"target:{t}" for t in targets], "dry": int(self.cfg.dry_run)}
        )
        out = {}
        for r in rows:
            ev = json.loads(r["evidence"] or "{}")
            out[r["resource"].removeprefix("target:")] = Planned(
                int(r["t_ns"]), ev.get("daemon", ""), len(ev.get("ids") or [])
            )
        return out

    def _failslow_times(self, targets: list[str], since_ns: int, now_ns: int) -> dict[str, list[int]]:
        """Target -> times (ns, sorted) of its active fail-slow detections in ``(since_ns, now_ns]``."""
        rows = self.store.query(
            FAILSLOW_TIMES_SQL,
            {"nodes": targets, "since": ns_to_datetime64(since_ns), "until": ns_to_datetime64(now_ns)},
        )
        return {r["node"]: [int(t) for t in r["times"]] for r in rows}

    # -- the cycle's step -------------------------------------------------------------------------
    def _migrations(self, now_ns: int, pins: dict, anomalies: list[dict], view: View) -> tuple[list[dict], list[dict]]:
        """Plan migrations off the persistently fail-slow targets (module doc): (action rows,
        skipped decisions as dicts). No HTTP call while no target is fail-slow."""
        cfg = self.cfg
        current = {a["node"]: a for a in anomalies if a["kind"] == "fail_slow_target"}
        eps = self.endpoints
        if not (cfg.migration_enabled and current and eps.daemons):
            return [], []
        targets = sorted(current)
        planned = self._planned(targets)
        gap_ns = int(cfg.migration_episode_gap_s * 1e9)
        oldest = min([now_ns - int(cfg.migration_persist_s * 1e9)] + [p.t_ns for p in planned.values()])
        times = self._failslow_times(targets, oldest - gap_ns, now_ns)
        docs = self._daemon_migrations(eps.daemons, view.down)
        answered = {n for n, (d, _) in docs.items() if d is not None}
        chosen = cfg.migration_daemon or next(iter(sorted(answered)), "")
        pool_targets = None
        if chosen in eps.daemons and chosen not in view.down:
            doc, _ = self._http("GET", eps.daemons[chosen] + "/placement")
            pool = ((doc or {}).get("pools") or {}).get(cfg.placement_pool) if isinstance(doc, dict) else None
            pool_targets = set(pool.get("targets") or []) if isinstance(pool, dict) else None
        pin = pins.get("pool", {}).get(cfg.placement_pool)
        pinned_pool = set((pin["value"] or {}).get("targets") or []) if pin else None
        tasks = {n: list(d.get("tasks") or []) for n, (d, _) in docs.items() if d is not None}
        decisions = plan_migrations(current, times, planned, tasks, answered, pool_targets, pinned_pool, now_ns, cfg)
        rows: list[dict] = []
        for d in decisions:
            if d.action == "adopt":
                daemon = sorted(d.evidence["under_way"])[0]
                ids = d.evidence["under_way"][daemon]
                rows.append(self._migration_row(now_ns, d, daemon, ids, {}, "recorded" if cfg.dry_run else "applied"))
            elif d.action in ("plan", "resume"):
                row = self._post_migration(now_ns, d, chosen, docs)
                if row is not None:
                    rows.append(row)
        skipped = [
            {"target": d.target, "reason": d.reason, "persisted_s": d.persisted_s}
            for d in decisions
            if d.action == "skip"
        ]
        return rows, skipped

    def _migration_row(
        self, now_ns: int, d: MigrationDecision, daemon: str, ids: list, body: dict, status: str, err: str = "", url=""
    ) -> dict:
        """Record one planning (``migration`` row: resource ``target:<name>``, to ``<daemon>: <n> task(s)``)."""
        return self._record(
            now_ns,
            "migration",
            "",
            f"target:{d.target}",
            d.target,
            f"{daemon}: {len(ids)} task(s)" if status != "failed" else "",
            d.reason,
            d.evidence
            | {"action": d.action, "persisted_s": d.persisted_s, "daemon": daemon, "ids": ids, "request": body},
            status,
            err,
            [url] if url else [],
        )

    def _post_migration(self, now_ns: int, d: MigrationDecision, daemon: str, docs: dict) -> dict | None:
        """Set the daemon's cap when configured, POST the planning, record it (None: in back-off)."""
        cfg = self.cfg
        body = request_body(d.target, cfg.placement_pool, cfg)
        if cfg.dry_run:
            return self._migration_row(now_ns, d, daemon, [], body, "recorded")
        key = "migrate:" + d.target
        if not self._backoff_ok(key, now_ns):
            return None
        eps = self.endpoints
        url = eps.daemons.get(daemon, "")
        doc = docs.get(daemon, (None, ""))[0]
        err = "" if url and doc is not None else f"daemon {daemon or '(none)'} does not answer GET /migrations"
        settings = dict((doc or {}).get("settings") or {})
        want = dict(settings)
        if cfg.migration_max_total_mb_s > 0:
            want["max_total_mb_s"] = cfg.migration_max_total_mb_s
        if cfg.migration_max_active > 0:
            want["max_active"] = cfg.migration_max_active
        if not err and want != settings:
            _, err = self._http("PUT", url + "/migrations", want)
        ids: list = []
        if not err:
            reply, err = self._http("POST", url + "/migrations", body, timeout=max(cfg.http_timeout_s, 30.0))
            ids = list((reply or {}).get("ids") or []) if not err else []
        self._note_push(key, not err, now_ns)
        d.evidence["settings"] = want
        return self._migration_row(
            now_ns, d, daemon, ids, body, "failed" if err else "applied", err, url + "/migrations"
        )

    # -- the API's calls --------------------------------------------------------------------------
    def migrations_overview(self) -> list[dict]:
        """Per daemon (by name): ``daemon``, ``url``, ``ok``, ``error``, and its ``GET /migrations``
        (``settings``, ``minimums_scaled``, ``tasks``) when it answered."""
        eps = self.endpoints
        docs = self._daemon_migrations(eps.daemons, set())
        out = []
        for n in sorted(eps.daemons):
            doc, err = docs[n]
            doc = doc or {}
            out.append(
                {
                    "daemon": n,
                    "url": eps.daemons[n],
                    "ok": not err,
                    "error": err,
                    "settings": doc.get("settings"),
                    "minimums_scaled": bool(doc.get("minimums_scaled", False)),
                    "tasks": list(doc.get("tasks") or []),
                }
            )
        return out

    def _admin_call(self, method: str, daemon: str, task_id: int, body: dict | None) -> tuple[dict | None, str]:
        """One call on ``/migrations/{task_id}`` of ``daemon``; raises MigrationCallError (404 / 400 / 502)."""
        url = self.endpoints.daemons.get(daemon)
        if url is None:
            raise MigrationCallError(
                404, f"unknown forwarding node {daemon}; known: {', '.join(sorted(self.endpoints.daemons))}"
            )
        url = f"{url}/migrations/{task_id}"
        if self.cfg.dry_run:
            return None, url
        try:
            r = self.client.request(
                method, url, json=body, timeout=self.cfg.http_timeout_s, headers=self._admin_headers()
            )
        except httpx.HTTPError as exc:
            raise MigrationCallError(502, f"{method} {url}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if r.status_code in (400, 404):
            try:
                msg = r.json().get("error", r.text)
            except ValueError:
                msg = r.text
            raise MigrationCallError(r.status_code, f"{daemon}: {str(msg)[:300]}")
        if r.status_code >= 300:
            raise MigrationCallError(502, f"{method} {url}: HTTP {r.status_code} {r.text[:200]}")
        try:
            return r.json(), url
        except ValueError:
            raise MigrationCallError(502, f"{method} {url}: reply is not JSON") from None

    def change_migration(
        self, daemon: str, task_id: int, change: dict, reason: str = "", now_ns: int | None = None
    ) -> dict:
        """Forward an admin's change of a task (``pinned``, ``priority``, ``min_mb_s``, ``max_mb_s``)
        to the daemon; recorded (``migration_change``). Returns ``{daemon, id, status, task}``
        (``task``: the daemon's view; None in dry run). Raises MigrationCallError."""
        return self._admin_action("PUT", "migration_change", daemon, task_id, change, reason, now_ns)

    def cancel_migration(self, daemon: str, task_id: int, reason: str = "", now_ns: int | None = None) -> dict:
        """Cancel a task on its daemon (a copy under way is rolled back); recorded
        (``migration_cancel``). Returns ``{daemon, id, status, task}`` (``task``: ``{id, state}``)."""
        return self._admin_action("DELETE", "migration_cancel", daemon, task_id, None, reason, now_ns)

    def _admin_action(
        self, method: str, kind: str, daemon: str, task_id: int, body: dict | None, reason: str, now_ns: int | None
    ) -> dict:
        now_ns = time.time_ns() if now_ns is None else now_ns
        reply, url = self._admin_call(method, daemon, task_id, body)
        status = "recorded" if self.cfg.dry_run else "applied"
        what = json.dumps(body, sort_keys=True) if body is not None else "cancel"
        with self._lock:
            self._record(
                now_ns,
                kind,
                "",
                f"migration:{daemon}/{task_id}",
                "",
                what,
                reason or ("changed by an admin" if body is not None else "cancelled by an admin"),
                {"daemon": daemon, "id": task_id, "request": body, "reply": reply},
                status,
                "",
                [url],
            )
        return {"daemon": daemon, "id": task_id, "status": status, "task": reply}
