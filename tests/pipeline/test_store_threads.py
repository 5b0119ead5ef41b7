"""No one lock for everything (issue 15, item 6): each thread reaches the store through its own
chDB session on the same directory, so an insert and a query of one thread complete while
another thread's slow query is still running, and every thread sees the others' data."""

from __future__ import annotations

import threading

import pytest
from pipeline_testkit import make_batch, make_record

from pharos_core.settings import Settings
from pharos_core.store import StoreError, migrate, open_store
from pharos_pipeline.columnar import insert_io_batches


@pytest.fixture
def store(tmp_path):
    s = open_store(Settings(state_dir=tmp_path / "state"))
    migrate(s)
    yield s
    s.close()


def test_a_slow_query_does_not_hold_up_another_thread(store):
    started, slow_done = threading.Event(), threading.Event()
    errors: list[str] = []

    def slow() -> None:
        try:
            started.set()
            # about 3 s of wall time, little CPU: one row every 0.1 s
            store.query("SELECT sum(sleepEachRow(0.1)) AS s FROM numbers(30) SETTINGS max_block_size = 1")
        except Exception as exc:
            errors.append(str(exc))
        finally:
            slow_done.set()

    t = threading.Thread(target=slow)
    t.start()
    started.wait(5)
    store.mark_ingest_thread()
    insert_io_batches(store, [make_batch("p1", 0, [make_record(k) for k in range(100)]).SerializeToString()])
    n = int(store.query("SELECT count() AS n FROM io_requests")[0]["n"])
    assert not slow_done.is_set(), "the slow query finished first: the insert waited for it"
    assert n == 100
    t.join(30)
    assert not errors, errors
    # the other thread's session sees what this one stored
    seen = []
    other = threading.Thread(target=lambda: seen.append(store.query("SELECT count() AS n FROM io_requests")))
    other.start()
    other.join(30)
    assert int(seen[0][0]["n"]) == 100


def test_priorities_and_close(store):
    prio = {}

    def read(name: str, ingest: bool) -> None:
        if ingest:
            store.mark_ingest_thread()
        prio[name] = int(store.query("SELECT getSetting('os_thread_priority') AS p")[0]["p"])

    for name, ingest in (("api", False), ("pipeline", True)):
        t = threading.Thread(target=read, args=(name, ingest))
        t.start()
        t.join(30)
    assert prio == {"api": store.QUERY_NICE, "pipeline": 0}
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.query("SELECT 1")


def test_query_rows_keep_their_values(store):
    # rows parsed in one go: strings with newlines, commas and brackets, arrays, maps, NULL,
    # DateTime64 text, and no rows at all
    rows = store.query(
        "SELECT number AS n, concat('a\\n,b]', toString(number)) AS s, [number, 2] AS a, "
        "map('k', number) AS m, if(number = 1, NULL, number) AS z, "
        "toDateTime64('2026-01-02 03:04:05.5', 3, 'UTC') AS t FROM numbers(3) ORDER BY n"
    )
    assert rows == [
        {
            "n": i,
            "s": f"a\n,b]{i}",
            "a": [i, 2],
            "m": {"k": i},
            "z": None if i == 1 else i,
            "t": "2026-01-02 03:04:05.500",
        }
        for i in range(3)
    ]
    assert store.query("SELECT 1 AS x WHERE 0") == []


def test_query_columns_are_the_rows_transposed(store):
    # the interference pass reads its ~10^6 usage rows as columns (Store.query_columns)
    sql = (
        "SELECT number AS n, toUInt64(9223372036854775808 + number) AS big, concat('a\\n,b]', toString(number)) AS s, "
        "[number, 2] AS a, if(number = 1, NULL, number) AS z, "
        "toDateTime64('2026-01-02 03:04:05.5', 3, 'UTC') AS t FROM numbers(3) ORDER BY n"
    )
    cols = store.query_columns(sql)
    assert list(cols) == ["n", "big", "s", "a", "z", "t"]
    assert cols["big"] == [2**63 + i for i in range(3)] and all(type(v) is int for v in cols["big"])
    rows = store.query(sql)
    assert {k: [r[k] for r in rows] for k in cols if k != "big"} == {k: v for k, v in cols.items() if k != "big"}
    assert store.query_columns("SELECT 1 AS x WHERE 0") == {"x": []}
    with pytest.raises(StoreError):
        store.query_columns("SELECT no_such_column")
