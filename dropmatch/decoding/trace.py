"""Frozen records of a run: one per verification round, one per generation.

Everything the app draws and the benchmark reports is a function of these records, so a run
never has to be repeated to show it another way. They hold plain Python values (no tensors),
which makes them cheap to keep and trivial to write as JSON.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass

from .acceptance import BASELINE, KNOBS, LOSSY_END, lossy_reasons
from .config import ConfigError, DecodeConfig, RuleConfig

TopTokens = tuple[tuple[int, float], ...]  # (token id, probability), most likely first


@dataclass(frozen=True)
class DraftedToken:
    """One drafted position of a round and why it was accepted or rejected (reason: a name of
    acceptance.REASONS). Path fields are empty / None for rules that use no Monte-Carlo paths."""

    token: int
    draft_prob: float
    target_token: int
    target_token_prob: float
    target_prob: float  # clean target's probability of the drafted token
    js_target: float  # JS(draft || clean target)
    reason: str
    path_tokens: tuple[int, ...] = ()
    js: float | None = None  # JS(draft || centroid of the paths)
    threshold: float | None = None  # max over paths of JS(path || centroid)
    majority_token: int | None = None
    majority_votes: int | None = None
    draft_votes: int | None = None
    judge_score: float | None = None  # the trained judge's P(accepting it changes the answer); judge rules only
    target_top3_entropy: float | None = None  # -sum p log p over the clean target's top 3 (FLy's gate)
    coin: float | None = None  # the lossless test's uniform draw (sampling); the static ensemble reads it too
    sample_target_prob: float | None = None  # p(x) and q(x) the lossless coin read (temperature, top-p): sampling
    sample_draft_prob: float | None = None
    target_runner_up: int | None = None  # the clean target's second likeliest token (MARS's top-2)
    target_logit_ratio: float | None = None  # z2 / (z1 + 1e-10) of the clean target's top two logits (MARS's r)
    draft_top: TopTokens = ()
    target_top: TopTokens = ()
    path_top: tuple[TopTokens, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.reason not in ("rejected", "unchecked")


@dataclass(frozen=True)
class RoundTrace:
    """One target call. For autoregressive decoding `drafted` is empty and one token is emitted.

    emitted: the accepted drafted tokens, then the extra token of kind `extra_kind`
    (correction after a rejection, bonus after an all-accepted round, or target for AR),
    cut after a stop token or at max_new_tokens. Times in seconds.
    """

    index: int
    context_token: int  # the last emitted token, fed first: verified positions = [context] + drafted
    drafted: tuple[DraftedToken, ...]
    emitted: tuple[int, ...]
    extra_kind: str
    num_accepted: int
    t_draft: float
    t_forward: float
    t_head: float
    t_mc: float
    t_round: float
    head_rows: int
    # The clean target's view of each emitted token (temperature 1): log-probability, and whether it
    # lies in the top-p 0.95 nucleus. Empty in traces written before these were recorded.
    emitted_logprob: tuple[float, ...] = ()
    emitted_in_nucleus: tuple[bool, ...] = ()
    gamma: int | None = None  # the draft length this round asked for (gamma = auto chooses it per round)
    draft_source: str = "model"  # who drafted this round: "model", "ngram" (prompt lookup) or "eagle3"

    @property
    def num_drafted(self) -> int:
        return len(self.drafted)


@dataclass(frozen=True)
class RoundStates:
    """What the rule lab (lab.py) re-judges one round's drafts from, without the transformer: the
    target's final hidden states at the g + 1 verified positions [g + 1, H] and the draft's at its g
    drafting steps [g, H_d] (none for a prompt-lookup round), as float32 little-endian bytes in base64 (exact: a replay with the run's
    own settings decides bit for bit as the run did); the lossless test's result per drafted position;
    the sequence position of the first drafted token (it keys the dropout masks)."""

    first_position: int
    target_hidden: str
    draft_hidden: str
    exact: tuple[bool, ...]
    coins: tuple[float, ...] = ()  # the lossless test's uniform draws (sampling; empty when greedy or kept before)

    @staticmethod
    def from_tensors(first_position: int, target_hidden, draft_hidden, exact, coins=None) -> "RoundStates":
        return RoundStates(first_position, _pack(target_hidden), _pack(draft_hidden),
                           tuple(bool(x) for x in exact.tolist()),
                           () if coins is None else tuple(float(x) for x in coins.tolist()))

    def tensors(self):
        """(target_hidden [g + 1, H], draft_hidden [g, H_d]) as float32 CPU tensors."""
        g, draft = len(self.exact), _unpack(self.draft_hidden)
        return _unpack(self.target_hidden).view(g + 1, -1), draft.view(g, -1) if draft.numel() else draft.view(0, 0)


def _unpack(text: str):
    import numpy
    import torch

    return torch.from_numpy(numpy.frombuffer(base64.b64decode(text), dtype="<f4").astype(numpy.float32))


def _pack(tensor) -> str:
    import torch

    data = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().astype("<f4").tobytes()
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class GenerationTrace:
    """A whole generation: settings, prefill, rounds, the text.

    mode: "sd" (speculative, with `rule`) or "ar" (autoregressive target baseline).
    p: the dropout rate actually used (None when the rule reads no paths; a number under p = auto).
    decode_config, rule_config: the run's settings whole, as the engine read them (an AR run's rule is
    lossless); the properties below read them, so a knob is never kept twice.
    """

    mode: str
    rule: str
    p: float | None
    decode_config: DecodeConfig
    rule_config: RuleConfig
    prompt_ids: tuple[int, ...]
    first_token: int
    rounds: tuple[RoundTrace, ...]
    output_ids: tuple[int, ...]
    token_texts: tuple[str, ...]
    text: str
    stop_reason: str  # eos | max_new_tokens | stopped
    t_prefill: float
    t_total: float
    target_name: str = ""
    draft_name: str = ""
    t_calibration: float = 0.0  # p = auto's calibration (Monte-Carlo work, counted in the MC share)
    p_auto_reached: bool | None = None  # p = auto: did any grid value reach the agreement target
    first_logprob: float | None = None  # the prefill token, as emitted_logprob
    first_in_nucleus: bool | None = None
    states: tuple[RoundStates, ...] = ()  # per round, for the rule lab; empty unless the run kept them
    # What computed the run: CausalLM.fingerprint of target and draft ("target+draft"; empty in runs
    # written before), and the target's device type and dtype. The rule lab re-judges only with the same.
    weights: str = ""
    device: str = ""
    dtype: str = ""
    kernels: str = ""  # the CPU kernels the loader chose (PairServices.kernels); empty in runs written before

    def __post_init__(self):
        object.__setattr__(self, "rounds", with_lossy_end(tuple(self.rounds), self.stop_reason))

    @property
    def label(self) -> str:
        return "autoregressive" if self.mode == "ar" else self.rule

    # The settings most views read, from the settings kept whole (a rule's knobs: trace.rule_config.<name>).
    num_paths = property(lambda self: self.rule_config.num_paths)
    centroid = property(lambda self: self.rule_config.centroid)
    gamma = property(lambda self: self.decode_config.gamma)  # the cap under gamma = auto (RoundTrace.gamma: a round's)
    gamma_auto = property(lambda self: self.decode_config.gamma_auto)
    temperature = property(lambda self: self.decode_config.temperature)
    top_p = property(lambda self: self.decode_config.top_p)
    seed = property(lambda self: self.decode_config.seed)

    @property
    def draft_source(self) -> str:
        return self.decode_config.draft_source if self.mode == "sd" else "model"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict) -> "GenerationTrace":
        """A trace from its JSON (written by to_dict, or before the settings were kept whole:
        upgraded_dict); ConfigError for settings out of range."""
        data = upgraded_dict(data)
        rounds = tuple(
            RoundTrace(**{**r, "drafted": tuple(_drafted_from_dict(d) for d in r["drafted"]),
                          "emitted": tuple(r["emitted"]), "emitted_logprob": tuple(r.get("emitted_logprob", ())),
                          "emitted_in_nucleus": tuple(r.get("emitted_in_nucleus", ()))})
            for r in data["rounds"]
        )
        states = tuple(RoundStates(**{**st, "exact": tuple(st["exact"]), "coins": tuple(st.get("coins", ()))})
                       for st in data.get("states", ()))
        fields = {**data, "rounds": rounds, "states": states, "decode_config": DecodeConfig(**data["decode_config"]),
                  "rule_config": RuleConfig(**data["rule_config"])}
        for name in ("prompt_ids", "output_ids", "token_texts"):
            fields[name] = tuple(data[name])
        return GenerationTrace(**fields)


def with_lossy_end(rounds: tuple[RoundTrace, ...], stop_reason: str) -> tuple[RoundTrace, ...]:
    """The rounds of a run with the lossy acceptance its text ends with relabelled LOSSY_END: where the run stopped
    at an end of text, the end of text itself, or the drafted token the target's own end of text follows, when
    only the rule accepted it (lossless SD would not have ended there). Every trace is made through this, so an
    engine's run, a run file's and a test's read alike; an end the exact test accepted keeps its reason."""
    if stop_reason != "eos" or not rounds:
        return rounds
    last = rounds[-1]
    end = len(last.emitted) - 1  # the end of text's place among the round's emitted tokens
    lossy = set(lossy_reasons())
    for i in (end, end - 1):  # the end of text when drafted, else the drafted token just before it
        if 0 <= i < min(last.num_accepted, len(last.drafted)) and last.drafted[i].reason in lossy:
            drafted = tuple(dataclasses.replace(d, reason=LOSSY_END) if j == i else d for j, d in enumerate(last.drafted))
            return (*rounds[:-1], dataclasses.replace(last, drafted=drafted))
    return rounds


