"""The input of the interference pass (:mod:`pharos_analytics.interference`): the forwarder
layer's usage per (job, window, resource) and per (job, window), from the per-second/per-minute
rollups or the raw records, and the indexes the detection asks per (job, window).

Units: ns (``*_ns``), bytes; windows are ``start // win_ns`` (ns since the epoch).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
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
):
    p = {"since": ns_to_datetime64(since_ns), "until": ns_to_datetime64(until_ns), "win": win_ns}
    if job_ids is not None:
        p["jobs"] = job_ids
    if reads_rollup(since_ns, win_ns, read_from):
        step = max(r.step_s for r in FORWARDER_ROLLUPS if win_ns % (r.step_s * 1_000_000_000) == 0)
        src = forwarder_rollup(since_ns, until_ns, step)
        usage_sql, job_sql = (q.replace("__SRC__", src) for q in (ROLLUP_USAGE_SQL, ROLLUP_JOB_SQL))
    else:
        usage_sql, job_sql = WINDOW_USAGE_SQL, WINDOW_JOB_SQL
    # (w) -> (rtype, res) -> job -> stats, read when first asked ; (job, w) -> stats. Columns, not
    # a dict per row: a site's hour is ~10^6 usage rows (bench/failslow_windows.py).
    by_w = _Windows.read(store, usage_sql.replace("__JOBS__", _jobs_clause(job_ids)), p)
    own = store.query_columns(job_sql.replace("__JOBS__", _jobs_clause(job_ids)), p)
    jobw = _JobWindows(
        ((j, w), {"n": n, "bytes": b, "svc_ns": s, "qw_ns": q})
        for j, w, n, b, s, q in zip(
            own["job_id"], own["w"], own["n"], own["bytes"], own["svc_ns"], own["qw_ns"], strict=True
        )
    )
    return by_w, jobw


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
    svc_ns} (``by_w[w]``, ``by_w.get(w)``), with the indexes the detection asks per job and
    window: the resources of each (job, window) (sorted), whether another job used one of them
    (``shared``) and the bytes the others moved on them (``co_bytes``).

    The indexes come from the store (:data:`INDEX_SQL` over the usage query: a window function
    per (window, resource), one row per (job, window)); the usage itself is read, whole, on the
    first ``by_w[w]``, which only an interfered window, a baseline's co-located bytes or a report
    asks for. A cycle with no interference reads ~(jobs x windows) rows, not the ~10^6 usage rows
    of a site's hour (bench/failslow_windows.py: building them in Python was most of the pass).
    Scanning every resource of a window, or every job of each resource, per ask was the cycle's
    cost before the indexes (50 jobs x 60 windows x 280 resources of ~25 jobs each: 72 s of a
    74 s cycle)."""

    def __init__(self, index: dict[str, list], load) -> None:
        """``index``: :data:`INDEX_SQL`'s columns; ``load()``: the usage query's columns."""
        self.res_of: dict[tuple[str, int], list[tuple[str, str]]] = {}
        self.shared: dict[tuple[str, int], bool] = {}
        self.co_bytes: dict[tuple[str, int], int] = {}
        for j, w, rs, shared, co in zip(
            index["job_id"], index["w"], index["rs"], index["shared"], index["co"], strict=True
        ):
            k = (j, w)
            self.res_of[k], self.shared[k], self.co_bytes[k] = [tuple(r) for r in rs], bool(shared), co
        self._load = load
        self._by_w: dict[int, dict[tuple[str, str], dict[str, dict]]] | None = None

    @classmethod
    def read(cls, store: Store, usage_sql: str, params: dict) -> _Windows:
        """The usage of ``usage_sql`` (columns w, rtype, res, job_id, n, bytes, svc_ns; a row per
        (job, window, resource)) in ``store``, with ``params``: its indexes now, itself when asked
        (:data:`GROUPED_SQL`: a row per (window, resource)). Raises StoreError."""
        index = store.query_columns(INDEX_SQL.replace("__USAGE__", usage_sql), params)
        return cls(index, lambda: store.query_columns(GROUPED_SQL.replace("__USAGE__", usage_sql), params))

    def _windows(self) -> dict[int, _WindowUsage]:
        if self._by_w is None:
            u = self._load()
            by_w: dict[int, _WindowUsage] = {}
            for w, rt, r, js, ns, bs, svs in zip(
                u["w"], u["rtype"], u["res"], u["jobs"], u["ns"], u["bs"], u["svs"], strict=True
            ):
                wu = by_w.get(w)
                if wu is None:
                    wu = by_w[w] = _WindowUsage()
                wu.raw[(rt, r)] = (js, ns, bs, svs)
            self._by_w, self._load = by_w, None
        return self._by_w

    def __getitem__(self, w: int) -> _WindowUsage:
        return self._windows()[w]

    def get(self, w: int, default=None):
        return self._windows().get(w, default)

    def __bool__(self) -> bool:
        return bool(self.res_of)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Windows):
            return NotImplemented
        mine = (self.res_of, self.shared, self.co_bytes, self._windows())
        return mine == (other.res_of, other.shared, other.co_bytes, other._windows())

    __hash__ = None  # type: ignore[assignment]


#: A usage query (``__USAGE__``) grouped per (window, resource): the jobs on it and their sums as
#: parallel arrays, so that one window's resources are made into dictionaries only when asked
#: (:class:`_WindowUsage`; the rows of a site's hour are ~10^6-10^7 (job, window, resource)).
GROUPED_SQL = """
SELECT w, rtype, res, groupArray(job_id) AS jobs, groupArray(n) AS ns, groupArray(bytes) AS bs,
       groupArray(svc_ns) AS svs
FROM (__USAGE__)
GROUP BY w, rtype, res
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


def _resources(by_w: _Windows, job: str, w: int) -> list[tuple[str, str]]:
    return by_w.res_of.get((job, w), [])


def _others(by_w: _Windows, job: str, w: int) -> set[str]:
    """The other jobs on the job's resources in window w (the detection tests ``shared`` first:
    this set is built for interfered windows only)."""
    out: set[str] = set()
    for res in _resources(by_w, job, w):
        out.update(by_w[w][res])
    out.discard(job)
    return out


def _co_bytes(by_w: _Windows, job: str, w: int) -> int:
    """Bytes other jobs moved on the job's resources in window w."""
    return by_w.co_bytes.get((job, w), 0)
