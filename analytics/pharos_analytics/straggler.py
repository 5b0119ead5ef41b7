"""Straggler attribution: which storage target, forwarding node or compute node the slow files
(and their ranks) of a job have in common.

Method: TOKIO's ``darshan_bad_ost`` (NERSC pytokio, ``tokio/cli/darshan_bad_ost.py``): each
file of the job is one observation with its performance (bytes / the longest I/O time any
rank spent on it, TOKIO's ``estimate_darshan_perf``) and, per resource, the share of the
file on it (1/k for a file striped over k OSTs, TOKIO's OST columns). The Pearson correlation
of performance with each resource's column says whether files on that resource are slower;
TOKIO flags "this OST looks unhealthy" at a coefficient <= -0.5 with p < 0.05. Pharos
correlates log10(performance) (file bandwidths span orders of magnitude; one huge fast file
would otherwise dominate Pearson's r) and adds two guards:

* effect size (Beacon NSDI'19 §5.3's 0.5 bandwidth ratio): the resource's median file
  performance is at most 1 / ``straggler_min_ratio`` of its peers' median;
* identifiability (Pharos): at least ``straggler_min_files`` files on the resource and on
  its peers, each moving at least ``straggler_min_file_bytes``: with one file per resource a
  slow file and a slow resource cannot be told apart, and a few tiny requests measure
  latency (locks, opens), not the resource.

Sources of observations:

* ``counters`` (a Darshan log): POSIX records grouped by file; resource ``ost`` from the
  LUSTRE module (``LUSTRE_OST_ID_<id>`` counters written by the importer).
* ``dxt`` (a Darshan log with DXT segments of files striped over several OSTs): each DXT
  request is mapped to the OST that holds its first byte (the file's LUSTRE layout: component
  by extent, stripe index = (offset - extent start) / stripe size mod stripe count, the
  component's OST list); one observation per (file, OST): bytes and TOKIO's time (the longest
  summed request time of one rank on that part). A slow OST then stands out even when every file
  is striped over every OST, where the per-file columns carry no contrast. A request that
  crosses a stripe boundary is counted on its first stripe's OST.
* ``trace`` (live jobs): forwarder-layer ``io_requests`` of the job grouped by file:
  performance = bytes / summed request duration (queue wait excluded: ``duration_ns`` is the
  daemon's service time); resources ``target``, ``forwarding_node`` and ``compute_node``.

A blamed resource becomes an insight (``straggler_resource``, see
:mod:`pharos_analytics.insights`) and, through :func:`record_straggler_anomalies`, an
``anomalies`` row of kind ``straggler_resource`` (``GET /v1/anomalies``, ``pharos anomalies``).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Literal

from pharos_core.store import Store, ns_to_datetime64

from .diagnosis_config import DiagnosisConfig
from .pattern import SYSTEM_PATH_REGEX, is_system_path
from .replays_sql import counted_once

ResourceType = Literal["ost", "target", "forwarding_node", "compute_node"]
ANOMALY_KIND = "straggler_resource"

#: Per file of a Darshan job: bytes, TOKIO's time (longest I/O time of one record), ranks, OSTs.
COUNTER_FILES_SQL = """
SELECT record_id, any(path) AS path,
       sumIf(value, counter IN ('POSIX_BYTES_READ', 'POSIX_BYTES_WRITTEN')) AS bytes,
       groupUniqArray(rank) AS ranks, any(log_id) AS log_id
FROM darshan_counters
WHERE job_id = {job_id:String} AND module = 'POSIX'
GROUP BY record_id
"""
COUNTER_TIMES_SQL = """
SELECT record_id, max(t) AS time_s FROM (
    SELECT record_id, rank, log_id,
           sumIf(value, counter IN ('POSIX_F_READ_TIME', 'POSIX_F_WRITE_TIME', 'POSIX_F_META_TIME')) AS t
    FROM darshan_counters WHERE job_id = {job_id:String} AND module = 'POSIX'
    GROUP BY record_id, rank, log_id)
