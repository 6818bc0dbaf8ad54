"""Metrics as pure functions of traces: rounds, tau, acceptance (per position too), tokens/s and the
time split, the MC-head share (pooled: MC time / round time), target NLL and the off-nucleus rate.

The definitions, with their formulas, are in docs/how_it_works.md (the app's How it works tab);
each function's docstring says what it reads from the trace.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .decoding.acceptance import LOSSY_END, RULES, judged_count, lossy_reasons
from .intervals import block_picks
from .quality import distinct2
from .decoding.trace import GenerationTrace

# A lossy run stays within the target's own variation (the reference band) when its target NLL is at
# or below that of the target's own samples, at most MAX_OFF_NUCLEUS of its tokens leave the target's
# top-p 0.95 nucleus, and its distinct-2 is at least MIN_DISTINCT2_SHARE of the samples' (NLL alone
# rewards loops: repeated text is likely under the target).
MAX_OFF_NUCLEUS = 0.01
MIN_DISTINCT2_SHARE = 0.9


@dataclass(frozen=True)
class RunMetrics:
    label: str
    p: float | None
    new_tokens: int
    rounds: int
    target_calls: int
    tau: float | None
    drafted: int
    accepted: int
    acceptance_rate: float | None
    per_position_acceptance: tuple[float | None, ...]
    tokens_per_s: float
    wall_s: float
    prefill_s: float
    draft_s: float
    verify_s: float
    head_s: float
    mc_s: float
    other_s: float
    mc_overhead: float | None
    lossy_share: float
    lossy_count: int
    target_nll: float | None = None
    off_nucleus_rate: float | None = None
    speedup_vs_ar: float | None = None  # against the target alone: transformers' generate()
    speedup_vs_lossless: float | None = None
    first_divergence: int | None = None
    distinct2: float | None = None  # distinct bigrams / bigrams of the output (repetition)
    # the change against lossless SD on the same prompt, seed and pair (lossy run minus lossless)
    delta_target_nll: float | None = None
    delta_off_nucleus_rate: float | None = None
    delta_distinct2: float | None = None
    stop_reason: str = ""  # eos | max_new_tokens | stopped (the trace's)
    ended_by_rule: bool = False  # the text ends with a token only the rule accepted (acceptance.LOSSY_END)

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def tau(trace: GenerationTrace) -> float | None:
    return _ratio(sum(len(r.emitted) for r in trace.rounds), len(trace.rounds))


def acceptance_counts(*traces: GenerationTrace) -> tuple[int, int]:
    """(accepted, drafted) over all rounds of the traces."""
    drafted = sum(r.num_drafted for t in traces for r in t.rounds)
    accepted = sum(d.accepted for t in traces for r in t.rounds for d in r.drafted)
    return accepted, drafted


def per_position_acceptance(*traces: GenerationTrace) -> tuple[float | None, ...]:
    """Accepted / reached at each draft slot, pooled over the traces (None where never reached)."""
    slots = max((t.gamma for t in traces), default=0)
    reached, accepted = [0] * slots, [0] * slots
    for trace in traces:
        for round_trace in trace.rounds:
            for j, token in enumerate(round_trace.drafted):
                if token.reason != "unchecked":
                    reached[j] += 1
                    accepted[j] += token.accepted
    return tuple(_ratio(a, n) for a, n in zip(accepted, reached))


def tokens_per_s(trace: GenerationTrace) -> float:
    return len(trace.output_ids) / trace.t_total if trace.t_total > 0 else 0.0


def mc_overhead(*traces: GenerationTrace) -> float | None:
    """MC work / (round time + calibration), pooled over the runs (a ratio of sums); None when no
    run read paths."""
    traces = [t for t in traces if t.p is not None and t.rounds]
    if not traces:
        return None
    return _ratio(sum(mc_seconds(t) for t in traces),
                  sum(sum(r.t_round for r in t.rounds) + t.t_calibration for t in traces))


def mc_seconds(trace: GenerationTrace) -> float:
    return sum(r.t_mc for r in trace.rounds) + trace.t_calibration


def _target_view(*traces: GenerationTrace) -> tuple[list[float], list[bool]]:
    """(log-probabilities, in-nucleus flags) of every emitted token of the traces, each trace's prefill's first;
    none from traces written before these were recorded."""
    kept = [t for t in traces if t.first_logprob is not None]
    log_probs = [v for t in kept for v in [t.first_logprob, *(x for r in t.rounds for x in r.emitted_logprob)]]
    in_nucleus = [v for t in kept for v in [t.first_in_nucleus, *(x for r in t.rounds for x in r.emitted_in_nucleus)]]
    return log_probs, in_nucleus


def target_nll(*traces: GenerationTrace) -> float | None:
    """Mean NLL (nats/token) of the emitted tokens under the clean target (temperature 1), pooled over the traces."""
    log_probs, _ = _target_view(*traces)
    return -sum(log_probs) / len(log_probs) if log_probs else None


def off_nucleus_rate(*traces: GenerationTrace) -> float | None:
    """Share of emitted tokens outside the clean target's top-p 0.95 nucleus (temperature 1), pooled over the traces."""
    _, in_nucleus = _target_view(*traces)
    return sum(not flag for flag in in_nucleus) / len(in_nucleus) if in_nucleus else None


