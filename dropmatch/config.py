"""Frozen settings of a run. Every value is checked here, once, with a one-line message.

`Settings` is a comparison as a user sets it (the UI's controls, the /compare API, record_runs);
its field defaults are the project's one table of defaults (`DEFAULTS`), read by the app, the API,
the benchmark's parser and the rule lab's controls. `DecodeConfig` and `RuleConfig` are what the
engine reads; `Settings.parse` turns the one into the others.
"""

from __future__ import annotations

import math
import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass

from .acceptance import RULES
from .mc_head import CENTROIDS, MASK_DRAWS

EMBEDDED = "embedded"
MAX_GAMMA = 16
AUTO_GAMMA_CAP = 8  # gamma = auto drafts at most this many tokens a round
DRAFT_SOURCES = ("model", "ngram", "hybrid")  # the draft model; prompt lookup; lookup where it matches, else the model
MAX_PATHS = 64


class ConfigError(ValueError):
    """A setting a user gave is out of range; the message is meant to be shown as is."""


def one_line(error: BaseException, limit: int = 200) -> str:
    """An error's message on one line (whitespace folded), cut to `limit` characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit - 3] + "…"


# ---------------------------------------------------------------- the one table of defaults


@dataclass(frozen=True)
class Settings:
    """One comparison as a user sets it: text where a value may be "auto" (gamma, p). The field
    defaults are the shipped defaults, the one table every entry point reads (DEFAULTS)."""

    prompt: str = ""
    pair: str = "Embedded CPU pair: SmolLM2-135M-Instruct + shipped draft"  # a name of PRESETS
    gamma: str = "auto"
    rule: str = "dropmatch"
    k: int = 5
    p: str = "auto"
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    seed: int = 0
    run_autoregressive: bool = True
    target_id: str = ""  # the custom pair's hub ids
    draft_id: str = ""
    centroid: str = "probs"
    majority_fraction: float = 0.8
    draft_source: str = "hybrid"
    # gamma = auto: False (the default) drafts both columns by one policy, lossless SD's costs, so that tau and
    # acceptance differ only by the rule; True prices the lossy rule's verify step too (draft length tuned for
    # this rule's cost: faster for a costly verify step, fewer drafts for it to accept).
    gamma_tuned_for_rule: bool = False
    fixed_js_threshold: float = 0.1
    typical_eps: float = 0.3
    rescue_argmax: bool = False  # sampling: paths may rescue a top-token draft the lossless coin rejected
    judge_threshold: str = "auto"  # the trained judge's: "auto" is the one chosen on its validation split
    fly_entropy_threshold: float = 0.3  # FLy's gate (RuleConfig's)
    ensemble_weight: float = 0.5  # the static ensemble's weight on the target (RuleConfig's)
    margin_ratio: float = 0.5  # the margin rule's: accept the runner-up where p2 / p1 is above it (RuleConfig's)
    preset: str = ""  # "method": the method's own settings (METHOD_SETTINGS) over the fields above

    def with_preset(self) -> "Settings":
        """These settings with the preset's values in place; ConfigError for an unknown preset."""
        if not self.preset:
            return self
        if self.preset not in PRESET_SETTINGS:
            raise ConfigError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESET_SETTINGS)} (or none)")
        return dataclasses.replace(self, preset="", **PRESET_SETTINGS[self.preset])

    def parse(self) -> tuple["DecodeConfig", "RuleConfig"]:
        """(DecodeConfig, RuleConfig); ConfigError with one message if any value is off."""
        if self.preset:
            return self.with_preset().parse()
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ConfigError("the prompt is empty; type a question or pick an example")
        decode = DecodeConfig(**DecodeConfig.parse_gamma(self.gamma), max_new_tokens=self.max_new_tokens,
                              temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                              draft_source=self.draft_source,
                              gamma_tuned_for_rule=self.gamma_tuned_for_rule)
        rule = RuleConfig.from_mapping({key: getattr(self, key) for key in SETTINGS_RULE_KEYS})
        return decode, rule

    def pair_spec(self) -> "PairSpec":
        return pair_from_choice(self.pair, self.target_id, self.draft_id)

    @staticmethod
    def types() -> dict[str, type]:
        """Each field's type (what an API built from these fields declares)."""
        return typing.get_type_hints(Settings)

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(Settings))


DEFAULTS = Settings()
# The Settings fields that are a rule's (RuleConfig.from_mapping's names): the rest are the decode's and the pair's.
SETTINGS_RULE_KEYS = ("rule", "k", "p", "centroid", "majority_fraction", "fixed_js_threshold", "typical_eps",
                      "rescue_argmax", "judge_threshold", "fly_entropy_threshold", "ensemble_weight",
                      "margin_ratio")
