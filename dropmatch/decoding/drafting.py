"""What a round drafts: drafters behind one small interface, n-gram proposals and the draft length.

A `Drafter` (in the spirit of transformers' CandidateGenerator) proposes a round's tokens with
their draft distributions (`propose`) and learns from the round's outcome (`learn`): the engine's
round calls nothing else. Three of them, one per DecodeConfig.draft_source (DRAFTERS):
`ModelDrafter` (the draft model), `LookupDrafter` (prompt lookup) and `HybridDrafter` (lookup where
it matches and pays, the model elsewhere).

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
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from .sampling import draw, sampling_probs, signal_probs

if TYPE_CHECKING:  # annotations only: drafting never imports transformers
    from .config import DecodeConfig
    from .causal_lm import CausalLM

NGRAM_MAX = 3  # the longest suffix looked up
HYBRID_MIN_N = 2  # hybrid trusts a lookup of at least this many tokens (a 1-gram match is mostly chance)
PRIOR_ACCEPTS, PRIOR_TRIES = 1.0, 2.0  # acceptance 0.5 worth two observations, per slot


def lookup(tokens: list[int], max_tokens: int, min_n: int = 1) -> list[int]:
    """Up to max_tokens tokens that followed the latest earlier occurrence of the longest suffix of
    `tokens` (n from NGRAM_MAX down to min_n); [] when no suffix recurs."""
    if max_tokens <= 0:
        return []
    for n in range(min(NGRAM_MAX, len(tokens) - 1), min_n - 1, -1):
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
class VerifyCost:
    """The verify step's cost as the run itself measures it, round by round: the seconds of its
    Monte-Carlo (and trained-judge) work, the drafted positions it judged (those the exact test
    rejected), and the draft slots the rounds reached. 0 until a round judged something."""

    seconds: float = 0.0
    judged: int = 0
    reached: int = 0

    def record(self, seconds: float, judged: int, reached: int) -> None:
        self.seconds += seconds
        self.judged += judged
        self.reached += reached

    def per_position(self) -> float:
        """Seconds per judged position."""
        return self.seconds / self.judged if self.judged else 0.0

    def per_reached_slot(self) -> float:
        """Seconds per reached draft slot: per judged position times the share of reached slots judged."""
        return self.per_position() * (self.judged / self.reached) if self.reached else 0.0


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


def expected_reached(acceptance: SlotAcceptance, gamma: int) -> float:
    """The draft slots a round of gamma drafted tokens reaches on average (slot 0 always; slot i when
    every earlier one was accepted): the slots the verify step may have to judge."""
    total, reach = 0.0, 1.0
    for slot in range(gamma):
        total += reach
        reach *= acceptance.rate(slot)
    return total


def choose_gamma(acceptance: SlotAcceptance, costs: StepCosts, cap: int, draft_step: float | None = None,
                 verify_per_slot: float = 0.0) -> int:
    """The draft length in 1..cap with the most expected tokens per second (draft_step overrides
    the measured one: 0 for n-gram proposals, which cost no model call)."""
    return best_length(acceptance, costs, cap, draft_step, verify_per_slot)[0]


def best_length(acceptance: SlotAcceptance, costs: StepCosts, cap: int, draft_step: float | None = None,
                verify_per_slot: float = 0.0) -> tuple[int, float]:
    """(length in 1..cap, its expected tokens per second); the shorter one on a tie. A round of g
    costs g draft steps, one verify call over g + 1 positions, and the verify step at the slots it
    reaches (verify_per_slot: VerifyCost.per_reached_slot, measured by the run so far). Its expected tokens:
    1 (the correction or bonus) + the accepted prefix, i.e. the slots a round of g + 1 drafts reaches."""
    step = costs.draft_step if draft_step is None else draft_step
    rates = {g: expected_reached(acceptance, g + 1) / (g * step + costs.verify(g + 1)
                                                       + verify_per_slot * expected_reached(acceptance, g))
             for g in range(1, cap + 1)}
    gamma = max(rates, key=lambda g: (rates[g], -g))
    return gamma, rates[gamma]


# ---------------------------------------------------------------- drafters


@dataclass
class Draft:
    """One round's proposal. tokens [g] (g <= the round's limit, on the device); q_sample [g, V] the
    distributions they were drawn from; q_signal [g, V] the smooth distributions the divergence rules
    compare; hidden [g, H_d] the draft's final hidden states they came from ([0, H_d] for prompt
    lookup, whose distributions are one-hot); source: the drafter's ("model", "ngram" or "eagle3");
    requested: the length the round asked for."""

    tokens: torch.Tensor
    q_sample: torch.Tensor
    q_signal: torch.Tensor
    hidden: torch.Tensor
    source: str
    requested: int

    @property
    def num_drafted(self) -> int:
        return int(self.tokens.shape[0])


class Drafter(Protocol):
    def start(self, prompt_ids: list[int]) -> None:
        """Read the prompt (before the first round; the prefill's time)."""

    def propose(self, tokens: list[int], limit: int) -> Draft:
        """At most `limit` tokens to follow `tokens` (prompt + output so far)."""

    def learn(self, draft: Draft, num_accepted: int, kept_length: int) -> None:
        """The round's outcome: num_accepted of the draft's tokens kept; the sequence is now
        kept_length tokens long before the extra token (what the target's cache keeps)."""


@dataclass
class DraftSpace:
    """What every drafter of a run shares: its settings, the run's seed stream (sampled drafts draw
    from it), gamma = auto's measured costs (None for a fixed gamma), the target's vocabulary size,
    the device and the draft model's hidden size (for empty hidden states)."""

    decode: "DecodeConfig"
    generator: torch.Generator
    costs: StepCosts | None
    vocab_size: int
    device: torch.device
    hidden_size: int
    verify_cost: VerifyCost = field(default_factory=VerifyCost)  # the engine records each round's

    def ids(self, tokens: list[int]) -> torch.Tensor:
        return torch.tensor(tokens, dtype=torch.long, device=self.device)

    def one_hot(self, tokens: list[int], source: str, requested: int) -> Draft:
        """The draft of these tokens with one-hot distributions and no hidden states: prompt lookup's, or
        (no tokens) an empty one."""
        ids = self.ids(tokens)
        one_hot = torch.nn.functional.one_hot(ids, self.vocab_size).float()
        return Draft(ids, one_hot, one_hot, torch.empty(0, self.hidden_size, device=self.device), source, requested)


class _Learning:
    """A source's running slot acceptance and gamma = auto's length choice from it."""

    draft_step: float | None = None  # None: the measured draft step; 0 for a proposal that costs no call

    def __init__(self, space: DraftSpace):
        self.space = space
        self.acceptance = SlotAcceptance()

    def length(self, limit: int) -> int:
        if not self.space.decode.gamma_auto or limit <= 0:
            return limit
        return choose_gamma(self.acceptance, self.space.costs, limit, self.draft_step, self.verify_price())

    def expected_rate(self, limit: int) -> float:
        """Expected tokens per second of this source's best length up to limit (gamma = auto only)."""
        return best_length(self.acceptance, self.space.costs, limit, self.draft_step, self.verify_price())[1]

    def verify_price(self) -> float:
        """The verify step's seconds per reached slot that gamma = auto weighs: none by default (every rule
        drafts by lossless SD's costs: one policy for both columns), the run's measured one when the
        draft length is tuned for the rule's cost (DecodeConfig.gamma_tuned_for_rule)."""
        return self.space.verify_cost.per_reached_slot() if self.space.decode.gamma_tuned_for_rule else 0.0

    def learn(self, draft: Draft, num_accepted: int, kept_length: int) -> None:
        if draft.source == self.source:
            self.acceptance.record(draft.num_drafted, num_accepted)

    def chain(self, gamma: int, state: torch.Tensor, logits: Callable, following: Callable) -> Draft:
        """gamma tokens drafted one by one from the first step's hidden state [H_d], staying on the device (no host
        sync per token): each a plain draw from q (its argmax when greedy), which lossless sampling divides by;
        logits(state) scores a step, following(state, token) is the next step's state (while tokens remain)."""
        decode, steps = self.space.decode, []
        for slot in range(gamma):
            scores = logits(state)
            probs = sampling_probs(scores, decode.temperature, decode.top_p)
            token = scores.argmax(-1, keepdim=True) if decode.greedy else draw(probs, self.space.generator).view(1)
            steps.append((token, probs, signal_probs(scores, decode.temperature), state))  # smooth even when greedy
            if slot + 1 < gamma:
                state = following(state, token)
        drafted, q_sample, q_signal, states = zip(*steps)
        return Draft(torch.cat(drafted), torch.stack(q_sample), torch.stack(q_signal), torch.stack(states),
                     self.source, gamma)


class ModelDrafter(_Learning):
    """The draft model, one token per call, with its own cache."""

    source = "model"

    def __init__(self, space: DraftSpace, model: "CausalLM"):
        super().__init__(space)
        self.model = model
        self.cache = model.new_cache()

    def start(self, prompt_ids: list[int]) -> None:
        self.model.hidden(self.space.ids(prompt_ids), self.cache)

    def propose(self, tokens: list[int], limit: int) -> Draft:
        """Up to length(limit) tokens (chain), the first step reading the tokens committed since last time."""
        gamma = self.length(limit)
        if gamma <= 0:
            return self.space.one_hot([], self.source, gamma)
        feed = self.space.ids(tokens[self.model.cached_length(self.cache):])
        return self.chain(gamma, self.model.hidden(feed, self.cache)[-1], self.model.logits,
                          lambda state, token: self.model.hidden(token, self.cache)[-1])

    def learn(self, draft: Draft, num_accepted: int, kept_length: int) -> None:
        super().learn(draft, num_accepted, kept_length)
        self.model.crop(self.cache, min(kept_length, self.model.cached_length(self.cache)))


class LookupDrafter(_Learning):
    """Prompt lookup: the tokens after the latest earlier occurrence of the text's last n tokens, with
    one-hot distributions (so lossless acceptance stays exact). min_n: the shortest suffix trusted."""

    source = "ngram"
    draft_step = 0.0

    def __init__(self, space: DraftSpace, min_n: int = 1):
        super().__init__(space)
        self.min_n = min_n

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], limit: int) -> Draft:
        return self.of(lookup(tokens, limit, self.min_n))

    def of(self, proposal: list[int]) -> Draft:
        """The draft of a proposal, cut to gamma = auto's length."""
        gamma = self.length(len(proposal))
        return self.space.one_hot(proposal[:max(gamma, 0)], self.source, gamma)


