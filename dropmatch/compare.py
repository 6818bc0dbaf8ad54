"""Lossless SD and a lossy rule on the same prompt, seed and pair, round by round, then the baselines.

The two runs advance alternately so that a UI can show both columns growing together; each run's times
are measured inside the run (Engine._finish), so alternating makes neither look slower. A short untimed
run of each rule comes first (`warm_up`), so that one-time costs (first calls' allocations, kernels built
on first use, cold caches) fall on neither column; each is then timed end to end (prefill, p = auto's
calibration, rounds). The target alone is what a user runs: transformers' generate() on the same loaded
target (`target_alone`), timed after the engine's own autoregressive run (the third column, kept for its trace).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from .decoding.acceptance import BASELINE, RULES
from .decoding.config import DecodeConfig, RuleConfig
from .decoding.engine import run_to_end
from .models import ensemble_assisted_generate, sequence_nll
from .models.peer import target_generate
from .decoding.trace import GenerationTrace, RoundTrace


@dataclass
class Column:
    """One side of the comparison while it runs: rounds so far, the final trace when done."""

    rule: str
    rounds: list[RoundTrace] = field(default_factory=list)
    trace: GenerationTrace | None = None

    @property
    def first_token(self) -> int | None:
        """The prefill's token, known once the first round ran (or the run ended)."""
        if self.trace is not None:
            return self.trace.first_token
        return self.rounds[0].context_token if self.rounds else None

    @property
    def done(self) -> bool:
        return self.trace is not None


@dataclass
class Comparison:
    prompt: str
    decode: DecodeConfig
    rule: RuleConfig
    lossless: Column
    lossy: Column
    ar: GenerationTrace | None = None
    phase: str = "running"  # warm-up | running | baseline | peer | done | stopped
    target_alone: dict | None = None  # transformers' generate() on the target, timed: {"tokens", "seconds"}
    peer: dict | None = None  # transformers' own run of the rule, where it has one (static_ensemble_peer)


def compare_stream(
    engine, prompt: str, decode: DecodeConfig, rule: RuleConfig, run_ar: bool = True,
    stop_event: threading.Event | None = None, progress: Callable[[str, int, int], None] | None = None,
) -> Iterator[Comparison]:
    """Yields the Comparison once before the untimed warm-up (phase "warm-up"), after every round of either
    run, then once more when done.
    progress(column, tokens read, prompt tokens): how far each column's target has read the prompt
    ("lossless" or "lossy"; Engine.speculative's progress)."""
    ids = engine.encode(prompt)
    engine.check_fits(ids, decode)
    state = Comparison(prompt, decode, rule, Column("lossless"), Column(rule.rule))

    def reading(column: str) -> dict:
        return {} if progress is None else {"progress": functools.partial(progress, column)}

    runs = {
        # The lossless column keeps its states: the rule lab re-judges its drafts under every rule.
        "lossless": (state.lossless, engine.speculative(ids, decode, replace(rule, rule=BASELINE), stop_event,
                                                        keep_states=True, **reading("lossless"))),
        "lossy": (state.lossy, engine.speculative(ids, decode, rule, stop_event, **reading("lossy"))),
    }

    def stopped() -> bool:
        return stop_event is not None and stop_event.is_set()

    try:
        # Said before the untimed warm-up, so that a caller holds the stream (and can close it) before any
        # model work: Gradio closes a cancelled event's generator only once its first step has returned.
        state.phase = "warm-up"
        yield state
        warm_up(engine, ids, decode, [RuleConfig(BASELINE), rule], stop_event)
        state.phase = "running"
        active = dict(runs)
        while active:
            for name in list(active):
                column, run = active[name]
                try:
                    column.rounds.append(next(run))
                except StopIteration as stop:
                    column.trace = stop.value
                    del active[name]
                yield state
    finally:  # a caller that stops asking (a cancelled request) ends both runs now, not at garbage collection
        for _, run in runs.values():
            run.close()
    if run_ar and not stopped():
        state.phase = "baseline"
        yield state
        state.ar = run_to_end(engine.autoregressive(ids, decode, stop_event))
        state.target_alone = None if stopped() else target_alone(engine, ids, decode)
    if RULES[rule.rule].peer and hasattr(engine, "target") and not stopped():
        state.phase = "peer"
        yield state
        state.peer = static_ensemble_peer(engine, ids, decode, rule)
    state.phase = "stopped" if stopped() else "done"
    yield state


