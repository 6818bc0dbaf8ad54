"""Lessons (dropmatch/lessons.py): a run's judged slots as questions, and the reference score (lesson_score.py) a
learner's answers get, on the shipped runs (no model)."""

from __future__ import annotations

import json

import pytest

from dropmatch.decoding.acceptance import RULES
from dropmatch.builtin_lessons import lesson_path, read_lesson
from tools.lesson_runs import SPECS, lesson_of_runs, read_runs, runs_path
from dropmatch.lessons import CONTEXT_TOKENS, lesson_from_trace, rule_reasons
from lesson_score import score
from dropmatch.runfile import read_recorded_run, recorded_runs

SHIPPED = recorded_runs()


def _lessons():
    for title, path in SHIPPED.items():
        record = read_recorded_run(path)
        for trace in (record.lossless, record.lossy):
            yield title, trace, record, lesson_from_trace(trace, record.token_text, title)


def test_every_rule_offers_exact_its_own_checks_and_rejected():
    assert rule_reasons("lossless") == ("exact", "rejected")
    assert rule_reasons("dropmatch") == ("exact", "js", "majority", "rejected")
    for name in RULES:
        reasons = rule_reasons(name)
        assert reasons[0] == "exact" and reasons[-1] == "rejected" and len(set(reasons)) == len(reasons)


def test_a_lesson_asks_every_checked_slot_in_order_with_the_runs_own_reason():
    for title, trace, record, lesson in _lessons():
        checked = [d for r in trace.rounds for d in r.drafted if d.reason != "unchecked"]
        assert [s["answer"] for s in lesson["slots"]] == [d.reason for d in checked], title
        assert set(lesson["choices"]) >= {s["answer"] for s in lesson["slots"]}, title
        # a path rule's paths are drawn where the exact test cannot accept: those slots show them
        judged = [s for s in lesson["slots"] if s["answer"] != "exact"]
        assert all(("paths" in s) == RULES[trace.rule].uses_paths for s in judged), title


def test_a_slots_context_is_the_text_emitted_just_before_it():
    for title, trace, record, lesson in _lessons():
        assert trace.output_ids[0] == trace.first_token
        expected, emitted = [], 1
        for r in trace.rounds:
            for j, d in enumerate(r.drafted):
                if d.reason == "unchecked":
                    break
                before = trace.output_ids[: emitted + j][-CONTEXT_TOKENS:]
                expected.append("".join(record.token_text(t) for t in before))
            emitted += len(r.emitted)
        assert [s["context"] for s in lesson["slots"]] == expected, title


def test_all_right_answers_score_every_slot_with_no_confusion():
    title, trace, record, lesson = next(_lessons())
    result = score(lesson, [s["answer"] for s in lesson["slots"]])
    assert result["right"] == result["asked"] == result["best_streak"] == len(lesson["slots"]) > 20
    assert result["confusions"] == []


def test_wrong_answers_are_grouped_by_reason_and_js_confusions_state_js_over_threshold():
    lesson = next(lesson for _, trace, _, lesson in _lessons() if trace.rule == "dropmatch"
                  and any(s["answer"] == "js" for s in lesson["slots"]))
    answers = ["rejected" if s["answer"] == "js" else s["answer"] for s in lesson["slots"]]
    result = score(lesson, answers)
    flipped = [s for s in lesson["slots"] if s["answer"] == "js"]
    assert result["right"] == len(lesson["slots"]) - len(flipped)
    (confusion,) = result["confusions"]
    assert (confusion.answered, confusion.truth, confusion.count) == ("rejected", "js", len(flipped))
    low = min(s["js"] / s["threshold"] for s in flipped)
    assert f"{low:.2g}" in confusion.sentence and "the threshold" in confusion.sentence


@pytest.mark.parametrize("cut", [0, 1, 5])
def test_a_partly_answered_lesson_scores_only_what_was_asked(cut):
    _, _, _, lesson = next(_lessons())
    result = score(lesson, ["exact"] * cut)
    assert result["asked"] == cut and result["right"] <= cut


# ---------------------------------------------------------------- the player, in the browser

SHOWN = next(iter(SHIPPED.items()))  # the run a first visit shows


@pytest.fixture(scope="module")
def lesson_page(fake_app_page):
    return fake_app_page


