"""The input of the interference pass (:mod:`pharos_analytics.interference`): the forwarder
layer's usage per (job, window, resource) and per (job, window), from the per-second/per-minute
rollups or the raw records, and the indexes the detection asks per (job, window).

Units: ns (``*_ns``), bytes; windows are ``start // win_ns`` (ns since the epoch).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pharos_core.store import Store, ns_to_datetime64

from .failslow_sql import FORWARDER_ROLLUPS, forwarder_rollup
from .interference_sql import (
    INDEX_SQL,
    ROLLUP_1S_RETENTION_NS,
    ROLLUP_JOB_SQL,
    ROLLUP_USAGE_SQL,
    WINDOW_JOB_SQL,
    WINDOW_USAGE_SQL,
)


def _jobs_clause(job_ids: list[str] | None) -> str:
    return "" if job_ids is None else "AND job_id IN {jobs:Array(String)}"


ReadFrom = Literal["auto", "rollup", "raw"]


def reads_rollup(since_ns: int, win_ns: int, read_from: ReadFrom = "auto", now_ns: int | None = None) -> bool:
    """Whether a range starting at ``since_ns`` (ns since the epoch) with windows of ``win_ns``
    is read from the per-second rollup rather than raw records (``read_from`` ``rollup`` or
    ``raw`` decides; tests compare the two). ``auto``: whole-second windows
    and ``since_ns`` within the last 7 days of the wall clock (a record is ingested after it
    starts, so every record of such a range is younger than the rollup's 8-day TTL)."""
    if read_from != "auto":
        return read_from == "rollup"
    now_ns = time.time_ns() if now_ns is None else now_ns
    return win_ns % 1_000_000_000 == 0 and since_ns >= now_ns - ROLLUP_1S_RETENTION_NS


def _usage(
    store: Store,
    since_ns: int,
    until_ns: int,
    win_ns: int,
    job_ids: list[str] | None = None,
    read_from: ReadFrom = "auto",
    min_occupancy_ns: int = 0,
    cache: UsageCache | None = None,
):
    """The usage of the windows of ``[since_ns, until_ns)`` (:class:`_Windows`, :class:`_JobWindows`).

    ``min_occupancy_ns``: the per-resource sums (``by_w[w]``) of the resources that some job
    occupied (its requests' service time there >= this, ns) only: the only ones a culprit can
    be found on (``interference_min_occupancy``); 0 = every resource (one job's report). At
    40,960 simulated nodes that is 3,567 of 2,990,495 rows: the whole usage of an hour does not
    fit in a process's memory (2.4 GB for 8 windows). ``shared`` and ``co_bytes`` still count
    every resource. ``cache``: the settled windows of earlier calls are taken from it and the
    windows read now that are settled kept in it (the periodic detection); see :class:`UsageCache`.
    Raises StoreError."""
    p = {"win": win_ns, "occ": min_occupancy_ns}
    if job_ids is not None:
        p["jobs"] = job_ids
    rollup = reads_rollup(since_ns, win_ns, read_from)
    if cache is None:
        usage_sql, job_sql = _usage_sql(since_ns, until_ns, win_ns, job_ids, rollup)
        p |= {"since": ns_to_datetime64(since_ns), "until": ns_to_datetime64(until_ns)}
        by_w = _Windows.read(store, usage_sql, p)
        own = store.query_columns(job_sql, p)
        return by_w, _JobWindows(_job_rows(own))
    first_w, end_w = since_ns // win_ns, -(-until_ns // win_ns)
    cache.keep((win_ns, min_occupancy_ns, rollup, tuple(job_ids or ())), first_w)
    read_w = next((w for w in range(first_w, end_w) if w not in cache.parts), end_w)
    parts = {w: cache.parts[w] for w in range(first_w, read_w)}
    if read_w < end_w:
        lo = max(since_ns, read_w * win_ns)
        usage_sql, job_sql = _usage_sql(lo, until_ns, win_ns, job_ids, rollup)
        p |= {"since": ns_to_datetime64(lo), "until": ns_to_datetime64(until_ns)}
        new = _WindowPart.read(store, usage_sql, job_sql, p)
        settled = (until_ns - cache.settle_ns) // win_ns  # windows before it ended settle_ns ago
        # a settled window without rows is kept too (empty), or every cycle would read from it
        cache.parts |= {w: new.get(w) or _WindowPart() for w in range(read_w, min(settled, end_w))}
        cache.reads += 1
        parts |= new
    return _Windows.of(parts), _JobWindows(((j, w), s) for w, part in parts.items() for j, s in part.jobw.items())


def _usage_sql(since_ns: int, until_ns: int, win_ns: int, job_ids: list[str] | None, rollup: bool) -> tuple[str, str]:
    if rollup:
        step = max(r.step_s for r in FORWARDER_ROLLUPS if win_ns % (r.step_s * 1_000_000_000) == 0)
        src = forwarder_rollup(since_ns, until_ns, step)
        usage_sql, job_sql = (q.replace("__SRC__", src) for q in (ROLLUP_USAGE_SQL, ROLLUP_JOB_SQL))
    else:
        usage_sql, job_sql = WINDOW_USAGE_SQL, WINDOW_JOB_SQL
    return usage_sql.replace("__JOBS__", _jobs_clause(job_ids)), job_sql.replace("__JOBS__", _jobs_clause(job_ids))


def _job_rows(own: dict[str, list]) -> Iterator[tuple[tuple[str, int], dict]]:
    for j, w, n, b, s, q in zip(
        own["job_id"], own["w"], own["n"], own["bytes"], own["svc_ns"], own["qw_ns"], strict=True
    ):
        yield (j, w), {"n": n, "bytes": b, "svc_ns": s, "qw_ns": q}


class _JobWindows(dict):
    """The jobs' own sums of :func:`_usage`: (job, window) -> {n, bytes, svc_ns, qw_ns}, with each
    job's windows in order (:meth:`windows`), indexed once: the detection asks per job, and a scan
    of every (job, window) for each job grows with the square of the jobs (2,000 concurrent jobs x
    60 windows: 240 M steps a cycle)."""

    def __init__(self, items=()) -> None:
        super().__init__(items)
        self.of: dict[str, list[int]] = {}
        for j, w in self:
            self.of.setdefault(j, []).append(w)
        for ws in self.of.values():
            ws.sort()

    def windows(self, job: str) -> list[int]:
        """The job's windows, oldest first ([] when it has none)."""
        return self.of.get(job, [])


class _Windows:
    """The usage of :func:`_usage`: window -> (resource type, resource) -> job -> {n, bytes,
    svc_ns} (``by_w[w]``, ``by_w.get(w)``; an absent window or resource has no usage), with the
    indexes the detection asks per (job, window): whether another job used one of its resources
    (``shared``), the bytes the others moved on them (``co_bytes``) and its resources
    (:meth:`resources`, sorted; of those in ``by_w`` only).

    ``shared`` and ``co_bytes`` come from the store (:data:`INDEX_SQL`: one row per (job,
    window)); the usage itself (:data:`GROUPED_SQL`) is read, whole, on the first ``by_w[w]``,
    which only an interfered window, a baseline's co-located bytes or a report asks for. A cycle
    with no interference reads ~(jobs x windows) rows, not the ~10^6-10^7 usage rows of a site's
    hour. Scanning every resource of a window, or every job of each resource, per ask was the
    cycle's cost before the indexes (50 jobs x 60 windows x 280 resources of ~25 jobs each: 72 s
    of a 74 s cycle)."""

    def __init__(self, shared: dict[tuple[str, int], bool], co_bytes: dict[tuple[str, int], int], load) -> None:
        """``load()``: window -> :class:`_WindowUsage` (called once, on the first ask)."""
        self.shared = shared
        self.co_bytes = co_bytes
        self._load = load
        self._by_w: dict[int, _WindowUsage] | None = None
        self._res_of: dict[int, dict[str, list[tuple[str, str]]]] = {}

    @classmethod
    def read(cls, store: Store, usage_sql: str, params: dict) -> _Windows:
        """The usage of ``usage_sql`` (columns w, rtype, res, job_id, n, bytes, svc_ns; a row per
        (job, window, resource)) in ``store``, with ``params`` (``occ``: see :func:`_usage`; 0 if
        absent): its indexes now, itself when asked. Raises StoreError."""
        params = {"occ": 0} | params
        shared, co = _index(store.query_columns(INDEX_SQL.replace("__USAGE__", usage_sql), params))
        return cls(
            shared, co, lambda: _grouped(store.query_columns(GROUPED_SQL.replace("__USAGE__", usage_sql), params))
        )

    @classmethod
    def of(cls, parts: dict[int, _WindowPart]) -> _Windows:
        """The windows of ``parts`` (window -> its part), read already."""
        shared: dict[tuple[str, int], bool] = {}
        co: dict[tuple[str, int], int] = {}
        for w, part in parts.items():
            shared |= {(j, w): v for j, v in part.shared.items()}
            co |= {(j, w): v for j, v in part.co_bytes.items()}
        by_w = {w: part.usage for w, part in parts.items()}
        return cls(shared, co, lambda: by_w)

    def _windows(self) -> dict[int, _WindowUsage]:
        if self._by_w is None:
            self._by_w, self._load = self._load(), None
        return self._by_w

    def __getitem__(self, w: int) -> _WindowUsage:
        return self._windows().get(w, _NO_USAGE)

    def get(self, w: int, default=None):
        return self._windows().get(w, default)

    def resources(self, job: str, w: int) -> list[tuple[str, str]]:
        """The job's resources in window ``w`` (of those in ``by_w[w]``), sorted; [] when none."""
        inv = self._res_of.get(w)
        if inv is None:  # a window's inverse, made on its first ask
            inv = {}
            for res, (js, *_) in self[w].raw.items():
                for j in js:
                    inv.setdefault(j, []).append(res)
            for rs in inv.values():
                rs.sort()
            self._res_of[w] = inv
        return inv.get(job, [])

    def __bool__(self) -> bool:
        return bool(self.shared)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Windows):
            return NotImplemented
        mine = (self.shared, self.co_bytes, self._windows())
        return mine == (other.shared, other.co_bytes, other._windows())

    __hash__ = None  # type: ignore[assignment]


