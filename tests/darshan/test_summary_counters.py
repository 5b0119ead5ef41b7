"""job_summary's Darshan counters on real logs (without DXT, and one with a complete DXT), in a real
chDB store.

Expected figures are computed independently from the logs with PyDarshan."""

from __future__ import annotations

import darshan
from pharos_darshan_corpus import count, log

from pharos_analytics.summary import job_summary
from pharos_analytics.summary_sql import DARSHAN_STREAMS
from pharos_api.schemas.jobs import JobSummaryOut
from pharos_pipeline.darshan_import import import_log

NO_DXT = "release_logs/mpi-io-test-x86_64-3.4.7.darshan"  # POSIX, MPI-IO, STDIO; no DXT
STDIO_ONLY = "stdio_no_posix/laytonjb_test1_id28730_6-7-43012-2131301613401632697_1.darshan"
SHARED_65536 = "skew_io/skew-app.darshan"  # one shared (rank -1) record over 65536 ranks
WITH_DXT = "mpi_io_test_with_dxt/treddy_mpi-io-test_id4373053_6-2-60198-9815401321915095332_1.darshan"


def expected(path, dxt: bool = False) -> dict:
    """Bytes and data requests of the log's files (POSIX + STDIO, standard streams apart); the log
    has DXT modules when ``dxt``, none otherwise."""
    r = darshan.DarshanReport(str(path), read_all=True)
    assert any(m.startswith("DXT") for m in r.modules) == dxt
    out = {"bytes_read": 0, "bytes_written": 0, "reads": 0, "writes": 0, "stream_bytes": 0}
    for mod, prefix in (("POSIX", "POSIX_"), ("STDIO", "STDIO_")):
        if mod not in r.records:
            continue
        c = r.records[mod].to_df()["counters"]
        streams = c["id"].map(lambda i: r.name_records.get(i) in DARSHAN_STREAMS)
        files = c[~streams]
        out["bytes_read"] += int(files[prefix + "BYTES_READ"].sum())
        out["bytes_written"] += int(files[prefix + "BYTES_WRITTEN"].sum())
        out["reads"] += int(files[prefix + "READS"].sum())
        out["writes"] += int(files[prefix + "WRITES"].sum())
        out["stream_bytes"] += int(c[streams][[prefix + "BYTES_READ", prefix + "BYTES_WRITTEN"]].sum().sum())
    return out


def test_log_without_dxt_is_summarised_from_counters(store):
    p = log(NO_DXT)
    r = import_log(store, p)
    assert r.status == "imported" and r.dxt_segments == 0 and "MPI-IO" in r.modules
    want = expected(p)
    s = job_summary(store, r.job_id)
    assert s.source == "darshan-counters"
    assert want["bytes_written"] > 0 and want["bytes_read"] > 0
    # POSIX (+ STDIO) bytes, MPI-IO's view of the same bytes not added on top
    assert (s.bytes_read, s.bytes_written) == (want["bytes_read"], want["bytes_written"])
    assert s.ops["read"] == s.data_requests - s.ops["write"] == want["reads"]
    assert s.ops["write"] == want["writes"]
    assert s.non_file_ops.bytes == want["stream_bytes"] > 0  # <STDOUT>
    assert sum(s.ops.values()) + s.non_file_ops.requests + sum(s.other_ops.values()) == s.requests
    assert s.records == s.data_records == 0 and s.failed_requests == 0
    assert s.n_files == len(s.files) == 1 and s.files[0].ranks == 4 and s.io_ranks == 4  # shared record
    assert s.pattern == "N-1"
    assert sum(s.size_histogram["write"].values()) == want["writes"]
    span = store.query(
        "SELECT toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start) AS n "
        "FROM darshan_logs FINAL WHERE job_id = {j:String}",
        {"j": r.job_id},
    )[0]["n"]
    assert s.first_io is not None and abs(s.io_span_s - int(span) / 1e9) < 1e-6 and s.bandwidth_mib_s > 0
    assert job_summary(store, r.job_id, layer="forwarder").source == "traces"  # client layer only
    # what GET /v1/jobs/{id} returns carries the source
    assert JobSummaryOut.model_validate(s).model_dump()["source"] == "darshan-counters"


def test_stdio_only_log(store):
    p = log(STDIO_ONLY)
    r = import_log(store, p)
    want = expected(p)
    s = job_summary(store, r.job_id)
    assert s.source == "darshan-counters" and want["bytes_written"] > 0
    assert (s.bytes_read, s.bytes_written) == (want["bytes_read"], want["bytes_written"])
    assert s.n_files == 1 and s.io_ranks == 1


def test_shared_record_counts_every_rank_of_the_log(store):
    p = log(SHARED_65536)
    r = import_log(store, p)
    want = expected(p)
    s = job_summary(store, r.job_id)
    assert s.source == "darshan-counters"
    assert (s.bytes_read, s.bytes_written) == (want["bytes_read"], want["bytes_written"])
    assert s.io_ranks == 65536 and s.pattern == "N-1"


def test_log_with_dxt_takes_its_totals_from_the_counters(store):
    # Issue 24: the totals of a log with DXT were the DXT segments' (source "traces"), which miss
    # STDIO and whatever DXT dropped; they are the counters' now, the DXT rows the records.
    p = log(WITH_DXT)
    r = import_log(store, p)
    assert r.dxt_segments > 0
    want = expected(p, dxt=True)
    s = job_summary(store, r.job_id)
    assert s.source == "darshan-counters+dxt"
    assert (s.bytes_read, s.bytes_written) == (want["bytes_read"], want["bytes_written"])
    assert s.ops["read"] == want["reads"] and s.ops["write"] == want["writes"]
    assert s.dxt is not None and not s.dxt.partial and s.dxt.share == 1.0
    # this log's DXT is complete: its rows hold the same bytes
    io = store.query(
        "SELECT sumIf(bytes, op IN ('read', 'pread', 'readv')) AS r, "
        "sumIf(bytes, op IN ('write', 'pwrite', 'writev')) AS w, count() AS n "
        "FROM io_requests WHERE job_id = {j:String} AND layer = 'client'",
        {"j": r.job_id},
    )[0]
    assert (s.bytes_read, s.bytes_written, s.records) == (int(io["r"]), int(io["w"]), int(io["n"]))
    assert s.records == r.dxt_segments and s.bytes_written > 0
    assert count(store, "SELECT count() AS n FROM darshan_counters WHERE job_id = {j:String}", j=r.job_id) > 0
