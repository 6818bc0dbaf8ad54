"""End to end in a real headless Chromium on the embedded pair: click an example, Run, check."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
from local_server import TEXT_CONTRAST_JS, assert_contrast, open_tab, serve_locally

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def embedded_app():
    import app
    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_pair
    from dropmatch.pair_host import Policy, PairHost

    studio = PairHost(load_pair, Engine, Policy())
    demo = app.create_demo(studio)
    serve_locally(demo, css=app.css())
    try:
        yield demo.local_url, json.loads(app.EXAMPLES_FILE.read_text())
    finally:
        demo.close()
        studio.close()  # its model thread's torch threads would slow every later test's torch work


def test_run_on_an_example_fills_both_columns_every_chart_and_the_step_view(embedded_app, tmp_path):
    """Clicking an example, the paper's settings and Run shows both columns, their stats, four charts, a round, the
    Trade-offs tab with the shipped frontier and this run's point, and the rule lab, which re-judges
    when a control moves; before that, the shipped run shown on first visit has its rule lab too."""
    if not Path("/usr/bin/chromium").exists():
        pytest.fail("Debian's chromium is missing: apt-get install -y chromium (scripts/setup.sh --test does it)")
    import subprocess

    url, _ = embedded_app
    # scripts/ui_flow.py as a user runs it, on this app: example 0, Run, every tab, the rule lab, screenshots
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "ui_flow.py"), "--url", url, "--out", str(tmp_path),
                           "--max-new-tokens", "24", "--json", str(tmp_path / "found.json")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads((tmp_path / "found.json").read_text())
    assert (found["method_p"], found["method_k"]) == ("0.3", "5")  # the paper's-settings button set them
    assert found["status"].startswith("Done"), found["status"]
    assert found["lossless_tokens"] >= 5 and found["lossy_tokens"] >= 5
    assert found["charts"] == 4
    assert "tau" in found["lossless_stats"] and "MC-head share" in found["lossy_stats"]
    # The verdict line above the columns: its target calls and tokens are the stats tables' (the run's trace).
    calls = re.search(r"Target calls: (\d+) for (\d+) tokens against (\d+) for (\d+); tau", found["verdict"])
    assert calls, found["verdict"]
    stated = [int(x) for x in calls.groups()]
    shown = [int(re.search(rf"{row}\s+(\d+)", found[table]).group(1))
             for table in ("lossy_stats", "lossless_stats") for row in ("target calls", "new tokens")]
    assert stated == shown, (found["verdict"], shown)
    assert "were accepted only by the rule" in found["verdict"]
    assert re.search(r"within the spread of its rounds' timings|(faster|slower), beyond the spread|too few rounds",
                     found["verdict"]), found["verdict"]
    assert "Round 0" in found["step_text"]
    assert "Trade-off frontier" in found["tradeoff_text"] and "this run" in found["tradeoff_text"]
    assert found["recorded_lab_rows"] >= 40  # the shipped run's matrix, shown before any model ran
    assert found["lab_rows"] >= 5 and "Re-judged" in found["lab_status"], found["lab_status"]
    assert "tau on these drafts" in found["lab_summary"]
    assert found["lab_disagreement_rows"] < found["lab_rows"]  # the filter keeps only rows where rules differ
    for path in found["screenshots"]:
        assert Path(path).stat().st_size > 10_000
    print("screenshots:", found["screenshots"])


# ---------------------------------------------------------------- the page on a model-free engine


def _lengthened(engine_class):
    """A FakeEngine whose runs make `tokens` new tokens whatever max new tokens says (the page's slider stops at
    512), so that the page can be tested on runs of any length."""
    class Lengthened(engine_class):
        tokens = 96

        def speculative(self, prompt_ids, decode, *args, **kwargs):
            return super().speculative(prompt_ids, dataclasses.replace(decode, max_new_tokens=self.tokens), *args, **kwargs)

        def autoregressive(self, prompt_ids, decode, *args, **kwargs):
            return super().autoregressive(prompt_ids, dataclasses.replace(decode, max_new_tokens=self.tokens), *args, **kwargs)

    return Lengthened


@pytest.fixture(scope="module")
def fake_page():
    """(url, browser, engine): the app on a FakeEngine of runs of engine.tokens tokens, served on loopback, with
    Debian's Chromium."""
    from conftest import fake_app_served
    from fake_engine import FakeEngine

    engine = _lengthened(FakeEngine)(max_context=20_000)
    for url, browser in fake_app_served(engine):
        yield url, browser, engine


