"""Rules on the job's files and what it moves through them: redundant reads, many small files,
STDIO, reads of its own writes (Drishti P09, S01, Pharos)."""

from __future__ import annotations

import bisect

from ..diagnosis_config import DiagnosisConfig
from ..phases import JobPhases
from .evidence import TRACE_RAW_SQL, Counters, Trace
from .model import Insight, mib, pct


def redundant_reads(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Redundant reads: the same bytes read more than once. Source: Drishti P09.

    Per file, the bytes read beyond the file's read extent (counters: POSIX_BYTES_READ -
    (POSIX_MAX_BYTE_READ + 1); trace: bytes read - (highest read end - lowest read offset))
    are certainly read twice; fires above ``redundant_min_bytes`` (bytes, default 1 MiB).
    """
    if c.present and c.posix:
        per = [
            (r.g("POSIX_BYTES_READ") - (r.g("POSIX_MAX_BYTE_READ") + 1), c.name(r))
            for r in c.posix
            if r.g("POSIX_BYTES_READ") > 0
        ]
        red = sum(max(x, 0) for x, _ in per)
        top = max(per, default=(0, ""))[1]
        src = "counters"
    elif t.files:
        red, top, src = t.f("redundant_bytes"), t.files["redundant_top_file"], "trace"
    else:
        return []
    if red <= cfg.redundant_min_bytes:
        return []
    return [
        Insight(
            "redundant_reads",
            "Redundant reads",
            "warn",
            src,  # type: ignore[arg-type]
            f"at least {mib(red)} were read more than once (most in {top})",
            {"redundant_bytes": int(red), "top_file": top},
            [
                "Read the data once and keep it in memory, or share it between ranks (MPI broadcast) "
                "instead of every rank reading it."
            ],
            "Drishti P09 (redundant read traffic)",
        )
    ]


def many_small_files(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Many small files. Source: Pharos.

    Fires when at least ``many_files_absolute`` (files, default 1000) data files each
    moved fewer than ``small_file_bytes`` (bytes, default 1 MiB). Counters: POSIX and
    STDIO records summed per file; trace: data requests per file.
    """
    if c.present and (c.posix or c.stdio):
        per: dict[str, float] = {}
        for r in c.posix:
            per[c.name(r)] = per.get(c.name(r), 0.0) + r.g("POSIX_BYTES_READ") + r.g("POSIX_BYTES_WRITTEN")
        for r in c.stdio:
            per[c.name(r)] = per.get(c.name(r), 0.0) + r.g("STDIO_BYTES_READ") + r.g("STDIO_BYTES_WRITTEN")
        small = sum(1 for v in per.values() if 0 < v < cfg.small_file_bytes)
        files, src = len(per), "counters"
    elif t.files:
        small, files, src = int(t.f("small_files")), int(t.f("n_files")), "trace"
    else:
        return []
    if small < cfg.many_files_absolute:
        return []
    return [
        Insight(
            "many_small_files",
            "Many small files",
            "warn",
            src,  # type: ignore[arg-type]
            f"{small} of {files} files each moved less than {mib(cfg.small_file_bytes)}",
            {"small_files": small, "files": files, "small_file_bytes": cfg.small_file_bytes},
            [
                "Pack small files into fewer large ones (HDF5/NetCDF containers, tar, record formats); "
                "each file costs metadata operations on the file system."
            ],
            "Pharos",
        )
    ]


def stdio_heavy(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Heavy use of STDIO. Source: Drishti S01 (interface_stdio): STDIO bytes / (POSIX +
    STDIO bytes) above ``interface_stdio_ratio`` (share 0-1, default 0.1), and at least
    ``stdio_min_bytes`` (bytes, default 1 MiB; Pharos) through STDIO. Counters only."""
    if not c.present:
        return []
    sb = sum(r.g("STDIO_BYTES_READ") + r.g("STDIO_BYTES_WRITTEN") for r in c.stdio)
    pb = sum(r.g("POSIX_BYTES_READ") + r.g("POSIX_BYTES_WRITTEN") for r in c.posix)
    if sb < cfg.stdio_min_bytes or sb / (sb + pb) <= cfg.interface_stdio_ratio:
        return []
    return [
        Insight(
            "stdio_heavy",
            "STDIO carries much of the data",
            "warn",
            "counters",
            f"{pct(sb / (sb + pb))} of the bytes ({mib(sb)}) go through STDIO (fopen/fread/fwrite)",
            {"stdio_bytes": int(sb), "posix_bytes": int(pb), "share": sb / (sb + pb)},
            ["Use POSIX or MPI-IO for bulk data: STDIO buffers in small chunks."],
            "Drishti S01: interface_stdio",
        )
    ]


def read_after_write(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Reads of bytes the job wrote earlier. Source: Pharos.

    Sequential scan, in time order, of the data records of files both read and written
    (at most ``scan_max_records`` records; the rest is not scanned and the insight says
    so): the written byte ranges of each file are kept as a union of intervals, and a read
    counts the bytes it overlaps. Fires above ``redundant_min_bytes`` (bytes, default
    1 MiB). Trace only (Darshan counters do not keep byte ranges).
    """
    if not t.files:
        return []
    rows = t.store.query(TRACE_RAW_SQL, {**t.p, "limit": cfg.scan_max_records + 1})
    truncated = len(rows) > cfg.scan_max_records
    rows = rows[: cfg.scan_max_records]
    written: dict[str, tuple[list[int], list[int]]] = {}
    raw = 0
    files: dict[str, int] = {}
    for r in rows:
        f, lo = r["file"], int(r["offset"])
        hi = lo + int(r["bytes"])
        starts, ends = written.setdefault(f, ([], []))
        if int(r["is_read"]):
            n = _overlap(starts, ends, lo, hi)
            raw += n
            if n:
                files[f] = files.get(f, 0) + n
        else:
            _add_interval(starts, ends, lo, hi)
    if raw <= cfg.redundant_min_bytes:
        return []
    top = max(files, key=files.get)  # type: ignore[arg-type]
    return [
        Insight(
            "read_after_write",
            "Reads of data written earlier",
            "info",
            "trace",
            f"{mib(raw)} read back after the job wrote them ({len(files)} file(s), most in {top})"
            + (f"; only the first {cfg.scan_max_records} records were scanned" if truncated else ""),
            {"bytes": raw, "files": len(files), "top_file": top, "scanned_records": len(rows), "truncated": truncated},
            [
                "Keep data the job reads back in memory, or hand it between ranks by messages; if it is a "
                "checkpoint verification, consider checksums at write time."
            ],
            "Pharos",
        )
    ]


def _add_interval(starts: list[int], ends: list[int], lo: int, hi: int) -> None:
    """Add [lo, hi) to the sorted, disjoint intervals (starts[i], ends[i])."""
    if hi <= lo:
        return
    i = bisect.bisect_left(ends, lo)  # first interval ending at or after lo
    j = bisect.bisect_right(starts, hi)  # intervals [i, j) touch [lo, hi]
    if i < j:
        lo, hi = min(lo, starts[i]), max(hi, ends[j - 1])
    starts[i:j] = [lo]
    ends[i:j] = [hi]


def _overlap(starts: list[int], ends: list[int], lo: int, hi: int) -> int:
    """Bytes of [lo, hi) covered by the intervals."""
    n = 0
    i = bisect.bisect_right(ends, lo)
    while i < len(starts) and starts[i] < hi:
        n += max(0, min(hi, ends[i]) - max(lo, starts[i]))
        i += 1
    return n
