"""The front door in a real Chromium on the model-free app: what a visitor meets first."""

from __future__ import annotations

import pytest
from local_server import open_tab

from dropmatch.ui.layout import TAB_GROUPS




def _opened(browser, url: str, width: int = 1400, height: int = 900, settings: bool = False, **options):
    """A new page on the app, its status line drawn; settings: with the Settings accordion opened."""
    page = browser.new_page(viewport={"width": width, "height": height}, **options)
    page.goto(url)
    page.wait_for_selector("#status")
    if settings:
        page.locator("#settings").get_by_text("Settings").first.click()
    return page


def _run_fake(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#status")
    page.locator("#prompt textarea").fill("alpha beta gamma delta epsilon zeta eta theta")
    page.locator("#run-button").click()
    page.wait_for_function("() => /^Done/.test(document.querySelector('#status').innerText)", timeout=60_000)


@pytest.mark.slow
@pytest.mark.browser
def test_stop_after_a_finished_run_changes_nothing(fake_app_page):
    """Stop is inactive once the run is done; pressed all the same, Done stays Done, both stats tables and the
    verdict stay as they were."""
    url, browser = fake_app_page
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    _run_fake(page, url)
    before = {name: page.inner_text(name) for name in ("#status", "#lossless-stats", "#lossy-stats", "#verdict")}
    assert before["#lossy-stats"].strip() and before["#verdict"].strip()
    page.wait_for_function("() => document.querySelector('#stop-button').disabled")
    page.locator("#stop-button").click(force=True)
    page.wait_for_timeout(1500)
    after = {name: page.inner_text(name) for name in before}
    assert after == before
    page.close()


def test_both_columns_numbers_arrive_before_the_autoregressive_baseline_runs():
    """The baseline is held back (it starts only when the stream asks past the columns' end): by then both
    stats tables and the verdict have been sent, without the speedup rows."""
    from fake_engine import FakeEngine

    from dropmatch.decoding.config import Settings
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


TABS = [name for _, _, names in TAB_GROUPS for name in names]


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
        open_tab(page, tab)
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


@pytest.mark.slow
@pytest.mark.browser
def test_a_token_opens_a_readable_popover_on_hover_focus_and_tap(fake_app_page):
    """Hover shows the token's numbers one fact per line, with the rule's sentence; keyboard focus shows it
    too; a click (a tap) pins it until Escape; at 390 px it stays inside the screen."""
    url, browser = fake_app_page
    page = browser.new_page(viewport={"width": 390, "height": 844}, has_touch=True)
    _run_fake(page, url)
    lossy = page.locator("#lossy-text")
    token = lossy.locator(".dm-tok.dm-js").first
    popover = lossy.locator(".dm-pop")
    token.hover()
    assert popover.is_visible()
    lines = popover.locator(":scope > div").all_inner_texts()
    assert len(lines) >= 4 and any(line.startswith("round ") for line in lines)
    assert "JS 0.0100 ≤ threshold 0.0200" in popover.locator(".dm-pop-why").inner_text()  # the rule's sentence
    assert "|" not in " ".join(lines)  # one fact per line, not one line joined by bars
    box = popover.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390 + 1
    assert float(popover.evaluate("e => parseFloat(getComputedStyle(e).fontSize)")) >= 16
    page.mouse.move(0, 0)
    assert not popover.is_visible()
    lossy.locator(".dm-tok").nth(2).focus()
    assert popover.is_visible()
    page.mouse.move(0, 0)
    token.tap()
    page.mouse.move(0, 0)
    assert popover.is_visible()  # pinned: leaving the token keeps it
    page.keyboard.press("Escape")
    assert not popover.is_visible()
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_each_column_has_a_colour_key_that_counts_its_tokens(fake_app_page):
    url, browser = fake_app_page
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    _run_fake(page, url)
    for column in ("#lossless-text", "#lossy-text"):  # the key counts the emitted tokens; rejected drafts apart
        tokens = page.locator(f"{column} .dm-text .dm-tok:not(.dm-rejected)").count()
        key = page.locator(f"{column} .dm-key span").all_inner_texts()
        assert key and sum(int(chip.rsplit(" ", 1)[1]) for chip in key) == tokens
        rejected = page.locator(f"{column} .dm-text .dm-tok.dm-rejected").count()
        assert rejected and f"the {rejected} rejected draft" in page.locator(f"{column} .dm-rejected-toggle").inner_text()
    assert any(chip.startswith("JS ") for chip in page.locator("#lossy-text .dm-key span").all_inner_texts())
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_a_number_outside_a_controls_range_is_said_next_to_the_control(fake_app_page):
    """Max new tokens 0 and top-p 100000 are set to the range's ends by Gradio: a line under each says so."""
    url, browser = fake_app_page
    page = _opened(browser, url, settings=True)
    page.wait_for_function("() => window.dmClampNotes === true")  # the page's listener is installed
    for label, typed, said in (("max new tokens", "0", "0 is below"), ("top-p", "100000", "100000 is above")):
        field = page.get_by_label(f"number input for {label}", exact=True)
        block = page.locator("#settings .block").filter(has=field).last
        field.fill(typed)
        field.press("Tab")
        note = block.locator(".dm-clamp")
        note.wait_for(timeout=5000)
        assert note.inner_text().startswith(said)
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_the_status_line_stays_on_the_first_screen_with_settings_open(fake_app_page):
    url, browser = fake_app_page
    page = _opened(browser, url, settings=True)
    page.wait_for_timeout(500)
    status, run = page.locator("#status").bounding_box(), page.locator("#run-button").bounding_box()
    assert status["y"] + status["height"] <= 900 and status["y"] >= run["y"]
    page.close()


def test_a_long_prompt_says_its_tokens_and_cost_before_the_run():
    from fake_engine import FakeEngine

    from dropmatch.decoding.drafting import StepCosts
    from dropmatch.ui.views import prompt_note

    long_prompt = " ".join(f"w{i}" for i in range(1500))
    assert prompt_note("a short prompt", FakeEngine()) == ""
    assert "1,500 tokens" in prompt_note(long_prompt, FakeEngine())
    assert "counted by characters" in prompt_note(long_prompt, None)

    measured = FakeEngine()
    measured.services.measured_costs = StepCosts(draft_step=0.001, verify_base=0.02, verify_per_position=0.002)
    assert "≈" not in prompt_note(long_prompt, measured)  # a cost per verified position says little of a prefill
    measured.services.prefill = (3000, 36.0)  # a run here read 3,000 tokens in 36 s
    note = prompt_note(long_prompt, measured)
    assert "≈ 18 s per run" in note and "83 tokens/s" in note  # 36 * 1500 / 3000, said as this machine's
    measured.services.prefill = (500, 1.5)
    assert "at least ≈ 4.5 s" in prompt_note(long_prompt, measured)  # beyond the longest read: a lower bound


def test_the_right_columns_title_names_the_rule_as_a_reader_does():
    from dropmatch.decoding.acceptance import RULES
    from dropmatch.rule_words import RULE_WORDS
    from dropmatch.ui.views import lossy_title

    assert lossy_title("dropmatch") == "### DropMatch" and lossy_title("mars") == "### MARS"
    for name, rule in RULES.items():  # a rule's declared title, else its label
        assert lossy_title(name) == f"### {RULE_WORDS[name].title or rule.label}"


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("width", [390, 1400])
def test_the_robustness_tables_cells_break_no_word_and_its_command_shows_whole(fake_app_page, width):
    """No cell of the Robustness table breaks a word ("dropmatch_judge", "ΔNLL"): on a phone each holds one line
    (the table scrolls in its box); at 1400 px the cells wrap between words and the table fits without a
    scrollbar of its own (issue 67). The command block wraps inside the page."""
    url, browser = fake_app_page
    page = _opened(browser, url, width=width)
    open_tab(page, "Robustness")
    table = page.locator("#robustness-table table")
    table.wait_for(timeout=10_000)
    tall = page.evaluate("""() => [...document.querySelectorAll('#robustness-table th, #robustness-table td')]
        .filter(c => { const s = getComputedStyle(c); const line = parseFloat(s.lineHeight) || 1.4 * parseFloat(s.fontSize);
                       return c.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom) > 1.6 * line; })
        .map(c => c.innerText)""")
    broken = page.evaluate("""() => [...document.querySelectorAll('#robustness-table th, #robustness-table td')]
        .filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.innerText)""")
    assert (tall if width < 1000 else broken) == []
    if width >= 1000:
        assert page.evaluate("() => [...document.querySelectorAll('#robustness-table .dm-scroll')]"
                             ".every(e => e.scrollWidth <= e.clientWidth + 1)")
    command = page.locator("#robustness-table pre")
    box = command.bounding_box()
    assert box["x"] + box["width"] <= width + 1
    assert page.evaluate("e => e.scrollWidth <= e.clientWidth + 1", command.element_handle())
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_on_a_phone_run_and_the_status_are_on_the_first_screen(fake_app_page):
    url, browser = fake_app_page
    page = _opened(browser, url, 390, 844)
    for name in ("#prompt", "#run-button", "#status"):
        box = page.locator(name).bounding_box()
        assert box["y"] + box["height"] <= 844, f"{name} is below the first screen"
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_the_rule_dropdowns_arrow_covers_no_part_of_the_rules_name(fake_app_page):
    url, browser = fake_app_page
    page = _opened(browser, url, settings=True)
    field = page.locator("#rule-choice input").first
    field.wait_for()
    text_right = page.evaluate("""e => { const c = document.createElement('canvas').getContext('2d');
        const s = getComputedStyle(e); c.font = s.font;
        return e.getBoundingClientRect().left + parseFloat(s.paddingLeft) + c.measureText(e.value).width; }""",
                               field.element_handle())
    arrow = page.locator("#rule-choice .icon-wrap, #rule-choice svg").first.bounding_box()
    assert text_right <= arrow["x"] + 1, (text_right, arrow)
    page.close()


def test_the_load_outcome_never_hides_a_line_the_visitors_action_wrote():
    """The timer's last tick can be answered after a Run was refused: the refusal stays, and the timer stops;
    the first line, a loading line and the recorded run's note do give way to the outcome."""
    from dropmatch.pair_host import LoadStatus
    from dropmatch.ui import views

    ready = LoadStatus("ready", label="SmolLM2 pair")
    refusal = "⚠️ the prompt is empty: type one or pick an example"
    kept, timer = views.load_status_view(ready, refusal)
    assert kept == {"__type__": "update"} and timer.active is False
    for shown in (views.FIRST_STATUS, "Loading **SmolLM2 pair** … 3 s", views.RECORDED_NOTE + ", *GSM8K math* (x)."):
        line, _ = views.load_status_view(ready, shown)
        assert line.startswith("**SmolLM2 pair** is loaded.")
    _, timer = views.load_status_view(LoadStatus("loading", label="SmolLM2 pair", started=0.0), refusal)
    assert timer.active is True
    waiting = "Waiting for **SmolLM2 pair** to load … (the first load of the embedded pair converts the GGUF once)"
    assert views.load_status_view(ready, waiting)[0] == {"__type__": "update"}  # Run's own line, then "Running …"
