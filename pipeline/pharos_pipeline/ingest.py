"""Kafka -> ClickHouse ingestion: the pipeline's consumer group.

One consumer (group ``settings.consumer_group``) reads ``pharos.io.requests`` (IoBatch,
key = producer_id), ``pharos.jobs`` (JobEvent, key = job_id) and ``pharos.target.metrics``
(TargetMetricsBatch from the forwarding layer, key = producer_id; stored in
``target_metrics``, a ReplacingMergeTree whose key makes a re-delivered batch collapse:
read it with FINAL). Each poll takes up to ``settings.pipeline_max_messages`` messages
or ``settings.pipeline_max_poll_mb`` MiB of them, or waits ``settings.pipeline_max_wait_ms``,
whichever comes first (STYLE.md: batch by rows or time; bytes, not messages, because an
agent's 200 ms batch may hold 3 records or 3,000), and then, in this order:

1. decodes every message; one that does not decode, has an unsupported ``schema_version``
   or is otherwise invalid is produced to ``pharos.io.deadletter`` (raw bytes, headers
   ``error``, ``source_topic``, ``source_partition``, ``source_offset``), delivery is
   awaited, and a row goes to ``dead_letters`` (once per source offset). The pipeline
   keeps going: a poison message never blocks a partition.
2. drops batches whose ``(producer_id, seq)`` repeats within the poll, and those whose
   records are already in ``io_requests`` (a re-delivery after a crash, or a producer that
   sent twice): their ``io_batches`` marker is looked up only for batches at or below their
   producer's last marked seq (the store's when this assignment first saw the producer, then
   what this pipeline wrote), and records stored without a marker by a run that died are
   looked for at each assignment;
3. inserts every new record of the poll in ONE statement (:mod:`pharos_pipeline.columnar`): one
   part, all or nothing. That insert is the exactly-once point: a batch is in
   ``io_requests`` entirely or not at all, so the check of step 2 is exact;
4. ``producer_drops`` (the per (producer, job) maximum of the cumulative counters of the
   poll's new batches), then ``io_batches`` (the marker that a batch is complete; rows for
   batches whose records were stored by a run that crashed before this step are written
   now), then ``job_events`` (ReplacingMergeTree by (job_id, kind): idempotent);
5. commits the offsets of the poll synchronously.

A crash anywhere before 5 re-delivers the poll; steps 1-4 are idempotent, so every record
is stored exactly once (Beacon's end-to-end loss accounting: nothing is silently lost,
duplicates are counted in ``duplicates_skipped``).

A poll that comes back full, or with a backlog behind it (``pipeline_prefetch``), has the next one
taken from Kafka, and its headers decoded chunk by chunk as they come (with each batch's marker
row), in a background thread while it is stored, filled until it is full or wanted
(not cut at ``pipeline_max_wait_ms``); steps 1-5 stay in this order, poll after poll, in the
thread that calls :meth:`Pipeline.process_once`. A revocation of partitions waits until the poll
being stored is committed, and a poll during which a rebalance came keeps only the partitions
still assigned. Every call of the consumer goes through
:class:`~pharos_pipeline.polls.ConsumerAccess`: confluent-kafka serializes them, so the commit
and the lag queries are handed to the background poll while it is in ``consume()``.

Gap detection: the pipeline keeps the highest seq seen per producer (seeded from
``io_batches`` after a restart); a batch whose seq skips ahead counts the skipped batches
in ``gaps`` and logs a warning. Producers start at seq 0.

Run standalone: ``python -m pharos_pipeline.ingest`` (settings from PHAROS_* / pharos.toml;
SIGTERM or SIGINT stops it after the current poll).

Decoding the messages and their rows: :mod:`pharos_pipeline.messages`; what the checks of steps
1-2 and the statistics ask the store: :mod:`pharos_pipeline.stored`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import replace
from typing import Any

from pharos_core.settings import Settings
from pharos_core.store import Store, StoreError

from . import columnar
from .counters import Counters, TopicCounters
from .dead_letters import DeadLetters
from .messages import InvalidMessage, decode_batch, drop_rows, job_event_row, target_metrics_rows
from .polls import HANDOFF_CHECK_S, Bad, Batch, ConsumerAccess, Polled, decode_poll, still_owned, take_messages
from .stored import Q_LAST_SEQ, Q_STORED_BATCH_KEYS, stored_keys, unmarked_record_keys

log = logging.getLogger("pharos_pipeline.ingest")

# -- the pipeline ----------------------------------------------------------------------------


class Pipeline:
    """The Kafka -> ClickHouse consumer. Not thread-safe: one thread calls
    :meth:`process_once` / :meth:`run`; :meth:`stats` may be read from any thread.

    ``max_messages`` / ``max_wait`` (s) default to ``settings.pipeline_max_messages`` /
    ``pipeline_max_wait_ms``, the bytes of a poll are at most ``settings.pipeline_max_poll_mb``
    MiB (one message more at most); ``consumer_config`` overrides librdkafka settings.
    The store must be migrated (:func:`pharos_core.store.migrate`).
    """

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        max_messages: int | None = None,
        max_wait: float | None = None,
        consumer_config: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.max_messages = max_messages or settings.pipeline_max_messages
        self.max_wait = max_wait if max_wait is not None else settings.pipeline_max_wait_ms / 1000
        self.max_poll_bytes = int(settings.pipeline_max_poll_mb * (1 << 20))
        #: running mean size of the messages polled (bytes), sizes the chunks of a poll
        self._mean_message_bytes = 64.0 * 1024
        self.topics = [settings.topic_requests, settings.topic_jobs, settings.topic_target_metrics]
        self._consumer_config = {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": settings.consumer_group,
            "client.id": "pharos-pipeline",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 2000,
        }
        if settings.consumer_instance_id:
            self._consumer_config["group.instance.id"] = settings.consumer_instance_id
        self._consumer_config.update(consumer_config or {})
        self._consumer = None
        self._dead_letters = DeadLetters(settings, store)
        self._c = Counters()
        # Batches whose records a dead run stored without markers; looked for at start and
        # whenever partitions are assigned (another consumer of the group may have died).
        self._unmarked: set[tuple[str, int]] = set()
        #: assignments seen (the consumer's callback, maybe in the background poll's thread) and
        #: the one the unmarked-records check last ran for
        self._assignments = 1
        self._reconciled = 0
        #: producer -> highest seq known to have its marker, for the assignment counted in _marked_gen
        self._marked_high: dict[str, int] = {}
        self._marked_gen = 0
        #: held while a poll is stored and committed (:meth:`_revoked` waits for it)
        self._storing = threading.RLock()
        self._executor = None
        self._next = None
        self._handoff = threading.Event()
        #: every consumer call goes through it while a background poll may be consuming
        self._access = ConsumerAccess()
        self._stats_lock = threading.Lock()
        #: (topic, partition) -> the group's committed offset (negative: none yet)
        self._committed: dict[tuple[str, int], int] = {}
        self._lag_at = 0.0
        #: the consumer lag is measured after a poll at most this often (seconds)
        self.lag_every_s = 1.0

    # -- Kafka clients -------------------------------------------------------------------
    def _ensure_consumer(self):
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(self._consumer_config, logger=log)
            self._consumer.subscribe(self.topics, on_assign=self._assigned, on_revoke=self._revoked)
        return self._consumer

    def _assigned(self, _consumer, _partitions) -> None:
        self._assignments += 1

    def reset_consumer(self) -> None:
        """Close the consumer without committing; the next poll rejoins the group and
        resumes from the committed offsets (what was polled but not committed comes again)."""
        self._drop_prefetched()
        self._marked_high.clear()  # asked from the store again: what failed may be half-stored
        self._committed.clear()  # asked from the broker again after the rejoin
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception as exc:  # already failed; closing is best effort
                log.warning("closing the consumer: %s", exc)
            self._consumer = None

    def close(self) -> None:
        """Close the Kafka clients (flushes the dead-letter producer). The store stays open."""
        self.reset_consumer()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._dead_letters.close()

    # -- one poll ------------------------------------------------------------------------
    def process_once(self, timeout: float | None = None) -> int:
        """Poll up to ``max_messages`` messages or ``max_poll_bytes`` bytes of them (waiting at most
        ``timeout`` s, default ``max_wait``), store them and commit their offsets. Returns the number
        of messages taken (0 when none came).

        A poll that came back full (its message or byte limit reached, or it ended with a backlog
        behind it: :func:`~pharos_pipeline.polls.take_messages`) starts the next poll in a background thread while this
        one is stored (:meth:`_prefetch`); the next call stores what that took (or polls anew when
        it took nothing). The store checks, inserts and
        commits stay in this thread and in poll order, so the exactly-once steps are unchanged.

        Raises StoreError when the store refuses an insert, or KafkaException when the
        dead-letter topic does not accept a message or the commit fails; nothing of the
        poll is committed then: call :meth:`reset_consumer` and poll again (what was
        stored is skipped on re-delivery).
        """
        self.store.mark_ingest_thread()
        consumer = self._ensure_consumer()
        polled = self._prefetched()
        if polled is None or not polled.taken:
            polled = self._take(consumer, self.max_wait if timeout is None else timeout)
        if not polled.taken:
            self._update_lag(consumer)
            return 0
        with self._storing:
            if polled.full and self.settings.pipeline_prefetch:
                self._prefetch(consumer)
            self._store_polled(consumer, polled)
        self._update_lag(consumer)
        return sum(polled.taken.values())

    # -- the next poll while this one is stored -------------------------------------------
    def _prefetch(self, consumer) -> None:
        """Start the next poll in the background thread (:meth:`_take` with a hand-off event: it
        fills until it is full or :meth:`_prefetched` asks for it, not cut by ``max_wait``).
        Called with :attr:`_storing` held, so a revocation of partitions that the background
        consume() triggers waits (:meth:`_revoked`) until this poll is stored and committed, as
        it would if the poll came after the commit."""
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pharos-pipeline-poll")
        self._handoff = threading.Event()
        self._next = self._executor.submit(self._take, consumer, self.max_wait, self._handoff)

    def _prefetched(self) -> Polled | None:
        """The background poll's result (asking it to end, then waiting for it), or None when
        none was started. Raises what the poll raised (KafkaException)."""
        fut, self._next = self._next, None
        if fut is None:
            return None
        self._handoff.set()
        return fut.result()

    def _drop_prefetched(self) -> None:
        """Wait for the background poll and forget what it took (never committed: it comes again)."""
        try:
            self._prefetched()
        except Exception as exc:  # the consumer is being reset anyway
            log.debug("background poll dropped: %s", exc)

    def _revoked(self, _consumer, _partitions) -> None:
        # Partitions go to another member: not before the poll being stored is committed. Called
        # in the background poll's thread, which holds the consumer: the storing thread's commit
        # is handed to it (ConsumerAccess), so run it meanwhile.
        while not self._storing.acquire(timeout=HANDOFF_CHECK_S):
            self._access.serve()
        self._storing.release()

    # -- one poll: take, then store -------------------------------------------------------
    def _take(self, consumer, wait: float, until: threading.Event | None = None) -> Polled:
        """One poll (:func:`~pharos_pipeline.polls.take_messages`; ``until``: the background
        poll's hand-off), decoded chunk by chunk as it comes (:meth:`~pharos_pipeline.polls.Polled.add`);
        after a rebalance during it, only the partitions still assigned
        (:func:`~pharos_pipeline.polls.still_owned`, decoded again). Raises KafkaException (a
        fatal consumer error)."""
        gen = self._assignments
        polled = Polled(full=False)
        msgs, self._mean_message_bytes, more = take_messages(
            consumer,
            wait,
            self.max_messages,
            self.max_poll_bytes,
            self._mean_message_bytes,
            until,
            self._access,
            lambda chunk: polled.add(chunk, self.settings),
        )
        if self._assignments != gen:
            owned = self._access.call(lambda: still_owned(consumer, msgs))
            if len(owned) != len(msgs):
                msgs, polled = owned, decode_poll(owned, self.settings, False)
        polled.full = more  # true at its limits too (a poll kept to owned partitions holds no more)
        return polled

    def _store_polled(self, consumer, polled: Polled) -> None:
        """Steps 1-5 of the module doc for one poll: dead letters, records and markers, job
        events, target metrics, then the commit of its offsets and the counters."""
        from confluent_kafka import TopicPartition

        if polled.bad:
            self._dead_letter(polled.bad)
        self._store_batches(polled.batches)
        if polled.events:
            self.store.insert_rows("job_events", [job_event_row(e) for e in polled.events])
        metric_rows = [r for b in polled.metrics for r in target_metrics_rows(b)]
        if metric_rows:  # ReplacingMergeTree: a re-delivered batch collapses into the same rows
            self.store.insert_rows("target_metrics", metric_rows)

        commit = [TopicPartition(t, p, o) for (t, p), o in polled.offsets.items()]
        if commit:
            self._access.call(lambda: consumer.commit(offsets=commit, asynchronous=False))
            self._committed.update(polled.offsets)
        with self._stats_lock:
            c = self._c
            for topic, n in polled.taken.items():
                c.topic(topic).messages += n
            c.topic(self.settings.topic_jobs).stored += len(polled.events)
            c.topic(self.settings.topic_target_metrics).stored += len(metric_rows)
            c.polls += 1
            if commit:
                c.commits += 1
                c.last_commit_time = time.time()

    def _update_lag(self, consumer) -> None:
        """The consumer lag of each assigned partition, at most every ``lag_every_s`` seconds: its high
        watermark (as the consumer last fetched it; asked from the broker when unknown) minus the
        group's committed offset (this pipeline's commits; the broker's for a partition it has not
        committed yet; none: the low watermark, where ``auto.offset.reset = earliest`` starts)."""
        from confluent_kafka import KafkaException

        now = time.monotonic()
        if now - self._lag_at < self.lag_every_s:
            return
        self._lag_at = now

        def lag_of_assigned() -> dict[tuple[str, int], int]:
            parts = consumer.assignment()
            unknown = [tp for tp in parts if (tp.topic, tp.partition) not in self._committed]
            if unknown:
                for tp in consumer.committed(unknown, timeout=5):
                    self._committed[(tp.topic, tp.partition)] = tp.offset
            lag = {}
            for tp in parts:
                low, high = consumer.get_watermark_offsets(tp, cached=True)
                if high < 0:  # nothing fetched yet
                    low, high = consumer.get_watermark_offsets(tp, timeout=5)
                committed = self._committed.get((tp.topic, tp.partition), -1)
                lag[(tp.topic, tp.partition)] = max(high - (committed if committed >= 0 else low), 0)
            return lag

        try:
            lag = self._access.call(lag_of_assigned)
        except KafkaException as exc:  # the broker is away: keep the previous values
            log.debug("consumer lag not updated: %s", exc)
            return
        with self._stats_lock:
            self._c.lag = lag

    def _store_batches(self, batches: list[Batch]) -> None:
        # Per batch only lookups of what the poll's decoding made (Batch: id, records, marker):
        # this runs between two inserts, in the cycle's serial part.
        # 1. duplicates within the poll (first one wins: the same key means the same batch)
        unique: dict[tuple[str, int], Batch] = {}
        for b in batches:
            unique.setdefault(b.id, b)
        dup = len(batches) - len(unique)
        high = self._marked_high_of({p for p, _ in unique})
        self._detect_gaps(list(unique), high)
        # 2. what earlier polls stored (io_batches), or a run that died before its markers
        seen = self._assignments
        if seen != self._reconciled:
            self._unmarked |= unmarked_record_keys(self.store)
            self._reconciled = seen
        have_marker = stored_keys(self.store, Q_STORED_BATCH_KEYS, {k for k in unique if k[1] <= high[k[0]]})
        done = self._unmarked | have_marker
        new = [b for k, b in unique.items() if k not in done] if done else list(unique.values())
        # 3. all new records in ONE insert (one part: all or nothing), decoded by the store
        new = self._insert_records(new)
        if len(new) == len(unique):  # every batch of the poll was new and stored (the usual case)
            incomplete = new
        else:
            stored = {b.id for b in new}
            incomplete = [b for k, b in unique.items() if k not in have_marker and (k in stored or k in self._unmarked)]
            dup += sum(1 for k in unique if k not in stored and (k in have_marker or k in self._unmarked))
        # 4. loss counters, then the completion markers
        self.store.insert_rows(
            "producer_drops", drop_rows([b.with_drops for b in incomplete if b.with_drops is not None])
        )
        self.store.insert_json_lines("io_batches", [b.marker for b in incomplete])
        if self._unmarked:
            self._unmarked -= {b.id for b in incomplete}
        for p, seq in (b.id for b in incomplete):
            if seq > high[p]:
                high[p] = seq
        if dup:
            log.info("skipped %d duplicate batch(es)", dup)
        with self._stats_lock:
            t = self._c.topic(self.settings.topic_requests)
            t.batches += len(new)
            t.stored += sum(b.records for b in new)
            t.duplicates += dup

    def _marked_high_of(self, producers: set[str]) -> dict[str, int]:
        """The highest seq with an ``io_batches`` marker of each of ``producers`` (-1: none), as
        the store had it when this assignment first saw the producer (one query for those not
        known yet) and as this pipeline wrote since. A batch above it has no marker: while this
        consumer owns the producer's partition no other writes its markers (a revocation waits
        for the poll being stored), so only batches at or below it are looked up
        (:data:`Q_STORED_BATCH_KEYS`): re-deliveries and batches sent twice. Forgotten at each
        assignment and consumer reset. Raises StoreError."""
        if self._marked_gen != self._assignments:
            self._marked_high.clear()
            self._marked_gen = self._assignments
        unknown = sorted(producers - self._marked_high.keys())
        if unknown:
            found = {r["producer_id"]: int(r["seq"]) for r in self.store.query(Q_LAST_SEQ, {"producers": unknown})}
            for p in unknown:
                self._marked_high[p] = found.get(p, -1)
        return self._marked_high

    def _insert_records(self, new: list[Batch]) -> list[Batch]:
        """Insert the records of ``new``; returns the batches stored. When the store refuses
        the poll (a record that breaks a rule, or one that does not parse: the dispatcher
        did not decode the records), each batch is validated here (:func:`decode_batch`):
        the invalid ones go to the dead letters and the others are inserted. When every
        batch is valid the refusal was the store's own: StoreError is raised."""
        try:
            columnar.insert_io_batches(self.store, [b.value for b in new], self.settings.pipeline_parse_threads)
            return new
        except StoreError as exc:
            refused = exc
        good, bad = [], []
        for b in new:
            try:
                decode_batch(b.value)
                good.append(b)
            except InvalidMessage as exc:
                bad.append(Bad(b.topic, b.partition, b.offset, b.key, b.value, str(exc)))
        if not bad:
            raise refused
        log.warning("%d batch(es) with invalid records in the poll: dead letters", len(bad))
        self._dead_letter(bad)
        columnar.insert_io_batches(self.store, [b.value for b in good], self.settings.pipeline_parse_threads)
        return good

    def _detect_gaps(self, ids: list[tuple[str, int]], marked_high: dict[str, int]) -> None:
        # ids: (producer_id, seq) of the poll's batches in Kafka order; a producer seen for the
        # first time starts from its last stored seq (marked_high: the store's, asked for every
        # producer of the poll)
        last = self._c.last_seq
        for p in {p for p, _ in ids} - last.keys():
            if marked_high[p] >= 0:
                last[p] = marked_high[p]
        gaps = 0
        for p, seq in ids:  # Kafka order within a producer's partition
            prev = last.get(p, -1)
            if seq > prev + 1:
                missing = seq - prev - 1
                gaps += missing
                log.warning(
                    "producer %s: %d batch(es) missing before seq %d (last seen %s)",
                    p,
                    missing,
                    seq,
                    prev if prev >= 0 else "none",
                )
            if seq > prev:
                last[p] = seq
        if gaps:
            with self._stats_lock:
                self._c.topic(self.settings.topic_requests).gaps += gaps

    def _dead_letter(self, bad: list[Bad]) -> None:
        written = self._dead_letters.write(bad)
        with self._stats_lock:
            for b in written:
                self._c.topic(b.topic).dead_letters += 1

    # -- loop ----------------------------------------------------------------------------
    def run(self, stop_event: threading.Event, *, max_backoff: float = 30.0) -> None:
        """Poll and store until ``stop_event`` is set, then close the Kafka clients.

        A store or Kafka error is logged and counted in ``errors``; the consumer is reset
        (re-delivery from the committed offsets) and the loop retries with a backoff
        doubling from 0.5 s up to ``max_backoff`` s. Returns after the poll in progress.
        """
        from confluent_kafka import KafkaException

        backoff = 0.5
        try:
            while not stop_event.is_set():
                try:
                    self.process_once()
                    backoff = 0.5
                except (StoreError, KafkaException) as exc:
                    with self._stats_lock:
                        self._c.errors += 1
                    log.error("pipeline poll failed, retrying in %.1f s: %s", backoff, exc)
                    self.reset_consumer()
                    stop_event.wait(backoff)
                    backoff = min(backoff * 2, max_backoff)
        finally:
            self.close()

    def stats(self) -> dict[str, Any]:
        """Counters of this process since it started, over every topic.

        Keys: messages (Kafka messages taken), batches (new IoBatches stored), records
        (io_requests rows written), job_events, duplicates_skipped (batches already stored
        or repeated within a poll), dead_letters, gaps (batches missing by seq), polls,
        commits, errors (failed polls retried), last_commit_time (Unix s, or None),
        producers (producers seen), consumer_lag (messages not committed yet, summed over the
        assigned partitions).
        """
        s = self.settings
        with self._stats_lock:
            c = self._c
            t = c.topics
            req, jobs = t.get(s.topic_requests, TopicCounters()), t.get(s.topic_jobs, TopicCounters())
            return {
                "messages": sum(x.messages for x in t.values()),
                "batches": req.batches,
                "records": req.stored,
                "job_events": jobs.stored,
                "duplicates_skipped": req.duplicates,
                "dead_letters": sum(x.dead_letters for x in t.values()),
                "gaps": req.gaps,
                "polls": c.polls,
                "commits": c.commits,
                "errors": c.errors,
                "last_commit_time": c.last_commit_time,
                "producers": len(c.last_seq),
                "consumer_lag": sum(c.lag.values()),
            }

    def topic_stats(self) -> tuple[dict[str, TopicCounters], dict[tuple[str, int], int]]:
        """Copies of the per-topic counters (every subscribed topic, zeros included) and the
        consumer lag by (topic, partition): what the Prometheus metrics read."""
        with self._stats_lock:
            topics = {name: TopicCounters() for name in self.topics}
            topics.update({k: replace(v) for k, v in self._c.topics.items()})
            return topics, dict(self._c.lag)


