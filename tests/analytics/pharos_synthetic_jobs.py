"""Synthetic jobs for the analytics and API tests: a real chDB store with exact numbers.

chDB allows one open data directory per process at a time: the fixtures build one store
per test module and close it at the module's end, so later tests (the pipeline's) can open
theirs. Times are relative to now: io_requests has a 90-day TTL, so rows dated 1970 vanish at the
first merge. Shared by tests/analytics and tests/api (the API tests put this folder on
sys.path).
"""

from __future__ import annotations

import time
from pathlib import Path

from pharos_core.settings import Settings
from pharos_core.store import Store, migrate, ns_to_datetime64, open_store

S = 1_000_000_000
T0 = (int(time.time()) - 3600) * S  # an hour ago, whole second
MiB = 1 << 20


def rec(
    job,
    rank,
    op,
    path,
    size,
    result,
    count=1,
    *,
    ftype="regular",
    start=1.0,
    end=None,
    dur=0.0,
    layer="client",
    dev=1,
    inode=None,
    producer="agent-1",
):
    """One io_requests row; start/end/dur in seconds after T0; bytes as the pipeline computes it."""
    end = start if end is None else end
    return {
        "start": ns_to_datetime64(T0 + int(start * S)),
        "end": ns_to_datetime64(T0 + int(end * S)),
        "duration_ns": int(dur * S),
        "layer": layer,
        "host": "cn01",
        "job_id": job,
        "rank": rank,
        "pid": 100 + rank,
        "tid": 100 + rank,
        "comm": "ior",
        "op": op,
        "file_type": ftype,
        "dev": dev,
        "inode": inode if inode is not None else abs(hash(path)) % 100000,
        "path": path,
        "fd": 3,
        "offset": 0,
        "size": size,
        "result": result,
        "count": count,
        "bytes": max(result, 0) * count,
        "producer_id": producer,
    }


def event(job, kind, at, *, name="", user="alice", ranks=0, exit_code=0, command=()):
    return {
        "job_id": job,
        "kind": kind,
        "time": ns_to_datetime64(T0 + int(at * S)),
        "name": name,
        "command": list(command),
        "user": user,
        "ranks": ranks,
        "host": "cn01",
        "exit_code": exit_code,
        "cgroup": f"pharos/job_{job}",
    }


# Job "mix": 4 ranks launched, 2 do data I/O, each to its own file (N-N), plus system
# files, a pipe, a terminal, metadata, block ops, a failed read and a forwarder record.
MIX_CLIENT = [
    rec("mix", 0, "write", "/scratch/a.0", MiB, MiB, 4, start=1, end=2, dur=0.5),
    rec("mix", 1, "write", "/scratch/a.1", 99, 99, 1, start=1, end=3, dur=0.1),
    rec("mix", 1, "pwrite", "/scratch/a.1", 100, 100, 2, start=3, end=4, dur=0.2),
    rec("mix", 0, "read", "/scratch/a.0", 1023, 1023, 3, start=5, end=6, dur=0.3),
    rec("mix", 0, "read", "/scratch/a.0", 1024, -5, 1, start=6, end=6.5, dur=0.05),  # EIO
    rec("mix", 0, "pread", "/scratch/a.0", 4 * MiB, 4 * MiB, 1, start=7, end=11, dur=1.0),
    rec("mix", 0, "read", "/usr/lib/libc.so.6", 832, 832, 2, start=1.5, end=1.6, dur=0.01),
    rec("mix", 1, "read", "/etc/passwd", 4096, 4096, 1, start=1.5, end=1.7, dur=0.02),
    rec("mix", 0, "write", "pipe:[123]", 10, 10, 5, ftype="pipe", start=0.5),
    rec("mix", 1, "write", "/dev/pts/0", 20, 20, 1, ftype="char_device", start=20),
    rec("mix", 0, "open", "/scratch/a.0", 0, 3, 1, start=0.9),
    rec("mix", 1, "stat", "/scratch", 0, 0, 1, ftype="directory", start=0.8),
    rec("mix", 0, "fsync", "/scratch/a.0", 0, 0, 1, start=12),
    rec("mix", -1, "block_write", "", 4096, 4096, 3, ftype="", start=13),
]
MIX_FORWARDER = [rec("mix", 0, "write", "/scratch/a.0", MiB, MiB, 10, layer="forwarder", start=2, end=4)]

