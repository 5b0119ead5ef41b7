"""Kafka as a cluster (issue 15, item 4), end to end with real components: the embedded stack
(``pharos up``) on a 3-node KRaft cluster on loopback (``kafka_brokers = 3``: topics with
replication factor 3, min.insync.replicas 2), the real eBPF agent producing with acks=all and
idempotence, the pipeline on chDB, and a traced fio job launched as ``pharos run`` does.

While the job writes, the broker leading the agent's requests partition is killed with
SIGKILL. Asserted once the pipeline has drained: every (producer_id, seq, record_index) stored
exactly once, no seq gap, the job's bytes equal to fio's. The killed broker is restarted at the
end and rejoins. Needs root (eBPF, cgroups); bounded (every wait has a timeout).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from pharos_testkit import LIVE_STACK_MARKS, kafka_bootstrap, kafka_jars, pharos_run, running_stack

from pharos_api.demo import FioJob, fio_command, fio_totals, wait_for_summary
from pharos_core.store import open_store
from pharos_pipeline.broker import KafkaCluster
from pharos_pipeline.stored import pipeline_stats

pytestmark = LIVE_STACK_MARKS

#: 4 ranks x 32 MiB at 3 MiB/s per rank: the job writes for about 11 s.
JOB = FioJob("N-N", 4, "--rw=write --bs=64k --size=32m --rate=3m --filename={dir}/data.$PHAROS_RANK")
KILL_AFTER_S = 3.0


def _high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kc-probe", "log_level": 0})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def _live(settings) -> dict:
    r = httpx.get(f"{settings.api_url}/v1/pipeline", timeout=10)
    r.raise_for_status()
    return r.json()["live"] or {}


def test_broker_killed_mid_job_every_record_stored_once(tmp_path: Path):
    kafka_home = kafka_jars()
    job_id = f"kcluster-{os.getpid()}"
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    overrides = {
        "kafka_bootstrap": kafka_bootstrap(3),
        "kafka_brokers": 3,
        "kafka_home": kafka_home,
        "fwd_nodes": 0,  # the agent is the producer under test; the job writes to a local folder
        "run_hint": False,
    }
    with running_stack(tmp_path / "state", "pharos-kc", {}, **overrides) as settings:
        cluster = KafkaCluster(settings)  # the nodes `pharos broker` started (their pid files)
        topic, parts = settings.topic_requests, settings.topic_partitions
        admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap, "log_level": 0})
        md = admin.list_topics(topic, timeout=10)
        assert set(md.brokers) == {1, 2, 3}
        assert all(len(p.replicas) == 3 for p in md.topics[topic].partitions.values())
        before = _high_watermarks(settings.kafka_bootstrap, topic, parts)

        out_dir = tmp_path / "out"
        argv, env = pharos_run(settings, job_id, fio_command(JOB, data_dir, "kc"), ranks=JOB.ranks, output_dir=out_dir)
        t0 = time.monotonic()
        job = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)  # `pharos run`, as a user types it
        try:
            # the agent keys its batches by producer id: one partition grows; kill its leader once
            # the job's batches flow (at least KILL_AFTER_S into the job; `pharos run` and fio take
            # a moment to start on a busy machine)
            deadline = time.monotonic() + 60
            while True:
                time.sleep(0.5)
                grown = _high_watermarks(settings.kafka_bootstrap, topic, parts)
                hot = max(grown, key=lambda p: grown[p] - before[p])
                flowing = grown[hot] - before[hot] >= 3 and time.monotonic() - t0 >= KILL_AFTER_S
                if flowing or time.monotonic() > deadline or job.poll() is not None:
                    break
            assert grown[hot] > before[hot], "the agent produced nothing"
            md = admin.list_topics(topic, timeout=10)
            leader = md.topics[topic].partitions[hot].leader
            victim = cluster.index_of(leader)
            assert job.poll() is None, "the job ended before the broker was killed"
            killed_pid = cluster.kill(victim)
            killed_at = time.monotonic() - t0
            assert killed_pid is not None
            print(
                f"\nkilled broker node {leader} (pid {killed_pid}, leader of {topic}[{hot}], "
                f"controller {md.controller_id}) at {killed_at:.1f} s"
            )

            assert job.wait(300) == 0, "pharos run (fio) failed"
        finally:
            if job.poll() is None:  # an assertion above failed: do not leave `pharos run` behind
                job.kill()
                job.wait()
        job_s = time.monotonic() - t0
        fio = fio_totals(sorted(out_dir.glob("rank_*.out")))
        assert fio["bytes_written"] == JOB.ranks * 32 * 2**20

        s = wait_for_summary(settings.api_url, job_id, fio["bytes_written"], timeout_s=240)
        assert s is not None, "the job never reached the API"
        # drained: the pipeline's committed offsets caught up with every partition
        deadline = time.monotonic() + 120
        live = _live(settings)
        while live.get("consumer_lag", 1) != 0 and time.monotonic() < deadline:
            time.sleep(1)
            live = _live(settings)
        drained_s = time.monotonic() - t0
        assert live.get("consumer_lag") == 0, live
        assert s["bytes_written"] == fio["bytes_written"]
        assert s["dropped_records"] == 0

        cluster.restart(victim, timeout=180)
        assert set(admin.list_topics(timeout=10).brokers) == {1, 2, 3}
    cluster.stop()  # `pharos broker` stopped every node, the restarted one too: a no-op unless one was left

    store = open_store(settings)
    try:
        dup = store.query(
            "SELECT count() AS n, uniqExact(producer_id, seq, record_index) AS u, uniqExact(producer_id) AS p "
            "FROM io_requests"
        )[0]
        job_bytes = store.query(
            "SELECT sum(bytes) AS b, count() AS n FROM io_requests "
            f"WHERE job_id = '{job_id}' AND layer = 'client' AND file_type = 'regular' "
            "AND op IN ('write', 'pwrite', 'writev')"
        )[0]
        stats = pipeline_stats(store)
    finally:
        store.close()
    print(
        f"job {job_s:.1f} s, drained at {drained_s:.1f} s; fio wrote {fio['bytes_written']} B in {fio['writes']} "
        f"writes; stored {job_bytes['b']} B of the job in {job_bytes['n']} records; io_requests {dup['n']} rows, "
        f"{dup['u']} distinct (producer_id, seq, record_index), {dup['p']} producers; batches {stats['batches']}, "
        f"missing {stats['missing_batches']}; live: duplicates_skipped {live.get('duplicates_skipped')}, "
        f"errors {live.get('errors')}"
    )
    assert dup["n"] == dup["u"], "a record stored twice"
    assert stats["missing_batches"] == 0
    assert stats["delivery_failures"] == 0
    assert int(job_bytes["b"]) == fio["bytes_written"]
