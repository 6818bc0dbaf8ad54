"""Frozen settings of a run. Every value is checked here, once, with a one-line message.

`Settings` is a comparison as a user sets it (the UI's controls, the /compare API, record_runs);
its field defaults are the project's one table of defaults (`DEFAULTS`), read by the app, the API,
the benchmark's parser and the rule lab's controls. `DecodeConfig` and `RuleConfig` are what the
engine reads; `Settings.parse` turns the one into the others.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass

from .acceptance import KNOBS, MAX_GAMMA, METHOD, RULES, ConfigError, Knob, finite_number, is_auto, knob_by_key

EMBEDDED = "embedded"
AUTO_GAMMA_CAP = 8  # gamma = auto drafts at most this many tokens a round
DRAFT_SOURCES = ("model", "ngram", "hybrid")  # the draft model; prompt lookup; lookup where it matches, else the model
HEAD_DRAFT_SOURCES = ("eagle3",)  # drafts from a head loaded beside the pair (decoding/eagle3.py; the bench's --eagle3-head)


def one_line(error: BaseException, limit: int = 200) -> str:
    """An error's message on one line (whitespace folded), cut to `limit` characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit - 3] + "…"


# ---------------------------------------------------------------- the one table of defaults


@dataclass(frozen=True, init=False)
class Settings:
    """One comparison as a user sets it: text where a value may be "auto" (gamma, p). The field
    defaults are the shipped defaults, the one table every entry point reads (DEFAULTS); a rule's knobs
    are the rule table's (acceptance.KNOBS), read by their keys (settings.k, settings.p, ...): the values
    a user gave in `knobs`, else each knob's Studio default."""

    prompt: str = ""
    pair: str = "Embedded CPU pair: SmolLM2-135M-Instruct + shipped draft"  # a name of PRESETS
    gamma: str = "auto"
    rule: str = "dropmatch"
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    seed: int = 0
    run_autoregressive: bool = True
    target_id: str = ""  # the custom pair's hub ids
    draft_id: str = ""
    draft_source: str = "hybrid"
    # gamma = auto: False (the default) drafts both columns by one policy, lossless SD's costs, so that tau and
    # acceptance differ only by the rule; True prices the lossy rule's verify step too (draft length tuned for
    # this rule's cost: faster for a costly verify step, fewer drafts for it to accept).
    gamma_tuned_for_rule: bool = False
    preset: str = ""  # "method": the method's own settings (METHOD_SETTINGS) over the fields above
    head_id: str = ""  # the custom pair's EAGLE-3 head (a hub id or folder; draft source eagle3); "": none
    knobs: dict = dataclasses.field(default_factory=dict)  # knob key -> the value the user gave

    def __init__(self, prompt: str = "", **given):
        fixed = {f.name: f.default for f in dataclasses.fields(Settings) if f.name != "knobs"}
        knobs = dict(given.pop("knobs", None) or {})
        for key in [key for key in given if key not in fixed]:
            knob = knob_by_key(key)
            if knob is None:
                raise TypeError(f"Settings got an unknown setting {key!r}")
            knobs[knob.user_key] = given.pop(key)
        for name, default in {**fixed, **given, "prompt": prompt}.items():
            object.__setattr__(self, name, default)
        object.__setattr__(self, "knobs", knobs)

    def __getattr__(self, key: str):
        knob = knob_by_key(key)
        if knob is None or key.startswith("__"):
            raise AttributeError(key)
        return self.__dict__.get("knobs", {}).get(knob.user_key, knob.app_default)

    def __hash__(self) -> int:
        return hash((self.prompt, self.rule, tuple(sorted(self.knobs.items(), key=lambda item: item[0]))))

    def __reduce__(self):  # pickled by its arguments (a ZeroGPU worker receives it)
        return functools.partial(Settings, **self.as_arguments()), ()

    def as_arguments(self) -> dict:
        """Every field and every knob by its key, as Settings(**...) takes them."""
        fixed = {f.name: getattr(self, f.name) for f in dataclasses.fields(Settings) if f.name != "knobs"}
        return {**fixed, **{knob.user_key: getattr(self, knob.user_key) for knob in KNOBS.values()}}

    def replace(self, **changes) -> "Settings":
        return Settings(**{**self.as_arguments(), **changes})

    def parse(self) -> tuple["DecodeConfig", "RuleConfig"]:
        """(DecodeConfig, RuleConfig), a preset's values in place; ConfigError (one message) if any value is off."""
        if self.preset:
            if self.preset not in PRESET_SETTINGS:
                raise ConfigError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESET_SETTINGS)} "
                                  "(or none)")
            return self.replace(preset="", **PRESET_SETTINGS[self.preset]).parse()
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ConfigError("the prompt is empty; type a question or pick an example")
        return configs_from(self.as_arguments())

    def pair_spec(self) -> "PairSpec":
        spec = pair_from_choice(self.pair, self.target_id, self.draft_id, self.head_id)
        if self.draft_source in HEAD_DRAFT_SOURCES and not spec.head:
            raise ConfigError(f"drafts from {self.draft_source} need a pair with an EAGLE-3 head: pick a "
                              "“+ EAGLE-3” pair, or Custom hub ids with the head's id")
        return spec

    @staticmethod
    def types() -> dict[str, type]:
        """Each setting's type (what an API built from these settings declares); an auto knob's is text."""
        hints = typing.get_type_hints(Settings)
        fixed = {f.name: hints[f.name] for f in dataclasses.fields(Settings) if f.name != "knobs"}
        return {**fixed, **{knob.user_key: str if knob.auto else knob.kind for knob in KNOBS.values()}}

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(Settings.types())


