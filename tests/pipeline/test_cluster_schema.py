"""The cluster variant of the schema (issue 15, item 8): ClickHouse's own parser (chDB's
formatQuery) accepts every statement; each table of the migrations becomes a replicated T_local
and a Distributed T sharded as documented; the local tables, created on chDB without the
replication (no Keeper here), have exactly the columns and sorting keys of the single-server
schema. A real cluster is not run here."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from pharos_api.cli import app
from pharos_core.cluster_schema import cluster_schema, cluster_statements
from pharos_core.settings import Settings
from pharos_core.store import migrate, open_store


@pytest.fixture
def store(tmp_path):
    s = open_store(Settings(state_dir=tmp_path / "state"))
    yield s
    s.close()


def statements() -> list[str]:
    return [s for _, stmts in cluster_schema("hpc-1") for s in stmts]


def test_every_statement_parses(store):
    for stmt in statements():
        store.query("SELECT formatQuery({q:String}) AS f", {"q": stmt})
    with pytest.raises(Exception, match="Syntax error"):
        store.query("SELECT formatQuery({q:String}) AS f", {"q": "CREATE TABLE t (a UInt8) ENGINE = = MergeTree"})


def test_tables_become_replicated_locals_and_distributed(store):
    migrate(store)
    tables = {
        r["name"]
        for r in store.query(
            "SELECT name FROM system.tables WHERE database = currentDatabase() AND engine != 'MaterializedView'"
        )
    }
    tables.discard("schema_migrations")
    stmts = statements()
    for t in tables:
        (local,) = [s for s in stmts if s.startswith(f"CREATE TABLE IF NOT EXISTS {t}_local ON CLUSTER 'hpc-1'")]
        assert re.search(
            rf"ENGINE = Replicated\w*MergeTree\('/clickhouse/tables/{{shard}}/{{database}}/{t}_local'", local
        )
        (dist,) = [s for s in stmts if s.startswith(f"CREATE TABLE IF NOT EXISTS {t} ON CLUSTER")]
        assert f"Distributed('hpc-1', currentDatabase(), {t}_local, " in dist
    key = {t: next(s for s in stmts if s.startswith(f"CREATE TABLE IF NOT EXISTS {t} ON")) for t in tables}
    assert key["io_requests"].endswith("cityHash64(job_id))")
    assert key["io_batches"].endswith("cityHash64(producer_id))")  # replacing rows meet on one shard
    assert key["anomalies"].endswith("rand())")
    # an added column reaches the Distributed table too; a TTL change only the local one
    assert any(
        s.startswith("ALTER TABLE io_requests ON CLUSTER 'hpc-1' ADD COLUMN IF NOT EXISTS ingested") for s in stmts
    )
    assert not any(s.startswith("ALTER TABLE io_requests ON CLUSTER 'hpc-1' MODIFY TTL") for s in stmts)
    # the rollups' views read each node's local requests into its local rollup
    # (created by 009, dropped and re-created with more columns by 011: in that order, on every node)
    views = [s for s in stmts if s.startswith("CREATE MATERIALIZED VIEW IF NOT EXISTS io_rollup_1s_mv")]
    assert len(views) == 2 and all("TO io_rollup_1s_local AS" in v and "FROM io_requests_local" in v for v in views)
    drop = stmts.index("DROP VIEW IF EXISTS io_rollup_1s_mv ON CLUSTER 'hpc-1'")
    assert stmts.index(views[0]) < drop < stmts.index(views[1]) and "meta_ops" in views[1]


def test_local_tables_match_the_single_server_schema(store):
    """The single-server tables (migrate) and the cluster's T_local tables side by side in one
    chDB database (one data directory per process)."""
    migrate(store)
    for stmt in statements():
        target = stmt.split(" ON CLUSTER ")[0]
        if "Distributed(" in stmt or not target.endswith("_local") or "MATERIALIZED VIEW" in stmt:
            continue
        plain = stmt.replace(" ON CLUSTER 'hpc-1'", "")
        plain = re.sub(r"Replicated(\w*MergeTree)\('[^']*', '\{replica\}'(?:, )?", r"\1(", plain)
        store.command(plain)
    cols = store.query(
        "SELECT table, name, type, default_expression FROM system.columns WHERE database = currentDatabase()"
    )
    keys = store.query("SELECT name AS table, sorting_key FROM system.tables WHERE database = currentDatabase()")

    def shape(rows, local: bool) -> set:
        return {
            (r["table"].removesuffix("_local"), *(v for k, v in r.items() if k != "table"))
            for r in rows
            if r["table"].endswith("_local") == local and r["table"] != "schema_migrations" and "_mv" not in r["table"]
        }

    assert shape(cols, True) == shape(cols, False)
    assert shape(keys, True) == shape(keys, False)
    assert len(shape(keys, True)) >= 14


def test_cli_prints_it_and_refuses_a_bad_name():
    r = CliRunner().invoke(app, ["schema", "--cluster", "hpc-1"])
    assert r.exit_code == 0, r.output
    assert "-- 001_initial.sql" in r.output and "ENGINE = Distributed('hpc-1'" in r.output
    r = CliRunner().invoke(app, ["schema", "--cluster", "x'; DROP TABLE io_requests"])
    assert r.exit_code != 0 and "cluster name" in r.output
    with pytest.raises(ValueError, match="not a CREATE TABLE"):
        cluster_statements("c", "DROP TABLE io_requests")
