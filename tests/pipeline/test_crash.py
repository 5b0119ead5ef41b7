"""Exactly-once under SIGKILL: a standalone pipeline process (run_pipeline_process) is
killed several times mid-stream while a producer thread sends batches; after restarts and
catch-up every record is stored exactly once.

The process runs the real pipeline with one addition (WINDOW below): after each
io_requests insert it prints a marker and sleeps a little, so the test can kill it at the
worst moment, records stored but offsets not committed, and not only at random moments.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

from pipeline_testkit import committed_total, lag, make_batch, make_record, producer, wait_for

from pharos_core.settings import REPO_ROOT
from pharos_core.store import open_store

PRODUCERS = 4
BATCHES_PER_PRODUCER = 50  # 200 batches
RECORDS_PER_BATCH = 500  # 100 000 records
KILLS = 4
MARK = "PHAROS-TEST records inserted"
#: The pipeline process: the real run_pipeline_process, with a marker and a 0.3 s pause
#: after every io_requests insert (between the records insert and the io_batches markers and
#: offset commit).
WINDOW = f"""
import sys, time
from pharos_pipeline import columnar
insert_io_batches = columnar.insert_io_batches
def marked(store, messages, *args):
    insert_io_batches(store, messages, *args)
    if messages:
        print({MARK!r}, len(messages), flush=True)
        time.sleep(0.3)
columnar.insert_io_batches = marked
from pharos_pipeline.ingest import run_pipeline_process
sys.exit(run_pipeline_process())
"""


def _env(s, log_path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PHAROS_CONFIG": str(log_path.parent / "no-pharos.toml"),  # ignore a developer's pharos.toml
            "PHAROS_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
            "PHAROS_STATE_DIR": str(s.state_dir),
            "PHAROS_TOPIC_REQUESTS": s.topic_requests,
            "PHAROS_TOPIC_JOBS": s.topic_jobs,
            "PHAROS_TOPIC_DEADLETTER": s.topic_deadletter,
            "PHAROS_TOPIC_PARTITIONS": str(s.topic_partitions),
            "PHAROS_CONSUMER_GROUP": s.consumer_group,
            "PHAROS_CONSUMER_INSTANCE_ID": "crash-test-pipeline",
            "PHAROS_PIPELINE_MAX_MESSAGES": "4",  # small polls: many commits to land between
            "PHAROS_PIPELINE_MAX_WAIT_MS": "50",
        }
    )
    return env


def test_sigkill_mid_stream_stores_every_record_once(pipeline_settings, tmp_path):
    s = pipeline_settings
    seed = int(os.environ.get("PHAROS_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"seed {seed}")
    template = [make_record(k) for k in range(RECORDS_PER_BATCH)]
    payloads = [
        (f"crash-{p}".encode(), make_batch(f"crash-{p}", seq, template).SerializeToString())
        for seq in range(BATCHES_PER_PRODUCER)
        for p in range(PRODUCERS)
    ]
    expected_bytes = BATCHES_PER_PRODUCER * PRODUCERS * sum(max(r.result, 0) * r.count for r in template)

    produced = threading.Event()
    errors: list[str] = []

    def produce_all():
        prod = producer(s)
        try:
            for key, value in payloads:
                prod.produce(
                    s.topic_requests, key=key, value=value, on_delivery=lambda err, _m: err and errors.append(str(err))
                )
                prod.poll(0)
                time.sleep(0.005)  # faster than the pipeline: a backlog, so kills land mid-poll
            if prod.flush(60):
                errors.append("flush left messages")
        finally:
            produced.set()

    log_path = tmp_path / "pipeline.log"
    env = _env(s, log_path)

    def start():
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(
                [sys.executable, "-c", WINDOW], env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT
            )

    thread = threading.Thread(target=produce_all, daemon=True)
    thread.start()
    proc = start()
    try:
        progress = []
        for k in range(KILLS):
            base = committed_total(s, [s.topic_requests])
            if k % 2 == 0:
                # the worst moment: records stored, offsets not yet committed
                marks = _marks(log_path)
                wait_for(
                    lambda marks=marks, proc=proc: _marks(log_path) > marks or proc.poll() is not None,
                    90,
                    what="the pipeline process to insert records",
                )
                time.sleep(rng.uniform(0.0, 0.2))
            else:
                # a random moment after this incarnation committed something
                wait_for(
                    lambda base=base, proc=proc: (
                        committed_total(s, [s.topic_requests]) > base or proc.poll() is not None
                    ),
                    90,
                    what="the pipeline process to commit",
                )
                time.sleep(rng.uniform(0.0, 1.0))
            assert proc.poll() is None, f"pipeline exited with {proc.returncode}: {log_path.read_text()[-3000:]}"
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            progress.append(committed_total(s, [s.topic_requests]))
            proc = start()
        thread.join(120)
        assert produced.is_set() and not errors, errors
        wait_for(
            lambda: lag(s, [s.topic_requests]) == 0 or proc.poll() is not None, 120, what="the pipeline to catch up"
        )
        assert proc.poll() is None, f"pipeline exited with {proc.returncode}: {log_path.read_text()[-3000:]}"
        assert progress == sorted(progress) and progress[-1] < len(payloads), progress  # killed mid-stream
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    store = open_store(s)  # the pipeline process is gone: the chDB dir is free
    try:
        total = RECORDS_PER_BATCH * len(payloads)
        r = store.query(
            "SELECT count() AS n, uniqExact(producer_id, seq, record_index) AS u, sum(bytes) AS b FROM io_requests"
        )[0]
        assert (int(r["n"]), int(r["u"]), int(r["b"])) == (total, total, expected_bytes)
        dup = store.query(
            "SELECT producer_id, seq, record_index, count() AS c FROM io_requests "
            "GROUP BY producer_id, seq, record_index HAVING c != 1 LIMIT 5"
        )
        assert dup == []
        per = store.query(
            "SELECT producer_id, uniqExact(seq) AS b, count() AS n FROM io_requests "
            "GROUP BY producer_id ORDER BY producer_id"
        )
        assert [(x["producer_id"], int(x["b"]), int(x["n"])) for x in per] == [
            (f"crash-{p}", BATCHES_PER_PRODUCER, BATCHES_PER_PRODUCER * RECORDS_PER_BATCH) for p in range(PRODUCERS)
        ]
        assert int(store.query("SELECT uniqExact(producer_id, seq) AS n FROM io_batches")[0]["n"]) == len(payloads)
    finally:
        store.close()
    # each kill in the window left stored but uncommitted batches: the restart skipped them
    redelivered = log_path.read_text().count("duplicate batch(es)")
    assert redelivered >= (KILLS + 1) // 2, log_path.read_text()[-3000:]
    # every start froze its set-up out of the garbage collector's passes (pharos_core.process)
    frozen = [
        int(n) for n in re.findall(r"; (\d+) start-up objects out of the garbage collector", log_path.read_text())
    ]
    assert len(frozen) == KILLS + 1 and min(frozen) > 10_000, frozen
    print(f"committed at the kills: {progress}; polls with re-delivered batches: {redelivered}")


def _marks(path) -> int:
    return path.read_text(errors="replace").count(MARK)
