"""Schema migrations on real chDB: applied once, recorded, re-runnable."""

from __future__ import annotations

from pharos_pipeline.store import migrate, migration_files, open_store

TABLES = {"io_requests", "io_batches", "job_events", "producer_drops", "dead_letters", "schema_migrations"}


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
        assert tables >= TABLES
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