def _page(browser, url: str, width: int = 1400, height: int = 900, settings: bool = False):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    page.wait_for_function("() => document.querySelectorAll('#lossy-text .dm-tok').length > 5", timeout=60_000)
    if settings:
        page.locator("#settings").get_by_text("Settings", exact=True).first.click()
        page.locator("#rule-choice").wait_for(state="visible")
    return page


def test_max_new_tokens_typed_as_letters_or_an_empty_box_says_what_it_became(fake_page):
    """Letters or an empty box in max new tokens are set to 1 by Gradio: one line under the control says so."""
    url, browser, _ = fake_page
    page = _page(browser, url, settings=True)
    field = page.get_by_label("number input for max new tokens", exact=True)
    block = page.locator("#settings .block").filter(has=field).last
    for typed in ("abc", ""):
        field.click()
        field.press("Control+a")
        field.press("Backspace")
        page.keyboard.type(typed)
        field.press("Tab")
        note = block.locator(".dm-clamp")
        note.wait_for(timeout=5000)
        assert note.inner_text() == f"That is not a number (letters or an empty box): it is set to {field.input_value()}."
        field.fill("7")
        field.press("Tab")
        note.wait_for(state="detached", timeout=5000)
    page.close()


def _run_file(path: Path) -> dict:
    """A run file of the FakeEngine at settings other than the page's defaults; returns those settings."""
    from fake_engine import FakeEngine

    from dropmatch.compare import compare_stream
    from dropmatch.decoding.config import Settings
    from dropmatch.runfile import RunRecord

    given = dict(rule="majority", temperature=0.5, max_new_tokens=17, seed=5, gamma="3", draft_source="model", k=7)
    settings = Settings("one two three four five six", **given)
    engine = FakeEngine()
    *_, state = compare_stream(engine, settings.prompt, *settings.parse())
    tokens = {t: engine.token_text(t) for t in range(len(engine.words))}
    record = RunRecord(settings.prompt, "majority", False, state.lossless.trace, state.lossy.trace, state.ar, tokens)
    path.write_text(json.dumps(record.to_dict()))
    return {"prompt": settings.prompt, **given}


def test_an_opened_run_file_puts_its_prompt_rule_and_settings_back_so_run_reproduces_it(fake_page, tmp_path):
    """Opening a run file sets the prompt, the rule and the settings it was made with; Run then makes the same run."""
    url, browser, _ = fake_page
    given = _run_file(tmp_path / "run.json")
    page = _page(browser, url, settings=True)
    open_tab(page, "Recorded runs")
    page.locator("#recorded-upload input[type=file]").set_input_files(str(tmp_path / "run.json"))
    page.wait_for_function("p => document.querySelector('#prompt textarea').value === p", arg=given["prompt"],
                           timeout=30_000)
    number = lambda label: float(page.get_by_label(f"number input for {label}", exact=True).input_value())
    assert (number("temperature (0 = greedy)"), number("max new tokens")) == (0.5, 17)
    assert float(page.get_by_label("seed", exact=True).input_value()) == 5
    assert page.locator("#rule-choice input").input_value() == "path majority"
    assert number("K (paths)") == 7
    assert page.get_by_label("model", exact=True).is_checked()
    columns = "() => ['#lossless-text', '#lossy-text'].map((c) => document.querySelector(c + ' .dm-text').innerText)"
    opened = page.evaluate(columns)
    page.locator("#run-button").click()
    page.wait_for_function("() => /^Done/.test(document.querySelector('#status').innerText)", timeout=60_000)
    assert page.evaluate(columns) == opened  # the same run again
    page.close()


ERROR_BADGES_JS = "() => Array.from(document.querySelectorAll('.error')).filter((e) => e.offsetParent).length"


