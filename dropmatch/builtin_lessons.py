"""The built-in lessons: one per rule, each a few runs of the embedded pair and the slots picked
from them so that the lesson asks every reason its rule can give and the close calls it is learned
on (lessons.CLOSE_CALLS).

Two files per lesson, both written by scripts/make_lessons.py (scripts/tools/lesson_runs.py picks the slots):
- assets/lessons/<name>.json: the lesson as the page plays it (intro, choices, slots); the app reads
  only these, checked on load, a bad file refused in one line;
- assets/lessons/runs/<name>.json: the runs it was made from (traces without states, token texts),
  from which the tests rebuild every slot (lessons.lesson_from_trace) and the reference score.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .decoding.acceptance import BASELINE, KNOBS, REASONS, RULES, knob_by_key, votes_needed
from .assets import LESSONS_DIR
from .decoding.config import ConfigError
from .lessons import CLOSE_CALLS, LESSON_VERSION, lesson_from_trace, rule_reasons, short_lesson
from .runfile_schema import SchemaError, check_value

LESSON_FORMAT = "dropmatch-lesson"
LESSON_SIZE = 16  # slots per built-in lesson
MAX_LESSON_BYTES = 2_000_000


@dataclass(frozen=True)
class LessonSpec:
    """A built-in lesson: the settings its runs use (config.Settings fields over the defaults), the two
    sentences that open it (intro_text: their numbers are fields of intro_numbers, the knobs' values), and the
    close calls it must ask besides every reason of its rule."""

    name: str
    title: str
    intro_text: str
    settings: dict
    close_calls: tuple[str, ...] = ("lookup",)
    runs_from: tuple[str, ...] = field(default=("math", "writing", "code", "instructions"))

    @property
    def intro(self) -> str:
        return self.intro_text.format(**intro_numbers(self.settings))


def intro_numbers(settings: dict) -> dict:
    """What a lesson's intro reads: its settings, every knob's value under them (the knob's default unless the
    lesson sets it), and the numbers derived from those (the votes a majority needs, FLy's later drafts, ...)."""
    values = {**settings, **{knob.name: knob.default for knob in KNOBS.values()}}
    values.update({knob_by_key(key).name: value for key, value in settings.items() if knob_by_key(key)})
    rest = 1 - values["ensemble_weight"]
    return {**values, "votes": votes_needed(values["num_paths"], values["majority_fraction"]),
            "fly_later": values["fly_window"] - 1, "ensemble_rest": rest,
            "ensemble_floor": "half" if rest == 0.5 else f"{rest:.0%} of"}


_PATHS = ("Each of K = {num_paths} dropout copies of the target's LM head input gives a path distribution and its "
          "top token.")
SPECS: dict[str, LessonSpec] = {spec.name: spec for spec in (
    LessonSpec("lossless", "Lossless SD, greedy",
               "Greedy speculative decoding accepts a drafted token only when it is the clean target's own top "
               "token. Nothing else is read: not the draft's probability, not how close the runner-up came.",
               {"rule": BASELINE}),
    LessonSpec("sampling", "Lossless SD, sampling (temperature 1)",
               "Sampled speculative decoding accepts a drafted token x with probability min(1, p(x) / q(x)): "
               "sure when the target likes it at least as much as the draft did, a coin when q > p. Where it is "
               "a coin, choose the likelier side: accept when p / q is at least one half.",
               {"rule": BASELINE, "temperature": 1.0}, ("lookup", "coin_rejected")),
    LessonSpec("js", "JS against the paths' centroid",
               f"{_PATHS} A mismatch is accepted when JS(draft ‖ centroid) is no larger than the largest JS of a "
               "path against that centroid: the draft is as close as the paths' own spread.",
               {"rule": "js"}, ("lookup", "js_near")),
    LessonSpec("majority", "Path majority",
               f"{_PATHS} A mismatch is accepted when nearly all paths ({{votes}} of {{num_paths}}) choose the "
               "drafted token and no other token has as many votes.",
               {"rule": "majority"}, ("lookup", "votes_short")),
    LessonSpec("dropmatch", "DropMatch (Algorithm 1)",
               f"{_PATHS} A mismatch is accepted by the JS test first (the draft as close to the centroid as the "
               "paths are), else by the majority test ({votes} of {num_paths} paths choose it).",
               {"rule": "dropmatch"}, ("lookup", "js_near", "votes_short")),
    LessonSpec("typical", "Typical acceptance (Medusa)",
               "Typical acceptance reads the clean target alone: a drafted token is accepted when its target "
               "probability is above min({typical_eps:g}, {typical_delta:g} * exp(-H)), H the target's entropy. The "
               "floor drops where the target is unsure, so a flat target lets through almost any token it gives some "
               "mass.",
               {"rule": "typical"}),
    LessonSpec("fixed_js", "Fixed-threshold JS (Fuzzy SD)",
               "Fixed-threshold JS compares the draft's whole distribution with the clean target's: a drafted "
               "token is accepted when JS(draft ‖ target) is at most a fixed {fixed_js_threshold:g}. The threshold "
               "is the same at every position, confident or not.",
               {"rule": "fixed_js"}),
    LessonSpec("fly", "FLy (entropy gate, deferred window)",
               "FLy reads the clean target and the rest of the round: a mismatch stands where the target is unsure "
               "(the entropy of its top three tokens at least {fly_entropy_threshold:g}) and the next {fly_later} "
               "drafted tokens are the target's own choices. Long drafts (γ {gamma}) give the window room; its last "
               "{fly_window} positions never tolerate.",
               {"rule": "fly", "gamma": "12"}),
    LessonSpec("ensemble", "Static ensemble (DIVERSED), sampling",
               "The static ensemble verifies against v = {ensemble_weight:g} p + {ensemble_rest:g} q instead of p: a "
               "drafted token x passes the same coin with odds min(1, {ensemble_rest:g} + {ensemble_weight:g} p(x) / "
               "q(x)), so even a token the target dislikes passes at least {ensemble_floor} the time. "
               "The lossless coin is tried first.",
               {"rule": "ensemble", "temperature": 1.0}, ("lookup", "coin_rejected")),
    LessonSpec("mars", "MARS (close top-two logits), greedy port",
               "MARS reads the clean target's two largest logits z1 ≥ z2: where z2 / z1 is above {mars_threshold:g} "
               "the target hesitates between its top two tokens, and a draft that is either of them is accepted. A "
               "third choice, "
               "however close, is rejected. (Greedy is our port; the authors relax only sampled decoding.)",
               {"rule": "mars"}),
)}


# ---------------------------------------------------------------- the files


def read_lesson(path: Path) -> dict:
    """A lesson file, checked: ConfigError with one line for anything the player cannot play."""
    data = read_json(path, "lesson")
    try:
        if data.get("format") != LESSON_FORMAT or data.get("version") != LESSON_VERSION:
            raise SchemaError(f"not a {LESSON_FORMAT} file of version {LESSON_VERSION}")
        rule = data.get("rule")
        if rule not in RULES or data.get("choices") != list(rule_reasons(rule)):
            raise SchemaError(f"rule {rule!r:.40} with choices that are not its reasons")
        for name in ("id", "title", "intro"):
            check_value(data.get(name), str, name)
        check_value(data.get("prompts"), tuple[str, ...], "prompts")
        labels = data.get("labels")
        if not isinstance(labels, dict) or not all(isinstance(labels.get(c), str) for c in data["choices"]):
            raise SchemaError("labels: one text per choice expected")
        slots = data.get("slots")
        if not isinstance(slots, list) or not slots:
            raise SchemaError("no slots")
        for i, slot in enumerate(slots):
            _check_slot(slot, data["choices"], f"slots[{i}]")
            if not 0 <= slot["run"] < len(data["prompts"]):
                raise SchemaError(f"slots[{i}]: run {slot['run']} has no prompt")
    except (SchemaError, AttributeError, TypeError) as error:
        raise ConfigError(f"{path.name}: this lesson file is damaged ({error})") from None
    return data


SLOT_FIELDS = {"run": int, "round": int, "slot": int, "source": str, "context": str, "x": str, "q": float, "p": float,
               "target": str, "p_target_top": float, "target_top": tuple[tuple[str, float], ...], "answer": str,
               "why": str, "tags": tuple[str, ...]}
PATH_FIELDS = {"paths": tuple[str, ...], "votes": int, "js": float, "threshold": float}  # a path rule's slots


def _check_slot(slot: dict, choices: list[str], where: str) -> None:
    for name, hint in SLOT_FIELDS.items():
        if name not in slot:
            raise SchemaError(f"{where}: missing field {name!r}")
        check_value(slot[name], hint, f"{where}.{name}")
    for name, hint in PATH_FIELDS.items():
        if name in slot:
            check_value(slot[name], hint, f"{where}.{name}")
    if slot["answer"] not in choices:
        raise SchemaError(f"{where}: answer {slot['answer']!r:.40} is not one of the rule's reasons")
    if not set(slot["tags"]) <= set(CLOSE_CALLS):
        raise SchemaError(f"{where}: unknown close call in {slot['tags']!r:.60}")


def read_json(path: Path, what: str) -> dict:
    """what: "lesson" or "runs" (the lesson's runs file, allowed larger)."""
    name = "lesson" if what == "lesson" else "lesson's runs"
    try:
        if path.stat().st_size > MAX_LESSON_BYTES * (1 if what == "lesson" else 8):
            raise ConfigError(f"{path.name}: this {name} file is too large")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ConfigError(f"{path.name}: this {name} file is not readable JSON ({type(error).__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path.name}: this {name} file is not a JSON object")
    return data


def lesson_path(name: str, folder: Path = LESSONS_DIR) -> Path:
    return folder / f"{name}.json"


def builtin_lessons(folder: Path = LESSONS_DIR) -> tuple[list[dict], list[str]]:
    """(the shipped lessons in SPECS order, one line per lesson that could not be read)."""
    lessons, problems = [], []
    for name in SPECS:
        try:
            lessons.append(read_lesson(lesson_path(name, folder)))
        except ConfigError as error:
            problems.append(str(error))
    return lessons, problems


def lessons_html(record, title: str = "", folder: Path = LESSONS_DIR) -> str:
    """The element the lesson player (assets/lessons.js) mounts on: the built-in lessons, then the shown
    run's lossy and lossless columns as lessons, escaped into a data attribute (no markup runs)."""
    import html

    lessons, problems = builtin_lessons(folder)
    if record is not None:
        for trace, which in ((record.lossy, "lossy"), (record.lossless, "lossless")):
            lesson = short_lesson(lesson_from_trace(trace, record.token_text, f"{title}: {trace.rule}"))
            lessons.append({**lesson, "id": f"this-run-{which}", "prompts": [record.prompt]})
    note = "".join(f'<p class="dm-lesson-problem">{html.escape(line)}</p>' for line in problems)
    if not lessons:
        return note + '<div class="dm-lesson-empty">Run a comparison or open a recorded run: its lessons appear here.</div>'
    payload = json.dumps(lessons, separators=(",", ":"))
    return f'{note}<div class="dm-lesson" data-lessons="{html.escape(payload, quote=True)}"></div>'
