"""Issue 24: a Darshan job's totals come from its module counters even when its log has DXT, and the
summary says how much the DXT covers; DFS (DAOS) logs count their I/O. Real logs, a real chDB store.

Every expected figure is summed independently here from the log with PyDarshan
(``darshan.DarshanReport(path, read_all=True)``), module by module."""

from __future__ import annotations

import io
from dataclasses import asdict

import darshan
import pytest
from pharos_darshan_corpus import log
from rich.console import Console

from pharos_analytics.phases import job_phases
from pharos_analytics.summary import job_summary, list_jobs
from pharos_analytics.summary_dxt import dxt_text
from pharos_analytics.summary_sql import ns_to_datetime
from pharos_api.cli_jobs import human_bytes, render_job
from pharos_api.report import render_report
from pharos_api.schemas.jobs import JobListItemOut, JobSummaryOut
from pharos_pipeline.darshan_import import import_log

PARTIAL_DXT = "partial_data_dxt/partial_data_dxt.darshan"  # DXT_POSIX/DXT_MPIIO overflowed
PARTIAL_STDIO = "partial_data_stdio/partial_data_stdio.darshan"  # >1024 fopen()ed files, no DXT
NONMPI_DXT = "nonmpi_dxt_anonymized/nonmpi_dxt_anonymized.darshan"  # DXT_POSIX + STDIO files
DFS = "ior_daos/snyder_ior-DFS_id4681120-53379_5-8-15060-3270540599978592154_1.darshan"
POSIX_TWIN = "ior_daos/snyder_ior-POSIX_id1057716-202103_11-8-64415-6936117869459351096_1.darshan"
COMPLETE_DXT = (
    "release_logs/mpi-io-test-x86_64-3.1.6.darshan",
    "mpi_io_test_with_dxt/treddy_mpi-io-test_id4373053_6-2-60198-9815401321915095332_1.darshan",
)
STREAMS = ("<STDIN>", "<STDOUT>", "<STDERR>")


def report(rel: str):
    return darshan.DarshanReport(str(log(rel)), read_all=True)


def module_sums(r, module: str, prefix: str) -> dict[str, int]:
    """Bytes, reads and writes of one module's records in a PyDarshan report, the standard
    streams left out (they are non-file ops)."""
    if module not in r.records:
        return {"read": 0, "written": 0, "reads": 0, "writes": 0}
    c = r.records[module].to_df()["counters"]
    files = c[~c["id"].map(lambda i: r.name_records.get(i) in STREAMS)]
    return {
        "read": int(files[f"{prefix}BYTES_READ"].sum()),
        "written": int(files[f"{prefix}BYTES_WRITTEN"].sum()),
        "reads": int(files[f"{prefix}READS"].sum()),
        "writes": int(files[f"{prefix}WRITES"].sum()),
    }


def dxt_bytes(r, module: str = "DXT_POSIX") -> int:
    """Bytes of a DXT module's read and write segments."""
    total = 0
    for rec in r.records.get(module, []):
        for key in ("read_segments", "write_segments"):
            segs = rec[key]
            rows = segs.to_dict("records") if hasattr(segs, "to_dict") else segs
            total += sum(int(s["length"]) for s in rows)
    return total


def posix_counter_bytes(r) -> int:
    """POSIX bytes over every record, the standard streams included (what DXT_POSIX may trace)."""
    c = r.records["POSIX"].to_df()["counters"]
    return int(c["POSIX_BYTES_READ"].sum() + c["POSIX_BYTES_WRITTEN"].sum())


def log_span_s(r) -> float:
    """The log's end - start (s), from its job record."""
    j = r.metadata["job"]
    ns = (j["end_time_sec"] - j["start_time_sec"]) * 10**9 + j.get("end_time_nsec", 0) - j.get("start_time_nsec", 0)
    return ns / 1e9


def imported(store, rel: str) -> str:
    """The job id of ``rel`` in this module's store (imported once; a second import is skipped)."""
    r = import_log(store, log(rel))
    assert r.status in ("imported", "skipped"), r.error
    return r.job_id


