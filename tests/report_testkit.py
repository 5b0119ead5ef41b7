"""The job report as a person sees it, for tests: Debian's Chromium driven by Playwright, every
console error and page error collected, every request outside the allowed origins refused and
counted, and the rank x time heat map read back from the pixels Chromium drew."""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

CHROMIUM = "/usr/bin/chromium"


@dataclass
class Watched:
    """What a page did: console errors (``console.error``, failed loads), uncaught exceptions,
    refused requests (outside the allowed origins), and every request made (URLs)."""

    errors: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    navigations: int = 0


@contextlib.contextmanager
def chromium_page(allowed: tuple[str, ...] = ("file:", "data:"), viewport=(1200, 900)) -> Iterator[tuple]:
    """A new Chromium page (and its :class:`Watched`): requests whose URL does not start with one
    of ``allowed`` are refused (aborted) and listed. Fails the test when Chromium is missing."""
    from playwright.sync_api import sync_playwright

    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} missing: apt-get install chromium (Makefile APT_PACKAGES)")
    w = Watched()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.on("console", lambda m: w.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: w.errors.append(f"page error: {e}"))
            page.on("request", lambda r: w.requests.append(r.url))
            page.on(
                "framenavigated",
                lambda f: setattr(w, "navigations", w.navigations + 1) if f == page.main_frame else None,
            )

            def refuse(route):
                w.refused.append(route.request.url)
                route.abort()

            page.route(lambda url: not url.startswith(allowed), refuse)
            yield page, w
        finally:
            browser.close()


@dataclass
class HeatmapPixels:
    """One panel of the heat map as Chromium drew it: ``lit[i]`` is True when pixel column i
    (image x ``first + i``) of the plot area shows a coloured cell (bytes moved then), False when
    it is blank (white). The plot area spans image x ``area_x0`` .. ``area_x0 + area_w``, which is
    ``t0_ns`` .. ``t0_ns + span_s``."""

    direction: str
    lit: list[bool]
    first: int
    area_x0: float
    area_w: float
    t0_ns: int
    span_s: float
    png: bytes

    def seconds(self, i: int) -> float:
        """The middle of pixel column i, seconds after ``t0_ns``."""
        return self.span_s * (self.first + i + 0.5 - self.area_x0) / self.area_w

    def lit_seconds(self) -> float:
        """Seconds of the time axis drawn with I/O."""
        return self.span_s * sum(self.lit) / len(self.lit)


def heatmap_pixels(page, direction: str = "write") -> HeatmapPixels:
    """Screenshot the heat map ``<img>`` as rendered and read the plot area of ``direction``'s
    panel (its box from the image's ``data-axes``): a pixel column is lit when any pixel in it,
    away from the frame, is coloured (viridis: its channels differ by more than 40; white, grey
    and black do not)."""
    from PIL import Image

    img = page.locator('img[alt="rank x time heat map"]')
    # an image swapped in by the live refresh decodes after the swap
    page.wait_for_function(
        "() => { const i = document.querySelector('img[alt=\"rank x time heat map\"]'); "
        "return i && i.complete && i.naturalWidth > 0; }",
        timeout=10_000,
    )
    img.scroll_into_view_if_needed()
    attrs = img.evaluate(
        "i => ({axes: i.dataset.axes, t0: i.dataset.t0Ns, span: i.dataset.spanS, "
        "complete: i.complete, w: i.naturalWidth, h: i.naturalHeight})"
    )
    assert attrs["complete"] and attrs["w"] > 300, attrs
    png = img.screenshot()
    im = Image.open(io.BytesIO(png)).convert("RGB")
    boxes = {d: tuple(map(float, b.split(","))) for d, b in (a.split(":") for a in attrs["axes"].split(";"))}
    x0, y0, x1, y1 = boxes[direction]
    W, H = im.size
    left, right = round(x0 * W) + 2, round(x1 * W) - 2  # inside the frame (spines ~1 px)
    top, bottom = round(y0 * H) + 2, round(y1 * H) - 2
    px = im.load()
    lit = []
    for x in range(left, right):
        lit.append(any(max(px[x, y]) - min(px[x, y]) > 40 for y in range(top, bottom)))
    return HeatmapPixels(direction, lit, left, x0 * W, (x1 - x0) * W, int(attrs["t0"]), float(attrs["span"]), png)
