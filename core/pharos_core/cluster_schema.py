"""The cluster variant of the schema (issue 15, item 8), generated from the same migrations.

For a site that outgrows one ClickHouse server: every table ``T`` of the migrations becomes

* ``T_local``, created ``ON CLUSTER`` on every node with the Replicated form of its engine
  (``MergeTree`` -> ``ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/T_local',
  '{replica}')``, ``ReplacingMergeTree(v)`` -> ``ReplicatedReplacingMergeTree(..., v)``), the
  same columns, keys, partitions and TTL (the migrations' intervals: ``migrate()`` then sets
  them to the ``[retention]`` settings with ``ALTER TABLE T_local ON CLUSTER``,
  :mod:`pharos_core.retention`); and
* ``T``, a ``Distributed`` table over the ``T_local`` of every shard, which Pharos reads and
  writes under the table's own name, so no query changes: ``Distributed(cluster, database,
  T_local, sharding key)``.

Sharding: the traced requests and Darshan counters by job (``cityHash64(job_id)``: a job's
analysis runs on its shard's data in parallel with the other shards'), every ReplacingMergeTree
by its first sorting-key column (rows that replace each other must meet on one shard), append-only
logs by ``rand()``. ``ALTER TABLE T`` goes to ``T_local`` ``ON CLUSTER``; an added or dropped
column is added to or dropped from ``T`` as well. A materialized view (the rollups) runs on every node from the local
requests into the local rollup; a backfill ``INSERT ... SELECT`` is printed for the local tables,
to run on one replica of every shard (INSERT has no ``ON CLUSTER``); ``DROP VIEW`` (a view
re-created with more columns) runs ``ON CLUSTER``.

``{cluster}``, ``{shard}``, ``{replica}`` and ``{database}`` are ClickHouse macros of each
node's configuration (``<macros>``), except the cluster name, which is given here. Inserts through
a Distributed table must be synchronous for the pipeline's exactly-once
(``distributed_foreground_insert = 1`` in the pipeline user's profile; docs/operations.md); a poll's
rows then land shard by shard, so "all or nothing" holds per shard, not across shards.

Print it with ``pharos schema --cluster NAME``; the syntax of every statement is checked by
ClickHouse's own parser in the tests (chDB ``formatQuery``). Not run on a real cluster here.
"""

from __future__ import annotations

import re

from .store import migration_files, split_statements

#: Sharding keys by table; others: the first ORDER BY column of a Replacing* table, else rand().
SHARD_BY = {
    "io_requests": "cityHash64(job_id)",
    "darshan_counters": "cityHash64(job_id)",
    "darshan_logs": "cityHash64(log_sha256)",
}

_CREATE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\s*\(", re.S)
_ENGINE = re.compile(r"\bENGINE\s*=\s*(\w*MergeTree)(?:\(([^)]*)\))?", re.S)
_ORDER = re.compile(r"\bORDER BY\s*\(?\s*([\w]+)")
_ALTER = re.compile(r"^ALTER TABLE (\w+)\s+(.*)$", re.S)
_VIEW = re.compile(r"^CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+)\s+TO (\w+)\s+AS\s+(.*)$", re.S)
_INSERT = re.compile(r"^INSERT INTO (\w+)\s+(SELECT .*)$", re.S)
_DROP_VIEW = re.compile(r"^DROP VIEW IF EXISTS (\w+)$", re.S)


def _tables() -> set[str]:
    """Every table the migrations create."""
    return {m.group(1) for _, _, sql in migration_files() for st in split_statements(sql) if (m := _CREATE.match(st))}


def _locals(sql: str, tables: set[str]) -> str:
    """``sql`` reading and writing the shard-local tables (``T`` -> ``T_local``)."""
    return re.sub(r"\b(" + "|".join(sorted(tables)) + r")\b", r"\1_local", sql)


def _replicated(engine: str, args: str, local: str) -> str:
    path = f"'/clickhouse/tables/{{shard}}/{{database}}/{local}', '{{replica}}'"
    return f"ENGINE = Replicated{engine}({path}{', ' + args.strip() if args and args.strip() else ''})"


def _shard_key(table: str, engine: str, stmt: str) -> str:
    if table in SHARD_BY:
        return SHARD_BY[table]
    if engine.startswith("Replacing") and (m := _ORDER.search(stmt)):
        return f"cityHash64({m.group(1)})"
    return "rand()"


def cluster_statements(cluster: str, sql: str) -> list[str]:
    """The cluster variant of one migration's statements (see the module doc). Raises ValueError
    for a statement it does not know how to distribute."""
    if not re.fullmatch(r"[A-Za-z_][\w-]*", cluster):
        raise ValueError(f"cluster name {cluster!r}: letters, digits, '_' and '-' only")
    on = f"ON CLUSTER '{cluster}'"
    out = []
    for stmt in split_statements(sql):
        if m := _CREATE.match(stmt):
            table = m.group(1)
            local = f"{table}_local"
            e = _ENGINE.search(stmt)
            if e is None:
                raise ValueError(f"{table}: no MergeTree engine")
            body = stmt[: m.start(1)] + f"{local} {on} (" + stmt[m.end() :]
            body = _ENGINE.sub(lambda x, local=local: _replicated(x.group(1), x.group(2) or "", local), body, count=1)
            out.append(body)
            key = _shard_key(table, e.group(1), stmt)
            out.append(
                f"CREATE TABLE IF NOT EXISTS {table} {on} AS {local}\n"
                f"ENGINE = Distributed('{cluster}', currentDatabase(), {local}, {key})"
            )
        elif m := _VIEW.match(stmt):
            # on every node, from its local requests into its local rollup
            out.append(
                f"CREATE MATERIALIZED VIEW IF NOT EXISTS {m.group(1)} {on} TO {m.group(2)}_local AS\n"
                + _locals(m.group(3), _tables())
            )
        elif m := _INSERT.match(stmt):
            # a backfill: INSERT has no ON CLUSTER; run it on one replica of every shard
            out.append(
                "-- on one replica of every shard (INSERT has no ON CLUSTER)\n"
                f"INSERT INTO {m.group(1)}_local " + _locals(m.group(2), _tables())
            )
        elif m := _DROP_VIEW.match(stmt):
            # a view re-created by a later statement (the rollups' views: on every node)
            out.append(f"DROP VIEW IF EXISTS {m.group(1)} {on}")
        elif m := _ALTER.match(stmt):
            table, rest = m.group(1), m.group(2)
            out.append(f"ALTER TABLE {table}_local {on} {rest}")
            if rest.upper().startswith(("ADD COLUMN", "DROP COLUMN")):
                out.append(f"ALTER TABLE {table} {on} {rest}")
        else:
            raise ValueError(
                f"not a CREATE TABLE, materialized view, DROP VIEW, backfill or ALTER TABLE: {stmt[:80]!r}"
            )
    return out


def cluster_schema(cluster: str) -> list[tuple[str, list[str]]]:
    """[(migration file name, its cluster statements)] for every shipped migration, in order."""
    return [(name, cluster_statements(cluster, sql)) for _, name, sql in migration_files()]