def first_divergence(trace: GenerationTrace, reference: GenerationTrace) -> int | None:
    """Index of the first output token that differs from the reference; None if identical."""
    for i, (a, b) in enumerate(zip(trace.output_ids, reference.output_ids)):
        if a != b:
            return i
    if len(trace.output_ids) != len(reference.output_ids):
        return min(len(trace.output_ids), len(reference.output_ids))
    return None


def lossy_count(trace: GenerationTrace) -> int:
    """How many of the new tokens only a lossy rule let through: emitted tokens only (a round's first
    num_accepted drafts), not the drafts accepted after an end of text or the token limit and cut."""
    lossy = set(lossy_reasons())
    return sum(d.reason in lossy for r in trace.rounds for d in r.drafted[: r.num_accepted])


def ended_by_rule(trace: GenerationTrace) -> bool:
    """Does the text end with a token only the rule accepted (trace.with_lossy_end's LOSSY_END)."""
    return trace.stop_reason == "eos" and bool(trace.rounds) and any(d.reason == LOSSY_END for d in trace.rounds[-1].drafted)


def ended_early(trace: GenerationTrace, lossless: GenerationTrace) -> bool:
    """Did the run end its answer (an end of text) before lossless SD's on the same prompt, seed and pair."""
    return trace.stop_reason == "eos" and len(trace.output_ids) < len(lossless.output_ids)


def lossy_share(trace: GenerationTrace) -> float:
    """Share of the new tokens that only a lossy rule let through."""
    return lossy_count(trace) / len(trace.output_ids) if trace.output_ids else 0.0


SPREAD_DRAWS, SPREAD_LEVEL, MIN_SPREAD_ROUNDS = 2000, 0.95, 5


def speed_ratio_interval(lossless: GenerationTrace, lossy: GenerationTrace) -> tuple[float, float] | None:
    """The spread of this run's speed comparison, measured from the run itself, of the figure the page shows:
    (lossy tokens/s) / (lossless tokens/s), each end to end (tokens_per_s: output / t_total). Its SPREAD_LEVEL
    interval over SPREAD_DRAWS resamples of each column: the prefill and p = auto's calibration (and the
    prefill's token) carried as they were measured, the rounds redrawn in contiguous blocks (circular block
    bootstrap, intervals.block_picks): neighbouring rounds share the text and the machine's state, so they
    are not independent draws. None when a column has too few rounds to say. A ratio is called faster or
    slower only when its whole interval lies on one side of 1."""
    if any(len(trace.rounds) < MIN_SPREAD_ROUNDS for trace in (lossless, lossy)):
        return None
    speeds = [_resampled_speeds(trace, seed) for seed, trace in enumerate((lossless, lossy))]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = speeds[1] / speeds[0]
    ratios = ratios[np.isfinite(ratios)]
    if not ratios.size:
        return None
    tail = 100 * (1 - SPREAD_LEVEL) / 2
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def _resampled_speeds(trace: GenerationTrace, seed: int) -> np.ndarray:
    """[SPREAD_DRAWS] tokens/s of `trace` with its rounds redrawn in blocks and its fixed part (what is not a
    round: prefill, calibration, the prefill's token) kept: the point (tokens_per_s) is the same sum undrawn."""
    emitted = np.array([len(r.emitted) for r in trace.rounds], dtype=float)
    seconds = np.array([r.t_round for r in trace.rounds], dtype=float)
    fixed_tokens, fixed_seconds = len(trace.output_ids) - emitted.sum(), trace.t_total - seconds.sum()
    picks = block_picks(len(emitted), seed, SPREAD_DRAWS)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (fixed_tokens + emitted[picks].sum(1)) / (fixed_seconds + seconds[picks].sum(1))


def summarize(
    trace: GenerationTrace, alone_tokens_per_s: float | None = None, lossless: GenerationTrace | None = None
) -> RunMetrics:
    """A run's numbers; speedup_vs_ar against `alone_tokens_per_s`, the target alone as a user runs it
    (transformers' generate() on the same target, prompt and budget: compare.target_alone), None without it."""
    accepted, drafted = acceptance_counts(trace)
    costs = component_costs([trace])
    draft_s, verify_s, head_s = costs["draft_s"], costs["forward_s"], costs["head_s"]
    mc_s = mc_seconds(trace)
    speed = tokens_per_s(trace)
    return RunMetrics(
        label=trace.label,
        p=trace.p,
        new_tokens=len(trace.output_ids),
        rounds=len(trace.rounds),
        target_calls=len(trace.rounds) + 1,
        tau=tau(trace),
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=_ratio(accepted, drafted),
        per_position_acceptance=per_position_acceptance(trace) if trace.mode == "sd" else (),
        tokens_per_s=speed,
        wall_s=trace.t_total,
        prefill_s=trace.t_prefill,
        draft_s=draft_s,
        verify_s=verify_s,
        head_s=head_s,
        mc_s=mc_s,
        other_s=max(0.0, trace.t_total - trace.t_prefill - draft_s - verify_s - head_s - mc_s),
        mc_overhead=mc_overhead(trace),
        lossy_share=lossy_share(trace), lossy_count=lossy_count(trace),
        target_nll=target_nll(trace),
        off_nucleus_rate=off_nucleus_rate(trace),
        speedup_vs_ar=_ratio(speed, alone_tokens_per_s) if alone_tokens_per_s else None,
        speedup_vs_lossless=_ratio(speed, tokens_per_s(lossless)) if lossless is not None else None,
        first_divergence=first_divergence(trace, lossless) if lossless is not None else None,
        distinct2=distinct2(trace.output_ids),
        **quality_deltas(trace, lossless),
        stop_reason=trace.stop_reason, ended_by_rule=ended_by_rule(trace),
    )


