"""The pipeline against the real Kafka broker and real chDB: exact row values, dead
letters, duplicates, gaps, repair after a crash between inserts."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import Consumer
from pipeline_testkit import (
    Q_RECORDS,
    T0,
    expected_row,
    make_batch,
    make_record,
    produce,
    wait_for,
)

from pharos_pipeline.ingest import Pipeline
from pharos_pipeline.messages import InvalidMessage, decode_job_event, record_rows
from pharos_pipeline.stored import pipeline_stats
from pharos_pipeline.wire import IoBatchHeader, io_pb2


def drain(pipe: Pipeline, cond, timeout: float = 60, what: str = "the pipeline") -> None:
    wait_for(cond, timeout, step=lambda: pipe.process_once(0.2), what=what)


def test_records_stored_with_exact_values(pipeline_settings, store):
    s = pipeline_settings
    merged = make_record(0, count=256, offset=1 << 32)  # a merged run
    failed = make_record(
        1,
        op=io_pb2.OP_OPEN,
        result=-2,
        fd=-1,
        size=0,
        count=1,
        file_type=io_pb2.FILE_TYPE_UNSPECIFIED,
        path="/scratch/missing",
    )
    fwd = make_record(
        2,
        layer=io_pb2.LAYER_FORWARDER,
        host="",
        compute_node="cn002",
        forwarding_node="fwd0",
        target="ost3",
        object_id=77,
        queue_wait_ns=10_000,
        size=1 << 20,
        result=1 << 20,
        op=io_pb2.OP_WRITE,
        rank=-1,
        dev=(1 << 64) - 1,
    )
    batches = [
        make_batch(
            "cn001:agent:1",
            0,
            [merged, failed, fwd],
            drops=[io_pb2.DropCounters(job_id="4242", ringbuf_drops=5, overflow_drops=1)],
        ),
        make_batch(
            "cn001:agent:1",
            1,
            [make_record(i) for i in range(3, 40)],
            drops=[io_pb2.DropCounters(job_id="4242", ringbuf_drops=7, overflow_drops=1, unmerged_fallbacks=3)],
        ),
        make_batch("fwd0:fwd:9", 0, [make_record(i, job="77", host="fwd0") for i in range(10)], host="fwd0"),
        make_batch("fwd0:fwd:9", 1, [], host="fwd0"),  # an empty batch
    ]
    start = io_pb2.JobEvent(
        schema_version=1,
        job_id="4242",
        kind=io_pb2.JobEvent.KIND_START,
        time_ns=T0 - 1,
        name="ior",
        command=["ior", "-w"],
        user="alice",
        ranks=4,
        host="cn001",
        cgroup="pharos/job_4242",
    )
    end = io_pb2.JobEvent(
        schema_version=1, job_id="4242", kind=io_pb2.JobEvent.KIND_END, time_ns=T0 + 99, exit_code=3, host="cn001"
    )
    produce(
        s,
        [(s.topic_requests, b.producer_id.encode(), b.SerializeToString()) for b in batches]
        + [(s.topic_jobs, b"4242", e.SerializeToString()) for e in (start, end)],
    )

    pipe = Pipeline(s, store)
    try:
        drain(pipe, lambda: pipe.stats()["batches"] == 4 and pipe.stats()["job_events"] == 2)
        st = pipe.stats()
        assert st["records"] == 3 + 37 + 10
        assert st["dead_letters"] == st["duplicates_skipped"] == st["gaps"] == 0
        assert st["last_commit_time"] is not None
    finally:
        pipe.close()

    got = store.query(Q_RECORDS)
    want = [
        expected_row(b, i) for b in sorted(batches, key=lambda b: (b.producer_id, b.seq)) for i in range(len(b.records))
    ]
    assert got == want
    # spot checks that do not go through expected_row
    assert got[0]["bytes"] == str(4096 * 256) and got[0]["start_ns"] == str(T0)
    assert got[1]["bytes"] == "0" and got[1]["result"] == "-2" and got[1]["file_type"] == ""
    assert got[2]["host"] == "cn001" and got[2]["layer"] == "forwarder" and got[2]["rank"] == -1

    b = store.query(
        "SELECT producer_id, seq, records, toString(toUnixTimestamp64Nano(created)) AS c "
        "FROM io_batches FINAL ORDER BY producer_id, seq"
    )
    assert [(r["producer_id"], int(r["seq"]), r["records"], int(r["c"])) for r in b] == [
        (x.producer_id, x.seq, len(x.records), x.created_ns)
        for x in sorted(batches, key=lambda x: (x.producer_id, x.seq))
    ]
    d = store.query(
        "SELECT producer_id, job_id, ringbuf_drops, overflow_drops, unmerged_fallbacks, "
        "toString(toUnixTimestamp64Nano(updated)) AS u FROM producer_drops FINAL"
    )
    assert [
        (
            r["producer_id"],
            r["job_id"],
            int(r["ringbuf_drops"]),
            int(r["overflow_drops"]),
            int(r["unmerged_fallbacks"]),
            int(r["u"]),
        )
        for r in d
    ] == [("cn001:agent:1", "4242", 7, 1, 3, batches[1].created_ns)]
    j = store.query(
        "SELECT job_id, kind, toString(toUnixTimestamp64Nano(time)) AS t, name, command, "
        "user, ranks, host, exit_code, cgroup FROM job_events FINAL ORDER BY kind DESC"
    )
    assert j == [
        {
            "job_id": "4242",
            "kind": "start",
            "t": str(T0 - 1),
            "name": "ior",
            "command": ["ior", "-w"],
            "user": "alice",
            "ranks": 4,
            "host": "cn001",
            "exit_code": 0,
            "cgroup": "pharos/job_4242",
        },
        {
            "job_id": "4242",
            "kind": "end",
            "t": str(T0 + 99),
            "name": "",
            "command": [],
            "user": "",
            "ranks": 0,
            "host": "cn001",
            "exit_code": 3,
            "cgroup": "",
        },
    ]
    ps = pipeline_stats(store)
    assert ps["records"] == 50 and ps["batches"] == 4 and ps["producers"] == 2
    assert ps["dead_letters"] == 0 and ps["missing_batches"] == 0 and ps["jobs"] == 1
    assert ps["ringbuf_drops"] == 7 and ps["unmerged_fallbacks"] == 3
    assert ps["bytes"] == sum(int(r["bytes"]) for r in got)

    # offsets were committed: the same group gets nothing more
    again = Pipeline(s, store)
    try:
        assert sum(again.process_once(1.0) for _ in range(3)) == 0
    finally:
        again.close()


def test_bad_messages_go_to_dead_letters(pipeline_settings, store):
    s = pipeline_settings
    good = [make_batch("p1", i, [make_record(10 * i + k) for k in range(5)]) for i in range(3)]
    garbage = bytes.fromhex("ffffffff0fdeadbeef") + os.urandom(32)  # field 0 / bad varint: never parses
    v2 = make_batch("p1", 99, [make_record(0)], schema_version=2).SerializeToString()
    wrong_type = make_batch("p2", 7, [make_record(1)]).SerializeToString()  # an IoBatch on the jobs topic
    with pytest.raises(InvalidMessage):
        decode_job_event(wrong_type)
    # records the store refuses (the whole poll falls back to checking batch by batch)
    count0 = make_batch("p3", 0, [make_record(0), make_record(1, count=0)]).SerializeToString()
    overflow = make_batch("p3", 1, [make_record(2, result=1 << 40, count=1 << 30)]).SerializeToString()
    # a batch whose header parses but one of whose records does not (the dispatcher does not
    # decode records: the store refuses the poll, the batch-by-batch check finds it)
    header = IoBatchHeader()
    header.ParseFromString(make_batch("p3", 2, [make_record(3), make_record(4)]).SerializeToString())
    header.records[1] = bytes.fromhex("ffffffff0f01")
    broken_record = header.SerializeToString()
    items = [
        (s.topic_requests, b"p1", good[0].SerializeToString()),
        (s.topic_requests, b"p1", garbage),
        (s.topic_requests, b"p1", good[1].SerializeToString()),
        (s.topic_requests, b"p1", v2),
        (s.topic_requests, b"p1", good[2].SerializeToString()),
        (s.topic_jobs, b"x", wrong_type),
        (s.topic_requests, b"p1", count0),
        (s.topic_requests, b"p1", overflow),
        (s.topic_requests, b"p1", broken_record),
    ]
    where = produce(s, items)
    bad = {
        1: "not an IoBatch",
        3: "unsupported schema_version 2",
        5: "JobEvent",
        6: "record 1: count 0",
        7: "record 0: bytes overflow",
        8: "not an IoBatch",
    }

    pipe = Pipeline(s, store)
    try:
        drain(pipe, lambda: pipe.stats()["messages"] == len(items))
        assert pipe.stats()["dead_letters"] == 6 and pipe.stats()["batches"] == 3
    finally:
        pipe.close()

    assert [
        (int(r["seq"]), r["n"])
        for r in store.query("SELECT seq, count() AS n FROM io_requests GROUP BY seq ORDER BY seq")
    ] == [(0, 5), (1, 5), (2, 5)]
    rows = store.query(
        "SELECT topic, partition, offset, error, size, payload_head FROM dead_letters ORDER BY topic, offset"
    )
    want = sorted(((items[i][0], *where[i], items[i][2], why) for i, why in bad.items()), key=lambda w: (w[0], w[2]))
    assert len(rows) == 6
    for r, (topic, part, off, value, why) in zip(rows, want, strict=True):
        assert (r["topic"], r["partition"], int(r["offset"]), r["size"]) == (topic, part, off, len(value))
        assert why in r["error"] and r["payload_head"] == value[:256].hex()
    assert pipeline_stats(store)["dead_letters"] == 6

    # the dead-letter topic holds the raw bytes, headers say why and where from
    c = Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": "dlq-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([s.topic_deadletter])
    got = []
    try:
        wait_for(
            lambda: len(got) >= 6,
            30,
            step=lambda: got.extend(m for m in c.consume(10, 0.5) if m.error() is None),
            what="6 dead letters on the topic",
        )
    finally:
        c.close()
    assert len(got) == 6
    got.sort(key=lambda m: (dict(m.headers())["source_topic"], int(dict(m.headers())["source_offset"])))
    for m, (topic, part, off, value, why) in zip(got, want, strict=True):
        h = {k: v.decode() for k, v in m.headers()}
        assert m.value() == value
        assert (h["source_topic"], int(h["source_partition"]), int(h["source_offset"])) == (topic, part, off)
        assert why in h["error"]

    # re-delivery of everything (a new group) stores nothing twice, dead letters included
    s2 = s.model_copy(update={"consumer_group": s.consumer_group + "-again"})
    pipe = Pipeline(s2, store)
    try:
        drain(pipe, lambda: pipe.stats()["messages"] == len(items))
        assert pipe.stats()["dead_letters"] == 0 and pipe.stats()["duplicates_skipped"] == 3
    finally:
        pipe.close()
    assert store.query("SELECT count() AS n FROM io_requests")[0]["n"] in (15, "15")
    assert store.query("SELECT count() AS n FROM dead_letters")[0]["n"] in (6, "6")


def test_duplicates_stored_once_and_gaps_counted(pipeline_settings, store):
    s = pipeline_settings
    b = {i: make_batch("dup", i, [make_record(100 * i + k) for k in range(4)]) for i in range(5)}
    seqs = [0, 0, 1, 3, 1, 4]  # 0 twice in a row, 1 re-delivered later, 2 lost
    produce(s, [(s.topic_requests, b"dup", b[i].SerializeToString()) for i in seqs])
    pipe = Pipeline(s, store, max_messages=2)  # the second copy of 1 comes in a later poll
    try:
        drain(pipe, lambda: pipe.stats()["messages"] == len(seqs))
        st = pipe.stats()
        assert st["batches"] == 4 and st["records"] == 16
        assert st["duplicates_skipped"] == 2 and st["gaps"] == 1
    finally:
        pipe.close()
    rows = store.query(
        "SELECT seq, record_index, count() AS n FROM io_requests GROUP BY seq, record_index ORDER BY seq, record_index"
    )
    assert [(int(r["seq"]), r["record_index"], int(r["n"])) for r in rows] == [
        (q, k, 1) for q in (0, 1, 3, 4) for k in range(4)
    ]
    assert pipeline_stats(store)["missing_batches"] == 1


def test_crash_between_record_insert_and_marker_is_repaired(pipeline_settings, store):
    """A run that stored a batch's records and died before io_batches: the re-delivered
    batch adds the io_batches and producer_drops rows, not the records again."""
    s = pipeline_settings
    b = make_batch(
        "half", 0, [make_record(k) for k in range(6)], drops=[io_pb2.DropCounters(job_id="4242", overflow_drops=2)]
    )
    store.insert_rows("io_requests", record_rows(b))  # what the crashed run left
    produce(s, [(s.topic_requests, b"half", b.SerializeToString())])
    pipe = Pipeline(s, store)
    try:
        drain(pipe, lambda: pipe.stats()["messages"] == 1)
        assert pipe.stats()["duplicates_skipped"] == 1 and pipe.stats()["records"] == 0
    finally:
        pipe.close()
    assert int(store.query("SELECT count() AS n FROM io_requests")[0]["n"]) == 6
    assert int(store.query("SELECT count() AS n FROM io_batches")[0]["n"]) == 1
    assert int(store.query("SELECT sum(overflow_drops) AS n FROM producer_drops")[0]["n"]) == 2


def test_polls_bounded_by_bytes_not_only_messages(pipeline_settings, store):
    # 40 batches of 100 records (~10 KiB each) and a 32 KiB poll bound: polls of a few messages
    # (the bound plus about one message), every record stored once over the polls
    s = pipeline_settings.model_copy(update={"pipeline_max_messages": 1000, "pipeline_max_poll_mb": 1 / 32})
    b = [make_batch("big", i, [make_record(1000 * i + k) for k in range(100)]) for i in range(40)]
    sizes = {len(x.SerializeToString()) for x in b}
    produce(s, [(s.topic_requests, b"big", x.SerializeToString()) for x in b])
    pipe = Pipeline(s, store)
    taken = []
    try:
        deadline = time.monotonic() + 60
        while sum(taken) < len(b) and time.monotonic() < deadline:
            n = pipe.process_once(1.0)
            if n:
                taken.append(n)
    finally:
        pipe.close()
    assert sum(taken) == len(b), taken
    most = (32 * 1024) // min(sizes) + 2  # the bound's messages, one over it, one of the mean's lag
    assert len(taken) >= 4 and max(taken) <= most, (taken, sizes)
    assert int(store.query("SELECT count() AS n FROM io_requests")[0]["n"]) == 4000


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_full_poll_takes_the_next_in_the_background_and_stores_each_batch_once(pipeline_settings, store, prefetch):
    """pipeline_prefetch: a poll that came back full has the next one taken (and its headers
    decoded) in the background thread while it is stored; the store steps stay in poll order, so
    a batch sent again in the next poll is still found stored (its marker is written before the
    next poll's check), every record is stored once and every offset committed."""
    import threading

    from pipeline_testkit import committed_total, lag

    s = pipeline_settings.model_copy(update={"pipeline_prefetch": prefetch, "pipeline_max_messages": 5})
    b = [make_batch("pf", i, [make_record(10 * i + k) for k in range(3)]) for i in range(30)]
    order = [*range(6), 4, *range(6, 30)]  # seq 4 again, in the poll after its own
    produce(s, [(s.topic_requests, b"pf", b[i].SerializeToString()) for i in order])
    pipe = Pipeline(s, store)
    threads: list[str] = []
    take = pipe._take

    def recording_take(consumer, wait, until=None):
        polled = take(consumer, wait, until)
        if polled.taken:
            threads.append(threading.current_thread().name)
        return polled

    pipe._take = recording_take
    try:
        drain(pipe, lambda: pipe.stats()["messages"] == len(order))
        st = pipe.stats()
        assert st["batches"] == 30 and st["records"] == 90 and st["duplicates_skipped"] == 1, st
        wait_for(lambda: lag(s, [s.topic_requests]) == 0, 30, what="every offset committed")
        assert committed_total(s, [s.topic_requests]) == len(order)
    finally:
        pipe.close()
    background = [t for t in threads if t.startswith("pharos-pipeline-poll")]
    if prefetch:
        assert background and len(background) < len(threads), threads
    else:
        assert not background, threads
    rows = store.query("SELECT seq, count() AS n FROM io_requests GROUP BY seq ORDER BY seq")
    assert [(int(r["seq"]), int(r["n"])) for r in rows] == [(i, 3) for i in range(30)]


def test_a_revocation_waits_for_the_poll_being_stored(tmp_path):
    """The consumer's on_revoke (called in the background poll's thread) returns only once the
    poll being stored is committed: the partitions' next owner starts after that commit."""
    import threading

    from pharos_core.settings import Settings

    pipe = Pipeline(Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1"), store=None)  # type: ignore[arg-type]
    done = threading.Event()
    with pipe._storing:
        t = threading.Thread(target=lambda: (pipe._revoked(None, []), done.set()))
        t.start()
        assert not done.wait(0.3)
    assert done.wait(5)
    t.join(5)


def test_a_rebalance_during_the_background_poll_lets_the_commit_through(pipeline_settings, store):
    """A member joins while a full poll is stored and the next one is taken in the background:
    the revocation comes in the background poll's consume() (20 of 30 batches stored, the
    other 10 do not fill the next poll, so it keeps consuming), which holds the consumer, and waits
    for the poll being stored to be committed; that commit is handed to it (ConsumerAccess) and
    run there, so the store goes on (confluent-kafka >= 2.16 serializes a Consumer's calls: a
    commit from the storing thread would otherwise wait for that consume() for ever). Every
    record is stored once."""
    import threading

    s = pipeline_settings.model_copy(update={"pipeline_prefetch": True, "pipeline_max_messages": 20})
    b = [make_batch("rb", i, [make_record(10 * i + k) for k in range(3)]) for i in range(30)]
    produce(s, [(s.topic_requests, b"rb", x.SerializeToString()) for x in b])
    pipe = Pipeline(s, store)
    revoked_in: list[str] = []
    revoked = pipe._revoked

    def recording_revoked(consumer, partitions):
        revoked_in.append(threading.current_thread().name)
        revoked(consumer, partitions)

    pipe._revoked = recording_revoked  # before the consumer subscribes with it
    stop = threading.Event()

    def other_member() -> None:  # joins the group, stores nothing, never commits
        c = Consumer(
            {"bootstrap.servers": s.kafka_bootstrap, "group.id": s.consumer_group, "enable.auto.commit": False}
        )
        c.subscribe(pipe.topics)
        while not stop.is_set():
            c.poll(0.2)
        c.close()

    other = threading.Thread(target=other_member, daemon=True)
    insert = pipe._insert_records

    def slow_store(new):
        if pipe._next is not None and not other.is_alive() and not stop.is_set():
            other.start()  # the group rebalances while this poll is stored, the next one taken
            deadline = time.monotonic() + 30
            while not revoked_in and time.monotonic() < deadline:
                time.sleep(0.1)
        return insert(new)

    pipe._insert_records = slow_store
    stores = threading.Thread(target=lambda: drain(pipe, other.is_alive), daemon=True)
    try:
        stores.start()
        stores.join(90)
        assert not stores.is_alive(), "the store of the poll did not finish: its commit never came through"
        assert any(n.startswith("pharos-pipeline-poll") for n in revoked_in), revoked_in
        stop.set()
        other.join(30)
        drain(pipe, lambda: pipe.stats()["records"] >= 90)
    finally:
        stop.set()
        pipe.close()
    rows = store.query("SELECT seq, count() AS n FROM io_requests GROUP BY seq ORDER BY seq")
    assert [(int(r["seq"]), int(r["n"])) for r in rows] == [(i, 3) for i in range(30)]


def test_markers_looked_up_only_at_or_below_the_last_marked_seq(pipeline_settings, store):
    """A batch above its producer's last marked seq is known new (no lookup); at a new assignment
    the last marked seq is asked of the store again, so markers another consumer wrote while it
    owned the partition are found and their batches skipped, not stored twice."""
    from pharos_pipeline.messages import batch_row
    from pharos_pipeline.stored import Q_STORED_BATCH_KEYS

    s = pipeline_settings
    b = [make_batch("hw", i, [make_record(10 * i + k) for k in range(2)]) for i in range(8)]
    lookups: list[int] = []
    query = store.query

    def counting_query(sql, params=None):
        if sql == Q_STORED_BATCH_KEYS:
            lookups.append(len(params["keys"]))
        return query(sql, params)

    store.query = counting_query
    pipe = Pipeline(s, store)
    try:
        produce(s, [(s.topic_requests, b"hw", b[i].SerializeToString()) for i in range(3)])
        drain(pipe, lambda: pipe.stats()["messages"] == 3)
        produce(
            s,
            [(s.topic_requests, b"hw", b[3].SerializeToString()), (s.topic_requests, b"hw", b[1].SerializeToString())],
        )
        drain(pipe, lambda: pipe.stats()["messages"] == 5)
        assert lookups == [1], lookups  # only the copy of seq 1 (at or below 2) was looked up
        assert pipe.stats()["duplicates_skipped"] == 1
        # another consumer owned the partition meanwhile and stored seqs 4 and 5 with their markers
        for i in (4, 5):
            store.insert_rows("io_requests", record_rows(b[i]))
            store.insert_rows("io_batches", [batch_row(b[i])])
        pipe._assigned(None, [])
        produce(s, [(s.topic_requests, b"hw", b[i].SerializeToString()) for i in (4, 5, 6, 7)])
        drain(pipe, lambda: pipe.stats()["messages"] == 9)
        assert pipe.stats()["duplicates_skipped"] == 3, pipe.stats()
        assert lookups[-1] == 2, lookups  # 4 and 5 (at or below the store's 5), not 6 or 7
    finally:
        pipe.close()
    rows = store.query("SELECT seq, count() AS n FROM io_requests GROUP BY seq ORDER BY seq")
    assert [(int(r["seq"]), int(r["n"])) for r in rows] == [(i, 2) for i in range(8)]


def test_a_poll_keeps_only_the_partitions_still_owned_after_a_rebalance(tmp_path):
    """Pure logic (a stand-in consumer): a rebalance during a poll's consume() calls leaves out
    the messages of partitions now owned by another member (they are not stored nor committed
    here); without a rebalance every message is kept."""
    from types import SimpleNamespace

    from pharos_core.settings import Settings

    s = Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1", pipeline_max_messages=10)
    b = make_batch("rb", 0, [make_record(0)]).SerializeToString()

    class Msg:
        def __init__(self, part: int, off: int) -> None:
            self.part, self.off = part, off

        def error(self):
            return None

        def topic(self):
            return s.topic_requests

        def partition(self):
            return self.part

        def offset(self):
            return self.off

        def key(self):
            return b"rb"

        def value(self):
            return b

        def __len__(self) -> int:
            return len(b)

    class Consumer:
        def __init__(self, pipe, rebalance: bool) -> None:
            self.pipe, self.rebalance, self.calls = pipe, rebalance, 0

        def consume(self, num_messages, timeout):
            self.calls += 1
            if self.calls == 1:
                return [Msg(0, 5), Msg(1, 7)]
            if self.rebalance and self.calls == 2:
                self.pipe._assigned(self, [])  # partition 1 went to another member
            return []

        def assignment(self):
            return [SimpleNamespace(topic=s.topic_requests, partition=0)]

    for rebalance, kept in ((False, {0: 6, 1: 8}), (True, {0: 6})):
        pipe = Pipeline(s, store=None)  # type: ignore[arg-type]
        pipe._mean_message_bytes = len(b)
        pipe.max_poll_bytes = 2 * len(b) + 1  # a first chunk of 2 messages, then a second consume() call
        polled = pipe._take(Consumer(pipe, rebalance), 0.5)
        assert {p: o for (_t, p), o in polled.offsets.items()} == kept
        assert len(polled.batches) == len(kept)


def test_a_poll_that_ends_with_messages_still_queued_says_more_is_waiting():
    """take_messages's third value: a poll that ended with its last chunk full (messages still
    queued: a backlog) or at its limits says more is waiting, so the pipeline takes the next poll
    in the background; one whose last chunk came back short does not. A background poll handed
    over before it filled says so with a full chunk still there, or holding a quarter of its
    limits (HANDED_OVER_BACKLOG)."""
    import threading

    from pharos_pipeline.polls import ConsumerAccess, take_messages

    class Consumer:
        def __init__(self, chunks) -> None:
            self.chunks = list(chunks)

        def consume(self, num_messages, timeout):
            n = self.chunks.pop(0) if self.chunks else 0
            if n == "all":
                return [b"xx"] * num_messages
            if not n:
                time.sleep(timeout)
            return [b"xx"] * n

    assert take_messages(Consumer(["all", "all", 3]), 1.0, 10_000, 1 << 20, 1.0)[2] is False  # short: the wait is over
    assert take_messages(Consumer(["all"] * 5), 1.0, 100, 1 << 20, 2.0)[1:] == (2.0, True)  # 100 messages: full
    msgs, _, more = take_messages(Consumer(["all"] * 50), 0.0, 10_000, 1 << 20, 1.0)  # past its wait, chunk full
    assert 1 <= len(msgs) < 10_000 and more
    until = threading.Event()
    until.set()  # wanted at once: ends after one chunk, which was full
    msgs, _, more = take_messages(Consumer(["all"] * 50), 0.0, 10_000, 1 << 20, 1.0, until, ConsumerAccess())
    assert len(msgs) == 1000 and more
    for held, backlog in ((499, False), (500, True)):  # a quarter of its 4,000 bytes (2 a message): a backlog
        msgs, _, more = take_messages(Consumer([held]), 0.0, 10_000, 4_000, 2.0, until, ConsumerAccess())
        assert len(msgs) == held and more is backlog


def test_a_background_poll_fills_past_the_wait_until_it_is_wanted():
    """take_messages with ``until``: not cut by ``wait`` (nor by a short chunk) while the poll is
    not full and not wanted; once ``until`` is set it ends as a foreground poll does. Without
    ``until`` the first short chunk ends it. Through ConsumerAccess, a call another thread hands
    over meanwhile is run by the consuming thread."""
    import threading

    from pharos_pipeline.polls import ConsumerAccess, take_messages

    class Consumer:
        def __init__(self) -> None:
            self.calls, self.ran_in = 0, []

        def consume(self, num_messages, timeout):
            self.calls += 1
            if self.calls in (1, 3, 5):
                return [b"x" * 10]
            time.sleep(timeout)
            return []

        def commit(self):
            self.ran_in.append(threading.current_thread().name)

    c = Consumer()
    msgs, _, more = take_messages(c, 0.05, 100, 1 << 20, 10.0)
    assert len(msgs) == 1 and c.calls == 1 and not more  # its first chunk came back short: that ended it

    c, until, access = Consumer(), threading.Event(), ConsumerAccess()
    out: list = []
    t0 = time.monotonic()
    bg = threading.Thread(
        target=lambda: out.append(take_messages(c, 0.05, 100, 1 << 20, 10.0, until, access)), name="bg"
    )
    bg.start()
    time.sleep(0.3)
    access.call(c.commit)  # handed to the thread in consume()
    assert c.ran_in == ["bg"]
    until.set()
    bg.join(5)
    msgs, _, more = out[0]
    assert len(msgs) == 3 and not more and time.monotonic() - t0 >= 0.3  # past its 0.05 s wait, every chunk taken
    assert c.calls > 5
    access.call(c.commit)  # nobody consumes now: run here
    assert c.ran_in == ["bg", threading.current_thread().name]
