"""Per-request forwarder records and per-target metrics land in the real Kafka broker.

fio writes through the mount as job "fj42" (in its job cgroup); the daemon ships one
IoRecord per request (layer = LAYER_FORWARDER) through the shared bounded sink. The
PWRITE records of the job must add up to exactly the bytes fio wrote, carry the
forwarding node, compute node, target and object id, and no loss may be reported.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from forwarder_testkit import consume, fio, wait_records_sent

from pharos_pipeline.wire import IoBatch, TargetMetricsBatch, io_pb2

JOB = "fj42"


@pytest.mark.timeout(300)
def test_forwarder_records_in_kafka_match_fio_bytes(cluster, kafka_settings):
    s = kafka_settings
    d = cluster.start_daemon(
        "fwd0",
        "--topic",
        s.topic_requests,
        "--metrics-topic",
        s.topic_target_metrics,
        "--metrics-interval-ms",
        "500",
        kafka=s.kafka_bootstrap,
    )
    m = cluster.start_mount([d], 0)
    out = fio(
        "--name=k",
        f"--directory={m.path}",
        "--rw=randwrite",
        "--bs=64k",
        "--numjobs=2",
        "--size=16M",
        "--ioengine=psync",
        "--group_reporting",
        job=JOB,
        timeout=120,
    )
    fio_bytes = out["jobs"][0]["write"]["io_bytes"]
    assert fio_bytes == 2 * (16 << 20)
    # Every produced record is eventually acknowledged by Kafka.
    produced = wait_records_sent(d)

    def fwd_write_bytes(batches) -> int:
        return sum(
            max(r.result, 0) * r.count
            for _, b in batches
            for r in b.records
            if r.job_id == JOB and r.op == io_pb2.OP_PWRITE
        )

    batches = consume(
        s.kafka_bootstrap,
        s.topic_requests,
        IoBatch.FromString,
        until=lambda got: sum(len(b.records) for _, b in got) >= produced,
    )
    recs = [r for _, b in batches for r in b.records]
    assert len(recs) == produced
    assert fwd_write_bytes(batches) == fio_bytes
    writes = [r for r in recs if r.op == io_pb2.OP_PWRITE]
    assert writes and all(r.layer == io_pb2.LAYER_FORWARDER for r in recs)
    w = writes[0]
    assert (w.forwarding_node, w.compute_node, w.job_id, w.count, w.rank) == ("fwd0", "cn0", JOB, 1, -1)
    assert w.target.startswith("ost") and w.object_id != 0 and w.size == 65536 and w.result == 65536
    assert w.start_ns > 0 and w.end_ns >= w.start_ns + w.duration_ns
    assert w.path.startswith("/k.")
    assert {r.op for r in recs} >= {io_pb2.OP_OPEN, io_pb2.OP_CLOSE, io_pb2.OP_PWRITE}
    # Batches are keyed by producer id with rising seq, and report no loss.
    keys = {k for k, _ in batches}
    assert len(keys) == 1
    seqs = sorted(b.seq for _, b in batches)
    assert seqs == list(range(len(seqs)))
    assert all(not b.drops for _, b in batches)

    # Target metrics: per-interval TargetMetricsBatch, bytes written add up too.
    time.sleep(1.2)
    mb = consume(
        s.kafka_bootstrap,
        s.topic_target_metrics,
        TargetMetricsBatch.FromString,
        until=lambda got: sum(t.bytes_written for _, b in got for t in b.metrics) >= fio_bytes,
        timeout=30,
    )
    per_target = Counter()
    for _, b in mb:
        assert b.schema_version == 1 and len(b.metrics) == cluster.n_targets
        for t in b.metrics:
            per_target[t.target] += t.bytes_written
            assert t.forwarding_node == "fwd0" and t.interval_ms == 500
    assert sum(per_target.values()) == fio_bytes
    assert sorted(b.seq for _, b in mb) == list(range(len(mb)))
