"""Leases of reserved (dedicated) forwarding nodes: a node DFRA hands to a job is held while
something says the job runs, and returned when nothing has for ``[control] lease_s``.

Why: a node used to be returned only at the job's end event; when that event was lost (the
API down while the Slurm epilog ran), the node stayed held forever. Now every allocation row
(``control_allocations``, migration 013) carries ``lease_until``:

* **Claim**: a claimed hint (``POST /v1/hints/jobs/{id}``) or a cycle's DFRA decision holds
  the node until ``now + reservation_start_grace_s``: the job has that long to start.
* **Renewal**, each control cycle, to ``t + lease_s`` for the newest ``t`` among: the job's
  start event; its newest I/O record stored (``io_requests``, any layer, request start time,
  within the last ``lease_s``); and, with ``lease_slurm``, now when Slurm (``squeue``) lists
  the job in a state other than an ended one (pending, running, suspended, completing...).
* **Return**: an end event returns the node at once (``release``); a job that never started
  within the grace is returned as before (``release``); a started job whose lease ran out
  (no renewal for ``lease_s``) is returned with a ``lease_expired`` action (the audit trail,
  ``GET /v1/control/actions?kind=lease_expired``), and its mapping entry is dropped from the
  mounts: the job goes back to the default mapping, the node to the reserved set.

A job that runs without any I/O for longer than ``lease_s`` and without Slurm configured
loses its dedicated node (it keeps running on the default mapping): set ``lease_slurm`` at a
Slurm site, or a longer ``lease_s``. Dry run (``[control] dry_run``) holds nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from pharos_core.store import ns_to_datetime64

from .state import MAPPING_KINDS

LEASES_SQL = """
SELECT node, job_id, reason, toUnixTimestamp64Nano(since) AS since_ns, toUnixTimestamp64Nano(lease_until) AS lease_ns
FROM control_allocations FINAL WHERE job_id != ''
"""
#: Per job: its first start event (ns), whether it started and ended.
JOB_EVENTS_SQL = """
SELECT job_id, toUnixTimestamp64Nano(minIf(time, kind = 'start')) AS start_ns,
       countIf(kind = 'start') AS started, countIf(kind = 'end') AS ended
