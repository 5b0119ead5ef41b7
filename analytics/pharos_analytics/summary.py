"""Per-job I/O summary and job list, aggregated in ClickHouse.

Every number is computed by SQL in the store (named query constants below, bound
parameters for every input); Python only reshapes the few aggregate rows. The counters
follow Darshan's POSIX module where it has one (bytes, op counts, access-size histogram,
cumulative I/O time); the I/O pattern follows Beacon (NSDI'19 §4, see
:mod:`pharos_analytics.pattern`).

Definitions used throughout (one layer at a time, ``client`` by default):

* *data ops*: ``read``/``pread``/``readv`` (reads) and ``write``/``pwrite``/``writev``
  (writes) on **regular** files. ``bytes_read``/``bytes_written``, the size histogram,
  ``first_io``/``last_io`` and ``io_time_s`` count data ops on data files only (below),
  as Darshan excludes system paths by default (DARSHAN_EXCLUDE_DIRS: /etc, /dev, /usr,
  /lib, /proc, /sys, ...): loading shared libraries is not the job's I/O.
* *data files*: regular files outside system paths
  (:data:`pharos_analytics.pattern.SYSTEM_PREFIXES`) that saw data ops. ``files``,
  ``n_files``, ``io_ranks`` and ``pattern`` use data files only. A file is its path, or
  ``dev:<dev>:inode:<inode>`` when the path is unknown.
* *non-file ops*: any op on pipes, sockets and character devices (terminals), and data ops on
  the standard streams (path ``<STDIN>``/``<STDOUT>``/``<STDERR>``: descriptors 0-2 inherited
  from the launcher, as Darshan's STDIO module names them; ``by_type`` key ``stdio``), counted
  apart.
* ``ops``: requests per op on regular files plus metadata ops (open, close, fsync,
  fdatasync, stat, unlink, mkdir, rename) on anything but non-file descriptors;
  everything else (block-layer ops, data ops on directories or unknown file types) is in
  ``other_ops``, so ``sum(ops) + non_file_ops.requests + sum(other_ops) == requests``.
* A row of ``io_requests`` is a run of ``count`` merged requests (Beacon's compression);
  ``records`` counts rows, ``requests`` sums ``count``; ``data_records``/``data_requests``
  do the same for data ops on data files, so their ratio is the merge ratio of the job's
  data I/O (metadata ops are never merged).
* A replayed request counts once (forwarder layer): a FUSE mount that fails over replays an
  idempotent request on another forwarding node, and when the first node had executed it both
  daemons recorded it. Every figure counts a replay record only when no other record of its
  ``(compute_node, request_id)`` exists (:mod:`pharos_analytics.replays_sql`): the original's
  forwarding node is the one in ``forwarding_nodes``. ``replayed_requests`` counts the replay
  records' requests, ``duplicate_requests`` those of them left out.

Darshan jobs (``source`` ``"darshan-counters"`` or ``"darshan-counters+dxt"``): on the
``client`` layer, a job with rows in ``darshan_counters`` (of completely imported logs) takes its
totals from the module counters (:data:`JOB_DARSHAN_SQL`), whether or not its logs
have DXT: the counters see every request of every file, while DXT never traces STDIO, DFS or
DAOS and stops at its trace memory limit. Without DXT rows the source is ``darshan-counters``;
with DXT rows it is ``darshan-counters+dxt``: ``records``/``data_records`` then count the DXT
rows (the per-request detail that phases and heat maps use), every other figure below comes
from the counters, and ``dxt`` says how much the DXT rows cover
(:func:`pharos_analytics.summary_dxt.job_dxt`). A job that also has client data rows traced by
Pharos (a log imported into a traced job with ``--job-id``) keeps the traces' figures. Per
log, the POSIX, STDIO and DFS modules are used; MPI-IO only for a log with neither POSIX nor
DFS (MPI-IO bytes are the POSIX bytes one layer up, or the DFS bytes with ROMIO's DAOS
driver, ``ad_daos``, which calls ``dfs_readx``/``dfs_writex``); DAOS only for a log without
DFS (DFS keeps its files and directories in DAOS objects: the DAOS module sees the DFS bytes
again plus DFS's own superblock and directory objects; darshan-dfs-log-format.h and
darshan-daos-log-format.h: one record per DFS file, one per DAOS object; the ior_daos DFS log:
DFS 16 MiB read + 16 MiB written, DAOS the same plus 528 B read and 88 B written). Never two
modules over the same bytes. The standard streams ``<STDIN>``/``<STDOUT>``/``<STDERR>`` count
as non-file ops (``by_type`` key ``stdio``). Counter -> summary field:

* ``bytes_read``/``bytes_written`` (bytes): ``POSIX_BYTES_READ``/``_WRITTEN`` +
  ``STDIO_BYTES_READ``/``_WRITTEN`` + ``DFS_BYTES_READ``/``_WRITTEN`` (``MPIIO_BYTES_*`` for
  logs with neither POSIX nor DFS, ``DAOS_BYTES_*`` for logs without DFS).
* ``ops`` (requests): ``read`` = ``POSIX_READS`` + ``STDIO_READS`` + ``DFS_READS`` +
  ``DFS_READXS`` (or ``MPIIO_{INDEP,COLL,SPLIT,NB}_READS``; ``DAOS_OBJ_FETCHES`` +
  ``DAOS_ARRAY_READS`` + ``DAOS_KV_GETS``), ``write`` likewise (``*_WRITES``, ``DFS_WRITEXS``,
  ``DAOS_OBJ_UPDATES``, ``DAOS_ARRAY_WRITES``, ``DAOS_KV_PUTS``), ``open`` = ``POSIX_OPENS`` +
  ``STDIO_OPENS`` + ``DFS_OPENS`` + ``DFS_GLOBAL_OPENS`` (or ``MPIIO_{INDEP,COLL}_OPENS``;
  ``DAOS_{OBJ,ARRAY,KV}_OPENS``), ``stat`` = ``POSIX_STATS`` + ``DFS_STATS``, ``fsync`` =
  ``POSIX_FSYNCS`` (or ``MPIIO_SYNCS``), ``fdatasync`` = ``POSIX_FDSYNCS``. Seeks, mmaps,
  dup/fileno calls and DFS lookups are not I/O requests in Pharos' op model and are left out.
  ``requests`` = ``data_requests`` + metadata ops; ``records`` = ``data_records`` = 0 without
  DXT rows (no stored rows), the DXT rows with them.
* ``size_histogram``: ``POSIX_SIZE_{READ,WRITE}_<bin>`` (``MPIIO_SIZE_*_AGG_<bin>``,
  ``DFS_SIZE_*_<bin>``, ``DAOS_SIZE_*_<bin>``); STDIO has no histogram, so its requests are
  not binned.
* ``io_time_s`` (s): ``POSIX_F_READ_TIME`` + ``POSIX_F_WRITE_TIME`` (+ STDIO/DFS/MPI-IO/DAOS
  alike).
* ``files``/``n_files``: records (by path) with bytes, reads, writes or opens.
  ``io_ranks``/``pattern``: ranks >= 0 of those records; a shared record (rank -1,
  reduced over ranks) stands for every rank of its log (``darshan_logs.nprocs``,
  shifted by ``rank_offset``).
* ``first_io``/``last_io``: with a complete DXT (``dxt.partial`` false), the first DXT request's
  start and the last one's end (real per-request times); otherwise the earliest
  ``darshan_logs.start`` and latest ``end`` of the job's logs (the counters carry no absolute
  times, and a partial DXT misses requests), so ``io_span_s`` is the logs' span.
  ``bandwidth_mib_s`` divides the counters' bytes by that span.
* ``failed_requests`` = 0: Darshan counts no failed requests.
* ``dxt`` (:class:`~pharos_analytics.summary_types.DxtCoverage`): DXT bytes against the POSIX
  (or MPI-IO) counter bytes, ``partial`` when DXT holds less or a log marks DXT partial.

Rows older than the table's TTL (90 days) are gone; a job then shows only its events.
"""

