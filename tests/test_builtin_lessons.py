"""The built-in lessons (dropmatch/builtin_lessons.py, assets/lessons): each asks every reason its rule
can give and its close calls, each slot is what its shipped run's trace says, and a damaged lesson
file is refused in one line (no model: the files are read as shipped)."""

from __future__ import annotations

import json
import shutil

import pytest

from dropmatch.builtin_lessons import LESSON_NAMES, builtin_lessons, lesson_path, lessons_html, read_lesson
from dropmatch.decoding.config import ConfigError, RuleConfig, Settings
from dropmatch.lessons import CLOSE_CALLS, rule_reasons
from dropmatch.render import explain
from tools.lesson_runs import LESSON_SIZE, SPECS, LessonSpec
from tools.lesson_runs import lesson_of_runs, pick_slots, read_runs, runs_path
from dropmatch.decoding.trace import DraftedToken


@pytest.mark.parametrize("name", list(SPECS))
def test_every_builtin_lesson_asks_each_reason_of_its_rule_and_each_close_call_it_teaches(name):
    lesson, spec = read_lesson(lesson_path(name)), SPECS[name]
    assert lesson["id"] == name and lesson["intro"] == spec.intro and len(lesson["slots"]) == LESSON_SIZE
    assert lesson["rule"] == spec.settings["rule"] and lesson["choices"] == list(rule_reasons(lesson["rule"]))
    asked = [slot["answer"] for slot in lesson["slots"]]
    assert set(asked) == set(lesson["choices"]), name
    assert max(asked.count(reason) for reason in set(asked)) <= LESSON_SIZE // 2  # no answer wins by itself
    tags = {tag for slot in lesson["slots"] for tag in slot["tags"]}
    assert set(spec.close_calls) <= tags, name
    assert spec.intro.count(". ") + 1 >= 2  # two sentences at least


def test_every_shipped_lesson_file_is_a_builtin_lesson_of_a_rule_the_table_has():
    """No orphan ships (a lesson of a removed rule would be uploaded to the Space and never played)."""
    from dropmatch.assets import LESSONS_DIR

    assert tuple(SPECS) == LESSON_NAMES  # the app lists what the specs made, in their order
    assert {path.stem for path in LESSONS_DIR.glob("*.json")} == set(SPECS)
    assert {path.stem for path in (LESSONS_DIR / "runs").glob("*.json")} == set(SPECS)


def test_the_close_calls_are_what_their_names_say():
    for name in SPECS:
        lesson = read_lesson(lesson_path(name))
        for slot in lesson["slots"]:
            assert ("lookup" in slot["tags"]) == (slot["source"] == "ngram")
            if "lookup" in slot["tags"]:
                assert slot["q"] == 1.0  # one-hot q
            if "js_near" in slot["tags"]:
                assert abs(slot["js"] / slot["threshold"] - 1) <= 0.1
            if "votes_short" in slot["tags"]:
                assert slot["votes"] == 3 and len(slot["paths"]) == 5  # under the 4-of-5 rule
            if "coin_rejected" in slot["tags"]:
                assert slot["answer"] == "rejected" and slot["q"] > slot["p"] and not lesson["greedy"]


@pytest.mark.parametrize("name", list(SPECS))
def test_a_builtin_lessons_slots_are_the_ones_its_shipped_runs_traces_give(name):
    runs = read_runs(runs_path(name))
    spec = SPECS[name]
    settings = Settings("x", **spec.settings)
    for _, trace, _ in runs:
        assert (trace.rule, trace.temperature) == (settings.rule, settings.temperature)
        assert not trace.states  # shipped without the rule lab's states
    rebuilt = json.loads(json.dumps(lesson_of_runs(spec, runs)))
    assert rebuilt == read_lesson(lesson_path(name))


def _slot(answer: str, tags=()) -> dict:
    return {"answer": answer, "tags": list(tags)}


def test_picking_asks_every_reason_and_close_call_and_takes_the_reasons_in_turn():
    spec = LessonSpec("t", "t", "t.", {"rule": "dropmatch"}, ("lookup", "votes_short"))
    slots = ([_slot("rejected")] * 40 + [_slot("exact")] * 30 + [_slot("js")] * 3 + [_slot("majority")]
             + [_slot("rejected", ["votes_short"])] + [_slot("exact", ["lookup"])])
    picked = pick_slots(spec, "dropmatch", slots, size=16)
    answers = [s["answer"] for s in picked]
    assert len(picked) == 16 and answers.count("js") == 3 and answers.count("majority") == 1
    assert {"votes_short", "lookup"} <= {t for s in picked for t in s["tags"]}
    assert abs(answers.count("exact") - answers.count("rejected")) <= 1  # the rest shared in turn


def test_picking_keeps_run_order():
    spec = LessonSpec("t", "t", "t.", {"rule": "lossless"})
    slots = [{"answer": "exact" if i % 3 else "rejected", "tags": [], "i": i} for i in range(50)]
    picked = pick_slots(spec, "lossless", slots, size=10)
    assert [s["i"] for s in picked] == sorted(s["i"] for s in picked) and len({s["i"] for s in picked}) == 10


