"""What the store already holds, as the pipeline and the API ask it: the keys behind the
pipeline's exactly-once checks (batches with their ``io_batches`` marker, records a crashed run
stored without one, the last seq of each producer, dead letters already written) and the
store-side statistics of ``GET /v1/pipeline`` and ``pharos status``. Named queries with bound
parameters; every function raises StoreError."""

from __future__ import annotations

import time
from typing import Any

from pharos_core.store import Store

# -- queries (named constants, bound parameters) -----------------------------------------

#: Batches whose records are stored but whose io_batches marker is not: a run that died between
#: the two inserts. Only parts written (or merged) since shortly before the newest marker can
#: hold them; their keys are checked against io_batches through its primary key.
Q_UNMARKED_RECORD_KEYS = """
WITH recent AS (
    SELECT DISTINCT producer_id, seq FROM io_requests
    WHERE _part IN (
        SELECT name FROM system.parts
        WHERE database = currentDatabase() AND table = 'io_requests' AND active
          AND modification_time >= toDateTime({since:UInt32})
    )
)
SELECT producer_id, seq FROM recent
WHERE (producer_id, seq) NOT IN (
    SELECT producer_id, seq FROM io_batches WHERE (producer_id, seq) IN (SELECT producer_id, seq FROM recent)
)
"""
Q_NEWEST_MARKER = "SELECT toUnixTimestamp(max(ingested)) AS t, count() AS n FROM io_batches"
#: How far before the newest marker (or now) the unmarked-records check looks, s.
RECONCILE_MARGIN_S = 600
#: The poll's batches that already have their marker: (producer_id, seq) looked up as a set of
#: exact keys (a hash set, and the primary key's ranges). Two ``has()`` over the producers and
#: the seqs cost 2-4x more at 8,000 keys and 72,000 markers (0.21-0.36 s -> 0.09 s, bench/ingest.py
#: --mix simulated) and matched their cross product.
Q_STORED_BATCH_KEYS = """
SELECT DISTINCT producer_id, seq FROM io_batches
WHERE (producer_id, seq) IN {keys:Array(Tuple(String, UInt64))}
"""
#: The last marked seq of each producer (the primary key's first column: its ranges only).
Q_LAST_SEQ = """
SELECT producer_id, max(seq) AS seq FROM io_batches
WHERE producer_id IN {producers:Array(String)} GROUP BY producer_id
"""
Q_STORED_DEAD_LETTERS = """
SELECT topic, partition, offset FROM dead_letters
WHERE has({topics:Array(String)}, topic) AND has({offsets:Array(Int64)}, offset)
"""


def unmarked_record_keys(store: Store) -> set[tuple[str, int]]:
    """(producer_id, seq) of the batches whose records are in io_requests without their
    io_batches marker: what a run that died between the two inserts left. Looks at the parts
    written or merged since RECONCILE_MARGIN_S before the newest marker (or now, if sooner).
    Raises StoreError."""
    newest = store.query(Q_NEWEST_MARKER)[0]
    t = min(int(newest["t"]), int(time.time())) if int(newest["n"]) else 0
    rows = store.query(Q_UNMARKED_RECORD_KEYS, {"since": max(0, t - RECONCILE_MARGIN_S)})
    return {(r["producer_id"], int(r["seq"])) for r in rows}


def stored_keys(store: Store, sql: str, keys: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Which of ``keys`` ((producer_id, seq)) the store holds, asked with ``sql``
    (:data:`Q_STORED_BATCH_KEYS`: a parameter ``keys`` of ``Array(Tuple(String, UInt64))``,
    columns ``producer_id`` and ``seq``). Raises StoreError."""
    if not keys:
        return set()
    rows = store.query(sql, {"keys": sorted(keys)})
    return {(r["producer_id"], int(r["seq"])) for r in rows} & keys


# -- store-side statistics (for the API) --------------------------------------------------

Q_PIPELINE_STATS = """
SELECT
    (SELECT count() FROM io_requests) AS records,
    (SELECT sum(bytes) FROM io_requests) AS bytes,
    (SELECT uniqExact(producer_id, seq) FROM io_batches) AS batches,
    (SELECT uniqExact(producer_id) FROM io_batches) AS producers,
    (SELECT max(ingested) FROM io_batches) AS last_ingested,
    (SELECT count() FROM dead_letters) AS dead_letters,
    (SELECT uniqExact(job_id) FROM job_events) AS jobs
"""
Q_MISSING_BATCHES = """
SELECT sum(missing) AS missing FROM (
    SELECT producer_id, max(seq) + 1 - uniqExact(seq) AS missing FROM io_batches GROUP BY producer_id
)
"""
Q_DROPS = """
SELECT sum(ringbuf_drops) AS ringbuf_drops, sum(delivery_failures) AS delivery_failures,
       sum(overflow_drops) AS overflow_drops, sum(unmerged_fallbacks) AS unmerged_fallbacks
FROM producer_drops FINAL
"""


def pipeline_stats(store: Store) -> dict[str, Any]:
    """What the store holds, for the API and ``pharos status``.

    Keys: records (io_requests rows), bytes (sum of bytes moved), batches (distinct
    (producer, seq)), producers, last_ingested (DateTime text or None), dead_letters,
    jobs (distinct job ids with events), missing_batches (seq gaps summed over producers,
    counting from seq 0), and the producers' loss counters summed over (producer, job):
    ringbuf_drops, delivery_failures, overflow_drops, unmerged_fallbacks. Raises StoreError.
    """
    out: dict[str, Any] = dict(store.query(Q_PIPELINE_STATS)[0])
    out["missing_batches"] = int(store.query(Q_MISSING_BATCHES)[0]["missing"] or 0)
    out.update(store.query(Q_DROPS)[0])
    for k, v in out.items():
        if k != "last_ingested":
            out[k] = int(v or 0)
    if out.get("last_ingested", "").startswith("1970-01-01"):
        out["last_ingested"] = None
    return out
