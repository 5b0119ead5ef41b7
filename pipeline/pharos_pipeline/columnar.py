"""The fast ingest path: ``pharos.io.requests`` messages (IoBatch) go into ``io_requests`` as
they came from Kafka, decoded by ClickHouse's own Protobuf input format against the wire
contract (``proto/pharos/v1/io.proto``) and inserted columnar by one ``INSERT ... SELECT``.

No Python object is made per record: Python joins the messages' bytes into the format's
length-delimited stream (a varint length before each message), ClickHouse parses each
IoBatch into one row with its records as ``Nested`` arrays, and ``ARRAY JOIN`` makes one
``io_requests`` row per record with the same mapping as :func:`pharos_pipeline.messages.record_rows`
(enum numbers -> the store's names, ns -> DateTime64(9), ``bytes`` = max(result, 0) * count,
a record without ``host`` takes the batch's, ``record_index`` = position in the batch).

Validation of the records (``count`` >= 1, timestamps that fit DateTime64(9), ``bytes`` that
fits UInt64; the rules of :func:`~pharos_pipeline.messages.decode_batch`) runs inside the same
statement: ``throwIf`` aborts the whole insert, nothing of it is stored, and the caller falls
back to validating each batch in Python to dead-letter the bad ones (a rare path).

One insert is one part (per day partition): the squashing settings below make ClickHouse
form a single block from the whole statement, so a poll's records are stored all or nothing,
as the pipeline's exactly-once needs.

Where the data comes from differs by back end, the SQL does not: chDB reads the stream from
files (``file()``, one per parse thread, in ``/dev/shm`` when there is one), a ClickHouse
server from the request body (``input()``). A server gets the schema
inline (``format_schema_source = 'string'``, ClickHouse >= 25.x), so no file has to be
installed on it; chDB reads the shipped file.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path

from pharos_core.store import Store, StoreError, ch_literal
from pharos_core.telemetry import INSERT_SECONDS

from .wire import FILE_TYPE_NAMES, LAYER_NAMES, OP_NAMES

#: The message the stream holds and the input structure ClickHouse decodes it into: every
#: IoRecord field (enums as their numbers), the batch fields the rows need.
MESSAGE = "IoBatch"
RECORD_FIELDS = (
    ("start_ns", "UInt64"),
    ("duration_ns", "UInt64"),
    ("end_ns", "UInt64"),
    ("layer", "Int32"),
    ("host", "String"),
    ("job_id", "String"),
    ("rank", "Int32"),
    ("pid", "UInt32"),
    ("tid", "UInt32"),
    ("comm", "String"),
    ("op", "Int32"),
    ("dev", "UInt64"),
    ("inode", "UInt64"),
    ("path", "String"),
    ("file_type", "Int32"),
    ("fd", "Int32"),
    ("offset", "UInt64"),
    ("size", "UInt64"),
    ("result", "Int64"),
    ("count", "UInt32"),
    ("compute_node", "String"),
    ("forwarding_node", "String"),
    ("target", "String"),
    ("object_id", "UInt64"),
    ("queue_wait_ns", "UInt64"),
    ("request_id", "UInt64"),
    ("replay", "UInt8"),
)
STRUCTURE = "producer_id String, seq UInt64, host String, records Nested({})".format(
    ", ".join(f"{n} {t}" for n, t in RECORD_FIELDS)
)

#: Largest ns since the epoch a DateTime64(9) holds (as messages.MAX_TIME_NS).
MAX_TIME_NS = (1 << 63) - 1
INVALID_RECORD = "pharos: invalid record in the poll"


def _enum(column: str, names: dict[int, str]) -> str:
    """SQL mapping an enum number to the store's name, ``unknown_N`` for a number this
    pipeline does not know (open enums, as ingest._enum_name)."""
    keys = ",".join(str(k) for k in names)
    values = ",".join(f"'{v}'" for v in names.values())
    return f"transform({column}, [{keys}], [{values}], concat('unknown_', toString({column})))"


#: io_requests column -> its expression over the ARRAY JOINed record ``r`` and the batch.
COLUMNS = {
    "start": "fromUnixTimestamp64Nano(toInt64(r.start_ns), 'UTC')",
    "end": "fromUnixTimestamp64Nano(toInt64(r.end_ns), 'UTC')",
    "duration_ns": "r.duration_ns",
    "layer": _enum("r.layer", LAYER_NAMES),
    "host": "if(r.host = '', host, r.host)",
    "job_id": "r.job_id",
    "rank": "r.rank",
    "pid": "r.pid",
    "tid": "r.tid",
    "comm": "r.comm",
    "op": _enum("r.op", OP_NAMES),
    "file_type": _enum("r.file_type", FILE_TYPE_NAMES),
    "dev": "r.dev",
    "inode": "r.inode",
    "path": "r.path",
    "fd": "r.fd",
    "offset": "r.offset",
    "size": "r.size",
    "result": "r.result",
    "count": "r.count",
    "bytes": "toUInt64(greatest(r.result, 0)) * r.count",
    "compute_node": "r.compute_node",
    "forwarding_node": "r.forwarding_node",
    "target": "r.target",
    "object_id": "r.object_id",
    "queue_wait_ns": "r.queue_wait_ns",
    "request_id": "r.request_id",
    "replay": "r.replay",
    "producer_id": "producer_id",
    "seq": "seq",
    "record_index": "toUInt32(i - 1)",
}

#: A record decode_batch would refuse: count 0, a time past 2262, bytes past UInt64.
INVALID = (
    f"r.count = 0 OR r.start_ns > {MAX_TIME_NS} OR r.end_ns > {MAX_TIME_NS}"
    f" OR (r.result > 0 AND toUInt64(r.result) > intDiv({(1 << 64) - 1}, toUInt64(r.count)))"
)

#: One block for the whole statement (one part per partition: all or nothing).
ONE_BLOCK = {
    "min_insert_block_size_rows": 1 << 40,
    "min_insert_block_size_bytes": 1 << 50,
    "max_insert_block_size": 1 << 40,
}

#: The settings of the ingest insert: one block, and the rollups' materialized views
#: (migration 009) fed in parallel with the io_requests part rather than one after the
#: other (measured on the ingest bench's data, 2-core machine: 0.68-0.73 M rec/s serial,
#: 1.08 M in parallel, the same rollup rows).
#: ``optimize_on_insert`` off: the rollups' materialized views group the poll by their tables'
#: sorting keys already, so the AggregatingMergeTree's own collapsing of equal keys in the new
#: part only re-sorts what is unique (the background merges and the readers' -Merge combinators
#: do the collapsing across parts either way). Measured on 469,203 records of the simulated
#: 4,096-node mix (bench/ingest.py --mix simulated): 0.70-0.74 s -> 0.59-0.60 s an insert.
INSERT_SETTINGS = {**ONE_BLOCK, "parallel_view_processing": 1, "optimize_on_insert": 0}


def insert_sql(table: str, source: str) -> str:
    """``INSERT INTO table (...) SELECT ...`` of the records of the IoBatch stream read by the
    table function ``source`` (``file(...)`` or ``input(...)``). Fails with INVALID_RECORD
    when any record is invalid; nothing is inserted then."""
    cols = ", ".join(f"`{c}`" for c in COLUMNS)
    exprs = ",\n       ".join(COLUMNS.values())
    return (
        f"INSERT INTO {table} ({cols})\n"
        f"SELECT {exprs}\n"
        f"FROM {source}\n"
        "ARRAY JOIN records AS r, arrayEnumerate(records.count) AS i\n"
        f"WHERE throwIf({INVALID}, '{INVALID_RECORD}') = 0"
    )


def proto_file() -> Path:
    """The wire contract, shipped next to its generated Python code by ``make proto``
    (wire/pharos/v1/io.proto)."""
    return Path(str(resources.files("pharos_pipeline.wire").joinpath("pharos/v1/io.proto")))


@cache
def proto_schema() -> str:
    return proto_file().read_text()


def format_settings(inline: bool) -> dict[str, str]:
    """The settings that make ClickHouse read the stream as IoBatch messages of the wire
    contract: the schema's text inline (a server, which has no copy of the file), or the
    shipped file by its path (chDB, in this process: an inline schema would be cached in a
    ``__cache__`` folder of the working directory)."""
    if inline:
        return {
            "format_schema_source": "string",
            "format_schema": proto_schema(),
            "format_schema_message_name": MESSAGE,
        }
    return {"format_schema": f"{proto_file()}:{MESSAGE}"}


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length_delimited_parts(messages: Sequence[bytes]) -> list[bytes]:
    """The Protobuf format's stream as pieces (each message preceded by its length as a
    varint), to write or join without copying a growing buffer."""
    parts: list[bytes] = []
    for m in messages:
        parts.append(_varint(len(m)))
        parts.append(m)
    return parts


def length_delimited(messages: Sequence[bytes]) -> bytes:
    """The Protobuf format's stream: each message preceded by its length as a varint."""
    return b"".join(length_delimited_parts(messages))


