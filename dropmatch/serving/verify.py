"""One verification step of a server's batch of greedy requests, judged by the project's own judge
step (judging.judge_batch) and decided by its own rule functions (acceptance.decide): the same
code the engine and the rule lab run, so a request served elsewhere gets the decisions it would
get here, from the same hidden states and masks.

    verdicts = verify_greedy(head, rule, [Round(...), ...])

`head` is anything with `path_logits(hidden, keep, p, clean_logits)` (judging.Head): our
models.CausalLM, or a server's LM head (serving/vllm/runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import acceptance, judging
from ..acceptance import Verdict
from ..config import RuleConfig


@dataclass(frozen=True)
class Round:
    """One request's drafted tokens in a batch.

    draft_tokens [g] at sequence positions first_position + i; q_signal [g, V] the draft's smooth
    distributions (one-hot for a lookup draft); hidden [g + 1, H] the target's final hidden states
    and clean_logits [g + 1, V] its logits at the verified positions; mask_seed keys the request's
    dropout masks (mc_head.mask_seed of its seed and prompt)."""

    first_position: int
    draft_tokens: torch.Tensor
    q_signal: torch.Tensor
    hidden: torch.Tensor
    clean_logits: torch.Tensor
    mask_seed: int

    def exact(self) -> torch.Tensor:
        """[g] greedy's lossless test: the target's argmax is the drafted token."""
        return self.clean_logits[: self.draft_tokens.shape[0]].argmax(-1) == self.draft_tokens

    def judge_inputs(self) -> judging.JudgeInputs:
        return judging.JudgeInputs(self.first_position, self.draft_tokens, self.q_signal, self.hidden,
                                   self.clean_logits.float(), self.exact(), 0.0, self.mask_seed)


def verify_greedy(head: judging.Head, rule: RuleConfig, rounds: list[Round]) -> list[Verdict]:
    """The verdict of each round under `rule` (greedy): how many drafted tokens it accepts, why each
    ended as it did, and the token emitted after them (the target's argmax there).

    Judged piece by piece, each piece a round's exact prefix and the one position after it that the
    exact test rejected: greedy decisions scan left to right and each position's checks read that
    position only, so this decides what judging the whole round decides (tested), while the
    full-vocabulary signals are computed only where a rule reads them. A piece the rule accepts to
    its end is followed by the next one, in the next batched pass."""
    if rule.uses_paths and rule.p is None:
        raise ValueError("p = auto calibrates on a run's own prompt before decoding; a server needs p as a number")
    exact = [round_.exact() for round_ in rounds]
    verdicts: list[list[Verdict]] = [[] for _ in rounds]
    pending = list(range(len(rounds)))
    starts = [0] * len(rounds)
    unused = torch.Generator()  # greedy decisions draw nothing
    while pending:
        inputs = [_piece(rounds[i], exact[i], starts[i]) for i in pending]
        judged = judging.judge_batch(head, rule, rule.p if rule.uses_paths else None, inputs)
        still = []
        for i, one, done in zip(pending, inputs, judged):
            verdict = acceptance.decide(rule, True, done.signals, one.q_signal, one.clean_logits, unused,
                                        exact=one.exact)
            verdicts[i].append(verdict)
            starts[i] += one.num_drafted
            if verdict.num_accepted == one.num_drafted and starts[i] < len(rounds[i].draft_tokens):
                still.append(i)
        pending = still
    return [_joined(round_, parts) for round_, parts in zip(rounds, verdicts)]


def _piece(round_: Round, exact: torch.Tensor, start: int) -> judging.JudgeInputs:
    """The judge inputs of the round's drafted positions from `start` through the first one the exact
    test (exact [g], computed once per round) rejects."""
    rejected = (~exact[start:]).nonzero()
    end = start + int(rejected[0]) + 1 if rejected.numel() else int(exact.numel())
    return judging.JudgeInputs(round_.first_position + start, round_.draft_tokens[start:end],
                               round_.q_signal[start:end], round_.hidden[start:end + 1],
                               round_.clean_logits[start:end + 1].float(), exact[start:end], 0.0, round_.mask_seed)


def _joined(round_: Round, parts: list[Verdict]) -> Verdict:
    """One round's verdict from its pieces' (positions after a rejection: unchecked)."""
    reasons = tuple(reason for part in parts for reason in part.reasons)
    reasons += ("unchecked",) * (len(round_.draft_tokens) - len(reasons))
    return Verdict(sum(part.num_accepted for part in parts), reasons, parts[-1].next_token, parts[-1].next_kind)
