"""Insights and phases on real Darshan logs (imported into a real chDB store)."""

from __future__ import annotations

import pytest
from pharos_darshan_corpus import log

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.insights import job_insights
from pharos_analytics.phases import job_phases
from pharos_pipeline.darshan_import import import_log


def test_imbalanced_io_points_at_single_target_striping(store):
    r = import_log(store, log("imbalanced_io/imbalanced-io.darshan"))
    ins = {i.id: i for i in job_insights(store, r.job_id).insights}
    imb = ins["rank_imbalance_bytes"]
    assert imb.severity == "high" and imb.source == "counters"
    assert imb.evidence["slowest_rank"] == 0 and imb.evidence["imbalance"] > 0.99
    assert imb.evidence["stripe_count"] == 1 and "ONE storage target" in imb.message
    assert "lfs setstripe" in imb.recommendations[0]
    assert ins["rank_imbalance_time"].evidence["stripe_count"] == 1
    st = ins["single_target_shared_file"]
    assert st.evidence["ranks"] == 496 and st.evidence["worst_file"] == imb.evidence["worst_file"]
    prof = job_phases(store, r.job_id)
    assert prof.source == "counters" and prof.phases == [] and prof.job.io_ranks == 496


def test_one_byte_hdf5_writes_give_the_small_write_insight(store):
    r = import_log(store, log("hdf5_diagonal_write_only/hdf5_diagonal_write_1_byte_dxt.darshan"))
    small = {i.id: i for i in job_insights(store, r.job_id).insights}["small_writes"]
    # All 40 POSIX writes are small; 40 is under Drishti's 1000, so the default severity is info.
    assert small.evidence["small_requests"] == small.evidence["requests"] == 40
    assert small.severity == "info"
    strict = {i.id: i for i in job_insights(store, r.job_id, DiagnosisConfig(small_requests_absolute=10)).insights}
    # 40 requests pass a count threshold of 10, but their 15,930 bytes are no material share of the job's
    # 2.6 MB nor of its I/O time: significance keeps it below high.
    sig = strict["small_writes"].evidence["significance"]
    assert strict["small_writes"].severity == "warn" and sig["bytes_share"] < 0.01, sig
    assert sig["time_share"] < 0.1, sig
    loose = DiagnosisConfig(small_requests_absolute=10, significance_share=0.0)
    assert {i.id: i.severity for i in job_insights(store, r.job_id, loose).insights}["small_writes"] == "high"
    # The DXT trace gives the phases: the 1-byte writes are there as requests.
    jp = job_phases(store, r.job_id)
    assert jp.source == "trace" and jp.job.writes == 40 and jp.job.size_class == "small"
    n1 = store.query(
        "SELECT count() AS n FROM io_requests WHERE job_id = {j:String} AND op = 'write' AND size = 1", {"j": r.job_id}
    )[0]["n"]
    assert int(n1) == 10


def test_empty_log_has_no_insight(store):
    r = import_log(store, log("empty_log/empty_log.darshan"))
    ji = job_insights(store, r.job_id)
    assert ji.insights == [] and ji.phases.source == "none"


def test_imbalanced_io_prices_its_straggler_from_the_logs_own_counters(store):
    """The price of the shared-file straggler (Drishti P19) read back against the log itself
    (PyDarshan, not the store): POSIX_F_SLOWEST_RANK_TIME minus the mean rank time of the one
    shared record; every price within the job's run time, ordered by it."""
    import darshan

    path = log("imbalanced_io/imbalanced-io.darshan")
    rep = darshan.DarshanReport(str(path), read_all=True)
    df = rep.records["POSIX"].to_df()
    c, f = df["counters"], df["fcounters"]
    shared = c[c["rank"] == -1].merge(f[f["rank"] == -1], on=["id", "rank"])
    assert len(shared) == 1
    rec = shared.iloc[0]
    nprocs = rep.metadata["job"]["nprocs"]
    t = rec.POSIX_F_READ_TIME + rec.POSIX_F_WRITE_TIME + rec.POSIX_F_META_TIME
    expect = rec.POSIX_F_SLOWEST_RANK_TIME - t / nprocs  # 583.1 s - 660.6 s / 496 ranks

    r = import_log(store, path)
    ins = job_insights(store, r.job_id).insights
    got = {i.id: i for i in ins}
    assert got["rank_imbalance_time"].seconds_lost == pytest.approx(expect, rel=1e-6)
    assert got["rank_imbalance_time"].drishti_code == "P19"
    run_time = rep.metadata["job"]["run_time"]  # 1479 s
    priced = [i.seconds_lost for i in ins if i.seconds_lost is not None]
    assert priced and all(0 <= s <= run_time for s in priced), (priced, run_time)
    assert priced == sorted(priced, reverse=True) and ins[0].id in ("rank_imbalance_bytes", "rank_imbalance_time")
