"""The job report, trusted and live (issue 24, item 4), on real traced jobs, as a person sees it.

One real embedded stack (Kafka, eBPF agent, forwarding daemons and mount, pipeline + analytics +
API on chDB; ``pharos_testkit.running_stack``); jobs run through ``pharos run`` (fio on a local
directory: the eBPF agent traces them on the client layer); the report is rendered by Debian's
Chromium (Playwright), which fails the test on any console error or page error and refuses,
and counts, every request the page makes outside its origin.

1. A job with two I/O phases and an idle gap (fio writes 24 MiB at 8 MiB/s, ``sleep 3``, fio
   again): ``GET /v1/jobs/{id}/insights`` gives two phases, each holding one fio run's I/O (as
   fio's own JSON times it); the saved report (a file, opened offline) is screenshotted in
   Chromium and the heat map's pixels read back: every pixel column inside fio's two I/O
   windows (away from their edges by 3 time bins) is coloured, every column between them is
   blank, and the coloured columns form exactly two bands, whose edges are fio's.
2. A job writing 4 MiB steps (1 s of I/O, 1 s idle, 10 times): its report, loaded from the API
   while the job runs, refreshes itself: a later render shows more bytes written, a longer
   time axis and more seconds of the heat map coloured, without a navigation; once the job
   has ended the page shows it finished, with all its bytes, and stops refreshing.

Needs root (eBPF, cgroups, FUSE). Bounded: each job < 30 s; the module ~2 min.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from pharos_testkit import LIVE_STACK_MARKS, pharos_run, running_stack
from report_testkit import chromium_page, heatmap_pixels

from pharos_agents.runner import run_job
from pharos_api.demo import wait_for_summary

pytestmark = LIVE_STACK_MARKS

MiB = 1 << 20
FIO = "fio --ioengine=psync --output-format=json --disk_util=0 --rw=write --bs=64k"
ENV = {"PHAROS_CONTROL_PERIOD_S": "0", "PHAROS_DIAGNOSIS_DETECT_PERIOD_S": "30"}
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    t0 = time.monotonic()
    with running_stack(tmp_path_factory.mktemp("live-report"), "pharos-report", ENV, fwd_nodes=2) as settings:
        print(f"\n[report-live] stack ready in {time.monotonic() - t0:.1f} s")
        yield settings


def fio_runs(out: Path) -> list[dict]:
    """The fio JSON documents in a rank's output (one per fio run), in order."""
    text, dec, pos, docs = out.read_text(), json.JSONDecoder(), 0, []
    while (pos := text.find("{", pos)) >= 0:
        doc, pos = dec.raw_decode(text, pos)
        docs.append(doc)
    return docs


def fio_io_window(doc: dict) -> tuple[float, float]:
    """When a fio run did its I/O, as fio itself says (Unix seconds): its report's time
    (``timestamp_ms``, made as the run ends) minus the job's runtime, to that time. (fio 3.33
    has no ``job_start`` yet.)"""
    (j,) = doc["jobs"]
    end = doc["timestamp_ms"] / 1e3
    return end - j["job_runtime"] / 1e3, end


def written_on_page(page) -> int:
    """Bytes written as the page's "In short" table says it (``24.0 MiB written, ...``), bytes."""
    row = page.locator("table.kv tr", has_text="bytes").first.inner_text()
    m = re.search(r"([\d.]+) (B|KiB|MiB|GiB|TiB) written", row)
    assert m, row
    return int(float(m.group(1)) * UNITS[m.group(2)])


def bands(lit: list[bool], hole: int = 3) -> list[tuple[int, int]]:
    """Runs of lit columns [first, last], holes of up to ``hole`` columns closed."""
    runs: list[list[int]] = []
    for i, on in enumerate(lit):
        if on:
            if runs and i - runs[-1][1] <= hole + 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
    return [(a, b) for a, b in runs]


