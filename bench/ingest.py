"""Ingest benchmark (issue 15): records/s from Kafka into the store with the real pipeline,
against the raw engine insert of the same rows, side by side in one run; and the pipeline's
rate while API-like queries run on the same store in a loop.

Starts a real Kafka broker (KRaft, loopback, the pinned jars in build/kafka) in a tmp dir and
produces ``--records`` records (agent-like IoBatch messages of ``--batch`` records: 64 ranks
writing 1 MiB requests to 8 files, plus opens and closes) to a 3-partition topic before any
timing; with ``--mix simulated`` instead the messages of a simulated machine of ``--mix-nodes``
compute nodes (bench/simkit.py: the record mix of real fio, MPI-IO and Darshan runs, one
message per agent or forwarding daemon per 200 ms, ~19 records each at 4,096 nodes, heartbeats),
the realistic mix of issue 28. Then, for each of ``--rounds`` rounds, on a fresh chDB store each:

* **pipeline**: a new consumer group reads the whole topic through
  :class:`pharos_pipeline.ingest.Pipeline` (decode, dedupe by (producer_id, seq), one insert per
  poll, markers, commit), timed from the first poll to the last record stored;
* **raw**: the same rows, already columnar in a Memory table of the same store, inserted with
  one ``INSERT INTO ... SELECT`` into an empty table of the io_requests schema: what the engine
  itself costs (sort, compress, write), the ceiling for any ingest path;
* **pipeline + queries** (``--with-queries``): the pipeline again while another thread runs a
  heavy API query (a job summary over all stored records and the system view) in a loop on
  the same store object, as the server's API threads do.

With ``--processes 1,2`` (and ``--brokers 3``: the 3-node KRaft cluster on loopback) it then
times, per round and count, that many pipeline PROCESSES of one new consumer group over the same
topic, each on its own fresh chDB store (chDB opens a data directory from one process; two
consumers of a ClickHouse server share it likewise), counts side by side in one run, alternating
their order by round: records/s from the moment every process has stored its first poll (the
group's join and rebalance left out) to the last record stored, summed over the processes, and
the scale-out ratio (2 processes / 1). Target (issue 28): >= 1.7x. With ``--pin`` each process
runs on one core of its own (``sched_setaffinity``), one process as two: the pipeline's own
scale-out, as with a core (or a host) per process, apart from what a host with fewer cores than
processes and brokers shares (the brokers still run on every core).

The messages are produced uncompressed in the batches one bulk producer fills, unless
``--compression`` (the agents' sink uses zstd) and ``--per-message`` (one message per Kafka record
batch, as each agent sends its 200 ms message alone) say otherwise. The pipeline freezes the
objects made before it out of the garbage collector's passes, as the pipeline processes do
(``--no-gc-freeze``: not; each round prints the collector's time).

Prints records/s of each and the ratios pipeline/raw and (pipeline + queries)/pipeline per
round, then their medians. Targets (issue 15): >= 500,000 records/s per pipeline process, >= 0.5
of raw, >= 0.8 of the idle rate with queries running.

With ``--stored N[,N...]`` it then times, on a chDB store holding N records (generated in the
store by SQL: jobs of 64 ranks, client and forwarder layers, 8 targets behind 4 forwarding
nodes, arriving at ``--stored-rate`` records/s until now), what users and the server wait for: the first six detection cycles after a start
(:class:`pharos_analytics.alerts.DetectionLoop`, fail-slow + interference + stragglers), the
job summary behind ``pharos job`` and the phases + insights behind ``pharos diagnose`` of one
job, ``GET /v1/forwarders``, and each query of the overview dashboard at its default range (6 h).
Targets (issue 15): each <= 1 s at 100 M records; (issue 28) ``pharos job`` and ``diagnose``
<= 1 s and the overview dashboard's queries <= 2 s at 1 B records. ``pharos job``, ``diagnose``
and ``GET /v1/forwarders`` run three times each (the median kept). With two sizes or more it
fits how each cost grows with the stored records (bench/growth.py's fit: the exponent k of
y ~ N^k and the best of a + b g(N)) and extrapolates the power law to 1 B and 10 B records where
not measured.

Usage: uv run python bench/ingest.py [--records 2000000] [--batch 1000 | --mix simulated] [--rounds 3]
                                     [--with-queries] [--stored 10000000] [--keep]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from pharos_testkit import free_port, kafka_bootstrap  # noqa: E402

from pharos_core.process import freeze_startup_objects  # noqa: E402
from pharos_core.settings import Settings  # noqa: E402
from pharos_core.store import migrate, open_store  # noqa: E402
from pharos_pipeline.broker import KafkaBroker, embedded_kafka, ensure_topics  # noqa: E402
from pharos_pipeline.ingest import Pipeline  # noqa: E402
from pharos_pipeline.wire import IoBatch  # noqa: E402
from pharos_pipeline.wire.pharos.v1 import io_pb2  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from ingest_scaleout import process_rounds  # noqa: E402
from ingest_stored import stored_growth, stored_queries  # noqa: E402

MiB = 1 << 20
ONE_BLOCK = "min_insert_block_size_rows = 1099511627776, min_insert_block_size_bytes = 1125899906842624"


def make_batches(records: int, per_batch: int, producers: int = 8) -> list[tuple[bytes, bytes]]:
    """(key, IoBatch bytes) messages: ``producers`` agents (one per compute node), each with
    its own seq; 64 ranks of job "bench" writing 1 MiB requests, an open and a close per file
    now and then (metadata records)."""
    t0 = time.time_ns() - 3600 * 10**9
    out, seqs, n = [], [0] * producers, 0
    while n < records:
        p = len(out) % producers
        b = IoBatch(schema_version=1, producer_id=f"cn{p:03d}:agent:1", seq=seqs[p], created_ns=t0, host=f"cn{p:03d}")
        seqs[p] += 1
        for _ in range(min(per_batch, records - n)):
            rank = 8 * p + n % 8
            start = t0 + n * 50_000
            op = io_pb2.OP_OPEN if n % 500 == 0 else io_pb2.OP_CLOSE if n % 500 == 499 else io_pb2.OP_PWRITE
            size = MiB if op == io_pb2.OP_PWRITE else 0
            b.records.add(
                start_ns=start,
                end_ns=start + 40_000,
                duration_ns=40_000,
                layer=io_pb2.LAYER_CLIENT,
                job_id="bench",
                rank=rank,
                pid=1000 + rank,
                tid=1000 + rank,
                comm="ior",
                op=op,
                dev=0x800001,
                inode=10_000 + rank % 8,
                path=f"/scratch/bench/out.{rank % 8}",
                file_type=io_pb2.FILE_TYPE_REGULAR,
                fd=3,
                offset=(n // 64) * MiB,
                size=size,
                result=size,
                count=1,
            )
            n += 1
        out.append((b.producer_id.encode(), b.SerializeToString()))
    return out


def simulated_batches(records: int, nodes: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """At least ``records`` records as a simulated machine of ``nodes`` compute nodes sends them
    (bench/simkit.py, TaihuLight's ratios as bench/growth.py: the record mix of real fio, MPI-IO
    and Darshan runs, client and forwarder layers, one message per producer per 200 ms tick,
    heartbeats of idle producers), an hour ago: (messages, records in them)."""
    import random

    sys.path.insert(0, str(REPO / "bench"))
    import growth
    import simkit

    m = growth.machine(nodes)
    jobs = simkit.place_jobs(nodes, m["jobs"], 4, random.Random(1))
    machine = simkit.Machine(nodes, m["forwarders"], m["targets"], jobs, 1, 4)
    out: list[tuple[bytes, bytes]] = []
    n, t = 0, time.time_ns() - 3_600_000_000_000
    while n < records:
        msgs, k = machine.tick(t)
        out += msgs
        n += k
        t += simkit.TICK_NS
    return out, n


def produce(
    settings: Settings, messages: list[tuple[bytes, bytes]], compression: str = "none", per_message: bool = False
) -> None:
    """Produce ``messages`` to the requests topic. ``compression``: the producer's
    ``compression.type`` (the agents' sink uses zstd); ``per_message``: one message per Kafka record
    batch, as each agent sends its 200 ms message alone (its linger is 5 ms), instead of the
    batches one bulk producer fills."""
    from confluent_kafka import Producer

    conf = {"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20, "acks": "all"}
    conf["compression.type"] = compression
    if per_message:
        conf |= {"batch.num.messages": 1, "linger.ms": 0}
    p = Producer(conf)
    failed = []
    for key, value in messages:
        while True:
            try:
                p.produce(
                    settings.topic_requests, key=key, value=value, on_delivery=lambda e, _m: e and failed.append(e)
                )
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    if p.flush(120) or failed:
        raise SystemExit(f"producing failed: {failed[:3]}")


class Queries(threading.Thread):
    """API-like queries on ``store`` in a loop until stopped: the job summary over every stored
    record of the job and the system view's per-layer totals."""

    SQL = (
        "SELECT rank, count() AS n, sum(bytes) AS b, quantiles(0.5, 0.99)(duration_ns) AS q "
        "FROM io_requests WHERE job_id = 'bench' GROUP BY rank ORDER BY rank",
        "SELECT layer, op, count() AS n, sum(bytes) AS b, uniqExact(path) AS files FROM io_requests GROUP BY layer, op",
    )

    def __init__(self, store) -> None:
        super().__init__(daemon=True)
        self.store, self.stop, self.done = store, threading.Event(), 0

    def run(self) -> None:
        while not self.stop.is_set():
            for q in self.SQL:
                self.store.query(q)
                self.done += 1


class GcClock:
    """Seconds the garbage collector ran while installed (``gc.callbacks``), all generations and
    the full (generation 2) collections apart."""

    def __init__(self) -> None:
        self.total = self.full = 0.0
        self._t = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
            return
        dt = time.perf_counter() - self._t
        self.total += dt
        if info["generation"] == 2:
            self.full += dt

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_) -> None:
        gc.callbacks.remove(self)


