"""Insight rules on synthetic traced requests in a real chDB store, and the config."""

from __future__ import annotations

import pytest
from pharos_diag_rows import KiB, MiB, req, start_event

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.insights import job_insights
from pharos_analytics.insights.files import _add_interval, _overlap


@pytest.fixture(scope="module")
def jobs(store):
    rows = []
    # small: 2000 writes of 100 B (sequential), 10 writes of 4 MiB.
    rows += [req("small", 0, "write", "/scratch/s", i * 100, 100, t=i * 0.001) for i in range(2000)]
    rows += [req("small", 0, "write", "/scratch/s", 200_000 + i * 4 * MiB, 4 * MiB, t=3 + i * 0.01) for i in range(10)]
    # random: 1500 reads of 4 KiB at offsets going backwards.
    rows += [req("random", 0, "read", "/scratch/r", (1500 - i) * 8 * KiB, 4 * KiB, t=i * 0.001) for i in range(1500)]
    # raw: write 4 MiB, then read it back, twice (read-after-write and redundant reads).
    rows += [req("raw", 0, "write", "/scratch/w", 0, 4 * MiB, t=0)]
    rows += [req("raw", 1, "read", "/scratch/w", 0, 4 * MiB, t=1), req("raw", 1, "read", "/scratch/w", 0, 4 * MiB, t=2)]
    # fsync: 200 writes, each followed by fsync.
    for i in range(200):
        rows += [
            req("fsync", 0, "write", "/scratch/f", i * 4 * KiB, 4 * KiB, t=i * 0.01),
            req("fsync", 0, "fsync", "/scratch/f", 0, 0, t=i * 0.01 + 0.005),
        ]
    # straggle: shared file, rank 0 writes 10 MiB, ranks 1-3 4 KiB each; rank 0 spends 40 s in opens.
    rows += [req("straggle", 0, "write", "/scratch/big", 0, 10 * MiB, t=0, dur=5)]
    rows += [req("straggle", r, "write", "/scratch/big", 10 * MiB + r * 4 * KiB, 4 * KiB, t=0) for r in (1, 2, 3)]
    rows += [req("straggle", 0, "open", "/scratch/big", 0, 0, t=10, dur=40)]
    # target: 16 ranks write one file; the storage layer shows one target.
    rows += [req("target", r, "write", "/scratch/t", r * MiB, MiB, t=0) for r in range(16)]
    rows += [
        req("target", r, "write", "/scratch/t", r * MiB, MiB, t=0.1, layer="storage", target="ost7") for r in range(16)
    ]
    # files: 30 small files, one write each.
    rows += [req("files", 0, "write", f"/scratch/many/{i}", 0, 10, t=i * 0.01) for i in range(30)]
    # clean: one rank, 8 sequential 4 MiB writes.
    rows += [req("clean", 0, "write", "/scratch/c", i * 4 * MiB, 4 * MiB, t=i * 0.01) for i in range(8)]
    store.insert_rows("io_requests", rows)
    store.insert_rows(
        "job_events",
        [start_event(j, 1) for j in ("small", "random", "raw", "fsync", "straggle", "target", "files", "clean")],
    )
    return store


def ids(store, job, **cfg):
    return {i.id: i for i in job_insights(store, job, DiagnosisConfig(**cfg)).insights}


def test_small_writes(jobs):
    got = ids(jobs, "small")
    i = got["small_writes"]
    assert i.severity == "high" and i.source == "trace"
    assert i.evidence["small_requests"] == 2000 and i.evidence["requests"] == 2010
    assert "small_reads" not in got
    # Below the absolute threshold the insight stays, as info.
    assert ids(jobs, "small", small_requests_absolute=5000)["small_writes"].severity == "info"
    assert "small_writes" not in ids(jobs, "small", small_requests_ratio=0.999)


def test_random_reads(jobs):
    i = ids(jobs, "random")["random_reads"]
    assert i.evidence["random"] == 1499 and i.evidence["requests"] == 1500
    assert "random_reads" not in ids(jobs, "random", random_absolute=1500)
    assert "random_writes" not in ids(jobs, "small")  # sequential writes


