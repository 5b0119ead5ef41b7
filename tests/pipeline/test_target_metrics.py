"""Target (OST) metrics from the forwarding layer through the real broker into chDB."""

from __future__ import annotations

from pipeline_testkit import produce, wait_for

from pharos_core.settings import REPO_ROOT
from pharos_pipeline.ingest import Pipeline
from pharos_pipeline.wire import TargetMetricsBatch

VECTOR = REPO_ROOT / "proto" / "vectors" / "metrics_basic.binpb"

Q = """
SELECT target, forwarding_node, toUnixTimestamp64Nano(time) AS time_ns, bytes_written, write_ops,
       latency_p99_ns, queue_depth, throttled, max_perf_mb_s, slowdown, added_latency_ns, service_ns_sum, seq
FROM target_metrics FINAL ORDER BY target
"""


def test_target_metrics_stored_once(pipeline_settings, store):
    s = pipeline_settings
    raw = VECTOR.read_bytes()
    b = TargetMetricsBatch()
    b.ParseFromString(raw)
    # the same batch twice (a re-delivery) and one garbage message between them
    produce(
        s,
        [
            (s.topic_target_metrics, b"k", raw),
            (s.topic_target_metrics, b"k", b"\xff\x00junk"),
            (s.topic_target_metrics, b"k", raw),
        ],
    )
    pipe = Pipeline(s, store)
    try:
        wait_for(lambda: pipe.stats()["messages"] == 3, 60, step=lambda: pipe.process_once(0.2), what="the pipeline")
        assert pipe.stats()["dead_letters"] == 1
    finally:
        pipe.close()
    rows = store.query(Q)
    assert [r["target"] for r in rows] == ["ost0", "ost3"]
    ost3 = rows[1]
    m = b.metrics[0]
    assert (ost3["forwarding_node"], int(ost3["time_ns"]), ost3["bytes_written"], ost3["write_ops"]) == (
        "fwd0",
        m.time_ns,
        m.bytes_written,
        m.write_ops,
    )
    assert (ost3["latency_p99_ns"], ost3["queue_depth"], ost3["throttled"]) == (9_000_000, 7, 1)
    assert (ost3["max_perf_mb_s"], ost3["slowdown"], ost3["added_latency_ns"], ost3["seq"]) == (50.0, 4.0, 1_000_000, 3)
    assert ost3["service_ns_sum"] == 95_000_000
