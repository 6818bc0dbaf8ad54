"""DropMatch's settings in vLLM: engine-wide from `additional_config={"dropmatch": {...}}`, per request
from `SamplingParams(extra_args={"dropmatch": {...}})` (over HTTP: `"vllm_xargs": {"dropmatch": ...}`
is not nested, so a request there gives the keys flat with a `dropmatch_` prefix). Pure Python: the
same parsing runs in the front end (validating a request, HTTP 400 on a bad one) and in the worker.

Keys: rule and every knob of the rule table by its key (acceptance.KNOBS: `served_keys()`; greedy serving
leaves out the sampling-only ones, and p = auto), seed; and, engine-wide only, judge: a trained judge's file (trained_judge.py), which the rules "judge" and
"dropmatch_judge" read (the embedded target's: assets/judge/judge.json).
Defaults: the rule "dropmatch" at its knobs' defaults (the method's operating point), seed 0, no judge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ...decoding.acceptance import AUTO_AGREEMENT_KNOB, BASELINE, KNOBS, METHOD, RESCUE_ARGMAX, RULES
from ...decoding.config import ConfigError, RuleConfig


def served_keys() -> tuple[str, ...]:
    """The rule's settings a request may give (RuleConfig.from_mapping's names): every knob of the table but
    those greedy serving has no use for (the paths' rescue of a rejected top token, sampling only; p = auto's
    agreement, as p = auto is not run)."""
    unused = (RESCUE_ARGMAX, AUTO_AGREEMENT_KNOB)
    return ("rule", *(knob.user_key for knob in KNOBS.values() if knob not in unused))


OTHER_KEYS = ("seed", "judge")
FLAT_PREFIX = "dropmatch_"


@dataclass(frozen=True)
class ServeSettings:
    """A request's rule (config.RuleConfig, validated there), the seed that keys its masks, and the
    engine's judge file (None: none; the judge rules are then refused)."""

    rule: RuleConfig = field(default_factory=lambda: RuleConfig(METHOD))  # p = auto is not run: p's own default
    seed: int = 0
    judge: str | None = None

    @property
    def lossless(self) -> bool:
        return self.rule.rule == BASELINE

    def updated(self, given: dict | None, engine: bool = False) -> "ServeSettings":
        """These settings with the keys of `given` applied (engine: the engine's own, which may name a
        judge file); ConfigError (one line) on a bad key or value."""
        if not given:
            return self
        if not isinstance(given, dict):
            raise ConfigError(f"DropMatch settings must be a mapping of keys to values, got {type(given).__name__}")
        keys = served_keys()
        unknown = sorted(set(given) - set(keys) - set(OTHER_KEYS))
        if unknown:
            raise ConfigError(f"unknown DropMatch setting {unknown[0]!r}; the keys are {', '.join([*keys, *OTHER_KEYS])}")
        if "judge" in given and not engine:
            raise ConfigError("the judge file is the engine's setting (additional_config['dropmatch']['judge']), "
                              "not a request's")
        if given.get("p") == "auto":
            raise ConfigError("p = auto calibrates on each prompt before decoding, which vLLM does not run: "
                              f"give p as a number (e.g. {KNOBS['p'].default:g})")
        rule = RuleConfig.from_mapping({key: value for key, value in given.items() if key in keys}, self.rule, keys)
        refuse_unservable(rule.rule)
        judge = given.get("judge", self.judge)
        if judge is not None:
            read_judge(judge)
        if rule.uses_judge and judge is None:  # refused, never served as another rule
            raise ConfigError(f"the rule {rule.rule!r} reads a trained judge: start the engine with one, "
                              "additional_config['dropmatch']['judge'] = its file (the embedded target's: "
                              "assets/judge/judge.json)")
        seed = given.get("seed", self.seed)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        return ServeSettings(rule, seed, judge)


def refuse_unservable(name: str) -> None:
    """ConfigError (one line) for a rule the plugin cannot serve as written: one defined under sampling
    only (the plugin re-verifies greedy requests), or one that reads the later drafted positions of its
    round (the plugin judges a request's positions one at a time, stopping at its first rejection)."""
    rule = RULES[name]
    unservable = (
        ("greedy" not in rule.modes, "is defined under sampling only, and the plugin re-verifies greedy requests"),
        (rule.correction_rows is not None, "tests greedy drafts against the argmax of its own distribution and emits "
         "that argmax as the correction, which the plugin's runner does not write"),
        (rule.reads_later, "reads the exact test at later drafted positions of its round (a window), which the "
         "plugin's verify step does not hold"))
    for cannot, why in unservable:
        if cannot:
            raise ConfigError(f"the rule {name!r} ({rule.label}) {why}: use it with the Studio's engine or generate()")


@lru_cache(maxsize=8)
def read_judge(path: str):
    """The trained judge in a file (trained_judge.TrainedJudge), read once per process; ConfigError with
    its one line if it is not one."""
    from ...decoding.trained_judge import JudgeFileError, TrainedJudge

    if not isinstance(path, str):
        raise ConfigError(f"judge must be the path of a judge file, got {path!r}")
    try:
        return TrainedJudge.read(path)
    except JudgeFileError as error:
        raise ConfigError(f"judge: {error}") from None


def request_settings(extra_args: dict | None) -> dict | None:
    """The DropMatch keys a request gave: extra_args["dropmatch"] (a mapping), or the flat
    `dropmatch_<key>` entries an HTTP request's vllm_xargs carries; None when it gave none."""
    if not extra_args:
        return None
    nested = extra_args.get("dropmatch")
    flat = {key[len(FLAT_PREFIX):]: value for key, value in extra_args.items() if key.startswith(FLAT_PREFIX)}
    if nested is not None and flat:
        raise ConfigError("give DropMatch settings either as extra_args['dropmatch'] or as dropmatch_<key> entries, "
                          "not both")
    return nested if nested is not None else (flat or None)
