"""Replayed requests counted once: the SQL condition every forwarder-layer sum applies.

A FUSE mount whose forwarding node does not answer within its request timeout replays an
idempotent request on the next node (forwarder/mount/src/rpc.rs). When the first node had
executed it (its link was cut after the request arrived, so the reply was lost), both daemons
store a record of the one client request. Each forwarder-layer record carries the mount's
``request_id`` (unique per mount instance, kept on every try) and ``replay`` (1 on a try the
mount sent as a replay) (io.proto ``IoRecord`` fields 26, 27; migration 012), so
``(compute_node, request_id)`` names the client request on every daemon.

Rule: a replay record counts only when no other record of its ``(compute_node, request_id)``
exists. The original execution is the one kept, and with it its forwarding node; a replay
whose original never reached a daemon counts (it is the only execution); of several replays
without an original, the earliest counts (then the first by forwarding node). Records without
a request id (0: other layers, daemons before it) always count.

Cost: only the replay records are joined against. :func:`duplicate_replays` reads the replay
records of the jobs asked for (the minmax index on ``replay`` skips the granules without one),
then the records of the same requests (a membership test in that small set while scanning the
jobs' forwarder-layer records, no grouping of every record's key), and ranks those few per
request with a window function. The same SQL runs on chDB and on a ClickHouse server.
"""

from __future__ import annotations

#: A record's identity among the forwarder-layer records: one request is never tried twice on
#: the same forwarding node, so (compute node, request id, forwarding node) is one record.
RECORD_KEY = "(compute_node, request_id, forwarding_node)"


def duplicate_replays(jobs: str) -> str:
    """A subquery: :data:`RECORD_KEY` of every replay record of the jobs matched by ``jobs``
    whose request another record already counts (see the module docstring).

    ``jobs``: a SQL condition on ``job_id`` made of constants and bound parameters only
    (``job_id = {job_id:String}``, ``job_id IN {jobs:Array(String)}``, ...); never user input.
    Returns SQL text (no trailing semicolon)."""
    fwd = f"{jobs} AND layer = 'forwarder' AND request_id != 0"
    return f"""SELECT compute_node, request_id, forwarding_node FROM
    (
        SELECT compute_node, request_id, forwarding_node, replay,
               row_number() OVER (PARTITION BY job_id, compute_node, request_id
                                  ORDER BY replay, start, forwarding_node) AS nth
        FROM io_requests
        WHERE {fwd}
          AND (replay = 1 OR (compute_node, request_id) IN (
              SELECT compute_node, request_id FROM io_requests WHERE {fwd} AND replay = 1))
    )
    WHERE replay = 1 AND nth > 1"""


def counted_once(jobs: str) -> str:
    """A WHERE condition on ``io_requests`` rows: true unless the row is a replay record whose
    request another record already counts (:func:`duplicate_replays` of ``jobs``, which must
    cover the jobs the query reads). Rows of other layers always pass. ``jobs`` as for
    :func:`duplicate_replays`."""
    return f"(replay = 0 OR {RECORD_KEY} NOT IN ({duplicate_replays(jobs)}))"