def _broken(folder, name: str, change) -> None:
    data = json.loads(lesson_path(name).read_text(encoding="utf-8"))
    change(data)
    (folder / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")


DAMAGE = {
    "not a lesson": lambda d: d.update(format="dropmatch-run"),
    "an answer the rule cannot give": lambda d: d["slots"][0].update(answer="majority"),
    "a slot without its context": lambda d: d["slots"][1].pop("context"),
    "an unknown close call": lambda d: d["slots"][2].update(tags=["lucky"]),
    "a number as text": lambda d: d["slots"][3].update(q="0.5"),
    "choices of another rule": lambda d: d.update(choices=["exact", "rejected"]),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_lesson_file_is_refused_in_one_line_and_the_others_still_play(tmp_path, damage):
    for name in SPECS:
        shutil.copy(lesson_path(name), tmp_path / f"{name}.json")
    _broken(tmp_path, "js", DAMAGE[damage])
    with pytest.raises(ConfigError) as error:
        read_lesson(tmp_path / "js.json")
    assert "\n" not in str(error.value) and str(error.value).startswith("js.json: this lesson file is damaged")
    lessons, problems = builtin_lessons(tmp_path)
    assert [lesson["id"] for lesson in lessons] == [name for name in SPECS if name != "js"]
    assert problems == [str(error.value)]
    assert str(error.value).replace("'", "&#x27;") in lessons_html(None, folder=tmp_path)


def test_a_lesson_file_that_is_not_json_is_refused_in_one_line(tmp_path):
    (tmp_path / "js.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^js.json: this lesson file is not readable JSON \(JSONDecodeError\)$"):
        read_lesson(tmp_path / "js.json")


def test_without_a_run_the_lessons_tab_offers_the_builtin_lessons():
    html = lessons_html(None)
    assert 'class="dm-lesson"' in html and html.count("&quot;intro&quot;") == len(SPECS)


def test_the_close_call_table_names_four_cases():
    assert set(CLOSE_CALLS) == {"lookup", "js_near", "votes_short", "coin_rejected"}


def _drafted(reason: str, draft_prob: float, target_prob: float) -> DraftedToken:
    return DraftedToken(token=1, draft_prob=draft_prob, target_token=2, target_token_prob=0.6, target_prob=target_prob,
                        js_target=0.1, reason=reason)


def test_under_sampling_the_sentence_names_the_lossless_coin_and_its_odds():
    text = {1: "cat", 2: "dog"}.get
    assert "accepted with probability p / q = 0.50" in explain(_drafted("exact", 0.4, 0.2), text, RuleConfig("lossless"), greedy=False)
    assert "accepted for sure" in explain(_drafted("exact", 0.1, 0.2), text, RuleConfig("lossless"), greedy=False)
    rejected = explain(_drafted("rejected", 0.8, 0.2), text, RuleConfig("lossless"), greedy=False)
    assert rejected.startswith("“cat” rejected: the lossless coin rejected it") and "0.25" in rejected
    assert "own choice" in explain(_drafted("exact", 0.4, 0.6), text, RuleConfig("lossless"))  # greedy: the argmax


def test_a_rejection_names_only_the_tests_its_rule_reads_and_every_comparison_it_states_holds():
    import re

    for name in SPECS:
        lesson = read_lesson(lesson_path(name))
        reads = set(lesson["choices"][1:-1])
        for slot in lesson["slots"]:
            why = slot["why"]
            for js, sign, threshold in re.findall(r"JS \(?(\d+\.\d+) ([>≤]) (?:threshold )?(\d+\.\d+)", why):
                assert (float(js) > float(threshold)) == (sign == ">"), why
            if slot["answer"] == "rejected":
                assert ("JS " in why and "threshold" in why) == ("js" in reads), (name, why)
                assert ("paths chose it" in why) == ("majority" in reads), (name, why)


def test_the_lessons_prose_reads_its_numbers_from_the_knobs(monkeypatch):
    """The intros say the knobs' values: a knob's default changed, the prose changes with it (K, the votes a
    majority needs, the typical floor, FLy's window, the ensemble's weight, MARS's threshold)."""
    import dataclasses

    from dropmatch.decoding import acceptance

    for name, value in (("num_paths", 7), ("typical_eps", 0.25), ("fly_window", 4), ("ensemble_weight", 0.7),
                        ("mars_threshold", 0.85)):
        monkeypatch.setitem(acceptance.KNOBS, name, dataclasses.replace(acceptance.KNOBS[name], default=value))
    assert "K = 7 dropout copies" in SPECS["majority"].intro and "(6 of 7)" in SPECS["majority"].intro
    assert "min(0.25, 0.09 * exp(-H))" in SPECS["typical"].intro
    assert "the next 3 drafted tokens" in SPECS["fly"].intro and "last 4 positions" in SPECS["fly"].intro
    assert "v = 0.7 p + 0.3 q" in SPECS["ensemble"].intro and "30% of the time" in SPECS["ensemble"].intro
    assert "above 0.85" in SPECS["mars"].intro