DEFAULTS = Settings()
# The method's own operating point (arXiv 2603.03333), written once, as its knobs' defaults: DropMatch with K
# paths at p, the mean of the path distributions as centroid, and "nearly all paths" for the majority test.
METHOD_SETTINGS = {"rule": METHOD, "k": KNOBS["num_paths"].default, "p": f"{KNOBS['p'].default:g}",
                   "centroid": KNOBS["centroid"].default, "majority_fraction": KNOBS["majority_fraction"].default}
PRESET_SETTINGS = {"method": METHOD_SETTINGS}
LAB_P = 0.1  # the rule lab's p when the run read no paths (the lab needs a number, not "auto")


# The decode fields as knobs: each DecodeConfig field is checked by its Knob, as a rule's knobs are.
DECODE_KNOBS: dict[str, Knob] = {knob.name: knob for knob in (
    Knob("gamma", 4, "gamma (draft length)", kind=int, low=1, high=MAX_GAMMA),
    Knob("max_new_tokens", 128, "max new tokens", kind=int, low=1, high=100_000),
    Knob("temperature", 0.0, "temperature", low=0.0, high=5.0),
    Knob("top_p", 1.0, "top-p", low=0.0, high=1.0, open_low=True),
    Knob("seed", 0, "seed", kind=int, low=0, high=2**63 - 1),
    Knob("gamma_auto", False, "gamma = auto", kind=bool),
    Knob("draft_source", "model", "draft source", kind=str, choices=DRAFT_SOURCES + HEAD_DRAFT_SOURCES),
    Knob("gamma_tuned_for_rule", False, "gamma tuned for the rule", kind=bool),
)}


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
    gamma_auto: bool = False
    draft_source: str = "model"
    gamma_tuned_for_rule: bool = False  # gamma = auto prices the rule's verify step too (Settings says why)

    @staticmethod
    def parse_gamma(text) -> dict:
        """'auto' -> gamma = auto (capped at AUTO_GAMMA_CAP); a number -> that fixed gamma."""
        if isinstance(text, str) and text.strip().lower() == "auto":
            return {"gamma": AUTO_GAMMA_CAP, "gamma_auto": True}
        return {"gamma": DECODE_KNOBS["gamma"].check(text), "gamma_auto": False}

    def __post_init__(self):
        for name, knob in DECODE_KNOBS.items():
            object.__setattr__(self, name, knob.check(getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, init=False)
class RuleConfig:
    """Which acceptance rule runs and the value of every knob of the rule table (acceptance.KNOBS), read
    as attributes (cfg.p, cfg.num_paths, cfg.typical_eps, ...) and checked by their Knob. p None means
    "auto" (calibrated per prompt); an auto knob's None is filled in by the engine (acceptance.Knob.auto).

        RuleConfig("dropmatch", p=0.2)          # every other knob at its default
    """

    rule: str = "dropmatch"
    knobs: dict = dataclasses.field(default_factory=dict)  # knob name -> value, every knob of the table

    def __init__(self, rule: str = "dropmatch", knobs: dict | None = None, **changes):
        if rule not in RULES:
            raise ConfigError(f"unknown rule {rule!r}; choose one of {', '.join(RULES)}")
        given = {**(knobs or {}), **changes}
        unknown = sorted(set(given) - set(KNOBS))
        if unknown:
            raise ConfigError(f"unknown DropMatch setting {unknown[0]!r}; the settings are {', '.join(rule_keys())}")
        values = {name: knob.check(given[name]) if name in given else knob.default for name, knob in KNOBS.items()}
        object.__setattr__(self, "rule", rule)
        object.__setattr__(self, "knobs", values)

    def __getattr__(self, name: str):
        values = self.__dict__.get("knobs")
        if values is None or name not in values:
            raise AttributeError(name)
        return values[name]

    def __hash__(self) -> int:
        return hash((self.rule, tuple(sorted(self.knobs.items()))))

    def replace(self, **changes) -> "RuleConfig":
        """These settings with `changes` (the rule and knobs by name) applied, checked."""
        return RuleConfig(changes.pop("rule", self.rule), {**self.knobs, **changes})

    @classmethod
    def from_mapping(cls, given, base: "RuleConfig | None" = None, keys: tuple[str, ...] | None = None) -> "RuleConfig":
        """`base` (default: the bare RuleConfig) with the entries of `given` applied: the one way a CLI's
        flags, a vLLM request, the generate() keywords and the rule lab turn user values into a rule.
        Keys are the knobs' keys ("k" for num_paths) or names, and "rule"; auto knobs take "auto" (None).
        keys: the names this entry point offers (default: all). ConfigError (one line) on an unknown key
        or a bad value."""
        if not isinstance(given, Mapping):
            raise ConfigError(f"DropMatch settings must be a mapping of names to values, got {type(given).__name__}")
        offered = keys or rule_keys()
        unknown = sorted(key for key in given if key not in offered and
                         not (knob_by_key(key) is not None and knob_by_key(key).user_key in offered))
        if unknown:
            raise ConfigError(f"unknown DropMatch setting {unknown[0]!r}; the settings are {', '.join(offered)}")
        changes = {("rule" if key == "rule" else knob_by_key(key).name): value for key, value in given.items()}
        return (base or cls()).replace(**changes)

    def to_mapping(self) -> dict:
        """The settings as from_mapping reads them: the rule and every knob by its key."""
        return {"rule": self.rule, **{KNOBS[name].user_key: value for name, value in self.knobs.items()}}

    @property
    def uses_paths(self) -> bool:
        return RULES[self.rule].uses_paths

    @property
    def uses_judge(self) -> bool:
        return RULES[self.rule].uses_judge


def configs_from(given: Mapping) -> tuple[DecodeConfig, RuleConfig]:
    """(DecodeConfig, RuleConfig) from a user's values by name (a Settings', the bench's flags), bare defaults else."""
    decode = {f.name: given[f.name] for f in dataclasses.fields(DecodeConfig) if f.name in given}
    rule = {key: given[key] for key in rule_keys() if key in given}
    return DecodeConfig(**{**decode, **DecodeConfig.parse_gamma(given["gamma"])}), RuleConfig.from_mapping(rule)


def rule_keys() -> tuple[str, ...]:
    """Every name RuleConfig.from_mapping reads: "rule" and each knob's key ("k" for num_paths)."""
    return ("rule", *(knob.user_key for knob in KNOBS.values()))


def rule_names() -> tuple[str, ...]:
    """Every rule of the one table (acceptance.RULES), lossless first."""
    return tuple(RULES)


def parse_p(text) -> float | None:
    """'auto' (or None/empty) -> None, else a float (RuleConfig checks its range)."""
    return None if is_auto(text) else finite_number("p (dropout rate)", text)


@dataclass(frozen=True)
class PairSpec:
    """Which models to load. EMBEDDED means the shipped CPU pair."""

    target: str = EMBEDDED
    draft: str = EMBEDDED
    trust_remote_code: bool = False
    head: str = ""  # an EAGLE-3 head over the target (a folder or hub id), for draft_source "eagle3"; "": none

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
        return f"{self.target} + {self.draft}" + (f" + EAGLE-3 {self.head}" if self.head else "")


PRESETS: dict[str, PairSpec | None] = {
    DEFAULTS.pair: PairSpec(),
    "SmolLM2-1.7B-Instruct / SmolLM2-135M-Instruct (GPU)": PairSpec(
        "HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "Qwen3-8B / Qwen3-0.6B (GPU)": PairSpec("Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"),
    # The paper's headline setting: its authors' heads (the draft model stays for the other draft sources).
    "Llama-3.1-8B-Instruct + EAGLE-3 (GPU)": PairSpec(
        "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct", head="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    "Qwen3-8B + EAGLE-3 (GPU)": PairSpec("Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B", head="AngelSlim/Qwen3-8B_eagle3"),
    "Custom hub ids": None,
}
DEFAULT_PRESET = DEFAULTS.pair


def pair_from_choice(preset: str, target: str = "", draft: str = "", head: str = "") -> PairSpec:
    """The PairSpec for a preset name, or for the custom hub ids typed by the user (head: an EAGLE-3 head's)."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown model pair {preset!r}")
    return PRESETS[preset] or PairSpec(target=(target or "").strip(), draft=(draft or "").strip(),
                                       head=(head or "").strip())
