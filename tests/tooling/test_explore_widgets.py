"""The offline explorers (_static/explore.js with its data files) in headless Chromium, from
file:// as in the offline zip: drawn on load, a slider moved with the keyboard changes the number
shown to the data file's next value, and the figures fit a 688 px column and a 420 px window."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bookbuild.browser import Browser, find_chromium

pytestmark = [pytest.mark.slow, pytest.mark.skipif(find_chromium() is None, reason="no Chromium")]

STATIC = Path(__file__).resolve().parents[2] / "_static"
PAGE = """<!DOCTYPE html><html><head><meta name="viewport" content="width=device-width">
<link rel="stylesheet" href="_static/book.css"><script src="_static/explore.js?v=1"></script></head>
<body><main style="max-width: 688px; margin: 0 auto">
<div class="book-explore" data-explore="damped-rotation"></div>
<noscript>A figure with sliders is here when JavaScript runs.</noscript>
<div class="book-explore" data-explore="heads-needed"></div>
</main></body></html>"""


@pytest.fixture
def page_url(tmp_path):
    shutil.copytree(STATIC, tmp_path / "_static")
    (tmp_path / "page.html").write_text(PAGE)
    return (tmp_path / "page.html").as_uri()


def _readouts(page) -> list[str]:
    return page.eval_on_selector_all("p.book-explore-readout", "els => els.map(e => e.textContent)")


def test_sliders_change_the_numbers_shown_from_file_urls(page_url):
    with Browser(find_chromium()) as browser, browser.page(page_url) as page:
        assert page.eval_on_selector_all("div.book-explore", "els => els.map(e => e.dataset.drawn)") == ["yes"] * 2
        data = json.loads(page.evaluate("JSON.stringify(window.BOOK_EXPLORE)"))
        rotation, heads = _readouts(page)
        a, b = data["damped-rotation"]["initial"]
        assert f"σ₂(G)² = {data['damped-rotation']['error'][a][b]:g}" in rotation  # 114.7, the chapter's
        a, b = data["heads-needed"]["initial"]
        assert heads.startswith(f"H_ε = {data['heads-needed']['heads'][a][b]}, the fewest heads")  # 47 at ρ = 0.99, ε = 1e-2
        sliders = page.locator("div.book-explore input[type=range]")
        assert sliders.count() == 4
        for i in range(4):  # every slider has a visible label and its value next to it
            slider_id = sliders.nth(i).get_attribute("id")
            assert page.locator(f"label[for={slider_id}]").inner_text() in ("ρ", "θ", "ε")
            assert page.locator(f"output[for={slider_id}]").inner_text()
        assert page.locator("div.book-explore svg[aria-label]").count() == 2

        sliders.nth(0).focus()  # ρ of the damped rotation, by the keyboard
        page.keyboard.press("ArrowRight")
        a, b = data["damped-rotation"]["initial"]
        moved = _readouts(page)[0]
        assert moved != rotation
        assert f"σ₂(G)² = {data['damped-rotation']['error'][a + 1][b]:g}" in moved

        sliders.nth(3).focus()  # ε of the heads needed: one step smaller
        page.keyboard.press("ArrowLeft")
        a, b = data["heads-needed"]["initial"]
        count = data["heads-needed"]["heads"][a][b - 1]
        assert count != data["heads-needed"]["heads"][a][b]
        assert _readouts(page)[1].startswith(f"H_ε = {count}, the fewest heads")
        assert page.locator("output[for=%s]" % sliders.nth(3).get_attribute("id")).inner_text() == (
            f"{data['heads-needed']['epsilon'][b - 1]:.1e}".replace("e-0", "e-"))


@pytest.mark.parametrize("width", [1280, 420])
def test_explorers_fit_the_column_and_a_narrow_window(page_url, width):
    with Browser(find_chromium()) as browser, browser.page(page_url) as page:
        page.set_viewport_size({"width": width, "height": 1600})
        boxes = page.eval_on_selector_all(
            "div.book-explore", "els => els.map(e => [e.scrollWidth, e.clientWidth, "
            "e.querySelector('svg').getBoundingClientRect().width])")
        for scroll, client, svg in boxes:
            assert scroll <= client and 0 < svg <= min(688, width)
