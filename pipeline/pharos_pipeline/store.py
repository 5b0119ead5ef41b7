"""The ClickHouse store: embedded chDB by default, a ClickHouse server when a URL is set.

Both back ends run the same SQL. Queries use ClickHouse's bound parameters
(``{name:Type}`` in the SQL, values in ``params``), never string formatting of input.
Inserts send one ``INSERT ... FORMAT JSONEachRow`` statement per call, so a call's rows
land in one part: all or nothing (the pipeline's exactly-once relies on it).

Only one process may open a chDB data directory; the embedded stack therefore hosts the
pipeline, analytics and API in one process (DESIGN.md).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from . import columnar
from .settings import Settings
from .telemetry import INSERT_SECONDS


class StoreError(RuntimeError):
    """A query or insert failed in the store; the message carries ClickHouse's error."""


def ns_to_datetime64(ns: int) -> str:
    """Wall-clock ns since the epoch -> the text a DateTime64(9) column parses exactly."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


class Store(ABC):
    """A ClickHouse endpoint. Thread-safe without one lock for all: each thread calls through
    its own handle (a chDB session on the same data directory, or its own HTTP client), so
    ingestion, API queries and detection run side by side (issue 15: a slow API query no longer
    stalls the pipeline). A call is one statement; nothing spans calls."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._handles: list[Any] = []
        self._handles_lock = threading.Lock()
        self._closed = False

    @abstractmethod
    def _open_handle(self) -> Any:
        """A new connection handle for the calling thread."""

    @abstractmethod
    def _close_handle(self, handle: Any) -> None: ...

    #: CPU niceness of the query threads of non-ingest handles (API, detection, control): when
    #: the CPU is short, ingestion goes first and queries wait (ClickHouse's os_thread_priority).
    QUERY_NICE = 10

    @property
    def _h(self) -> Any:
        """The calling thread's handle, opened on first use."""
        if self._closed:
            raise StoreError("the store is closed")
        h = getattr(self._local, "handle", None)
        if h is None:
            with self._handles_lock:
                if self._closed:
                    raise StoreError("the store is closed")
                h = self._local.handle = self._open_handle()
                self._handles.append(h)
            self._set_priority(h, ingest=getattr(self._local, "ingest", False))
        return h

    def mark_ingest_thread(self) -> None:
        """The calling thread ingests: its statements run at normal priority, ahead of the other
        threads' queries (which run at QUERY_NICE) when the CPU is short. Idempotent."""
        if not getattr(self._local, "ingest", False):
            self._local.ingest = True
            if getattr(self._local, "handle", None) is not None:
                self._set_priority(self._local.handle, ingest=True)

    def _set_priority(self, handle: Any, ingest: bool) -> None:  # noqa: B027 - optional hook
        """Apply the thread's priority to its handle (a no-op unless the back end has one)."""

    def close(self) -> None:
        """Close every thread's handle; later calls raise StoreError."""
        with self._handles_lock:
            self._closed = True
            handles, self._handles = self._handles, []
        for h in handles:
            with contextlib.suppress(Exception):  # closing is best effort
                self._close_handle(h)

    @abstractmethod
    def _command(self, sql: str, params: dict[str, Any] | None) -> None: ...

    @abstractmethod
    def _query(self, sql: str, params: dict[str, Any] | None) -> list[dict[str, Any]]: ...

    @abstractmethod
    def _insert_json(self, table: str, payload: bytes) -> None: ...

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        """Run a statement that returns nothing (DDL, ALTER). Raises StoreError."""
        try:
            self._command(sql, params)
        except StoreError:
            raise
        except Exception as exc:  # the drivers raise their own types
            raise StoreError(str(exc)) from exc

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run a SELECT; rows as dicts keyed by column name. Raises StoreError."""
        try:
            return self._query(sql, params)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(str(exc)) from exc

    def insert_rows(self, table: str, rows: Iterable[dict[str, Any]]) -> int:
        """Insert rows (dicts of column -> JSON-serialisable value) in one statement.

        DateTime64 columns take the text of :func:`ns_to_datetime64`. Returns the row count.
        Raises StoreError; on error nothing of the call is stored. The statement's time goes to
        the ``pharos_store_insert_seconds`` histogram (pharos_pipeline.telemetry).
        """
        lines = [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in rows]
        if not lines:
            return 0
        payload = ("\n".join(lines) + "\n").encode()
        try:
            with INSERT_SECONDS.labels(table).time():
                self._insert_json(table, payload)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(str(exc)) from exc
        return len(lines)

    def insert_io_batches(self, messages: Sequence[bytes], parse_threads: int = 2) -> None:
        """Insert the records of serialized IoBatch messages into ``io_requests`` in one
        statement, decoded by ClickHouse's Protobuf format (:mod:`pharos_pipeline.columnar`).

        All or nothing. Raises StoreError; its text holds ``columnar.INVALID_RECORD`` when a
        record is invalid (then nothing is stored: validate the batches one by one).
        """
        if not messages:
            return
        try:
            with INSERT_SECONDS.labels("io_requests").time():
                self._insert_io_batches(messages, max(1, parse_threads))
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(str(exc)) from exc

    @abstractmethod
    def _insert_io_batches(self, messages: Sequence[bytes], parse_threads: int) -> None: ...


def _ch_literal(value: Any) -> str:
    """A Python value as ClickHouse literal text (strings quoted and escaped)."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        inner = ",".join(_ch_literal(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


