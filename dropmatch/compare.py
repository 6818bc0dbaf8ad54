"""Lossless SD and a lossy rule on the same prompt, seed and pair, round by round.

The two runs advance alternately so that a UI can show both columns growing together. Each
run's times are measured inside the run (see Engine._finish), so alternating does not make
either one look slower.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Iterator

from .config import DecodeConfig, RuleConfig
from .engine import run_to_end
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
    phase: str = "running"  # running | baseline | done | stopped


def compare_stream(
    engine, prompt: str, decode: DecodeConfig, rule: RuleConfig, run_ar: bool = True,
    stop_event: threading.Event | None = None,
) -> Iterator[Comparison]:
    """Yields the Comparison after every round of either run, then once more when done."""
    ids = engine.encode(prompt)
    engine.check_fits(ids, decode)
    state = Comparison(prompt, decode, rule, Column("lossless"), Column(rule.rule))
    runs = {
        # The lossless column keeps its states: the rule lab re-judges its drafts under every rule.
        "lossless": (state.lossless, engine.speculative(ids, decode, replace(rule, rule="lossless"), stop_event,
                                                        keep_states=True)),
        "lossy": (state.lossy, engine.speculative(ids, decode, rule, stop_event)),
    }
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
    stopped = stop_event is not None and stop_event.is_set()
    if run_ar and not stopped:
        state.phase = "baseline"
        yield state
        state.ar = run_to_end(engine.autoregressive(ids, decode, stop_event))
    state.phase = "stopped" if stop_event is not None and stop_event.is_set() else "done"
    yield state
