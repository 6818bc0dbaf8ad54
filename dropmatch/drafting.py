"""What a round drafts, as pure functions: n-gram proposals (prompt lookup) and the draft length.

Prompt lookup proposes the tokens that followed the latest earlier occurrence of the text's last n
tokens (prompt and output so far): free to compute, and often right where an answer repeats its
question or itself (numbers, names, code). Its draft distribution is one-hot on the proposed token,
so lossless acceptance stays exact (accept with probability p(x) / 1; residual max(0, p - one-hot)).

gamma = auto drafts, each round, the number of tokens that maximises expected tokens per second:
(1 + sum_k prod_{i<=k} a_i) / (g * draft_step + verify(g + 1)), where a_i is this generation's
running acceptance at slot i (a prior until it has data) and the costs were measured on this
machine for this pair (StepCosts). Under hybrid drafting with gamma = auto, a lookup proposal is used
only when its expected rate (its own slot acceptance, no draft cost) beats the draft model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NGRAM_MAX = 3  # the longest suffix looked up
HYBRID_MIN_N = 2  # hybrid trusts a lookup of at least this many tokens (a 1-gram match is mostly chance)
PRIOR_ACCEPTS, PRIOR_TRIES = 1.0, 2.0  # acceptance 0.5 worth two observations, per slot


def lookup(tokens: list[int], max_tokens: int, min_n: int = 1, max_n: int = NGRAM_MAX) -> list[int]:
    """Up to max_tokens tokens that followed the latest earlier occurrence of the longest suffix of
    `tokens` (n from max_n down to min_n); [] when no suffix recurs."""
    if max_tokens <= 0:
        return []
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + max_tokens]
    return []


@dataclass(frozen=True)
class StepCosts:
    """Seconds, measured on this machine for this pair: one draft step, and one target call over n
    verified positions as verify_base + verify_per_position * (n - 1)."""

    draft_step: float
    verify_base: float
    verify_per_position: float

    def verify(self, positions: int) -> float:
        return self.verify_base + self.verify_per_position * max(positions - 1, 0)


@dataclass
class SlotAcceptance:
    """A generation's running acceptance per draft slot: of the rounds that reached slot i, how many
    accepted its token."""

    accepts: list[float] = field(default_factory=list)
    tries: list[float] = field(default_factory=list)

    def rate(self, slot: int) -> float:
        accepts = self.accepts[slot] if slot < len(self.accepts) else 0.0
        tries = self.tries[slot] if slot < len(self.tries) else 0.0
        return (accepts + PRIOR_ACCEPTS) / (tries + PRIOR_TRIES)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """One round: slots 0 .. num_accepted were reached (the first rejected one included)."""
        while len(self.tries) < num_drafted:
            self.tries.append(0.0)
            self.accepts.append(0.0)
        for slot in range(min(num_accepted + 1, num_drafted)):
            self.tries[slot] += 1
            self.accepts[slot] += slot < num_accepted


def expected_tokens(acceptance: SlotAcceptance, gamma: int) -> float:
    """1 (the correction or bonus) + the expected accepted prefix of gamma drafted tokens."""
    total, reach = 1.0, 1.0
    for slot in range(gamma):
        reach *= acceptance.rate(slot)
        total += reach
    return total


def choose_gamma(acceptance: SlotAcceptance, costs: StepCosts, cap: int, draft_step: float | None = None) -> int:
    """The draft length in 1..cap with the most expected tokens per second (draft_step overrides
    the measured one: 0 for n-gram proposals, which cost no model call)."""
    return best_length(acceptance, costs, cap, draft_step)[0]


def best_length(acceptance: SlotAcceptance, costs: StepCosts, cap: int,
                draft_step: float | None = None) -> tuple[int, float]:
    """(length in 1..cap, its expected tokens per second); the shorter one on a tie."""
    step = costs.draft_step if draft_step is None else draft_step
    rates = {g: expected_tokens(acceptance, g) / (g * step + costs.verify(g + 1)) for g in range(1, cap + 1)}
    gamma = max(rates, key=lambda g: (rates[g], -g))
    return gamma, rates[gamma]
