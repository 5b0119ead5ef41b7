"""The Kafka side of one pipeline poll (:class:`pharos_pipeline.ingest.Pipeline`): the messages
taken in chunks until the poll's bounds (messages, bytes, wait), then sorted by topic and decoded:
``pharos.io.requests`` to their batch headers (the records are decoded by the store,
:mod:`pharos_pipeline.columnar`), job events, target metrics; what does not decode is kept
aside for the dead letters. No store access here: these run in the pipeline's background poll
thread too."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from pharos_core.settings import Settings

from .messages import InvalidMessage, batch_row_json, decode_batch_header, decode_job_event, decode_target_metrics
from .wire import IoBatchHeader, JobEvent, TargetMetricsBatch

log = logging.getLogger("pharos_pipeline.ingest")

#: Messages asked of librdkafka per ``consume()`` call within one poll (:func:`take_messages`).
CONSUME_CHUNK = 1000
#: How often a background poll (:func:`take_messages` with ``until``) looks whether it is wanted, s.
HANDOFF_CHECK_S = 0.02
#: A background poll handed over holding at least this share of its message or byte limit says more
#: is waiting: a backlog the fetch beside the insert could not keep up with (on the ingest bench,
#: 20-47 MiB of 64 handed over), where a topic at a steady rate below the pipeline's fills a poll
#: with what arrives during one store (at 27,000 records/s, 40,960 simulated nodes at 0.005 real
#: time, ~1 MiB). Its last chunk alone does not tell: the background poll drains the consumer's
#: queue every 20 ms.
HANDED_OVER_BACKLOG = 0.25


@dataclass
class Bad:
    """A message that does not decode: where it came from, its bytes and why."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    error: str


@dataclass(slots=True)
class Batch:
    """A ``pharos.io.requests`` message: where it came from, its bytes and what the storing thread
    needs of its parsed header, made when the poll is decoded (in the background poll's
    thread, while the poll before is inserted: the storing thread only looks them up)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    #: (producer_id, seq): the batch's key in the exactly-once checks
    id: tuple[str, int]
    #: how many records it holds
    records: int
    #: its ``io_batches`` row (:func:`~pharos_pipeline.messages.batch_row`) as a JSONEachRow line
    marker: str
    #: the parsed batch when it carries loss counters (``drops``: ``producer_drops`` rows), else
    #: None: not kept, as objects that live for a poll (~18,000 a 64 MiB poll) make Python's
    #: full garbage collections (~60 ms each, every ~1.5 s of ingest)
    with_drops: IoBatchHeader | None

    @classmethod
    def of(cls, topic: str, partition: int, offset: int, key: bytes | None, value: bytes) -> Batch:
        """The batch of a message. Raises InvalidMessage (:func:`decode_batch_header`)."""
        h = decode_batch_header(value)
        return cls(
            topic,
            partition,
            offset,
            key,
            value,
            (h.producer_id, h.seq),
            len(h.records),
            batch_row_json(h),
            h if h.drops else None,
        )


@dataclass
class Polled:
    """One poll's messages, sorted and decoded (:func:`decode_poll`). ``full``: the poll hit
    its message or byte limit, or ended with a backlog behind it (:func:`take_messages`'s third
    value): more is likely waiting."""

    full: bool
    batches: list[Batch] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)
    metrics: list[TargetMetricsBatch] = field(default_factory=list)
    bad: list[Bad] = field(default_factory=list)
    #: (topic, partition) -> the offset to commit (the last message's + 1)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    #: topic -> messages taken
    taken: dict[str, int] = field(default_factory=dict)

    def add(self, msgs: list, settings: Settings) -> None:
        """Sort and decode ``msgs`` (a chunk of the poll, in the order taken) into this poll: headers of
        IoBatches, job events, target metrics; their offsets to commit and counts; what does not
        decode goes to ``bad``. Raises KafkaException (a fatal consumer error)."""
        from confluent_kafka import KafkaError, KafkaException

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
            self.taken[topic] = self.taken.get(topic, 0) + 1
            self.offsets[(topic, part)] = max(self.offsets.get((topic, part), -1), off + 1)
            try:
                if topic == settings.topic_requests:
                    self.batches.append(Batch.of(topic, part, off, m.key(), m.value()))
                elif topic == settings.topic_jobs:
                    self.events.append(decode_job_event(m.value()))
                elif topic == settings.topic_target_metrics:
                    self.metrics.append(decode_target_metrics(m.value()))
                else:  # not subscribed; cannot happen
                    raise InvalidMessage(f"unexpected topic {topic}")
            except InvalidMessage as exc:
                self.bad.append(Bad(topic, part, off, m.key(), m.value() or b"", str(exc)))


class ConsumerAccess:
    """One thread at a time calls the consumer, without starving the others.

    confluent-kafka (>= 2.16) serializes a Consumer's calls: a call from another thread waits,
    polling, until the current one returns. A background poll that calls ``consume()`` in a
    loop (:func:`take_messages` with ``until``) would starve the storing thread's commit and lag
    queries (measured: a synchronous commit, ``assignment()`` and ``committed()`` were still
    waiting after 10 s, a cached ``get_watermark_offsets()`` after 40 s, beside a loop of 20 ms
    or 200 ms ``consume()`` calls; a commit took 8-15 ms without it). So the other threads hand their calls
    (:meth:`call`) to the thread in ``consume()``, which runs them between its calls
    (:meth:`consume`) and from within the consumer's callbacks (:meth:`serve`: a call made in a
    callback of the consumer is admitted at once, so a revocation that waits for the poll
    being stored to be committed can run that commit). When no thread is in ``consume()`` the
    caller runs its call itself."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: int | None = None  # the thread calling the consumer
        self._consuming = False  # ... and it is in consume(): calls are handed to it
        self._pending: list[tuple[Callable[[], Any], Future]] = []

    def call(self, fn):
        """``fn()``, run by this thread (after the thread calling the consumer, if any, is done)
        or, while another thread is in ``consume()``, by that one. Returns what ``fn`` returns;
        raises what it raises."""
        me = threading.get_ident()
        handed: Future | None = None
        with self._cond:
            while self._owner not in (None, me) and not self._consuming:
                self._cond.wait()
            if self._owner in (None, me):
                mine = self._owner is None
                self._owner = me
            else:
                handed = Future()
                self._pending.append((fn, handed))
        if handed is not None:
            return handed.result()
        try:
            return fn()
        finally:
            if mine:
                self._release()

    def _release(self) -> None:
        while True:
            with self._cond:
                if not self._pending:
                    self._owner, self._consuming = None, False
                    self._cond.notify_all()
                    return
            self.serve()

    def consume(self, consumer, num_messages: int, timeout: float) -> list:
        """``consumer.consume()``; the calls other threads hand over meanwhile are run after it
        (and from the consumer's callbacks: :meth:`serve`)."""

        def consume():
            with self._cond:
                self._consuming = True
            return consumer.consume(num_messages=num_messages, timeout=timeout)

        return self.call(consume)

    def serve(self) -> None:
        """Run the calls other threads handed over, in this thread, which holds the consumer
        (within :meth:`consume`, e.g. in a callback of the consumer; elsewhere nothing is pending)."""
        while True:
            with self._cond:
                if not self._pending or self._owner != threading.get_ident():
                    return
                fn, handed = self._pending.pop(0)
            try:
                handed.set_result(fn())
            except BaseException as exc:  # handed back to the caller
                handed.set_exception(exc)


