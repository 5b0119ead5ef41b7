"""Import Darshan logs into the Pharos store (``pharos import darshan LOG...``).

A Darshan log (https://www.mcs.anl.gov/research/projects/darshan/) is read with PyDarshan
(``darshan.DarshanReport(path, read_all=True)``, libdarshan-util inside) and lands in the
same tables as traced jobs, so the summary, phases and insights work on both:

* **DXT_POSIX** segments -> one ``io_requests`` row per request: layer ``client``, op
  ``read``/``write``, ``file_type`` ``regular``, ``count`` 1, ``size`` = ``result`` =
  ``bytes`` = the segment's length, ``offset``, ``rank``, ``path`` from the log's name
  records, ``host`` = ``compute_node`` = the DXT record's hostname. DXT times are seconds
  after the log's start; they become absolute ns from the job record's start time
  (``start_time_sec`` + ``start_time_nsec``). ``producer_id`` is the log id
  (``darshan:<first 16 hex of the log's SHA-256>``), ``seq`` 0, ``record_index`` the
  row's position in the log, ``pid``/``tid``/``dev``/``inode`` 0 and ``fd`` -1 (unknown).
* **DXT_MPIIO** segments are stored the same way, but only for files that have no
  DXT_POSIX segment in the same log: the MPI-IO requests of a POSIX-traced file are the
  same bytes again, and the summary would count them twice. The segments left out are
  counted (``dxt_skipped``); the MPI-IO view of those files stays in the MPIIO_* counters.
* **Module counters** (POSIX, MPI-IO, STDIO, H5F, H5D, PNETCDF_*, DFS, DAOS: every module
  whose records carry Darshan's ``counters``/``fcounters`` arrays) -> ``darshan_counters``,
  long format: one row per (record, counter) with a non-zero value (absent = 0); ``rank``
  -1 is a shared record. **LUSTRE** records become ``LUSTRE_STRIPE_SIZE`` (first
  component), ``LUSTRE_STRIPE_COUNT`` (largest over components), ``LUSTRE_OSTS`` (distinct
  OST ids), ``LUSTRE_COMPONENTS`` and one ``LUSTRE_OST_ID_<id>`` (value 1) per OST the
  file is striped over (straggler attribution, :mod:`pharos_analytics.straggler`), and, once
  per file, its layout per component ``c``: ``LUSTRE_COMP<c>_STRIPE_SIZE`` (bytes),
  ``_STRIPE_COUNT``, ``_EXT_START`` / ``_EXT_END`` (bytes; -1 = end of file) and
  ``LUSTRE_COMP<c>_OST_<k>`` = the OST id of stripe index ``k`` (zeros kept), which maps a DXT
  request's offset to its OST. APMPI/APXC (MPI and Cray profiling, not I/O) and
  heatmaps are not imported; the result says so.
* **Job record** -> ``job_events``: a ``start`` event (the log's start time, ``ranks`` =
  nprocs, ``user`` = uid as text, ``command`` = the exe line split on blanks, ``name`` =
  ``--name`` or the exe's base name, ``host`` = the first DXT hostname or '') and an ``end``
  event (end time, ``exit_code`` 0: Darshan does not record it).
* A row in ``darshan_logs`` (written last) marks the log as completely stored.

**Idempotency.** A log is identified by the SHA-256 of its bytes: a log already in
``darshan_logs`` is skipped (status ``skipped``), whatever its path or the job id asked
for. Each table gets one atomic insert per log; if an import died between inserts, the
next import of the same log finds the rows of its ``log_id`` already in ``io_requests`` /
``darshan_counters`` and does not insert them again (the pipeline's exactly-once idea).

**Job ids.** ``--job-id ID`` puts every given log into job ``ID`` (several logs of one job,
e.g. the 24 DLIO logs). Without it the job id is the log's Darshan ``jobid``, or
``darshan-<first 12 hex of the SHA-256>`` when that is 0 (no scheduler). When a job with
that id already exists and is *not* the same Darshan job (it was traced by Pharos, or
its earlier logs have another uid or jobid, or started more than 24 h apart), the id gets
the suffix ``-<first 8 hex of the SHA-256>`` so unrelated jobs never mix. Logs that join a
job take consecutive ranks: a log's ranks are shifted by ``rank_offset``, the sum of the
nprocs of the logs imported into that job before it (24 one-process DLIO logs become ranks
0..23). The job's start/end events span all its logs.

**Partial and empty logs** import with warnings (modules whose buffers overflowed are
listed in ``partial_modules``; a log without module data becomes a job with events and no
I/O); an unreadable file is reported as ``failed`` and the other logs go on.

Pure store code: the caller opens the store (CLI: directly, or through the API's
``POST /v1/import/darshan`` when ``pharos serve`` holds the chDB directory). Reading and
parsing a log: :mod:`pharos_pipeline.darshan_log`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pharos_core.store import Store, ns_to_datetime64

from .darshan_log import (
    MAX_LOG_BYTES,
    READ_TIMEOUT_S,
    DarshanImportError,
    DarshanLog,
    S,
    fd_sha256,
    open_regular,
)
from .darshan_parse import ParseLimits, read_log_bounded

#: Earlier logs of an existing job must start within this window to share its id.
SAME_JOB_WINDOW_NS = 24 * 3600 * S

Status = Literal["imported", "skipped", "failed"]

# One import at a time per process: the "already imported?" check and the inserts must not
# interleave (the API may import from several requests).
_IMPORT_LOCK = threading.Lock()


@dataclass
class LogImport:
    """What happened to one log. Counts are rows written (0 when skipped or failed)."""

    path: str
    status: Status
    job_id: str | None = None
    log_id: str | None = None
    dxt_segments: int = 0
    dxt_skipped: int = 0
    counter_rows: int = 0
    ranks: int = 0
    rank_offset: int = 0
    modules: list[str] = field(default_factory=list)
    partial_modules: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


LOG_BY_SHA_SQL = "SELECT job_id, log_id FROM darshan_logs FINAL WHERE log_sha256 = {sha:String} LIMIT 1"
JOB_LOGS_SQL = """
SELECT darshan_jobid, uid, toUnixTimestamp64Nano(start) AS start_ns, nprocs
FROM darshan_logs FINAL WHERE job_id = {job_id:String}
"""
JOB_EVENT_ROWS_SQL = """
SELECT kind, toUnixTimestamp64Nano(time) AS time_ns, name, command, user, ranks, host, exit_code, cgroup
FROM job_events FINAL WHERE job_id = {job_id:String}
"""
HAS_REQUESTS_SQL = "SELECT count() AS n FROM io_requests WHERE producer_id = {log_id:String} AND seq = 0"
HAS_COUNTERS_SQL = "SELECT count() AS n FROM darshan_counters WHERE log_id = {log_id:String}"


def _log_id(sha: str) -> str:
    return f"darshan:{sha[:16]}"


def _choose_job_id(store: Store, log: DarshanLog, sha: str) -> str:
    base = str(log.jobid) if log.jobid else f"darshan-{sha[:12]}"
    events = store.query(JOB_EVENT_ROWS_SQL, {"job_id": base})
    logs = store.query(JOB_LOGS_SQL, {"job_id": base})
    if not events and not logs:
        return base
    same = bool(logs) and all(
        int(r["darshan_jobid"]) == log.jobid
        and int(r["uid"]) == log.uid
        and abs(int(r["start_ns"]) - log.start_ns) <= SAME_JOB_WINDOW_NS
        for r in logs
    )
    return base if same else f"{base}-{sha[:8]}"


def _exe_name(exe: str) -> str:
    first = exe.split()[0] if exe.split() else ""
    return os.path.basename(first)


def _event_rows(store: Store, job_id: str, log: DarshanLog, name: str | None, ranks: int, host: str) -> list[dict]:
    """start/end events spanning the job's earlier events and this log."""
    old = {r["kind"]: r for r in store.query(JOB_EVENT_ROWS_SQL, {"job_id": job_id})}
    s, e = old.get("start"), old.get("end")
    start_ns = min(log.start_ns, int(s["time_ns"])) if s else log.start_ns
    end_ns = max(log.end_ns, int(e["time_ns"])) if e else log.end_ns
    start = {
        "job_id": job_id,
        "kind": "start",
        "time": ns_to_datetime64(start_ns),
        "name": name or (s["name"] if s and s["name"] else _exe_name(log.exe)),
        "command": list(s["command"]) if s and s["command"] else log.exe.split(),
        "user": s["user"] if s and s["user"] else str(log.uid),
        "ranks": max(ranks, int(s["ranks"]) if s else 0),
        "host": s["host"] if s and s["host"] else host,
        "exit_code": 0,
        "cgroup": s["cgroup"] if s else "",
    }
    end = {
        "job_id": job_id,
        "kind": "end",
        "time": ns_to_datetime64(end_ns),
        "name": "",
        "command": [],
        "user": "",
        "ranks": 0,
        "host": "",
        "exit_code": int(e["exit_code"]) if e else 0,
        "cgroup": "",
    }
    return [start, end]


