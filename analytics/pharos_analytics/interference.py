"""Interference between jobs on shared forwarding nodes and storage targets (Pharos).

Input: forwarder-layer ``io_requests`` only (``job_id``, ``forwarding_node``, ``target``,
``start`` = arrival, ``duration_ns`` = service time, ``queue_wait_ns``, ``bytes``, ``count``).
Time is cut into windows of ``interference_window_s`` aligned on the epoch. In each window a
job *shares* a resource (a forwarding node or a target it used) when another job used it in
the same window; a window in which no other job touched any of its resources is *quiet*.

For each shared window the job's mean latency per request (queue wait + service, ns) is
compared with its baseline: the median over its own quiet windows, or, when it had none,
over the quiet windows of the most recent earlier run of the same job name
(``job_events.name``), or, failing both (a busy system leaves no job alone on its targets),
over its *least shared* windows (the quarter with the fewest co-located bytes on its
resources). A window is interfered when the latency rose by at least
``interference_latency_ratio`` x and ``interference_min_added_ms``. The likely culprit is
the co-located job with the most bytes (then requests) on one of the job's resources in that
window beyond what it already moved there in the baseline windows (so a steady background
job is not blamed for a newcomer), and that resource is named. Only resources whose kind of wait
carries the rise are candidates (``interference_mechanism_share`` of it, 0.5): queue wait for a
forwarding node (another job holds its workers), service time for a target (another job's bytes
take its bandwidth); a job slowed by its own slow target (service time up, no queue wait) blames
no forwarding node it happens to share. And the culprit must have occupied the resource: the sum of its
requests' service times there is at least ``interference_min_occupancy`` (0.1) of the window
(on average 0.1 of its requests in service): a few metadata requests cannot hold a node. Interfered windows with the
same culprit, consecutive or one window apart, merge into one event; its resource is the one
where the culprit moved the most over the event.

Cost: with whole-second windows (the default is 60 s) and a range inside the last 7 days the
window sums come from the per-second rollup ``io_rollup_1s`` (migration 009), so a detection
cycle grows with seconds x (job, forwarding node, target), not with records; the same sums, and
so the same events, as the raw records over whole seconds (tested). Earlier runs of a job name
are found in ``io_rollup_1m``.

Units: ns in the fields ending ``_ns``, ms in those ending ``_ms``, bytes, ratios dimensionless.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Literal

from pharos_core.store import Store

from .diagnosis_config import DiagnosisConfig
from .interference_sql import (
    JOB_NAME_SQL,
    JOB_NAMES_SQL,
    JOB_SPAN_SQL,
    JOB_SPANS_SQL,
    PREVIOUS_RUNS_BY_NAME_SQL,
    PREVIOUS_RUNS_SQL,
)
from .interference_usage import (
    ReadFrom,
    UsageCache,
    _co_bytes,
    _JobWindows,
    _others,
    _resources,
    _usage,
    _Windows,
)


@dataclass
class InterferenceEvent:
    """A job slowed by co-located jobs on a shared forwarding node or target (Pharos)."""

    job_id: str
    culprit_job: str
    resource_type: Literal["forwarding_node", "target"]
    resource: str
    start_ns: int
    end_ns: int
    windows: int
    latency_ms: float  # mean per request (queue wait + service) in the interfered windows
    baseline_latency_ms: float
    latency_ratio: float
    queue_wait_ms: float
    baseline_queue_wait_ms: float
    queue_wait_ratio: float | None
    service_ms: float
    baseline_service_ms: float
    culprit_bytes: int  # on the shared resource, in the interfered windows
    culprit_requests: int
    job_bytes_on_resource: int
    co_located: list[str]
    baseline_source: str  # 'quiet_windows' | 'previous_run:<job_id>' | 'least_shared_windows'
    baseline_windows: int
    severity: Literal["critical", "warning"]
    active: bool = False  # the last interfered window is the newest window of the detection range
    detected_ns: int = 0
    rule_source: str = "Pharos (quiet-window baseline, culprit = largest co-located bytes on the shared resource)"
    evidence: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"interference:{self.job_id}:{self.culprit_job}:{self.resource_type}:{self.resource}"

    def to_dict(self) -> dict:
        return asdict(self) | {"key": self.key}


def _baseline_of(jobw, job: str, ws: list[int]) -> dict:
    ss = [jobw[(job, w)] for w in ws]
    return {
        "lat_ns": median((s["svc_ns"] + s["qw_ns"]) / s["n"] for s in ss),
        "qw_ns": median(s["qw_ns"] / s["n"] for s in ss),
        "svc_ns": median(s["svc_ns"] / s["n"] for s in ss),
        "windows": len(ss),
        "w": ws,
    }


def _quiet_baseline(by_w, jobw, job: str, cfg: DiagnosisConfig) -> dict | None:
    quiet = [
        w
        for w in jobw.windows(job)
        if jobw[(job, w)]["n"] >= cfg.interference_min_requests and not by_w.shared.get((job, w), False)
    ]
    return _baseline_of(jobw, job, quiet) if quiet else None


def _least_shared_baseline(by_w, jobw, job: str, cfg: DiagnosisConfig) -> dict | None:
    """The job's windows with the least co-located bytes (bottom quarter, at least 2 windows): a
    busy system leaves no job alone on its targets."""
    ws = sorted(
        (_co_bytes(by_w, job, w), w) for w in jobw.windows(job) if jobw[(job, w)]["n"] >= cfg.interference_min_requests
    )
    if len(ws) < 4:
        return None
    cut = ws[max(1, len(ws) // 4) - 1][0]
    low = [w for b, w in ws if b <= cut]
    return _baseline_of(jobw, job, sorted(low)) if len(low) >= 2 else None


@dataclass
class _Lookups:
    """What one detection pass looks up once for all its jobs: names, exact spans, and the window
    sums it already loaded for ``[since, until)`` (a previous run whose whole windows lie in that
    range is judged from them, with the same numbers a query of its own span would give).
    ``read_ahead``: read the spans of the runs that may precede the range's jobs in one query (a
    pass over many jobs); off for one job, whose search reads a span or two, newest first."""

    store: Store
    since_ns: int
    until_ns: int
    by_w: dict
    jobw: dict
    read_ahead: bool = True
    names: dict[str, str] = field(default_factory=dict)
    spans: dict[str, dict | None] = field(default_factory=dict)
    runs_by_name: dict[str, list[dict]] = field(default_factory=dict)

    def runs(self, name: str) -> list[dict]:
        """Every run of ``name`` with forwarder requests: job_id, last_minute (s), newest first."""
        if name not in self.runs_by_name:
            self.runs_by_name[name] = self.store.query(PREVIOUS_RUNS_SQL, {"name": name})
            self._read_ahead(self.runs_by_name[name])
        return self.runs_by_name[name]

    def prefetch_runs(self, names: list[str]) -> None:
        """The runs of all ``names`` (:meth:`runs`) in one query, and their spans read ahead in
        one more: a pass over 2,000 jobs asked ~1 s of queries name by name."""
        names = sorted({n for n in names if n and n not in self.runs_by_name})
        if not names:
            return
        got: dict[str, list[dict]] = {n: [] for n in names}
        for r in self.store.query(PREVIOUS_RUNS_BY_NAME_SQL, {"names": names}):
            got[r["name"]].append({"job_id": r["job_id"], "last_minute": r["last_minute"]})
        self.runs_by_name |= got
        self._read_ahead([r for runs in got.values() for r in runs])

    def _read_ahead(self, runs: list[dict]) -> None:
        # the exact spans of the runs that can precede this range's jobs (ended in the hour
        # before it or inside it), in one query by job id; without a range, one by one as asked
        near = sorted(
            {
                r["job_id"]
                for r in runs
                if self.read_ahead
                and self.since_ns - 3_600_000_000_000 <= int(r["last_minute"]) * 1_000_000_000 < self.until_ns
                and r["job_id"] not in self.spans
            }
        )
        if near:
            got = {r["job_id"]: r for r in self.store.query(JOB_SPANS_SQL, {"jobs": near})}
            self.spans |= {j: got.get(j) for j in near}

    def name(self, job: str) -> str:
        if job not in self.names:
            rows = self.store.query(JOB_NAME_SQL, {"job_id": job})
            self.names[job] = rows[0]["name"] if rows else ""
        return self.names[job]

    def prefetch_names(self, jobs: list[str]) -> None:
        if jobs:
            found = {r["job_id"]: r["name"] for r in self.store.query(JOB_NAMES_SQL, {"jobs": jobs})}
            self.names |= {j: found.get(j, "") for j in jobs}

    def span(self, job: str) -> dict | None:
        if job not in self.spans:
            rows = self.store.query(JOB_SPAN_SQL, {"job_id": job})
            self.spans[job] = rows[0] if rows and int(rows[0]["n"]) > 0 else None
        return self.spans[job]


def _previous_run_baseline(
    store: Store,
    job: str,
    before_ns: int,
    cfg: DiagnosisConfig,
    read_from: ReadFrom = "auto",
    seen: _Lookups | None = None,
) -> tuple[dict, str] | None:
    seen = seen or _Lookups(store, 0, 0, {}, _JobWindows())
    name = seen.name(job)
    if not name:
        return None
    prev = None
    cands = [c for c in seen.runs(name) if c["job_id"] != job and int(c["last_minute"]) * 1_000_000_000 < before_ns]
    for cand in cands:
        if prev is not None and (int(cand["last_minute"]) + 60) * 1_000_000_000 <= int(prev["last_ns"]):
            break  # this and every later candidate ended before the run already found
        span = [seen.span(cand["job_id"])] if seen.span(cand["job_id"]) else []
        ok = span and int(span[0]["n"]) > 0 and int(span[0]["last_ns"]) < before_ns
        if ok and (prev is None or int(span[0]["last_ns"]) > int(prev["last_ns"])):
            prev = span[0] | {"job_id": cand["job_id"]}
    if prev is None:
        return None
    pj = prev["job_id"]
    win_ns = int(cfg.interference_window_s * 1e9)
    first, last = int(prev["first_ns"]), int(prev["last_ns"])
    since, until = first // win_ns * win_ns, (last // win_ns + 1) * win_ns
    if seen.by_w and since >= seen.since_ns and until <= seen.until_ns:
        by_w, jobw = seen.by_w, seen.jobw  # its whole windows are already loaded
    else:
        occ = int(cfg.interference_min_occupancy * win_ns)  # its quiet windows need no usage
        by_w, jobw = _usage(store, since, until, win_ns, read_from=read_from, min_occupancy_ns=occ)
    b = _quiet_baseline(by_w, jobw, pj, cfg)
    return (b, f"previous_run:{pj}") if b else None


class _Usual(dict):
    """What each co-located job already moved on each of ``job``'s resources in the baseline
    windows ``ws``, bytes per window (0 when the baseline was quiet: ``ws`` empty); (job,
    resource) -> bytes, summed when first asked (a detection asks for the candidates of its
    interfered windows only, not for every job of every resource)."""

    def __init__(self, by_w: _Windows, job: str, ws: list[int]) -> None:
        super().__init__()
        self.by_w, self.job, self.ws = by_w, job, ws

    def get(self, key: tuple[str, tuple[str, str]], default: float = 0.0) -> float:
        if key not in self:
            o, res = key
            tot = 0.0
            for w in self.ws:
                jobs = self.by_w[w].get(res, {})
                if self.job in jobs and o in jobs:
                    tot += jobs[o]["bytes"] / len(self.ws)
            self[key] = tot
        return self[key]


def _events_for(
    store,
    by_w,
    jobw,
    job: str,
    cfg: DiagnosisConfig,
    win_ns: int,
    last_w: int | None,
    now_ns: int,
    read_from: ReadFrom = "auto",
    seen: _Lookups | None = None,
) -> list[InterferenceEvent]:
    base = _quiet_baseline(by_w, jobw, job, cfg)
    source = "quiet_windows"
    if base is None:
        first_w = jobw.windows(job)[0]
        prev = _previous_run_baseline(store, job, first_w * win_ns, cfg, read_from, seen)
        if prev is not None:
            base, source = prev
        else:
            base, source = _least_shared_baseline(by_w, jobw, job, cfg), "least_shared_windows"
            if base is None:
                return []
    usual = _Usual(by_w, job, base["w"] if source == "least_shared_windows" else [])
    hits = []  # (w, culprit, res, stats)
    for w in jobw.windows(job):
        s = jobw[(job, w)]
        if s["n"] < cfg.interference_min_requests or not by_w.shared.get((job, w), False):
            continue
        lat = (s["svc_ns"] + s["qw_ns"]) / s["n"]
        if (
            lat < cfg.interference_latency_ratio * base["lat_ns"]
            or lat - base["lat_ns"] < cfg.interference_min_added_ms * 1e6
        ):
            continue
        # which kind of resource the rise points at: queue wait -> a forwarding node's workers,
        # service time -> a target's bandwidth (interference_mechanism_share of the rise)
        d_lat = lat - base["lat_ns"]
        kinds = {
            k
            for k, d in (
                ("forwarding_node", s["qw_ns"] / s["n"] - base["qw_ns"]),
                ("target", s["svc_ns"] / s["n"] - base["svc_ns"]),
            )
            if d >= cfg.interference_mechanism_share * d_lat
        }
        best = None
        for res in _resources(by_w, job, w):
            if res[0] not in kinds:
                continue
            for o, st in by_w[w][res].items():
                if o == job or st["svc_ns"] < cfg.interference_min_occupancy * win_ns:
                    continue  # it barely used the resource in the window
                cand = (st["bytes"] - usual.get((o, res), 0.0), st["n"], o, res)
                if res[0] == "target" and cand[0] <= 0:
                    continue  # a target's bandwidth is taken by bytes
                if best is None or cand[:2] > best[:2]:
                    best = cand
        if best is None:
            continue
        hits.append((w, best[2], best[3], s, _others(by_w, job, w)))
    events: list[InterferenceEvent] = []
    run: list = []

    def flush():
        if not run:
            return
        culprit = run[0][1]
        moved: dict[tuple[str, str], int] = {}  # the culprit's bytes per shared resource over the run
        kinds = {h[2][0] for h in run}  # the kinds of resource the rise pointed at
        for h in run:
            for r_ in _resources(by_w, job, h[0]):
                if r_[0] in kinds and culprit in by_w[h[0]][r_]:
                    moved[r_] = moved.get(r_, 0) + by_w[h[0]][r_][culprit]["bytes"] - int(usual.get((culprit, r_), 0.0))
        res = max(moved, key=lambda r_: (moved[r_], r_[0] == "forwarding_node"))
        n = sum(h[3]["n"] for h in run)
        svc = sum(h[3]["svc_ns"] for h in run) / n
        qw = sum(h[3]["qw_ns"] for h in run) / n
        lat = svc + qw
        ratio = lat / base["lat_ns"] if base["lat_ns"] > 0 else float("inf")
        cb = sum(by_w[h[0]][res][culprit]["bytes"] for h in run if culprit in by_w[h[0]].get(res, {}))
        cn = sum(by_w[h[0]][res][culprit]["n"] for h in run if culprit in by_w[h[0]].get(res, {}))
        jb = sum(by_w[h[0]][res][job]["bytes"] for h in run if job in by_w[h[0]].get(res, {}))
        co = sorted(set().union(*(h[4] for h in run)))
        events.append(
            InterferenceEvent(
                job_id=job,
                culprit_job=culprit,
                resource_type=res[0],
                resource=res[1],
                start_ns=run[0][0] * win_ns,
                end_ns=(run[-1][0] + 1) * win_ns,
                windows=len(run),
                latency_ms=round(lat / 1e6, 3),
                baseline_latency_ms=round(base["lat_ns"] / 1e6, 3),
                latency_ratio=round(ratio, 2),
                queue_wait_ms=round(qw / 1e6, 3),
                baseline_queue_wait_ms=round(base["qw_ns"] / 1e6, 3),
                queue_wait_ratio=round(qw / base["qw_ns"], 2) if base["qw_ns"] > 0 else None,
                service_ms=round(svc / 1e6, 3),
                baseline_service_ms=round(base["svc_ns"] / 1e6, 3),
                culprit_bytes=cb,
                culprit_requests=cn,
                job_bytes_on_resource=jb,
                co_located=co,
                baseline_source=source,
                baseline_windows=base["windows"],
                severity="critical" if ratio >= 3 else "warning",
                active=last_w is not None and run[-1][0] >= last_w - 1,
                detected_ns=now_ns,
                evidence={
                    "window_s": cfg.interference_window_s,
                    "requests": n,
                    "per_window": [
                        {
                            "start_ns": h[0] * win_ns,
                            "latency_ms": round((h[3]["svc_ns"] + h[3]["qw_ns"]) / h[3]["n"] / 1e6, 3),
                            "requests": h[3]["n"],
                        }
                        for h in run
                    ][:50],
                },
            )
        )
        run.clear()

    for h in hits:  # one event per culprit and run of windows (one quiet window may separate them)
        if run and (h[0] > run[-1][0] + 2 or h[1] != run[0][1]):
            flush()
        run.append(h)
    flush()
    return events


def detect_interference(
    store: Store,
    cfg: DiagnosisConfig | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
    job_ids: list[str] | None = None,
    read_from: ReadFrom = "auto",
    cache: UsageCache | None = None,
) -> list[InterferenceEvent]:
    """Interference events of every job with forwarder-layer requests in ``[since, until)`` (ns since
    the epoch; default: the whole windows of the last ``interference_lookback_s`` up to now), or of ``job_ids`` only
    (their co-located jobs are still read). ``active``: the event reaches the newest complete window.
    ``read_from``: see :func:`reads_rollup`. ``cache``: the settled windows kept between calls
    (the periodic detection: :class:`~pharos_analytics.interference_usage.UsageCache`, its
    ``settle_ns`` set from ``interference_settle_s``). Only the resources some job occupied
    (``interference_min_occupancy``) are read per job: culprits are found on those only, and an
    event's ``co_located`` names the jobs on them. Raises StoreError."""
    cfg = cfg or DiagnosisConfig()
    now_ns = time.time_ns()
    until_ns = now_ns if until_ns is None else until_ns
    win_ns = int(cfg.interference_window_s * 1e9)
    if since_ns is None:  # the look-back from its first whole window (a partial one is no baseline)
        since_ns = -(-(until_ns - int(cfg.interference_lookback_s * 1e9)) // win_ns) * win_ns
    if cache is not None:
        cache.settle_ns = int(cfg.interference_settle_s * 1e9)
    occ = int(cfg.interference_min_occupancy * win_ns)
    by_w, jobw = _usage(store, since_ns, until_ns, win_ns, None, read_from, occ, cache)
    last_w = (until_ns - 1) // win_ns
    jobs = sorted(jobw.of) if job_ids is None else [j for j in job_ids if j in jobw.of]
    seen = _Lookups(store, since_ns, until_ns, by_w, jobw)
    seen.prefetch_names(jobs)
    seen.prefetch_runs([seen.names[j] for j in jobs])
    out: list[InterferenceEvent] = []
    for j in jobs:
        out += _events_for(store, by_w, jobw, j, cfg, win_ns, last_w, until_ns, read_from, seen)
    return out


def job_interference(
    store: Store, job_id: str, cfg: DiagnosisConfig | None = None, read_from: ReadFrom = "auto"
) -> dict:
    """A job's interference over its whole forwarder-layer span: events, and per window the
    jobs that shared its forwarding nodes or targets. Empty when the job has no such rows."""
    cfg = cfg or DiagnosisConfig()
    span = store.query(JOB_SPAN_SQL, {"job_id": job_id})
    if not span or int(span[0]["n"]) == 0:
        return {
            "job_id": job_id,
            "window_s": cfg.interference_window_s,
            "events": [],
            "shared_windows": [],
            "note": "no forwarder-layer requests for this job",
        }
    win_ns = int(cfg.interference_window_s * 1e9)
    first, last = int(span[0]["first_ns"]), int(span[0]["last_ns"])
    since, until = first // win_ns * win_ns, (last // win_ns + 1) * win_ns
    by_w, jobw = _usage(store, since, until, win_ns, read_from=read_from)
    seen = _Lookups(store, since, until, by_w, jobw, read_ahead=False)
    events = _events_for(store, by_w, jobw, job_id, cfg, win_ns, None, time.time_ns(), read_from, seen)
    shared = []
    for w in jobw.windows(job_id):
        s = jobw[(job_id, w)]
        shared.append(
            {
                "start_ns": w * win_ns,
                "requests": s["n"],
                "bytes": s["bytes"],
                "latency_ms": round((s["svc_ns"] + s["qw_ns"]) / max(s["n"], 1) / 1e6, 3),
                "queue_wait_ms": round(s["qw_ns"] / max(s["n"], 1) / 1e6, 3),
                "shared": [
                    {
                        "resource_type": res[0],
                        "resource": res[1],
                        "jobs": {o: st["bytes"] for o, st in by_w[w][res].items() if o != job_id},
                    }
                    for res in _resources(by_w, job_id, w)
                    if len(by_w[w][res]) > 1
                ],
            }
        )
    return {
        "job_id": job_id,
        "window_s": cfg.interference_window_s,
        "events": [e.to_dict() for e in events],
        "shared_windows": shared,
        "note": "",
    }