from __future__ import annotations

from dataclasses import replace

from pharos_core.store import Store

from .coverage import job_coverage
from .pattern import SYSTEM_PATH_REGEX, DirectionFanIn, Pattern, classify_fan_in, decide_directions, direction_pattern
from .summary_dxt import job_dxt
from .summary_sql import (
    DATA_OPS,
    JOB_DARSHAN_SQL,
    JOB_DROPS_SQL,
    JOB_EVENTS_SQL,
    JOB_FAN_IN_SQL,
    JOB_FILES_SQL,
    JOB_NODES_SQL,
    JOB_OPS_SQL,
    JOB_REPLAYS_SQL,
    JOB_SIZE_HISTOGRAM_SQL,
    JOBS_COUNT_SQL,
    JOBS_PAGE_BYTES_SQL,
    JOBS_PAGE_DARSHAN_SQL,
    JOBS_PAGE_FAN_IN_SQL,
    JOBS_PAGE_SQL,
    LAYERS,
    META_OPS,
    NON_FILE_TYPES,
    READ_OPS,
    SIZE_BINS,
    ns_to_datetime,
)
from .summary_types import (
    Drops,
    DxtCoverage,
    FileSummary,
    JobListItem,
    JobState,
    JobSummary,
    NonFileOps,
    SummarySource,
)

