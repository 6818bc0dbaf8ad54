"""The front door in a real Chromium on the model-free app: what a visitor meets first."""

from __future__ import annotations

import pytest




def _run_fake(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#status")
    page.locator("#prompt textarea").fill("alpha beta gamma delta epsilon zeta eta theta")
    page.locator("#run-button").click()
    page.wait_for_function("() => /^Done/.test(document.querySelector('#status').innerText)", timeout=60_000)


@pytest.mark.slow
@pytest.mark.browser
def test_stop_after_a_finished_run_changes_nothing(fake_app_page):
    """Done stays Done, both stats tables and the verdict stay as they were."""
    url, browser = fake_app_page
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    _run_fake(page, url)
    before = {name: page.inner_text(name) for name in ("#status", "#lossless-stats", "#lossy-stats", "#verdict")}
    assert before["#lossy-stats"].strip() and before["#verdict"].strip()
    page.locator("#stop-button").click()
    page.wait_for_timeout(1500)
    after = {name: page.inner_text(name) for name in before}
    assert after == before
    page.close()


def test_both_columns_numbers_arrive_before_the_autoregressive_baseline_runs():
    """The baseline is held back (it starts only when the stream asks past the columns' end): by then both
    stats tables and the verdict have been sent, without the speedup rows."""
    from fake_engine import FakeEngine

    from dropmatch.config import Settings
    from dropmatch.ui.streaming import stream_comparison

    class HeldBaseline(FakeEngine):
        baseline_started = False

        def autoregressive(self, *args, **kwargs):
            HeldBaseline.baseline_started = True
            return super().autoregressive(*args, **kwargs)

    engine = HeldBaseline()
    decode, rule = Settings("alpha beta gamma delta epsilon zeta", max_new_tokens=12).parse()
    sent: dict = {}
    for update in stream_comparison(engine, "alpha beta gamma delta epsilon zeta", decode, rule, run_ar=True):
        if not isinstance(update, dict):
            break
        if not HeldBaseline.baseline_started:
            sent.update({name: value for name, value in update.items() if name in ("lossless_stats", "lossy_stats",
                                                                                      "verdict")})
    assert set(sent) == {"lossless_stats", "lossy_stats", "verdict"}
    assert "tau" in sent["lossy_stats"] and "target calls per token" in sent["verdict"]
    assert HeldBaseline.baseline_started  # and it did run afterwards
