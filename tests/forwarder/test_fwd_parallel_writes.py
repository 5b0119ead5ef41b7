"""Parallel direct writes through the mount (issue 12, item 1; pharos-mount
``--parallel-writes``, FOPEN_PARALLEL_DIRECT_WRITES): the ranks of an N-1 job reach the
forwarding daemon at once instead of one after the other, and their data verifies.

Two mounts on one daemon (the daemon's Kafka records on the real broker give every write's
arrival and reply time): 8 fio jobs write interleaved 64 KiB blocks of one shared file, then read
every block back with crc32c. With ``--parallel-writes false`` FUSE passes one write of the file
at a time (the kernel holds the inode lock across the request), so no two writes of the file
overlap at the daemon; with ``--parallel-writes true`` (the default) they do. Each target adds
5 ms to a request so that an overlap, when allowed, is certain.
"""

from __future__ import annotations

import pytest
from forwarder_testkit import consume, fio, n1_interleaved_args, wait_records_sent

from pharos_pipeline.wire import IoBatch, io_pb2

RANKS = 8
PER_RANK = 1 << 20
BLOCK = 64 << 10


def interleaved(directory, job: str) -> None:
    out = fio(
        "--name=pw", f"--directory={directory}", *n1_interleaved_args(RANKS, BLOCK, PER_RANK), job=job, timeout=180
    )
    j = out["jobs"][0]
    assert j["error"] == 0, j
    assert j["write"]["io_bytes"] == j["read"]["io_bytes"] == RANKS * PER_RANK


def most_in_flight(intervals: list[tuple[int, int]]) -> int:
    """Largest number of [start, end) intervals that hold one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = cur = 0
    for _, d in events:
        cur += d
        most = max(most, cur)
    return most


@pytest.mark.timeout(300)
def test_parallel_writes_reach_the_daemon_at_once_and_verify(cluster, kafka_settings):
    s = kafka_settings
    latency = [a for i in range(cluster.n_targets) for a in ("--latency-ms", f"ost{i}=5")]
    d = cluster.start_daemon("fwd0", "--topic", s.topic_requests, *latency, kafka=s.kafka_bootstrap)
    serial = cluster.start_mount([d], 0, "--parallel-writes", "false")
    parallel = cluster.start_mount([d], 1)  # the default
    interleaved(serial.path, "pw-serial")
    interleaved(parallel.path, "pw-parallel")

    produced = wait_records_sent(d)
    batches = consume(
        s.kafka_bootstrap,
        s.topic_requests,
        IoBatch.FromString,
        until=lambda got: sum(len(b.records) for _, b in got) >= produced,
    )
    writes: dict[str, list[tuple[int, int]]] = {"pw-serial": [], "pw-parallel": []}
    for _, b in batches:
        for r in b.records:
            if r.op == io_pb2.OP_PWRITE and r.job_id in writes:
                assert r.path.endswith("/shared") and r.size == BLOCK
                writes[r.job_id].append((r.start_ns, r.end_ns))
    assert len(writes["pw-serial"]) == len(writes["pw-parallel"]) == RANKS * PER_RANK // BLOCK
    assert most_in_flight(writes["pw-serial"]) == 1
    assert most_in_flight(writes["pw-parallel"]) >= 2


def test_most_in_flight():
    assert most_in_flight([(0, 10), (10, 20)]) == 1
    assert most_in_flight([(0, 10), (5, 20), (6, 7)]) == 3
    assert most_in_flight([]) == 0
