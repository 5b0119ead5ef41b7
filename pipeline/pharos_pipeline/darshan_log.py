"""Reading a Darshan log for the import (:mod:`pharos_pipeline.darshan_import`): the file
checked and hashed without blocking on what is not a regular file, then parsed with PyDarshan
(``darshan.DarshanReport(path, read_all=True)``, libdarshan-util inside) into the parts the
importer stores (:class:`DarshanLog`: job record, name records, DXT segments, module counters,
LUSTRE layouts). No store here."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

S = 1_000_000_000
#: Modules that are traced requests (handled apart from the counters).
DXT_MODULES = ("DXT_POSIX", "DXT_MPIIO")
#: Modules read but not imported: MPI / Cray profiling, not I/O.
NOT_IMPORTED = ("APMPI", "APXC", "HEATMAP", "MDHIM")
#: SHA-256 read size.
_CHUNK = 1 << 20
#: Default largest log an import reads (bytes; ``Settings.import_max_bytes`` in the API).
MAX_LOG_BYTES = 256 * 2**20
#: Default longest time (s) reading one log's bytes may take (``Settings.import_timeout_s``).
READ_TIMEOUT_S = 120.0


class DarshanImportError(RuntimeError):
    """A log could not be read (not a Darshan log, truncated, unsupported)."""


def _checked_regular(fd: int, label: str, max_bytes: int) -> int:
    """``fd`` if it is a regular file of at most ``max_bytes`` bytes, set blocking; else closes
    it and raises DarshanImportError."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DarshanImportError(f"{label}: not a regular file")
        if st.st_size > max_bytes:
            raise DarshanImportError(f"{label}: {st.st_size} bytes, over the import limit of {max_bytes} bytes")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: Path, max_bytes: int = MAX_LOG_BYTES) -> int:
    """Open ``path`` for reading and return the descriptor, if it is a regular file of at most
    ``max_bytes`` bytes. Never blocks on a FIFO (opened non-blocking, then refused) and never
    reads a device (/dev/zero). Raises DarshanImportError (not regular, too large) or OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    return _checked_regular(fd, str(path), max_bytes)


def open_beneath(base: Path, rel: str, max_bytes: int = MAX_LOG_BYTES) -> int:
    """Open ``rel`` inside the directory ``base`` without following any symbolic link, and
    return the descriptor of the regular file it names (at most ``max_bytes`` bytes).

    Each component is opened relative to the descriptor of the one before it (``openat``,
    ``O_NOFOLLOW``; directories as ``O_PATH``), so what is opened is the file beneath ``base``
    at the moment of the open: there is no check-then-open window in which a component could be
    swapped for a link leading out (the effect of ``openat2``'s ``RESOLVE_BENEATH |
    RESOLVE_NO_SYMLINKS``). ``base`` itself is the administrator's setting and may be a link.
    Raises ValueError for an empty or absolute ``rel``, a ``..`` component or a NUL byte;
    DarshanImportError for a symbolic link on the way ("symbolic link"), a file that is not
    regular or too large; OSError otherwise (ENOENT, EACCES)."""
    if "\0" in rel:
        raise ValueError("a NUL byte in the path")
    parts = [c for c in rel.split("/") if c not in ("", ".")]
    if not parts or rel.startswith("/") or ".." in parts:
        raise ValueError("give a path relative to the import directory, without '..'")
    dfd = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, comp in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_NOFOLLOW | os.O_CLOEXEC
            flags |= os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY if last else os.O_PATH | os.O_DIRECTORY
            try:
                fd = os.open(comp, flags, dir_fd=dfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _is_link(comp, dfd)):
                    raise DarshanImportError(
                        f"{rel}: {'/'.join(parts[: i + 1])} is a symbolic link (not followed in the import directory)"
                    ) from None
                raise
            if last:
                return _checked_regular(fd, rel, max_bytes)
            os.close(dfd)
            dfd = fd
    finally:
        os.close(dfd)
    raise AssertionError("unreachable")


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


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
class DarshanLog:
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


def read_log(path: Path, label: str | None = None) -> DarshanLog:
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
    # Closed here, by the report's context manager: left to DarshanReport.__del__, the log was
    # closed whenever the garbage collector ran, and when that was inside cffi's (non-reentrant)
    # type lock in this same thread, the import hung for good (reading six logs in a row did).
    with report:
        try:
            return _extract(report, notes)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise DarshanImportError(
                f"{label}: unexpected Darshan record layout ({type(exc).__name__}: {exc})"
            ) from exc


def _extract(report: Any, notes: list[str]) -> DarshanLog:
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

    return DarshanLog(
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