def _index(cols: dict[str, list]) -> tuple[dict[tuple[str, int], bool], dict[tuple[str, int], int]]:
    keys = list(zip(cols["job_id"], cols["w"], strict=True))
    return dict(zip(keys, map(bool, cols["shared"]), strict=True)), dict(zip(keys, cols["co"], strict=True))


def _grouped(u: dict[str, list]) -> dict[int, _WindowUsage]:
    """:data:`GROUPED_SQL`'s columns as window -> :class:`_WindowUsage`."""
    by_w: dict[int, _WindowUsage] = {}
    for w, rt, r, js, ns, bs, svs in zip(
        u["w"], u["rtype"], u["res"], u["jobs"], u["ns"], u["bs"], u["svs"], strict=True
    ):
        wu = by_w.get(w)
        if wu is None:
            wu = by_w[w] = _WindowUsage()
        wu.raw[(rt, r)] = (js, ns, bs, svs)
    return by_w


@dataclass
class _WindowPart:
    """One window of a read (:func:`_usage` with a cache): per job, ``shared`` and ``co_bytes``
    (:class:`_Windows`) and its own sums (``jobw``: {n, bytes, svc_ns, qw_ns}); ``usage``."""

    shared: dict[str, bool] = field(default_factory=dict)
    co_bytes: dict[str, int] = field(default_factory=dict)
    jobw: dict[str, dict] = field(default_factory=dict)
    usage: _WindowUsage = field(default_factory=lambda: _WindowUsage())

    @staticmethod
    def read(store: Store, usage_sql: str, job_sql: str, params: dict) -> dict[int, _WindowPart]:
        """The windows of one range, each usage read now (three queries). Raises StoreError."""
        parts: dict[int, _WindowPart] = {}

        def part(w: int) -> _WindowPart:
            return parts.setdefault(w, _WindowPart())

        idx = store.query_columns(INDEX_SQL.replace("__USAGE__", usage_sql), params)
        for j, w, sh, co in zip(idx["job_id"], idx["w"], idx["shared"], idx["co"], strict=True):
            pt = part(w)
            pt.shared[j], pt.co_bytes[j] = bool(sh), co
        for (j, w), s in _job_rows(store.query_columns(job_sql, params)):
            part(w).jobw[j] = s
        for w, wu in _grouped(store.query_columns(GROUPED_SQL.replace("__USAGE__", usage_sql), params)).items():
            part(w).usage = wu
        return parts