def _drafted_from_dict(data: dict) -> DraftedToken:
    fields = dict(data)
    fields["path_tokens"] = tuple(data["path_tokens"])
    for name in ("draft_top", "target_top"):
        fields[name] = tuple(tuple(pair) for pair in data[name])
    fields["path_top"] = tuple(tuple(tuple(pair) for pair in top) for top in data["path_top"])
    return DraftedToken(**fields)


# Settings a trace kept as loose fields before they were kept whole (run file version 3 and the lessons' runs
# of that time), and the field each fills.
_LOOSE_DECODE = ("gamma", "temperature", "top_p", "seed", "gamma_auto", "draft_source")
_LOOSE_REMOVED = ("path_support",)  # a loose rule setting that is no knob now (REMOVED_OPTIONS)


# Options removed from the engine (run file version 5) and the value that meant "off": an older trace that
# kept them off reads as it was; one that used them was decided by an engine this one is not.
REMOVED_OPTIONS = {"decode_config": {"draft_confidence": 0.0}, "rule_config": {"path_support": 0}}


# A removed rule's knob and drafted-token field (the project's p2/p1 "margin" rule, replaced by MARS as its
# authors wrote it): dropped where an older trace kept them; a run of that rule reads as an unknown rule.
REMOVED_KNOBS, REMOVED_SIGNALS = ("margin_ratio",), ("target_margin",)