def test_partial_dxt_totals_come_from_the_counters(store):
    r = report(PARTIAL_DXT)
    posix, stdio = module_sums(r, "POSIX", "POSIX_"), module_sums(r, "STDIO", "STDIO_")
    want_read = posix["read"] + stdio["read"]
    assert want_read == 1_000_000  # the log's reads: 1 MB, of which DXT kept 64 KiB
    s = job_summary(store, imported(store, PARTIAL_DXT))
    assert s.source == "darshan-counters+dxt"
    assert (s.bytes_read, s.bytes_written) == (want_read, posix["written"] + stdio["written"])
    assert s.ops["read"] == posix["reads"] + stdio["reads"] and s.data_requests == s.ops["read"] + s.ops.get("write", 0)
    assert sum(s.size_histogram["read"].values()) == posix["reads"]  # STDIO has no histogram
    # the DXT rows stay the per-request detail
    traced = dxt_bytes(r)
    assert s.records == s.data_records == 65536 and 0 < traced < want_read
    # ... and the coverage says how much they hold, and that the log marked DXT partial
    partial = sorted(m for m, info in r.modules.items() if m.startswith("DXT") and info.get("partial_flag"))
    assert partial == ["DXT_MPIIO", "DXT_POSIX"]
    d = s.dxt
    assert d is not None and d.partial and d.partial_modules == partial
    assert (d.bytes, d.counter_bytes, d.records) == (traced, posix_counter_bytes(r), 65536)
    assert d.share == pytest.approx(traced / posix_counter_bytes(r)) and d.share < 0.07
    # a partial DXT misses requests: the I/O window is the log's, not the DXT's
    assert s.io_span_s == pytest.approx(log_span_s(r))
    # the API, `pharos job` and the report say it
    out = JobSummaryOut.model_validate(s).model_dump(mode="json")
    assert out["source"] == "darshan-counters+dxt" and out["dxt"]["partial"] is True
    assert out["dxt"]["share"] == pytest.approx(d.share)
    assert dxt_text(out["dxt"]) == (
        f"DXT covers 6.5% of the bytes ({traced:,} of 1,000,000 B; partial: DXT_MPIIO, DXT_POSIX out of trace memory)"
    )
    console = Console(file=io.StringIO(), width=200, record=True)
    render_job(console, out)
    text = console.export_text()
    assert "DXT covers 6.5% of the bytes" in text and "source darshan-counters+dxt" in text
    assert f"read {human_bytes(want_read)}" in text, text
    html = render_report(store, s.job_id)
    assert "DXT covers 6.5% of the bytes" in html and "darshan-counters+dxt" in html


def test_stdio_files_count_beside_a_complete_dxt(store):
    r = report(NONMPI_DXT)
    posix, stdio = module_sums(r, "POSIX", "POSIX_"), module_sums(r, "STDIO", "STDIO_")
    assert stdio["read"] > 0 and stdio["written"] > 0  # files read and written through fopen()
    s = job_summary(store, imported(store, NONMPI_DXT))
    assert s.source == "darshan-counters+dxt"
    assert (s.bytes_read, s.bytes_written) == (posix["read"] + stdio["read"], posix["written"] + stdio["written"])
    assert s.data_requests == posix["reads"] + posix["writes"] + stdio["reads"] + stdio["writes"]
    # DXT holds every POSIX byte (STDIO is no part of what it can trace): complete
    assert s.dxt is not None and not s.dxt.partial and s.dxt.share == 1.0
    assert s.dxt.bytes == dxt_bytes(r) == posix_counter_bytes(r)
    # a complete DXT gives the real I/O window: its first request's start, its last one's end
    row = store.query(
        "SELECT toUnixTimestamp64Nano(min(start)) AS first, toUnixTimestamp64Nano(max(end)) AS last "
        "FROM io_requests WHERE job_id = {j:String}",
        {"j": s.job_id},
    )[0]
    assert (s.first_io, s.last_io) == (ns_to_datetime(row["first"]), ns_to_datetime(row["last"]))
    assert s.io_span_s == pytest.approx((int(row["last"]) - int(row["first"])) / 1e9)
    assert s.io_span_s < log_span_s(r)


def test_partial_stdio_log_counts_its_stdio_bytes(store):
    r = report(PARTIAL_STDIO)
    posix, stdio = module_sums(r, "POSIX", "POSIX_"), module_sums(r, "STDIO", "STDIO_")
    assert stdio["written"] > 10**10 and r.modules["STDIO"]["partial_flag"]
    s = job_summary(store, imported(store, PARTIAL_STDIO))
    assert (s.bytes_read, s.bytes_written) == (posix["read"] + stdio["read"], posix["written"] + stdio["written"])
    assert s.source == "darshan-counters" and s.dxt is None  # no DXT in that log