def _lessons_tab(page, lesson_id: str | None = None):
    from local_server import open_tab

    open_tab(page, "Lessons")
    page.wait_for_selector(".dm-ls [data-score]", timeout=60_000)
    if lesson_id is not None:  # a lesson of the run shown comes with the first visit's view: wait for it
        page.wait_for_function("(id) => JSON.parse(document.querySelector('.dm-lesson').dataset.lessons)"
                               ".some((lesson) => lesson.id === id)", arg=lesson_id, timeout=60_000)
        lessons = json.loads(page.locator(".dm-lesson").get_attribute("data-lessons"))
        index = [lesson.get("id") for lesson in lessons].index(lesson_id)
        page.locator(f"[data-lesson='{index}']").click()
    page.locator(".dm-ls").focus()  # as a keyboard user tabs into it


def _state(page) -> tuple[int, str]:
    root = page.locator(".dm-ls")
    return int(root.get_attribute("data-slot")), root.get_attribute("data-stage")


def _reference_lesson():
    from dropmatch.lessons import short_lesson

    title, path = SHOWN
    record = read_recorded_run(path)
    return short_lesson(lesson_from_trace(record.lossy, record.token_text, f"{title}: {record.lossy.rule}"))


@pytest.mark.slow
@pytest.mark.browser
def test_a_lesson_played_with_the_keyboard_alone_ends_with_the_python_score_and_confusions(lesson_page):
    url, browser = lesson_page
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url)
    _lessons_tab(page, "this-run-lossy")
    lesson = _reference_lesson()
    shown = next(l for l in json.loads(page.locator(".dm-lesson").get_attribute("data-lessons")) if l["id"] == "this-run-lossy")
    expected = {**json.loads(json.dumps(lesson)), "id": "this-run-lossy", "prompts": [read_recorded_run(SHOWN[1]).prompt]}
    assert shown == expected  # the lesson the Python functions make
    answers = [lesson["choices"][(i * 7) % len(lesson["choices"])] for i in range(len(lesson["slots"]))]
    for i, answer in enumerate(answers):
        assert _state(page) == (i, "ask")
        page.keyboard.press(str(lesson["choices"].index(answer) + 1))
        if _state(page)[1] == "exact":
            assert page.locator("[data-reveal=paths]").count() == 0  # the exact test first, then the paths
            page.keyboard.press("Enter")
        verdict = page.locator(".dm-ls-verdict")
        assert verdict.get_attribute("data-verdict") == lesson["slots"][i]["answer"]  # the right reason, revealed
        assert page.locator(".dm-ls-why").inner_text() == lesson["slots"][i]["why"]
        page.keyboard.press("ArrowRight")
    page.wait_for_selector("[data-finished]")
    reference = score(lesson, answers)
    assert int(page.locator(".dm-ls").get_attribute("data-right")) == reference["right"]
    assert reference["confusions"] and reference["right"] < len(answers)  # the script gets some wrong
    rows = page.locator("[data-confusion]").evaluate_all("rows => rows.map((r) => r.dataset.confusion)")
    assert rows == [f"{c.answered}|{c.truth}|{c.count}" for c in reference["confusions"]]
    assert f"best streak {reference['best_streak']}" in page.locator("[data-finished]").inner_text()
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_a_reload_resumes_the_lesson_at_the_same_slot(lesson_page):
    url, browser = lesson_page
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url)
    _lessons_tab(page, "js")
    for _ in range(3):
        page.keyboard.press("1")
        while _state(page)[1] != "ask":
            page.keyboard.press("Enter")
    right = page.locator(".dm-ls").get_attribute("data-right")
    page.reload()
    _lessons_tab(page)  # the lesson last opened opens again
    assert page.locator("[data-intro]").inner_text() == read_lesson(lesson_path("js"))["intro"]
    assert _state(page) == (3, "ask") and page.locator(".dm-ls").get_attribute("data-right") == right
    page.close()


def _builtin_reference(name: str) -> dict:
    """The built-in lesson as the Python functions make it from its shipped runs' traces."""
    return json.loads(json.dumps(lesson_of_runs(SPECS[name], read_runs(runs_path(name)))))