def take_messages(
    consumer,
    wait: float,
    max_messages: int,
    max_bytes: int,
    mean_bytes: float,
    until: threading.Event | None = None,
    access: ConsumerAccess | None = None,
    on_chunk: Callable[[list], None] | None = None,
) -> tuple[list, float, bool]:
    """The messages of one poll, the running mean message size (bytes) after it, and whether more
    is likely waiting (the poll ended full, or its last chunk came back with all it asked for:
    messages were still queued when it ended, as in a backlog): taken in
    chunks until the poll holds ``max_messages`` messages or ``max_bytes`` bytes, or ``wait``
    seconds passed (a chunk that comes back short means the wait is over). A chunk is at most
    :data:`CONSUME_CHUNK` messages and what the bytes left allow at ``mean_bytes``, so a poll
    overshoots its bytes by about one message.

    ``until``: a background poll taken while the previous one is stored. It is not cut by
    ``wait`` (which bounds how long a record waits on an idle topic, not how long a store
    takes): it keeps filling until it is full or ``until`` is set (the pipeline wants it),
    then ends as a poll in the foreground would (at once: its wait is over), with more waiting
    when it holds :data:`HANDED_OVER_BACKLOG` of its limits or its last chunk came back full, so
    the pipeline takes the next poll in the background too (a poll handed over before it filled,
    because the insert outran the fetch beside it, used to leave the one after it to the
    foreground). Cut at ``wait``, a poll taken beside a store
    came back partly filled (18,000 of a 64 MiB poll's messages in 0.2 s on the ingest bench),
    so the next poll was taken in the foreground again: ~0.3-0.5 s of each 1.3-1.5 s poll
    cycle without a store running. ``access``: how the consumer is called (:class:`ConsumerAccess`:
    needed with ``until``, so the storing thread's calls are not starved). ``on_chunk``: called with
    each chunk that came back non-empty, as it comes (the pipeline decodes it then: in a
    background poll, beside the insert of the poll before, which holds no GIL). Raises
    KafkaException, and what ``on_chunk`` raises."""
    deadline = time.monotonic() + wait
    msgs: list = []
    size = 0
    while True:
        fit = (max_bytes - size) // max(1, int(mean_bytes))
        want = max(1, min(CONSUME_CHUNK, max_messages - len(msgs), fit))
        waiting = until is not None and not until.is_set()
        timeout = HANDOFF_CHECK_S if waiting else max(deadline - time.monotonic(), 0.0)
        if access is not None:
            got = access.consume(consumer, want, timeout)
        else:
            got = consumer.consume(num_messages=want, timeout=timeout)
        if got:
            got_bytes = sum(len(m) for m in got)
            mean_bytes += (got_bytes / len(got) - mean_bytes) * min(1.0, len(got) / 64)
            msgs += got
            size += got_bytes
            if on_chunk is not None:
                on_chunk(got)
        if len(msgs) >= max_messages or size >= max_bytes:
            return msgs, mean_bytes, True
        if not waiting and (len(got) < want or time.monotonic() >= deadline):
            backlog = until is not None and (
                len(msgs) >= max_messages * HANDED_OVER_BACKLOG or size >= max_bytes * HANDED_OVER_BACKLOG
            )
            return msgs, mean_bytes, backlog or len(got) >= want


def still_owned(consumer, msgs: list) -> list:
    """``msgs`` without those of partitions ``consumer`` is no longer assigned (after a
    rebalance during the poll: their new owner starts from the committed offset, and storing them
    here too would race it; a partition assigned again is fetched again from there)."""
    owned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
    return [m for m in msgs if m.error() is not None or (m.topic(), m.partition()) in owned]


def decode_poll(msgs: list, settings: Settings, full: bool) -> Polled:
    """A poll's messages sorted by topic and decoded (:meth:`Polled.add`). Raises KafkaException
    (a fatal consumer error)."""
    out = Polled(full=full)
    out.add(msgs, settings)
    return out
