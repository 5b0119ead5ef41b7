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
``POST /v1/import/darshan`` when ``pharos serve`` holds the chDB directory).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pharos_pipeline.store import Store, ns_to_datetime64

S = 1_000_000_000
#: Modules that are traced requests (handled apart from the counters).
DXT_MODULES = ("DXT_POSIX", "DXT_MPIIO")
#: Modules read but not imported: MPI / Cray profiling, not I/O.
NOT_IMPORTED = ("APMPI", "APXC", "HEATMAP", "MDHIM")
#: Earlier logs of an existing job must start within this window to share its id.
SAME_JOB_WINDOW_NS = 24 * 3600 * S
#: SHA-256 read size.
_CHUNK = 1 << 20
#: Default largest log an import reads (bytes; ``Settings.import_max_bytes`` in the API).
MAX_LOG_BYTES = 256 * 2**20
#: Default longest time (s) reading one log's bytes may take (``Settings.import_timeout_s``).
READ_TIMEOUT_S = 120.0

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


class DarshanImportError(RuntimeError):
    """A log could not be read (not a Darshan log, truncated, unsupported)."""


# -- reading --------------------------------------------------------------------------------


def open_regular(path: Path, max_bytes: int = MAX_LOG_BYTES) -> int:
    """Open ``path`` for reading and return the descriptor, if it is a regular file of at most
    ``max_bytes`` bytes. Never blocks on a FIFO (opened non-blocking, then refused) and never
    reads a device (/dev/zero). Raises DarshanImportError (not regular, too large) or OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DarshanImportError(f"{path}: not a regular file")
        if st.st_size > max_bytes:
            raise DarshanImportError(f"{path}: {st.st_size} bytes, over the import limit of {max_bytes} bytes")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fd_sha256(fd: int, max_bytes: int = MAX_LOG_BYTES, timeout_s: float = READ_TIMEOUT_S, label: str = "") -> str:
    """SHA-256 (hex) of the whole file behind ``fd``, read from its start. Raises
    DarshanImportError when it holds more than ``max_bytes`` bytes (it grew) or reading takes
    longer than ``timeout_s`` seconds; OSError when a read fails."""
    h = hashlib.sha256()
    deadline = time.monotonic() + timeout_s
    total, pos = 0, 0
    while chunk := os.pread(fd, _CHUNK, pos):
        pos += len(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise DarshanImportError(f"{label}: over the import limit of {max_bytes} bytes")
        if time.monotonic() > deadline:
            raise DarshanImportError(f"{label}: reading took longer than {timeout_s:g} s")
        h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path, max_bytes: int = MAX_LOG_BYTES, timeout_s: float = READ_TIMEOUT_S) -> str:
    """SHA-256 (hex) of a regular file of at most ``max_bytes`` bytes (see :func:`open_regular`)."""
    fd = open_regular(path, max_bytes)
    try:
        return fd_sha256(fd, max_bytes, timeout_s, str(path))
    finally:
        os.close(fd)


@dataclass
class _Log:
    """The parts of a Darshan report the importer uses (rank numbers as in the log)."""

    jobid: int
    uid: int
    nprocs: int
    start_ns: int
    end_ns: int
    exe: str
    log_version: str
    lib_version: str
    modules: list[str]
    partial_modules: list[str]
    names: dict[int, str]
    counters: list[tuple[str, int, int, str, float]]  # module, rank, record_id, counter, value
    segments: list[tuple[str, int, int, str, str, int, int, int, int]]
    # (module, rank, record_id, hostname, op, offset, length, start_rel_ns, end_rel_ns)
    dxt_skipped: int
    warnings: list[str]


def _seconds_ns(sec: Any, nsec: Any) -> int:
    return int(sec or 0) * S + int(nsec or 0)


def read_log(path: Path, label: str | None = None) -> _Log:
    """Parse a Darshan log with PyDarshan (``label``: the name errors give, default ``path``).
    Raises DarshanImportError when it cannot be read."""
    import darshan  # PyDarshan; imported late: it loads libdarshan-util

    label = label or str(path)
    notes: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = darshan.DarshanReport(str(path), read_all=True)
        notes += sorted({str(w.message).splitlines()[0] for w in caught})
    except Exception as exc:  # PyDarshan raises RuntimeError, ValueError, OSError, ...
        msg = str(exc).replace(str(path), label)
        raise DarshanImportError(f"{label}: not a readable Darshan log ({type(exc).__name__}: {msg})") from None
    try:
        return _extract(report, notes)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise DarshanImportError(f"{label}: unexpected Darshan record layout ({type(exc).__name__}: {exc})") from exc
    finally:
        close = getattr(report.log, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):  # best effort: the data is already read
                close()


def _extract(report: Any, notes: list[str]) -> _Log:
    job = report.metadata.get("job", {})
    meta = job.get("metadata", {}) or {}
    modules = sorted(report.modules.keys())
    partial = sorted(m for m, info in report.modules.items() if info.get("partial_flag"))
    for m in partial:
        notes.append(f"module {m} is partial: Darshan ran out of record memory, some of its data is missing")
    names = {int(k): str(v) for k, v in (report.name_records or {}).items()}

    counters: list[tuple[str, int, int, str, float]] = []
    skipped_modules = []
    for mod, coll in report.records.items():
        if mod in DXT_MODULES:
            continue
        recs = list(getattr(coll, "_records", coll))
        if mod == "LUSTRE":
            counters += _lustre_counters(recs)
            continue
        spec = report.counters.get(mod) if isinstance(report.counters, dict) else None
        if mod in NOT_IMPORTED or not spec or not spec.get("counters") or spec.get("fcounters") is None:
            if recs:
                skipped_modules.append(mod)
            continue
        cnames, fnames = list(spec["counters"]), list(spec["fcounters"])
        for rec in recs:
            rank, rid = int(rec["rank"]), int(rec["id"])
            for names_, values in ((cnames, rec.get("counters")), (fnames, rec.get("fcounters"))):
                if values is None:
                    continue
                for name, value in zip(names_, values.tolist() if hasattr(values, "tolist") else values, strict=False):
                    if value:
                        counters.append((mod, rank, rid, name, float(value)))
    if skipped_modules:
        notes.append(f"modules not imported (profiling, not I/O): {', '.join(sorted(skipped_modules))}")

    segments: list[tuple[str, int, int, str, str, int, int, int, int]] = []
    posix_ids = set()
    dxt = {
        m: list(getattr(report.records[m], "_records", report.records[m])) for m in DXT_MODULES if m in report.records
    }
    for rec in dxt.get("DXT_POSIX", []):
        if rec.get("read_segments") is not None and len(rec["read_segments"]) + len(rec["write_segments"]) > 0:
            posix_ids.add(int(rec["id"]))
    dxt_skipped = 0
    for mod in DXT_MODULES:
        for rec in dxt.get(mod, []):
            rid, rank, host = int(rec["id"]), int(rec["rank"]), str(rec.get("hostname") or "")
            n = 0
            for op, key in (("read", "read_segments"), ("write", "write_segments")):
                segs = rec.get(key)
                if segs is None or len(segs) == 0:
                    continue
                rows = segs.to_dict("records") if hasattr(segs, "to_dict") else segs
                for s in rows:
                    n += 1
                    if mod == "DXT_MPIIO" and rid in posix_ids:
                        continue
                    segments.append(
                        (
                            mod,
                            rank,
                            rid,
                            host,
                            op,
                            int(s["offset"]),
                            int(s["length"]),
                            round(float(s["start_time"]) * S),
                            round(float(s["end_time"]) * S),
                        )
                    )
            if mod == "DXT_MPIIO" and rid in posix_ids:
                dxt_skipped += n
    if not modules:
        notes.append("log has no module data: imported as a job without I/O")

    return _Log(
        jobid=int(job.get("jobid", 0) or 0),
        uid=int(job.get("uid", 0) or 0),
        nprocs=int(job.get("nprocs", 0) or 0),
        start_ns=_seconds_ns(job.get("start_time_sec"), job.get("start_time_nsec")),
        end_ns=_seconds_ns(job.get("end_time_sec"), job.get("end_time_nsec")),
        exe=str(report.metadata.get("exe", "") or ""),
        log_version=str(job.get("log_ver", "")),
        lib_version=str(meta.get("lib_ver", "")),
        modules=modules,
        partial_modules=partial,
        names=names,
        counters=counters,
        segments=segments,
        dxt_skipped=dxt_skipped,
        warnings=notes,
    )


def _lustre_counters(recs: list[dict]) -> list[tuple[str, int, int, str, float]]:
    out = []
    laid_out: set[int] = set()
    for rec in recs:
        comps = rec.get("components") or []
        if not comps:
            continue
        sizes = [int(c["counters"][0]) for c in comps if len(c.get("counters", [])) > 1]
        counts = [int(c["counters"][1]) for c in comps if len(c.get("counters", [])) > 1]
        osts = {int(o) for c in comps for o in (c.get("ost_ids") if c.get("ost_ids") is not None else [])}
        rank, rid = int(rec["rank"]), int(rec["id"])
        values = {
            "LUSTRE_STRIPE_SIZE": sizes[0] if sizes else 0,
            "LUSTRE_STRIPE_COUNT": max(counts) if counts else 0,
            "LUSTRE_OSTS": len(osts),
            "LUSTRE_COMPONENTS": len(comps),
        }
        out += [("LUSTRE", rank, rid, k, float(v)) for k, v in values.items() if v > 0]
        # which OSTs: one counter per OST id (value 1), for straggler attribution (TOKIO darshan_bad_ost)
        out += [("LUSTRE", rank, rid, f"LUSTRE_OST_ID_{o}", 1.0) for o in sorted(osts)]
        if rid in laid_out:
            continue
        laid_out.add(rid)
        # the layout itself, once per file: extent, stripe size and the OST of each stripe index of
        # every component, so that a DXT request's offset maps to its OST (straggler attribution)
        for c, comp in enumerate(comps):
            cs = [int(v) for v in comp.get("counters", [])]
            ost_ids = comp.get("ost_ids") if comp.get("ost_ids") is not None else []
            if len(cs) < 6 or cs[0] <= 0 or cs[1] <= 0 or len(ost_ids) == 0:
                continue
            out += [
                ("LUSTRE", rank, rid, f"LUSTRE_COMP{c}_STRIPE_SIZE", float(cs[0])),
                ("LUSTRE", rank, rid, f"LUSTRE_COMP{c}_STRIPE_COUNT", float(cs[1])),
                ("LUSTRE", rank, rid, f"LUSTRE_COMP{c}_EXT_START", float(cs[4])),
                ("LUSTRE", rank, rid, f"LUSTRE_COMP{c}_EXT_END", float(cs[5])),  # -1: end of file
            ]
            out += [("LUSTRE", rank, rid, f"LUSTRE_COMP{c}_OST_{k}", float(o)) for k, o in enumerate(ost_ids)]
    return out


# -- storing --------------------------------------------------------------------------------

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


def _choose_job_id(store: Store, log: _Log, sha: str) -> str:
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


def _event_rows(store: Store, job_id: str, log: _Log, name: str | None, ranks: int, host: str) -> list[dict]:
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
) -> LogImport:
    """Import one Darshan log into ``store`` (migrated). Never raises for a bad log: the
    result's ``status`` is ``failed`` and ``error`` says why (no ``log_id``: nothing of a failed
    file is returned); StoreError propagates.

    Only a regular file of at most ``max_bytes`` bytes is read (a FIFO or device such as
    /dev/zero fails at once), its bytes within ``timeout_s`` seconds; the parser reads the very
    file that was checked (``/proc/self/fd``), so a path swapped meanwhile changes nothing.
    ``label`` is the name results and errors give (default: ``path``; an upload's file name)."""
    path = Path(path)
    label = label or str(path)
    try:
        fd = open_regular(path, max_bytes)
    except OSError as exc:
        return LogImport(path=label, status="failed", error=f"{label}: {exc.strerror or exc}")
    except DarshanImportError as exc:
        return LogImport(path=label, status="failed", error=str(exc).replace(str(path), label, 1))
    try:
        return _import_fd(store, fd, path, label, job_id, name, max_bytes, timeout_s)
    finally:
        os.close(fd)


def _import_fd(
    store: Store,
    fd: int,
    path: Path,
    label: str,
    job_id: str | None,
    name: str | None,
    max_bytes: int,
    timeout_s: float,
) -> LogImport:
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
            log = read_log(Path(f"/proc/self/fd/{fd}"), label)
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
) -> list[LogImport]:
    """Import several logs in order (``job_id`` given: all into that job); each as
    :func:`import_log` with ``max_bytes``, ``timeout_s`` and its label (``labels[i]``, default
    the path). ``on_done`` is called after each log (progress bars)."""
    out = []
    for i, p in enumerate(paths):
        label = labels[i] if labels else None
        r = import_log(store, p, job_id=job_id, name=name, max_bytes=max_bytes, timeout_s=timeout_s, label=label)
        out.append(r)
        if on_done:
            on_done(r)
    return out