def import_log(
    store: Store,
    path: str | Path,
    job_id: str | None = None,
    name: str | None = None,
    *,
    max_bytes: int = MAX_LOG_BYTES,
    timeout_s: float = READ_TIMEOUT_S,
    label: str | None = None,
    limits: ParseLimits | None = None,
) -> LogImport:
    """Import one Darshan log into ``store`` (migrated). Never raises for a bad log: the
    result's ``status`` is ``failed`` and ``error`` says why (no ``log_id``: nothing of a failed
    file is returned); StoreError propagates.

    Only a regular file of at most ``max_bytes`` bytes is read (a FIFO or device such as
    /dev/zero fails at once), its bytes within ``timeout_s`` seconds; the parser reads the very
    file that was checked (``/proc/self/fd``), so a path swapped meanwhile changes nothing.
    ``label`` is the name results and errors give (default: ``path``; an upload's file name).
    The parse runs in a child process within ``limits`` (CPU time, memory, wall time:
    :func:`pharos_pipeline.darshan_parse.read_log_bounded`)."""
    path = Path(path)
    label = label or str(path)
    try:
        fd = open_regular(path, max_bytes)
    except OSError as exc:
        return LogImport(path=label, status="failed", error=f"{label}: {exc.strerror or exc}")
    except DarshanImportError as exc:
        return LogImport(path=label, status="failed", error=str(exc).replace(str(path), label, 1))
    try:
        return import_fd(store, fd, label, job_id, name, max_bytes=max_bytes, timeout_s=timeout_s, limits=limits)
    finally:
        os.close(fd)


