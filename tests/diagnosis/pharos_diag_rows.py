"""Row builders for the diagnosis tests: synthetic io_requests and job_events rows."""

from __future__ import annotations

import time

from pharos_core.store import ns_to_datetime64

S = 1_000_000_000
T0 = (int(time.time()) - 3600) * S
KiB, MiB = 1024, 1 << 20


def req(job, rank, op, path, offset, size, *, t, dur=0.001, count=1, layer="client", target="", ftype="regular"):
    """One io_requests row at T0 + t seconds."""
    start = T0 + int(t * S)
    return {
        "start": ns_to_datetime64(start),
        "end": ns_to_datetime64(start + int(dur * S)),
        "duration_ns": int(dur * S),
        "layer": layer,
        "host": "cn01",
        "job_id": job,
        "rank": rank,
        "pid": 100 + rank,
        "tid": 100 + rank,
        "comm": "app",
        "op": op,
        "file_type": ftype,
        "dev": 1,
        "inode": 0,
        "path": path,
        "fd": 3,
        "offset": offset,
        "size": size,
        "result": size,
        "count": count,
        "bytes": size * count,
        "target": target,
        "producer_id": "test",
        "seq": 0,
    }


def start_event(job, ranks):
    return {
        "job_id": job,
        "kind": "start",
        "time": ns_to_datetime64(T0),
        "name": job,
        "command": [job],
        "user": "alice",
        "ranks": ranks,
        "host": "cn01",
        "exit_code": 0,
        "cgroup": "",
    }


def ctr(job, module, rank, rid, path, counter, value):
    """One darshan_counters row of job ``job``'s log ``darshan:<job>``."""
    return {
        "job_id": job,
        "log_id": f"darshan:{job}",
        "module": module,
        "rank": rank,
        "record_id": rid,
        "path": path,
        "counter": counter,
        "value": float(value),
    }