# -- standalone process -----------------------------------------------------------------------


def run_pipeline_process(settings: Settings | None = None) -> int:
    """Entry point of ``python -m pharos_pipeline.ingest``: open and migrate the store,
    create the topics if missing, run the pipeline until SIGTERM/SIGINT. Returns the exit
    status (0). Settings from the environment / pharos.toml unless given.

    Note: a chDB data directory may be opened by one process only (DESIGN.md).
    """
    from pharos_core.process import freeze_startup_objects
    from pharos_core.settings import get_settings
    from pharos_core.store import migrate, open_store

    from .broker import ensure_topics

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings or get_settings()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    store = open_store(settings)
    try:
        applied = migrate(store)
        if applied:
            log.info("applied migrations %s", applied)
        try:
            ensure_topics(settings)
        except Exception as exc:  # the broker may come later; the consumer retries
            log.warning("could not ensure topics on %s: %s", settings.kafka_bootstrap, exc)
        pipeline = Pipeline(settings, store)
        frozen = freeze_startup_objects()
        log.info(
            "pipeline consuming %s from %s (group %s; %d start-up objects out of the garbage collector's passes)",
            pipeline.topics,
            settings.kafka_bootstrap,
            settings.consumer_group,
            frozen,
        )
        pipeline.run(stop)
        log.info("pipeline stopped: %s", pipeline.stats())
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(run_pipeline_process())
