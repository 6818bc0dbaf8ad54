"""Lossless SD and a lossy rule on the same prompt, seed and pair, round by round.

The two runs advance alternately so that a UI can show both columns growing together. Each
run's times are measured inside the run (see Engine._finish), so alternating does not make
either one look slower.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from .acceptance import RULES
from .config import DecodeConfig, RuleConfig
from .engine import run_to_end
from .models import ensemble_assisted_generate, sequence_nll
from .trace import GenerationTrace, RoundTrace


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
    phase: str = "running"  # running | baseline | peer | done | stopped
    peer: dict | None = None  # transformers' own run of the rule, where it has one (static_ensemble_peer)


def compare_stream(
    engine, prompt: str, decode: DecodeConfig, rule: RuleConfig, run_ar: bool = True,
    stop_event: threading.Event | None = None, progress: Callable[[str, int, int], None] | None = None,
) -> Iterator[Comparison]:
    """Yields the Comparison after every round of either run, then once more when done.
    progress(column, tokens read, prompt tokens): how far each column's target has read the prompt
    ("lossless" or "lossy"; Engine.speculative's progress)."""
    ids = engine.encode(prompt)
    engine.check_fits(ids, decode)
    state = Comparison(prompt, decode, rule, Column("lossless"), Column(rule.rule))

    def reading(column: str) -> dict:
        return {} if progress is None else {"progress": functools.partial(progress, column)}

    runs = {
        # The lossless column keeps its states: the rule lab re-judges its drafts under every rule.
        "lossless": (state.lossless, engine.speculative(ids, decode, replace(rule, rule="lossless"), stop_event,
                                                        keep_states=True, **reading("lossless"))),
        "lossy": (state.lossy, engine.speculative(ids, decode, rule, stop_event, **reading("lossy"))),
    }

    def stopped() -> bool:
        return stop_event is not None and stop_event.is_set()

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
    if run_ar and not stopped():
        state.phase = "baseline"
        yield state
        state.ar = run_to_end(engine.autoregressive(ids, decode, stop_event))
    if RULES[rule.rule].peer and hasattr(engine, "target") and not stopped():
        state.phase = "peer"
        yield state
        state.peer = static_ensemble_peer(engine, ids, decode, rule)
    state.phase = "stopped" if stopped() else "done"
    yield state


def peer_weight(rule: RuleConfig) -> float:
    """The value transformers' peer runs at: the rule's own swept knob (the static ensemble's weight)."""
    return rule.knobs[RULES[rule.rule].knob]


def static_ensemble_peer(engine, ids: list[int], decode: DecodeConfig, rule: RuleConfig) -> dict:
    """transformers' own static ensemble (assisted generation with assistant_ensemble_weight) on the same pair,
    prompt, weight, temperature, top-p and draft length, timed, with its text's target NLL: the peer row
    under the ensemble column (its draws are transformers', so its text is a sample of the same rule)."""
    tokens, seconds = ensemble_assisted_generate(engine.target, engine.draft, ids, decode.max_new_tokens,
                                                 None if decode.gamma_auto else decode.gamma, engine.stop_ids,
                                                 peer_weight(rule), decode.temperature, decode.top_p, decode.seed)
    return {"weight": peer_weight(rule), "tokens": len(tokens), "seconds": seconds,
            "target_nll": sequence_nll(engine.target, ids, tokens) if tokens else None}
