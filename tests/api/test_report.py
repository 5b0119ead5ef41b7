"""The job report (issue 11 item 2): ``GET /v1/jobs/{id}/report`` and ``pharos report JOB --html
FILE`` on a real chDB store: one self-contained page (no external resource: every image is a
data URI) with the diagnosis in plain words and its plots; and a job of 2,048 ranks and
1,000,000 requests (generated in the store by SQL) whose report bins every rank. Issue 24: a
running job's page carries its live refresh (a finished job's none), each insight its seconds
lost, the heat map where its plot areas lie."""

from __future__ import annotations

import dataclasses
import re
import time

from pharos_synthetic_jobs import T0, event
from typer.testing import CliRunner

from pharos_analytics.insights.model import Insight
from pharos_analytics.report_data import rank_time_bytes
from pharos_api.cli import app as cli_app
from pharos_api.report import insight_html, ordered_insights, render_report

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


def test_running_job_page_refreshes_itself_finished_page_has_no_script(client):
    # "n1" has a start event and no end: running
    r = client.get("/v1/jobs/n1/report", params={"refresh_s": 3})
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    page = r.text
    assert '<meta name="pharos-refresh" content="3">' in page and page.count("<script>") == 1
    assert "(running)</title>" in page and "refreshes itself every 3 s until the job ends" in page
    assert external_refs(page) == []
    # refresh_s=0: the running job's page says it is running, and has no script
    still = client.get("/v1/jobs/n1/report", params={"refresh_s": 0}).text
    assert "The job is running" in still and "<script" not in still and "pharos-refresh" not in still
    finished = client.get("/v1/jobs/mix/report", params={"refresh_s": 3}).text
    assert "<script" not in finished and "pharos-refresh" not in finished and "The job is running" not in finished
    assert client.get("/v1/jobs/n1/report", params={"refresh_s": -1}).status_code == 422


def test_heat_map_says_where_its_plot_areas_are(client):
    page = client.get("/v1/jobs/mix/report").text
    (img,) = re.findall(r'<img [^>]*alt="rank x time heat map"[^>]*>', page)
    attrs = dict(re.findall(r'data-([a-z0-9-]+)="([^"]*)"', img))
    panels = [a.split(":") for a in attrs["axes"].split(";")]
    # job "mix" writes and reads: two panels, writes above reads, each a sane box inside the image
    assert [d for d, _ in panels] == ["write", "read"], panels
    boxes = [tuple(map(float, b.split(","))) for _, b in panels]
    for x0, y0, x1, y1 in boxes:
        assert 0 < x0 < x1 < 1 and 0 < y0 < y1 < 1
    assert boxes[0][3] < boxes[1][1]  # the write panel ends above the read panel
    assert int(attrs["t0-ns"]) > 0 and float(attrs["span-s"]) > 0


@dataclasses.dataclass(frozen=True)
class LostInsight(Insight):
    """An Insight with the seconds_lost field the analytics are gaining (issue 24)."""

    seconds_lost: float | None = None


def _insight(i: str, severity: str, lost: float | None) -> LostInsight:
    return LostInsight(i, f"title {i}", severity, "trace", f"message {i}", {}, ["do this"], "rule", lost)


def test_insights_show_seconds_lost_most_first():
    a, b, c, d = (
        _insight("a", "info", 12.34),
        _insight("b", "high", None),
        _insight("c", "warn", 40.0),
        _insight("d", "high", 1.0),
    )
    assert [i.id for i in ordered_insights([a, b, c, d])] == ["c", "a", "d", "b"]
    assert "<span class='lost'>~12.3 s lost</span>" in insight_html(a)
    assert "lost" not in insight_html(b)
    # an Insight without the field at all (before the analytics have it): no estimate shown
    plain = Insight("p", "t", "warn", "trace", "m", {}, [], "rule")
    assert "lost" not in insight_html(plain) and ordered_insights([plain, a])[0] is a
