"""Every insight priced (issue 24, item 2): ``seconds_lost`` of each rule on synthetic rows in a
real chDB store, the numbers worked out by hand from the rows; the order by it."""

from __future__ import annotations

import pytest
from pharos_diag_rows import KiB, MiB, ctr, req, start_event

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.insights import job_insights
from pharos_analytics.insights.model import DRISHTI_CODES, Insight, order_key
from pharos_analytics.insights.price import Pricer, price_straggler_resource
from pharos_analytics.insights.run import RULES, catalogue
from pharos_analytics.system_diag import interference_price

#: Seconds before T0 of the jobs that price against the site (nothing else of the store is near).
PAST = -6e8


def _log(job, nprocs):
    return {"log_sha256": job, "log_id": f"darshan:{job}", "job_id": job, "nprocs": nprocs, "rank_offset": 0}


@pytest.fixture(scope="module")
def jobs(store):
    rows = []
    # small: 1000 writes of 4 KiB at 1 ms, 10 writes of 4 MiB at 10 ms (400 MiB/s).
    rows += [req("small", 0, "write", "/s/a", i * 4 * KiB, 4 * KiB, t=i * 0.002) for i in range(1000)]
    rows += [
        req("small", 0, "write", "/s/a", 8 * MiB + i * 4 * MiB, 4 * MiB, t=3 + i * 0.02, dur=0.01) for i in range(10)
    ]
    # random: 1500 reads of 4 KiB going backwards at 2 ms, 500 consecutive ones at 0.1 ms.
    rows += [
        req("random", 0, "read", "/s/r", (1500 - i) * 8 * KiB, 4 * KiB, t=i * 0.003, dur=0.002) for i in range(1500)
    ]
    rows += [req("random", 0, "read", "/s/c", i * 4 * KiB, 4 * KiB, t=5 + i * 0.001, dur=0.0001) for i in range(500)]
    # misaligned: 200 aligned 4 KiB writes at 0.1 ms, 800 one byte off at 0.5 ms.
    rows += [req("misal", 0, "write", "/s/m", i * 4 * KiB, 4 * KiB, t=i * 0.001, dur=0.0001) for i in range(200)]
    rows += [
        req("misal", 0, "write", "/s/m", MiB + i * 4 * KiB + 1, 4 * KiB, t=1 + i * 0.001, dur=0.0005)
        for i in range(800)
    ]
    # fsync: 200 writes of 4 KiB each followed by a 1 ms fsync, one file.
    for i in range(200):
        rows += [
            req("fsync", 0, "write", "/s/f", i * 4 * KiB, 4 * KiB, t=i * 0.01),
            req("fsync", 0, "fsync", "/s/f", 0, 0, t=i * 0.01 + 0.005),
        ]
    # imbalance: 4 ranks, private files; ranks 0-2 write 1 MiB in 1 s, rank 3 4 MiB in 4 s.
    for r in range(4):
        n = 4 if r == 3 else 1
        rows += [req("imb", r, "write", f"/s/i.{r}", 0, n * MiB, t=0, dur=float(n))]
    # shared: ranks 0-2 on one file: rank 0 10 MiB in 5 s, ranks 1 and 2 1 MiB in 0.5 s.
    rows += [req("shared", 0, "write", "/s/sh", 0, 10 * MiB, t=0, dur=5)]
    rows += [req("shared", r, "write", "/s/sh", r * 10 * MiB, MiB, t=0, dur=0.5) for r in (1, 2)]
    # reread: rank 0 reads the same 4 MiB three times, 0.1 s each.
    rows += [req("reread", 0, "read", "/s/rr", 0, 4 * MiB, t=i, dur=0.1) for i in range(3)]
    # In the past, alone: small writes only (priced at the site's bandwidth), their reference
    # job (4 MiB writes at 10 ms, 50 opens at 0.1 ms), and a job of 1000 stats at 2 ms.
    rows += [req("site-small", 0, "write", "/p/a", i * 4 * KiB, 4 * KiB, t=PAST + i * 0.002) for i in range(1000)]
    rows += [req("site-ref", 0, "write", "/p/b", i * 4 * MiB, 4 * MiB, t=PAST + i * 0.02, dur=0.01) for i in range(10)]
    rows += [req("site-ref", 0, "open", f"/p/o{i}", 0, 0, t=PAST + 1 + i * 0.001, dur=0.0001) for i in range(50)]
    rows += [req("meta", 0, "stat", f"/p/m{i}", 0, 0, t=PAST + i * 0.003, dur=0.002) for i in range(1000)]
    rows += [req("meta", 0, "write", "/p/md", 0, 4 * KiB, t=PAST + 4)]
    store.insert_rows("io_requests", rows)
    jobs = ["small", "random", "misal", "fsync", "imb", "shared", "reread", "site-small", "site-ref", "meta"]
    store.insert_rows("job_events", [start_event(j, 4) for j in jobs])
    # Darshan counters only: 1000 small + 10 large writes by rank 0 in 1.1 s; 2 MiB through
    # STDIO by rank 0 in 2 s next to 8 MiB of POSIX writes in 0.1 s; 4 ranks of MPI-IO, all
    # independent writes.
    c = []
    for k, v in (
        ("POSIX_WRITES", 1010),
        ("POSIX_SIZE_WRITE_1K_10K", 1000),
        ("POSIX_SIZE_WRITE_1M_4M", 10),
        ("POSIX_BYTES_WRITTEN", 1000 * 4 * KiB + 10 * 4 * MiB),
        ("POSIX_F_WRITE_TIME", 1.1),
    ):
        c.append(ctr("ctr-small", "POSIX", 0, 1, "/l/a", k, v))
    for k, v in (("POSIX_WRITES", 8), ("POSIX_BYTES_WRITTEN", 8 * MiB), ("POSIX_F_WRITE_TIME", 0.1)):
        c.append(ctr("ctr-stdio", "POSIX", 0, 1, "/l/p", k, v))
    for k, v in (("STDIO_WRITES", 512), ("STDIO_BYTES_WRITTEN", 2 * MiB), ("STDIO_F_WRITE_TIME", 2.0)):
        c.append(ctr("ctr-stdio", "STDIO", 0, 2, "/l/s", k, v))
    for k, v in (("MPIIO_INDEP_WRITES", 4000), ("MPIIO_BYTES_WRITTEN", 4000 * 64 * KiB), ("MPIIO_F_WRITE_TIME", 8.0)):
        c.append(ctr("ctr-mpiio", "MPI-IO", -1, 3, "/l/m", k, v))
    for k, v in (("POSIX_WRITES", 4000), ("POSIX_BYTES_WRITTEN", 4000 * 64 * KiB), ("POSIX_F_WRITE_TIME", 7.0)):
        c.append(ctr("ctr-mpiio", "POSIX", -1, 3, "/l/m", k, v))
    store.insert_rows("darshan_counters", c)
    store.insert_rows("darshan_logs", [_log("ctr-small", 1), _log("ctr-stdio", 1), _log("ctr-mpiio", 4)])
    return store