def test_dfs_log_counts_its_dfs_bytes_once(store):
    r = report(DFS)
    dfs = module_sums(r, "DFS", "DFS_")
    c = r.records["DFS"].to_df()["counters"]
    daos = r.records["DAOS"].to_df()["counters"]
    assert dfs["read"] == dfs["written"] == 16 * 2**20
    # DAOS sees the DFS file's bytes again (one DAOS array object per DFS file) plus DFS's own objects
    assert int(daos["DAOS_BYTES_READ"].sum()) > dfs["read"] and int(daos["DAOS_BYTES_WRITTEN"].sum()) > dfs["written"]
    s = job_summary(store, imported(store, DFS))
    assert (s.bytes_read, s.bytes_written) == (dfs["read"], dfs["written"])  # not 0, not DFS + DAOS
    assert s.source == "darshan-counters" and s.dxt is None
    assert s.ops["read"] == int(c["DFS_READS"].sum() + c["DFS_READXS"].sum()) == 64
    assert s.ops["write"] == int(c["DFS_WRITES"].sum() + c["DFS_WRITEXS"].sum()) == 64
    assert s.ops["open"] == int(c["DFS_OPENS"].sum() + c["DFS_GLOBAL_OPENS"].sum())
    assert s.size_histogram["read"]["100K-1M"] == int(c["DFS_SIZE_READ_100K_1M"].sum()) == 64
    f = r.records["DFS"].to_df()["fcounters"]
    assert s.io_time_s == pytest.approx(float(f["DFS_F_READ_TIME"].sum() + f["DFS_F_WRITE_TIME"].sum()))
    # one shared file of 16 ranks, as its POSIX twin (the same IOR run through POSIX)
    assert (s.n_files, s.io_ranks, s.pattern) == (1, 16, "N-1")
    tr = report(POSIX_TWIN)
    posix = module_sums(tr, "POSIX", "POSIX_")
    twin = job_summary(store, imported(store, POSIX_TWIN))
    assert twin.source == "darshan-counters"
    assert (twin.bytes_read, twin.bytes_written) == (posix["read"], posix["written"]) == (s.bytes_read, s.bytes_written)
    assert (twin.n_files, twin.io_ranks, twin.pattern) == (1, 16, "N-1")
    assert twin.ops["read"] == s.ops["read"] and twin.ops["write"] == s.ops["write"]


@pytest.mark.parametrize("rel", COMPLETE_DXT)
def test_complete_dxt_is_not_partial(store, rel):
    r = report(rel)
    assert not any(info.get("partial_flag") for info in r.modules.values())
    posix, stdio = module_sums(r, "POSIX", "POSIX_"), module_sums(r, "STDIO", "STDIO_")
    s = job_summary(store, imported(store, rel))
    assert s.source == "darshan-counters+dxt"
    assert (s.bytes_read, s.bytes_written) == (posix["read"] + stdio["read"], posix["written"] + stdio["written"])
    d = s.dxt
    assert d is not None and not d.partial and d.partial_modules == [] and d.share == 1.0
    assert d.bytes == d.counter_bytes == posix_counter_bytes(r) == dxt_bytes(r)
    assert d.records == s.records == s.data_records > 0
    assert "DXT covers 100% of the bytes" in dxt_text(asdict(d)) and "partial" not in dxt_text(asdict(d))


def test_job_list_and_phases_agree_with_the_summary(store):
    jobs = {rel: imported(store, rel) for rel in (PARTIAL_DXT, NONMPI_DXT, DFS, POSIX_TWIN, *COMPLETE_DXT)}
    listed = {j.job_id: j for j in list_jobs(store, limit=1000)}
    for rel, jid in jobs.items():
        s = job_summary(store, jid, coverage=False)
        item = listed[jid]
        assert (item.bytes_read, item.bytes_written, item.source) == (s.bytes_read, s.bytes_written, s.source), rel
        assert (item.pattern, item.patterns, item.fan_in_pattern) == (s.pattern, s.patterns, s.fan_in_pattern), rel
        assert (item.io_ranks, item.n_files) == (s.io_ranks, s.n_files), rel
        assert JobListItemOut.model_validate(item).model_dump()["source"] == s.source
        prof = job_phases(store, jid).job
        assert (prof.pattern, prof.io_ranks, prof.n_files) == (s.pattern, s.io_ranks, s.n_files), rel
    # the list has the counters' bytes, not the DXT's
    assert listed[jobs[PARTIAL_DXT]].bytes_read == 1_000_000
    assert listed[jobs[DFS]].bytes_written == 16 * 2**20