def import_fd(
    store: Store,
    fd: int,
    label: str,
    job_id: str | None = None,
    name: str | None = None,
    *,
    max_bytes: int = MAX_LOG_BYTES,
    timeout_s: float = READ_TIMEOUT_S,
    limits: ParseLimits | None = None,
) -> LogImport:
    """Import the Darshan log open on ``fd`` (a regular file the caller checked, e.g. with
    :func:`~pharos_pipeline.darshan_log.open_regular` or
    :func:`~pharos_pipeline.darshan_log.open_beneath`; read from its start, not closed here),
    as :func:`import_log` does. ``label`` names it in the result."""
    try:
        sha = fd_sha256(fd, max_bytes, timeout_s, label)
    except OSError as exc:
        return LogImport(path=label, status="failed", error=f"{label}: {exc.strerror or exc}")
    except DarshanImportError as exc:
        return LogImport(path=label, status="failed", error=str(exc))
    log_id = _log_id(sha)
    with _IMPORT_LOCK:
        done = store.query(LOG_BY_SHA_SQL, {"sha": sha})
        if done:
            return LogImport(
                path=label,
                status="skipped",
                job_id=done[0]["job_id"],
                log_id=log_id,
                warnings=[f"already imported as job {done[0]['job_id']} ({log_id})"],
            )
        try:
            log = read_log_bounded(fd, label, limits)
        except DarshanImportError as exc:
            return LogImport(path=label, status="failed", error=str(exc))
        jid = job_id or _choose_job_id(store, log, sha)
        offset = sum(int(r["nprocs"]) for r in store.query(JOB_LOGS_SQL, {"job_id": jid}))
        result = LogImport(
            path=label,
            status="imported",
            job_id=jid,
            log_id=log_id,
            ranks=log.nprocs,
            rank_offset=offset,
            modules=log.modules,
            partial_modules=log.partial_modules,
            warnings=list(log.warnings),
            dxt_skipped=log.dxt_skipped,
        )
        shift = lambda r: r + offset if r >= 0 else r  # noqa: E731 - shared records stay -1
        comm = _exe_name(log.exe)[:15]

        req_rows = [
            {
                "start": ns_to_datetime64(log.start_ns + st),
                "end": ns_to_datetime64(log.start_ns + max(en, st)),
                "duration_ns": max(en - st, 0),
                "layer": "client",
                "host": host,
                "job_id": jid,
                "rank": shift(rank),
                "pid": 0,
                "tid": 0,
                "comm": comm,
                "op": op,
                "file_type": "regular",
                "dev": 0,
                "inode": 0,
                "path": log.names.get(rid, ""),
                "fd": -1,
                "offset": off,
                "size": length,
                "result": length,
                "count": 1,
                "bytes": length,
                "compute_node": host,
                "producer_id": log_id,
                "seq": 0,
                "record_index": i,
            }
            for i, (mod, rank, rid, host, op, off, length, st, en) in enumerate(log.segments)
        ]
        if req_rows and int(store.query(HAS_REQUESTS_SQL, {"log_id": log_id})[0]["n"]) == 0:
            result.dxt_segments = store.insert_rows("io_requests", req_rows)
        elif req_rows:
            result.dxt_segments = len(req_rows)  # stored by an import that stopped before its marker

        ctr_rows = [
            {
                "job_id": jid,
                "log_id": log_id,
                "module": mod,
                "rank": shift(rank),
                "record_id": rid,
                "path": log.names.get(rid, ""),
                "counter": counter,
                "value": value,
            }
            for mod, rank, rid, counter, value in log.counters
        ]
        if ctr_rows and int(store.query(HAS_COUNTERS_SQL, {"log_id": log_id})[0]["n"]) == 0:
            result.counter_rows = store.insert_rows("darshan_counters", ctr_rows)
        elif ctr_rows:
            result.counter_rows = len(ctr_rows)

        host = next((s[3] for s in log.segments if s[3]), "")
        store.insert_rows("job_events", _event_rows(store, jid, log, name, offset + log.nprocs, host))
        store.insert_rows(
            "darshan_logs",
            [
                {
                    "log_sha256": sha,
                    "log_id": log_id,
                    "job_id": jid,
                    "file_name": Path(label).name,
                    "darshan_jobid": log.jobid,
                    "uid": log.uid,
                    "exe": log.exe,
                    "nprocs": log.nprocs,
                    "rank_offset": offset,
                    "start": ns_to_datetime64(log.start_ns),
                    "end": ns_to_datetime64(max(log.end_ns, log.start_ns)),
                    "log_version": log.log_version,
                    "lib_version": log.lib_version,
                    "modules": log.modules,
                    "partial_modules": log.partial_modules,
                    "dxt_segments": result.dxt_segments,
                    "dxt_skipped": log.dxt_skipped,
                    "counter_rows": result.counter_rows,
                }
            ],
        )
        if log.dxt_skipped:
            result.warnings.append(
                f"{log.dxt_skipped} DXT_MPIIO segment(s) of POSIX-traced files not stored as requests "
                "(the same bytes as their DXT_POSIX segments; see the MPIIO_* counters)"
            )
        _attribute_stragglers(store, jid, result)
        return result