# --------------------------------------------------------------------------------------
# Helpers


def _state(ev: dict | None) -> JobState:
    if ev is None or not (ev["has_start"] or ev["has_end"]):
        return "unknown"
    if not ev["has_end"]:
        return "running"
    return "finished" if int(ev["exit_code"]) == 0 else "failed"


def _event_fields(ev: dict | None) -> dict:
    """The job's fields from its events (a row of :data:`JOB_EVENTS_SQL` or
    :data:`JOBS_PAGE_SQL`; ``None``: no event): name, user, host, ranks from the start event,
    exit code from the end event, start and end (UTC), state."""
    has_start = bool(ev and ev["has_start"])
    has_end = bool(ev and ev["has_end"])
    return {
        "name": ev["name"] if has_start else None,
        "user": ev["user"] if has_start else None,
        "host": ev["host"] if has_start else None,
        "ranks": int(ev["ranks"]) if has_start else None,
        "exit_code": int(ev["exit_code"]) if has_end else None,
        "start": ns_to_datetime(ev["start_ns"]) if has_start else None,
        "end": ns_to_datetime(ev["end_ns"]) if has_end else None,
        "state": _state(ev),
    }


def _check_layer(layer: str) -> None:
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; expected one of {', '.join(LAYERS)}")


def fan_in_patterns(
    fan: dict | None, bytes_read: int, bytes_written: int
) -> tuple[int, int, Pattern, dict[str, Pattern], Pattern]:
    """(io_ranks, n_files, pattern, {"read": p, "write": p}, fan-in pattern) from a fan-in row
    (the columns of :func:`~pharos_analytics.summary_sql.fan_in_columns`) and the bytes read and
    written (bytes). Each direction's pattern is decided by volume over its shared and private
    files (:func:`pharos_analytics.pattern.direction_pattern`), the job's by Beacon's volume
    dominance over the two directions (:func:`pharos_analytics.pattern.decide_directions`); the
    fan-in pattern is that of all data files together."""
    if fan is None:
        return 0, 0, "none", {"read": "none", "write": "none"}, "none"

    def g(k):
        return int(fan.get(k) or 0)

    fan_in = classify_fan_in(g("n_ranks"), g("n_files"), g("max_fan_in"))
    patterns: dict[str, Pattern] = {}
    for d in ("read", "write"):
        stats = DirectionFanIn(
            n_ranks=g(f"n_{d}_ranks"),
            n_files=g(f"n_{d}_files"),
            max_fan_in=g(f"max_{d}_fan_in"),
            shared_files=g(f"n_{d}_shared_files"),
            shared_ranks=g(f"n_{d}_shared_ranks"),
            shared_bytes=g(f"{d}_shared_bytes"),
            top_shared_bytes=g(f"{d}_top_shared_bytes"),
            private_files=g(f"n_{d}_private_files"),
            private_ranks=g(f"n_{d}_private_ranks"),
            private_bytes=g(f"{d}_private_bytes"),
        )
        patterns[d] = direction_pattern(stats)[0]
    return (
        g("n_ranks"),
        g("n_files"),
        decide_directions(patterns, bytes_read, bytes_written, fan_in),
        patterns,
        fan_in,
    )


