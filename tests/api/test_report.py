"""The job report (issue 11 item 2): ``GET /v1/jobs/{id}/report`` and ``pharos report JOB --html
FILE`` on a real chDB store: one self-contained page (no external resource: every image is a
data URI) with the diagnosis in plain words and its plots; and a job of 2,048 ranks and
1,000,000 requests (generated in the store by SQL) whose report bins every rank."""

from __future__ import annotations

import re
import time

from pharos_synthetic_jobs import T0, event
from typer.testing import CliRunner

from pharos_analytics.report_data import rank_time_bytes
from pharos_api.cli import app as cli_app
from pharos_api.report import render_report

RANKS = 2048
REQUESTS = 1_000_000


def external_refs(page: str) -> list[str]:
    """src/href values that would need the network (anything but data: URIs and #anchors)."""
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", page, flags=re.I)
    refs += re.findall(r"url\(([^)]*)\)", page)
    return [r for r in refs if not r.startswith(("data:", "#"))]


def test_report_page_is_self_contained_and_says_the_diagnosis(client, api_url, tmp_path):
    r = client.get("/v1/jobs/mix/report")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text[:300]
    page = r.text
    assert "<h1>Job mix</h1>" in page and "I/O pattern" in page and "Diagnosis" in page
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) >= 3  # heat map, bandwidth, sizes
    assert external_refs(page) == []
    assert "<script" not in page.lower()
    assert client.get("/v1/jobs/no-such-job/report").status_code == 404
    out = tmp_path / "mix.html"
    res = CliRunner().invoke(cli_app, ["report", "mix", "--html", str(out), "--api", api_url])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("<!doctype html>") and "Job mix" in out.read_text()
    bad = CliRunner().invoke(cli_app, ["report", "no-such-job", "--html", str(tmp_path / "x.html"), "--api", api_url])
    assert bad.exit_code == 1 and "404" in bad.output and not (tmp_path / "x.html").exists()


def test_report_of_2048_ranks_and_a_million_requests(store):
    # every rank writes its own file in 488 requests of 1 MiB, 10 ms apart; rank 7 four times slower
    store.command(
        f"""
        INSERT INTO io_requests (start, end, duration_ns, layer, host, job_id, rank, pid, tid, comm, op,
            file_type, dev, inode, path, fd, offset, size, result, count, bytes, producer_id, seq, record_index)
        SELECT
            fromUnixTimestamp64Nano(toInt64({T0} + intDiv(number, {RANKS}) * if(number % {RANKS} = 7, 4, 1) * 10000000), 'UTC'),
            fromUnixTimestamp64Nano(toInt64({T0} + intDiv(number, {RANKS}) * if(number % {RANKS} = 7, 4, 1) * 10000000 + 5000000), 'UTC'),
            5000000, 'client', 'cn01', 'big', toInt32(number % {RANKS}), 100, 100, 'ior', 'pwrite',
            'regular', 1, number % {RANKS}, concat('/scratch/big/', toString(number % {RANKS})), 3,
            intDiv(number, {RANKS}) * 1048576, 1048576, 1048576, 1, 1048576, 'gen', intDiv(number, 1000),
            toUInt32(number % 1000)
        FROM numbers({REQUESTS})
        """
    )
    store.insert_rows("job_events", [event("big", "start", 0, name="ior", ranks=RANKS), event("big", "end", 30)])
    t0 = time.monotonic()
    rt = rank_time_bytes(store, "big", bins=240)
    t_bin = time.monotonic() - t0
    assert rt is not None and rt.rows == RANKS and rt.ranks_per_row == 1 and rt.records == REQUESTS
    assert sum(map(sum, rt.write)) == REQUESTS * 1048576  # every byte in exactly one cell share
    # rank 7's bytes reach later bins than any other rank's
    last = [max((j for j, v in enumerate(row) if v), default=-1) for row in rt.write]
    assert last[7] == max(last) and last[7] > sorted(last)[-2]
    t0 = time.monotonic()
    page = render_report(store, "big")
    t_page = time.monotonic() - t0
    assert page is not None and "2048 rank rows" in page and external_refs(page) == []
    print(
        f"\n[report] 2,048 ranks x 1,000,000 requests: binned in {t_bin:.1f} s, page in {t_page:.1f} s, {len(page) // 1024} KiB"
    )