def ins(store, job, **cfg) -> dict[str, Insight]:
    return {i.id: i for i in job_insights(store, job, DiagnosisConfig(**cfg)).insights}


def test_small_writes_at_the_jobs_large_write_bandwidth(jobs):
    i = ins(jobs, "small")["small_writes"]
    # 1000 x 1 ms minus 4000 KiB at 40 MiB / 0.1 s.
    assert i.seconds_lost == pytest.approx(1.0 - 4000 * KiB / (400 * MiB), rel=1e-6)
    assert "large-write bandwidth (400.0 MiB/s)" in i.evidence["seconds_lost_basis"]
    assert i.drishti_code == "P06"


def test_small_writes_without_large_ones_at_the_sites_bandwidth(jobs):
    i = ins(jobs, "site-small")["small_writes"]
    assert i.seconds_lost == pytest.approx(1.0 - 4000 * KiB / (400 * MiB), rel=1e-6)
    assert "the site's large-write bandwidth" in i.evidence["seconds_lost_basis"]
    # The reference job itself has no small writes to price.
    assert "small_writes" not in ins(jobs, "site-ref")


def test_random_reads_at_the_consecutive_bandwidth(jobs):
    i = ins(jobs, "random")["random_reads"]
    # The first backwards read starts after offset 0 (sequential); 1499 random at 2 ms vs 4 KiB / 0.1 ms.
    assert i.evidence["random"] == 1499
    assert i.seconds_lost == pytest.approx(1499 * (0.002 - 0.0001), rel=1e-6)
    assert i.drishti_code == "P11"


def test_misaligned_at_the_aligned_bandwidth(jobs):
    i = ins(jobs, "misal")["misaligned_file"]
    assert i.seconds_lost == pytest.approx(800 * (0.0005 - 0.0001), rel=1e-6)


def test_metadata_beyond_the_sites_median_latency(jobs):
    i = ins(jobs, "meta", metadata_time_rank_s=1)["metadata_time"]
    # 1000 stats of 2 ms against the site's opens of 0.1 ms (the job's one write is data).
    assert i.seconds_lost == pytest.approx(2.0 - 1000 * 0.0001, rel=1e-3)
    assert "site's median metadata latency" in i.evidence["seconds_lost_basis"]
    # fsync time is no metadata time to price (it flushes data: fsync_storm prices it)
    f = ins(jobs, "fsync", metadata_time_rank_s=0.1)["metadata_time"]
    assert f.evidence["worst_s"] == pytest.approx(0.2) and f.seconds_lost == 0


