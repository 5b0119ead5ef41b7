"""A simulated machine's load on the real Kafka and the real pipeline (issue 28, items 1-2).

N compute nodes' eBPF agents (client layer), F forwarding daemons (forwarder layer) in front of T
storage targets, and J concurrent jobs of the shapes in ``bench/simkit.py`` (taken from real
Darshan logs and Pharos's own fio and MPI-IO runs; ``--derive-shapes`` re-derives the Darshan
rows) produce ``IoBatch`` messages as the agents and daemons do (topic ``pharos.io.requests``,
key = producer id, seq rising per producer, one batch per producer per 200 ms tick, empty
heartbeat batches every 2 s of idleness), and ``pharos run``'s job start and end events
(``pharos.jobs``). Defaults: 40,960 compute nodes and 240 forwarding nodes (Sunway TaihuLight,
Beacon NSDI'19), 1,280 targets, 2,000 jobs, 4 ranks per node.

It starts a real Kafka (``--brokers 1``: :class:`pharos_pipeline.broker.KafkaBroker`; ``3``: the
3-node :class:`~pharos_pipeline.broker.KafkaCluster`, loopback), and for each count in
``--pipelines`` (e.g. ``1,2``: side by side in one run, one phase after the other, each
``--minutes`` long) that many pipeline PROCESSES (:class:`pharos_pipeline.ingest.Pipeline`, one
consumer group, the requests topic's ``--partitions`` shared), each on its own fresh chDB store:
chDB lets one process open a data directory, so with 2 processes the records are sharded over 2
stores, as two consumers of a ClickHouse server would share it (docs/operations.md, "more
consumers"). The first process also runs the detection loop
(:class:`pharos_analytics.alerts.DetectionLoop`) and a dry-run control loop
(:class:`pharos_analytics.control.loop.ControlLoop`) every their period, as ``pharos serve``
does, and times each cycle.

Time: the simulated machine runs at ``--rate-fraction`` of real time (a tick of 200 ms of the
machine's records every 0.2 / X s of wall time; records stamped with the wall time); 0 = as
fast as this host generates (the ingest capacity, lag grows). Generation is cheap: a few ticks
are built once per run and re-stamped (times, seq) with numpy; said in the output.

Printed: records/s produced and ingested (per process and total, from each process's stored
count), the scale-out ratio, the consumer lag (messages; committed offsets of the group vs high
watermarks, AdminClient) at the start and end of each phase, RSS (MB) of every process, cycle
times, and last::

    simulate: nodes N, records/s R, lag start/end A/B, detection cycle D s (period P s), control cycle C s

(R: records/s ingested in the last phase; D, C: the slowest cycle; n/a when none ran).
Everything stops by itself; tmp dirs are removed unless ``--keep``; every child is killed on
exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "tests"))  # appended: tests/darshan must not hide PyDarshan
sys.path.insert(0, str(REPO / "bench"))

import simkit  # noqa: E402
from pharos_testkit import kafka_bootstrap  # noqa: E402

from pharos_core.settings import Settings  # noqa: E402
from pharos_pipeline.wire import JobEvent  # noqa: E402

MB = 1 << 20


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (/proc/<pid>/status VmRSS), 0 when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss_mb(pid: int) -> float:
    """RSS of ``pid`` and its children (a Kafka broker is a java child of nothing else)."""
    total = rss_mb(pid)
    for c in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in c.read_text().split():
            total += tree_rss_mb(int(child))
    return total


# -- a pipeline process -----------------------------------------------------------------------


def _time_cycles(store, settings: Settings, stop: threading.Event, out: dict) -> None:
    """Runs one detection and one dry-run control cycle every their period until ``stop``; appends
    each cycle's seconds to ``out['detection']`` / ``out['control']``."""
    from pharos_analytics.alerts import DetectionLoop
    from pharos_analytics.control.config import ControlConfig
    from pharos_analytics.control.loop import ControlLoop
    from pharos_analytics.diagnosis_config import DiagnosisConfig

    det = DetectionLoop(store, DiagnosisConfig)
    ccfg = ControlConfig(dry_run=True, http_timeout_s=0.5)
    ctl = ControlLoop(store, settings, lambda: ccfg, detector=det)
    out["detect_period_s"], out["control_period_s"] = det.period_s, ctl.period_s
    nxt = {"detection": time.monotonic() + det.period_s, "control": time.monotonic() + ctl.period_s}
    while not stop.wait(0.2):
        for name, fn, period in (("detection", det.run_once, det.period_s), ("control", ctl.cycle, ctl.period_s)):
            if period and time.monotonic() >= nxt[name]:
                t = time.perf_counter()
                try:
                    fn()
                    out[name].append(time.perf_counter() - t)
                except Exception as exc:  # recorded, never hidden: a failed cycle is no timing
                    out.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
                nxt[name] = time.monotonic() + period


