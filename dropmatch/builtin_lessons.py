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

import html
import json
from pathlib import Path

from .decoding.acceptance import RULES
from .assets import LESSONS_DIR
from .decoding.config import ConfigError
from .lessons import CLOSE_CALLS, LESSON_VERSION, lesson_from_trace, rule_reasons, short_lesson
from .runfile_schema import SchemaError, check_value

LESSON_FORMAT = "dropmatch-lesson"
MAX_LESSON_BYTES = 2_000_000
# The shipped lessons, in the page's order; each file carries its own title and intro (scripts/tools/lesson_runs.py
# holds what they were made from).
LESSON_NAMES = ("lossless", "sampling", "js", "majority", "dropmatch", "typical", "fixed_js", "fly", "ensemble", "mars")


def read_lesson(path: Path) -> dict:
    """A lesson file, checked: ConfigError with one line for anything the player cannot play."""
    data = read_json(path, "lesson")
    try:
        if data.get("format") != LESSON_FORMAT or data.get("version") != LESSON_VERSION:
            raise SchemaError(f"not a {LESSON_FORMAT} file of version {LESSON_VERSION}")
        rule = data.get("rule")
        if rule not in RULES or data.get("choices") != list(rule_reasons(rule)):
            raise SchemaError(f"rule {rule!r:.40} with choices that are not its reasons")
        for name, hint in (("id", str), ("title", str), ("intro", str), ("prompts", tuple[str, ...])):
            check_value(data.get(name), hint, name)
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
    """(the shipped lessons in LESSON_NAMES order, one line per lesson that could not be read)."""
    lessons, problems = [], []
    for name in LESSON_NAMES:
        try:
            lessons.append(read_lesson(lesson_path(name, folder)))
        except ConfigError as error:
            problems.append(str(error))
    return lessons, problems


def lessons_html(record, title: str = "", folder: Path = LESSONS_DIR) -> str:
    """The element the lesson player (assets/lessons.js) mounts on: the built-in lessons, then the shown
    run's lossy and lossless columns as lessons, escaped into a data attribute (no markup runs)."""
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
