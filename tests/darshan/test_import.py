"""The Darshan importer on the real corpus, into a real chDB store."""

from __future__ import annotations

import shutil

from pharos_darshan_corpus import count, log, logs

from pharos_analytics.summary import job_summary
from pharos_pipeline.darshan_import import import_log, import_logs

TABLES = ("io_requests", "darshan_counters", "job_events FINAL", "darshan_logs FINAL")


def totals(store):
    return {t: count(store, f"SELECT count() AS n FROM {t}") for t in TABLES}


def test_every_release_log_imports(store):
    paths = logs("release_logs")
    results = import_logs(store, paths)
    assert [r.status for r in results] == ["imported"] * len(paths), [r.error for r in results]
    for r in results:
        assert r.ranks == 4 and "POSIX" in r.modules and r.counter_rows > 0
        s = job_summary(store, r.job_id)
        assert s.ranks == 4 and s.state == "finished" and s.start is not None and s.end >= s.start
        n = count(
            store,
            "SELECT count() AS n FROM darshan_counters WHERE job_id = {j:String} "
            "AND counter = 'POSIX_BYTES_WRITTEN' AND value > 0",
            j=r.job_id,
        )
        assert n >= 1
    # Logs with DXT (3.1.3-3.1.6) give per-request rows with absolute times inside the job.
    dxt = [r for r in results if r.dxt_segments]
    assert len(dxt) == 8
    for r in dxt:
        row = store.query(
            "SELECT min(start) >= (SELECT min(time) FROM job_events WHERE job_id = {j:String}) AS inside, "
            "countIf(path = '') AS nopath, uniqExact(rank) AS ranks, count() AS n FROM io_requests WHERE job_id = {j:String}",
            {"j": r.job_id},
        )[0]
        assert int(row["inside"]) == 1 and int(row["nopath"]) == 0 and int(row["ranks"]) == 4
        assert int(row["n"]) == r.dxt_segments


def test_reimport_stores_nothing_twice(store, tmp_path):
    p = log("mpi_io_test_with_dxt/treddy_mpi-io-test_id4373053_6-2-60198-9815401321915095332_1.darshan")
    first = import_log(store, p)
    assert first.status == "imported" and first.dxt_segments == 320 and first.dxt_skipped == 256
    before = totals(store)
    again = import_log(store, p)
    copy = tmp_path / "renamed.darshan"
    shutil.copy(p, copy)
    other = import_log(store, copy, job_id="another-id")  # same bytes, other path and job id
    assert again.status == other.status == "skipped" and other.job_id == first.job_id
    assert totals(store) == before


def test_empty_log_is_an_empty_job(store):
    r = import_log(store, log("empty_log/empty_log.darshan"))
    assert r.status == "imported" and r.modules == [] and r.counter_rows == r.dxt_segments == 0
    assert any("no module data" in w for w in r.warnings)
    s = job_summary(store, r.job_id)
    assert s.ranks == 4 and s.requests == 0 and s.bytes_written == 0 and s.state == "finished"


def test_dlio_set_imports_as_one_job(store):
    paths = logs("dlio_logs")
    results = import_logs(store, paths, job_id="dlio", name="dlio-run")
    assert {r.status for r in results} == {"imported"} and {r.job_id for r in results} == {"dlio"}
    assert sorted(r.rank_offset for r in results) == list(range(len(paths)))
    s = job_summary(store, "dlio")
    assert s.name == "dlio-run" and s.ranks == len(paths) == 24
    ranks = store.query("SELECT groupUniqArray(rank) AS r FROM darshan_counters WHERE job_id = 'dlio' AND rank >= 0")[
        0
    ]["r"]
    assert sorted(ranks) == list(range(24))
    span = store.query(
        "SELECT toUnixTimestamp64Nano(min(start)) AS s, toUnixTimestamp64Nano(max(end)) AS e "
        "FROM darshan_logs FINAL WHERE job_id = 'dlio'"
    )[0]
    ev = store.query("SELECT kind, toUnixTimestamp64Nano(time) AS t FROM job_events FINAL WHERE job_id = 'dlio'")
    assert {r["kind"]: int(r["t"]) for r in ev} == {"start": int(span["s"]), "end": int(span["e"])}


def test_partial_logs_import_with_warnings(store):
    for rel, mod in (
        ("partial_data_dxt/partial_data_dxt.darshan", "DXT_POSIX"),
        ("partial_data_stdio/partial_data_stdio.darshan", "STDIO"),
        ("imbalanced_io/imbalanced-io.darshan", "POSIX"),
    ):
        r = import_log(store, log(rel))
        assert r.status == "imported" and mod in r.partial_modules
        assert any(f"module {mod} is partial" in w for w in r.warnings)


def test_unreadable_file_fails_cleanly(store, tmp_path):
    bad = tmp_path / "junk.darshan"
    bad.write_bytes(b"this is not a darshan log\n" * 10)
    before = totals(store)
    r = import_log(store, bad)
    assert r.status == "failed" and "junk.darshan" in r.error
    assert import_log(store, tmp_path / "missing.darshan").status == "failed"
    assert totals(store) == before


def test_job_id_collision_gets_a_suffix(store):
    p = log("ior_daos/snyder_ior-POSIX_id1057716-202103_11-8-64415-6936117869459351096_1.darshan")
    store.insert_rows(
        "job_events",
        [
            {
                "job_id": "1057716",
                "kind": "start",
                "time": "1700000000.000000000",
                "name": "traced",
                "command": [],
                "user": "bob",
                "ranks": 1,
                "host": "x",
                "exit_code": 0,
                "cgroup": "",
            }
        ],
    )
    r = import_log(store, p)
    assert r.status == "imported" and r.job_id.startswith("1057716-") and len(r.job_id) == len("1057716-") + 8
    assert job_summary(store, "1057716").name == "traced"  # the traced job is untouched