def split_even(messages: Sequence[bytes], parts: int) -> list[list[bytes]]:
    """``messages`` in at most ``parts`` consecutive runs of about equal bytes (one per parse
    thread); empty runs are left out."""
    total = sum(len(m) for m in messages)
    runs: list[list[bytes]] = [[]]
    size = 0
    for m in messages:
        if size >= total * len(runs) / parts and len(runs) < parts:
            runs.append([])
        runs[-1].append(m)
        size += len(m)
    return [r for r in runs if r]


def insert_io_batches(store: Store, messages: Sequence[bytes], parse_threads: int = 2) -> None:
    """Insert the records of serialized IoBatch messages into ``io_requests`` in one
    statement, decoded by ClickHouse's Protobuf format against the wire contract.

    All or nothing. Raises StoreError; its text holds :data:`INVALID_RECORD` when a record is
    invalid (then nothing is stored: validate the batches one by one). chDB reads the stream
    from ``parse_threads`` files (``file()``, in ``/dev/shm`` when there is one), a ClickHouse
    server from the request body (``input()``). The statement's time goes to
    ``pharos_store_insert_seconds{table="io_requests"}``.
    """
    if not messages:
        return
    try:
        with INSERT_SECONDS.labels("io_requests").time():
            if store.backend == "chdb":
                _insert_from_files(store, messages, max(1, parse_threads))
            else:
                _insert_from_body(store, messages)
    except StoreError:
        raise
    except Exception as exc:
        raise StoreError(str(exc)) from exc


