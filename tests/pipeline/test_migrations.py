"""Schema migrations on real chDB: applied once, recorded, re-runnable."""

from __future__ import annotations

from pharos_pipeline.store import migrate, migration_files, open_store

TABLES = {"io_requests", "io_batches", "job_events", "producer_drops", "dead_letters", "schema_migrations"}


def test_migrate_twice_applies_nothing_the_second_time(pipeline_settings):
    store = open_store(pipeline_settings)      # a fresh chDB dir, nothing applied yet
    try:
        first = migrate(store)
        assert first == [name for _, name, _ in migration_files()]
        assert first[0] == "001_initial.sql"
        assert migrate(store) == []
        rows = store.query("SELECT version, name FROM schema_migrations FINAL ORDER BY version")
        assert [(int(r["version"]), r["name"]) for r in rows] == [(v, n) for v, n, _ in migration_files()]
        tables = {r["name"] for r in store.query("SELECT name FROM system.tables WHERE database = currentDatabase()")}
        assert TABLES <= tables
    finally:
        store.close()
    # a new process-level open of the same directory sees the recorded versions
    store = open_store(pipeline_settings)
    try:
        assert migrate(store) == []
        assert int(store.query("SELECT count() AS n FROM schema_migrations")[0]["n"]) == len(first)
    finally:
        store.close()
