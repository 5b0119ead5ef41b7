"""Schema migrations on real chDB: applied once, recorded, re-runnable."""

from __future__ import annotations

import re

from pharos_core.store import migrate, migration_files, open_store
from pharos_pipeline.columnar import insert_io_batches

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
    "009_rollups.sql": {"tables": {"io_rollup_1s", "io_rollup_1m"}},
    "010_io_batches_created_index.sql": {},
    "011_rollup_data_ops.sql": {
        "columns": {
            (t, c)
            for t in ("io_rollup_1s", "io_rollup_1m")
            for c in ("data_bytes_read", "data_bytes_written", "data_reads", "data_writes", "meta_ops")
        }
    },
    "012_request_replays.sql": {"columns": {("io_requests", "request_id"), ("io_requests", "replay")}},
    "013_control_leases.sql": {"columns": {("control_allocations", "lease_until")}},
    "014_forwarder_rollups.sql": {"tables": {"io_rollup_forwarder_1m", "io_rollup_forwarder_10m"}},
    "015_io_batches_ttl.sql": {},
    "016_rollup_1m_per_job.sql": {},
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
        assert [r["type"] for r in idx] == ["minmax"]  # 010: liveness read by time
        idx = store.query(
            "SELECT type FROM system.data_skipping_indices WHERE table = 'io_requests' AND name = 'idx_replay'"
        )
        assert [r["type"] for r in idx] == ["minmax"]  # 012: the rare replay records found cheaply
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
    from pharos_core.store import ns_to_datetime64

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


def test_rollups_follow_inserts_and_are_backfilled_once(pipeline_settings):
    """009 and 011: the rollups' views add every insert into io_requests; applied to a store that
    already holds records, the migrations fill the rollups from them, once (011's columns with the
    operation sets of pharos_analytics.summary and the dashboards' IS_DATA)."""
    from pipeline_testkit import make_batch, make_record

    from pharos_analytics.summary_sql import META_OPS, READ_OPS, WRITE_OPS, sql_list
    from pharos_pipeline.messages import record_rows
    from pharos_pipeline.wire import io_pb2

    store = open_store(pipeline_settings)
    try:
        migrate(store)
        ops = [io_pb2.OP_PWRITE, io_pb2.OP_READ, io_pb2.OP_OPEN, io_pb2.OP_STAT, io_pb2.OP_WRITE]
        kinds = [io_pb2.FILE_TYPE_REGULAR, io_pb2.FILE_TYPE_REGULAR, io_pb2.FILE_TYPE_PIPE]
        b = make_batch(
            "p",
            0,
            [
                make_record(k, layer=2, forwarding_node=f"fwd{k % 2}", op=ops[k % 5], file_type=kinds[k % 3])
                for k in range(50)
            ],
        )
        insert_io_batches(store, [b.SerializeToString()])
        store.insert_rows("io_requests", record_rows(make_batch("p", 1, [make_record(k) for k in range(7)])))
        sums = (
            "SELECT sum(records) AS r, sum(ops) AS o, sum(bytes) AS b, sum(service_ns) AS s, "
            "sum(data_bytes_read) AS dbr, sum(data_bytes_written) AS dbw, sum(data_reads) AS dr, "
            "sum(data_writes) AS dw, sum(meta_ops) AS m FROM {}"
        )
        regular = "file_type = 'regular'"
        raw_sql = (
            "SELECT count() AS r, sum(count) AS o, sum(bytes) AS b, sum(duration_ns) AS s, "
            f"sumIf(bytes, {regular} AND op IN {sql_list(READ_OPS)}) AS dbr, "
            f"sumIf(bytes, {regular} AND op IN {sql_list(WRITE_OPS)}) AS dbw, "
            f"sumIf(count, {regular} AND op IN {sql_list(READ_OPS)}) AS dr, "
            f"sumIf(count, {regular} AND op IN {sql_list(WRITE_OPS)}) AS dw, "
            f"sumIf(count, op IN {sql_list(META_OPS)}) AS m FROM io_requests"
        )
        raw = store.query(raw_sql)
        assert all(int(v) > 0 for v in raw[0].values()), raw  # every column has something to sum
        assert store.query(sums.format("io_rollup_1s")) == raw == store.query(sums.format("io_rollup_1m"))
        # as if 009 had not run yet on this store: the re-run creates the rollups and fills them
        # from the records, 011 adds its columns and fills them
        # (014's views read io_rollup_1s: as on a store 014 has not reached yet, they come after)
        for v in ("io_rollup_forwarder_10m_mv", "io_rollup_forwarder_1m_mv", "io_rollup_1s_mv", "io_rollup_1m_mv"):
            store.command(f"DROP VIEW {v}")
        for t in ("io_rollup_1s", "io_rollup_1m"):
            store.command(f"DROP TABLE {t}")
        store.command(
            "ALTER TABLE schema_migrations DELETE WHERE version IN (9, 11, 14, 16) SETTINGS mutations_sync = 1"
        )
        # 010, 012, 013 and 015 stay recorded; 016 replaces 011's per-rank view again
        assert migrate(store) == [
            "009_rollups.sql",
            "011_rollup_data_ops.sql",
            "014_forwarder_rollups.sql",
            "016_rollup_1m_per_job.sql",
        ]
        assert store.query(sums.format("io_rollup_1s")) == raw == store.query(sums.format("io_rollup_1m"))
        # 011 again (a crash before it was recorded): the columns are filled, nothing is added twice
        # (then nothing after it was recorded either: 016 comes again and replaces 011's view)
        store.command("ALTER TABLE schema_migrations DELETE WHERE version IN (11, 16) SETTINGS mutations_sync = 1")
        assert migrate(store) == ["011_rollup_data_ops.sql", "016_rollup_1m_per_job.sql"]
        assert store.query(sums.format("io_rollup_1s")) == raw == store.query(sums.format("io_rollup_1m"))
        # the re-created views keep following the inserts
        rows_sql = "SELECT count() AS n, countIf(rank = -1) AS all FROM io_rollup_1m"
        before = store.query(rows_sql)[0]
        insert_io_batches(
            store, [make_batch("p", 2, [make_record(k, op=ops[k % 5]) for k in range(9)]).SerializeToString()]
        )
        raw = store.query(raw_sql)
        assert store.query(sums.format("io_rollup_1s")) == raw == store.query(sums.format("io_rollup_1m"))
        # 016: the view writes per job (rank -1): one row per minute, layer, job, node and target
        after = store.query(rows_sql)[0]
        keys = store.query(
            "SELECT count() AS n FROM (SELECT DISTINCT toStartOfMinute(start), layer, job_id, forwarding_node, "
            "target FROM io_requests WHERE producer_id = 'p' AND seq = 2)"
        )[0]
        assert int(after["n"]) - int(before["n"]) == int(after["all"]) - int(before["all"]) == int(keys["n"]) > 0
        per_node = store.query(
            "SELECT forwarding_node AS n, sum(ops) AS o FROM io_rollup_1s WHERE layer = 'forwarder' GROUP BY n ORDER BY n"
        )
        assert [(r["n"], int(r["o"])) for r in per_node] == [
            (r["n"], int(r["o"]))
            for r in store.query(
                "SELECT forwarding_node AS n, sum(count) AS o FROM io_requests WHERE layer = 'forwarder' "
                "GROUP BY n ORDER BY n"
            )
        ]
        _forwarder_rollups_follow(store)
    finally:
        store.close()


