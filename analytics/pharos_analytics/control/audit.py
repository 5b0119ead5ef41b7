"""What the control loop records: every action (the audit trail, ``control_actions``) and the
admins' pins (``control_pins``), which always win over the loop's decisions."""

from __future__ import annotations

import json
import logging
import time
import uuid

from pharos_core.store import ns_to_datetime64

log = logging.getLogger("pharos.control")

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


def nodes_text(nodes: list[str] | None) -> str:
    """Node names as an action row's state: ``fwd2,fwd3`` ('' for none)."""
    return ",".join(nodes or [])


class Audit:
    """The recording half of :class:`~pharos_analytics.control.loop.ControlLoop`: action rows,
    pins, the audit trail. Uses the loop's ``store``, ``cfg``, ``_lock`` and ``live_view``."""

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
        """Records one action row (``control_actions``) and logs it; returns the row."""
        args = dict(kind=kind, job_id=job_id, resource=resource, before=before, after=after, reason=reason)
        return self._record_many(now_ns, [args | {"evidence": evidence}], status, error, endpoints)[0]

    def _record_many(
        self, now_ns: int, actions: list[dict], status: str, error: str = "", endpoints: list[str] | None = None
    ) -> list[dict]:
        """:meth:`_record` for many actions (each a dict of its ``kind``, ``job_id``, ``resource``,
        ``before``, ``after``, ``reason``, ``evidence``) with one status, in one insert: a cycle's
        DFRA decisions at 2,000 jobs were 2,000 inserts (~7 s, ``bench/simulate.py``)."""
        rows = [
            {
                "time": ns_to_datetime64(now_ns),
                "action_id": uuid.uuid4().hex,
                "job_id": a["job_id"],
                "kind": a["kind"],
                "resource": a["resource"],
                "from_state": a["before"],
                "to_state": a["after"],
                "reason": a["reason"],
                "evidence": json.dumps(a["evidence"], default=str, separators=(",", ":")),
                "dry_run": int(self.cfg.dry_run),
                "status": status,
                "error": error,
                "endpoints": endpoints or [],
            }
            for a in actions
        ]
        if rows:
            self.store.insert_rows("control_actions", rows)
        for a in actions:
            if status == "failed":
                log.warning("control %s %s %s failed: %s", a["kind"], a["job_id"] or a["resource"], a["after"], error)
            else:
                log.info(
                    "control %s %s %s -> %s (%s): %s",
                    a["kind"],
                    a["job_id"] or a["resource"],
                    a["before"],
                    a["after"],
                    status,
                    a["reason"],
                )
        return rows

    # -- pins -------------------------------------------------------------------------------------
    def pins(self) -> dict[str, dict[str, dict]]:
        """Active pins: {"job": {job_id: {...}}, "pool": {pool: {...}}}; value parsed from JSON."""
        out: dict[str, dict[str, dict]] = {"job": {}, "pool": {}}
        for r in self.store.query(PINS_SQL, {}):
            out.setdefault(r["scope"], {})[r["name"]] = {
                "value": json.loads(r["value"]),
                "reason": r["reason"],
                "updated_ns": int(r["updated_ns"]),
            }
        return out

    def _write_pin(
        self, scope: str, name: str, value: str, reason: str, deleted: int, after: str, why: str, ev: dict, now_ns: int
    ) -> None:
        """One ``control_pins`` row (``value`` JSON; ``deleted`` 1: the pin is removed) and its
        action row (``pin`` or ``unpin``, on the job's mapping or on the pool)."""
        self.store.insert_rows(
            "control_pins",
            [
                {
                    "scope": scope,
                    "name": name,
                    "value": value,
                    "reason": reason,
                    "deleted": deleted,
                    "updated": ns_to_datetime64(now_ns),
                }
            ],
        )
        self._record(
            now_ns,
            "unpin" if deleted else "pin",
            name if scope == "job" else "",
            "mapping" if scope == "job" else f"pool:{name}",
            "",
            after,
            why,
            ev,
            "recorded",
        )

    def set_pin(self, scope: str, name: str, value, reason: str = "", now_ns: int | None = None) -> dict:
        """Pin a job's forwarding nodes (``scope`` 'job', value: list of node names) or a pool
        (``scope`` 'pool', value: {"targets": [...], "max_perf": {...}}); recorded as a ``pin``
        action. Raises ControlError on an empty or unknown value."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        if scope == "job":
            nodes = list(value or [])
            if not nodes:
                raise ControlError("a job pin needs at least one forwarding node")
            known = self.live_view().node_names
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
            self._write_pin(
                scope,
                name,
                value=json.dumps(value),
                reason=reason,
                deleted=0,
                after=nodes_text(value) if scope == "job" else json.dumps(value, sort_keys=True),
                why=reason or "pinned by an admin",
                ev={"scope": scope, "name": name, "value": value},
                now_ns=now_ns,
            )
        return {"scope": scope, "name": name, "value": value, "reason": reason}

    def delete_pin(self, scope: str, name: str, now_ns: int | None = None) -> bool:
        """Remove a pin; False when there was none."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        with self._lock:
            if name not in self.pins().get(scope, {}):
                return False
            self._write_pin(
                scope,
                name,
                value="null",
                reason="",
                deleted=1,
                after="",
                why="pin removed by an admin",
                ev={"scope": scope, "name": name},
                now_ns=now_ns,
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