GROUP BY record_id
"""
COUNTER_OSTS_SQL = """
SELECT record_id, groupUniqArray(toUInt32(substring(counter, 15))) AS osts
FROM darshan_counters
WHERE job_id = {job_id:String} AND module = 'LUSTRE' AND startsWith(counter, 'LUSTRE_OST_ID_')
GROUP BY record_id
"""
LOGS_SQL = """
SELECT log_id, nprocs, rank_offset, toUnixTimestamp64Nano(start) AS start_ns, toUnixTimestamp64Nano(end) AS end_ns
FROM darshan_logs FINAL WHERE job_id = {job_id:String}
"""
#: The LUSTRE layout counters (per component) of the job's files, for the DXT-by-stripe mapping.
LAYOUT_SQL = """
SELECT record_id, any(path) AS path, groupArray((counter, value)) AS kv
FROM (SELECT DISTINCT record_id, path, counter, value FROM darshan_counters
      WHERE job_id = {job_id:String} AND module = 'LUSTRE' AND startsWith(counter, 'LUSTRE_COMP'))
GROUP BY record_id
"""
#: The job's DXT requests (client layer, imported with offsets) summed per (file, rank, block of
#: the file's first stripe size): the block maps to one OST through the layout.
DXT_BLOCKS_SQL = """
SELECT r.path AS path, r.rank AS rank, intDiv(r.offset, l.ss) AS blk,
       sum(r.bytes) AS bytes, sum(r.duration_ns) AS time_ns
FROM io_requests AS r
INNER JOIN (SELECT any(path) AS path, toUInt64(anyIf(value, counter = 'LUSTRE_COMP0_STRIPE_SIZE')) AS ss
            FROM darshan_counters
            WHERE job_id = {job_id:String} AND module = 'LUSTRE' AND counter = 'LUSTRE_COMP0_STRIPE_SIZE'
            GROUP BY record_id HAVING ss > 0 AND path != '') AS l ON r.path = l.path
WHERE r.job_id = {job_id:String} AND r.layer = 'client' AND r.op IN ('read', 'write') AND r.bytes > 0
GROUP BY path, rank, blk
"""
#: Per file of a live job on the forwarder layer: bytes, service time, ranks, resources (a request
#: a mount replayed on another forwarding node once: :mod:`pharos_analytics.replays_sql`).
TRACE_FILES_SQL = f"""
SELECT job_id, path,
       sum(bytes) AS bytes, sum(duration_ns) AS time_ns,
       groupUniqArray(rank) AS ranks,
       groupUniqArrayIf(target, target != '') AS targets,
       groupUniqArrayIf(forwarding_node, forwarding_node != '') AS fwds,
       groupUniqArrayIf(compute_node, compute_node != '') AS cns,
       toUnixTimestamp64Nano(min(start)) AS first_ns, toUnixTimestamp64Nano(max(end)) AS last_ns
FROM io_requests
WHERE job_id IN {{jobs:Array(String)}} AND layer = 'forwarder'
  AND op IN ('read', 'write', 'pread', 'pwrite', 'readv', 'writev')
  AND path != '' AND NOT match(path, {{system_re:String}})
  AND {counted_once("job_id IN {jobs:Array(String)}")}
GROUP BY job_id, path
"""


@dataclass(frozen=True)
class FileObs:
    """One file of the job: bytes (B), time (s), performance (B/s), ranks, resources per type."""

    name: str
    bytes: float
    time_s: float
    ranks: tuple[int, ...]
    resources: dict[str, tuple[str, ...]]

    @property
    def perf(self) -> float:
        return self.bytes / self.time_s


@dataclass(frozen=True)
class ResourceVerdict:
    """One resource judged against its peers (same type). Performance in B/s, ``ratio`` =
    peers' median / the resource's median (> 1: slower), ``coefficient`` Pearson's r of
    log10(performance) with the resource's column, ``p_value`` its two-sided p."""

    resource_type: str
    resource: str
    files: int
    peer_files: int
    coefficient: float | None
    p_value: float | None
    median_perf_b_s: float
    peers_median_perf_b_s: float
    ratio: float
    blamed: bool


