"""Helpers of the pipeline tests: wire messages with known field values, a real Kafka
producer, waits with deadlines, and the io_requests columns read back exactly."""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from pharos_core.settings import Settings
from pharos_pipeline.wire import io_pb2

# ns since the epoch, an hour ago: io_requests has a 90-day TTL, so older rows would be
# dropped by ClickHouse right after the insert.
T0 = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000 + 123_456_789


def make_record(i: int, *, job: str = "4242", base_ns: int = T0, **over) -> io_pb2.IoRecord:
    """A client-layer pwrite record whose fields all depend on ``i`` (ns-exact times)."""
    fields = dict(
        start_ns=base_ns + i * 1_000_003,
        duration_ns=1_000 + i,
        end_ns=base_ns + i * 1_000_003 + 999_999,
        layer=io_pb2.LAYER_CLIENT,
        host="cn001",
        job_id=job,
        rank=i % 4,
        pid=1000 + i % 3,
        tid=2000 + i,
        comm="ior",
        op=io_pb2.OP_PWRITE,
        dev=0x800001,
        inode=10_000 + i,
        path=f"/scratch/run/out.{i % 4}",
        file_type=io_pb2.FILE_TYPE_REGULAR,
        fd=3 + i % 5,
        offset=i * 4096 * 8,
        size=4096,
        result=4096,
        count=1 + i % 8,
    )
    fields.update(over)
    return io_pb2.IoRecord(**fields)


def make_batch(
    producer: str,
    seq: int,
    records: list[io_pb2.IoRecord],
    *,
    drops=(),
    host: str = "cn001",
    created_ns: int | None = None,
    schema_version: int = 1,
) -> io_pb2.IoBatch:
    return io_pb2.IoBatch(
        schema_version=schema_version,
        producer_id=producer,
        seq=seq,
        created_ns=created_ns if created_ns is not None else T0 + 10_000_000_000 + seq,
        host=host,
        records=records,
        drops=list(drops),
    )


def producer(settings: Settings) -> Producer:
    return Producer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.max.bytes": 4_000_000,
        }
    )


def produce(settings: Settings, items: list[tuple[str, bytes | None, bytes]]) -> list[tuple[int, int]]:
    """Produce (topic, key, value) in order, wait for delivery; returns (partition, offset) each."""
    p = producer(settings)
    out: list[tuple[int, int] | None] = [None] * len(items)

    def cb(i):
        def done(err, msg):
            assert err is None, err
            out[i] = (msg.partition(), msg.offset())

        return done

    for i, (topic, key, value) in enumerate(items):
        p.produce(topic, key=key, value=value, on_delivery=cb(i))
        p.poll(0)
    assert p.flush(30) == 0
    return out  # type: ignore[return-value]


def wait_for(
    cond: Callable[[], bool], timeout: float, step: Callable[[], object] | None = None, what: str = "condition"
) -> None:
    """Call ``step`` (or sleep) until ``cond()`` holds; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        if step is not None:
            step()
        else:
            time.sleep(0.2)


def _retry(fn, timeout: float = 30):
    """Run fn(), retrying transient broker errors (e.g. NOT_COORDINATOR while the group
    coordinator loads) for up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def committed_total(settings: Settings, topics: list[str]) -> int:
    """Offsets committed by ``settings.consumer_group`` summed over the topics' partitions."""
    return sum(max(o, 0) for o in _positions(settings, topics)[0].values())


def lag(settings: Settings, topics: list[str]) -> int:
    """Messages of ``topics`` not yet committed by ``settings.consumer_group`` (real broker)."""
    committed, high = _positions(settings, topics)
    return sum(high[k] - max(committed[k], 0) for k in high)


def _positions(settings: Settings, topics: list[str]):
    c = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": settings.consumer_group,
            "enable.auto.commit": False,
        }
    )
    try:

        def read():
            md = c.list_topics(timeout=10)
            tps = [TopicPartition(t, p) for t in topics for p in md.topics[t].partitions]
            committed = {(tp.topic, tp.partition): tp.offset for tp in c.committed(tps, timeout=10)}
            high = {(tp.topic, tp.partition): c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
            return committed, high

        return _retry(read)
    finally:
        c.close()


#: io_requests read back with exact integers (times as ns since the epoch).
Q_RECORDS = """
SELECT producer_id, seq, record_index,
       toString(toUnixTimestamp64Nano(start)) AS start_ns, toString(toUnixTimestamp64Nano(end)) AS end_ns,
       toString(duration_ns) AS duration_ns, layer, host, job_id, rank, pid, tid, comm, op, file_type,
       toString(dev) AS dev, toString(inode) AS inode, path, fd, toString(offset) AS offset,
       toString(size) AS size, toString(result) AS result, count, toString(bytes) AS bytes,
       compute_node, forwarding_node, target, toString(object_id) AS object_id,
       toString(queue_wait_ns) AS queue_wait_ns
FROM io_requests ORDER BY producer_id, seq, record_index
"""

LAYER = {1: "client", 2: "forwarder", 3: "storage"}


def expected_row(b: io_pb2.IoBatch, i: int) -> dict:
    """What Q_RECORDS must return for record ``i`` of batch ``b`` (independent of ingest.py)."""
    r = b.records[i]
    return {
        "producer_id": b.producer_id,
        "seq": b.seq,
        "record_index": i,
        "start_ns": str(r.start_ns),
        "end_ns": str(r.end_ns),
        "duration_ns": str(r.duration_ns),
        "layer": LAYER[r.layer],
        "host": r.host or b.host,
        "job_id": r.job_id,
        "rank": r.rank,
        "pid": r.pid,
        "tid": r.tid,
        "comm": r.comm,
        "op": io_pb2.Op.Name(r.op).removeprefix("OP_").lower(),
        "file_type": "" if r.file_type == 0 else io_pb2.FileType.Name(r.file_type).removeprefix("FILE_TYPE_").lower(),
        "dev": str(r.dev),
        "inode": str(r.inode),
        "path": r.path,
        "fd": r.fd,
        "offset": str(r.offset),
        "size": str(r.size),
        "result": str(r.result),
        "count": r.count,
        "bytes": str(max(r.result, 0) * r.count),
        "compute_node": r.compute_node,
        "forwarding_node": r.forwarding_node,
        "target": r.target,
        "object_id": str(r.object_id),
        "queue_wait_ns": str(r.queue_wait_ns),
    }
