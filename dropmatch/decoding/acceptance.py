"""Acceptance rules as pure functions over tensors, and the one table of rules, their knobs and reasons.

One verification round has g drafted tokens. The verify step (verifying.py) computes, for every
drafted position at once, what any rule may look at (`Signals`); a rule is a function from those
signals to an ordered list of (reason, accepted-mask); verifying.verify scans the positions left to
right and stops at the first one that neither the exact (lossless) test nor the rule accepts (`scan`).

`RULES`, `KNOBS` and `REASONS` are the project's one vocabulary. A rule is one `Rule` entry: its check, its
knobs (`Knob`: name, type, default, range, label, the frontier's values, whether the rule lab offers it), the
modes it is defined under; its words (colours, sentences, the lab's lines) are one entry of rule_words.py.
Every consumer derives from the two: RuleConfig, the benchmark's flags, the vLLM plugin's keys, generate()'s
keywords, the app's controls, the rule lab, the frontier, the run file (docs/architecture.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from .mc_head import CENTROIDS, MASK_DRAWS
from .sampling import draw


class ConfigError(ValueError):
    """A setting a user gave is out of range; the message is meant to be shown as is."""


class RuleKnobs(Protocol):
    """What the rules read of a run's settings (config.RuleConfig: its rule and every knob of KNOBS by name)."""

    rule: str

    def __getattr__(self, name: str) -> Any: ...


CORRECTION, BONUS = "correction", "bonus"


# ---------------------------------------------------------------- knobs


def finite_number(label: str, value) -> float:
    """value as a finite float (a bool is not a number here), else a ConfigError naming `label`."""
    if isinstance(value, bool):
        raise ConfigError(f"{label} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{label} must be a number, got {value!r}") from None
    if math.isnan(number) or math.isinf(number):
        raise ConfigError(f"{label} must be a finite number, got {value!r}")
    return number