def test_read_after_write_and_redundant_reads(jobs):
    got = ids(jobs, "raw")
    assert got["read_after_write"].evidence["bytes"] == 8 * MiB
    assert got["redundant_reads"].evidence["redundant_bytes"] == 4 * MiB
    assert "read_after_write" not in ids(jobs, "raw", redundant_min_bytes=8 * MiB)


def test_fsync_storm(jobs):
    i = ids(jobs, "fsync")["fsync_storm"]
    assert {k: i.evidence[k] for k in ("fsyncs", "writes", "per_write")} == {
        "fsyncs": 200,
        "writes": 200,
        "per_write": 1.0,
    }
    # 200 fsyncs of 1 ms on one file: all but one are lost.
    assert i.seconds_lost == pytest.approx(0.199) and "fsync" in i.evidence["seconds_lost_basis"]
    assert "fsync_storm" not in ids(jobs, "fsync", fsync_absolute=201)


def test_stragglers_imbalance_and_metadata_time(jobs):
    got = ids(jobs, "straggle")
    assert got["rank_imbalance_bytes"].evidence["worst_file"] == "/scratch/big"
    assert got["rank_imbalance_bytes"].evidence["imbalance"] == pytest.approx(
        (10 * MiB - 4 * KiB) / (10 * MiB + 12 * KiB)
    )
    assert got["rank_imbalance_bytes_per_rank"].evidence["max_rank"] == 0
    assert got["rank_imbalance_time_per_rank"].evidence["max_rank"] == 0
    assert got["metadata_time"].evidence["worst_rank"] == 0 and got["metadata_time"].evidence["worst_s"] == 40
    assert "metadata_time" not in ids(jobs, "straggle", metadata_time_rank_s=40)


def test_single_target(jobs):
    i = ids(jobs, "target")["single_target_shared_file"]
    assert i.evidence["worst_file"] == "/scratch/t" and i.evidence["ranks"] == 16 and "ost7" in i.evidence["layout"]
    assert "single_target_shared_file" not in ids(jobs, "target", shared_file_min_ranks=17)


def test_many_small_files(jobs):
    assert "many_small_files" not in ids(jobs, "files")
    assert ids(jobs, "files", many_files_absolute=30)["many_small_files"].evidence["small_files"] == 30


def test_clean_job_has_no_insight(jobs):
    assert ids(jobs, "clean") == {}


def test_insights_are_sorted_and_documented(jobs):
    ins = job_insights(jobs, "straggle").insights
    # By seconds lost, largest first; unpriced ones last, by severity.
    lost = [i.seconds_lost for i in ins if i.seconds_lost is not None]
    assert lost == sorted(lost, reverse=True) and len(lost) >= 3
    unpriced = [i for i in ins if i.seconds_lost is None]
    assert ins[len(lost) :] == unpriced
    order = {"high": 0, "warn": 1, "info": 2}
    assert [order[i.severity] for i in unpriced] == sorted(order[i.severity] for i in unpriced)
    from pharos_analytics.insights.run import RULES

    for r in RULES:
        assert "Source:" in r.__doc__, r.__name__
        assert "default" in r.__doc__, r.__name__  # the threshold and its unit


def test_config_from_env_and_settings_file(tmp_path, monkeypatch):
    f = tmp_path / "pharos.toml"
    f.write_text("state_dir = '/tmp/x'\n[diagnosis]\nsmall_requests_absolute = 7\nphase_gap_s = 2.5\n")
    monkeypatch.setenv("PHAROS_CONFIG", str(f))
    cfg = DiagnosisConfig()
    assert cfg.small_requests_absolute == 7 and cfg.phase_gap_s == 2.5 and cfg.random_ratio == 0.2
    monkeypatch.setenv("PHAROS_DIAGNOSIS_PHASE_GAP_S", "4")
    assert DiagnosisConfig().phase_gap_s == 4
    with pytest.raises(ValueError):
        DiagnosisConfig(small_requests_ratio=2)


def test_interval_union():
    s, e = [], []
    for lo, hi in ((10, 20), (30, 40), (15, 32), (50, 60), (60, 61)):
        _add_interval(s, e, lo, hi)
    assert list(zip(s, e, strict=True)) == [(10, 40), (50, 61)]
    assert _overlap(s, e, 0, 100) == 41
    assert _overlap(s, e, 39, 51) == 2
    assert _overlap(s, e, 40, 50) == 0