@pytest.mark.timeout(240)
def test_heat_map_pixels_show_the_jobs_phases(live, tmp_path: Path):
    job_id = f"phases-{os.getpid()}"
    data = tmp_path / "data"
    data.mkdir()
    phase = f"{FIO} --size=24m --rate=8m --filename={data}/f"
    cmd = ["sh", "-c", f"{phase} --name=first && sleep 3 && {phase} --name=second"]
    t0 = time.monotonic()
    res = run_job(live, job_id, cmd, ranks=1, name="two-phases", output_dir=tmp_path / "out", quiet=True)
    assert res.exit_code == 0, res.rank_exit_codes
    runs = fio_runs(res.outputs[0])
    total = sum(j["write"]["io_bytes"] for d in runs for j in d["jobs"])
    assert len(runs) == 2 and total == 48 * MiB
    wrote = [fio_io_window(d) for d in runs]  # when the job did I/O, by fio
    s = wait_for_summary(live.api_url, job_id, total, timeout_s=60)
    assert s is not None and s["bytes_written"] == total, s
    t_job = time.monotonic() - t0
    # the phases as the API gives them: two, each holding one fio run's I/O, the sleep between
    ph = httpx.get(f"{live.api_url}/v1/jobs/{job_id}/insights", timeout=60).json()["phases"]["phases"]
    spans = [
        (
            datetime.fromisoformat(p["profile"]["start"]).timestamp(),
            datetime.fromisoformat(p["profile"]["end"]).timestamp(),
        )
        for p in ph
    ]
    assert len(spans) == 2, ph
    for (a, b), (fa, fb) in zip(spans, wrote, strict=True):
        assert a - 0.1 <= fa and fb <= b + 0.1, (spans, wrote)
    gap = wrote[1][0] - wrote[0][1]
    assert 3 <= gap <= 5, gap
    # the report saved as a file and opened offline, as a person would
    page_file = tmp_path / "report.html"
    page_file.write_text(httpx.get(f"{live.api_url}/v1/jobs/{job_id}/report", timeout=120).text)
    with chromium_page() as (page, seen):
        page.goto(page_file.as_uri(), wait_until="load")
        assert page.inner_text("h1") == f"Job {job_id}"
        assert written_on_page(page) == total
        px = heatmap_pixels(page, "write")
        page.wait_for_timeout(500)
    (tmp_path / "heatmap.png").write_bytes(px.png)
    assert seen.errors == [] and seen.refused == [], (seen.errors, seen.refused)
    # fio's I/O in seconds after the heat map's first column; margin: 3 time bins (240 per span), 2 px
    rel = [(a - px.t0_ns / 1e9, b - px.t0_ns / 1e9) for a, b in wrote]
    margin = 3 * px.span_s / 240 + 2 * px.span_s / px.area_w
    inside = [i for i in range(len(px.lit)) if any(a + margin < px.seconds(i) < b - margin for a, b in rel)]
    in_gap = [i for i in range(len(px.lit)) if rel[0][1] + margin < px.seconds(i) < rel[1][0] - margin]
    lit_inside = sum(px.lit[i] for i in inside) / len(inside)
    lit_gap = [round(px.seconds(i), 2) for i in in_gap if px.lit[i]]
    found = bands(px.lit)
    print(
        f"\n[report-live] two-phase job ({t_job:.1f} s): fio wrote at {[(round(a, 2), round(b, 2)) for a, b in rel]} s, "
        f"gap {gap:.2f} s; API phases {[(round(a - px.t0_ns / 1e9, 2), round(b - px.t0_ns / 1e9, 2)) for a, b in spans]} s; heat map {len(px.lit)} px over {px.span_s:.2f} s: {lit_inside:.1%} of {len(inside)} "
        f"columns inside the phases lit, {len(lit_gap)} of {len(in_gap)} in the gap; bands (s) "
        f"{[(round(px.seconds(a), 2), round(px.seconds(b), 2)) for a, b in found]}; {tmp_path / 'heatmap.png'}"
    )
    assert len(inside) > 200 and len(in_gap) > 100  # the phases and the gap are wide on screen
    assert lit_inside >= 0.98 and lit_gap == []
    assert len(found) == 2, found
    for (a, b), (sa, sb) in zip(found, rel, strict=True):  # each band lies on one fio run's I/O
        assert sa - margin <= px.seconds(a) <= sa + margin and sb - margin <= px.seconds(b) <= sb + margin


