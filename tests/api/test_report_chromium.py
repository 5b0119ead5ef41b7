"""The job report in a real browser (Debian's Chromium, driven by Playwright): the page renders
with every image decoded and makes no network request at all (each one is refused and counted),
so it can be mailed or archived and opened anywhere."""

from __future__ import annotations

import shutil

import pytest
from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"


def test_report_renders_offline_in_chromium(client, tmp_path):
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} missing: apt-get install chromium (Makefile APT_PACKAGES)")
    page_file = tmp_path / "mix.html"
    page_file.write_text(client.get("/v1/jobs/mix/report").text)
    requested: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})

            def refuse(route):
                requested.append(route.request.url)
                route.abort()

            page.route(lambda url: not url.startswith(("file:", "data:")), refuse)
            page.goto(page_file.as_uri(), wait_until="load")
            images = page.evaluate(
                "[...document.images].map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])"
            )
            heading = page.inner_text("h1")
            shot = tmp_path / "mix.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert heading == "Job mix"
    assert len(images) >= 3 and all(ok and w > 300 and h > 100 for _, ok, w, h in images), images
    assert requested == [], requested
    assert shot.stat().st_size > 50_000  # a page with plots, not a blank one
    print(f"\n[report] Chromium: {len(images)} images decoded ({[i[0] for i in images]}), no request; {shot}")
