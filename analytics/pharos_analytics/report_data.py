"""Binned figures of one job for its visual report (``pharos report``, ``GET /v1/jobs/{id}/report``).

Everything is binned in the store, so the report's cost grows with the number of bins, not with
the job's requests (millions of records, thousands of ranks):

* :func:`rank_time_bytes`: bytes per (rank, time bin), reads and writes apart: Darshan's DXT
  heat map (PyDarshan ``darshan.experimental.plots.heatmap``), from the job's data requests on
  data files. A merged run of requests (Beacon's online compression, ``count`` > 1) spans
  ``start``..``end``; its bytes are spread evenly over the time bins it covers. More than
  ``max_rank_rows`` ranks are grouped into equal rank ranges (rows).
* :func:`resource_bytes`: bytes per storage target and per forwarding node (forwarder layer).

Data requests on data files: the summary's definition (:mod:`pharos_analytics.summary`):
``read``/``pread``/``readv``/``write``/``pwrite``/``writev`` on regular files outside system paths
and standard streams. A request a mount replayed on another forwarding node counts once, on the
node of the execution kept (:mod:`pharos_analytics.replays_sql`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pharos_core.store import Store

from .pattern import SYSTEM_PATH_REGEX
from .replays_sql import counted_once
from .summary_sql import DATA_OPS, READ_OPS, sql_list

#: A replayed request once (:mod:`pharos_analytics.replays_sql`).
_ONCE = counted_once("job_id = {job_id:String}")

#: Time range of a job's data requests on one layer (ns since the epoch) and its ranks.
EXTENT_SQL = f"""
SELECT toUnixTimestamp64Nano(min(start)) AS t0, toUnixTimestamp64Nano(max(end)) AS t1,
       min(rank) AS rank_min, max(rank) AS rank_max, count() AS records
FROM io_requests
WHERE job_id = {{job_id:String}} AND layer = {{layer:String}} AND file_type = 'regular'
  AND op IN {sql_list(DATA_OPS)} AND NOT match(path, {{system_re:String}}) AND {_ONCE}
"""

#: Bytes per (rank row, time bin, direction); a record's bytes spread over the bins it spans.
RANK_TIME_SQL = f"""
SELECT row, b, is_read, sum(share) AS bytes
FROM (
    SELECT
        intDiv(rank - {{rank_min:Int64}}, {{ranks_per_row:Int64}})               AS row,
        op IN {sql_list(READ_OPS)}                                                AS is_read,
        least(intDiv(toUnixTimestamp64Nano(start) - {{t0:Int64}}, {{bin_ns:Int64}}), {{last:Int64}}) AS b0,
        least(intDiv(toUnixTimestamp64Nano(end) - {{t0:Int64}}, {{bin_ns:Int64}}), {{last:Int64}})   AS b1,
        arrayJoin(range(toUInt64(b0), toUInt64(b1) + 1))                          AS b,
        bytes / (b1 - b0 + 1)                                                     AS share
    FROM io_requests
    WHERE job_id = {{job_id:String}} AND layer = {{layer:String}} AND file_type = 'regular'
      AND op IN {sql_list(DATA_OPS)} AND NOT match(path, {{system_re:String}}) AND rank >= 0 AND {_ONCE}
)
GROUP BY row, b, is_read
"""

#: Bytes per storage target and per forwarding node of a job (the daemons' records).
RESOURCE_SQL = f"""
SELECT 'target' AS kind, target AS name, sum(bytes) AS bytes, sum(count) AS requests
FROM io_requests
WHERE job_id = {{job_id:String}} AND layer = 'forwarder' AND target != '' AND op IN {sql_list(DATA_OPS)}
  AND {_ONCE}
GROUP BY name
UNION ALL
SELECT 'forwarding_node' AS kind, forwarding_node AS name, sum(bytes) AS bytes, sum(count) AS requests
FROM io_requests
WHERE job_id = {{job_id:String}} AND layer = 'forwarder' AND forwarding_node != '' AND op IN {sql_list(DATA_OPS)}
  AND {_ONCE}
GROUP BY name
"""


@dataclass
class RankTime:
    """Bytes per rank row and time bin. ``read``/``write``: ``rows`` lists of ``bins`` floats
    (bytes); row i holds ranks ``rank_min + i * ranks_per_row`` .. ``+ ranks_per_row - 1``;
    bin j covers ``t0_ns + j * bin_ns`` .. ``+ bin_ns`` (ns since the epoch)."""

    t0_ns: int
    bin_ns: int
    bins: int
    rank_min: int
    ranks_per_row: int
    rows: int
    read: list[list[float]]
    write: list[list[float]]
    records: int

    def bandwidth(self, direction: str) -> list[float]:
        """Bytes/s per time bin over all ranks of ``direction`` (``read`` | ``write``)."""
        m = self.read if direction == "read" else self.write
        return [sum(col) / (self.bin_ns / 1e9) for col in zip(*m, strict=True)] if m else [0.0] * self.bins


def rank_time_bytes(
    store: Store, job_id: str, layer: str = "client", bins: int = 240, max_rank_rows: int = 2048
) -> RankTime | None:
    """The job's bytes per (rank row, time bin) on ``layer``; None when it has no traced data
    requests there (e.g. a Darshan log without DXT). ``bins`` >= 1 time bins over the job's
    I/O span; at most ``max_rank_rows`` rows (ranks grouped beyond). Raises ValueError for
    bins or max_rank_rows < 1, StoreError."""
    if bins < 1 or max_rank_rows < 1:
        raise ValueError("bins and max_rank_rows must be >= 1")
    p = {"job_id": job_id, "layer": layer, "system_re": SYSTEM_PATH_REGEX}
    ext = store.query(EXTENT_SQL, p)
    if not ext or not int(ext[0]["records"]):
        return None
    e = ext[0]
    t0, t1 = int(e["t0"]), int(e["t1"])
    rank_min, rank_max = max(int(e["rank_min"]), 0), max(int(e["rank_max"]), 0)
    n_ranks = rank_max - rank_min + 1
    per_row = -(-n_ranks // max_rank_rows)
    rows = -(-n_ranks // per_row)
    bin_ns = max(-(-(t1 - t0 + 1) // bins), 1)
    q = p | {"rank_min": rank_min, "ranks_per_row": per_row, "t0": t0, "bin_ns": bin_ns, "last": bins - 1}
    read = [[0.0] * bins for _ in range(rows)]
    write = [[0.0] * bins for _ in range(rows)]
    for r in store.query(RANK_TIME_SQL, q):
        row, b = int(r["row"]), int(r["b"])
        if 0 <= row < rows and 0 <= b < bins:
            (read if int(r["is_read"]) else write)[row][b] += float(r["bytes"])
    return RankTime(t0, bin_ns, bins, rank_min, per_row, rows, read, write, int(e["records"]))


def resource_bytes(store: Store, job_id: str) -> dict[str, dict[str, int]]:
    """``{"target": {name: bytes}, "forwarding_node": {name: bytes}}`` of the job's forwarded
    data requests (empty dicts for a job that did not go through the forwarding layer)."""
    out: dict[str, dict[str, int]] = {"target": {}, "forwarding_node": {}}
    for r in store.query(RESOURCE_SQL, {"job_id": job_id}):
        out[r["kind"]][r["name"]] = int(r["bytes"])
    return out
