"""The control loop's on-demand answers (the API's hint routes): a job's DFRA decision claimed
(:meth:`Hints.hint`: recorded, reserved nodes held, the mapping pushed) or read
(:meth:`Hints.read_hint`: nothing written), the decision a job not started yet would get
(:meth:`Hints.preview`), and the I/O class of every (user, job name) with history
(:meth:`Hints.io_classes`).

Bounded work: none of them waits on an admin interface that does not answer. They read the
forwarding layer from the kept view (:mod:`.liveness`); only a claim with ``apply`` calls the
mounts, all at once, each call bounded by ``[control] liveness_timeout_s``. Only a claim takes
the loop's lock (it may hold reserved nodes), and the control cycle keeps its slow parts (the
view, Slurm, placement) outside that lock.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict

from pharos_core.store import ns_to_datetime64

from ..profiles import job_metrics
from .audit import ControlError, nodes_text
from .dfra import decide, history_from_metrics

#: Jobs with an end event that started from ``since`` on (the runs a history counts).
ENDED_SINCE_SQL = "SELECT DISTINCT job_id FROM job_events WHERE kind = 'end' AND time >= {since:DateTime64(9)}"

DFRA_KINDS = ("dfra_default", "dfra_more_nodes", "dfra_dedicated")


class Hints:
    """The on-demand half of :class:`~pharos_analytics.control.loop.ControlLoop`. Uses the
    loop's ``store``, ``cfg``, ``diag``, ``_lock``, the view (:meth:`live_view`), the decision
    (:meth:`_decide_job`) and the pushes."""

    def _identity(
        self, job_id: str, name: str | None, user: str | None, command: list[str] | None
    ) -> tuple[str | None, str, list[str] | None]:
        """The job's name, user and command: from its start event, else the arguments."""
        ident = self._job_identity(job_id)
        if ident and int(ident["started"]):
            return ident["name"], ident["user"], list(ident["command"] or [])
        return name, user or "", command

    def _stored_out(self, job_id: str, r: dict) -> dict:
        """A recorded decision (its ``control_actions`` row) as :meth:`hint` returns it;
        ``node_local`` from its evidence (false for a decision recorded before it was suggested)."""
        e = json.loads(r["evidence"] or "{}")
        return {
            "job_id": job_id,
            "class": r["kind"].removeprefix("dfra_"),
            "nodes": [n for n in r["to_state"].split(",") if n],
            "reserved": e.get("decision", {}).get("reserved", []),
            "reason": r["reason"],
            "evidence": e,
            "node_local": bool((e.get("node_local") or {}).get("suggested", False)),
            "decided": True,
            "new": False,
        }

    def _finish(self, out: dict, job_id: str, current: dict | None, pin: dict | None) -> dict:
        out["current_nodes"] = [n for n in (current or {}).get("to_state", nodes_text(out["nodes"])).split(",") if n]
        out["pinned"] = pin["value"] if pin else None
        out["dry_run"] = self.cfg.dry_run
        return out

    def hint(
        self,
        job_id: str,
        name: str | None = None,
        user: str | None = None,
        command: list[str] | None = None,
        apply: bool = False,
        now_ns: int | None = None,
        ranks: int | None = None,
    ) -> dict:
        """Claim the DFRA decision of ``job_id`` (``POST /v1/hints/jobs/{id}``): taken now if it
        has none (recorded; reserved nodes held for the start grace, then leased, :mod:`.lease`;
        dry run: recorded, nothing held), else the stored one (a later remap shows as
        ``current_nodes``). The job's name, user and command come from its start event, else
        from the arguments (a job not started yet); ``apply`` pushes the mapping to every mount
        at once (before the job's first I/O; each call bounded by ``liveness_timeout_s``; a
        mount the kept view says does not answer fails at once and the loop retries it);
        ``ranks`` (None: from the start event, else unknown) is a feature of the learned class of
        a job without exact history (:mod:`.class_model`). Raises ControlError when the job is
        unknown and no name is given, StoreError."""
        with self._lock:
            self._reload()
            now_ns = time.time_ns() if now_ns is None else now_ns
            name, user, command = self._identity(job_id, name, user, command)
            stored = self._stored_decisions([job_id], DFRA_KINDS)
            if job_id not in stored and not name:
                raise ControlError(f"job {job_id}: no start event and no name given: cannot look up its history")
            current = self._stored_decisions([job_id]).get(job_id)
            pin = self.pins()["job"].get(job_id)
            if job_id in stored:
                return self._finish(self._stored_out(job_id, stored[job_id]), job_id, current, pin)
            view = self.live_view()
            d = self._decide_job(job_id, name, user, command, view, now_ns, True, ranks=ranks)
            status, err, urls = "recorded", "", []
            if apply and not self.cfg.dry_run and pin is None:
                t = self.cfg.liveness_timeout_s
                entry = None if not d.nodes or d.nodes == [view.default_node] else d.nodes
                res = self._push_mapping(self.fresh_mount_maps(view, t), {job_id: entry}, set(), now_ns, True, None, t)
                status = "failed" if any(not r.ok for r in res) else "applied"
                err = "; ".join(f"{r.url}: {r.error}" for r in res if not r.ok)
                urls = [r.url for r in res]
            self._record(
                now_ns,
                f"dfra_{d.klass}",
                job_id,
                "mapping",
                view.default_node or "",
                nodes_text(d.nodes),
                d.reason,
                d.evidence | {"via": "hint"},
                status,
                err,
                urls,
            )
            out = d.to_dict() | {"class": d.klass, "decided": True, "new": True, "status": status, "error": err}
            out.pop("klass", None)
            return self._finish(out, job_id, current, pin)

    def read_hint(
        self,
        job_id: str,
        name: str | None = None,
        user: str | None = None,
        command: list[str] | None = None,
        now_ns: int | None = None,
        ranks: int | None = None,
    ) -> dict:
        """Read the DFRA decision of ``job_id`` (``GET /v1/hints/jobs/{id}``): the recorded one
        (``decided`` true), else the decision it would get now (``decided`` false, the preview
        by its start event's or the given name, user and command). Records nothing, holds
        nothing, pushes nothing; never takes the loop's lock. Raises ControlError when the job
        has no decision, no start event and no name is given, StoreError."""
        self._reload()
        now_ns = time.time_ns() if now_ns is None else now_ns
        stored = self._stored_decisions([job_id], DFRA_KINDS)
        current = self._stored_decisions([job_id]).get(job_id)
        pin = self.pins()["job"].get(job_id)
        if job_id in stored:
            return self._finish(self._stored_out(job_id, stored[job_id]), job_id, current, pin)
        name, user, command = self._identity(job_id, name, user, command)
        if not name:
            raise ControlError(f"job {job_id}: no decision, no start event and no name given")
        d = self._decide_job(job_id, name, user, command, self.live_view(), now_ns, False, ranks=ranks)
        out = d.to_dict() | {"class": d.klass, "decided": False, "new": False}
        out.pop("klass", None)
        return self._finish(out, job_id, current, pin)

    def preview(
        self,
        name: str,
        user: str = "",
        command: list[str] | None = None,
        now_ns: int | None = None,
        ranks: int | None = None,
    ) -> dict:
        """The decision a job not started yet would get (nothing recorded, nothing held); ``ranks``
        (None: unknown) is a feature of the learned class when there is no exact history. Never
        takes the loop's lock."""
        if not name:
            raise ControlError("name is required: the history is matched by job name, user and command")
        self._reload()
        now_ns = time.time_ns() if now_ns is None else now_ns
        d = self._decide_job("", name, user, command, self.live_view(), now_ns, False, ranks=ranks or 0)
        out = d.to_dict() | {"class": d.klass, "decided": False, "new": False, "dry_run": self.cfg.dry_run}
        out.pop("klass", None)
        return out

    def io_classes(self, since_ns: int, user: str | None = None, limit: int = 1000) -> list[dict]:
        """The DFRA class a new job of each (user, job name) with I/O since ``since_ns`` would get
        now (``GET /v1/hints/classes``): ``{user, name, class, pattern, runs, node_local}``
        (``node_local``: node-local mode suggested, :func:`~.dfra.node_local_suggestion`), largest
        total bytes first, at most ``limit``; ``user`` None: every user's.

        Bounded: one read of the jobs' metrics, one of the ended jobs, one of the node states
        and capacity, then :func:`~.dfra.decide` per (user, name) on the newest
        ``dfra_history_runs`` finished runs with I/O: no call to a mount or daemon per item
        (the kept view, :mod:`.liveness`). A name whose runs never finished gets ``default``
        (no learned-class prediction here: that is per job, at its hint). Jobs without a name
        are left out."""
        self._reload()
        cfg = self.cfg
        now_ns = time.time_ns()
        groups: dict[tuple[str, str], list] = defaultdict(list)
        for m in job_metrics(self.store, since_ns=since_ns):
            if m.name and (user is None or m.user == user):
                groups[(m.name, m.user)].append(m)
        if not groups:
            return []
        ended = {r["job_id"] for r in self._q(ENDED_SINCE_SQL, since=ns_to_datetime64(since_ns))}
        view = self.live_view()
        nodes = self._node_states(view, now_ns)
        cap, _ = self.node_capacity(now_ns)
        ranked = sorted(groups.items(), key=lambda kv: -sum(m.numbers["bytes"] for m in kv[1]))[:limit]
        out = []
        for (name, u), ms in ranked:
            ms.sort(key=lambda m: m.start_ns, reverse=True)
            runs = [m for m in ms if m.job_id in ended and (m.numbers["bytes"] > 0 or m.numbers["metadata_ops"] > 0)]
            hist = history_from_metrics(runs[: cfg.dfra_history_runs])
            d = decide("", hist, nodes, view.default_node, cap, cfg, self.diag)
            pattern = Counter(m.pattern for m in ms).most_common(1)[0][0]
            out.append(
                {
                    "user": u,
                    "name": name,
                    "class": d.klass,
                    "pattern": pattern,
                    "runs": len(ms),
                    "node_local": d.node_local,
                }
            )
        return out