def test_rank_imbalance_is_the_slowest_minus_the_median(jobs):
    got = ins(jobs, "imb")
    assert got["rank_imbalance_time_per_rank"].seconds_lost == pytest.approx(4.0 - 1.0)
    # rank 3's 4 s for 4 MiB against the median's 1 MiB: 3 s of it.
    assert got["rank_imbalance_bytes_per_rank"].seconds_lost == pytest.approx(3.0)


def test_shared_file_straggler_is_the_slowest_minus_the_median_rank(jobs):
    i = ins(jobs, "shared")["rank_imbalance_bytes"]
    assert i.seconds_lost == pytest.approx(5.0 - 0.5)
    assert i.drishti_code == "P18"


def test_redundant_reads_at_the_read_bandwidth(jobs):
    i = ins(jobs, "reread")["redundant_reads"]
    # 8 of the 12 MiB read again, at 12 MiB / 0.3 s.
    assert i.seconds_lost == pytest.approx(8 / 40) and i.drishti_code == "P09"


def test_counters_small_writes_pro_rata(jobs):
    i = ins(jobs, "ctr-small")["small_writes"]
    assert i.source == "counters"
    t_small = 1.1 * 1000 / 1010
    big_b = 1000 * 4 * KiB + 40 * MiB - 1000 * 3162
    ref = big_b / (1.1 * 10 / 1010)
    assert i.seconds_lost == pytest.approx(t_small - 1000 * 3162 / ref, rel=1e-3)
    # The true loss of such a job (1 s of small writes, 4 MiB ones at 10 ms) is 0.99 s: within 10%.
    assert abs(i.seconds_lost - 0.99) / 0.99 < 0.1


def test_stdio_at_the_posix_bandwidth(jobs):
    i = ins(jobs, "ctr-stdio")["stdio_heavy"]
    assert i.seconds_lost == pytest.approx(2.0 - 2 * MiB / (8 * MiB / 0.1))
    assert i.drishti_code == "S01"


def test_mpiio_without_collectives_fires_and_says_why_it_is_not_priced(jobs):
    i = ins(jobs, "ctr-mpiio")["mpiio_independent_writes"]
    assert i.drishti_code == "M03" and i.evidence["independent"] == 4000
    # Counters alone, and no large writes of any job near it: no reference bandwidth.
    assert i.seconds_lost is None and "no large writes" in i.evidence["seconds_lost_basis"]


def test_straggler_resource_and_interference_prices():
    i = Insight("straggler_resource", "", "high", "trace", "", {"excess_time_s": 12.0, "n_ranks": 4}, [], "")
    s, basis = price_straggler_resource(None, i)  # type: ignore[arg-type]
    assert s == 3.0 and "4 rank(s)" in basis
    ev = {"start_ns": 10, "end_ns": 30, "baseline_latency_ms": 2.0, "baseline_source": "quiet_windows"}
    windows = [
        {"start_ns": 0, "requests": 100, "latency_ms": 9.0},  # before the event
        {"start_ns": 10, "requests": 1000, "latency_ms": 6.0},
        {"start_ns": 20, "requests": 500, "latency_ms": 1.0},  # faster than the baseline: no loss
    ]
    s, basis = interference_price(ev, windows, ranks=2)
    assert s == pytest.approx(1000 * 4e-3 / 2) and "1500 requests" in basis


def test_order_is_by_seconds_lost_then_severity():
    def mk(id_, sev, lost):
        return Insight(id_, "", sev, "trace", "", {}, [], "", seconds_lost=lost)

    got = sorted(
        [mk("a", "high", None), mk("b", "info", 3.0), mk("c", "high", 1.0), mk("d", "warn", None)], key=order_key
    )
    assert [i.id for i in got] == ["b", "c", "a", "d"]


def test_every_rule_prices_or_says_why_and_the_catalogue_lists_codes(jobs):
    for job in ("small", "random", "misal", "fsync", "imb", "shared", "reread", "ctr-small", "ctr-stdio", "ctr-mpiio"):
        for i in job_insights(jobs, job).insights:
            assert i.evidence["seconds_lost_basis"], (job, i.id)
            assert i.drishti_code == DRISHTI_CODES.get(i.id)
    cat = {c["rule"]: c for c in catalogue()}
    assert set(cat) == {r.__name__ for r in RULES}
    assert cat["small_requests"]["drishti_codes"] == ["P05", "P06"]
    assert all(c["insights"] for c in cat.values()), [k for k, c in cat.items() if not c["insights"]]


def test_pricer_reads_the_trace_once(jobs):
    from pharos_analytics.insights.evidence import Counters, Trace

    cfg = DiagnosisConfig()
    p = Pricer(Counters(jobs, "small"), Trace(jobs, "small", cfg), cfg)
    assert p.rank_rows() is p.rank_rows()
    assert p.job_bw("write", "large") == pytest.approx(400 * MiB)
