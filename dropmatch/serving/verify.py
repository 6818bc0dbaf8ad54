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

    def judge_inputs(self) -> judging.JudgeInputs:
        num_drafted = int(self.draft_tokens.shape[0])
        exact = self.clean_logits[:num_drafted].argmax(-1) == self.draft_tokens  # greedy's lossless test
        return judging.JudgeInputs(self.first_position, self.draft_tokens, self.q_signal, self.hidden,
                                   self.clean_logits.float(), exact, 0.0, self.mask_seed)


def verify_greedy(head: judging.Head, rule: RuleConfig, rounds: list[Round]) -> list[Verdict]:
    """The verdict of each round under `rule` (greedy): how many drafted tokens it accepts, why each
    ended as it did, and the token emitted after them (the target's argmax there)."""
    if rule.uses_paths and rule.p is None:
        raise ValueError("p = auto calibrates on a run's own prompt before decoding; a server needs p as a number")
    inputs = [one.judge_inputs() for one in rounds]
    judged = judging.judge_batch(head, rule, rule.p if rule.uses_paths else None, inputs)
    unused = torch.Generator()  # greedy decisions draw nothing
    return [acceptance.decide(rule, True, done.signals, one.q_signal, one.clean_logits, unused, exact=one.exact)
            for one, done in zip(inputs, judged)]