@pytest.mark.parametrize("tokens", [1, 96, 4000])
def test_stop_during_a_run_of_any_length_leaves_no_error_badge(fake_page, tokens):
    """Stop while runs of 1, 96 and 4,000 tokens stream: the status says Stopped (or Done), and no output wears
    Gradio's red Error badge."""
    url, browser, engine = fake_page
    engine.tokens = tokens
    page = _page(browser, url)
    page.locator("#prompt textarea").fill(" ".join(f"w{i}" for i in range(max(tokens, 10) + 5)))
    page.locator("#run-button").click()
    page.wait_for_function("() => !document.querySelector('#stop-button').disabled", timeout=30_000)
    if tokens > 96:  # stop a long run while its columns stream
        page.wait_for_function("() => document.querySelectorAll('#lossy-text .dm-tok').length > 200", timeout=60_000)
    page.locator("#stop-button").click()
    page.wait_for_function("() => document.querySelector('#stop-button').disabled", timeout=60_000)
    page.wait_for_timeout(1500)  # what a cancelled event's stream says arrives after Stop's own update
    assert page.evaluate(ERROR_BADGES_JS) == 0
    assert re.match(r"(Stopped|Done)", page.locator("#status").inner_text()), page.locator("#status").inner_text()
    page.close()


def test_the_first_screen_at_1400x900_shows_the_verdict_and_both_columns_first_tokens(fake_page):
    """No scrolling on a 1400x900 screen: the verdict's headline and the first tokens of both columns are in view."""
    url, browser, _ = fake_page
    page = _page(browser, url)
    page.wait_for_function("() => document.querySelector('#verdict').innerText.trim().length > 0")
    for selector in ("#verdict p", "#lossless-text .dm-tok", "#lossy-text .dm-tok"):
        box = page.locator(selector).first.bounding_box()
        assert box and 0 <= box["y"] and box["y"] + box["height"] <= 900, (selector, box)
    page.close()


def test_a_skip_link_takes_the_keyboard_past_the_tokens(fake_page):
    """Tab reaches "Skip past the tokens" before any token; Enter on it puts the next Tab on the tabs, not a token."""
    url, browser, _ = fake_page
    page = _page(browser, url)
    page.locator("#prompt textarea").focus()
    for _ in range(60):
        page.keyboard.press("Tab")
        focused = page.evaluate("() => document.activeElement.className")
        assert "dm-tok" not in focused, "a token was reached before the skip link"
        if "dm-skip" in focused:
            break
    assert page.locator(".dm-skip").evaluate("(e) => e.getBoundingClientRect().width > 0")  # seen while focused
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.getAttribute('role')") == "tab"
    page.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_text_of_the_first_view_with_settings_open_meets_4_5_contrast(fake_page, theme):
    """Hint text, slider ends, Run, the selected tab and the footer too: WCAG's 4.5:1 in both themes."""
    url, browser, _ = fake_page
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url + f"?__theme={theme}")
    page.wait_for_function("() => document.querySelectorAll('#lossy-text .dm-tok').length > 5", timeout=60_000)
    page.locator("#settings").get_by_text("Settings", exact=True).first.click()
    page.locator("#rule-choice").wait_for(state="visible")
    found = page.evaluate(TEXT_CONTRAST_JS, "body")
    assert len(found) > 300 and any("info" in str(item["cls"]) for item in found)
    assert_contrast(found)
    page.close()


OVERFLOWING_JS = """(selector) => [...document.querySelectorAll(selector + ' *')].filter((e) => e.offsetParent !== null
    && e.scrollWidth > e.clientWidth + 1 && ['auto', 'scroll', 'hidden'].includes(getComputedStyle(e).overflowX))
    .map((e) => `${e.tagName}.${String(e.className).slice(0, 40)}#${e.id}: ${e.scrollWidth} > ${e.clientWidth}`)"""


@pytest.mark.parametrize("tab, selector", [("Rule lab", "#lab-tab"), ("Step through", "#step-tab"),
                                           ("Robustness", "#robustness-tab")])
def test_the_wide_tabs_fit_1400_px_without_inner_scrollbars_or_clipped_controls(fake_page, tab, selector):
    """At 1400 px the rule lab's controls and matrix, the step table and every Robustness table fit their boxes."""
    url, browser, _ = fake_page
    page = _page(browser, url)
    open_tab(page, tab)
    page.locator(selector + " table").first.wait_for(timeout=30_000)
    page.wait_for_timeout(500)
    assert page.evaluate(OVERFLOWING_JS, selector) == []
    page.close()