def _attribute_stragglers(store: Store, job_id: str, result: LogImport) -> None:
    """A slow OST found in the job's own log (pharos_analytics.straggler) becomes an ``anomalies``
    row (kind straggler_resource); a failure here is a warning, never a failed import."""
    try:
        from pharos_analytics.straggler import record_straggler_anomalies

        rep = record_straggler_anomalies(store, job_id)
    except Exception as exc:  # the import itself succeeded; attribution is best effort
        result.warnings.append(f"straggler attribution failed: {str(exc).splitlines()[0][:200]}")
        return
    for f in rep.findings:
        result.warnings.append(
            f"slow {f.resource_type} {f.resource}: {len(f.files)} file(s) {f.verdict.ratio:.1f}x slower than on its "
            "peers (stored in anomalies as straggler_resource)"
        )


def import_logs(
    store: Store,
    paths: list[str | Path],
    job_id: str | None = None,
    name: str | None = None,
    on_done: Callable[[LogImport], None] | None = None,
    *,
    max_bytes: int = MAX_LOG_BYTES,
    timeout_s: float = READ_TIMEOUT_S,
    labels: list[str] | None = None,
    limits: ParseLimits | None = None,
) -> list[LogImport]:
    """Import several logs in order (``job_id`` given: all into that job); each as
    :func:`import_log` with ``max_bytes``, ``timeout_s``, ``limits`` and its label (``labels[i]``, default
    the path). ``on_done`` is called after each log (progress bars)."""
    out = []
    for i, p in enumerate(paths):
        label = labels[i] if labels else None
        r = import_log(
            store, p, job_id=job_id, name=name, max_bytes=max_bytes, timeout_s=timeout_s, label=label, limits=limits
        )
        out.append(r)
        if on_done:
            on_done(r)
    return out
