"""The scale-out part of bench/ingest.py (issue 28): that many pipeline PROCESSES of one new
consumer group over the same topic, each on its own fresh chDB store, records/s summed and the
CPU us a record (see bench/ingest.py's doc, ``--processes``, ``--pin``)."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from pharos_core.process import freeze_startup_objects
from pharos_core.settings import Settings
from pharos_core.store import migrate, open_store
from pharos_pipeline.ingest import Pipeline


def process_worker(idx: int, settings: Settings, q, go, stop, cpu: int | None = None) -> None:
    """One pipeline process of :func:`process_rounds`: a fresh chDB store, the real Pipeline
    from ``go`` until ``stop``; its stored records go to ``q`` every 0.1 s as (idx, time, n, CPU s
    of the process so far: its threads, chDB's and librdkafka's).
    ``cpu``: run on that core only (its threads, chDB's and librdkafka's, too)."""
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    store = open_store(settings)
    try:
        migrate(store)
        pipe = Pipeline(settings, store)
        freeze_startup_objects()  # as the pipeline processes do
        q.put((idx, time.time(), 0, time.process_time()))
        go.wait()
        last = 0.0
        try:
            while not stop.is_set():
                pipe.process_once(0.2)
                if time.monotonic() - last >= 0.1:
                    last = time.monotonic()
                    q.put((idx, time.time(), pipe.stats()["records"], time.process_time()))
            q.put((idx, time.time(), pipe.stats()["records"], time.process_time()))
        finally:
            pipe.close()
    finally:
        store.close()


def process_phase(
    settings: Settings, root: Path, procs: int, total: int, tag: str, pin: bool = False
) -> tuple[float, float]:
    """``procs`` pipeline processes of a new group over the whole topic (see the module doc):
    records/s summed over them from the time all have stored something to the last record, and
    the CPU us a record they spent meanwhile (summed CPU over summed records: what a record costs
    whatever the cores; equal for 1 and 2 processes when nothing is lost to coordination).
    ``pin``: process i runs on the i-th core this one may use (round robin)."""
    import multiprocessing as mp
    import os
    import queue

    cpus = sorted(os.sched_getaffinity(0))

    ctx = mp.get_context("spawn")
    q, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    group = f"bench-{tag}-{time.time_ns()}"
    workers = []
    for i in range(procs):
        s = settings.model_copy(update={"consumer_group": group, "state_dir": root / f"{tag}-{i}"})
        cpu = cpus[i % len(cpus)] if pin else None
        w = ctx.Process(target=process_worker, args=(i, s, q, go, stop, cpu), daemon=True)
        w.start()
        workers.append(w)
    seen: dict[int, tuple[float, int, float]] = {}
    try:
        deadline = time.monotonic() + 120
        while len(seen) < procs and time.monotonic() < deadline:  # stores migrated
            idx, t, n, c = q.get(timeout=120)
            seen[idx] = (t, n, c)
        go.set()
        start: tuple[float, int, float] | None = None
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            try:
                idx, t, n, c = q.get(timeout=1.0)
            except queue.Empty:
                continue
            seen[idx] = (t, n, c)
            done, cpu = sum(v[1] for v in seen.values()), sum(v[2] for v in seen.values())
            if start is None and all(v[1] > 0 for v in seen.values()):
                start = (t, done, cpu)
            if done >= total:
                break
        else:
            raise SystemExit(f"{procs} process(es): {sum(v[1] for v in seen.values()):,} of {total:,} in 900 s")
        assert start is not None
        if done == start[1] or t == start[0]:
            raise SystemExit(f"{procs} process(es) stored all in their first polls: too few --records to time")
        return (done - start[1]) / (t - start[0]), (cpu - start[2]) / (done - start[1]) * 1e6
    finally:
        stop.set()
        for w in workers:
            w.join(60)
            if w.is_alive():
                w.kill()


def process_rounds(a: argparse.Namespace, settings: Settings, root: Path, total: int) -> list[dict[int, float]]:
    """Per round, :func:`process_phase` for each count of ``--processes`` (order alternating):
    {count: records/s, -count: CPU us a record} per round."""
    counts = [int(x) for x in a.processes.split(",") if x]
    rows = []
    for r in range(a.rounds):
        row: dict[int, float] = {}
        for n in counts if r % 2 == 0 else counts[::-1]:
            row[n], row[-n] = process_phase(settings, root / f"procs{r}", n, total, f"p{n}r{r}", a.pin)
            shutil.rmtree(root / f"procs{r}", ignore_errors=True)
        rows.append(row)
        base = row.get(1)
        print(
            f"round {r + 1}: "
            + ", ".join(
                f"{n} process(es) {row[n]:,.0f} rec/s ({row[-n]:.2f} CPU us a record)"
                + (f" ({row[n] / base:.2f}x)" if base and n != 1 else "")
                for n in counts
            ),
            flush=True,
        )
    return rows
