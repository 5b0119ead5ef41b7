"""The pipeline's Prometheus families (pharos_core.telemetry.PipelineCollector) against the
real Kafka broker and chDB: per topic, they count what :meth:`Pipeline.stats` counts (one counting
path), and the consumer lag per partition is the broker's high watermark minus the group's
committed offset, as an independent consumer reads them."""

from __future__ import annotations

from pipeline_testkit import T0, lag, make_batch, make_record, produce, wait_for
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pharos_core.telemetry import service_registry
from pharos_pipeline.ingest import Pipeline
from pharos_pipeline.wire import io_pb2


def exported(pipe: Pipeline) -> dict[str, dict[tuple, float]]:
    """{sample name: {label values: value}} of the pipeline families, through the text format."""
    text = generate_latest(service_registry(lambda: pipe)).decode()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("pharos_pipeline_"):
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_per_topic_counters_and_consumer_lag(pipeline_settings, store):
    s = pipeline_settings
    batch = {seq: make_batch("p1", seq, [make_record(2 * seq), make_record(2 * seq + 1)]) for seq in (0, 1, 2, 4, 5)}
    ev = io_pb2.JobEvent(schema_version=1, job_id="j1", kind=io_pb2.JobEvent.KIND_START, time_ns=T0, host="h")
    end = io_pb2.JobEvent(schema_version=1, job_id="j1", kind=io_pb2.JobEvent.KIND_END, time_ns=T0 + 1, host="h")
    items = [(s.topic_requests, b"p1", batch[q].SerializeToString()) for q in (0, 1, 2)]
    items += [
        (s.topic_requests, b"p1", batch[1].SerializeToString()),  # a duplicate
        (s.topic_requests, b"p1", b"\xffnot protobuf"),  # a dead letter
        (s.topic_requests, b"p1", batch[4].SerializeToString()),  # seq 3 is missing: a gap
        (s.topic_requests, b"p1", batch[5].SerializeToString()),
        (s.topic_jobs, b"j1", ev.SerializeToString()),
        (s.topic_jobs, b"j1", end.SerializeToString()),
        (s.topic_jobs, b"j1", b"\x00\x01junk"),
    ]
    produce(s, items)
    topics = [s.topic_requests, s.topic_jobs, s.topic_target_metrics]

    pipe = Pipeline(s, store, max_messages=3)
    pipe.lag_every_s = 0
    try:
        wait_for(lambda: pipe.process_once(0.5) > 0, 60, what="the first poll")
        m = exported(pipe)
        assert sum(m["pharos_pipeline_consumer_lag"].values()) == lag(s, topics) == pipe.stats()["consumer_lag"] > 0
        assert {dict(k)["topic"] for k in m["pharos_pipeline_consumer_lag"]} == set(topics)
        wait_for(lambda: pipe.stats()["messages"] == len(items), 60, step=lambda: pipe.process_once(0.2))
        pipe.process_once(0.2)  # one more poll measures the lag after the last commit
        st = pipe.stats()
        m = exported(pipe)
    finally:
        pipe.close()

    def per_topic(name: str) -> dict[str, float]:
        return {dict(k)["topic"]: v for k, v in m[name].items()}

    req, jobs, tm = s.topic_requests, s.topic_jobs, s.topic_target_metrics
    assert per_topic("pharos_pipeline_messages_total") == {req: 7, jobs: 3, tm: 0}
    assert per_topic("pharos_pipeline_records_stored_total") == {req: 10, jobs: 2, tm: 0}
    assert per_topic("pharos_pipeline_duplicate_batches_total") == {req: 1, jobs: 0, tm: 0}
    assert per_topic("pharos_pipeline_dead_letters_total") == {req: 1, jobs: 1, tm: 0}
    assert per_topic("pharos_pipeline_missing_batches_total") == {req: 1, jobs: 0, tm: 0}
    # the same counters as Pipeline.stats() (GET /v1/pipeline's "live", pharos status)
    assert (st["messages"], st["records"], st["job_events"]) == (10, 10, 2)
    assert (st["duplicates_skipped"], st["dead_letters"], st["gaps"]) == (1, 2, 1)
    assert m["pharos_pipeline_poll_errors_total"] == {(): 0}
    assert set(m["pharos_pipeline_consumer_lag"].values()) == {0} and lag(s, topics) == 0
    assert m["pharos_pipeline_last_commit_timestamp_seconds"][()] == st["last_commit_time"]
