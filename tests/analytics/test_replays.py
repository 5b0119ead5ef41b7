"""Replayed requests counted once (issue 25, item 5) on real chDB: the forwarder-layer records
of one job where mounts replayed requests on other forwarding nodes, with and without the
original execution stored; every view of the job counts each client request once."""

from __future__ import annotations

import pytest
from pharos_synthetic_jobs import T0, MiB, S, event, rec

from pharos_analytics.phases import job_phases
from pharos_analytics.profiles import job_metrics
from pharos_analytics.report_data import rank_time_bytes, resource_bytes
from pharos_analytics.summary import job_summary, list_jobs
from pharos_analytics.system_diag import forwarder_loads
from pharos_core.settings import Settings
from pharos_core.store import migrate, open_store

JOB = "replayed"


def fwd(cn, rid, node, op, size, *, replay=False, start=1.0, rank=0, path="/scratch/r.0"):
    """One forwarder-layer record of request ``rid`` of compute node ``cn`` served by ``node``."""
    r = rec(JOB, rank, op, path, size, size, layer="forwarder", start=start, end=start + 0.01, producer=node)
    return {**r, "host": node, "compute_node": cn, "forwarding_node": node, "request_id": rid, "replay": int(replay)}


# cn0's writes and reads, 1 MiB each; fwd0's link was cut, so some requests ran on fwd0 (reply
# lost) and again on fwd1 (replay); one never reached fwd0 (replay only); one was replayed twice.
RECORDS = [
    fwd("cn0", 10, "fwd0", "pwrite", MiB, start=1),
    fwd("cn0", 10, "fwd1", "pwrite", MiB, replay=True, start=4),  # duplicate of fwd0's
    fwd("cn0", 11, "fwd1", "pwrite", MiB, replay=True, start=4.5),  # original never reached a daemon
    fwd("cn0", 12, "fwd0", "pwrite", MiB, start=2),
    fwd("cn0", 12, "fwd1", "pwrite", MiB, replay=True, start=5),  # duplicate
    fwd("cn0", 12, "fwd2", "pwrite", MiB, replay=True, start=8),  # duplicate (second replay)
    fwd("cn0", 13, "fwd1", "pwrite", MiB, replay=True, start=6),  # two replays, no original:
    fwd("cn0", 13, "fwd2", "pwrite", MiB, replay=True, start=9),  # the earliest counts
    fwd("cn0", 20, "fwd0", "pread", MiB, start=10),
    fwd("cn0", 20, "fwd1", "pread", MiB, replay=True, start=13),  # duplicate read
    # cn1 uses the same request id as cn0's replayed one: another request, not a duplicate
    fwd("cn1", 10, "fwd1", "pwrite", MiB, start=1, rank=1, path="/scratch/r.1"),
    # a record of a daemon before request ids (0): always counts
    fwd("cn1", 0, "fwd1", "pread", MiB, start=11, rank=1, path="/scratch/r.1"),
]
#: What each client request moved once: cn0 writes 10, 11, 12, 13 and read 20; cn1 write 10, read 0.
WRITTEN, READ = 5 * MiB, 2 * MiB
CLIENT = [
    rec(JOB, 0, "pwrite", "/scratch/r.0", MiB, MiB, 4, start=1),
    rec(JOB, 0, "pread", "/scratch/r.0", MiB, MiB, 1, start=10),
    rec(JOB, 1, "pwrite", "/scratch/r.1", MiB, MiB, 1, start=1),
    rec(JOB, 1, "pread", "/scratch/r.1", MiB, MiB, 1, start=11),
]


@pytest.fixture(scope="module")
def store_builder():
    def build(state_dir):
        store = open_store(Settings(state_dir=state_dir))
        migrate(store)
        store.insert_rows("io_requests", RECORDS + CLIENT)
        store.insert_rows("job_events", [event(JOB, "start", 0, name="fio", ranks=2), event(JOB, "end", 20)])
        return store

    return build


