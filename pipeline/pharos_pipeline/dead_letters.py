"""Dead letters of the pipeline: a message that does not decode (or whose records the store
refuses) is produced to ``pharos.io.deadletter`` as it came (raw bytes, headers ``error``,
``source_topic``, ``source_partition``, ``source_offset``), its delivery awaited, and a row goes
to ``dead_letters``, once per source offset (a re-delivered poll finds its rows and writes
nothing again)."""

from __future__ import annotations

import logging
import time

from pharos_core.settings import Settings
from pharos_core.store import Store

from .polls import Bad
from .stored import Q_STORED_DEAD_LETTERS

log = logging.getLogger("pharos_pipeline.ingest")

#: dead_letters.payload_head keeps this many leading bytes of the message, hex.
PAYLOAD_HEAD_BYTES = 256


class DeadLetters:
    """The dead-letter topic's producer (made at the first dead letter) and the table's rows."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings, self.store = settings, store
        self._producer = None

    def _ensure_producer(self):
        if self._producer is None:
            from confluent_kafka import Producer

            self._producer = Producer(
                {
                    "bootstrap.servers": self.settings.kafka_bootstrap,
                    "client.id": "pharos-pipeline-deadletter",
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                },
                logger=log,
            )
        return self._producer

    def write(self, bad: list[Bad]) -> list[Bad]:
        """Produce and record those of ``bad`` not recorded yet; returns them. Raises
        KafkaException when the topic does not take one (nothing recorded then), StoreError."""
        from confluent_kafka import KafkaException

        rows = self.store.query(
            Q_STORED_DEAD_LETTERS,
            {
                "topics": sorted({b.topic for b in bad}),
                "offsets": sorted({b.offset for b in bad}),
            },
        )
        seen = {(r["topic"], int(r["partition"]), int(r["offset"])) for r in rows}
        todo = [b for b in bad if (b.topic, b.partition, b.offset) not in seen]
        if not todo:
            return []
        producer = self._ensure_producer()
        failures: list[str] = []

        def delivered(err, _msg):
            if err is not None:
                failures.append(str(err))

        for b in todo:
            log.warning("dead letter %s[%d]@%d: %s", b.topic, b.partition, b.offset, b.error)
            producer.produce(
                self.settings.topic_deadletter,
                value=b.value,
                key=b.key,
                headers=[
                    ("error", b.error.encode()),
                    ("source_topic", b.topic.encode()),
                    ("source_partition", str(b.partition).encode()),
                    ("source_offset", str(b.offset).encode()),
                ],
                on_delivery=delivered,
            )
        left = producer.flush(30)
        if left or failures:
            raise KafkaException(f"dead-letter topic did not take {left or len(failures)} message(s): {failures[:3]}")
        now = time.time()
        self.store.insert_rows(
            "dead_letters",
            [
                {
                    "time": f"{now:.3f}",
                    "topic": b.topic,
                    "partition": b.partition,
                    "offset": b.offset,
                    "error": b.error,
                    "size": len(b.value),
                    "payload_head": b.value[:PAYLOAD_HEAD_BYTES].hex(),
                }
                for b in todo
            ],
        )
        return todo

    def close(self) -> None:
        """Flush and drop the producer."""
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
