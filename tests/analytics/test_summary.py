from __future__ import annotations

import pytest
from pharos_synthetic_jobs import MIX_CLIENT, T0, MiB, S

from pharos_analytics.pattern import classify_pattern, is_system_path
from pharos_analytics.summary import count_jobs, job_summary, list_jobs
from pharos_analytics.summary_sql import SIZE_BINS, ns_to_datetime

DATA = {"read", "pread", "readv", "write", "pwrite", "writev"}


def test_unknown_job_is_none(store):
    assert job_summary(store, "no-such-job") is None


def test_unknown_layer_is_an_error(store):
    with pytest.raises(ValueError):
        job_summary(store, "mix", layer="bogus")


def test_mix_header(store):
    s = job_summary(store, "mix")
    assert (s.job_id, s.layer, s.name, s.user, s.host) == ("mix", "client", "ior", "alice", "cn01")
    assert s.command == ["ior", "-w", "-r"]
    assert s.ranks == 4 and s.exit_code == 0 and s.state == "finished"
    assert s.start == ns_to_datetime(T0) and s.end == ns_to_datetime(T0 + 100 * S)


def test_mix_bytes_and_counts(store):
    s = job_summary(store, "mix")
    # writes: 4 x 1 MiB merged + 99 + 2 x 100; reads: 3 x 1023 + failed 1024 (0 B) + 4 MiB
    # system files (/usr/lib, /etc: 2 x 832 + 4096) are not the job's data I/O (Darshan's exclusions)
    assert s.bytes_written == 4 * MiB + 99 + 200
    assert s.bytes_read == 3 * 1023 + 0 + 4 * MiB
    assert s.ops == {"fsync": 1, "open": 1, "pread": 1, "pwrite": 2, "read": 3 + 1 + 2 + 1, "stat": 1, "write": 5}
    assert s.other_ops == {"block_write": 3}
    assert (s.non_file_ops.requests, s.non_file_ops.bytes) == (6, 70)
    assert s.non_file_ops.by_type == {"char_device": 1, "pipe": 5}
    assert s.failed_requests == 1
    assert s.records == len(MIX_CLIENT) == 14
    assert s.requests == sum(r["count"] for r in MIX_CLIENT) == 27
    # data ops on data files only: the merge ratio of the job's data I/O
    data = [
        r
        for r in MIX_CLIENT
        if r["file_type"] == "regular"
        and r["op"] in ("read", "pread", "readv", "write", "pwrite", "writev")
        and not r["path"].startswith(("/usr/", "/etc/"))
    ]
    assert s.data_records == len(data)
    assert s.data_requests == sum(r["count"] for r in data) == sum(f.reads + f.writes for f in s.files)
    assert sum(s.ops.values()) + s.non_file_ops.requests + sum(s.other_ops.values()) == s.requests


def test_mix_histogram_darshan_bins(store):
    s = job_summary(store, "mix")
    labels = [label for label, _ in SIZE_BINS]
    assert list(s.size_histogram["read"]) == labels and list(s.size_histogram["write"]) == labels
    read = {k: v for k, v in s.size_histogram["read"].items() if v}
    write = {k: v for k, v in s.size_histogram["write"].items() if v}
    # 1023 x3 in [100, 1024); 1024 (failed) in [1024, 10240); system files excluded;
    # 4 MiB exactly opens [4 MiB, 10 MiB)
    assert read == {"100-1K": 3, "1K-10K": 1, "4M-10M": 1}
    # 99 in [0, 100); 100 x2 opens [100, 1024); 1 MiB x4 opens [1 MiB, 4 MiB)
    assert write == {"0-100": 1, "100-1K": 2, "1M-4M": 4}


def test_mix_files_pattern_and_window(store):
    s = job_summary(store, "mix")
    assert [(f.path, f.bytes_read, f.bytes_written, f.reads, f.writes, f.ranks) for f in s.files] == [
        ("/scratch/a.0", 3 * 1023 + 4 * MiB, 4 * MiB, 5, 4, 1),
        ("/scratch/a.1", 0, 299, 0, 3, 1),
    ]
    assert s.n_files == 2 and s.io_ranks == 2
    # Beacon's volume dominance (pattern.decide_pattern): rank 0's reads of its own file (1-1,
    # 4 MiB + 3069 B) carry 50.04% of the bytes, the writes (N-N) 49.96%: the job is 1-1; the
    # fan-in over all files together is N-N.
    assert s.pattern == "1-1" and s.fan_in_pattern == "N-N"
    assert s.patterns == {"read": "1-1", "write": "N-N"}
    pairs = [
        (r["rank"], r["path"])
        for r in MIX_CLIENT
        if r["file_type"] == "regular" and r["op"] in DATA and not is_system_path(r["path"])
    ]
    assert classify_pattern(pairs) == s.fan_in_pattern
    assert s.first_io == ns_to_datetime(T0 + 1 * S)
    assert s.last_io == ns_to_datetime(T0 + 11 * S)
    assert s.io_span_s == pytest.approx(10.0)
    assert s.io_time_s == pytest.approx(0.5 + 0.1 + 0.2 + 0.3 + 0.05 + 1.0)
    assert s.bandwidth_mib_s == pytest.approx((s.bytes_read + s.bytes_written) / MiB / 10)