def pipeline_worker(idx: int, settings: Settings, q, stop, cycles: bool) -> None:
    """One pipeline process: a fresh chDB store in ``settings.state_dir``, the real Pipeline until
    ``stop``; every second its counters go to ``q``, at the end its store's own counts."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    from pharos_core.process import freeze_startup_objects
    from pharos_core.store import migrate, open_store
    from pharos_pipeline.ingest import Pipeline

    store = open_store(settings)
    migrate(store)
    pipe = Pipeline(settings, store)
    freeze_startup_objects()  # as the pipeline processes do
    timing = {"detection": [], "control": []}
    tstop = threading.Event()
    th = threading.Thread(target=_time_cycles, args=(store, settings, tstop, timing), daemon=True) if cycles else None
    if th:
        th.start()
    last = 0.0
    try:
        while not stop.is_set():
            pipe.process_once(0.5)
            if time.monotonic() - last >= 1.0:
                last = time.monotonic()
                s = pipe.stats()
                q.put(("stats", idx, time.time(), s["records"], s["batches"], s["duplicates_skipped"], s["gaps"]))
    finally:
        tstop.set()
        if th:
            th.join(60)
        pipe.close()
        r = store.query(
            "SELECT count() AS n, uniqExact(producer_id, seq, record_index) AS u, "
            "countIf(layer = 'forwarder') AS fwd FROM io_requests"
        )[0]
        b = store.query("SELECT uniqExact(producer_id, seq) AS b FROM io_batches")[0]
        e = store.query("SELECT count() AS e FROM job_events FINAL")[0]
        s = pipe.stats()
        q.put(("final", idx, int(r["n"]), int(r["u"]), int(r["fwd"]), int(b["b"]), int(e["e"]), s["gaps"], timing))
        store.close()


# -- the main process -------------------------------------------------------------------------


def group_lag(settings: Settings, group: str) -> int | None:
    """Messages of the requests topic not committed by ``group``: high watermark minus committed
    offset (the low watermark where the group has none), summed over partitions; None when
    Kafka did not answer."""
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    parts = [TopicPartition(settings.topic_requests, p) for p in range(settings.topic_partitions)]
    try:
        fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])
        committed = {tp.partition: tp.offset for tp in fut[group].result(10).topic_partitions}
        c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group + "-lag"})
        try:
            lag = 0
            for tp in parts:
                low, high = c.get_watermark_offsets(tp, timeout=10)
                off = committed.get(tp.partition, -1)
                lag += max(0, high - (off if off >= 0 else low))
            return lag
        finally:
            c.close()
    except Exception:  # the broker is busy or away: no value, said as n/a
        return None


def start_group_at_end(settings: Settings, group: str) -> None:
    """Commits ``group``'s offsets of the requests topic at its high watermarks, so a phase's new
    group reads the load from now on (an earlier phase's records are not its backlog); the jobs
    topic it reads from the start (the jobs' start events)."""
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group + "-probe"})
    try:
        parts = []
        for p in range(settings.topic_partitions):
            tp = TopicPartition(settings.topic_requests, p)
            parts.append(TopicPartition(settings.topic_requests, p, c.get_watermark_offsets(tp, timeout=10)[1]))
    finally:
        c.close()
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])[group].result(30)