#: ClickHouse reads a query parameter's text in its Escaped (TSV) format: a raw tab or newline
#: is refused and ``\\`` is one backslash, so these are escaped first.
_PARAM_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _chdb_params(params: dict[str, Any] | None) -> dict[str, Any] | None:
    """chDB passes list parameters without quoting their strings (``['a']`` -> ``[a]``);
    give it the literal text of arrays and tuples instead, as a ClickHouse server gets, and
    strings escaped as the parameter format wants (any string, tabs and backslashes included,
    arrives unchanged)."""
    if not params:
        return None
    return {
        k: _ch_literal(v) if isinstance(v, (list, tuple)) else v.translate(_PARAM_ESCAPES) if isinstance(v, str) else v
        for k, v in params.items()
    }


class ChdbStore(Store):
    """Embedded ClickHouse (chDB) on a data directory."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._h  # open now: a bad directory fails here, not at the first query  # noqa: B018

    def _open_handle(self):
        # Sessions on one directory in one process share the embedded engine (chDB allows one
        # process per directory, several sessions in it); each runs its own queries.
        from chdb import session

        return session.Session(str(self.path))

    def _close_handle(self, handle):
        handle.close()

    def _set_priority(self, handle, ingest):
        # A session setting: the handle's later queries run their threads at this nice value.
        handle.query(f"SET os_thread_priority = {0 if ingest else self.QUERY_NICE}", "Null")

    def _command(self, sql, params):
        self._h.query(sql, "Null", params=_chdb_params(params))

    def _query(self, sql, params):
        res = self._h.query(sql, "JSONEachRow", params=_chdb_params(params))
        data = res.bytes()
        return [json.loads(line) for line in data.splitlines() if line]

    def _insert_json(self, table, payload):
        self._h.query(f"INSERT INTO {table} FORMAT JSONEachRow\n" + payload.decode(), "Null")

    def _insert_io_batches(self, messages, parse_threads):
        # chDB has no request body: the stream goes through files, one per parse thread
        # (file() reads several files in parallel), in memory when /dev/shm exists.
        runs = columnar.split_even(messages, parse_threads)
        shm = Path("/dev/shm")
        with tempfile.TemporaryDirectory(prefix="pharos-ingest-", dir=shm if shm.is_dir() else None) as tmp:
            for k, run in enumerate(runs):
                with open(Path(tmp) / f"{k}.bin", "wb") as f:
                    f.writelines(columnar.length_delimited_parts(run))
            names = "{" + ",".join(str(k) for k in range(len(runs))) + "}"
            source = f"file({_ch_literal(f'{tmp}/{names}.bin')}, 'Protobuf', {_ch_literal(columnar.STRUCTURE)})"
            settings = {**columnar.format_settings(inline=False), **columnar.INSERT_SETTINGS, "max_threads": len(runs)}
            clause = ", ".join(f"{k} = {_ch_literal(v)}" for k, v in settings.items())
            self._h.query(f"{columnar.insert_sql('io_requests', source)}\nSETTINGS {clause}", "Null")


class ServerStore(Store):
    """A ClickHouse server through clickhouse-connect (HTTP)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = urlparse(url)
        self._h  # connect now: a bad URL or credentials fail here  # noqa: B018

    def _open_handle(self):
        import clickhouse_connect

        u = self._url
        return clickhouse_connect.get_client(
            host=u.hostname or "127.0.0.1",
            port=u.port or 8123,
            username=u.username or "default",
            password=u.password or "",
            database=(u.path or "/").strip("/") or "default",
            secure=u.scheme == "https",
        )

    def _close_handle(self, handle):
        handle.close()

    def _set_priority(self, handle, ingest):
        # The server's own scheduler: a lower number goes first among concurrent queries
        # (0 would mean none; untested here: no ClickHouse server on the build machines).
        handle.set_client_setting("priority", 1 if ingest else 2)

    def _command(self, sql, params):
        self._h.command(sql, parameters=params or None)

    def _query(self, sql, params):
        return list(self._h.query(sql, parameters=params or None).named_results())

    def _insert_json(self, table, payload):
        self._h.raw_insert(table, insert_block=payload, fmt="JSONEachRow")

    def _insert_io_batches(self, messages, parse_threads):
        # The stream is the request body, read by input(); the server parses it.
        source = f"input({_ch_literal(columnar.STRUCTURE)})"
        self._h.command(
            f"{columnar.insert_sql('io_requests', source)}\nFORMAT Protobuf",
            data=columnar.length_delimited(messages),
            settings={**columnar.format_settings(inline=True), **columnar.ONE_BLOCK},
        )