# The method's own operating point (arXiv 2603.03333): DropMatch with K 5 paths at p 0.3, the mean of
# the path distributions as centroid, and "nearly all paths" (4 of 5) for the majority test.
METHOD_SETTINGS = {"rule": "dropmatch", "k": 5, "p": "0.3", "centroid": "probs", "majority_fraction": 0.8}
PRESET_SETTINGS = {"method": METHOD_SETTINGS}
LAB_P = 0.1  # the rule lab's p when the run read no paths (the lab needs a number, not "auto")
AUTO_AGREEMENT = 0.5  # p = auto's target agreement; chosen on the dev set (docs/results-archive-2026-12.md)


def _number(name: str, value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(number) or math.isinf(number):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    return number


def _integer(name: str, value, low: int, high: int) -> int:
    number = _number(name, value)
    if number != int(number):
        raise ConfigError(f"{name} must be a whole number, got {value!r}")
    if not low <= number <= high:
        raise ConfigError(f"{name} must be between {low} and {high}, got {int(number)}")
    return int(number)


@dataclass(frozen=True)
class DecodeConfig:
    """How tokens are drafted and sampled. temperature 0 means greedy.

    The field defaults are the bare loop (a fixed gamma of 4 from the draft model), which the
    engine's tests and golden traces are built on; a user's defaults are DEFAULTS (gamma = auto,
    hybrid drafts), which Settings.parse turns into a DecodeConfig.

    gamma_auto: each round drafts the length with the most expected tokens per second (drafting.py),
    at most `gamma`. draft_source: the draft model, prompt lookup (n-grams of the text so far), or
    hybrid (lookup where it matches, the model otherwise)."""

    gamma: int = 4
    max_new_tokens: int = 128
    temperature: float = DEFAULTS.temperature
    top_p: float = DEFAULTS.top_p
    seed: int = DEFAULTS.seed
    # Stop drafting a round early before a slot where the draft's top probability is below this
    # (0: always draft gamma). The target still verifies every drafted token and each one is a
    # plain draw from the draft, so lossless output keeps the target's distribution (greedy: the
    # same text); what changes is how many unlikely drafts are paid for.
    gamma_auto: bool = False
    draft_source: str = "model"
    gamma_tuned_for_rule: bool = False  # gamma = auto prices the rule's verify step too (Settings says why)

    @staticmethod
    def parse_gamma(text) -> dict:
        """'auto' -> gamma = auto (capped at AUTO_GAMMA_CAP); a number -> that fixed gamma."""
        if isinstance(text, str) and text.strip().lower() == "auto":
            return {"gamma": AUTO_GAMMA_CAP, "gamma_auto": True}
        return {"gamma": _integer("gamma (draft length)", text, 1, MAX_GAMMA), "gamma_auto": False}

    def __post_init__(self):
        object.__setattr__(self, "gamma", _integer("gamma (draft length)", self.gamma, 1, MAX_GAMMA))
        object.__setattr__(
            self, "max_new_tokens", _integer("max new tokens", self.max_new_tokens, 1, 100_000)
        )
        temperature = _number("temperature", self.temperature)
        if not 0.0 <= temperature <= 5.0:
            raise ConfigError(f"temperature must be between 0 and 5, got {temperature:g}")
        top_p = _number("top-p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise ConfigError(f"top-p must be in (0, 1], got {top_p:g}")
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "seed", _integer("seed", self.seed, 0, 2**63 - 1))
        if self.draft_source not in DRAFT_SOURCES:
            raise ConfigError(f"draft source must be one of {', '.join(DRAFT_SOURCES)}, got {self.draft_source!r}")
        object.__setattr__(self, "gamma_auto", bool(self.gamma_auto))
        object.__setattr__(self, "gamma_tuned_for_rule", bool(self.gamma_tuned_for_rule))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class RuleConfig:
    """Which acceptance rule runs and its parameters (README: The method in brief).

    p is the dropout rate on the LM-head input; None means "auto" (calibrated per prompt).
    """

    rule: str = DEFAULTS.rule
    num_paths: int = DEFAULTS.k
    p: float | None = 0.3  # the bare default; a user's default is DEFAULTS.p ("auto")
    # The majority rule needs ceil(fraction * K) votes (never fewer than a strict majority):
    # 0.8 is the method's "nearly all paths choose the same token", 4 of 5.
    majority_fraction: float = DEFAULTS.majority_fraction
    centroid: str = DEFAULTS.centroid
    typical_eps: float = DEFAULTS.typical_eps
    typical_delta: float = 0.09
    fixed_js_threshold: float = DEFAULTS.fixed_js_threshold
    # p = auto: the largest p whose paths keep the clean argmax at this share of the prompt's positions.
    # 0.5 chosen on the dev set (GSM8K train + written prompts, docs/results-archive-2026-12.md): the largest tau gain whose
    # answers stayed well inside the target's own variation there.
    auto_agreement: float = AUTO_AGREEMENT
    # Sampling only (greedy accepts a top-token draft anyway). False: the lossless coin alone decides a
    # draft equal to the clean target's top token, so p = 0 equals lossless SD. True: the path rules
    # judge it too when the coin rejected it ("paths may rescue the argmax").
    rescue_argmax: bool = DEFAULTS.rescue_argmax
    # The trained judge's rules: accept a mismatch the judge scores below this. None: the judge's own,
    # chosen on its validation split (trained_judge.py); the engine fills it in.
    judge_threshold: float | None = None
    # How the drafted positions' dropout masks are drawn (mc_head.MASK_DRAWS): "per_position" (every recorded
    # run's) or "counter", a labelled option: a server's whole step in one batched draw, the same masks on
    # every device, other masks (so other decisions) than per_position's.
    mask_draw: str = "per_position"
    # FLy (greedy): a mismatch stands where the target's top-3 entropy is at least the threshold and the next
    # window - 1 drafts are exact; the authors' defaults (AMD-AGI/FLy's config; vLLM's fly_* options): 6 and 0.3.
    fly_window: int = 6
    fly_entropy_threshold: float = DEFAULTS.fly_entropy_threshold
    # The static ensemble (sampling): verify against w p_target + (1 - w) q_draft; w = 1 is lossless SD. 0.5 is
    # the authors' default (comeusr/diversed: draft weight 0.5).
    ensemble_weight: float = DEFAULTS.ensemble_weight
    # The margin rule (greedy), MARS as its abstract and public summaries describe it: the target's runner-up
    # is accepted where p(runner-up) / p(top) > margin_ratio; 1 is lossless SD. The paper's own statistic and
    # default were not reachable from this project; 0.5 (the top token less than twice as likely) is ours.
    margin_ratio: float = DEFAULTS.margin_ratio

    def __post_init__(self):
        names = rule_names()
        if self.rule not in names:
            raise ConfigError(f"unknown rule {self.rule!r}; choose one of {', '.join(names)}")
        if self.centroid not in CENTROIDS:
            raise ConfigError(f"centroid must be one of {', '.join(CENTROIDS)}, got {self.centroid!r}")
        object.__setattr__(self, "num_paths", _integer("K (paths)", self.num_paths, 1, MAX_PATHS))
        if self.p is not None:
            p = _number("p (dropout rate)", self.p)
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"p (dropout rate) must be in [0, 1), got {p:g}")
            object.__setattr__(self, "p", p)
        fraction = _number("majority fraction", self.majority_fraction)
        if not 0.5 <= fraction <= 1.0:
            raise ConfigError(f"majority fraction must be between 0.5 (a strict majority) and 1, got {fraction:g}")
        object.__setattr__(self, "majority_fraction", fraction)
        for name in ("typical_eps", "typical_delta", "fixed_js_threshold"):
            value = _number(name.replace("_", " "), getattr(self, name))
            if value < 0:
                raise ConfigError(f"{name.replace('_', ' ')} must be >= 0, got {value:g}")
            object.__setattr__(self, name, value)
        agreement = _number("auto agreement", self.auto_agreement)
        if not 0.0 < agreement <= 1.0:
            raise ConfigError(f"auto agreement must be in (0, 1], got {agreement:g}")
        object.__setattr__(self, "auto_agreement", agreement)
        object.__setattr__(self, "rescue_argmax", bool(self.rescue_argmax))
        if self.judge_threshold is not None:
            threshold = _number("judge threshold", self.judge_threshold)
            if not 0.0 <= threshold <= 1.0:
                raise ConfigError(f"judge threshold must be in [0, 1] (a probability), got {threshold:g}")
            object.__setattr__(self, "judge_threshold", threshold)
        if self.mask_draw not in MASK_DRAWS:
            raise ConfigError(f"mask draw must be one of {', '.join(MASK_DRAWS)}, got {self.mask_draw!r}")
        object.__setattr__(self, "fly_window", _integer("FLy window", self.fly_window, 2, MAX_GAMMA))
        threshold = _number("FLy entropy threshold", self.fly_entropy_threshold)
        if threshold < 0:
            raise ConfigError(f"FLy entropy threshold must be >= 0, got {threshold:g}")
        object.__setattr__(self, "fly_entropy_threshold", threshold)
        weight = _number("ensemble weight", self.ensemble_weight)
        if not 0.0 < weight <= 1.0:
            raise ConfigError(f"ensemble weight must be in (0, 1] (1: lossless SD), got {weight:g}")
        object.__setattr__(self, "ensemble_weight", weight)
        ratio = _number("margin ratio", self.margin_ratio)
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"margin ratio must be in [0, 1] (1: lossless SD), got {ratio:g}")
        object.__setattr__(self, "margin_ratio", ratio)

    @classmethod
    def from_mapping(cls, given, base: "RuleConfig | None" = None, keys: tuple[str, ...] | None = None) -> "RuleConfig":
        """`base` (default: the bare RuleConfig) with the entries of `given` applied: the one way a CLI's
        flags, a vLLM request, the generate() keywords and the rule lab turn user values into a rule.
        Keys are RuleConfig's field names, "k" for num_paths; p and judge_threshold take "auto" (None).
        keys: the names this entry point offers (default: all). ConfigError (one line) on an unknown key
        or a bad value."""
        if not isinstance(given, Mapping):
            raise ConfigError(f"DropMatch settings must be a mapping of names to values, got {type(given).__name__}")
        offered = keys or rule_keys()
        unknown = sorted(set(given) - set(offered))
        if unknown:
            raise ConfigError(f"unknown DropMatch setting {unknown[0]!r}; the settings are {', '.join(offered)}")
        changes = {RULE_KEY_ALIASES.get(key, key): value for key, value in given.items()}
        for name, label in (("p", "p (dropout rate)"), ("judge_threshold", "judge threshold")):
            if name in changes:
                changes[name] = parse_auto(label, changes[name])
        return dataclasses.replace(base or cls(), **changes)

    def to_mapping(self) -> dict:
        """The settings as from_mapping reads them (every field; "k" for num_paths)."""
        inverse = {field: key for key, field in RULE_KEY_ALIASES.items()}
        return {inverse.get(name, name): value for name, value in dataclasses.asdict(self).items()}

    @property
    def uses_paths(self) -> bool:
        return RULES[self.rule].uses_paths

    @property
    def uses_judge(self) -> bool:
        return RULES[self.rule].uses_judge


