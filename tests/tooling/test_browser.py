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
