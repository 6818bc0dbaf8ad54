"""Making the built-in lessons (scripts/make_lessons.py) and rebuilding them in the tests: a lesson's runs
file (assets/lessons/runs/<name>.json) read back, its candidate slots, and the slots a lesson asks picked
from them. The app reads only the lessons themselves (dropmatch/builtin_lessons.py)."""

from __future__ import annotations

from pathlib import Path

from dropmatch.assets import LESSONS_DIR
from dropmatch.builtin_lessons import LESSON_FORMAT, LESSON_SIZE, LessonSpec, read_json
from dropmatch.decoding.acceptance import REASONS
from dropmatch.decoding.config import ConfigError
from dropmatch.decoding.trace import GenerationTrace, upgraded_dict
from dropmatch.lessons import LESSON_VERSION, lesson_from_trace, rule_reasons
from dropmatch.runfile_schema import SchemaError, check_trace_consistency, check_value

RUNS_FORMAT = "dropmatch-lesson-runs"


def missing(spec: LessonSpec, rule: str, slots: list[dict], each: int = 2) -> list[str]:
    """What the lesson must ask and these slots lack: reasons of the rule with fewer than `each`
    slots, then close calls with none."""
    reasons = [s["answer"] for s in slots]
    tags = {t for s in slots for t in s["tags"]}
    return ([r for r in rule_reasons(rule) if reasons.count(r) < each]
            + [t for t in spec.close_calls if t not in tags])


def pick_slots(spec: LessonSpec, rule: str, slots: list[dict], size: int = LESSON_SIZE) -> list[dict]:
    """`size` of the candidate slots, in run order: one of each reason and of each close call the
    lesson asks, then always a slot of the reason asked least so far (so that no single answer wins
    by always choosing it), each reason's slots spread evenly over the runs."""
    chosen: list[int] = []
    wanted = [("answer", r) for r in rule_reasons(rule)] + [("tags", t) for t in spec.close_calls]
    for key, value in wanted:
        found = [i for i, s in enumerate(slots) if i not in chosen and _has(s, key, value)]
        if found and len(chosen) < size:
            chosen.append(found[len(found) // 2])
    pools = {r: [i for i, s in enumerate(slots) if i not in chosen and s["answer"] == r] for r in rule_reasons(rule)}
    quota = dict.fromkeys(pools, 0)
    asked = {r: sum(slots[i]["answer"] == r for i in chosen) for r in pools}
    while len(chosen) + sum(quota.values()) < size:
        open_ = [r for r in pools if quota[r] < len(pools[r])]
        if not open_:
            break
        quota[min(open_, key=lambda r: asked[r] + quota[r])] += 1  # the reason asked least so far
    for r, pool in pools.items():
        chosen += [pool[(k * len(pool)) // quota[r]] for k in range(quota[r])]
    return [slots[i] for i in sorted(chosen)]


def _has(slot: dict, key: str, value: str) -> bool:
    return slot["answer"] == value if key == "answer" else value in slot["tags"]


def candidate_slots(runs: list[tuple[str, GenerationTrace, dict[int, str]]]) -> list[dict]:
    """Every judged slot of every run [(prompt, trace, token id -> text)], tagged with its run index."""
    slots = []
    for index, (_, trace, tokens) in enumerate(runs):
        slots += lesson_from_trace(trace, lambda t, tokens=tokens: tokens.get(t, f"<{t}>"), run=index)["slots"]
    return slots


def lesson_of_runs(spec: LessonSpec, runs: list[tuple[str, GenerationTrace, dict[int, str]]]) -> dict:
    """The built-in lesson of `spec` from its runs [(prompt, trace, token id -> text)]: the runs'
    candidate slots, LESSON_SIZE picked."""
    rule = runs[0][1].rule
    base = lesson_from_trace(runs[0][1], lambda t: "", spec.title)
    return {**base, "format": LESSON_FORMAT, "id": spec.name, "intro": spec.intro,
            "prompts": [prompt for prompt, _, _ in runs], "slots": pick_slots(spec, rule, candidate_slots(runs))}


def read_runs(path: Path) -> list[tuple[str, GenerationTrace, dict[int, str]]]:
    """A lesson's runs file -> [(prompt, trace, token id -> text)]; ConfigError with one line when damaged."""
    data = read_json(path, "runs")
    try:
        if data.get("format") != RUNS_FORMAT or data.get("version") != LESSON_VERSION:
            raise SchemaError(f"not a {RUNS_FORMAT} file of version {LESSON_VERSION}")
        runs = []
        for i, run in enumerate(data["runs"]):
            trace = upgraded_dict(run["trace"])  # runs recorded before the settings were kept whole
            check_value(trace, GenerationTrace, f"runs[{i}].trace")
            check_trace_consistency(trace, f"runs[{i}].trace", REASONS)
            check_value(run["prompt"], str, f"runs[{i}].prompt")
            runs.append((run["prompt"], GenerationTrace.from_dict(trace),
                         {int(k): v for k, v in run["tokens"].items()}))
    except (SchemaError, KeyError, AttributeError, TypeError, ValueError) as error:
        raise ConfigError(f"{path.name}: this lesson's runs file is damaged ({error})") from None
    return runs


def runs_path(name: str, folder: Path = LESSONS_DIR) -> Path:
    return folder / "runs" / f"{name}.json"