def _forwarder_rollups_follow(store) -> None:
    """014: the forwarder layer's per-minute and per-10-minute rollups (views on io_rollup_1s and
    on the per-minute one) hold the forwarder records' sums, by minute / 10 minutes, forwarding
    node (also none), job and target; applied to a store that already holds records, the
    migration fills them once."""
    from pipeline_testkit import make_batch, make_record

    by = "toStartOfInterval({t}, INTERVAL {s} SECOND) AS i, forwarding_node AS f, target AS g, job_id AS j"
    raw_sql = (
        f"SELECT {by.format(t='start', s='{s}')}, sum(count) AS o, sum(bytes) AS b, sum(duration_ns) AS d, "
        "sum(queue_wait_ns) AS q FROM io_requests WHERE layer = 'forwarder' GROUP BY i, f, g, j ORDER BY i, f, g, j"
    )

    def rolled(table, step):
        return store.query(
            f"SELECT {by.format(t='time', s=step)}, sum(ops) AS o, sum(bytes) AS b, sum(service_ns) AS d, "
            f"sum(queue_wait_ns) AS q FROM {table} GROUP BY i, f, g, j ORDER BY i, f, g, j"
        )

    def check():
        for table, step in (("io_rollup_forwarder_1m", 60), ("io_rollup_forwarder_10m", 600)):
            raw = store.query(raw_sql.replace("{s}", str(step)))
            assert raw and rolled(table, step) == raw, table
        assert any(r["f"] == "" for r in rolled("io_rollup_forwarder_1m", 60))

    # records 50 s apart: several minutes, two 10-minute intervals; every fifth names no
    # forwarding node (kept: the interference pass counts its requests)
    recs = [
        make_record(
            k, layer=2, forwarding_node=f"fwd{k % 3}" if k % 5 else "", target=f"ost{k % 4}", queue_wait_ns=100 + k
        )
        for k in range(30)
    ]
    for k, r in enumerate(recs):
        r.start_ns += k * 50 * 10**9
    insert_io_batches(store, [make_batch("fw", 0, recs).SerializeToString()])
    check()
    for v in ("io_rollup_forwarder_10m_mv", "io_rollup_forwarder_1m_mv"):
        store.command(f"DROP VIEW {v}")
    for t in ("io_rollup_forwarder_1m", "io_rollup_forwarder_10m"):
        store.command(f"DROP TABLE {t}")
    store.command("ALTER TABLE schema_migrations DELETE WHERE version = 14 SETTINGS mutations_sync = 1")
    assert migrate(store) == ["014_forwarder_rollups.sql"]
    check()
    insert_io_batches(store, [make_batch("fw", 1, recs[:7]).SerializeToString()])  # the views follow again
    check()