def _darshan_figures(store: Store, job_id: str, files_limit: int) -> dict | None:
    """The JobSummary fields computed from the job's Darshan counters (:data:`JOB_DARSHAN_SQL`),
    ``None`` when the job has none (every field as without DXT rows: ``records`` 0, the logs'
    span). Units and counter names: see the module docstring."""
    r = store.query(JOB_DARSHAN_SQL, {"job_id": job_id, "limit": files_limit})[0]
    if not int(r["counted_files"]):
        return None

    def g(k):
        return int(r[k] or 0)

    reads, writes = g("reads"), g("writes")
    ops = {
        "read": reads,
        "write": writes,
        "open": g("opens"),
        "stat": g("stats"),
        "fsync": g("fsyncs"),
        "fdatasync": g("fdsyncs"),
    }
    ops = {op: n for op, n in sorted(ops.items()) if n}
    hist = {
        d: {label: int(r[f"hist_{d}"][i]) if len(r[f"hist_{d}"]) > i else 0 for i, (label, _) in enumerate(SIZE_BINS)}
        for d in ("read", "write")
    }
    io_ranks, n_files, pattern, patterns, fan_in = fan_in_patterns(r, g("bytes_read"), g("bytes_written"))
    first_ns, last_ns = g("start_ns") or None, g("end_ns") or None
    span_s = (last_ns - first_ns) / 1e9 if first_ns and last_ns else None
    total = g("bytes_read") + g("bytes_written")
    stream_requests = g("stream_requests")
    return {
        "source": "darshan-counters",
        "io_ranks": io_ranks,
        "pattern": pattern,
        "patterns": patterns,
        "fan_in_pattern": fan_in,
        "bytes_read": g("bytes_read"),
        "bytes_written": g("bytes_written"),
        "ops": ops,
        "other_ops": {},
        "non_file_ops": NonFileOps(
            requests=stream_requests,
            bytes=g("stream_bytes"),
            by_type={"stdio": stream_requests} if stream_requests else {},
        ),
        "failed_requests": 0,
        "records": 0,
        "requests": sum(ops.values()) + stream_requests,
        "data_records": 0,
        "data_requests": reads + writes,
        "size_histogram": hist,
        "files": [
            FileSummary(
                path=f[0],
                bytes_read=int(f[1]),
                bytes_written=int(f[2]),
                reads=int(f[3]),
                writes=int(f[4]),
                ranks=int(f[5]),
            )
            for f in r["files"]
        ],
        "n_files": n_files,
        "first_io": ns_to_datetime(first_ns),
        "last_io": ns_to_datetime(last_ns),
        "io_time_s": float(r["io_time_s"] or 0.0),
        "io_span_s": span_s,
        "bandwidth_mib_s": total / 2**20 / span_s if total and span_s and span_s > 0 else None,
    }


