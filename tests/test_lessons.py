"""Lessons (dropmatch/lessons.py): a run's judged slots as questions, and the reference score a
learner's answers get, on the shipped runs (no model)."""

from __future__ import annotations

import pytest

from dropmatch.acceptance import RULES
from dropmatch.lessons import CONTEXT_TOKENS, lesson_from_trace, rule_reasons, score
from dropmatch.record import read_recorded_run, recorded_runs

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
