"""Retention as settings (issue 28, item 5; pharos_core.retention) on a real chDB store: the
defaults are the migrations' TTLs, a setting changes the TTL of its tables only (read back from
system.tables), once; a bad value is refused before anything changes; the TTL really deletes."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from pharos_core.retention import RETENTION_TABLES, RetentionConfig, apply_retention, plan_retention, retention_in_force
from pharos_core.settings import Settings
from pharos_core.store import MIGRATIONS_TABLE, migrate, migration_files, open_store, split_statements


@pytest.fixture
def store(tmp_path, monkeypatch):
    for field in RetentionConfig.model_fields:
        monkeypatch.delenv(f"PHAROS_RETENTION_{field.upper()}", raising=False)
    monkeypatch.setenv("PHAROS_CONFIG", str(tmp_path / "none.toml"))  # no settings file: the defaults
    s = open_store(Settings(state_dir=tmp_path / "state"))
    yield s
    s.close()


def engines(store) -> dict[str, str]:
    rows = store.query("SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()")
    return {r["name"]: r["engine_full"] for r in rows}


def ttl_days(store, table: str) -> int:
    m = re.search(r"TTL (?:toDateTime\()?ingested\)? \+ toIntervalDay\((\d+)\)", engines(store)[table])
    assert m, engines(store)[table]
    return int(m.group(1))


def migration_ttls() -> dict[str, int]:
    """Each table's TTL days as the migrations' text leaves them (a later MODIFY TTL wins)."""
    out = {}
    for _, _, sql in migration_files():
        for stmt in split_statements(sql):
            m = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", stmt) or re.match(r"ALTER TABLE (\w+) MODIFY TTL", stmt)
            ttl = re.search(r"\bTTL\s+.*?INTERVAL (\d+) DAY", stmt, re.S)
            if m and ttl:
                out[m.group(1)] = int(ttl.group(1))
    return out


def test_every_expiring_table_has_a_setting_whose_default_is_its_migration_interval():
    ttls = migration_ttls()
    covered = [t for tables in RETENTION_TABLES.values() for t in tables]
    assert sorted(covered) == sorted(ttls), "a table with a TTL needs a [retention] setting (RETENTION_TABLES)"
    defaults = RetentionConfig()
    for setting, tables in RETENTION_TABLES.items():
        assert {ttls[t] for t in tables} == {getattr(defaults, setting)}, setting
    assert (defaults.raw_days, defaults.rollup_1s_days, defaults.rollup_days, defaults.system_days) == (90, 8, 90, 90)


def test_defaults_leave_the_ttls_as_the_migrations_made_them(store):
    # the migrations alone, as before the settings existed
    for _, _, sql in migration_files():
        for stmt in split_statements(sql):
            store.command(stmt)
    store.command(MIGRATIONS_TABLE)
    store.insert_rows("schema_migrations", [{"version": v, "name": n} for v, n, _ in migration_files()])
    before = engines(store)
    assert apply_retention(store) == []
    assert migrate(store) == []  # every migration recorded: the retention only
    assert engines(store) == before
    assert ttl_days(store, "io_requests") == 90 and ttl_days(store, "io_rollup_1s") == 8
    in_force = {t.table: (t.setting, t.days, t.wanted_days, t.statement) for t in retention_in_force(store)}
    assert in_force["io_requests"] == ("raw_days", 90, 90, None)
    assert in_force["control_actions"] == ("system_days", 90, 90, None)
    assert set(in_force) == {t for tables in RETENTION_TABLES.values() for t in tables}


def test_raw_days_changes_the_raw_tables_only_and_once(store):
    migrate(store)
    before = engines(store)
    changed = apply_retention(store, RetentionConfig(raw_days=7))
    raw = {"io_requests", "io_batches"}
    assert sorted((t.table, t.days, t.wanted_days) for t in changed) == [("io_batches", 90, 7), ("io_requests", 90, 7)]
    after = engines(store)
    assert "TTL ingested + toIntervalDay(7) SETTINGS ttl_only_drop_parts = 1" in after["io_requests"]
    assert "TTL toDateTime(ingested) + toIntervalDay(7) SETTINGS" in after["io_batches"]
    assert {t: e for t, e in after.items() if t not in raw} == {t: e for t, e in before.items() if t not in raw}
    # again: nothing to do, no ALTER (no new mutation), the same schema
    mutations = store.query("SELECT count() AS n FROM system.mutations WHERE table = 'io_requests'")
    assert migrate(store, RetentionConfig(raw_days=7)) == []
    assert apply_retention(store, RetentionConfig(raw_days=7)) == []
    assert store.query("SELECT count() AS n FROM system.mutations WHERE table = 'io_requests'") == mutations
    assert engines(store) == after
    # the setting is the truth: back to the default, back to 90 days
    assert sorted(t.table for t in apply_retention(store, RetentionConfig())) == ["io_batches", "io_requests"]
    assert engines(store) == before


def test_each_setting_reaches_its_tables(store):
    migrate(store)
    cfg = RetentionConfig(raw_days=3, rollup_1s_days=2, rollup_days=30, system_days=400)
    changed = {t.table for t in apply_retention(store, cfg)}
    assert changed == {t for tables in RETENTION_TABLES.values() for t in tables}
    for setting, tables in RETENTION_TABLES.items():
        for t in tables:
            assert ttl_days(store, t) == getattr(cfg, setting), t
    assert "TTL" not in engines(store)["job_events"]  # tables without a TTL stay without


def test_settings_file_and_environment(store, tmp_path, monkeypatch):
    cfg = tmp_path / "pharos.toml"
    cfg.write_text('kafka_bootstrap = "x:1"\n\n[retention]\nraw_days = 7\nrollup_days = 30\n')
    monkeypatch.setenv("PHAROS_CONFIG", str(cfg))
    monkeypatch.setenv("PHAROS_RETENTION_ROLLUP_DAYS", "60")  # the environment over the file
    r = RetentionConfig()
    assert (r.raw_days, r.rollup_1s_days, r.rollup_days, r.system_days) == (7, 8, 60, 90)
    migrate(store)  # no argument: the file and the environment
    assert ttl_days(store, "io_requests") == 7
    assert ttl_days(store, "io_rollup_forwarder_10m") == 60
    assert ttl_days(store, "io_rollup_1s") == 8


@pytest.mark.parametrize("bad", [0, -1, 3651, 7.5, "seven", True])
def test_a_bad_value_is_a_clear_error(bad):
    with pytest.raises(ValidationError, match=r"raw_days\n"):
        RetentionConfig(raw_days=bad)


def test_a_bad_setting_stops_migrate_before_anything_changes(store, monkeypatch):
    monkeypatch.setenv("PHAROS_RETENTION_RAW_DAYS", "0")
    with pytest.raises(ValidationError, match=r"raw_days\n.*greater than or equal to 1"):
        migrate(store)
    assert "schema_migrations" not in engines(store)


def test_raw_kept_longer_than_the_rollups_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="pharos_core.retention"):
        RetentionConfig(raw_days=90, rollup_days=90)
        assert not caplog.records
        r = RetentionConfig(raw_days=120, rollup_days=30)
    assert r.raw_days == 120  # a warning, not an error
    assert len(caplog.records) == 1 and "raw_days = 120 is more than rollup_days = 30" in caplog.text


def test_a_ttl_of_another_form_is_left_alone(store, caplog):
    migrate(store)
    store.command("ALTER TABLE anomalies MODIFY TTL ingested + toIntervalMonth(1)")
    before = engines(store)["anomalies"]
    with caplog.at_level(logging.WARNING, logger="pharos_core.retention"):
        changed = apply_retention(store, RetentionConfig(system_days=30))
    assert "anomalies" not in {t.table for t in changed}
    assert engines(store)["anomalies"] == before
    assert "anomalies has TTL 'ingested + toIntervalMonth(1)'" in caplog.text


def test_cluster_local_tables_get_the_alter_on_their_cluster(store):
    """pharos_core.cluster_schema's layout: T Distributed (no TTL), T_local replicated with the TTL.
    chDB has no cluster (no Keeper): the statements are planned and parsed, not run."""
    local = (
        "ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/io_requests_local', '{replica}') "
        "PARTITION BY toDate(start) ORDER BY (job_id, layer, start) TTL ingested + toIntervalDay(90) "
        "SETTINGS ttl_only_drop_parts = 1, index_granularity = 8192"
    )
    rows = [
        {
            "name": "io_requests",
            "engine": "Distributed",
            "engine_full": "Distributed('hpc-1', 'pharos', 'io_requests_local', cityHash64(job_id))",
        },
        {"name": "io_requests_local", "engine": "ReplicatedMergeTree", "engine_full": local},
        {"name": "io_rollup_1s_local", "engine": "ReplicatedAggregatingMergeTree", "engine_full": local},
    ]
    plan = plan_retention(rows, RetentionConfig(raw_days=7))
    assert [(t.table, t.statement) for t in plan] == [
        ("io_requests_local", "ALTER TABLE io_requests_local ON CLUSTER 'hpc-1' MODIFY TTL ingested + INTERVAL 7 DAY"),
        # no Distributed io_rollup_1s beside it: a local table of its own, altered here only
        ("io_rollup_1s_local", "ALTER TABLE io_rollup_1s_local MODIFY TTL ingested + INTERVAL 8 DAY"),
    ]
    for t in plan:
        store.query("SELECT formatQuery({q:String}) AS f", {"q": t.statement})


def test_the_ttl_deletes_what_the_setting_says(store):
    """Rows stored 30 days ago: kept under 90 days, gone under 1 day (after the TTL's mutation and a
    merge); rows stored now are kept."""
    migrate(store)
    for job, stored in (("old", "now() - INTERVAL 30 DAY"), ("new", "now()")):
        store.command(
            "INSERT INTO io_requests (start, end, job_id, count, bytes, ingested) "
            f"VALUES (now64(9), now64(9), '{job}', 1, 5, {stored})"
        )

    def jobs() -> list[str]:
        store.command("OPTIMIZE TABLE io_requests FINAL")
        return [r["job_id"] for r in store.query("SELECT job_id FROM io_requests ORDER BY job_id")]

    assert jobs() == ["new", "old"]
    apply_retention(store, RetentionConfig(raw_days=1))
    deadline = time.monotonic() + 60
    while store.query("SELECT 1 FROM system.mutations WHERE table = 'io_requests' AND NOT is_done"):
        assert time.monotonic() < deadline, "the TTL's mutation did not finish"
        time.sleep(0.1)
    assert jobs() == ["new"]


def test_the_example_config_block_is_the_defaults(tmp_path, monkeypatch):
    """deploy/pharos/pharos.toml's commented [retention] block, uncommented, reads as the defaults."""
    example = (Path(__file__).resolve().parents[2] / "deploy" / "pharos" / "pharos.toml").read_text().splitlines()
    start = example.index(next(line for line in example if line.startswith("# [retention]")))
    block = []
    for line in example[start:]:
        if not line.startswith("# "):
            break
        block.append(line.removeprefix("# ").split("#")[0].rstrip())
    assert len(block) == 1 + len(RetentionConfig.model_fields)
    (tmp_path / "pharos.toml").write_text("\n".join(block) + "\n")
    monkeypatch.setenv("PHAROS_CONFIG", str(tmp_path / "pharos.toml"))
    for field in RetentionConfig.model_fields:
        monkeypatch.delenv(f"PHAROS_RETENTION_{field.upper()}", raising=False)
    r = RetentionConfig()
    assert r.model_fields_set == set(RetentionConfig.model_fields)  # every field read from the file
    assert r.model_dump() == {f: info.default for f, info in RetentionConfig.model_fields.items()}


def test_pharos_config_shows_the_retention_in_force(monkeypatch):
    """``pharos config`` prints the ``[retention]`` days with the rest of the settings."""
    import json

    from typer.testing import CliRunner

    from pharos_api.cli import app

    monkeypatch.setenv("PHAROS_RETENTION_RAW_DAYS", "7")
    res = CliRunner().invoke(app, ["config"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["retention"] == {
        "raw_days": 7,
        "rollup_1s_days": 8,
        "rollup_days": 90,
        "system_days": 90,
    }