@dataclass(frozen=True)
class StragglerFinding:
    """A blamed resource and its evidence (files, ranks, bytes, time, excess time in s =
    time its files took beyond what the peers' median performance needs)."""

    resource_type: str
    resource: str
    source: Literal["counters", "dxt", "trace"]
    verdict: ResourceVerdict
    files: list[str]
    ranks: list[int]
    bytes: float
    time_s: float
    excess_time_s: float

    def evidence(self) -> dict:
        """The finding's evidence (files and ranks capped at 50 and 200, with their counts), as
        the insight and the anomaly row both carry it."""
        return {
            "resource_type": self.resource_type,
            "resource": self.resource,
            "source": self.source,
            "files": self.files[:50],
            "n_files": len(self.files),
            "ranks": self.ranks[:200],
            "n_ranks": len(self.ranks),
            "bytes": self.bytes,
            "time_s": self.time_s,
            "excess_time_s": self.excess_time_s,
        }


@dataclass
class StragglerReport:
    """Everything the attribution looked at: observations used, every verdict, the findings."""

    job_id: str
    source: Literal["counters", "dxt", "trace", "none"]
    observations: int
    verdicts: list[ResourceVerdict] = field(default_factory=list)
    findings: list[StragglerFinding] = field(default_factory=list)
    start_ns: int | None = None
    end_ns: int | None = None
    notes: list[str] = field(default_factory=list)


def _pearson(x: list[float], y: list[float]) -> tuple[float, float] | None:
    """Pearson's r and two-sided p (scipy.stats.pearsonr); None when either is constant."""
    if len(set(x)) < 2 or len(set(y)) < 2:
        return None
    from scipy.stats import pearsonr

    r, p = pearsonr(x, y)
    return float(r), float(p)


def judge(obs: list[FileObs], rtype: str, cfg: DiagnosisConfig) -> list[ResourceVerdict]:
    """Every resource of type ``rtype`` judged against its peers (pure; see the module docstring).

    Args:
        obs: file observations (bytes > 0, time > 0); files without a resource of this type
            are left out; files under ``straggler_min_file_bytes`` too.
        rtype: the resource type (a key of ``FileObs.resources``).
        cfg: thresholds (``straggler_*``).

    Returns:
        One verdict per resource with at least ``straggler_min_files`` files and as many on its
        peers; ``blamed`` when r <= -``straggler_correlation``, p < ``straggler_p_value`` and the
        peers' median performance is >= ``straggler_min_ratio`` x the resource's.
    """
    use = [o for o in obs if o.resources.get(rtype) and o.bytes >= cfg.straggler_min_file_bytes and o.time_s > 0]
    names = sorted({r for o in use for r in o.resources[rtype]})
    if len(names) < 2:
        return []
    y = [math.log10(o.perf) for o in use]
    out = []
    for name in names:
        x = [1.0 / len(o.resources[rtype]) if name in o.resources[rtype] else 0.0 for o in use]
        on = [o.perf for o, xi in zip(use, x, strict=True) if xi > 0]
        off = [o.perf for o, xi in zip(use, x, strict=True) if xi == 0]
        if len(on) < cfg.straggler_min_files or len(off) < cfg.straggler_min_files:
            continue
        rp = _pearson(x, y)
        med_on, med_off = statistics.median(on), statistics.median(off)
        ratio = med_off / med_on if med_on > 0 else math.inf
        blamed = (
            rp is not None
            and rp[0] <= -cfg.straggler_correlation
            and rp[1] < cfg.straggler_p_value
            and ratio >= cfg.straggler_min_ratio
        )
        out.append(
            ResourceVerdict(
                rtype,
                name,
                len(on),
                len(off),
                None if rp is None else rp[0],
                None if rp is None else rp[1],
                med_on,
                med_off,
                ratio,
                blamed,
            )
        )
    return out


