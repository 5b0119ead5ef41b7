"""Pharos's own Prometheus metrics (self-monitoring, docs/dashboards.md "Self-monitoring").

The process-wide families live in prometheus_client's default registry, next to its process
and platform collectors: a store's insert latency (:data:`INSERT_SECONDS`, observed by
:meth:`pharos_core.store.Store.insert_rows`), the periodic loops' cycle time and failures
(:data:`CYCLE_SECONDS`, :data:`CYCLE_FAILURES`, :class:`pharos_analytics.periodic.PeriodicLoop`),
the API's request latency (:data:`API_REQUEST_SECONDS`, pharos_api.metrics) and the build
(:data:`BUILD_INFO`). The pipeline's counters are not duplicated here: :class:`PipelineCollector`
reads :meth:`pharos_pipeline.ingest.Pipeline.topic_stats` (the counters behind ``pharos status``
and ``GET /v1/pipeline``) when Prometheus scrapes.

:func:`exposition` renders a registry in the text format (``GET /metrics`` of ``pharos serve``).
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, Info, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

# No ``*_created`` series beside every counter and histogram child: Prometheus 2 ingests them as
# series of their own (one more per route and status), and rate() does not need them.
disable_created_metrics()

#: Seconds buckets of store inserts and loop cycles: chDB inserts take ms, a detection cycle
#: on a busy store seconds.
SLOW_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

INSERT_SECONDS = Histogram(
    "pharos_store_insert_seconds",
    "Time of one INSERT into the store (chDB or a ClickHouse server), by table.",
    ["table"],
    buckets=SLOW_BUCKETS,
)
CYCLE_SECONDS = Histogram(
    "pharos_loop_cycle_seconds",
    "Time of one completed cycle of a periodic loop of pharos serve (detection, control).",
    ["loop"],
    buckets=SLOW_BUCKETS,
)
CYCLE_FAILURES = Counter(
    "pharos_loop_cycle_failures",
    "Cycles of a periodic loop that raised (logged; the loop goes on).",
    ["loop"],
)
API_REQUEST_SECONDS = Histogram(
    "pharos_api_request_duration_seconds",
    "Time from a request's arrival to the end of its response, by method, route template and status.",
    ["method", "route", "status"],
)
BUILD_INFO = Info("pharos_build", "The running Pharos: package version and Python.")


def _version() -> str:
    try:
        return version("pharos")
    except PackageNotFoundError:
        return "unknown"


BUILD_INFO.info({"version": _version(), "python": platform.python_version(), "service": "server"})


class PipelineCollector:
    """The pipeline's counters as Prometheus families, read at scrape time from ``source()``
    (a :class:`~pharos_pipeline.ingest.Pipeline`, or None when this process runs none: then
    nothing is exported)."""

    def __init__(self, source) -> None:
        self._source = source

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families appear only once a pipeline runs

    def collect(self) -> Iterator[Metric]:
        pipe = self._source()
        if pipe is None:
            return
        topics, lag = pipe.topic_stats()
        st = pipe.stats()
        fams = {
            "messages": ("pharos_pipeline_messages", "Kafka messages the pipeline took and committed, by topic."),
            "stored": (
                "pharos_pipeline_records_stored",
                "Rows the pipeline wrote (io_requests, job_events, target_metrics), by source topic.",
            ),
            "duplicates": (
                "pharos_pipeline_duplicate_batches",
                "Batches skipped because they were stored already or repeated within a poll, by topic.",
            ),
            "dead_letters": (
                "pharos_pipeline_dead_letters",
                "Messages that did not decode, sent to the dead-letter topic and table, by source topic.",
            ),
            "gaps": (
                "pharos_pipeline_missing_batches",
                "Batches missing by producer seq (lost between a producer and the pipeline), by topic.",
            ),
        }
        for attr, (name, doc) in fams.items():
            fam = CounterMetricFamily(name, doc, labels=["topic"])
            for topic, c in sorted(topics.items()):
                fam.add_metric([topic], getattr(c, attr))
            yield fam
        errors = CounterMetricFamily(
            "pharos_pipeline_poll_errors", "Polls that failed on the store or Kafka and were retried."
        )
        errors.add_metric([], st["errors"])
        yield errors
        lag_fam = GaugeMetricFamily(
            "pharos_pipeline_consumer_lag",
            "Messages of a partition not yet committed by the consumer group: high watermark minus committed offset.",
            labels=["topic", "partition"],
        )
        for (topic, part), n in sorted(lag.items()):
            lag_fam.add_metric([topic, str(part)], n)
        yield lag_fam
        if st["last_commit_time"] is not None:
            yield GaugeMetricFamily(
                "pharos_pipeline_last_commit_timestamp_seconds",
                "Unix time of the pipeline's last offset commit.",
                value=st["last_commit_time"],
            )


class _DefaultRegistry:
    """prometheus_client's default registry as one collector of another registry."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def service_registry(pipeline_source) -> CollectorRegistry:
    """A registry of the process-wide families plus the pipeline that ``pipeline_source()``
    returns (see :class:`PipelineCollector`)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_DefaultRegistry())
    reg.register(PipelineCollector(pipeline_source))
    return reg


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """(body, content type) of ``registry`` in the Prometheus text format 0.0.4 (every Pharos
    name is a classic one, so the text is the same as 1.0.0's; Prometheus 2.42 knows 0.0.4)."""
    return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4
