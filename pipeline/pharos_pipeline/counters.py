"""The counters of :class:`pharos_pipeline.ingest.Pipeline`: per topic and per poll, what it took,
stored, skipped and lost since it started (behind ``Pipeline.stats``, ``GET /v1/pipeline``,
``pharos status`` and the Prometheus metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TopicCounters:
    """What the pipeline did with one topic's messages since it started (the one count behind
    :meth:`~pharos_pipeline.ingest.Pipeline.stats`, ``GET /v1/pipeline`` and the Prometheus metrics)."""

    messages: int = 0  # Kafka messages taken (and committed)
    stored: int = 0  # rows written: io_requests, job_events or target_metrics
    batches: int = 0  # new IoBatches stored (io requests)
    duplicates: int = 0  # batches skipped: already stored, or repeated within a poll
    dead_letters: int = 0  # messages sent to the dead-letter topic
    gaps: int = 0  # batches missing by seq (lost between the producer and the pipeline)


@dataclass
class Counters:
    """The pipeline's counters (one :class:`TopicCounters` per topic), under its stats lock."""

    topics: dict[str, TopicCounters] = field(default_factory=dict)
    polls: int = 0
    commits: int = 0
    errors: int = 0
    last_commit_time: float | None = None
    last_seq: dict[str, int] = field(default_factory=dict)
    #: (topic, partition) -> messages not yet committed (high watermark - committed offset)
    lag: dict[tuple[str, int], int] = field(default_factory=dict)

    def topic(self, name: str) -> TopicCounters:
        t = self.topics.get(name)
        if t is None:
            t = self.topics[name] = TopicCounters()
        return t