def open_store(settings: Settings) -> Store:
    """The store the settings name: a server if ``clickhouse_url`` is set, else chDB."""
    if settings.clickhouse_url:
        return ServerStore(settings.clickhouse_url)
    return ChdbStore(settings.chdb_path)


MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations
(version UInt32, name String, applied DateTime64(3, 'UTC') DEFAULT now64(3))
ENGINE = ReplacingMergeTree ORDER BY version
"""


def migration_files() -> list[tuple[int, str, str]]:
    """The numbered migrations shipped in ``pharos_pipeline/migrations``: (version, name, sql)."""
    out = []
    for f in resources.files("pharos_pipeline.migrations").iterdir():
        if f.name.endswith(".sql") and f.name[:3].isdigit():
            out.append((int(f.name[:3]), f.name, f.read_text()))
    return sorted(out)


def split_statements(sql: str) -> list[str]:
    """Split a migration file into statements at ';' line ends (comments dropped)."""
    body = "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def migrate(store: Store) -> list[str]:
    """Apply the migrations not yet recorded in ``schema_migrations``, in order.

    Re-runnable: every statement is idempotent and each applied version is recorded after
    its statements succeed. Returns the names applied now.
    """
    store.command(MIGRATIONS_TABLE)
    done = {r["version"] for r in store.query("SELECT version FROM schema_migrations")}
    applied = []
    for version, name, sql in migration_files():
        if version in done:
            continue
        for stmt in split_statements(sql):
            store.command(stmt)
        store.insert_rows("schema_migrations", [{"version": version, "name": name}])
        applied.append(name)
    return applied