def _darshan_totals(store: Store, job_id: str, files_limit: int) -> tuple[dict | None, DxtCoverage | None]:
    """The JobSummary fields a Darshan job takes from its counters, and its DXT coverage
    (:func:`pharos_analytics.summary_dxt.job_dxt`; ``None`` without DXT). The fields are ``None``
    when the job has no Darshan counters, or has client data rows traced by Pharos (the traces'
    totals stand). With DXT rows, ``records``/``data_records`` are left to the rows, ``source`` is
    ``darshan-counters+dxt``, and a complete DXT (not ``partial``) gives the I/O window
    (``first_io``, ``last_io``, ``io_span_s``, ``bandwidth_mib_s``). Units: see the module docstring."""
    jd = job_dxt(store, job_id)
    if jd is None:
        return None, None
    figs = _darshan_figures(store, job_id, files_limit)
    if figs is None or jd.traced_records:
        return None, jd.coverage
    cov = jd.coverage
    if cov is not None and cov.records:
        del figs["records"], figs["data_records"]
        figs["source"] = "darshan-counters+dxt"
        if not cov.partial and jd.first_ns and jd.last_ns:
            span_s = (jd.last_ns - jd.first_ns) / 1e9
            total = figs["bytes_read"] + figs["bytes_written"]
            figs |= {
                "first_io": ns_to_datetime(jd.first_ns),
                "last_io": ns_to_datetime(jd.last_ns),
                "io_span_s": span_s,
                "bandwidth_mib_s": total / 2**20 / span_s if total and span_s > 0 else None,
            }
    return figs, cov


# --------------------------------------------------------------------------------------
# Public API