def _counter_obs(store: Store, job_id: str) -> tuple[list[FileObs], int | None, int | None]:
    files = store.query(COUNTER_FILES_SQL, {"job_id": job_id})
    if not files:
        return [], None, None
    times = {int(r["record_id"]): float(r["time_s"]) for r in store.query(COUNTER_TIMES_SQL, {"job_id": job_id})}
    osts = {int(r["record_id"]): r["osts"] for r in store.query(COUNTER_OSTS_SQL, {"job_id": job_id})}
    logs = {r["log_id"]: r for r in store.query(LOGS_SQL, {"job_id": job_id})}
    obs = []
    for f in files:
        rid = int(f["record_id"])
        if is_system_path(f["path"]) or float(f["bytes"]) <= 0 or times.get(rid, 0.0) <= 0:
            continue
        ranks = {int(r) for r in f["ranks"] if int(r) >= 0}
        if any(int(r) < 0 for r in f["ranks"]) and f["log_id"] in logs:
            lg = logs[f["log_id"]]
            ranks |= set(range(int(lg["rank_offset"]), int(lg["rank_offset"]) + int(lg["nprocs"])))
        obs.append(
            FileObs(
                f["path"] or f"record {rid}",
                float(f["bytes"]),
                times[rid],
                tuple(sorted(ranks)),
                {"ost": tuple(f"OST{int(o)}" for o in sorted(osts.get(rid, [])))},
            )
        )
    start = min((int(lg["start_ns"]) for lg in logs.values()), default=None)
    end = max((int(lg["end_ns"]) for lg in logs.values()), default=None)
    return obs, start, end