def run_pipeline(
    settings: Settings, store, total: int, tag: str, queries: bool, freeze: bool = True
) -> tuple[float, int, int, float, GcClock]:
    """The pipeline of a new group over the whole topic: (seconds, records stored in them,
    queries run meanwhile, CPU seconds of this process meanwhile: the pipeline's threads, chDB's
    and librdkafka's, the query thread's; the garbage collector's time meanwhile). The first
    poll (group join, partition assignment) is not timed. ``freeze``: the objects made so far
    frozen out of the garbage collector's passes once the pipeline is made, as the pipeline
    processes do (pharos_core.process)."""
    s = settings.model_copy(update={"consumer_group": f"bench-{tag}-{time.time_ns()}"})
    pipe = Pipeline(s, store)
    if freeze:
        freeze_startup_objects()
    q = Queries(store) if queries else None
    try:
        pipe.max_messages = 1  # the group joins, the first poll comes: one message, untimed
        while pipe.process_once(1.0) == 0:
            pass
        pipe.max_messages = s.pipeline_max_messages
        t, cpu, base = time.perf_counter(), time.process_time(), pipe.stats()["records"]
        if q:
            q.start()
        with GcClock() as clock:
            while pipe.stats()["records"] < total:
                pipe.process_once(0.5)
        dt, cpu = time.perf_counter() - t, time.process_time() - cpu
    finally:
        if q:
            q.stop.set()
            q.join()
        pipe.close()
    return dt, total - base, (q.done if q else 0), cpu, clock