RULE_KEY_ALIASES = {"k": "num_paths"}  # the name users type -> the RuleConfig field


def rule_keys() -> tuple[str, ...]:
    """Every name RuleConfig.from_mapping reads: the fields, and "k" for num_paths."""
    return (*RULE_KEY_ALIASES, *(f.name for f in dataclasses.fields(RuleConfig)))


def rule_names() -> tuple[str, ...]:
    """Every rule of the one table (acceptance.RULES), lossless first."""
    return tuple(RULES)


def parse_p(text) -> float | None:
    """'auto' (or None/empty) -> None, else a float checked by RuleConfig."""
    return parse_auto("p (dropout rate)", text)


def parse_auto(name: str, text) -> float | None:
    """'auto' (or None/empty) -> None, else a number (RuleConfig checks its range)."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "auto")):
        return None
    return _number(name, text)


@dataclass(frozen=True)
class PairSpec:
    """Which models to load. EMBEDDED means the shipped CPU pair."""

    target: str = EMBEDDED
    draft: str = EMBEDDED
    trust_remote_code: bool = False

    def __post_init__(self):
        for role in ("target", "draft"):
            name = str(getattr(self, role) or "").strip()
            if not name:
                raise ConfigError(f"the {role} model id is empty")
            object.__setattr__(self, role, name)
        if (self.target == EMBEDDED) != (self.draft == EMBEDDED):
            raise ConfigError("the embedded target and draft only come as a pair")

    @property
    def label(self) -> str:
        if self.target == EMBEDDED:
            return "embedded: SmolLM2-135M-Instruct + shipped draft (CPU)"
        return f"{self.target} + {self.draft}"


PRESETS: dict[str, PairSpec | None] = {
    DEFAULTS.pair: PairSpec(),
    "SmolLM2-1.7B-Instruct / SmolLM2-135M-Instruct (GPU)": PairSpec(
        "HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "Qwen3-8B / Qwen3-0.6B (GPU)": PairSpec("Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"),
    "Custom hub ids": None,
}
DEFAULT_PRESET = DEFAULTS.pair


def pair_from_choice(preset: str, target: str = "", draft: str = "") -> PairSpec:
    """The PairSpec for a preset name, or for the custom hub ids typed by the user."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown model pair {preset!r}")
    spec = PRESETS[preset]
    if spec is not None:
        return spec
    return PairSpec(target=(target or "").strip(), draft=(draft or "").strip())