class Generator:
    """Produces the machine's ticks at the wall rate of ``fraction`` (0: as fast as it can) with one
    confluent-kafka Producer (the agents' producer settings: idempotent, acks=all, zstd)."""

    def __init__(self, settings: Settings, machine: simkit.Machine, fraction: float) -> None:
        from confluent_kafka import Producer

        self.settings, self.m, self.fraction = settings, machine, fraction
        self.p = Producer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "zstd",
                "queue.buffering.max.kbytes": 1 << 20,
            }
        )
        self.records = self.messages = self.heartbeats = 0
        self.failed: list[str] = []

    def _send(self, topic: str, key: bytes, value: bytes) -> None:
        while True:
            try:
                self.p.produce(topic, key=key, value=value, on_delivery=self._delivered)
                return
            except BufferError:
                self.p.poll(0.05)

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.failed.append(str(err))

    def events(self, kind: int) -> None:
        now = time.time_ns()
        for job in self.m.jobs:
            self._send(self.settings.topic_jobs, job.job_id.encode(), simkit.job_event(job, kind, now))
        self.p.flush(60)

    def run(self, seconds: float, stop: threading.Event) -> float:
        """Ticks for ``seconds`` of wall time; returns the seconds it took."""
        period = simkit.TICK_NS / 1e9 / self.fraction if self.fraction > 0 else 0.0
        t0 = time.monotonic()
        nxt = t0
        while time.monotonic() - t0 < seconds and not stop.is_set():
            msgs, recs = self.m.tick(time.time_ns())
            for key, value in msgs:
                self._send(self.settings.topic_requests, key, value)
            self.p.poll(0)
            self.records += recs
            self.messages += len(msgs)
            if period:
                nxt += period
                time.sleep(max(0.0, nxt - time.monotonic()))
        self.p.flush(120)
        return time.monotonic() - t0


def run_phase(
    a,
    settings: Settings,
    root: Path,
    gen: Generator,
    pipes: int,
    stop: threading.Event,
    kafka_pids: list[int],
    last_phase: bool,
) -> dict:
    """One phase: ``pipes`` pipeline processes of a new group, the load for ``--minutes``, then a
    bounded drain. Returns its figures."""
    group = f"sim-{pipes}p-{time.time_ns()}"
    start_group_at_end(settings, group)
    ctx = mp.get_context("spawn")
    q, pstop = ctx.Queue(), ctx.Event()
    procs = []
    for i in range(pipes):
        s = settings.model_copy(
            update={"consumer_group": group, "state_dir": root / f"store-{pipes}p-{i}", "consumer_instance_id": ""}
        )
        p = ctx.Process(target=pipeline_worker, args=(i, s, q, pstop, i == 0), daemon=True)
        p.start()
        procs.append(p)
    last: dict[int, tuple] = {}
    first: dict[int, tuple] = {}
    finals: dict[int, tuple] = {}
    rss: dict[str, float] = {}

    def drain_queue(timeout: float = 0.0) -> None:
        try:
            while True:
                m = q.get(timeout=timeout)
                if m[0] == "stats":
                    first.setdefault(m[1], m)
                    last[m[1]] = m
                else:
                    finals[m[1]] = m
        except queue.Empty:
            pass

    try:
        t_join = time.monotonic()
        while len(first) < pipes and time.monotonic() - t_join < 120:  # processes up, stores migrated
            drain_queue(0.5)
        r0 = gen.records
        lag_start = group_lag(settings, group)
        res = {"pipes": pipes, "lag_start": lag_start}
        gen_box: dict = {}
        th = threading.Thread(target=lambda: gen_box.update(dt=gen.run(a.minutes * 60, stop)), daemon=True)
        tstart = time.time()
        th.start()
        base = {i: m[3] for i, m in last.items()}
        while th.is_alive():
            th.join(1.0)
            drain_queue()
            for p in procs:
                rss[f"pipeline{procs.index(p)}"] = max(rss.get(f"pipeline{procs.index(p)}", 0), rss_mb(p.pid))
            rss["simulate"] = max(rss.get("simulate", 0), rss_mb(os.getpid()))
            for i, pid in enumerate(kafka_pids):
                rss[f"kafka{i}"] = max(rss.get(f"kafka{i}", 0), tree_rss_mb(pid))
        tend = time.time()
        if last_phase:
            gen.events(JobEvent.KIND_END)
        drain_queue()
        lag_end = group_lag(settings, group)
        ingested = {i: last[i][3] - base.get(i, 0) for i in last}
        res.update(
            lag_end=lag_end,
            seconds=tend - tstart,
            produced=(gen.records - r0) / gen_box.get("dt", tend - tstart),
            ingested={i: n / (tend - tstart) for i, n in ingested.items()},
        )
        # drain what is left (bounded), then stop the pipelines and collect their stores' counts
        t = time.monotonic()
        while time.monotonic() - t < a.drain_s:
            lag = group_lag(settings, group)
            if lag == 0:
                break
            drain_queue(1.0)
        res["lag_after_drain"] = group_lag(settings, group)
    finally:
        pstop.set()
        t = time.monotonic()
        while len(finals) < pipes and time.monotonic() - t < 120 and any(p.is_alive() for p in procs):
            drain_queue(0.5)
        drain_queue()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    res["rss_mb"] = rss
    res["finals"] = finals
    return res