@pytest.mark.slow
@pytest.mark.browser
def test_a_builtin_lesson_opened_by_its_link_and_played_by_touch_scores_as_its_runs_traces_say(lesson_page):
    url, browser = lesson_page
    page = browser.new_page(viewport={"width": 900, "height": 900}, has_touch=True)
    page.goto(url + "?lesson=dropmatch")
    _lessons_tab(page)
    lesson = _builtin_reference("dropmatch")
    assert page.locator("[data-intro]").inner_text() == lesson["intro"]
    answers = [lesson["choices"][(i * 3 + 1) % len(lesson["choices"])] for i in range(len(lesson["slots"]))]
    for i, answer in enumerate(answers):
        assert _state(page) == (i, "ask")
        player = page.locator(".dm-ls")  # the page has other players' buttons (the replay's)
        player.locator(f"[data-choice='{answer}']").tap()
        while _state(page)[1] != "verdict":
            player.locator("[data-act=next]").tap()
        truth = lesson["slots"][i]["answer"]
        assert page.locator(".dm-ls-verdict").get_attribute("data-verdict") == truth
        assert ("✓ right" in page.locator(".dm-ls-verdict").inner_text()) == (answer == truth)
        tags = player.locator("[data-tag]").evaluate_all("tags => tags.map((t) => t.dataset.tag)")
        assert tags == lesson["slots"][i]["tags"]  # the close call is named in the reveal
        player.locator("[data-act=next]").tap()
    page.wait_for_selector("[data-finished]")
    reference = score(lesson, answers)
    assert reference["confusions"] and 0 < reference["right"] < len(answers)
    assert int(page.locator(".dm-ls").get_attribute("data-right")) == reference["right"]
    rows = page.locator("[data-confusion]").evaluate_all("rows => rows.map((r) => r.dataset.confusion)")
    assert rows == [f"{c.answered}|{c.truth}|{c.count}" for c in reference["confusions"]]
    sentences = page.locator("[data-confusion] td:last-child").all_inner_texts()
    assert sentences == [c.sentence for c in reference["confusions"]]
    page.close()


def _pdf_pages(pdf: bytes) -> int:
    import re

    return len(re.findall(rb"/Type\s*/Page(?![a-z])", pdf))


@pytest.mark.slow
@pytest.mark.browser
def test_the_printable_sheet_prints_the_slots_without_answers_and_the_key_on_its_own_last_page(lesson_page, tmp_path):
    url, browser = lesson_page
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(url + "?lesson=majority")
    _lessons_tab(page)
    with page.context.expect_page() as opened:
        page.locator(".dm-ls [data-act=sheet]").click()
    sheet = opened.value
    sheet.wait_for_load_state()
    lesson = read_lesson(lesson_path("majority"))
    slots = sheet.locator(".slot")
    assert slots.count() == len(lesson["slots"])
    asked = " ".join(slots.all_inner_texts())
    assert all(slot["why"] not in asked for slot in lesson["slots"])  # no answer before the key
    key_rows = sheet.locator(".key tr").all_inner_texts()[1:]
    assert [row.split("\t")[1] for row in key_rows] == [lesson["labels"][s["answer"]] for s in lesson["slots"]]
    sheet.emulate_media(media="print")
    assert sheet.locator(".key").evaluate("e => getComputedStyle(e).breakBefore") == "page"
    pdf = sheet.pdf(format="A4")
    (tmp_path / "lesson_sheet.pdf").write_bytes(pdf)
    assert pdf.startswith(b"%PDF") and _pdf_pages(pdf) >= 2
    sheet.close()
    page.close()


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_lessons_tab_fits_a_phone_and_its_text_meets_4_5_contrast(lesson_page, theme):
    from local_server import TEXT_CONTRAST_JS, assert_contrast, assert_no_horizontal_scroll

    url, browser = lesson_page
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(url + f"?lesson=dropmatch&__theme={theme}")
    _lessons_tab(page)
    assert page.evaluate("document.body.classList.contains('dark')") == (theme == "dark")
    found = []
    for _ in range(4):  # the question, then the reveal of judged slots (paths, JS bars, close calls)
        found += page.evaluate(TEXT_CONTRAST_JS, ".dm-ls")
        page.keyboard.press("1")
        while _state(page)[1] != "verdict":
            page.keyboard.press("Enter")
        found += page.evaluate(TEXT_CONTRAST_JS, ".dm-ls")
        assert_no_horizontal_scroll(page)
        page.keyboard.press("Enter")
    assert {"BUTTON", "P", "SPAN", "KBD"} <= {item["tag"] for item in found}
    assert_contrast(found)
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_a_lesson_link_opens_the_lessons_tab_at_that_lessons_first_question_in_view(lesson_page):
    """/?lesson=js: the Lessons tab is selected, the JS lesson open at its first question, and that question
    inside the first screen (no scrolling, no click)."""
    url, browser = lesson_page
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url + "?lesson=js")
    page.wait_for_selector(".dm-ls [data-score]", timeout=60_000)
    assert page.get_by_role("tab", name="Lessons").get_attribute("aria-selected") == "true"
    lesson = _builtin_reference("js")
    assert page.locator("[data-intro]").inner_text() == lesson["intro"]
    assert _state(page) == (0, "ask")
    page.wait_for_timeout(500)  # the scroll after the lesson's first render
    box = page.locator(".dm-ls [data-choice]").first.bounding_box()
    height = page.evaluate("window.innerHeight")
    assert box is not None and 0 <= box["y"] and box["y"] + box["height"] <= height, (box, height)
    page.close()