def ingest_rounds(a: argparse.Namespace, root: Path) -> list[dict]:
    """The pipeline and raw rounds on a real broker (see the module doc)."""
    port, ctl = free_port(), free_port()
    settings = Settings(
        kafka_bootstrap=f"127.0.0.1:{port}" if a.brokers == 1 else kafka_bootstrap(a.brokers),
        kafka_brokers=a.brokers,
        kafka_home=REPO / "build" / "kafka",
        state_dir=root / "state",
        topic_requests="bench.io.requests",
        topic_jobs="bench.jobs",
        topic_deadletter="bench.io.deadletter",
        topic_target_metrics="bench.target.metrics",
        topic_partitions=3,
    )
    broker = (
        KafkaBroker(settings, root / "kafka", controller_port=ctl) if a.brokers == 1 else embedded_kafka(settings, root)
    )
    rows: list[dict] = []
    try:
        broker.start(timeout=240)
        ensure_topics(settings)
        t = time.perf_counter()
        if a.mix == "simulated":
            msgs, total = simulated_batches(a.records, a.mix_nodes)
        else:
            msgs, total = make_batches(a.records, a.batch), a.records
        produce(settings, msgs, a.compression, a.per_message)
        print(
            f"produced {total:,} records ({a.mix} mix) in {len(msgs):,} messages "
            f"({sum(len(v) for _, v in msgs) / MiB:.0f} MiB, compression {a.compression}"
            f"{', a batch per message' if a.per_message else ''}) in {time.perf_counter() - t:.1f} s"
        )
        del msgs  # in Kafka now: not the pipeline's objects (the garbage collector would walk them)
        if a.processes:
            return process_rounds(a, settings, root, total)
        for r in range(a.rounds):
            store_dir = root / f"store{r}"
            store = open_store(settings.model_copy(update={"state_dir": store_dir}))
            try:
                migrate(store)
                dt, n, _, cpu, gcs = run_pipeline(settings, store, total, f"r{r}", False, not a.no_gc_freeze)
                pipe_rate = n / dt
                store.command("CREATE TABLE mem AS io_requests ENGINE = Memory")
                store.command("INSERT INTO mem SELECT * FROM io_requests")
                store.command("CREATE TABLE raw AS io_requests")
                t = time.perf_counter()
                store.command(f"INSERT INTO raw SELECT * FROM mem SETTINGS {ONE_BLOCK}")
                raw_rate = total / (time.perf_counter() - t)
                n = int(store.query("SELECT count() AS n FROM raw")[0]["n"])
                assert n == total, (n, total)
                row = {"pipeline": pipe_rate, "raw": raw_rate, "cpu_us": cpu / n * 1e6}
                if a.with_queries:
                    store.command("TRUNCATE TABLE io_requests")
                    store.command("TRUNCATE TABLE io_batches")
                    dq, nq, done, _, _ = run_pipeline(settings, store, total, f"q{r}", True, not a.no_gc_freeze)
                    row["with_queries"] = nq / dq
                    row["queries"] = done / dq
                rows.append(row)
                extra = (
                    f"; with queries {row['with_queries']:,.0f} rec/s ({row['queries']:.1f} queries/s), "
                    f"{row['with_queries'] / pipe_rate:.2f} of idle"
                    if a.with_queries
                    else ""
                )
                print(
                    f"round {r + 1}: pipeline {pipe_rate:,.0f} rec/s ({row['cpu_us']:.2f} CPU us a record, "
                    f"{row['cpu_us'] * pipe_rate / 1e6:.2f} cores; gc {gcs.total:.2f} s, full {gcs.full:.2f} s), "
                    f"raw insert {raw_rate:,.0f} rec/s, "
                    f"pipeline/raw {pipe_rate / raw_rate:.2f}{extra}",
                    flush=True,
                )
            finally:
                store.close()
                shutil.rmtree(store_dir, ignore_errors=True)
    finally:
        broker.stop()
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=1000, help="records per IoBatch message (uniform mix)")
    ap.add_argument(
        "--mix",
        choices=("uniform", "simulated"),
        default="uniform",
        help="uniform: 64 ranks' 1 MiB writes, opens and closes in --batch-record messages; simulated: a "
        "simulated machine's messages (bench/simkit.py: real runs' record mix, a message per producer per 200 ms)",
    )
    ap.add_argument("--mix-nodes", type=int, default=4096, help="compute nodes of the simulated mix")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--processes", default="", help="comma list of pipeline process counts to time side by side, e.g. 1,2"
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="with --processes: each pipeline process on a core of its own (one core each, whatever the count: "
        "the scale-out of the pipeline itself, not of this host's cores shared with the brokers)",
    )
    ap.add_argument("--brokers", type=int, choices=(1, 3), default=1, help="one Kafka broker or the 3-node cluster")
    ap.add_argument(
        "--compression",
        choices=("none", "gzip", "snappy", "lz4", "zstd"),
        default="none",
        help="the producer's compression.type (the agents' sink: zstd)",
    )
    ap.add_argument(
        "--per-message",
        action="store_true",
        help="one message per Kafka record batch, as agents send theirs (one 200 ms message, linger 5 ms)",
    )
    ap.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="leave out the pipeline processes' gc.freeze after set-up (pharos_core.process): the figure before it",
    )
    ap.add_argument("--with-queries", action="store_true", help="also the pipeline beside a heavy query loop")
    ap.add_argument("--keep", action="store_true", help="keep the tmp dir")
    ap.add_argument("--stored", default="", help="comma list of stored-record counts to time queries on")
    ap.add_argument("--no-ingest", action="store_true", help="only the --stored part")
    ap.add_argument("--stored-dir", type=Path, help="keep (and reuse) the --stored stores in this directory")
    ap.add_argument(
        "--stored-rate", type=int, default=2000, help="records/s the stored records arrived at (sets their time span)"
    )
    a = ap.parse_args()
    if a.no_ingest:
        a.rounds = 0

    root = Path(tempfile.mkdtemp(prefix="pharos-bench-ingest-"))
    rows = ingest_rounds(a, root) if a.rounds else []
    stored = {}
    for n in [int(x) for x in a.stored.split(",") if x]:
        root.mkdir(parents=True, exist_ok=True)
        stored[n] = stored_queries(a.stored_dir or root, n, a.stored_rate, keep=a.stored_dir is not None)
        print(f"{n:,} records stored: " + ", ".join(f"{k} {v:.2f} s" for k, v in stored[n].items()), flush=True)
        shutil.rmtree(root, ignore_errors=True)
    if len(stored) >= 2:
        stored_growth(stored)
    if not rows:
        return
    if a.processes:
        counts = sorted(n for n in rows[0] if n > 0)
        med = {n: statistics.median(r[n] for r in rows) for n in rows[0]}
        line = ", ".join(f"{n} process(es) {med[n]:,.0f} rec/s ({med[-n]:.2f} CPU us a record)" for n in counts)
        if 1 in med and 2 in med:
            ratios = [r[2] / r[1] for r in rows]
            cpu = [r[-1] / r[-2] for r in rows]
            line += (
                f"; scale-out 2/1 {statistics.median(ratios):.2f}x "
                f"(range {min(ratios):.2f}-{max(ratios):.2f}; target >= 1.7); CPU a record 1/2 "
                f"{statistics.median(cpu):.2f} (range {min(cpu):.2f}-{max(cpu):.2f}: 1.0 = no cost of the second "
                "process but the cores it takes)"
            )
        print(f"median: {line}")
        return
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratios = [r["pipeline"] / r["raw"] for r in rows]
    print(
        f"median: pipeline {med['pipeline']:,.0f} rec/s (target >= 500,000; {med['cpu_us']:.2f} CPU us a record), "
        f"raw {med['raw']:,.0f} rec/s, "
        f"pipeline/raw {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}; target >= 0.5)"
    )
    if a.with_queries:
        q = [r["with_queries"] / r["pipeline"] for r in rows]
        print(f"with queries: {statistics.median(q):.2f} of idle (range {min(q):.2f}-{max(q):.2f}; target >= 0.8)")


if __name__ == "__main__":
    main()
