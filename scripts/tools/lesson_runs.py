"""Making the built-in lessons (scripts/make_lessons.py) and rebuilding them in the tests: a lesson's runs
file (assets/lessons/runs/<name>.json) read back, its candidate slots, and the slots a lesson asks picked
from them. The app reads only the lessons themselves (dropmatch/builtin_lessons.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dropmatch.assets import LESSONS_DIR
from dropmatch.builtin_lessons import LESSON_FORMAT, read_json
from dropmatch.decoding.acceptance import BASELINE, KNOBS, REASONS, knob_by_key, votes_needed
from dropmatch.decoding.config import ConfigError
from dropmatch.decoding.trace import GenerationTrace, upgraded_dict
from dropmatch.lessons import LESSON_VERSION, lesson_from_trace, rule_reasons
from dropmatch.runfile_schema import SchemaError, check_trace_consistency, check_value

RUNS_FORMAT = "dropmatch-lesson-runs"
LESSON_SIZE = 16  # slots per built-in lesson


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