def test_mix_drops_take_newest_row_per_producer(store):
    s = job_summary(store, "mix")
    assert s.dropped_records == (3 + 2 + 1) + 5 == 11
    d = s.drops
    got = (d.ringbuf_drops, d.delivery_failures, d.overflow_drops, d.unmerged_fallbacks, d.producers)
    assert got == (8, 2, 1, 7, 2)


def test_forwarder_layer_is_separate(store):
    s = job_summary(store, "mix", layer="forwarder")
    assert s.bytes_written == 10 * MiB and s.bytes_read == 0
    assert s.records == 1 and s.requests == 10 and s.pattern == "1-1"
    assert s.name == "ior"  # events are per job, not per layer


def test_n1_running(store):
    s = job_summary(store, "n1")
    assert s.state == "running" and s.end is None and s.exit_code is None
    assert s.pattern == "N-1" and s.io_ranks == 3 and s.n_files == 1
    assert s.files[0].path == "/scratch/shared" and s.files[0].ranks == 3
    assert s.bytes_written == 3 * 8 * 4096 and s.bytes_read == 0
    assert s.dropped_records == 27 and s.drops.producers == 1
    assert s.first_io == ns_to_datetime(T0 + 11 * S) and s.last_io == ns_to_datetime(T0 + 13 * S)


def test_failed_job_without_io(store):
    s = job_summary(store, "failed")
    assert s.state == "failed" and s.exit_code == 2
    assert s.pattern == "none" and s.io_ranks == 0 and s.files == [] and s.n_files == 0
    assert s.records == 0 and s.first_io is None and s.bandwidth_mib_s is None and s.io_span_s is None
    assert all(v == 0 for v in s.size_histogram["read"].values())
    assert s.dropped_records == 0 and s.drops.producers == 0


def test_nm_and_one_to_n(store):
    assert job_summary(store, "nm").pattern == "N-M"
    one = job_summary(store, "one")
    assert one.pattern == "1-N" and one.n_files == 3
    assert {f.path for f in one.files} == {"/scratch/o1", "/scratch/o2", "dev:5:inode:7"}
    # a single instant of I/O has no span: no bandwidth rather than a division by zero
    assert job_summary(store, "orphan").bandwidth_mib_s is None


def test_files_limit_keeps_n_files(store):
    s = job_summary(store, "one", files_limit=1)
    assert len(s.files) == 1 and s.n_files == 3


def test_job_with_records_but_no_event(store):
    s = job_summary(store, "orphan")
    assert s.state == "unknown" and s.name is None and s.ranks is None and s.start is None
    assert s.bytes_written == 1 and s.pattern == "1-1"


def test_list_jobs_newest_first(store):
    jobs = list_jobs(store, limit=50, offset=0)
    assert [j.job_id for j in jobs] == ["one", "nm", "failed", "n1", "mix"]
    by = {j.job_id: j for j in jobs}
    assert (by["mix"].pattern, by["mix"].bytes_written, by["mix"].state, by["mix"].ranks) == (
        "1-1",  # volume dominance, as job_summary (test_mix_files_pattern_and_window)
        4 * MiB + 299,
        "finished",
        4,
    )
    assert by["mix"].bytes_read == job_summary(store, "mix").bytes_read
    assert (by["n1"].pattern, by["n1"].state, by["n1"].io_ranks) == ("N-1", "running", 3)
    assert (by["failed"].pattern, by["failed"].state, by["failed"].exit_code) == ("none", "failed", 2)
    assert by["nm"].pattern == "N-M" and by["one"].pattern == "1-N" and by["one"].n_files == 3
    assert count_jobs(store) == 5


def test_list_jobs_paging(store):
    assert [j.job_id for j in list_jobs(store, limit=2, offset=1)] == ["nm", "failed"]
    assert list_jobs(store, limit=10, offset=5) == []
    assert list_jobs(store, limit=0) == []
    with pytest.raises(ValueError):
        list_jobs(store, limit=-1)