def start_kafka(a, root: Path) -> tuple[Settings, object]:
    from pharos_pipeline.broker import embedded_kafka, ensure_topics

    settings = Settings(
        kafka_bootstrap=kafka_bootstrap(a.brokers),
        kafka_brokers=a.brokers,
        kafka_home=REPO / "build" / "kafka",
        state_dir=root / "state",
        topic_partitions=a.partitions,
    )
    broker = embedded_kafka(settings, root / "kafka")
    broker.start(timeout=240)
    ensure_topics(settings)
    return settings, broker


def kafka_pids(broker) -> list[int]:
    nodes = getattr(broker, "nodes", [broker])
    return [p for p in (n.running_pid() for n in nodes) if p]


def derive_shapes(logs: Path) -> None:
    """Prints the Darshan rows of simkit.SHAPES, derived again from the logs."""
    for name, rel in simkit.DARSHAN_SOURCES.items():
        print(repr(simkit.shape_from_darshan(logs / rel, name)))


def fmt(v, spec: str = ",.0f") -> str:
    return "n/a" if v is None else format(v, spec)


def report(a, machine: simkit.Machine, gen: Generator, phases: list[dict]) -> None:
    real = machine.records_per_tick() * 1e9 / simkit.TICK_NS
    print(
        f"machine: {a.nodes:,} compute nodes, {a.forwarders} forwarding nodes, {a.targets} targets, "
        f"{len(machine.jobs):,} jobs, {a.ranks_per_node} ranks/node; real-time rate {real:,.0f} records/s "
        f"(client + forwarder layers); generated at "
        + (f"{a.rate_fraction:g} of real time" if a.rate_fraction > 0 else "the generator's top speed")
        + f" from {len(machine.plans)} pre-built ticks re-stamped (times, seq)"
    )
    print(
        f"{'pipelines':>9} {'produced/s':>12} {'ingested/s':>12} {'per process':>26} {'lag start':>10} {'lag end':>9} {'after drain':>11}"
    )
    for ph in phases:
        per = " ".join(f"{v:,.0f}" for _, v in sorted(ph["ingested"].items()))
        print(
            f"{ph['pipes']:>9} {ph['produced']:>12,.0f} {sum(ph['ingested'].values()):>12,.0f} {per:>26} "
            f"{fmt(ph['lag_start']):>10} {fmt(ph['lag_end']):>9} {fmt(ph['lag_after_drain']):>11}"
        )
        print("   RSS MB (max): " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(ph["rss_mb"].items())))
        for i, f in sorted(ph["finals"].items()):
            print(
                f"   store {i}: {f[2]:,} records ({f[3]:,} distinct, {f[4]:,} forwarder), {f[5]:,} batches, "
                f"{f[6]} job events, {f[7]} gaps"
            )
    if len(phases) > 1:
        one = sum(phases[0]["ingested"].values())
        for ph in phases[1:]:
            tot = sum(ph["ingested"].values())
            print(f"scale-out: {ph['pipes']} processes / {phases[0]['pipes']}: {tot / one if one else 0:.2f}x")
    print(f"produced in all: {gen.records:,} records in {gen.messages:,} messages; delivery failures {len(gen.failed)}")
    last = phases[-1]
    timing = last["finals"].get(0, (None,) * 8 + ({},))[8]
    for e in timing.get("errors", [])[:5]:
        print(f"   cycle error: {e}")
    det, ctl = timing.get("detection") or [], timing.get("control") or []
    print(
        f"cycles: detection {len(det)} ({', '.join(f'{x:.2f}' for x in det)} s), "
        f"control {len(ctl)} ({', '.join(f'{x:.2f}' for x in ctl)} s)"
    )
    print(
        f"simulate: nodes {a.nodes}, records/s {sum(last['ingested'].values()):.0f}, "
        f"lag start/end {fmt(last['lag_start'], 'd')}/{fmt(last['lag_end'], 'd')}, "
        f"detection cycle {fmt(max(det) if det else None, '.2f')} s (period {fmt(timing.get('detect_period_s'), 'g')} s), "
        f"control cycle {fmt(max(ctl) if ctl else None, '.2f')} s"
    )