def is_auto(value) -> bool:
    """"auto" (any case), empty or None: the value an auto knob's engine fills in."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto"))


@dataclass(frozen=True)
class Knob:
    """A rule's setting, declared once. name: the RuleConfig attribute the rules read; key: what users type
    (a CLI's --key, a vLLM request's key, generate()'s dropmatch_<key>; default: name). Its range is
    [low, high], an end open where open_low / open_high; auto: "auto" (None) is a value, which the engine
    fills in (studio_default: the app's default where it differs from the bare one). sweep: the values
    the frontier sweeps; lab: the rule lab offers it as a control (slider: (low, high, step) of a control)."""

    name: str
    default: Any
    label: str  # its name in a control and in an error message (its help: rule_words.KNOB_HELP)
    kind: type = float
    key: str = ""
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple[str, ...] = ()
    auto: bool = False
    studio_default: Any = "same"
    sweep: tuple[float, ...] = ()
    lab: bool = False
    slider: tuple[float, float, float] | None = None
    short: str = ""  # its name on a chart's axis (default: label)

    @property
    def user_key(self) -> str:
        return self.key or self.name

    @property
    def app_default(self) -> Any:
        """The Studio's default (a user's first value): "auto" for an auto knob whose default is auto there."""
        value = self.default if self.studio_default == "same" else self.studio_default
        return "auto" if self.auto and value is None else value

    def check(self, value) -> Any:
        """The value of this knob as the rules read it; ConfigError (one line) when out of range."""
        if self.auto and is_auto(value):
            return None
        if self.kind is bool:
            if not isinstance(value, (bool, int)) or value not in (0, 1):
                raise ConfigError(f"{self.label} must be true or false, got {value!r}")
            return bool(value)
        if self.kind is str:
            if value not in self.choices:
                raise ConfigError(f"{self.label} must be one of {', '.join(self.choices)}, got {value!r}")
            return value
        number = finite_number(self.label, value)
        if self.kind is int and number != int(number):
            raise ConfigError(f"{self.label} must be a whole number, got {value!r}")
        below = self.low is not None and (number < self.low or (self.open_low and number == self.low))
        above = self.high is not None and (number > self.high or (self.open_high and number == self.high))
        if below or above:
            raise ConfigError(f"{self.label} must be in {self.range_text()}, got {self._shown(number)}")
        return int(number) if self.kind is int else number

    def _shown(self, number: float) -> str:
        return str(int(number)) if self.kind is int else f"{number:g}"

    def range_text(self) -> str:
        if self.choices:
            return ", ".join(self.choices)
        low = "-inf" if self.low is None else self._shown(self.low)
        high = "inf" if self.high is None else self._shown(self.high)
        return f"{'(' if self.open_low else '['}{low}, {high}{')' if self.open_high or self.high is None else ']'}"


KNOBS: dict[str, Knob] = {}  # every knob of every rule, by name, in the order the rules declare them


def knob_by_key(key: str) -> Knob | None:
    """The knob a user's key names (its key, or its name)."""
    return next((knob for knob in KNOBS.values() if key in (knob.user_key, knob.name)), None)


MAX_PATHS, MAX_GAMMA = 64, 16
FRONTIER_P = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
AUTO_AGREEMENT = 0.5  # p = auto's target agreement; chosen on the dev set (docs/results-archive-2026-12.md)
NUM_PATHS = Knob("num_paths", 5, "K (paths)", kind=int, key="k", low=1, high=MAX_PATHS, lab=True, slider=(1, 16, 1))
P = Knob("p", 0.3, "p (dropout rate)", low=0.0, high=1.0, open_high=True, auto=True, studio_default=None,
         sweep=FRONTIER_P, lab=True, slider=(0.0, 0.5, 0.01), short="p")
CENTROID = Knob("centroid", "probs", "centroid of the paths", kind=str, choices=CENTROIDS, lab=True)
MASK_DRAW = Knob("mask_draw", "per_position", "mask draw", kind=str, choices=MASK_DRAWS)
AUTO_AGREEMENT_KNOB = Knob("auto_agreement", AUTO_AGREEMENT, "auto agreement", low=0.0, high=1.0, open_low=True)
RESCUE_ARGMAX = Knob("rescue_argmax", False, "paths may rescue the target's top token (sampling)", kind=bool, lab=True)
MAJORITY_FRACTION = Knob("majority_fraction", 0.8, "majority: share of paths that must agree", low=0.5, high=1.0,
                         lab=True, slider=(0.5, 1.0, 0.05))
JUDGE_THRESHOLD = Knob("judge_threshold", None, "trained judge threshold", low=0.0, high=1.0, auto=True,
                       sweep=(0.05, 0.1, 0.2, 0.3, 0.5), short="threshold")
PATH_KNOBS = (NUM_PATHS, P, CENTROID, MASK_DRAW, AUTO_AGREEMENT_KNOB, RESCUE_ARGMAX)


# ---------------------------------------------------------------- the vocabulary


@dataclass(frozen=True)
class Reason:
    """Why a drafted token ended as it did. lossy: accepted only because a lossy rule let it through.
    (Its words and colours: rule_words.REASON_WORDS.)"""

    name: str
    lossy: bool = False


def tests_in_order(s: "Signals", cfg: RuleKnobs) -> list[tuple[str, torch.Tensor]]:
    """A rule's check by default: the TESTS its `checks` name (RULES[cfg.rule].checks), tried in that order."""
    return [(name, TESTS[name](s, cfg)) for name in RULES[cfg.rule].checks]


@dataclass(frozen=True)
class Rule:
    """An acceptance rule's decision (its words: rule_words.RULE_WORDS). check: Signals, RuleKnobs -> [(reason,
    accepted mask [g])] (by default its `checks`' tests in TESTS, tried in that order: tests_in_order).
    knobs: the settings it reads (Knob); knob: the one the frontier sweeps (None: not swept).
    uses_paths: reads the K Monte-Carlo dropout paths; uses_judge: the trained judge's scores."""

    name: str
    label: str
    lossy: bool
    uses_paths: bool
    check: Callable[["Signals", RuleKnobs], list[tuple[str, torch.Tensor]]] = tests_in_order
    knobs: tuple[Knob, ...] = ()
    knob: str | None = None
    uses_judge: bool = False
    checks: tuple[str, ...] = ()  # the reasons its check gives, in the order it tries them
    reads_draft: bool = False  # its checks read the draft's distribution (not only the drafted token)
    modes: tuple[str, ...] = ("greedy", "sampling")  # the decoding modes the rule is defined under
    reads_later: bool = False  # reads the exact test's result at later drafted positions of its round (a window)
    reads_coin: bool = False  # under sampling it reads the lossless test's coin (a run must have kept them)
    frontier_also: tuple[str, ...] = ()  # knobs whose every choice the frontier crosses with its sweep
    peer: str = ""  # transformers' own implementation of the rule, timed beside it (models.references)
    # Where the rule's own test replaces the lossless one: (signals, knobs, greedy) -> mask [g] (None: nowhere).
    # There the lossless test's verdict does not stand (a draft it accepted may be rejected), and a rejection
    # emits argmax(correction_rows) under greedy, a draw from p under sampling (no residual: no coin decided).
    replaces_exact: Callable[["Signals", RuleKnobs, bool], torch.Tensor | None] | None = None
    # The rows [g, V] whose argmax is a greedy correction where replaces_exact holds: (p_signal, q_signal, knobs).
    correction_rows: Callable[[torch.Tensor, torch.Tensor, RuleKnobs], torch.Tensor] | None = None
    # The drafts a round needs for the rule to act at all (FLy's window), and its authors' draft length.
    min_drafts: Callable[[RuleKnobs], int] | None = None
    authors_gamma: int | None = None
    # False: its authors never run it on prompt-lookup drafts, and those rounds get the exact test alone
    # (judges_drafts; rule_words.RuleWords.lookup_note says why).
    judges_lookup: bool = True


REASONS: dict[str, Reason] = {}
RULES: dict[str, Rule] = {}


def judges_drafts(rule: str, draft_source: str) -> bool:
    """Does the rule judge a round drafted by draft_source ("model", "ngram")? The one place this is decided:
    a rule that declares judges_lookup False leaves prompt-lookup rounds to the exact test."""
    return draft_source != "ngram" or RULES[rule].judges_lookup


def register_reason(reason: Reason) -> None:
    REASONS[reason.name] = reason


def register_rule(rule: Rule) -> None:
    """Adds a rule and its knobs to the table (a knob's name means one thing: the same Knob everywhere)."""
    for knob in rule.knobs:
        if KNOBS.setdefault(knob.name, knob) is not knob:
            raise ValueError(f"knob {knob.name!r} is declared twice, differently")
    if rule.knob is not None and rule.knob not in {knob.name for knob in rule.knobs}:
        raise ValueError(f"rule {rule.name!r} sweeps {rule.knob!r}, which is not one of its knobs")
    RULES[rule.name] = rule


BASELINE, METHOD = "lossless", "dropmatch"  # the lossless rule every other is measured against; the method


def judged_count(reasons) -> int:
    """How many of these reasons a rule's own test decided: neither the exact test's nor unchecked."""
    return sum(reason not in ("exact", "unchecked") for reason in reasons)


LOSSY_END = "lossy_end"  # the reason of a lossy acceptance the text ends with (Reason below)


def lossy_reasons() -> tuple[str, ...]:
    return tuple(name for name, reason in REASONS.items() if reason.lossy)


# The reasons, in the legend's order; a lossy reason names the check that accepted a token (LOSSY_END: a lossy
# acceptance the text ends with, trace.with_lossy_end relabels it whatever check gave it).
for _name in ("exact", "js", "majority", "naive", "typical", "fixed_js", "judge", "fly", "ensemble", "mars", LOSSY_END,
              "rejected", "unchecked"):
    register_reason(Reason(_name, lossy=_name not in ("exact", "rejected", "unchecked")))


@dataclass(frozen=True)
class Signals:
    """Per drafted position (g of them); path fields are None when the rule uses no paths.

    draft_tokens, target_tokens [g] long; draft_prob, target_prob [g] = probability of the
    draft token under the draft and the clean target; target_token_prob [g]; js_draft_target,
    target_entropy [g]; path_tokens [K, g] (each path's top token); js_draft_centroid,
    js_threshold [g]; majority_tokens [g] (the paths' top token, -1 when two tie at the top),
    majority_votes [g] (its votes), draft_votes [g]; judge_scores [g] the trained judge's probability
    that accepting the token changes the answer (None unless the rule reads the judge); exact, coin,
    sample_target_prob, sample_draft_prob [g]: the lossless test (LosslessTest) the round ran.
    """

    draft_tokens: torch.Tensor
    target_tokens: torch.Tensor
    draft_prob: torch.Tensor
    target_prob: torch.Tensor
    target_token_prob: torch.Tensor
    js_draft_target: torch.Tensor
    target_entropy: torch.Tensor
    path_tokens: torch.Tensor | None = None
    js_draft_centroid: torch.Tensor | None = None
    js_threshold: torch.Tensor | None = None
    majority_tokens: torch.Tensor | None = None
    majority_votes: torch.Tensor | None = None
    draft_votes: torch.Tensor | None = None
    judge_scores: torch.Tensor | None = None
    exact: torch.Tensor | None = None  # [g] bool: the lossless test at every drafted position of the round
    target_top3_entropy: torch.Tensor | None = None  # [g] -sum p log p over the clean target's three likeliest tokens
    coin: torch.Tensor | None = None  # [g] the lossless test's uniform draws (sampling only)
    sample_target_prob: torch.Tensor | None = None  # [g] p(x) under the sampled (temperature, top-p) target
    sample_draft_prob: torch.Tensor | None = None  # [g] q(x), the distribution the draft token was drawn from
    target_runner_up: torch.Tensor | None = None  # [g] long: the clean target's second likeliest token
    target_logit_ratio: torch.Tensor | None = None  # [g] z2 / (z1 + 1e-10), the target's top two logits (MARS)
    rule_top: torch.Tensor | None = None  # [g] argmax of the rule's own correction_rows (the greedy ensemble's v)


def judged_by_paths(signals: Signals, cfg: RuleKnobs) -> torch.Tensor:
    """[g] bool: the positions a path rule judges. By default (cfg.rescue_argmax False) those where
    the draft is not the clean target's top token: where it is, the lossless test decides alone
    (under greedy it has accepted it already; under sampling its coin is exact). So at p = 0, where
    every path is the clean row, a path rule adds nothing and its run equals lossless SD, greedy or
    sampled; the price, under sampling, is that a top-token draft the coin rejected is rejected even
    when every path votes for it. rescue_argmax True judges those too (paths may rescue the argmax;
    p = 0 then no longer equals lossless SD under sampling)."""
    if cfg.rescue_argmax:
        return torch.ones_like(signals.draft_tokens, dtype=torch.bool)
    return signals.draft_tokens != signals.target_tokens


def rule_checks(cfg: RuleKnobs, signals: Signals) -> list[tuple[str, torch.Tensor]]:
    """The rule's ordered (reason, accepted mask [g]) list, the exact test aside."""
    rule = RULES[cfg.rule]
    checks = rule.check(signals, cfg)
    if rule.uses_paths or rule.uses_judge:  # these judge only where the exact test cannot accept
        judged = judged_by_paths(signals, cfg)
        checks = [(reason, mask & judged) for reason, mask in checks]
    return checks


def rule_accepts(cfg: RuleKnobs, signals: Signals) -> torch.Tensor:
    """[g] bool: does any of the rule's checks accept each position (the exact test aside)."""
    masks = [mask for _, mask in rule_checks(cfg, signals)]
    return torch.stack(masks).any(0) if masks else torch.zeros_like(signals.draft_tokens, dtype=torch.bool)


# ---------------------------------------------------------------- the rules

def votes_needed(num_paths: int, fraction: float) -> int:
    """Votes the majority rule asks of K paths: ceil(fraction * K), and never fewer than a strict
    majority (more than K / 2). 0.8 of 5 -> 4 ("nearly all paths"); 0.5 of 5 -> 3."""
    return max(math.ceil(fraction * num_paths - 1e-9), num_paths // 2 + 1)


def typical_floor(target_entropy: torch.Tensor, cfg: RuleKnobs) -> torch.Tensor:
    """[g] the probability typical acceptance asks of a draft token: min(eps, delta * exp(-H(p_target)))."""
    return torch.clamp(cfg.typical_delta * torch.exp(-target_entropy), max=cfg.typical_eps)


def fly_window_holds(exact: torch.Tensor, window: int) -> torch.Tensor:
    """[g] bool: FLy's deferred window at each drafted position i (AMD-AGI/FLy, `win_len`): the next
    window - 1 drafted tokens are all the target's own choices, and the window ends before the round's
    last drafted token (the public code lets no mismatch among the round's last `window` positions stand)."""
    holds = torch.zeros_like(exact, dtype=torch.bool)
    fits = max(int(exact.shape[0]) - window, 0)  # positions whose window ends before the round's last draft
    if fits:  # the window after position i is exact[i + 1 : i + window], all at once (no host copy)
        holds[:fits] = exact[1:].unfold(0, window - 1, 1)[:fits].all(-1)
    return holds


FLY_GATE_OFF = 0.01  # an entropy threshold at or below it turns FLy's gate off, as AMD-AGI/FLy's code does


def _fly(s: Signals, cfg: RuleKnobs) -> torch.Tensor:
    """FLy (arXiv 2511.22972): a mismatch stands where the target is unsure (its top-3 entropy at least the
    threshold) and the deferred window after it holds. Greedy: AMD-AGI/FLy's fly/models/FLy.py. Sampling:
    vLLM pull request #53987's random kernel (a position whose lossless coin failed is deferred where p(x) > 0
    and q(x) > 0 and its followers passed their own coins; a real rejection draws from the residual), with
    the window counted as AMD's win_len (docs/rivals-from-authors-code.md, 2.3: vLLM's fly_window_size is
    win_len - 1, and also lets the position K - win_len stand); its entropy reads the processed probabilities
    (temperature, then top-p), as vLLM's. A threshold <= 0.01 turns the gate off (AMD's entropy_thre)."""
    unsure = (s.target_top3_entropy >= cfg.fly_entropy_threshold) | (cfg.fly_entropy_threshold <= FLY_GATE_OFF)
    stands = ~s.exact & unsure & fly_window_holds(s.exact, cfg.fly_window)
    if s.coin is not None:
        stands = stands & (s.sample_target_prob > 0) & (s.sample_draft_prob > 0)
    return stands


def ensemble_odds(p_x: float, q_x: float, weight: float) -> float:
    """The static ensemble's acceptance probability of a drafted token: min(1, 1 - w + w p(x) / q(x))."""
    return min(1.0, 1.0 - weight + weight * p_x / q_x) if q_x > 0 else 1.0


def _ensemble(s: Signals, cfg: RuleKnobs) -> torch.Tensor:
    """DIVERSED's static ensemble (arXiv 2604.07622; transformers 5.23's assistant_ensemble_weight, in
    _speculative_sampling), verifying against v = w p + (1 - w) q. Sampling: the same coin u as the lossless
    test, accept iff u q(x) < (1 - w) q(x) + w p(x), i.e. u < min(1, 1 - w + w p(x) / q(x)). Greedy: the draft
    is accepted iff it is argmax v (which replaces the exact test, _ensemble_replaces), and argmax v is the
    correction (ensemble_rows). w = 1 is lossless SD."""
    if s.coin is None:
        return s.draft_tokens == s.rule_top
    w = cfg.ensemble_weight
    q_x, p_x = s.sample_draft_prob, s.sample_target_prob
    return s.coin * q_x < (1.0 - w) * q_x + w * p_x


def ensemble_rows(p_signal: torch.Tensor, q_signal: torch.Tensor, cfg: RuleKnobs) -> torch.Tensor:
    """[g, V] v = w p + (1 - w) q: under greedy the draft is tested against argmax v, the correction is argmax v."""
    return cfg.ensemble_weight * p_signal + (1.0 - cfg.ensemble_weight) * q_signal


def _ensemble_replaces(s: Signals, cfg: RuleKnobs, greedy: bool) -> torch.Tensor | None:
    return torch.ones_like(s.draft_tokens, dtype=torch.bool) if greedy else None


def _mars(s: Signals, cfg: RuleKnobs) -> torch.Tensor:
    """MARS (arXiv 2601.15498; 5SSjw/MARS mars/model/utils.py evaluate_posterior): where the target's top two
    processed logits (temperature, then top-p, their processors' order) are close, r = z2 / (z1 + 1e-10) >
    threshold, a draft that is the target's top-1 or top-2 token (the argmax with the top-1 masked out: on
    tied logits the other tied token) is accepted without a coin. Under sampling that test replaces the lossless
    one there (_mars_replaces: a top-1 draft passes without its coin, any other draft is rejected and the next
    token drawn from p); elsewhere the lossless test and its residual (rule_words.MARS_RESIDUAL: ours, not the
    authors'). Greedy: the authors' code is exact match; our port (YichiCS/Secure-Speculative-Decoding's
    securesd/verifier/mars.py) also accepts the top-2 token where r > threshold, the correction the argmax.
    r is a ratio of logits: any negative top logit gives r >= 1 (their code's)."""
    close = s.target_logit_ratio > cfg.mars_threshold
    return close & ((s.draft_tokens == s.target_runner_up) | (s.draft_tokens == s.target_tokens))


def _mars_replaces(s: Signals, cfg: RuleKnobs, greedy: bool) -> torch.Tensor | None:
    return None if greedy else s.target_logit_ratio > cfg.mars_threshold


# Each check's test, by the reason it gives: Signals, RuleKnobs -> accepted mask [g]. A rule declared without a
# check function tries the tests its `checks` name, in that order (DropMatch: JS, then majority).

TESTS = {
    "naive": lambda s, cfg: s.draft_votes > 0,
    "js": lambda s, cfg: s.js_draft_centroid <= s.js_threshold,
    "majority": lambda s, cfg: ((s.draft_tokens == s.majority_tokens)
                                & (s.draft_votes >= votes_needed(s.path_tokens.shape[0], cfg.majority_fraction))),
    "judge": lambda s, cfg: s.judge_scores < cfg.judge_threshold,
    "typical": lambda s, cfg: s.target_prob > typical_floor(s.target_entropy, cfg),
    "fixed_js": lambda s, cfg: s.js_draft_target <= cfg.fixed_js_threshold,
    "fly": _fly, "ensemble": _ensemble, "mars": _mars,
}


TYPICAL_EPS = Knob("typical_eps", 0.3, "typical ε", low=0.0, high=1.0, sweep=(0.3, 0.2, 0.1, 0.05, 0.02), lab=True,
                   slider=(0.0, 0.5, 0.01), short="ε")
TYPICAL_DELTA = Knob("typical_delta", 0.09, "typical δ", low=0.0)
FIXED_JS = Knob("fixed_js_threshold", 0.1, "fixed-JS threshold T", low=0.0, sweep=(0.02, 0.05, 0.1, 0.2, 0.3), lab=True,
                slider=(0.0, 0.69, 0.01), short="threshold")
FLY_WINDOW = Knob("fly_window", 6, "FLy window", kind=int, low=2, high=MAX_GAMMA)
FLY_ENTROPY = Knob("fly_entropy_threshold", 0.3, "FLy entropy threshold", low=0.0, sweep=(1.0, 0.6, 0.3, 0.15, 0.05),
                   lab=True, slider=(0.0, 1.5, 0.05), short="entropy threshold")
ENSEMBLE_WEIGHT = Knob("ensemble_weight", 0.5, "ensemble weight w", low=0.0, high=1.0, open_low=True,
                       sweep=(0.9, 0.7, 0.5, 0.3, 0.1), lab=True, slider=(0.05, 1.0, 0.05), short="weight w")
MARS_THRESHOLD = Knob("mars_threshold", 0.9, "MARS threshold", low=0.0, high=1.0, sweep=(0.98, 0.94, 0.9, 0.86, 0.84),
                      lab=True, slider=(0.5, 1.0, 0.01), short="logit-ratio threshold")
MAJORITY_KNOBS = (*PATH_KNOBS, MAJORITY_FRACTION)

for _rule in (
    Rule("lossless", "Lossless SD", lossy=False, uses_paths=False),
    Rule("naive", "naive (any path)", lossy=True, uses_paths=True, knob="p", knobs=PATH_KNOBS, checks=("naive",)),
    # js alone is not swept on the frontier (knob None): DropMatch's sweep covers it, JS being its first test.
    Rule("js", "JS vs path centroid", lossy=True, uses_paths=True, checks=("js",), knobs=PATH_KNOBS, reads_draft=True),
    Rule("majority", "path majority", lossy=True, uses_paths=True, knob="p", knobs=MAJORITY_KNOBS,
         checks=("majority",)),
    Rule("dropmatch", "DropMatch (JS, then majority)", lossy=True, uses_paths=True, knob="p", knobs=MAJORITY_KNOBS,
         checks=("js", "majority"), reads_draft=True, frontier_also=("centroid",)),
    Rule("typical", "typical (Medusa)", lossy=True, uses_paths=False, knob="typical_eps",
         knobs=(TYPICAL_EPS, TYPICAL_DELTA), checks=("typical",)),
    Rule("fixed_js", "fixed-threshold JS (Fuzzy SD)", lossy=True, uses_paths=False, knob="fixed_js_threshold",
         knobs=(FIXED_JS,), checks=("fixed_js",), reads_draft=True),
    Rule("judge", "trained judge (AutoJudge)", lossy=True, uses_paths=False, knob="judge_threshold",
         knobs=(JUDGE_THRESHOLD, RESCUE_ARGMAX), uses_judge=True, checks=("judge",)),
    Rule("dropmatch_judge", "DropMatch + trained judge", lossy=True, uses_paths=True, knob="p",
         knobs=(*MAJORITY_KNOBS, JUDGE_THRESHOLD), uses_judge=True, checks=("js", "majority", "judge"),
         reads_draft=True),
    Rule("fly", "FLy (entropy gate, deferred window)", lossy=True, uses_paths=False,
         knob="fly_entropy_threshold", knobs=(FLY_WINDOW, FLY_ENTROPY), checks=("fly",),
         reads_later=True, reads_coin=True, min_drafts=lambda cfg: cfg.fly_window + 1, authors_gamma=15),
    Rule("ensemble", "static ensemble (DIVERSED)", lossy=True, uses_paths=False,
         knob="ensemble_weight", knobs=(ENSEMBLE_WEIGHT,), checks=("ensemble",), reads_draft=True,
         reads_coin=True, peer="ensemble_assisted", replaces_exact=_ensemble_replaces,
         correction_rows=ensemble_rows, judges_lookup=False),
    Rule("mars", "MARS (close top-two logits)", lossy=True, uses_paths=False,
         knob="mars_threshold", knobs=(MARS_THRESHOLD,), checks=("mars",), replaces_exact=_mars_replaces),
):
    register_rule(_rule)


# ---------------------------------------------------------------- one round's decision


@dataclass(frozen=True)
class Verdict:
    """num_accepted of the g drafted tokens, why each position ended as it did, the extra token."""

    num_accepted: int
    reasons: tuple[str, ...]
    next_token: int
    next_kind: str


@dataclass(frozen=True)
class LosslessTest:
    """The lossless test at g drafted positions: exact [g] bool; under sampling also its coin [g] (the
    uniform draws) and p(x), q(x) [g], the sampled target's and the draft's probabilities of each drafted
    token (None when greedy). A rule that relaxes the coin (the static ensemble) reads the same draws."""

    exact: torch.Tensor
    coin: torch.Tensor | None = None
    p_x: torch.Tensor | None = None
    q_x: torch.Tensor | None = None


def lossless_test(
    draft_tokens: torch.Tensor, q_sample: torch.Tensor, p_sample: torch.Tensor, greedy: bool,
    generator: torch.Generator,
) -> LosslessTest:
    """The lossless test per position [g]: argmax match, or u < p(x) / q(x) (Leviathan et al.)."""
    index = draft_tokens.unsqueeze(-1)
    if greedy:
        return LosslessTest(p_sample.argmax(-1) == draft_tokens)
    p_x = p_sample.gather(-1, index).squeeze(-1)
    q_x = q_sample.gather(-1, index).squeeze(-1)
    uniform = torch.rand(draft_tokens.shape, generator=generator, device=draft_tokens.device)
    return LosslessTest(uniform * q_x < p_x, uniform, p_x, q_x)  # u < p/q without dividing by a zero q


def extra_token(num_accepted: int, num_drafted: int, q_sample: torch.Tensor | None, p_sample: torch.Tensor | None,
                generator: torch.Generator | None) -> tuple[int, str]:
    """(the token a sampled round emits after num_accepted of g drafts, its kind): a bonus after the last
    draft, drawn from p_sample [g + 1, V]; else a correction at the rejected position, drawn from the
    residual norm(max(0, p - q)) (q_sample [g, V]), so that whatever a lossy rule adds, the lossless part
    keeps the target's distribution. Token -1 where no distributions were given (a caller that reads
    reasons only)."""
    kind = BONUS if num_accepted == num_drafted else CORRECTION
    if p_sample is None:
        return -1, kind
    if kind == BONUS:
        return int(draw(p_sample[num_drafted], generator)), kind
    residual = (p_sample[num_accepted] - q_sample[num_accepted]).clamp_min(0.0)
    if float(residual.sum()) <= 0.0:
        residual = p_sample[num_accepted]
    return int(draw(residual / residual.sum(), generator)), kind


def scan(tests: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The one left-to-right scan, over every round of a batch at once, on the tests' device. tests [C, n] bool
    over the stacked drafted slots of rounds of `lengths` [B] (summing to n): row 0 the exact test, then the
    rule's checks in the order it tries them. A round keeps its accepted prefix (the cumulative product of
    "some test accepts the slot"); there a slot's reason is the first test accepting it (an argmax); the first
    slot nothing accepts is rejected, every later one unchecked. -> codes [n] into scan_names(checks): the
    first accepting test, C at the rejection, C + 1 after it."""
    num_tests, device = tests.shape[0], tests.device
    slots = torch.arange(max(lengths, default=0), device=device)
    valid = slots < torch.tensor(lengths, device=device).unsqueeze(-1)  # [B, g] the rounds, padded to the longest
    accepted = torch.zeros(valid.shape, dtype=torch.long, device=device)
    accepted[valid] = tests.any(0).long()
    kept = accepted.cumprod(-1).bool()  # [B, g] the accepted prefix
    reached = torch.cat([torch.ones_like(kept[:, :1]), kept[:, :-1]], -1)  # every slot before it accepted
    first = tests.to(torch.uint8).argmax(0)  # [n] the first test accepting each slot
    return torch.where(kept[valid], first, torch.where(reached[valid], num_tests, num_tests + 1))


def scan_names(checks) -> tuple[str, ...]:
    """The reasons scan's codes name: the exact test, the rule's checks in order, then "rejected", "unchecked"."""
    return ("exact", *checks, *NOT_ACCEPTED)


NOT_ACCEPTED = ("rejected", "unchecked")  # every other reason names the check that accepted the token


def accepted_count(reasons) -> int:
    """How many drafted tokens a scan's reasons accept: every position not rejected nor left unchecked."""
    return sum(reason not in NOT_ACCEPTED for reason in reasons)