def job_summary(
    store: Store,
    job_id: str,
    layer: str = "client",
    files_limit: int = 100,
    coverage: bool = True,
    silence_s: float | None = None,
) -> JobSummary | None:
    """The I/O summary of ``job_id`` as seen on ``layer``.

    Args:
        store: an open, migrated store.
        job_id: the job's id as in ``job_events`` / ``io_requests``.
        layer: ``client`` (default), ``forwarder`` or ``storage``.
        files_limit: at most this many files in ``files`` (largest first); ``n_files``
            always counts all data files.
        coverage: check the agents' coverage of the job (``complete``, ``gaps``,
            :func:`pharos_analytics.coverage.job_coverage`); False leaves ``complete`` true and
            ``coverage`` None.
        silence_s: the coverage check's longest silence of a live agent (default: the
            settings' ``heartbeat_missed`` x ``heartbeat_interval_s``).

    Returns:
        A :class:`JobSummary`, or ``None`` when the job has neither an event nor a record
        on ``layer`` (unknown job). On the ``client`` layer, a job with Darshan counters takes
        its totals from the counters, ``source`` ``"darshan-counters"`` (no DXT rows) or
        ``"darshan-counters+dxt"`` (DXT rows give ``records``/``data_records``), and ``dxt``
        is its DXT coverage when its logs have DXT (see the module docstring).

    Raises:
        ValueError: unknown layer or negative ``files_limit``.
        pharos_core.store.StoreError: the store failed.
    """
    _check_layer(layer)
    if files_limit < 0:
        raise ValueError("files_limit must be >= 0")
    p = {"job_id": job_id, "layer": layer, "system_re": SYSTEM_PATH_REGEX}
    ev_rows = store.query(JOB_EVENTS_SQL, {"job_id": job_id})
    ev = ev_rows[0] if ev_rows else None
    op_rows = store.query(JOB_OPS_SQL, p)
    if ev is None and not op_rows:
        return None

    ops: dict[str, int] = {}
    other_ops: dict[str, int] = {}
    non_file: dict[str, int] = {}
    nf_requests = nf_bytes = records = requests = failed = 0
    bytes_read = bytes_written = data_duration_ns = data_records = data_requests = 0
    first_ns: int | None = None
    last_ns: int | None = None
    for r in op_rows:
        op, ftype = r["op"], "stdio" if int(r["stream"]) else r["file_type"]
        n = int(r["requests"])
        records += int(r["records"])
        requests += n
        failed += int(r["failed"])
        if ftype in NON_FILE_TYPES or ftype == "stdio":
            non_file[ftype] = non_file.get(ftype, 0) + n
            nf_requests += n
            nf_bytes += int(r["bytes"])
        elif ftype == "regular" or op in META_OPS:
            ops[op] = ops.get(op, 0) + n
        else:
            other_ops[op] = other_ops.get(op, 0) + n
        if ftype == "regular" and op in DATA_OPS and not int(r["system_path"]):
            if op in READ_OPS:
                bytes_read += int(r["bytes"])
            else:
                bytes_written += int(r["bytes"])
            data_duration_ns += int(r["duration_ns"])
            data_records += int(r["records"])
            data_requests += n
            first, last = int(r["first_ns"]), int(r["last_ns"])
            first_ns = first if first_ns is None else min(first_ns, first)
            last_ns = last if last_ns is None else max(last_ns, last)

    darshan, dxt = _darshan_totals(store, job_id, files_limit) if layer == "client" else (None, None)

    hist = {d: {label: 0 for label, _ in SIZE_BINS} for d in ("read", "write")}
    for r in store.query(JOB_SIZE_HISTOGRAM_SQL, p):
        hist[r["direction"]][SIZE_BINS[int(r["bin"])][0]] += int(r["requests"])

    fp = p
    files = [
        FileSummary(
            path=r["file"],
            bytes_read=int(r["bytes_read"]),
            bytes_written=int(r["bytes_written"]),
            reads=int(r["reads"]),
            writes=int(r["writes"]),
            ranks=int(r["ranks"]),
        )
        for r in store.query(JOB_FILES_SQL, {**fp, "limit": files_limit})
    ]
    fan_rows = store.query(JOB_FAN_IN_SQL, fp)
    io_ranks, n_files, pattern, patterns, fan_in = fan_in_patterns(
        fan_rows[0] if fan_rows else None, bytes_read, bytes_written
    )

    d = store.query(JOB_DROPS_SQL, {"job_id": job_id})[0]
    drops = Drops(
        total=int(d["ringbuf_drops"]) + int(d["delivery_failures"]) + int(d["overflow_drops"]),
        ringbuf_drops=int(d["ringbuf_drops"]),
        delivery_failures=int(d["delivery_failures"]),
        overflow_drops=int(d["overflow_drops"]),
        unmerged_fallbacks=int(d["unmerged_fallbacks"]),
        producers=int(d["producers"]),
    )

    span_s = (last_ns - first_ns) / 1e9 if first_ns is not None and last_ns is not None else None
    total = bytes_read + bytes_written
    bandwidth = total / 2**20 / span_s if span_s and span_s > 0 else None

    summary = JobSummary(
        job_id=job_id,
        layer=layer,
        command=list(ev["command"]) if ev and ev["has_start"] else [],
        **_event_fields(ev),
        io_ranks=io_ranks,
        pattern=pattern,
        patterns=patterns,
        bytes_read=bytes_read,
        bytes_written=bytes_written,
        ops=dict(sorted(ops.items())),
        other_ops=dict(sorted(other_ops.items())),
        non_file_ops=NonFileOps(requests=nf_requests, bytes=nf_bytes, by_type=dict(sorted(non_file.items()))),
        failed_requests=failed,
        records=records,
        requests=requests,
        data_records=data_records,
        data_requests=data_requests,
        size_histogram=hist,
        files=files,
        n_files=n_files,
        first_io=ns_to_datetime(first_ns),
        last_io=ns_to_datetime(last_ns),
        io_time_s=data_duration_ns / 1e9,
        io_span_s=span_s,
        bandwidth_mib_s=bandwidth,
        dropped_records=drops.total,
        drops=drops,
        fan_in_pattern=fan_in,
    )
    if darshan:
        summary = replace(summary, **darshan)
    if dxt is not None:
        summary = replace(summary, dxt=dxt)
    nodes = store.query(JOB_NODES_SQL, {"job_id": job_id, "layer": layer})
    summary = replace(
        summary,
        compute_nodes=[r["node"] for r in nodes],
        forwarding_nodes={r["node"]: list(r["forwarding_nodes"]) for r in nodes if len(r["forwarding_nodes"])},
    )
    if layer != "client":
        rp = store.query(JOB_REPLAYS_SQL, {"job_id": job_id, "layer": layer})[0]
        summary = replace(
            summary, replayed_requests=int(rp["replayed"] or 0), duplicate_requests=int(rp["duplicates"] or 0)
        )
    if coverage:
        cov = job_coverage(store, job_id, silence_s=silence_s)
        summary = replace(summary, complete=cov.complete, gaps=cov.gaps, coverage=cov)
    return summary