def result(a, machine: simkit.Machine, phases: list[dict]) -> dict:
    """The last phase's figures as ``--json`` writes them (bench/growth.py reads them)."""
    last = phases[-1]
    timing = last["finals"].get(0, (None,) * 8 + ({},))[8]
    return {
        "nodes": a.nodes,
        "forwarders": a.forwarders,
        "targets": a.targets,
        "jobs": len(machine.jobs),
        "rate_fraction": a.rate_fraction,
        "minutes": a.minutes,
        "real_time_records_per_s": machine.records_per_tick() * 1e9 / simkit.TICK_NS,
        "pipelines": last["pipes"],
        "produced_per_s": last["produced"],
        "ingested_per_s": sum(last["ingested"].values()),
        "lag_start": last["lag_start"],
        "lag_end": last["lag_end"],
        "lag_after_drain": last["lag_after_drain"],
        "rss_mb": last["rss_mb"],
        "stored_records": sum(f[2] for f in last["finals"].values()),
        "detection_s": timing.get("detection") or [],
        "control_s": timing.get("control") or [],
        "detect_period_s": timing.get("detect_period_s"),
        "cycle_errors": timing.get("errors", []),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=40_960, help="compute nodes, one agent each (TaihuLight: 40,960)")
    ap.add_argument("--forwarders", type=int, default=240, help="forwarding nodes, one daemon each (TaihuLight: 240)")
    ap.add_argument("--targets", type=int, default=1280, help="storage targets (OSTs) behind the forwarding nodes")
    ap.add_argument("--jobs", type=int, default=2000, help="concurrent jobs (at most --nodes)")
    ap.add_argument(
        "--ranks-per-node", type=int, default=4, help="MPI ranks per compute node (one per SW26010 core group)"
    )
    ap.add_argument("--minutes", type=float, default=3.0, help="length of each phase's load, minutes")
    ap.add_argument(
        "--rate-fraction",
        type=float,
        default=0.05,
        help="the simulated machine's time as a fraction of real time (1 = real time); 0 = as fast as it generates",
    )
    ap.add_argument("--brokers", type=int, choices=(1, 3), default=1, help="one Kafka broker or the 3-node cluster")
    ap.add_argument(
        "--pipelines", default="1", help="pipeline process counts, one phase each, e.g. 1,2 (side by side in one run)"
    )
    ap.add_argument("--partitions", type=int, default=12, help="partitions of pharos.io.requests")
    ap.add_argument("--variants", type=int, default=4, help="different 200 ms ticks pre-built and cycled")
    ap.add_argument("--drain-s", type=float, default=60.0, help="after the load, at most this long to drain the lag, s")
    ap.add_argument("--seed", type=int, default=1, help="seed of job placement and the records (deterministic)")
    ap.add_argument("--keep", action="store_true", help="keep the tmp dir (Kafka data, stores)")
    ap.add_argument("--derive-shapes", metavar="DARSHAN_DIR", type=Path, help="print the Darshan shapes and exit")
    ap.add_argument("--json", type=Path, help="also write the last phase's figures to this file (bench/growth.py)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import random

    a = parse_args(argv)
    if a.derive_shapes:
        derive_shapes(a.derive_shapes)
        return 0
    counts = [int(x) for x in a.pipelines.split(",") if x]
    t = time.perf_counter()
    jobs = simkit.place_jobs(a.nodes, a.jobs, a.ranks_per_node, random.Random(a.seed))
    machine = simkit.Machine(a.nodes, a.forwarders, a.targets, jobs, a.seed, a.variants)
    print(
        f"built {len(machine.plans)} ticks of {machine.records_per_tick():,.0f} records in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    root = Path(tempfile.mkdtemp(prefix="pharos-simulate-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    broker = gen = None
    try:
        settings, broker = start_kafka(a, root)
        print(f"kafka: {a.brokers} broker(s) on {settings.kafka_bootstrap}, {a.partitions} partitions", flush=True)
        gen = Generator(settings, machine, a.rate_fraction)
        gen.events(JobEvent.KIND_START)
        phases = []
        for n in counts:
            print(f"phase: {n} pipeline process(es), {a.minutes:g} min", flush=True)
            phases.append(run_phase(a, settings, root, gen, n, stop, kafka_pids(broker), n is counts[-1]))
        report(a, machine, gen, phases)
        if a.json:
            a.json.write_text(json.dumps(result(a, machine, phases), indent=1))
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        stop.set()
        for c in mp.active_children():
            c.kill()
        gen = None  # the producer goes before the brokers (no reconnect noise)
        if broker is not None:
            broker.stop()
        if a.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
