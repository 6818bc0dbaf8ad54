"""The replay: its payload (pure) and the player in a real headless Chromium, on the shipped runs
(no model: a recorded run opens without one)."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from dropmatch.runfile import read_recorded_run, recorded_runs
from dropmatch.replay import replay_html, replay_payload
from dropmatch.ui.views import shipped_run_title

from fake_engine import FakeEngine
from local_server import open_tab, serve_locally

SHIPPED = recorded_runs()


@pytest.mark.parametrize("title", list(SHIPPED))
def test_payload_counters_end_at_the_runs_own_metrics(title):
    record = read_recorded_run(SHIPPED[title])
    payload = replay_payload(record, title)
    for column, trace, metrics in zip(payload["columns"], (record.lossless, record.lossy), record.metrics()):
        assert column["final"]["tokens"] == metrics.new_tokens == 1 + sum(len(r["emitted"]) for r in column["rounds"])
        assert column["final"]["calls"] == metrics.target_calls == len(column["rounds"]) + 1
        assert column["final"]["tau"] == pytest.approx(metrics.tau)
        assert column["final"]["lossy_only"] == round(metrics.lossy_share * metrics.new_tokens)
        assert [d["reason"] for r in column["rounds"] for d in r["drafted"]] == \
            [d.reason for r in trace.rounds for d in r.drafted]


def test_payload_is_escaped_so_no_token_text_becomes_markup():
    record = read_recorded_run(next(iter(SHIPPED.values())))
    record.tokens[record.lossless.output_ids[1]] = '"><script>alert(1)</script>'
    element = replay_html(record)
    tags = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.append((tag, dict(attrs)))

    Tags().feed(element)
    assert [tag for tag, _ in tags] == ["div"] and "<script>" not in element
    assert json.loads(tags[0][1]["data-run"]) == json.loads(json.dumps(replay_payload(record)))


def test_a_link_names_a_shipped_run_by_file_name_or_title():
    stem, title = next((path.stem, title) for title, path in SHIPPED.items())
    assert shipped_run_title(SHIPPED, stem) == title
    assert shipped_run_title(SHIPPED, title) == title
    assert shipped_run_title(SHIPPED, "no such run") is None and shipped_run_title(SHIPPED, "") is None


# ---------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def browser_app():
    from pathlib import Path

    if not Path("/usr/bin/chromium").exists():
        pytest.fail("Debian's chromium is missing: apt-get install -y chromium (scripts/setup.sh --test does it)")
    import app
    from dropmatch.pair_host import PairHost
    from playwright.sync_api import sync_playwright

    from dropmatch.runfile import Downloads
    import tempfile

    downloads = Downloads(Path(tempfile.mkdtemp(prefix="dm-test-downloads-")))
    demo = app.create_demo(PairHost(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine()), downloads)
    serve_locally(demo, css=app.css())
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            yield demo.local_url, browser, downloads.folder
        finally:
            browser.close()
            demo.close()


def _open(browser, url: str, query: str):
    page = browser.new_page(viewport={"width": 1920, "height": 1080})
    page.goto(url + query)
    page.wait_for_selector(".dm-rp", timeout=60_000)
    return page


def _stage(page) -> str:
    return page.locator(".dm-rp").get_attribute("data-stage")


# Resolves after the page has drawn `n` animation frames: a wait counted in frames, not seconds.
ANIMATION_FRAMES = "n => new Promise(done => { let left = n; const f = () => (--left <= 0 ? done() : requestAnimationFrame(f)); requestAnimationFrame(f); })"
SHOWN_STEM = next(iter(SHIPPED.values())).stem if SHIPPED else ""


@pytest.mark.browser
def test_replay_of_a_shipped_run_ends_on_its_texts_and_metrics(browser_app):
    url, browser, _ = browser_app
    title = next(iter(SHIPPED))
    record = read_recorded_run(SHIPPED[title])
    page = _open(browser, url, f"?run={SHIPPED[title].stem}")
    assert page.locator("#replay-tab").is_visible()  # the link opened the Replay tab
    page.select_option("[data-act=speed]", "4")
    page.click("[data-act=play]")
    page.wait_for_function("document.querySelector('.dm-rp').dataset.playing === '0'", timeout=60_000)
    for index, (trace, metrics) in enumerate(zip((record.lossless, record.lossy), record.metrics())):
        stop = set(trace.output_ids[-1:]) if trace.stop_reason == "eos" else set()
        expected = "".join(record.token_text(t) for t in trace.output_ids if t not in stop)
        shown = page.locator(f"[data-text='{index}']").evaluate(  # the emitted text: rejected drafts struck aside
            "e => { const c = e.cloneNode(true); c.querySelectorAll('.dm-rejected').forEach((r) => r.remove()); "
            "return c.textContent; }")
        assert shown.replace("⏎\n", "\n") == expected
        refused = sum(r.extra_kind == "correction" and r.num_accepted < len(r.drafted) for r in trace.rounds)
        assert page.locator(f"[data-text='{index}'] .dm-rejected").count() == refused
        counters = {name: page.locator(f"[data-counters='{index}'] [data-counter={name}]").inner_text()
                    for name in ("tokens", "calls", "tau", "lossy")}
        assert counters == {"tokens": str(metrics.new_tokens), "calls": str(metrics.target_calls),
                            "tau": f"{metrics.tau:.2f}", "lossy": str(round(metrics.lossy_share * metrics.new_tokens))}
    page.close()


@pytest.mark.browser
def test_pause_stops_the_frames_and_a_key_advances_one_stage(browser_app):
    url, browser, _ = browser_app
    page = _open(browser, url, f"?run={SHOWN_STEM}")
    page.select_option("[data-act=speed]", "0.25")
    page.click("[data-act=play]")
    page.wait_for_function("document.querySelector('.dm-rp').dataset.stage !== '0,0'", timeout=60_000)
    page.click("[data-act=play]")  # pause
    paused_at = _stage(page)
    clock = page.locator("[data-counter=clock]").first.inner_text()
    assert paused_at != "0,0" and page.locator(".dm-rp").get_attribute("data-playing") == "0"
    page.evaluate(ANIMATION_FRAMES, 30)  # playing, 30 frames would move the clock (and redraw it)
    assert _stage(page) == paused_at and page.locator("[data-counter=clock]").first.inner_text() == clock
    page.keyboard.press("Home")
    assert _stage(page) == "0,0"
    page.locator("body").click(position={"x": 5, "y": 5})  # focus on the page, not on a control
    page.keyboard.press("PageDown")  # what a presenter's clicker sends
    assert _stage(page) == "1,1"
    page.keyboard.press("ArrowRight")
    assert _stage(page) == "2,2"
    page.keyboard.press("ArrowLeft")
    assert _stage(page) == "1,1"
    page.locator("[data-text='1'] .dm-tok").first.click()
    assert "Pinned token:" in page.locator("[data-pin]").inner_text() and "none" not in page.locator("[data-pin]").inner_text()
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_in_lesson_mode_the_replay_stops_before_each_verdict_and_scores_the_predictions(browser_app):
    from dropmatch.lessons import rule_reasons
    from dropmatch.render import kind_label

    url, browser, _ = browser_app
    record = read_recorded_run(SHIPPED[next(iter(SHIPPED))])
    checked = [d.reason for r in record.lossy.rounds for d in r.drafted if d.reason != "unchecked"]
    choices = rule_reasons(record.lossy.rule)
    page = _open(browser, url, f"?run={SHOWN_STEM}")
    page.check("[data-act=predict]")
    page.locator("body").click(position={"x": 5, "y": 5})
    page.click("[data-act=play]")  # playing, the race stops at the lossy column's first verdict
    page.wait_for_selector("[data-question]", timeout=60_000)
    assert page.locator(".dm-rp").get_attribute("data-playing") == "0"
    answers, asked = [], 12
    for i in range(asked):
        if i:
            page.keyboard.press("ArrowRight")  # and stepping stops at each later one
            while page.locator("[data-question]").count() == 0:
                page.keyboard.press("ArrowRight")
        answer = choices[(i * 2) % len(choices)]
        before = _stage(page)
        page.keyboard.press(str(choices.index(answer) + 1))
        answers.append(answer)
        assert _stage(page) != before and page.locator("[data-question]").count() == 0  # the verdict, revealed
        mark = page.locator("[data-mark]").get_attribute("data-mark")
        assert mark == ("right" if answer == checked[i] else "wrong"), (i, answer, checked[i])
        assert kind_label(checked[i]) in page.locator("[data-note='1'] b").first.inner_text()  # the rule's verdict
    right = sum(a == t for a, t in zip(answers, checked))
    assert page.locator("[data-quiz]").get_attribute("data-quiz") == f"{right}/{asked}" and 0 < right < asked
    page.close()


@pytest.mark.browser
def test_presenter_layout_shows_both_columns_and_counters_on_one_1080p_screen(browser_app):
    url, browser, _ = browser_app
    page = _open(browser, url, f"?run={SHOWN_STEM}&presenter=1")
    page.wait_for_selector(".dm-rp.dm-presenting")
    for _ in range(60):
        page.keyboard.press("PageDown")
    boxes = {name: page.locator(selector).bounding_box() for name, selector in
             {"controls": ".dm-rp-controls", "counters0": "[data-counters='0']", "counters1": "[data-counters='1']",
              "text0": "[data-text='0']", "text1": "[data-text='1']", "note1": "[data-note='1']"}.items()}
    for name, box in boxes.items():
        assert box is not None and box["y"] >= 0 and box["y"] + min(box["height"], 200) <= 1080, (name, box)
    assert boxes["text0"]["x"] + boxes["text0"]["width"] <= boxes["text1"]["x"]  # side by side
    overlay = page.locator(".dm-rp").bounding_box()  # fixed over the page: nothing to scroll to
    assert (overlay["x"], overlay["y"], overlay["width"], overlay["height"]) == (0, 0, 1920, 1080), overlay
    page.close()


CONTRAST_JS = """
() => {
  const lum = (rgb) => {
    const [r, g, b] = rgb.match(/[\\d.]+/g).slice(0, 3).map(Number).map((v) => v / 255)
      .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  return [...document.querySelectorAll('.dm-tok')].filter((e) => e.offsetParent !== null).map((e) => {
    const style = getComputedStyle(e);
    const [a, b] = [lum(style.color), lum(style.backgroundColor)];
    return {kind: e.className, ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), bg: style.backgroundColor};
  });
}
"""


@pytest.mark.browser
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_token_meets_a_4_5_contrast_ratio_in_both_themes(browser_app, theme):
    url, browser, _ = browser_app
    page = _open(browser, url, f"?run={SHOWN_STEM}&__theme={theme}")
    assert page.evaluate("document.body.classList.contains('dark')") == (theme == "dark")
    for _ in range(12):
        page.keyboard.press("PageDown")  # drafted, checked and landed tokens all on screen
    found = page.evaluate(CONTRAST_JS)
    kinds = {kind for item in found for kind in item["kind"].split() if kind.startswith("dm-") and kind != "dm-tok"}
    assert len(found) > 100 and {"dm-exact", "dm-correction", "dm-pending"} <= kinds, kinds
    assert all("rgba(0, 0, 0, 0)" != item["bg"] for item in found)  # every token has its own background
    worst = min(found, key=lambda item: item["ratio"])
    assert worst["ratio"] >= 4.5, worst
    page.close()


@pytest.mark.browser
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_charts_follow_the_pages_theme(browser_app, theme):
    url, browser, _ = browser_app
    page = _open(browser, url, f"?run={SHOWN_STEM}&__theme={theme}")
    open_tab(page, "Charts")
    page.wait_for_selector(".js-plotly-plot", timeout=30_000)
    page.wait_for_function(
        f"() => [...document.querySelectorAll('.js-plotly-plot')].every(c => c._fullLayout && "
        f"(c._fullLayout.paper_bgcolor === '#0b0f19') === {'true' if theme == 'dark' else 'false'})", timeout=10_000)
    fonts = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(c => c._fullLayout.font.color)")
    assert len(fonts) >= 4 and set(fonts) == ({"#e5e7eb"} if theme == "dark" else {"#2a3f5f"}), fonts
    page.close()


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
@pytest.mark.browser
def test_first_visits_share_one_shipped_view_and_write_no_run_to_disk(browser_app):
    """Every first visit shows the shipped run (its step slider and its replay work), read from memory:
    the downloads folder holds no per-visit run, only the shipped run's CSV written once."""
    url, browser, downloads_folder = browser_app
    for _ in range(3):
        page = _open(browser, url, "")
        assert page.locator(".dm-rp").count() == 1 and page.locator("#lossless-text .dm-tok").count() > 20
        page.keyboard.press("PageDown")
        assert _stage(page) == "1,1"
        page.close()
    written = sorted(path.name for path in downloads_folder.iterdir())
    assert all(name.startswith("shipped-") and name.endswith(".csv") for name in written), written
    assert len(written) <= len(SHIPPED)
