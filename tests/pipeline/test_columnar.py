"""The fast ingest path (pharos_pipeline.columnar): ClickHouse's Protobuf input format,
decoding IoBatch messages in the store, gives exactly the rows of the reference mapping
(ingest.record_rows) for every field, edge values included, and refuses a poll holding an
invalid record without storing any of it. Real chDB; no Kafka."""

from __future__ import annotations

import pytest
from pipeline_testkit import make_batch, make_record

from pharos_core.store import StoreError, migrate, open_store
from pharos_pipeline import columnar
from pharos_pipeline.columnar import insert_io_batches
from pharos_pipeline.messages import InvalidMessage, batch_row, batch_row_json, decode_batch, record_rows
from pharos_pipeline.wire.pharos.v1 import io_pb2

MAX_NS = (1 << 63) - 1


@pytest.fixture
def store(tmp_path):
    from pharos_core.settings import Settings

    s = open_store(Settings(state_dir=tmp_path / "state"))
    migrate(s)
    s.command("CREATE TABLE reference AS io_requests")
    yield s
    s.close()


def edge_records() -> list[io_pb2.IoRecord]:
    return [
        make_record(0),
        make_record(1, count=256, offset=(1 << 64) - 1, size=(1 << 64) - 1, result=-28, fd=-1, rank=-1),
        make_record(2, host="", op=99, layer=7, file_type=42),  # unknown enums, the batch's host
        make_record(3, start_ns=MAX_NS, end_ns=MAX_NS, duration_ns=(1 << 64) - 1, queue_wait_ns=(1 << 64) - 1),
        make_record(4, result=(1 << 63) - 1, count=1, object_id=(1 << 64) - 1, dev=(1 << 64) - 1, inode=1 << 40),
        make_record(5, result=(1 << 32), count=(1 << 32) - 1),  # bytes just inside UInt64
        make_record(6, path="/scratch/ünïcødé 'quoted'\t\\", comm="", job_id="", compute_node="cn\n1"),
        make_record(7, layer=io_pb2.LAYER_FORWARDER, forwarding_node="fwd3", target="ost7", pid=(1 << 32) - 1),
    ]


def rows(store, table: str) -> list[dict]:
    return store.query(f"SELECT * FROM {table} ORDER BY producer_id, seq, record_index")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_store_decodes_exactly_as_the_reference(store, threads):
    batches = [
        make_batch("p1", 0, edge_records(), host="cn009"),
        make_batch("p1", 1, []),
        make_batch("p2", 5, [make_record(k, job="77") for k in range(300)]),
        make_batch("p3", 0, [make_record(k) for k in range(3)], host=""),
    ]
    for b in batches:
        decode_batch(b.SerializeToString())  # all valid by the reference's rules
    insert_io_batches(store, [b.SerializeToString() for b in batches], threads)
    store.insert_rows("reference", [r for b in batches for r in record_rows(b)])
    got, want = rows(store, "io_requests"), rows(store, "reference")
    assert len(got) == len(edge_records()) + 300 + 3
    # `ingested` is each insert's own now(): the two inserts may fall in different seconds
    stamps = {r.pop("ingested") for r in got} | {r.pop("ingested") for r in want}
    assert len(stamps) <= 2, stamps
    assert got == want
    unknown = got[2]
    assert (unknown["op"], unknown["layer"], unknown["file_type"], unknown["host"]) == (
        "unknown_99",
        "unknown_7",
        "unknown_42",
        "cn009",
    )
    # every field at its default (the reference's JSON text cannot carry time 0: checked apart)
    insert_io_batches(store, [make_batch("p9", 0, [io_pb2.IoRecord(count=1)]).SerializeToString()])
    (zero,) = store.query("SELECT * FROM io_requests WHERE producer_id = 'p9'")
    assert zero["start"].startswith("1970-01-01 00:00:00") and zero["op"] == "" and zero["host"] == "cn001"
    assert (zero["bytes"], zero["count"], zero["rank"], zero["record_index"]) == (0, 1, 0, 0)
    # one statement, one part per day partition (2262, today, 1970): all or nothing
    parts = store.query(
        "SELECT count() AS n, uniqExact(partition) AS p FROM system.parts WHERE table = 'io_requests' AND active"
    )
    assert (int(parts[0]["n"]), int(parts[0]["p"])) == (3, 3)


@pytest.mark.parametrize(
    "bad",
    [
        make_record(1, count=0),
        make_record(1, start_ns=MAX_NS + 1),
        make_record(1, end_ns=MAX_NS + 5),
        make_record(1, result=1 << 33, count=(1 << 32) - 1),  # bytes past UInt64
    ],
    ids=["count-0", "start-past-2262", "end-past-2262", "bytes-overflow"],
)
def test_an_invalid_record_stores_nothing_of_the_poll(store, bad):
    good = make_batch("p1", 0, [make_record(k) for k in range(50)])
    wrong = make_batch("p1", 1, [make_record(0), bad])
    with pytest.raises(InvalidMessage):
        decode_batch(wrong.SerializeToString())
    with pytest.raises(StoreError, match=columnar.INVALID_RECORD):
        insert_io_batches(store, [good.SerializeToString(), wrong.SerializeToString()], 2)
    assert int(store.query("SELECT count() AS n FROM io_requests")[0]["n"]) == 0