FROM job_events FINAL WHERE job_id IN {jobs:Array(String)} GROUP BY job_id
"""
#: Per job: the start time (ns) of its newest request in ``(since, until]`` (io_requests is
#: ordered by job first: one range per job).
LAST_RECORD_SQL = """
SELECT job_id, toUnixTimestamp64Nano(max(start)) AS t_ns FROM io_requests
WHERE job_id IN {jobs:Array(String)} AND start > {since:DateTime64(9)} AND start <= {until:DateTime64(9)}
GROUP BY job_id
"""
#: Slurm job states (squeue %T) of a job that no longer runs; any other listed state renews.
SLURM_ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
#: A Slurm job id (the SPANK plugin sends Slurm's id as the job id): 123, or 123_4 for an array task.
SLURM_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


def slurm_alive(jobs: list[str], squeue: str, timeout_s: float) -> tuple[set[str] | None, str]:
    """Which of ``jobs`` Slurm lists as not ended: ``squeue --noheader --format='%i %T'
    --jobs=...`` (``squeue``: a name on PATH or a path; the environment's ``SLURM_CONF``).

    Returns (job ids pending, running, suspended or completing; '') or (None, why Slurm could
    not say: squeue missing, failed, timed out). Job ids that are not Slurm's (not digits) are
    never asked; a squeue that knows none of the ids (``Invalid job id``) is an empty set."""
    ids = sorted({j for j in jobs if SLURM_JOB_ID.match(j)})
    if not ids:
        return set(), ""
    exe = shutil.which(squeue)
    if exe is None:
        return None, f"{squeue} not found on PATH"
    argv = [exe, "--noheader", "--format=%i %T", "--jobs=" + ",".join(ids)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"squeue did not answer within {timeout_s:g} s"
    except OSError as exc:
        return None, f"squeue: {exc}"
    if r.returncode != 0:
        if "Invalid job id" in r.stderr:
            return set(), ""
        return None, f"squeue exit {r.returncode}: {r.stderr.strip()[:200]}"
    alive = set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] not in SLURM_ENDED:
            alive.add(parts[0])
    return alive, ""


class Leases:
    """The reservation half of :class:`~pharos_analytics.control.loop.ControlLoop`: holding,
    renewing and returning reserved nodes. Uses the loop's ``store``, ``cfg``, ``_q`` and
    ``_record``."""

    def _hold(
        self,
        nodes: list[str],
        job_id: str,
        reason: str,
        now_ns: int,
        since_ns: int | None = None,
        lease_until_ns: int | None = None,
    ) -> None:
        """Allocation rows: ``nodes`` held by ``job_id`` ('' : returned) since ``since_ns``
        (default now) until ``lease_until_ns`` (default now + ``reservation_start_grace_s`` for
        a job, 0 for a returned node)."""
        if lease_until_ns is None:
            lease_until_ns = now_ns + int(self.cfg.reservation_start_grace_s * 1e9) if job_id else 0
        # a returned node's lease_until is the column's default, the epoch (omitted: "0.000000000"
        # does not parse as a DateTime64)
        lease = {"lease_until": ns_to_datetime64(lease_until_ns)} if lease_until_ns > 0 else {}
        self.store.insert_rows(
            "control_allocations",
            [
                {
                    "node": n,
                    "job_id": job_id,
                    "since": ns_to_datetime64(now_ns if since_ns is None else since_ns),
                    "reason": reason,
                    "updated": ns_to_datetime64(now_ns),
                }
                | lease
                for n in nodes
            ],
        )
        self._allocations_changed()

    def _slurm_view(self) -> tuple[set[str] | None, str]:
        """Slurm's answer for the jobs holding reserved nodes (:func:`slurm_alive`); (None,
        'lease_slurm off') when not configured. Called outside the loop's lock."""
        cfg = self.cfg
        if not cfg.lease_slurm:
            return None, "lease_slurm off"
        jobs = sorted({r["job_id"] for r in self._q(LEASES_SQL)})
        return slurm_alive(jobs, cfg.slurm_squeue, cfg.slurm_timeout_s) if jobs else (set(), "")

    def _release(self, now_ns: int, slurm: tuple[set[str] | None, str] = (None, "")) -> list[dict]:
        """Renew the leases of reserved nodes, return those of ended jobs, of hinted jobs that
        never started, and of jobs whose lease expired (see the module doc); ``slurm``:
        :meth:`_slurm_view`. Returns the action rows (``release``, ``lease_expired``)."""
        cfg = self.cfg
        held = self._q(LEASES_SQL)
        if not held:
            return []
        jobs = sorted({r["job_id"] for r in held})
        lease = int(cfg.lease_s * 1e9)
        grace = int(cfg.reservation_start_grace_s * 1e9)
        events = {r["job_id"]: r for r in self._q(JOB_EVENTS_SQL, jobs=jobs)}
        records = {
            r["job_id"]: int(r["t_ns"])
            for r in self._q(
                LAST_RECORD_SQL, jobs=jobs, since=ns_to_datetime64(now_ns - lease), until=ns_to_datetime64(now_ns)
            )
        }
        alive, slurm_error = slurm
        step = int(max(cfg.period_s, 1.0) * 1e9)
        rows = []
        for r in sorted(held, key=lambda r: r["node"]):
            node, job, since = r["node"], r["job_id"], int(r["since_ns"])
            stored = int(r["lease_ns"]) or since + grace  # rows from before leases: the start grace
            ev = events.get(job)
            started = bool(ev and int(ev["started"]))
            # the claim's lease (the start grace) ends when the job starts: renewals only from then on
            claim = stored == since + grace
            renewal = {}
            if started:
                renewal["start_event"] = int(ev["start_ns"])
            if job in records:
                renewal["io_record"] = records[job]
            if alive is not None and job in alive:
                renewal["slurm"] = now_ns
            base = 0 if started and claim else stored
            renewed = max([base] + [t + lease for t in renewal.values()])
            if ev and int(ev["ended"]):
                kind, why = "release", f"job {job} ended"
            elif now_ns <= renewed:
                if renewed - stored >= step or (started and claim and renewed != stored):
                    self._hold([node], job, r["reason"], now_ns, since_ns=since, lease_until_ns=renewed)
                continue
            elif not started:
                kind = "release"
                why = f"job {job} did not start within {cfg.reservation_start_grace_s:g} s of its hint"
            else:
                kind = "lease_expired"
                why = (
                    f"lease of job {job} on {node} expired: no start event, I/O record"
                    f"{' or Slurm report' if cfg.lease_slurm else ''} of it in the last {cfg.lease_s:g} s"
                )
            self._hold([node], "", why, now_ns)
            evidence = {
                "node": node,
                "since_ns": since,
                "lease_until_ns": renewed,
                "lease_s": cfg.lease_s,
                "renewal_ns": renewal,
                "slurm": sorted(alive) if alive is not None else slurm_error,
            }
            rows.append(self._record(now_ns, kind, job, f"node:{node}", node, "", why, evidence, "recorded"))
        return rows

    def _lease_expired(self, jobs: list[str]) -> set[str]:
        """Those of ``jobs`` whose newest mapping action is a ``lease_expired`` (no newer decision
        or remap): the loop no longer manages their mapping entry."""
        if not jobs:
            return set()
        got = self._stored_decisions(jobs, (*MAPPING_KINDS, "lease_expired"))
        return {j for j, d in got.items() if d["kind"] == "lease_expired"}
