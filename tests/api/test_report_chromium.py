"""The job report in a real browser (Debian's Chromium, driven by Playwright): the page renders
with every image decoded, no console error, and makes no network request at all (each one is
refused and counted), so it can be mailed or archived and opened anywhere. Served by the API, a
running job's page refreshes itself (its body swapped in, no navigation) and stops once the
job has ended. (The same on a real traced job, heat map pixels against its phases:
tests/live/test_report_live.py.)"""

from __future__ import annotations

import time

from pharos_synthetic_jobs import event
from report_testkit import HeatmapPixels, chromium_page, heatmap_pixels

# Job "mix" (pharos_synthetic_jobs) moves bytes on its data files 1-4 s after T0 (writes) and
# 5-6 s and 7-11 s (reads; its 6-6.5 s read failed: no bytes): seconds after its first data request
MIX_WRITES = [(0.0, 3.0)]
MIX_READS = [(4.0, 5.0), (6.0, 10.0)]


def lit_where_bytes_moved(px: HeatmapPixels, busy: list[tuple[float, float]]) -> list[float]:
    """The times (s) of pixel columns that are lit outside ``busy`` or blank inside it, away from
    the edges by 3 time bins (240 per span) and 2 px."""
    m = 3 * px.span_s / 240 + 2 * px.span_s / px.area_w
    wrong = []
    for i, on in enumerate(px.lit):
        t = px.seconds(i)
        inside = any(a + m < t < b - m for a, b in busy)
        outside = all(t < a - m or t > b + m for a, b in busy)
        if (inside and not on) or (outside and on):
            wrong.append(round(t, 2))
    return wrong


def test_report_renders_offline_in_chromium(client, tmp_path):
    page_file = tmp_path / "mix.html"
    page_file.write_text(client.get("/v1/jobs/mix/report").text)
    with chromium_page() as (page, seen):
        page.goto(page_file.as_uri(), wait_until="load")
        images = page.evaluate("[...document.images].map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
        heading = page.inner_text("h1")
        writes, reads = heatmap_pixels(page, "write"), heatmap_pixels(page, "read")
        shot = tmp_path / "mix.png"
        page.screenshot(path=str(shot), full_page=True)
        page.wait_for_timeout(500)  # anything the page would do after load
    assert heading == "Job mix"
    assert len(images) >= 3 and all(ok and w > 300 and h > 100 for _, ok, w, h in images), images
    assert seen.refused == [] and seen.errors == [], (seen.refused, seen.errors)
    assert shot.stat().st_size > 50_000  # a page with plots, not a blank one
    # the heat map's pixels: bytes where the job moved them, blank elsewhere
    assert abs(writes.span_s - 10) < 0.1 and len(writes.lit) > 500
    assert lit_where_bytes_moved(writes, MIX_WRITES) == [] and lit_where_bytes_moved(reads, MIX_READS) == []
    assert lit_where_bytes_moved(writes, MIX_READS) != []  # the check tells one panel from the other
    print(f"\n[report] Chromium: {len(images)} images decoded ({[i[0] for i in images]}), no request; {shot}")


def test_served_running_report_refreshes_until_the_job_ends(store, api_url):
    # a job that has started (no end event yet); the page is loaded from the API
    store.insert_rows("job_events", [event("live1", "start", 200, name="live", ranks=1)])
    url = f"{api_url}/v1/jobs/live1/report?refresh_s=1"
    with chromium_page(allowed=(api_url + "/", "data:")) as (page, seen):
        page.goto(url, wait_until="load")
        assert "The job is running" in page.inner_text("#pharos-live")
        state = page.locator("table.kv tr", has_text="state").first
        assert state.inner_text().split("\t")[1].startswith("running")
        # while it runs, the page refreshes itself: a new "stored until" time, fetched again
        first = page.inner_text("#pharos-live")
        page.wait_for_function(f"() => document.getElementById('pharos-live').textContent != {first!r}", timeout=10_000)
        assert sum(u == url for u in seen.requests) >= 2
        # the job ends: the next refresh shows it finished, and the page stops refreshing
        store.insert_rows("job_events", [event("live1", "end", 210, exit_code=0)])
        page.wait_for_function(
            "() => document.querySelector('table.kv td:nth-child(2)').textContent.startsWith('finished')",
            timeout=15_000,
        )
        fetched = sum(u == url for u in seen.requests)
        assert page.locator("#pharos-live").count() == 0 and page.title() == "Pharos report: job live1"
        assert page.evaluate("document.querySelector('meta[name=pharos-refresh]')") is None
        time.sleep(3)  # three refresh periods: no further fetch
        assert sum(u == url for u in seen.requests) == fetched
        navigations = seen.navigations
    assert fetched >= 3 and navigations == 1, (fetched, navigations)  # swapped in, never reloaded
    assert seen.refused == [] and seen.errors == [], (seen.refused, seen.errors)
    print(f"\n[report] running job's page fetched {fetched} times, stopped once the job ended")
