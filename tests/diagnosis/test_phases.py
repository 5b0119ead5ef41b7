"""Phases and access profiles on synthetic requests in a real chDB store."""

from __future__ import annotations

import pytest
from pharos_diag_rows import KiB, MiB, req, start_event

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.phases import job_phases, longest_run


@pytest.fixture(scope="module")
def jobs(store):
    rows = []
    # "bursts": phase 1 (t=0..0.3): 4 ranks write one shared file sequentially, 4 KiB aligned.
    for rank in range(4):
        for i in range(4):
            rows.append(
                req(
                    "bursts",
                    rank,
                    "write",
                    "/scratch/shared",
                    (rank * 4 + i) * 4 * KiB,
                    4 * KiB,
                    t=0.01 * i + 0.1 * rank,
                )
            )
    # phase 2 (t=5..5.5): each rank reads its own file at random, misaligned offsets.
    for rank in range(4):
        for i, off in enumerate((900_001, 17, 500_003, 3)):
            rows.append(req("bursts", rank, "read", f"/scratch/own.{rank}", off, 2 * MiB, t=5 + 0.1 * i))
    # phase 3 (t=20): one small write. A library read in the gap does not bridge it.
    rows.append(req("bursts", 0, "write", "/scratch/log", 0, 100, t=20))
    rows.append(req("bursts", 0, "read", "/usr/lib/libc.so.6", 0, 832, t=10))
    # "meta": 2000 stats per second for 4 s (t=0..4), then 2000 in 1 s (t=10).
    for sec in range(4):
        rows.append(req("meta", 0, "stat", "/scratch/dir/f", 0, 0, t=sec + 0.5, count=2000, ftype="directory"))
    rows.append(req("meta", 0, "stat", "/scratch/dir/f", 0, 0, t=10.5, count=2000))
    # "merged": one record of 8 contiguous 1 MiB writes (Beacon merge).
    rows.append(req("merged", 0, "write", "/scratch/m", 0, MiB, t=1, count=8))
    store.insert_rows("io_requests", rows)
    store.insert_rows("job_events", [start_event(j, 4) for j in ("bursts", "meta", "merged")])
    return store


def test_bursts_split_at_idle_gaps(jobs):
    jp = job_phases(jobs, "bursts")
    assert jp.source == "trace"
    assert [p.index for p in jp.phases] == [1, 2, 3]
    p1, p2, p3 = (p.profile for p in jp.phases)
    assert (p1.pattern, p1.direction, p1.access, p1.alignment, p1.size_class) == (
        "N-1",
        "write",
        "sequential",
        "aligned",
        "small",
    )
    assert p1.writes == 16 and p1.bytes_written == 16 * 4 * KiB and p1.io_ranks == 4 and p1.max_fan_in == 4
    assert (p2.pattern, p2.direction, p2.alignment, p2.size_class) == ("N-N", "read", "misaligned", "large")
    # Per rank: 900001 first (sequential), 17 back (random), 500003 forward but before 900001+2MiB (random), 3 (random).
    assert p2.sequential_share == pytest.approx(4 / 16)
    assert p2.access == "random"
    assert p2.misaligned_share == 1.0
    assert p3.writes == 1 and p3.pattern == "1-1"
    # Beacon's volume dominance: the N-N reads (32 MiB) outweigh the writes; over all files
    # together the job is N-M. The writes are N-1 by volume (issue 24): 64 KiB to one shared file,
    # and rank 0's 100 B log is a side file (their fan-in over both files is N-M).
    assert jp.job.pattern == "N-N" and jp.job.fan_in_pattern == "N-M"
    assert jp.job.patterns == {"read": "N-N", "write": "N-1"}
    assert jp.job.reads == 16 and jp.job.writes == 17
    assert p1.end < p2.start < p2.end < p3.start


def test_gap_threshold_and_phase_cap(jobs):
    assert len(job_phases(jobs, "bursts", cfg=DiagnosisConfig(phase_gap_s=30)).phases) == 1
    assert len(job_phases(jobs, "bursts", cfg=DiagnosisConfig(phase_gap_s=10)).phases) == 2
    capped = job_phases(jobs, "bursts", cfg=DiagnosisConfig(max_phases=2))
    # Only the longest gap (5.5 s -> 20 s) splits the job.
    assert [p.profile.writes for p in capped.phases] == [16, 1]


def test_metadata_heavy_needs_sustained_rate(jobs):
    jp = job_phases(jobs, "meta")
    assert jp.job.metadata_ops == 10000
    assert jp.job.metadata_busy_s == 4 and jp.job.metadata_heavy
    heavy = [p.profile.metadata_heavy for p in jp.phases]
    assert heavy == [True, False]  # the lone busy second at t=10 is not sustained
    assert not job_phases(jobs, "meta", cfg=DiagnosisConfig(metadata_sustained_s=5)).job.metadata_heavy
    assert not job_phases(jobs, "meta", cfg=DiagnosisConfig(metadata_rate_ops_s=2000)).job.metadata_heavy


def test_merged_record_counts_as_consecutive(jobs):
    prof = job_phases(jobs, "merged").job
    assert prof.writes == 8 and prof.consecutive_share == 1.0 and prof.size_class == "large"


def test_unknown_job_has_no_profile(jobs):
    jp = job_phases(jobs, "nope")
    assert jp.source == "none" and jp.job is None and jp.phases == []


def test_longest_run():
    assert longest_run([]) == 0
    assert longest_run([1, 2, 3, 7, 8]) == 3
    assert longest_run([4]) == 1