@dataclass
class UsageCache:
    """The settled windows of the periodic detection's usage, kept between its cycles
    (:class:`~pharos_analytics.alerts.DetectionLoop`): a cycle reads the windows from the first
    one not kept to now, not its whole look-back (an hour re-read every 10 s was most of the
    cycle at 40,960 simulated nodes). A window is settled, and kept, once it ended ``settle_ns``
    before the cycle's end (``interference_settle_s``): records that reach the store later than
    that for a kept window are not in later cycles' view of it (they are in one job's report,
    ``pharos diagnose JOB``, which reads the store). Windows before the look-back are
    dropped; a change of window, occupancy, source or jobs empties it. Holds ~(jobs x windows)
    sums and the occupied resources' usage: a few MB at 2,000 jobs over an hour."""

    settle_ns: int = 120 * 1_000_000_000
    parts: dict[int, _WindowPart] = field(default_factory=dict)
    key: tuple = ()
    reads: int = 0  # ranges read (one a call at most)

    def keep(self, key: tuple, first_w: int) -> None:
        """Empty when ``key`` changed; drop the windows before ``first_w``."""
        if key != self.key:
            self.parts, self.key = {}, key
        for w in [w for w in self.parts if w < first_w]:
            del self.parts[w]


#: A usage query (``__USAGE__``) grouped per (window, resource): the jobs on it and their sums as
#: parallel arrays, so that one window's resources are made into dictionaries only when asked
#: (:class:`_WindowUsage`). Only the resources some job occupied (service time there >=
#: ``{occ}`` ns in the window; 0 = all): the rows of a site's hour are ~10^6-10^7 (job, window,
#: resource), those of occupied resources ~10^3-10^4 (:func:`_usage`).
GROUPED_SQL = """
SELECT w, rtype, res, groupArray(job_id) AS jobs, groupArray(n) AS ns, groupArray(bytes) AS bs,
       groupArray(svc_ns) AS svs
FROM (__USAGE__)
GROUP BY w, rtype, res
HAVING max(svc_ns) >= {occ:UInt64}
"""