def pooled(traces: list[GenerationTrace]) -> dict:
    """Totals over many generations (a benchmark): ratios of sums, not means of ratios."""
    rounds = [r for t in traces for r in t.rounds]
    accepted, drafted = acceptance_counts(*traces)
    costs = component_costs(traces)
    return {
        "prompts": len(traces),
        "new_tokens": costs["tokens"],
        "rounds": len(rounds),
        "tau": _ratio(sum(len(r.emitted) for r in rounds), len(rounds)),
        "acceptance_rate": _ratio(accepted, drafted),
        "tokens_per_s": _ratio(costs["tokens"], costs["total_s"]),
        "wall_s": costs["total_s"],
        "draft_step_ms": _ms(_ratio(costs["draft_s"], drafted)),
        "verify_round_ms": _ms(_ratio(sum(r.t_round for r in rounds), len(rounds))),
        "target_nll": target_nll(*traces),
        "off_nucleus_rate": off_nucleus_rate(*traces),
        # gamma = auto and prompt lookup: the mean length rounds asked for, the share drafted by lookup
        "gamma_asked": _ratio(sum(r.gamma for r in rounds if r.gamma is not None),
                              sum(r.gamma is not None for r in rounds)),
        "lookup_share": _ratio(sum(r.draft_source == "ngram" for r in rounds), len(rounds)),
        "costs": costs,
    }


def _lossy(trace: GenerationTrace) -> bool:
    return trace.mode == "sd" and trace.rule in RULES and RULES[trace.rule].lossy


def component_costs(traces: list[GenerationTrace]) -> dict:
    """The measured seconds of each part of the runs and the counts they were spent on, summed (what
    scripts/tools/cost_model.py reads): prefill and calibration; per round the draft, the target's forward over the
    verified positions (with the sums a least-squares line of forward seconds on positions needs), the
    clean head, the verify step (Monte-Carlo work) and the rest; the tokens the draft model drafted
    (prompt lookup costs no model call) and the positions the verify step judged."""
    rounds = [r for t in traces for r in t.rounds]
    positions = [r.num_drafted + 1 for r in rounds]
    # A lossless run's verify step reads no paths: its few microseconds are bookkeeping, not verifying.
    mc = sum(r.t_mc for t in traces if _lossy(t) for r in t.rounds)
    rest = sum(r.t_round - r.t_draft - r.t_forward - r.t_head for r in rounds) - mc
    return {
        "prompts": len(traces), "rounds": len(rounds), "tokens": sum(len(t.output_ids) for t in traces),
        "prefill_s": sum(t.t_prefill for t in traces), "calibration_s": sum(t.t_calibration for t in traces),
        "draft_s": sum(r.t_draft for r in rounds),
        "model_drafted": sum(r.num_drafted for r in rounds if r.draft_source == "model"),
        "forward_s": sum(r.t_forward for r in rounds), "positions": sum(positions),
        "positions_sq": sum(n * n for n in positions),
        "forward_x_positions": sum(r.t_forward * n for r, n in zip(rounds, positions)),
        "head_s": sum(r.t_head for r in rounds), "mc_s": mc,
        "judged": sum(judged_count(d.reason for d in r.drafted) for t in traces if _lossy(t) for r in t.rounds),
        "other_s": rest, "total_s": sum(t.t_total for t in traces),
    }


def quality_deltas(trace: GenerationTrace, lossless: GenerationTrace | None) -> dict[str, float | None]:
    """delta_target_nll, delta_off_nucleus_rate, delta_distinct2: this run minus lossless SD's."""
    if lossless is None:
        return {"delta_target_nll": None, "delta_off_nucleus_rate": None, "delta_distinct2": None}
    return {"delta_target_nll": difference(target_nll(trace), target_nll(lossless)),
            "delta_off_nucleus_rate": difference(off_nucleus_rate(trace), off_nucleus_rate(lossless)),
            "delta_distinct2": distinct2(trace.output_ids) - distinct2(lossless.output_ids)}


def difference(a: float | None, b: float | None) -> float | None:
    """a - b, None where either is missing."""
    return None if a is None or b is None else a - b


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds
