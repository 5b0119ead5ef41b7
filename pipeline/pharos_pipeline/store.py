"""The ClickHouse store: embedded chDB by default, a ClickHouse server when a URL is set.

Both back ends run the same SQL. Queries use ClickHouse's bound parameters
(``{name:Type}`` in the SQL, values in ``params``), never string formatting of input.
Inserts send one ``INSERT ... FORMAT JSONEachRow`` statement per call, so a call's rows
land in one part: all or nothing (the pipeline's exactly-once relies on it).

Only one process may open a chDB data directory; the embedded stack therefore hosts the
pipeline, analytics and API in one process (DESIGN.md).
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .settings import Settings
from .telemetry import INSERT_SECONDS


class StoreError(RuntimeError):
    """A query or insert failed in the store; the message carries ClickHouse's error."""


def ns_to_datetime64(ns: int) -> str:
    """Wall-clock ns since the epoch -> the text a DateTime64(9) column parses exactly."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


class Store(ABC):
    """A ClickHouse endpoint. Thread-safe: calls are serialised per store."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    @abstractmethod
    def _command(self, sql: str, params: dict[str, Any] | None) -> None: ...

    @abstractmethod
    def _query(self, sql: str, params: dict[str, Any] | None) -> list[dict[str, Any]]: ...

    @abstractmethod
    def _insert_json(self, table: str, payload: bytes) -> None: ...

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        """Run a statement that returns nothing (DDL, ALTER). Raises StoreError."""
        with self._lock:
            try:
                self._command(sql, params)
            except StoreError:
                raise
            except Exception as exc:  # the drivers raise their own types
                raise StoreError(str(exc)) from exc

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run a SELECT; rows as dicts keyed by column name. Raises StoreError."""
        with self._lock:
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
        with self._lock, INSERT_SECONDS.labels(table).time():
            try:
                self._insert_json(table, payload)
            except Exception as exc:
                raise StoreError(str(exc)) from exc
        return len(lines)

    def close(self) -> None:  # noqa: B027 - optional hook: stores without a handle keep this no-op
        """Release the store's handle (chDB session, HTTP pool); a no-op by default."""


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
        from chdb import session

        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._session = session.Session(str(path))

    def _command(self, sql, params):
        self._session.query(sql, "Null", params=_chdb_params(params))

    def _query(self, sql, params):
        res = self._session.query(sql, "JSONEachRow", params=_chdb_params(params))
        data = res.bytes()
        return [json.loads(line) for line in data.splitlines() if line]

    def _insert_json(self, table, payload):
        self._session.query(f"INSERT INTO {table} FORMAT JSONEachRow\n" + payload.decode(), "Null")

    def close(self) -> None:
        with self._lock:
            self._session.close()


class ServerStore(Store):
    """A ClickHouse server through clickhouse-connect (HTTP)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        import clickhouse_connect

        u = urlparse(url)
        self._client = clickhouse_connect.get_client(
            host=u.hostname or "127.0.0.1",
            port=u.port or 8123,
            username=u.username or "default",
            password=u.password or "",
            database=(u.path or "/").strip("/") or "default",
            secure=u.scheme == "https",
        )

    def _command(self, sql, params):
        self._client.command(sql, parameters=params or None)

    def _query(self, sql, params):
        return list(self._client.query(sql, parameters=params or None).named_results())

    def _insert_json(self, table, payload):
        self._client.raw_insert(table, insert_block=payload, fmt="JSONEachRow")

    def close(self) -> None:
        self._client.close()


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