@pytest.mark.timeout(240)
def test_running_jobs_report_refreshes_with_new_io(live, tmp_path: Path):
    job_id = f"steps-{os.getpid()}"
    data = tmp_path / "data"
    data.mkdir()
    step = f"{FIO} --size=4m --rate=4m --filename={data}/f --name=s$i"
    argv, env = pharos_run(
        live, job_id, ["sh", "-c", f"for i in 1 2 3 4 5 6 7 8 9 10; do {step} || exit 1; sleep 1; done"]
    )
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"{live.api_url}/v1/jobs/{job_id}/report?refresh_s=2"
    try:
        # the job runs and some of its I/O is stored
        deadline = time.monotonic() + 30
        while True:
            r = httpx.get(f"{live.api_url}/v1/jobs/{job_id}", timeout=10)
            if r.status_code == 200 and r.json()["state"] == "running" and r.json()["bytes_written"] > 0:
                break
            assert time.monotonic() < deadline and proc.poll() is None, (r.status_code, r.text[:300])
            time.sleep(0.5)
        t_get = time.monotonic()
        assert httpx.get(url, timeout=60).status_code == 200
        t_get = time.monotonic() - t_get  # what one render of the running job's report costs
        with chromium_page(allowed=(live.api_url + "/", "data:")) as (page, seen):
            t_load = time.monotonic()
            page.goto(url, wait_until="load")
            assert "The job is running" in page.inner_text("#pharos-live")
            b1, px1 = written_on_page(page), heatmap_pixels(page)
            # the page refreshes itself (no navigation): wait until it shows more bytes
            page.wait_for_function(
                "([b]) => !document.querySelector('table.kv').innerText.includes(b)",
                arg=[page.locator("table.kv tr", has_text="bytes").first.inner_text().split("\t")[1]],
                timeout=20_000,
            )
            t_second = time.monotonic() - t_load
            still_running = page.locator("#pharos-live").count() == 1
            b2, px2 = written_on_page(page), heatmap_pixels(page)
            assert proc.wait(60) == 0, proc.stderr.read().decode()[-2000:]
            # once the job has ended the page says so, with all of its bytes, and stops refreshing
            page.wait_for_function(
                "() => document.querySelector('table.kv td:nth-child(2)').textContent.startsWith('finished')",
                timeout=30_000,
            )
            final = wait_for_summary(live.api_url, job_id, 40 * MiB, timeout_s=30)
            reloaded = written_on_page(page) != final["bytes_written"]
            if reloaded:  # a record stored after the end event: the page opened again has it
                page.reload(wait_until="load")
            b3 = written_on_page(page)
            fetched = sum(u == url for u in seen.requests)
            time.sleep(6)  # three refresh periods
            fetched_after = sum(u == url for u in seen.requests)
            navigations = seen.navigations
            live_banner = page.locator("#pharos-live").count()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(20)
    print(
        f"\n[report-live] running job (report served in {t_get:.1f} s): first render {b1 / MiB:.1f} MiB, {px1.span_s:.1f} s axis, "
        f"{px1.lit_seconds():.1f} s lit; refreshed by itself after {t_second:.1f} s: {b2 / MiB:.1f} MiB, "
        f"{px2.span_s:.1f} s axis, {px2.lit_seconds():.1f} s lit (running {still_running}); finished: "
        f"{b3 / MiB:.1f} MiB; {fetched} fetches, {fetched_after - fetched} after the end; navigations {navigations} (reloaded {reloaded})"
    )
    assert seen.errors == [] and seen.refused == [], (seen.errors, seen.refused)
    assert still_running and b2 > b1 and px2.span_s > px1.span_s and px2.lit_seconds() > px1.lit_seconds()
    assert b3 == final["bytes_written"] == 40 * MiB and live_banner == 0
    assert navigations == 1 + reloaded and fetched >= 3 and fetched_after == fetched