WARM_UP_PROMPT, WARM_UP_TOKENS = 64, 4  # the prompt's first tokens and the budget the warm-up runs


def warm_up(engine, ids: list[int], decode: DecodeConfig, rules: list[RuleConfig],
            stop_event: threading.Event | None = None) -> None:
    """One short untimed run of each rule on the prompt's first WARM_UP_PROMPT tokens, before either column's
    clock starts: the first call into the models pays one-time costs (on the first run after loading: 2.05 s
    of prefill against 0.19 s), and which column pays them must not decide the speed comparison."""
    short = replace(decode, max_new_tokens=min(WARM_UP_TOKENS, decode.max_new_tokens))
    for rule in rules:
        run_to_end(engine.speculative(ids[:WARM_UP_PROMPT], short, rule, stop_event))


def target_alone(engine, ids: list[int], decode: DecodeConfig) -> dict | None:
    """transformers' generate() on the engine's loaded target (generate_alone), timed: {"tokens", "seconds"}; None
    for an engine without a transformers target (a test's model-free engine). Its first call is a warm-up, untimed."""
    if not hasattr(engine, "target"):
        return None
    short = replace(decode, max_new_tokens=min(WARM_UP_TOKENS, decode.max_new_tokens))
    generate_alone(engine, ids[:WARM_UP_PROMPT], short)
    tokens, seconds = generate_alone(engine, ids, decode)
    return {"tokens": len(tokens), "seconds": seconds}


def generate_alone(engine, ids: list[int], decode: DecodeConfig) -> tuple[list[int], float]:
    """transformers' generate() on the engine's target (models.peer.target_generate) with the run's budget, stop
    tokens, temperature, top-p and seed, timed: (tokens, seconds); also the bench's --peer run of the target alone."""
    return target_generate(engine.target, ids, decode.max_new_tokens, engine.stop_ids, decode.temperature,
                           decode.top_p, decode.seed)


def peer_weight(rule: RuleConfig) -> float:
    """The value transformers' peer runs at: the rule's own swept knob (the static ensemble's weight)."""
    return rule.knobs[RULES[rule.rule].knob]


def static_ensemble_peer(engine, ids: list[int], decode: DecodeConfig, rule: RuleConfig) -> dict:
    """transformers' own static ensemble (assisted generation with assistant_ensemble_weight) on the same pair,
    prompt, weight, temperature, top-p and draft length, timed, with its text's target NLL: the peer row
    under the ensemble column (its draws are transformers', so its text is a sample of the same rule)."""
    tokens, seconds = generate_ensemble(engine, ids, decode, peer_weight(rule))
    return {"weight": peer_weight(rule), "tokens": len(tokens), "seconds": seconds,
            "target_nll": sequence_nll(engine.target, ids, tokens) if tokens else None}


def generate_ensemble(engine, ids: list[int], decode: DecodeConfig, weight: float) -> tuple[list[int], float]:
    """transformers' static ensemble at `weight` on the engine's pair with the run's budget, draft length, stop
    tokens, temperature, top-p and seed, timed: (tokens, seconds); the bench's --peer runs it too."""
    return ensemble_assisted_generate(engine.target, engine.draft, ids, decode.max_new_tokens,
                                      None if decode.gamma_auto else decode.gamma, engine.stop_ids, weight,
                                      decode.temperature, decode.top_p, decode.seed)