def test_marker_lines_store_as_the_reference_rows(store):
    """The pipeline's io_batches markers, made as JSONEachRow lines while a poll is decoded
    (batch_row_json), are the text json.dumps makes of batch_row and store the same rows, odd
    strings and edge numbers included."""
    import json

    batches = [
        make_batch('cn"0\\é\n\t\x01:agent\u2028', (1 << 64) - 1, [make_record(0)], host="h 'ö'", created_ns=MAX_NS),
        make_batch("p", 0, [], host=""),
        make_batch("p", 7, [make_record(k) for k in range(5)]),
    ]
    for b in batches:
        assert batch_row_json(b) == json.dumps(batch_row(b), separators=(",", ":"), ensure_ascii=False)
    store.command("CREATE TABLE io_batches_ref AS io_batches")
    assert store.insert_json_lines("io_batches", [batch_row_json(b) for b in batches]) == 3
    store.insert_rows("io_batches_ref", [batch_row(b) for b in batches])
    cols = "producer_id, seq, host, records, created"
    got = store.query(f"SELECT {cols} FROM io_batches ORDER BY producer_id, seq")
    assert got == store.query(f"SELECT {cols} FROM io_batches_ref ORDER BY producer_id, seq")
    assert [int(r["records"]) for r in got] == [1, 0, 5] and int(got[0]["seq"]) == (1 << 64) - 1
    assert got[0]["producer_id"] == batches[0].producer_id and got[0]["host"] == "h 'ö'"


def test_length_delimited_and_split():
    msgs = [b"", b"x" * 127, b"y" * 128, b"z" * 300_000]
    data = columnar.length_delimited(msgs)
    assert data[:1] == b"\x00" and data[1:2] == b"\x7f" and data[129:131] == b"\x80\x01"
    assert data[-300_000 - 3 : -300_000] == bytes([0xE0, 0xA7, 0x12])  # 300000 as a varint
    runs = columnar.split_even([b"a" * 10] * 10, 3)
    assert [len(r) for r in runs] == [4, 3, 3] or sum(len(r) for r in runs) == 10
    assert [m for r in runs for m in r] == [b"a" * 10] * 10
    assert columnar.split_even([], 2) == []


def test_stream_folders_of_killed_processes_are_removed(tmp_path):
    """A pipeline killed mid-insert (SIGKILL) leaves its stream files (in /dev/shm: memory until a
    reboot); the next start removes the folders of dead pids old enough, and no other."""
    import os
    import subprocess
    import sys
    import time

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    dead_pid = int(dead.stdout)
    old = time.time() - 3600

    def folder(name: str, mtime: float) -> None:
        d = tmp_path / name
        d.mkdir()
        (d / "0.bin").write_bytes(b"x" * 100)
        os.utime(d, (mtime, mtime))

    folder(f"{columnar.STREAM_PREFIX}{dead_pid}-abc", old)  # killed long ago: removed
    folder(f"{columnar.STREAM_PREFIX}{dead_pid}-new", time.time())  # too fresh to judge: kept
    folder(f"{columnar.STREAM_PREFIX}{os.getpid()}-live", old)  # a live process's: kept
    folder(f"{columnar.STREAM_PREFIX}x7q_", old)  # the name before the pid was in it: removed
    folder("someone-else", old)  # not ours: kept
    assert columnar.remove_stale_streams(tmp_path, min_age_s=600) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{columnar.STREAM_PREFIX}{dead_pid}-new", f"{columnar.STREAM_PREFIX}{os.getpid()}-live", "someone-else"]
    )
    assert columnar.remove_stale_streams(tmp_path, min_age_s=600) == 0


def test_the_insert_names_its_stream_folder_with_its_pid(store, monkeypatch):
    """The folder the insert writes its stream to carries this process's pid (so a killed
    process's can be told apart), exists while the statement runs, and is gone after."""
    import os
    import re

    folders = []
    real = store.command

    def spy(sql, params=None):
        m = re.search(rf"file\('([^']*/{columnar.STREAM_PREFIX}{os.getpid()}-[^/']+)/", sql)
        if m:
            folders.append((m.group(1), os.path.isdir(m.group(1))))
        return real(sql, params)

    monkeypatch.setattr(store, "command", spy)
    insert_io_batches(store, [make_batch("p", 0, [make_record(0)]).SerializeToString()])
    assert len(folders) == 1 and folders[0][1], folders
    assert not os.path.exists(folders[0][0])
    assert int(store.query("SELECT count() AS n FROM io_requests")[0]["n"]) == 1