def list_jobs(
    store: Store, limit: int = 50, offset: int = 0, layer: str = "client", user: str | None = None
) -> list[JobListItem]:
    """Jobs known from ``job_events``, newest start first, ``limit`` from ``offset``; with
    ``user``, only the jobs whose start event names that user.

    Bytes and pattern come from ``layer``'s data I/O (see module docstring), the pattern
    decided as in :func:`job_summary` (volume dominance). On the ``client`` layer, a job with
    Darshan counters gets its bytes and pattern from the counters, as its summary does
    (``source`` ``darshan-counters`` or ``darshan-counters+dxt``; three more queries per such
    job). Jobs that have records but no event are not listed (they still have a summary).

    Raises:
        ValueError: unknown layer, ``limit`` < 0 or ``offset`` < 0.
        pharos_core.store.StoreError: the store failed.
    """
    _check_layer(layer)
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must be >= 0")
    page = {"limit": limit, "offset": offset, "only_user": int(user is not None), "user": user or ""}
    events = store.query(JOBS_PAGE_SQL, page)
    if not events:
        return []
    io = {
        r["job_id"]: r
        for r in store.query(JOBS_PAGE_BYTES_SQL, {**page, "layer": layer, "system_re": SYSTEM_PATH_REGEX})
    }
    fan = {
        r["job_id"]: r
        for r in store.query(JOBS_PAGE_FAN_IN_SQL, {**page, "layer": layer, "system_re": SYSTEM_PATH_REGEX})
    }
    darshan = {r["job_id"] for r in store.query(JOBS_PAGE_DARSHAN_SQL, page)} if layer == "client" else set()
    out = []
    for ev in events:
        jid = ev["job_id"]
        b = io.get(jid)
        br, bw = (int(b["bytes_read"]), int(b["bytes_written"])) if b else (0, 0)
        io_ranks, n_files, pattern, patterns, fan_in = fan_in_patterns(fan.get(jid), br, bw)
        source: SummarySource = "traces"
        if jid in darshan and (d := _darshan_totals(store, jid, 0)[0]) is not None:
            io_ranks, n_files, pattern, patterns, fan_in = (
                d["io_ranks"],
                d["n_files"],
                d["pattern"],
                d["patterns"],
                d["fan_in_pattern"],
            )
            br, bw, source = d["bytes_read"], d["bytes_written"], d["source"]
        out.append(
            JobListItem(
                job_id=jid,
                **_event_fields(ev),
                pattern=pattern,
                io_ranks=io_ranks,
                n_files=n_files,
                bytes_read=br,
                bytes_written=bw,
                patterns=patterns,
                fan_in_pattern=fan_in,
                source=source,
            )
        )
    return out


def count_jobs(store: Store, user: str | None = None) -> int:
    """Number of jobs with at least one event (the total behind :func:`list_jobs` paging);
    with ``user``, of the jobs whose start event names that user."""
    params = {"only_user": int(user is not None), "user": user or ""}
    return int(store.query(JOBS_COUNT_SQL, params)[0]["jobs"])


def job_known(store: Store, job_id: str) -> bool:
    """The job has an event, a record or a Darshan counter (what the API's 404 checks)."""
    if store.query(JOB_EVENTS_SQL, {"job_id": job_id}):
        return True
    rows = store.query("SELECT count() AS n FROM io_requests WHERE job_id = {job_id:String}", {"job_id": job_id})
    if int(rows[0]["n"]):
        return True
    rows = store.query("SELECT count() AS n FROM darshan_counters WHERE job_id = {job_id:String}", {"job_id": job_id})
    return bool(int(rows[0]["n"]))
