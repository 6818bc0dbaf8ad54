"""What a teacher shows in the columns (issue 60, items 1 and 2), in a real Chromium on the model-free app:
the rejected drafts struck through with their reasons and a switch that hides them, a rule that could not act
saying why with its fix one click away, and a run refused at its start leaving the previous run on screen."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def fly_app_page():
    """(url, browser): the app on a FakeEngine whose FLy accepts only exact drafts and whose gamma = auto drafts
    3 a round (as on this CPU), served on loopback, with Debian's Chromium."""
    from conftest import fake_app_served
    from fake_engine import FakeEngine

    yield from fake_app_served(FakeEngine(reason_for={"fly": "exact"}, auto_gamma=3, max_context=400))


def _first_view(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url)
    page.wait_for_function("() => document.querySelectorAll('#lossy-text .dm-tok').length > 5", timeout=60_000)
    return page


def _settings(page) -> None:
    """Opens the Settings accordion (closed on a first visit)."""
    settings = page.locator("#settings")
    if not settings.locator("#rule-choice").is_visible():
        settings.get_by_text("Settings", exact=True).first.click()
    page.locator("#rule-choice").wait_for(state="visible")


def test_the_first_view_strikes_through_rejected_drafts_with_their_reason_and_a_switch_hides_them(fly_app_page):
    """The shipped run's lossy column shows .dm-rejected tokens before their corrections; a rejected draft's
    popover names its verdict and why the rule turned it down; each column's switch hides its own, saying Hide or Show."""
    url, browser = fly_app_page
    page = _first_view(browser, url)
    rejected = page.locator("#lossy-text .dm-tok.dm-rejected")
    assert rejected.count() > 0
    decoration = rejected.first.evaluate("(e) => getComputedStyle(e).textDecorationLine")
    assert "line-through" in decoration
    rejected.first.hover()
    popover = page.locator("#lossy-text .dm-pop")
    popover.wait_for(state="visible")
    text = popover.inner_text()
    assert "rejected" in text and "rejected:" in text and ("JS" in text or "paths" in text), text
    lossy, lossless = page.locator("#lossy-text .dm-rejected-toggle"), page.locator("#lossless-text .dm-rejected-toggle")
    count = rejected.count()
    assert lossy.inner_text() == f"Hide the {count} rejected drafts (struck through)"
    lossy.click()
    page.locator("#lossy-text .dm-tok.dm-rejected").first.wait_for(state="hidden")
    assert lossy.inner_text() == f"Show the {count} rejected drafts (struck through)"
    assert page.locator("#lossless-text .dm-tok.dm-rejected").first.is_visible()  # the other column keeps its own
    assert lossless.inner_text().startswith("Hide the ")
    lossless.click()
    page.locator("#lossless-text .dm-tok.dm-rejected").first.wait_for(state="hidden")
    assert lossless.inner_text().startswith("Show the ")
    lossy.click()
    assert page.locator("#lossy-text .dm-tok.dm-rejected").first.is_visible()
    assert lossy.inner_text().startswith("Hide the ") and lossy.get_attribute("aria-pressed") == "false"
    page.close()


def test_fly_at_gamma_auto_says_why_it_could_not_act_and_the_button_applies_the_fix(fly_app_page):
    """FLy whose rounds drafted 3 tokens: the verdict says its window needs 7 and offers its authors' 15; the
    button sets the draft length to 15."""
    url, browser = fly_app_page
    page = _first_view(browser, url)
    _settings(page)
    page.locator("#rule-choice input").fill("FLy")
    page.get_by_role("option", name="FLy (entropy gate, deferred window)").click()
    page.locator("#prompt textarea").fill(" ".join(f"w{i}" for i in range(30)))
    page.locator("#run-button").click()
    page.wait_for_function("() => /^Done/.test(document.querySelector('#status').innerText)", timeout=60_000)
    verdict = page.locator("#verdict").inner_text()
    assert "needs at least 7 drafts" in verdict and "3.0 on average" in verdict and "15" in verdict, verdict
    button = page.locator("#fix-button")
    assert button.is_visible() and "15" in button.inner_text()
    button.click()
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('γ 15')")
    gamma = page.get_by_label("draft length γ")
    assert gamma.input_value() == "15"
    page.close()


def test_a_run_refused_at_its_start_leaves_the_previous_run_on_screen(fly_app_page):
    """A prompt the pair cannot hold is refused in the status line; the shipped run's columns stay whole."""
    url, browser = fly_app_page
    page = _first_view(browser, url)
    # once the pair is loaded (no "Loading … s" line of the load timer): the refusal is then the run's own line
    page.wait_for_function("() => !document.querySelector('#status').innerText.startsWith('Loading')", timeout=60_000)
    before = page.locator("#lossy-text .dm-tok").count()
    page.locator("#prompt textarea").fill(" ".join(f"w{i}" for i in range(400)))
    page.locator("#run-button").click()
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('too long')",
                           timeout=120_000)  # a generous hang guard: the server shares the machine with other tests
    assert page.locator("#lossy-text .dm-tok").count() == before
    assert page.locator("#lossless-text .dm-tok").count() > 5 and page.locator("#verdict").inner_text().strip()
    page.close()
