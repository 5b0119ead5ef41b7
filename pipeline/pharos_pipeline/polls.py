"""The Kafka side of one pipeline poll (:class:`pharos_pipeline.ingest.Pipeline`): the messages
taken in chunks until the poll's bounds (messages, bytes, wait), then sorted by topic and decoded:
``pharos.io.requests`` to their batch headers (the records are decoded by the store,
:mod:`pharos_pipeline.columnar`), job events, target metrics; what does not decode is kept
aside for the dead letters. No store access here: these run in the pipeline's background poll
thread too."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from pharos_core.settings import Settings

from .messages import InvalidMessage, decode_batch_header, decode_job_event, decode_target_metrics
from .wire import IoBatchHeader, JobEvent, TargetMetricsBatch

log = logging.getLogger("pharos_pipeline.ingest")

#: Messages asked of librdkafka per ``consume()`` call within one poll (:func:`take_messages`).
CONSUME_CHUNK = 1000


@dataclass
class Bad:
    """A message that does not decode: where it came from, its bytes and why."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    error: str


@dataclass
class Batch:
    """A ``pharos.io.requests`` message: where it came from, its bytes and its parsed batch."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    batch: IoBatchHeader


@dataclass
class Polled:
    """One poll's messages, sorted and decoded (:func:`decode_poll`). ``full``: the poll hit
    its message or byte limit (more is likely waiting)."""

    full: bool
    batches: list[Batch] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)
    metrics: list[TargetMetricsBatch] = field(default_factory=list)
    bad: list[Bad] = field(default_factory=list)
    #: (topic, partition) -> the offset to commit (the last message's + 1)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    #: topic -> messages taken
    taken: dict[str, int] = field(default_factory=dict)


def take_messages(consumer, wait: float, max_messages: int, max_bytes: int, mean_bytes: float) -> tuple[list, float]:
    """The messages of one poll and the running mean message size (bytes) after it: taken in
    chunks until the poll holds ``max_messages`` messages or ``max_bytes`` bytes, or ``wait``
    seconds passed (a chunk that comes back short means the wait is over). A chunk is at most
    :data:`CONSUME_CHUNK` messages and what the bytes left allow at ``mean_bytes``, so a poll
    overshoots its bytes by about one message. Raises KafkaException."""
    deadline = time.monotonic() + wait
    msgs: list = []
    size = 0
    while True:
        fit = (max_bytes - size) // max(1, int(mean_bytes))
        want = max(1, min(CONSUME_CHUNK, max_messages - len(msgs), fit))
        got = consumer.consume(num_messages=want, timeout=max(deadline - time.monotonic(), 0.0))
        if got:
            got_bytes = sum(len(m) for m in got)
            mean_bytes += (got_bytes / len(got) - mean_bytes) * min(1.0, len(got) / 64)
            msgs += got
            size += got_bytes
        if len(got) < want or len(msgs) >= max_messages or size >= max_bytes or time.monotonic() >= deadline:
            return msgs, mean_bytes


def still_owned(consumer, msgs: list) -> list:
    """``msgs`` without those of partitions ``consumer`` is no longer assigned (after a
    rebalance during the poll: their new owner starts from the committed offset, and storing them
    here too would race it; a partition assigned again is fetched again from there)."""
    owned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
    return [m for m in msgs if m.error() is not None or (m.topic(), m.partition()) in owned]


def decode_poll(msgs: list, settings: Settings, full: bool) -> Polled:
    """A poll's messages sorted by topic and decoded (headers of IoBatches; job events; target
    metrics), their offsets to commit and counts; what does not decode goes to ``bad``. Raises
    KafkaException (a fatal consumer error)."""
    from confluent_kafka import KafkaError, KafkaException

    out = Polled(full=full)
    for m in msgs:
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            if err.fatal():
                raise KafkaException(err)
            log.warning("consumer: %s", err)
            continue
        topic, part, off = m.topic(), m.partition(), m.offset()
        out.taken[topic] = out.taken.get(topic, 0) + 1
        out.offsets[(topic, part)] = max(out.offsets.get((topic, part), -1), off + 1)
        try:
            if topic == settings.topic_requests:
                out.batches.append(Batch(topic, part, off, m.key(), m.value(), decode_batch_header(m.value())))
            elif topic == settings.topic_jobs:
                out.events.append(decode_job_event(m.value()))
            elif topic == settings.topic_target_metrics:
                out.metrics.append(decode_target_metrics(m.value()))
            else:  # not subscribed; cannot happen
                raise InvalidMessage(f"unexpected topic {topic}")
        except InvalidMessage as exc:
            out.bad.append(Bad(topic, part, off, m.key(), m.value() or b"", str(exc)))
    return out
