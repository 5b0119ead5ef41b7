"""Schema migrations on real chDB: applied once, recorded, re-runnable."""

from __future__ import annotations

import re

from pharos_pipeline.store import migrate, migration_files, open_store

# What each migration must leave behind, written out by hand: the tables it creates and the
# columns it adds (table, column). A new migration that is not listed here fails the first test.
MIGRATIONS = {
    "001_initial.sql": {"tables": {"io_requests", "io_batches", "job_events", "producer_drops", "dead_letters"}},
    "002_ttl_by_ingest_time.sql": {"columns": {("io_requests", "ingested")}},
    "003_darshan.sql": {"tables": {"darshan_counters", "darshan_logs"}},
    "004_target_metrics.sql": {"tables": {"target_metrics"}},
    "005_system_diagnosis.sql": {"tables": {"anomalies", "alert_log"}},
    "006_target_service_sum.sql": {"columns": {("target_metrics", "service_ns_sum")}},
    "007_control.sql": {"tables": {"control_actions", "control_pins", "control_allocations"}},
    "008_api_tokens.sql": {"tables": {"api_tokens"}},
    "009_io_batches_created_index.sql": {},
}
TABLES = {"schema_migrations"}.union(*(m.get("tables", set()) for m in MIGRATIONS.values()))
COLUMNS = set().union(*(m.get("columns", set()) for m in MIGRATIONS.values()))


def test_every_migration_is_listed_with_the_tables_it_creates():
    files = {name: sql for _, name, sql in migration_files()}
    assert set(files) == set(MIGRATIONS), "list each new migration's tables and columns in MIGRATIONS"
    for name, sql in files.items():
        created = set(re.findall(r"CREATE TABLE IF NOT EXISTS\s+(\w+)", sql, flags=re.IGNORECASE))
        assert created == MIGRATIONS[name].get("tables", set()), name


def test_migrate_twice_applies_nothing_the_second_time(pipeline_settings):
    store = open_store(pipeline_settings)  # a fresh chDB dir, nothing applied yet
    try:
        first = migrate(store)
        assert first == [name for _, name, _ in migration_files()]
        assert first[0] == "001_initial.sql"
        assert migrate(store) == []
        rows = store.query("SELECT version, name FROM schema_migrations FINAL ORDER BY version")
        assert [(int(r["version"]), r["name"]) for r in rows] == [(v, n) for v, n, _ in migration_files()]
        tables = {r["name"] for r in store.query("SELECT name FROM system.tables WHERE database = currentDatabase()")}
        assert tables >= TABLES, TABLES - tables
        columns = {
            (r["table"], r["name"])
            for r in store.query("SELECT table, name FROM system.columns WHERE database = currentDatabase()")
        }
        assert columns >= COLUMNS, COLUMNS - columns
        ttl = store.query("SELECT create_table_query AS q FROM system.tables WHERE name = 'io_requests'")[0]["q"]
        assert "TTL ingested + toIntervalDay(90)" in ttl, ttl  # 002: the TTL counts from ingest time
        idx = store.query(
            "SELECT type FROM system.data_skipping_indices WHERE table = 'io_batches' AND name = 'idx_created'"
        )
        assert [r["type"] for r in idx] == ["minmax"]  # 009: liveness read by time
    finally:
        store.close()
    # a new process-level open of the same directory sees the recorded versions
    store = open_store(pipeline_settings)
    try:
        assert migrate(store) == []
        assert int(store.query("SELECT count() AS n FROM schema_migrations")[0]["n"]) == len(first)
    finally:
        store.close()


def test_old_requests_survive_the_ttl(pipeline_settings):
    """Imported history (requests years old) is kept: the TTL counts from ingest time."""
    from pharos_pipeline.store import ns_to_datetime64

    store = open_store(pipeline_settings)
    try:
        migrate(store)
        old = 1_500_000_000_000_000_000  # 2017
        store.insert_rows(
            "io_requests",
            [{"start": ns_to_datetime64(old), "end": ns_to_datetime64(old), "job_id": "old", "count": 1, "bytes": 5}],
        )
        store.command("OPTIMIZE TABLE io_requests FINAL")
        assert store.query("SELECT job_id, bytes FROM io_requests WHERE job_id = 'old'") == [
            {"job_id": "old", "bytes": 5}
        ]
    finally:
        store.close()