# Job "n1": 3 ranks write one shared file (N-1); every rank also reads a library.
N1 = [rec("n1", r, "pwrite", "/scratch/shared", 4096, 4096, 8, start=11 + r) for r in range(3)] + [
    rec("n1", r, "read", "/lib64/ld.so", 832, 832, 1, start=11) for r in range(3)
]
# Job "nm": ranks 0,1 share f1, ranks 2,3 share f2 (N-M).
NM = [rec("nm", r, "write", f"/scratch/f{1 + r // 2}", 100, 100, 1, start=31) for r in range(4)]
# Job "one": one rank writes three files, one with no path (1-N).
ONE = [
    rec("one", 0, "write", "/scratch/o1", 10, 10, 1, start=41),
    rec("one", 0, "write", "/scratch/o2", 10, 10, 1, start=42),
    rec("one", 0, "write", "", 10, 10, 1, start=43, dev=5, inode=7),
]
# Job "orphan": records but no event.
ORPHAN = [rec("orphan", 0, "write", "/scratch/x", 1, 1, 1, start=50)]

EVENTS = [
    event("mix", "start", 0, name="ior", ranks=4, command=["ior", "-w", "-r"]),
    event("mix", "end", 100, exit_code=0),
    event("n1", "start", 10, name="n1", user="bob", ranks=3),
    event("failed", "start", 20, name="crash", ranks=2),
    event("failed", "end", 21, exit_code=2),
    event("nm", "start", 30, name="nm", ranks=4),
    event("nm", "end", 35, exit_code=0),
    event("one", "start", 40, name="one", ranks=1),
    event("one", "end", 45, exit_code=0),
]


def drops(producer, job, rb, df, od, uf, at):
    return {
        "producer_id": producer,
        "job_id": job,
        "ringbuf_drops": rb,
        "delivery_failures": df,
        "overflow_drops": od,
        "unmerged_fallbacks": uf,
        "updated": ns_to_datetime64(T0 + int(at * S)),
    }


DROPS = [
    drops("agent-1", "mix", 100, 100, 100, 100, 1),  # older, larger: must lose to the newer row
    drops("agent-1", "mix", 3, 2, 1, 7, 5),
    drops("agent-2", "mix", 5, 0, 0, 0, 3),
    drops("agent-1", "n1", 9, 9, 9, 9, 3),  # another job
]


def build_store(state_dir: Path) -> Store:
    """Open a chDB store in ``state_dir``, migrate it and load every synthetic job."""
    store = open_store(Settings(state_dir=state_dir))
    migrate(store)
    store.insert_rows("io_requests", MIX_CLIENT + MIX_FORWARDER + N1 + NM + ONE + ORPHAN)
    store.insert_rows("job_events", EVENTS)
    store.insert_rows("producer_drops", DROPS)
    store.insert_rows(
        "io_batches",
        [
            {"producer_id": "agent-1", "seq": s, "host": "cn01", "records": 5, "created": ns_to_datetime64(T0)}
            for s in (0, 1, 3)
        ]
        + [{"producer_id": "agent-2", "seq": 0, "host": "cn02", "records": 2, "created": ns_to_datetime64(T0)}],
    )
    store.insert_rows(
        "dead_letters",
        [
            {
                "time": ns_to_datetime64(T0),
                "topic": "pharos.io.requests",
                "partition": 0,
                "offset": 7,
                "error": "bad",
                "size": 3,
                "payload_head": "ffff",
            }
        ],
    )
    return store