class RemovedOptionError(ConfigError):
    """A run made with an option this version removed (REMOVED_OPTIONS): one line, not "damaged"."""


def upgraded_dict(data: dict) -> dict:
    """A trace's JSON with its settings whole: one written with loose settings gets a decode_config and a
    rule_config from them (knobs it did not keep, such as typical's eps, take their defaults: such a run
    cannot say what they were); removed options (REMOVED_OPTIONS) are dropped where they were off, and a
    trace that used one is refused in one line (RemovedOptionError). A trace already whole is returned as is."""
    if not isinstance(data, dict):
        return data
    if "rule_config" not in data:
        data = _whole(data)
    return _without_removed_signals(_with_knobs(_without_removed(data)))


def _without_removed_signals(data: dict) -> dict:
    """A trace JSON whose drafted tokens keep a removed rule's field (REMOVED_SIGNALS) without it."""
    rounds = data.get("rounds")
    if not isinstance(rounds, list) or not any(isinstance(d, dict) and name in d for r in rounds if isinstance(r, dict)
                                               for d in r.get("drafted", ()) for name in REMOVED_SIGNALS):
        return data
    strip = lambda d: {k: v for k, v in d.items() if k not in REMOVED_SIGNALS} if isinstance(d, dict) else d  # noqa: E731
    return {**data, "rounds": [{**r, "drafted": [strip(d) for d in r.get("drafted", ())]} if isinstance(r, dict) else r
                               for r in rounds]}


def _with_knobs(data: dict) -> dict:
    """A trace JSON whose rule_config keeps its knobs flat (run file version 5 and before) with them in `knobs`."""
    rule = data.get("rule_config")
    if not isinstance(rule, dict):
        return data
    knobs = rule.get("knobs") if "knobs" in rule else {name: value for name, value in rule.items() if name != "rule"}
    if isinstance(knobs, dict):
        knobs = {name: value for name, value in knobs.items() if name not in REMOVED_KNOBS}
    return {**data, "rule_config": {"rule": rule.get("rule"), "knobs": knobs}}


def _without_removed(data: dict) -> dict:
    found = {**data}
    for block, options in REMOVED_OPTIONS.items():
        settings = found.get(block)
        if not isinstance(settings, dict) or not any(name in settings for name in options):
            continue
        for name, off in options.items():
            if settings.get(name, off) not in (off, None):
                raise RemovedOptionError(f"this run used {name.replace('_', ' ')} {settings[name]!r:.20}, an option this "
                                  "version removed; record it again")
        found[block] = {name: value for name, value in settings.items() if name not in options}
    return found


def _whole(data: dict) -> dict:
    """A trace JSON with loose settings (run file version 3) with a decode_config and a rule_config."""
    fields = dict(data)
    decode = {name: fields.pop(name) for name in _LOOSE_DECODE if name in fields}
    if fields.get("mode") != "sd":
        decode.pop("draft_source", None)
    trace_fields = {field.name for field in dataclasses.fields(GenerationTrace)}  # p is the trace's own too
    rule = {name: fields.pop(name) for name in list(fields)
            if (name in KNOBS or name in _LOOSE_REMOVED) and name not in trace_fields}
    rule["rule"] = fields.get("rule") if fields.get("mode") == "sd" else BASELINE
    rule["p"] = fields.get("p")
    return {**fields, "decode_config": decode, "rule_config": rule}
