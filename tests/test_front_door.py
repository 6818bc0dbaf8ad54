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


TABS = ("Replay", "Lessons", "Charts", "Step through", "Rule lab", "Trade-offs", "Robustness", "Toy head",
        "How it works", "Downloads", "Recorded runs")


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_tab_overflows_a_390_px_phone_screen(fake_app_page, scheme):
    """At 390 px, light and dark, on every tab: nothing wider than the screen (the page never scrolls
    sideways), and the elements that overflow are named when it does."""
    url, browser = fake_app_page
    page = browser.new_page(viewport={"width": 390, "height": 844}, color_scheme=scheme)
    page.goto(url + ("?__theme=dark" if scheme == "dark" else ""))
    page.wait_for_selector("#status")
    page.wait_for_timeout(1500)
    wide = {}
    for tab in TABS:
        # At 390 px most tabs sit in Gradio's overflow menu: press the tab's button as that menu would.
        page.evaluate("""(name) => { const found = [...document.querySelectorAll('button')]
            .filter((b) => b.innerText.trim() === name); found[found.length - 1].click(); }""", tab)
        page.wait_for_timeout(400)
        overflow = page.evaluate("""() => {
            const width = document.documentElement.clientWidth;
            const out = [];
            const clipped = (el) => {  // inside a box that scrolls sideways on purpose, or not shown
              for (let a = el; a && a !== document.body; a = a.parentElement) {
                const style = getComputedStyle(a);
                if (style.visibility === 'hidden' || ['auto', 'scroll'].includes(style.overflowX)
                    || a.classList.contains('visually-hidden')) return true;  // Gradio's tab-measuring copy
              }
              return false;
            };
            for (const el of document.querySelectorAll('body *')) {
              const box = el.getBoundingClientRect();
              if (box.width && box.right > width + 1 && el.offsetParent !== null && !clipped(el)) out.push(
                (el.id ? '#' + el.id : el.tagName.toLowerCase() + '.' + [...el.classList].slice(0, 2).join('.'))
                + ' ' + Math.round(box.right));
            }
            return {scroll: document.documentElement.scrollWidth - width, out: out.slice(0, 5)};
        }""")
        if overflow["scroll"] > 1 or overflow["out"]:
            wide[tab] = overflow
    assert not wide, wide
    page.close()