class _WindowUsage(Mapping):
    """One window of :class:`_Windows`: (resource type, resource) -> job -> {n, bytes, svc_ns}
    (requests, bytes, service ns). Each resource's job dictionary is built on its first ask, from
    the arrays of :data:`GROUPED_SQL`: the detection asks for the resources of interfered
    (job, window) pairs only (building all of them was ~6 s of a 23 s detection cycle at 40,960
    simulated nodes, docs/operations.md)."""

    __slots__ = ("_built", "raw")

    def __init__(self) -> None:
        self.raw: dict[tuple[str, str], tuple[list, list, list, list]] = {}
        self._built: dict[tuple[str, str], dict[str, dict]] = {}

    def __getitem__(self, res: tuple[str, str]) -> dict[str, dict]:
        d = self._built.get(res)
        if d is None:
            js, ns, bs, svs = self.raw[res]
            d = self._built[res] = {
                j: {"n": n, "bytes": b, "svc_ns": sv} for j, n, b, sv in zip(js, ns, bs, svs, strict=True)
            }
        return d

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    __hash__ = None  # type: ignore[assignment]


_NO_USAGE = _WindowUsage()  # an absent window's


def _resources(by_w: _Windows, job: str, w: int) -> list[tuple[str, str]]:
    return by_w.resources(job, w)


def _others(by_w: _Windows, job: str, w: int) -> set[str]:
    """The other jobs on the job's resources in window w (those in ``by_w``: in the periodic
    detection, the occupied ones; the detection tests ``shared`` first: this set is built for
    interfered windows only)."""
    out: set[str] = set()
    for res in _resources(by_w, job, w):
        out.update(by_w[w][res])
    out.discard(job)
    return out


def _co_bytes(by_w: _Windows, job: str, w: int) -> int:
    """Bytes other jobs moved on the job's resources in window w."""
    return by_w.co_bytes.get((job, w), 0)
