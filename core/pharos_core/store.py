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
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .retention import RetentionConfig, apply_retention
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

    #: Which back end: ``"chdb"`` (embedded) or ``"server"`` (clickhouse-connect).
    backend: str

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
    def _query_columns(self, sql: str, params: dict[str, Any] | None) -> dict[str, list[Any]]: ...

    @abstractmethod
    def _insert_json(self, table: str, payload: bytes) -> None: ...

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        """Run a statement that returns nothing (DDL, ALTER). Raises StoreError."""
        self._driver(self._command, sql, params)

    @staticmethod
    def _driver(call: Any, *args: Any) -> Any:
        """``call(*args)`` with the drivers' own exception types raised as StoreError."""
        try:
            return call(*args)
        except StoreError:
            raise
        except Exception as exc:  # the drivers raise their own types
            raise StoreError(str(exc)) from exc

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run a SELECT; rows as dicts keyed by column name. Raises StoreError.

        Both back ends give the same plain values (:func:`plain_value`: what chDB's JSONEachRow
        parses to): numbers, strings, ``DateTime`` as text (``YYYY-MM-DD hh:mm:ss[.fraction]``,
        UTC for UTC columns), arrays and tuples as lists, maps as dicts; callers never check
        which back end answered."""
        return self._driver(self._query, sql, params)

    def query_columns(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, list[Any]]:
        """Run a SELECT (no ``SETTINGS`` or ``FORMAT`` clause of its own); its columns as lists
        keyed by column name, in the SELECT's order: for results of many rows, where a dict per
        row (:meth:`query`) costs more than the query. Integers of every width are ``int`` (in
        :meth:`query`, chDB's JSON gives 64-bit ones as text); other values as :meth:`query`
        gives them. Raises StoreError."""
        return self._driver(self._query_columns, sql, params)

    def insert_rows(self, table: str, rows: Iterable[dict[str, Any]]) -> int:
        """Insert rows (dicts of column -> JSON-serialisable value) in one statement.

        DateTime64 columns take the text of :func:`ns_to_datetime64`. Returns the row count.
        Raises StoreError; on error nothing of the call is stored. The statement's time goes to
        the ``pharos_store_insert_seconds`` histogram (pharos_core.telemetry).
        """
        return self.insert_json_lines(table, [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in rows])

    def insert_json_lines(self, table: str, lines: Sequence[str]) -> int:
        """Insert rows already serialized as JSONEachRow lines (one JSON object each, no newline
        inside: ``json.dumps`` of a row of :meth:`insert_rows`) in one statement. Returns the row
        count; raises StoreError (nothing of the call stored then). For rows made ahead of the
        insert, e.g. in another thread (the pipeline's ``io_batches`` markers)."""
        if not lines:
            return 0
        payload = ("\n".join(lines) + "\n").encode()
        with INSERT_SECONDS.labels(table).time():
            self._driver(self._insert_json, table, payload)
        return len(lines)

    def command_with_body(self, sql: str, data: bytes, settings: dict[str, Any]) -> None:
        """Run a statement that reads ``data`` as its request body (``INSERT ... FORMAT X``
        from ``input()``), with per-query ``settings``. A ClickHouse server only: chDB has no
        request body (read the data from ``file()`` with :meth:`command` instead) and raises
        StoreError. Used by the pipeline's Protobuf ingest (:mod:`pharos_pipeline.columnar`)."""
        self._driver(self._command_with_body, sql, data, settings)

    def _command_with_body(self, sql: str, data: bytes, settings: dict[str, Any]) -> None:
        raise StoreError(f"the {self.backend} store takes no request body: read the data from file()")


def plain_value(value: Any) -> Any:
    """A value of a ClickHouse server's result (clickhouse-connect's Python types) as chDB's
    JSONEachRow gives it: tuples and arrays as lists, maps as dicts, ``datetime`` as text
    (aware ones in UTC; microseconds at most), ``date`` as ``YYYY-MM-DD``; anything else as is."""
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ")
    if isinstance(value, date):
        return value.isoformat()
    return value


def ch_literal(value: Any) -> str:
    """A Python value as ClickHouse literal text (strings quoted and escaped)."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        inner = ",".join(ch_literal(v) for v in value)
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
        k: ch_literal(v) if isinstance(v, (list, tuple)) else v.translate(_PARAM_ESCAPES) if isinstance(v, str) else v
        for k, v in params.items()
    }


class ChdbStore(Store):
    """Embedded ClickHouse (chDB) on a data directory."""

    backend = "chdb"

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
        data = res.bytes().strip(b"\n")
        # one parse of all rows (JSONEachRow escapes newlines inside strings: a raw one ends a row)
        return json.loads(b"[" + data.replace(b"\n", b",") + b"]") if data else []

    def _query_columns(self, sql, params):
        sql = sql.rstrip().rstrip(";") + "\nSETTINGS output_format_json_quote_64bit_integers = 0"
        return json.loads(self._h.query(sql, "JSONColumns", params=_chdb_params(params)).bytes())

    def _insert_json(self, table, payload):
        self._h.query(f"INSERT INTO {table} FORMAT JSONEachRow\n" + payload.decode(), "Null")


class ServerStore(Store):
    """A ClickHouse server through clickhouse-connect (HTTP)."""

    backend = "server"

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
        rows = self._h.query(sql, parameters=params or None).named_results()
        return [{k: plain_value(v) for k, v in r.items()} for r in rows]

    def _query_columns(self, sql, params):
        r = self._h.query(sql, parameters=params or None)
        return {k: [plain_value(v) for v in col] for k, col in zip(r.column_names, r.result_columns, strict=True)}

    def _insert_json(self, table, payload):
        self._h.raw_insert(table, insert_block=payload, fmt="JSONEachRow")

    def _command_with_body(self, sql, data, settings):
        self._h.command(sql, data=data, settings=settings)


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
    """The numbered migrations shipped in ``pharos_core/migrations``: (version, name, sql)."""
    out = []
    for f in resources.files("pharos_core.migrations").iterdir():
        if f.name.endswith(".sql") and f.name[:3].isdigit():
            out.append((int(f.name[:3]), f.name, f.read_text()))
    return sorted(out)


def split_statements(sql: str) -> list[str]:
    """Split a migration file into statements at ';' line ends (comments dropped)."""
    body = "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def migrate(store: Store, retention: RetentionConfig | None = None) -> list[str]:
    """Apply the migrations not yet recorded in ``schema_migrations``, in order, then the
    retention settings to the tables' TTLs (``retention``, else the ``[retention]`` table of the
    settings file and ``PHAROS_RETENTION_*``: :func:`pharos_core.retention.apply_retention`).

    Re-runnable: every statement is idempotent and each applied version is recorded after
    its statements succeed; a TTL that already has its setting is not altered. Returns the
    names of the migrations applied now. Raises StoreError; ValidationError (a ValueError) for
    a bad retention setting, before anything is changed.
    """
    retention = retention or RetentionConfig()
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
    apply_retention(store, retention)
    return applied