@dataclass(frozen=True)
class LayoutComponent:
    """One component of a Lustre file layout (Darshan LUSTRE module): extent [start, end) in
    bytes (end None = end of file), stripe size in bytes, the OST id of each stripe index."""

    start: int
    end: int | None
    stripe_size: int
    osts: tuple[int, ...]

    def ost_at(self, offset: int) -> int:
        """The OST holding byte ``offset`` (bytes from the start of the file) of this component."""
        return self.osts[((offset - self.start) // self.stripe_size) % len(self.osts)]


def parse_layout(kv: list[tuple[str, float]]) -> list[LayoutComponent]:
    """A file's components from its ``LUSTRE_COMP<c>_*`` counters (the importer's names);
    components without a stripe size or an OST list are left out."""
    comps: dict[int, dict] = {}
    for name, value in kv:
        head, _, rest = name[len("LUSTRE_COMP") :].partition("_")
        if not head.isdigit():
            continue
        c = comps.setdefault(int(head), {"osts": {}})
        if rest.startswith("OST_") and rest[4:].isdigit():
            c["osts"][int(rest[4:])] = int(value)
        else:
            c[rest] = int(value)
    out = []
    for _, c in sorted(comps.items()):
        osts = tuple(c["osts"][k] for k in sorted(c["osts"]))
        if c.get("STRIPE_SIZE", 0) <= 0 or not osts:
            continue
        end = c.get("EXT_END", -1)
        out.append(LayoutComponent(max(c.get("EXT_START", 0), 0), None if end < 0 else end, c["STRIPE_SIZE"], osts))
    return out


def ost_of(layout: list[LayoutComponent], offset: int) -> int | None:
    """The OST holding byte ``offset`` of a file with this layout (None: no component covers it)."""
    for comp in layout:
        if offset >= comp.start and (comp.end is None or offset < comp.end):
            return comp.ost_at(offset)
    return None


def _dxt_ost_obs(store: Store, job_id: str) -> list[FileObs]:
    """Per (file, OST) observations from the job's DXT requests mapped through the files' LUSTRE
    layouts; empty unless some file with DXT requests is striped over two or more OSTs."""
    layouts = {r["path"]: parse_layout(r["kv"]) for r in store.query(LAYOUT_SQL, {"job_id": job_id}) if r["path"]}
    striped = {p for p, lay in layouts.items() if len({o for c in lay for o in c.osts}) > 1}
    if not striped:
        return []
    blocks = store.query(DXT_BLOCKS_SQL, {"job_id": job_id})
    if not any(b["path"] in striped for b in blocks):
        return []
    parts: dict[tuple[str, int], dict] = {}
    for b in blocks:
        lay = layouts.get(b["path"])
        if not lay or is_system_path(b["path"]):
            continue
        ost = ost_of(lay, int(b["blk"]) * lay[0].stripe_size)
        if ost is None:
            continue
        p = parts.setdefault((b["path"], ost), {"bytes": 0, "rank_ns": {}})
        p["bytes"] += int(b["bytes"])
        rank = int(b["rank"])
        p["rank_ns"][rank] = p["rank_ns"].get(rank, 0) + int(b["time_ns"])
    return [
        FileObs(
            f"{path} [OST{ost}]",
            float(p["bytes"]),
            max(p["rank_ns"].values()) / 1e9,
            tuple(sorted(r for r in p["rank_ns"] if r >= 0)),
            {"ost": (f"OST{ost}",)},
        )
        for (path, ost), p in sorted(parts.items())
        if p["bytes"] > 0 and max(p["rank_ns"].values()) > 0
    ]


TraceObs = tuple[list[FileObs], int | None, int | None]


def trace_observations(store: Store, job_ids: list[str]) -> dict[str, TraceObs]:
    """Per job of ``job_ids``: its forwarder-layer file observations and I/O time range (ns), in
    one query by job id (the detection loop's batch of ended jobs); jobs without such requests
    get ``([], None, None)``."""
    rows: dict[str, list[dict]] = {j: [] for j in job_ids}
    if job_ids:
        for r in store.query(TRACE_FILES_SQL, {"jobs": list(job_ids), "system_re": SYSTEM_PATH_REGEX}):
            rows[r["job_id"]].append(r)
    return {j: _trace_obs_of(rs) for j, rs in rows.items()}


def _trace_obs(store: Store, job_id: str) -> TraceObs:
    return trace_observations(store, [job_id])[job_id]


def _trace_obs_of(rows: list[dict]) -> TraceObs:
    obs = [
        FileObs(
            r["path"],
            float(r["bytes"]),
            int(r["time_ns"]) / 1e9,
            tuple(sorted(int(x) for x in r["ranks"])),
            {
                "target": tuple(sorted(r["targets"])),
                "forwarding_node": tuple(sorted(r["fwds"])),
                "compute_node": tuple(sorted(r["cns"])),
            },
        )
        for r in rows
        if int(r["bytes"]) > 0 and int(r["time_ns"]) > 0
    ]
    start = min((int(r["first_ns"]) for r in rows), default=None)
    end = max((int(r["last_ns"]) for r in rows), default=None)
    return obs, start, end


def attribute(
    obs: list[FileObs],
    cfg: DiagnosisConfig,
    types: tuple[str, ...],
    source: Literal["counters", "dxt", "trace"] = "counters",
) -> tuple[list[ResourceVerdict], list[StragglerFinding]]:
    """(verdicts, findings) over ``obs`` for each resource type in ``types`` (pure); findings
    sorted by excess time, largest first."""
    verdicts: list[ResourceVerdict] = []
    findings: list[StragglerFinding] = []
    for rtype in types:
        vs = judge(obs, rtype, cfg)
        verdicts += vs
        for v in vs:
            if not v.blamed:
                continue
            mine = [o for o in obs if v.resource in o.resources.get(rtype, ())]
            excess = sum(max(o.time_s - o.bytes / v.peers_median_perf_b_s, 0.0) for o in mine)
            findings.append(
                StragglerFinding(
                    rtype,
                    v.resource,
                    source,
                    v,
                    sorted(o.name for o in mine),
                    sorted({r for o in mine for r in o.ranks}),
                    sum(o.bytes for o in mine),
                    sum(o.time_s for o in mine),
                    excess,
                )
            )
    findings.sort(key=lambda f: -f.excess_time_s)
    return verdicts, findings


def job_stragglers(
    store: Store, job_id: str, cfg: DiagnosisConfig | None = None, trace: TraceObs | None = None
) -> StragglerReport:
    """Straggler attribution of one job (TOKIO darshan_bad_ost; see the module docstring).

    Uses the forwarder-layer trace when the job has one (live jobs: targets, forwarding
    nodes, compute nodes), else the Darshan log's DXT requests per (file, OST) when some file
    is striped over several OSTs, else its Darshan counters per file (OSTs from the LUSTRE
    module). ``trace``: the job's forwarder observations already read
    (:func:`trace_observations`).

    Returns:
        A :class:`StragglerReport`; ``findings`` is empty when no resource explains the slow
        files (``verdicts`` still lists every resource judged). Raises
        pharos_core.store.StoreError when the store fails.
    """
    cfg = cfg or DiagnosisConfig()
    obs, start, end = _trace_obs(store, job_id) if trace is None else trace
    source: Literal["counters", "trace", "none"] = "trace"
    types: tuple[str, ...] = ("target", "forwarding_node", "compute_node")
    if not obs:
        obs, start, end = _counter_obs(store, job_id)
        source, types = ("counters", ("ost",)) if obs else ("none", ())
        dxt = _dxt_ost_obs(store, job_id) if obs else []
        if dxt:
            obs, source = dxt, "dxt"
    verdicts, findings = attribute(obs, cfg, types, "counters" if source == "none" else source)
    return StragglerReport(job_id, source, len(obs), verdicts, findings, start, end)


def anomaly_rows(rep: StragglerReport, detected_ns: int) -> list[dict]:
    """``anomalies`` rows (migration 005's table) of kind ``straggler_resource`` for the report's
    findings: ``key`` straggler_resource:<job>:<type>:<resource>, ``node`` the resource,
    ``node_type`` its type (ost | target | forwarding_node | compute_node), ``job_id`` the job,
    ``start``/``end`` the job's I/O time range, ``ratio`` peers' median / its median
    performance, ``active`` 0 (evidence from a job, not a live condition), ``evidence`` JSON."""
    rows = []
    for f in rep.findings:
        rows.append(
            {
                "detected": ns_to_datetime64(detected_ns),
                "key": f"{ANOMALY_KIND}:{rep.job_id}:{f.resource_type}:{f.resource}",
                "kind": ANOMALY_KIND,
                "node": f.resource,
                "node_type": f.resource_type,
                "job_id": rep.job_id,
                "culprit_job": "",
                "persistence": "",
                "active": 0,
                "severity": "warning",
                "ratio": f.verdict.ratio if math.isfinite(f.verdict.ratio) else 1e9,
                "onset": ns_to_datetime64(rep.start_ns) if rep.start_ns else None,
                "start": ns_to_datetime64(rep.start_ns) if rep.start_ns else None,
                "end": ns_to_datetime64(rep.end_ns) if rep.end_ns else None,
                "evidence": json.dumps(
                    {
                        **f.evidence(),
                        "verdict": asdict(f.verdict),
                        "method": "TOKIO darshan_bad_ost (Pearson r of log10 per-file performance) + Beacon §5.3 ratio",
                    }
                ),
            }
        )
    return rows


EXISTING_SQL = "SELECT DISTINCT key FROM anomalies WHERE kind = {kind:String} AND job_id = {job_id:String}"


def record_straggler_anomalies(
    store: Store,
    job_id: str,
    cfg: DiagnosisConfig | None = None,
    now_ns: int | None = None,
    trace: TraceObs | None = None,
) -> StragglerReport:
    """Attribute ``job_id``'s stragglers and store each blamed resource once as an ``anomalies``
    row (kind ``straggler_resource``; a key already stored for the job is not stored again).
    ``now_ns`` (ns since the epoch, default now) is the row's ``detected`` time."""
    import time

    rep = job_stragglers(store, job_id, cfg, trace)
    if rep.findings:
        have = {r["key"] for r in store.query(EXISTING_SQL, {"kind": ANOMALY_KIND, "job_id": job_id})}
        rows = [r for r in anomaly_rows(rep, now_ns or time.time_ns()) if r["key"] not in have]
        if rows:
            store.insert_rows("anomalies", rows)
    return rep