def test_records_hold_every_execution(store):
    """The store keeps every record (nothing is deleted): 5 duplicates among 12 records."""
    rows = store.query(
        "SELECT count() AS n, sum(bytes) AS b, countIf(replay = 1) AS r FROM io_requests "
        "WHERE job_id = {j:String} AND layer = 'forwarder'",
        {"j": JOB},
    )[0]
    assert (int(rows["n"]), int(rows["b"]), int(rows["r"])) == (12, 12 * MiB, 7)


def test_summary_counts_each_request_once(store):
    s = job_summary(store, JOB, layer="forwarder", coverage=False)
    assert (s.bytes_written, s.bytes_read) == (WRITTEN, READ)
    assert s.ops == {"pread": 2, "pwrite": 5} and s.requests == s.records == 7
    assert s.data_requests == 7 and s.size_histogram["write"]["1M-4M"] == 5
    assert {f.path: (f.bytes_read, f.bytes_written, f.writes) for f in s.files} == {
        "/scratch/r.0": (MiB, 4 * MiB, 4),
        "/scratch/r.1": (MiB, MiB, 1),
    }
    # The kept execution's node: fwd0 for the originals, fwd1 for replays without one; every
    # record on fwd2 repeats a request counted elsewhere.
    assert s.forwarding_nodes == {"cn0": ["fwd0", "fwd1"], "cn1": ["fwd1"]}
    assert (s.replayed_requests, s.duplicate_requests) == (7, 5)
    # the client layer agrees, and has no replays
    c = job_summary(store, JOB, coverage=False)
    assert (c.bytes_written, c.bytes_read, c.replayed_requests) == (WRITTEN, READ, 0)


def test_job_list_counts_each_request_once(store):
    (item,) = [j for j in list_jobs(store, layer="forwarder") if j.job_id == JOB]
    assert (item.bytes_written, item.bytes_read, item.io_ranks, item.n_files) == (WRITTEN, READ, 2, 2)


def test_per_rank_per_node_and_phase_views_count_each_request_once(store):
    """Report (bytes per forwarding node and target, per rank and time), profile, phases."""
    res = resource_bytes(store, JOB)
    # fwd0: writes 10, 12 and read 20; fwd1: replay-only 11, earliest replay of 13, cn1's 2 MiB
    assert res["forwarding_node"] == {"fwd0": 3 * MiB, "fwd1": 4 * MiB}
    heat = rank_time_bytes(store, JOB, layer="forwarder", bins=4)
    assert heat.records == 7
    assert round(sum(map(sum, heat.read)) + sum(map(sum, heat.write))) == WRITTEN + READ
    (m,) = [m for m in job_metrics(store, [JOB])]
    assert m.numbers["forwarding_nodes"] == 2  # fwd2 ran duplicates only
    ph = job_phases(store, JOB, layer="forwarder")
    assert (ph.job.bytes_written, ph.job.bytes_read, ph.job.writes, ph.job.reads) == (WRITTEN, READ, 5, 2)
    assert sum(p.profile.bytes_written for p in ph.phases) == WRITTEN


def test_forwarders_view_counts_each_request_once(store):
    """The system view's per-node load (rollup minus the window's duplicate replays)."""
    loads = {f.node: f for f in forwarder_loads(store, until=T0 + 30 * S, window_s=60)}
    assert {n: (f.bytes, f.requests) for n, f in loads.items()} == {
        "fwd0": (3 * MiB, 3),
        "fwd1": (4 * MiB, 4),
        "fwd2": (0, 0),  # ran only repeats of requests counted on fwd0 and fwd1
    }
    assert dict(loads["fwd1"].jobs) == {JOB: 4 * MiB}


def test_an_unrelated_job_keeps_its_own_figures(store):
    """The same request ids in another job's records are not its duplicates."""
    other = [{**r, "job_id": "other"} for r in RECORDS[:1]]
    store.insert_rows("io_requests", other)
    assert job_summary(store, "other", layer="forwarder", coverage=False).bytes_written == MiB
    assert job_summary(store, JOB, layer="forwarder", coverage=False).bytes_written == WRITTEN
