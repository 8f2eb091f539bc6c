"""Headless Chromium waits for the page's own signal, not for a time budget."""

from __future__ import annotations

import pytest

from bookbuild.browser import Browser, find_chromium, serve

pytestmark = [pytest.mark.slow, pytest.mark.skipif(find_chromium() is None, reason="no Chromium")]


def test_render_waits_for_mathjax_to_finish_not_for_a_time_budget(tmp_path):
    # A stand-in MathJax whose typesetting finishes 1.5 s after load.
    (tmp_path / "page.html").write_text(
        "<html><body><p>x</p><script>window.MathJax = {startup: {promise: new Promise("
        "r => setTimeout(() => { document.body.appendChild(document.createElement("
        "'mjx-' + 'container')); r(); }, 1500))}};</script></body></html>")
    (tmp_path / "plain.html").write_text("<html><body><p>no math</p></body></html>")
    with serve(tmp_path) as base, Browser(find_chromium()) as browser:
        late = browser.render(f"{base}/page.html", screenshot=tmp_path / "page.png")
        plain = browser.render(f"{base}/plain.html")
    assert late.typeset and late.dom.count("<mjx-container") == 1
    assert (tmp_path / "page.png").exists()
    assert not plain.typeset and "<mjx-container" not in plain.dom


def test_wide_display_math_is_reported_and_so_is_math_that_would_clip(tmp_path):
    def page(name, width, overflow):
        (tmp_path / name).write_text(
            f'<html><body><main style="width:300px"><mjx-container display="true" style="display:'
            f'block;overflow-x:{overflow}"><span style="display:inline-block;width:{width}px">'
            "W_ij</span></mjx-container></main></body></html>")

    page("wide.html", 900, "visible")
    page("fits.html", 200, "auto")
    with serve(tmp_path) as base, Browser(find_chromium()) as browser:
        wide, fits = (browser.render(f"{base}/{n}.html").overflowing for n in ("wide", "fits"))
    assert wide == ['900 px in 300: "W_ij"',
                    "display math that a narrow screen clips (overflow-x is not auto)"]
    assert fits == []


def test_prose_that_cannot_wrap_is_reported(tmp_path):
    text = "+0.83 for seed 0 (below the threshold: no change), +1.17 for seed 1" * 3
    for name, style in (("stuck", "white-space:nowrap"), ("wraps", "white-space:normal")):
        (tmp_path / f"{name}.html").write_text(
            f'<html><body><main style="width:300px"><p>Gains: <span style="{style}">{text}'
            "</span></p></main></body></html>")
    with serve(tmp_path) as base, Browser(find_chromium()) as browser:
        stuck, wraps = (browser.render(f"{base}/{n}.html").overflowing for n in ("stuck", "wraps"))
    assert len(stuck) == 1 and stuck[0].endswith('in 300: "Gains: +0.83 for seed 0 (below the thres"')
    assert wraps == []