log = logging.getLogger("pharos_pipeline.ingest")

#: Folders of the stream files start with this, then the pid of the process that writes them.
STREAM_PREFIX = "pharos-ingest-"


def stream_root() -> Path | None:
    """Where the stream files go: ``/dev/shm`` (memory) when there is one, else the temp dir (None)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def remove_stale_streams(root: Path | None = None, min_age_s: float = 600.0) -> int:
    """Remove the stream folders a pipeline process left when it was killed mid-insert (SIGKILL,
    OOM: its ``TemporaryDirectory`` was never cleaned up; in ``/dev/shm`` they hold memory until a
    reboot, a poll's worth each, up to ``pipeline_max_poll_mb``). A folder is stale when the pid in
    its name is not a live process (or it has none: before the pid was in the name) and it was
    last changed ``min_age_s`` or more ago (an insert reads its files within seconds; the age
    keeps a live process of another pid namespace sharing the folder safe). Run at a process's first
    insert. ``root``: where to
    look (default :func:`stream_root`, else the temp dir). Returns the folders removed; a folder
    that cannot be removed is left (no error)."""
    root = root or stream_root() or Path(tempfile.gettempdir())
    removed = 0
    now = time.time()
    for d in root.glob(f"{STREAM_PREFIX}*"):
        head = d.name[len(STREAM_PREFIX) :].split("-", 1)
        pid = int(head[0]) if len(head) == 2 and head[0].isdigit() else None
        try:
            if (pid is not None and _pid_alive(pid)) or now - d.stat().st_mtime < min_age_s:
                continue
        except FileNotFoundError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed += not d.exists()
    return removed


@cache
def _remove_stale_streams_once() -> None:
    """:func:`remove_stale_streams` at the first insert of this process (a start)."""
    stale = remove_stale_streams()
    if stale:
        log.info("removed %d stream folder(s) that killed pipeline processes left", stale)


def _insert_from_files(store: Store, messages: Sequence[bytes], parse_threads: int) -> None:
    # chDB has no request body: the stream goes through files, one per parse thread
    # (file() reads several files in parallel), in memory when /dev/shm exists; the folder
    # is named with this pid, so one left by a killed process can be found (remove_stale_streams).
    _remove_stale_streams_once()
    runs = split_even(messages, parse_threads)
    prefix = f"{STREAM_PREFIX}{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=stream_root()) as tmp:
        for k, run in enumerate(runs):
            with open(Path(tmp) / f"{k}.bin", "wb") as f:
                f.writelines(length_delimited_parts(run))
        names = "{" + ",".join(str(k) for k in range(len(runs))) + "}"
        source = f"file({ch_literal(f'{tmp}/{names}.bin')}, 'Protobuf', {ch_literal(STRUCTURE)})"
        settings = {**format_settings(inline=False), **INSERT_SETTINGS, "max_threads": len(runs)}
        clause = ", ".join(f"{k} = {ch_literal(v)}" for k, v in settings.items())
        store.command(f"{insert_sql('io_requests', source)}\nSETTINGS {clause}")


def _insert_from_body(store: Store, messages: Sequence[bytes]) -> None:
    # The stream is the request body, read by input(); the server parses it.
    source = f"input({ch_literal(STRUCTURE)})"
    store.command_with_body(
        f"{insert_sql('io_requests', source)}\nFORMAT Protobuf",
        length_delimited(messages),
        {**format_settings(inline=True), **ONE_BLOCK},
    )