class HybridDrafter:
    """A lookup of at least HYBRID_MIN_N tokens where one exists and, under gamma = auto, where its
    expected tokens per second (its own slot acceptance, no draft cost) beat the draft model's; the
    draft model elsewhere. Each source learns from its own rounds."""

    def __init__(self, space: DraftSpace, model: "CausalLM"):
        self.space = space
        self.model = ModelDrafter(space, model)
        self.lookup = LookupDrafter(space, min_n=HYBRID_MIN_N)

    def start(self, prompt_ids: list[int]) -> None:
        self.model.start(prompt_ids)

    def propose(self, tokens: list[int], limit: int) -> Draft:
        proposal = lookup(tokens, limit, HYBRID_MIN_N)
        if proposal and self.lookup_pays(len(proposal), limit):
            return self.lookup.of(proposal)
        return self.model.propose(tokens, limit)

    def lookup_pays(self, proposed: int, limit: int) -> bool:
        return (not self.space.decode.gamma_auto
                or self.lookup.expected_rate(proposed) >= self.model.expected_rate(limit))

    def learn(self, draft: Draft, num_accepted: int, kept_length: int) -> None:
        self.lookup.learn(draft, num_accepted, kept_length)
        self.model.learn(draft, num_accepted, kept_length)


# One drafter per DecodeConfig.draft_source (config.DRAFT_SOURCES names the same keys).
DRAFTERS = {
    "model": ModelDrafter,
    "ngram": lambda space, model: LookupDrafter(space),
    "hybrid": HybridDrafter,
}


def make_drafter(space: DraftSpace, model: "CausalLM") -> Drafter:
    """The drafter of space.decode.draft_source over this draft model."""
    return DRAFTERS[space.decode.draft_source](space, model)
