"""The control loop: reads the store, decides (DFRA, remapping, placement), pushes the decisions
to the forwarding layer's admin interfaces, and records every action.

One :meth:`ControlLoop.cycle` (every ``[control] period_s`` in ``pharos serve``, beside the
detection loop of :mod:`pharos_analytics.alerts`):

0. **View** (:mod:`.liveness`): every mount and daemon asked at once, outside the lock hints
   take; with ``lease_slurm``, Slurm's view of the jobs holding reserved nodes (``squeue``).
1. **Jobs and leases** (:mod:`.lease`): active jobs (``job_events`` start without end), and jobs
   hinted but not started yet. Leases of reserved forwarding nodes are renewed (start event,
   newest I/O record, Slurm); nodes held by ended jobs, by hinted jobs that never started
   within ``reservation_start_grace_s`` (``release`` rows) and by jobs whose lease expired
   (``lease_expired`` rows, their mapping entries dropped) are returned.
2. **DFRA** (:mod:`.dfra`) for every active job without a decision yet: the history of its
   earlier runs decides its forwarding nodes (``dfra_*`` rows; the histories of all these jobs
   read at once, :func:`~.dfra.job_histories`). :meth:`ControlLoop.hint`
   takes the same decision on demand (a claimed hint, :mod:`.hints`), before the job's first I/O. A job without exact history
   gets the class of the learned job-class model when it is confident (:mod:`.class_model`).
3. **Remapping** (:mod:`.remap`) on the detection loop's active interference events on a
   forwarding node (``remap`` rows).
4. **Mapping push**: the mount's whole job table (``GET``/``PUT /mapping`` of pharos-mount,
   ``{"jobs": {"42": ["fwd2", "fwd3"]}}``, primary first) gets each managed job's entry; pinned
   jobs get their pin. Entries of other jobs are kept; entries of ended jobs are dropped.
5. **Placement** (:mod:`.placement`): the pool document to every daemon's ``PUT /placement``
   (outside the lock; daemons that did not answer the view are not called).
6. **Migration** (:mod:`.migration`): a target fail-slow for ``migration_persist_s`` and out
   of the pool has its files' objects moved off it (``POST /migrations`` to one daemon), once
   per fail-slow episode (``migration`` rows).

Safety: ``dry_run`` records (status ``recorded``), pushes nothing and holds no reserved node. A push that fails
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

Where each part lives: :mod:`.state` (what the loop reads from the store, and its SQL),
:mod:`.push` (the admin interfaces: HTTP, token, back-off), :mod:`.liveness` (the kept view),
:mod:`.lease` (reserved nodes: hold, renew, return), :mod:`.audit` (action rows, pins, the
audit trail), :mod:`.hints` (the on-demand calls of the API); this module holds the cycle and
the decisions.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import httpx

from pharos_core.settings import Settings
from pharos_core.store import Store

from ..diagnosis_config import DiagnosisConfig
from ..periodic import PeriodicLoop
from .audit import Audit, ControlError, nodes_text
from .class_model import ClassModel, JobIdentity, LearnedClass, start_ranks, training_samples
from .config import ControlConfig
from .dfra import DfraDecision, decide
from .hints import Hints
from .lease import Leases
from .liveness import Liveness
from .migration import Migration
from .placement import measure_targets, plan_placement
from .push import AdminPush, Endpoints, PushResult, View, _Backoff, _canon
from .remap import InterferenceHint, Move, plan_moves
from .state import ControlState

log = logging.getLogger("pharos.control")

__all__ = ["ControlError", "ControlLoop", "Endpoints", "PushResult"]


class ControlLoop(ControlState, AdminPush, Liveness, Leases, Audit, Hints, Migration, PeriodicLoop):
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
        #: held while reserved nodes are handed out or returned and mappings pushed (a cycle's
        #: decisions, a claimed hint); ``_cycle_lock``: one cycle at a time
        self._lock = threading.RLock()
        self._cycle_lock = threading.Lock()
        self._init_liveness()
        self._backoff: dict[str, _Backoff] = {}
        self._dry_seen: dict[tuple[str, str], str] = {}
        #: (monotonic time trained, config key, model or None, why None)
        self._class_model: tuple[float, str, ClassModel | None, str] | None = None

    # -- plumbing ---------------------------------------------------------------------------
    def _reload(self) -> None:
        """Re-read both configs (file and environment may have changed)."""
        self.cfg = self.cfg_factory()
        self.diag = self.diag_factory()

    def run_once(self) -> dict:
        """One cycle at the current time (:meth:`cycle`); what the loop's thread runs."""
        return self.cycle()

    # -- DFRA -------------------------------------------------------------------------------------
    def _decide_job(
        self,
        job_id: str,
        name: str,
        user: str,
        command: list[str] | None,
        view: View,
        now_ns: int,
        record: bool,
        anomalies: list[dict] | None = None,
        ranks: int | None = None,
    ) -> DfraDecision:
        cfg = self.cfg
        hist = self._histories([(job_id, name, user, command)])[0]
        learned, why_not = None, ""
        if hist is None and name and cfg.dfra_model_enabled:
            learned, why_not = self._learned_class(job_id, name, user, command, ranks, now_ns)
        nodes = self._node_states(view, now_ns, anomalies)
        cap, cap_src = self.node_capacity(now_ns)
        d = decide(job_id, hist, nodes, view.default_node, cap, cfg, self.diag, learned)
        if why_not:
            d.evidence["learned"] = {"model": why_not}
        # A job the mount already maps (set there by an admin, the scheduler or a test, not by this
        # loop: the job has no decision yet) keeps that entry when DFRA has nothing better than the
        # default: "default" means no allocation of ours, not "undo someone else's".
        known = set(view.node_names)
        entry = next((m[job_id] for m in view.mount_maps.values() if m and m.get(job_id)), None)
        if d.klass == "default" and job_id and entry and all(n in known for n in entry) and entry != d.nodes:
            d.evidence["default_nodes"] = d.nodes
            d.nodes, d.reserved = list(entry), [n for n in entry if n in d.reserved]
            d.reason += f"; the mount already maps the job to {nodes_text(entry)}: kept"
        d.evidence |= {
            "name": name,
            "user": user,
            "command": command or [],
            "node_capacity_source": cap_src,
            "nodes": [n.__dict__ for n in nodes],
            "decision": {"class": d.klass, "nodes": d.nodes, "reserved": d.reserved},
        }
        if record and job_id and d.reserved and not cfg.dry_run:
            self._hold(d.reserved, job_id, f"DFRA {d.klass}", now_ns)
        return d

    def _learned_class(
        self, job_id: str, name: str, user: str, command: list[str] | None, ranks: int | None, now_ns: int
    ) -> tuple[LearnedClass | None, str]:
        """The class model's prediction for a job without exact history, or (None, why not). The
        model is trained from the store when there is none yet, when the thresholds changed, or
        when it is older than ``dfra_model_retrain_s``; ``ranks`` None: from the job's start event
        (0 = unknown)."""
        cfg = self.cfg
        key = cfg.model_dump_json() + self.diag.model_dump_json()
        cached = self._class_model
        if cached is None or cached[1] != key or time.monotonic() - cached[0] >= cfg.dfra_model_retrain_s:
            samples = training_samples(self.store, cfg, self.diag, now_ns, exclude=job_id)
            model, why = ClassModel.fit(samples, cfg, now_ns)
            self._class_model = cached = (time.monotonic(), key, model, why)
        model, why = cached[2], cached[3]
        if model is None:
            return None, why
        if ranks is None:
            ranks = start_ranks(self.store, job_id) if job_id else 0
        return model.predict(JobIdentity(name, user, tuple(command or ()), ranks)), ""

    def _desired_entries(self, jobs: list[str], pins: dict, view: View) -> dict[str, list[str] | None]:
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

    # -- one cycle --------------------------------------------------------------------------------
    def cycle(self, now_ns: int | None = None) -> dict:
        """One control cycle (see the module doc); returns a summary. Raises StoreError. The
        view and Slurm are asked, and the placement pushed, outside the lock claimed hints take."""
        with self._cycle_lock:
            self._reload()
            cfg = self.cfg
            now_ns = time.time_ns() if now_ns is None else now_ns
            t0 = time.monotonic()
            view = self.refresh_view(cfg.http_timeout_s)
            slurm = self._slurm_view()
            with self._lock, self.memo_cycle():
                rows, pins, anomalies, summary = self._cycle(now_ns, view, slurm)
            placement = self._placement(now_ns, pins, anomalies, view) if cfg.placement_enabled else None
            if placement:
                rows.append(placement)
            migrated, waiting = self._migrations(now_ns, pins, anomalies, view)
            rows += migrated
            summary |= {"migrations": len(migrated), "migrations_waiting": waiting}
            self.last = summary | {
                "time_ns": now_ns,
                "duration_s": self.cycle_done(t0),
                "actions": len(rows),
                "failed": sum(1 for r in rows if r["status"] == "failed"),
                "dry_run": cfg.dry_run,
            }
            return self.last

    def _cycle(
        self, now_ns: int, view: View, slurm: tuple[set[str] | None, str]
    ) -> tuple[list[dict], dict, list[dict], dict]:
        """Leases, DFRA, remapping, the mapping push: (action rows, pins, anomalies, summary)."""
        rows: list[dict] = []
        pins = self.pins()
        anomalies = self._anomalies(now_ns)
        rows += self._release(now_ns, slurm)
        active = self._active_jobs(now_ns)
        pending = self._pending_jobs(now_ns)
        jobs = sorted(set(active) | pending)
        decided = self._stored_decisions(jobs)
        expired = self._lease_expired(jobs)
        managed = [j for j in jobs if j not in expired]
        running = {j: r for j, r in active.items() if j not in expired}
        # DFRA for active jobs without a decision
        undecided = sorted(set(active) - set(decided) - set(pins["job"]))
        new_rows = self._dfra_rows(undecided, active, view, now_ns, anomalies)
        # live remapping
        moves, skipped = self._remap(anomalies, managed, pins, view, new_rows, running, now_ns)
        new_rows += [
            (
                dict(
                    kind="remap",
                    job_id=m.job_id,
                    resource="mapping",
                    before=nodes_text(m.nodes_before),
                    after=nodes_text(m.nodes_after),
                    reason=m.reason,
                    evidence=m.evidence | {"skipped": skipped},
                ),
                m.job_id,
            )
            for m in moves
        ]
        # the mapping: new decisions are recorded first so that the desired table includes them
        rows += self._apply_mapping(new_rows, managed, pins, view, now_ns)
        summary = {
            "active_jobs": len(active),
            "pending_jobs": len(pending),
            "lease_expired_jobs": len(expired),
            "decisions": len([a for a, _ in new_rows if a["kind"].startswith("dfra_")]),
            "moves": len(moves),
            "skipped_moves": skipped,
        }
        return rows, pins, anomalies, summary

    def _dfra_rows(
        self, jobs: list[str], active: dict[str, dict], view: View, now_ns: int, anomalies: list[dict]
    ) -> list[tuple[dict, str]]:
        """DFRA decisions of ``jobs`` (active, without a decision or pin; reserved nodes held):
        (action row arguments, job of the mapping entry) each. Their histories are read at once
        first (:meth:`_histories`, kept for the cycle)."""
        new_rows: list[tuple[dict, str]] = []
        self._histories([(j, active[j]["name"], active[j]["user"], list(active[j]["command"] or [])) for j in jobs])
        for job in jobs:
            r = active[job]
            d = self._decide_job(job, r["name"], r["user"], list(r["command"] or []), view, now_ns, True, anomalies)
            new_rows.append(
                (
                    dict(
                        kind=f"dfra_{d.klass}",
                        job_id=job,
                        resource="mapping",
                        before=nodes_text([view.default_node] if view.default_node else []),
                        after=nodes_text(d.nodes),
                        reason=d.reason,
                        evidence=d.evidence,
                    ),
                    job,
                )
            )
        return new_rows

    def _remap(
        self,
        anomalies: list[dict],
        managed: list[str],
        pins: dict,
        view: View,
        new_rows: list[tuple[dict, str]],
        active: dict[str, dict],
        now_ns: int,
    ) -> tuple[list[Move], list[dict]]:
        """(moves, skipped moves) for the current interference events on forwarding nodes, against
        the mapping as it will be after this cycle's new decisions (``new_rows``)."""
        cfg = self.cfg
        moves: list[Move] = []
        skipped: list[dict] = []
        if not (cfg.remap_enabled and cfg.remap_max_moves_per_cycle > 0):
            return moves, skipped
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
        if not events:
            return moves, skipped
        cur_map = self._desired_entries(managed, pins, view)
        mount_map = next((m for m in view.mount_maps.values() if m is not None), {})
        mapping = {j: v for j, v in mount_map.items()}
        mapping.update({j: v for j, v in cur_map.items() if v is not None})
        for nr in new_rows:
            a = nr[0]["after"].split(",") if nr[0]["after"] else []
            if a:
                mapping[nr[1]] = a
        jobs_ev = sorted({e.victim for e in events} | {e.culprit for e in events})
        last = self._last_moves(jobs_ev)
        _, job_load = self._loads(now_ns)
        return plan_moves(
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

    def _apply_mapping(
        self, new_rows: list[tuple[dict, str]], managed: list[str], pins: dict, view: View, now_ns: int
    ) -> list[dict]:
        """Record this cycle's new decisions and push the mapping they make with the stored ones
        and the pins (ended jobs' entries dropped); a ``sync`` row when only a re-push happened.
        Dry run: recorded, nothing pushed. Returns the action rows."""
        if self.cfg.dry_run:
            return self._record_many(now_ns, [args for args, _ in new_rows], "recorded")
        rows = []
        desired = self._desired_entries(managed, pins, view)
        for args, job in new_rows:
            nodes = [n for n in args["after"].split(",") if n]
            desired[job] = None if not nodes or nodes == [view.default_node] else nodes
        mapped = sorted({j for m in view.mount_maps.values() if m for j in m})
        drop = (self._ended(mapped) | self._lease_expired(mapped)) - set(pins["job"])
        job_nodes = self._job_nodes(sorted(j for j, v in desired.items() if v and len(v) > 1))
        results = self._push_mapping(view, desired, drop, now_ns, force=bool(new_rows), job_nodes=job_nodes)
        failed = [r for r in results if not r.ok]
        err = "; ".join(f"{r.url}: {r.error}" for r in failed)
        urls = [r.url for r in results]
        rows += self._record_many(now_ns, [args for args, _ in new_rows], "failed" if failed else "applied", err, urls)
        if not new_rows and any(r.changed for r in results):
            pushed = [r for r in results if r.changed and r.error != "in back-off after a failed push"]
            if pushed:
                rows.append(
                    self._record(
                        now_ns,
                        "sync",
                        "",
                        "mapping",
                        "",
                        json.dumps({j: v for j, v in desired.items()}, separators=(",", ":")),
                        "re-push of the decided mapping (earlier push failed, an ended or lease-expired job's "
                        "entry dropped, a pin changed, or a mount restarted)",
                        {"dropped": sorted(drop)},
                        "failed" if failed else "applied",
                        err,
                        [r.url for r in pushed],
                    )
                )
        return rows

    def _placement(self, now_ns: int, pins: dict, anomalies: list[dict], view: View) -> dict | None:
        cfg = self.cfg
        eps = self.endpoints
        if not eps.daemons:
            return None
        docs, errors, targets = self._daemon_placements(eps, view.down)
        if not targets:
            targets = self._targets_seen(now_ns - int(cfg.placement_window_s * 1e9))
        if not targets:
            return None
        base = next((d for d in docs.values() if d is not None), {})
        measured = measure_targets(
            self.store, now_ns - int(cfg.placement_window_s * 1e9), now_ns, cfg.placement_quantile
        )
        slow = {a["node"] for a in anomalies if a["kind"] == "fail_slow_target"}
        last = self._last_failslow(now_ns - int((cfg.placement_quiet_s + cfg.anomaly_max_age_s) * 1e9), now_ns)
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
        results = self._push_placement(eps, out_of_sync, docs, errors, doc, now_ns)
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

    def status(self) -> dict:
        return {
            "period_s": self.period_s,
            "cycles": self.cycles,
            "dry_run": self.cfg.dry_run,
            "endpoints": {"mounts": self.endpoints.mounts, "daemons": self.endpoints.daemons},
            "last": self.last,
        }
