"""Rows of the store for the control-loop tests: job events and forwarder-layer requests of a
job whose pattern, volume, metadata and ranks are chosen (what the real forwarder writes)."""

from __future__ import annotations

NS = 1_000_000_000
MiB = 1 << 20


def dt(ns: int) -> str:
    return f"{ns // NS}.{ns % NS:09d}"


def job_events(
    job_id: str,
    start_ns: int,
    end_ns: int | None,
    name: str,
    user: str = "alice",
    command: list[str] | None = None,
    ranks: int = 4,
) -> list[dict]:
    rows = []
    for kind, t in (("start", start_ns), ("end", end_ns)):
        if t is None:
            continue
        rows.append(
            {
                "job_id": job_id,
                "kind": kind,
                "time": dt(t),
                "name": name,
                "command": command or [name],
                "user": user,
                "ranks": ranks,
                "host": "cn0",
                "exit_code": 0,
                "cgroup": "",
            }
        )
    return rows


def requests(
    job_id: str,
    start_ns: int,
    ranks: int,
    per_rank: int,
    req_bytes: int = MiB,
    shared_file: bool = False,
    fwd: str = "fwd0",
    span_s: float = 10.0,
    metadata_per_rank: int = 0,
) -> list[dict]:
    """Forwarder-layer rows: each rank writes ``per_rank`` requests of ``req_bytes`` (its own file:
    N-N, or one shared file: N-1) spread over ``span_s``, plus ``metadata_per_rank`` stats."""
    rows = []
    n = ranks * (per_rank + metadata_per_rank)
    k = 0
    for r in range(ranks):
        path = f"/pfs/{job_id}/out" if shared_file else f"/pfs/{job_id}/out.{r}"
        for i in range(per_rank + metadata_per_rank):
            t = start_ns + int(span_s * NS * k / max(n, 1))
            k += 1
            meta = i >= per_rank
            rows.append(
                {
                    "start": dt(t),
                    "end": dt(t + 1000),
                    "duration_ns": 1000,
                    "layer": "forwarder",
                    "host": fwd,
                    "job_id": job_id,
                    "rank": r,
                    "pid": 1000 + r,
                    "tid": 1000 + r,
                    "comm": "app",
                    "op": "stat" if meta else "write",
                    "file_type": "regular",
                    "dev": 0,
                    "inode": 0,
                    "path": path,
                    "fd": 3,
                    "offset": (r * per_rank + i) * req_bytes if shared_file else i * req_bytes,
                    "size": 0 if meta else req_bytes,
                    "result": 0 if meta else req_bytes,
                    "count": 1,
                    "bytes": 0 if meta else req_bytes,
                    "compute_node": "cn0",
                    "forwarding_node": fwd,
                    "target": "" if meta else f"ost{r % 8}",
                    "object_id": 0,
                    "queue_wait_ns": 0,
                    "producer_id": f"test:{fwd}",
                    "seq": k,
                    "record_index": 0,
                }
            )
    return rows
