"""A server's batch of greedy requests as the one verify step reads it (verifying.verify): the same
function the engine and the rule lab call, so a request served elsewhere gets the decisions it would
get here, from the same hidden states and masks.

    verified = verify_rounds(head, rule, [Round(...), ...], one_pass)

`head` is anything with `path_logits(hidden, keep, p, clean_logits)` (verifying.Head): our
causal_lm.CausalLM, or a server's LM head (serving/vllm/runner.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import verifying
from .config import RuleConfig
from .sampling import signal_probs, top_token
from .trained_judge import TrainedJudge


@dataclass(frozen=True)
class Round:
    """One request's drafted tokens in a batch.

    draft_tokens [g] at sequence positions first_position + i; draft_logits the draft's logits
    there ([g, V], or g rows [V] of the server's per-step tensors; None for a lookup draft, whose
    distribution is one-hot); hidden [g + 1, H] the target's final hidden states and clean_logits
    [g + 1, V] its logits at the verified positions; mask_seed keys the request's dropout masks
    (mc_head.mask_seed of its seed and prompt)."""

    first_position: int
    draft_tokens: torch.Tensor
    draft_logits: torch.Tensor | Sequence[torch.Tensor] | None
    hidden: torch.Tensor
    clean_logits: torch.Tensor
    mask_seed: int

    @property
    def num_drafted(self) -> int:
        return int(self.draft_tokens.shape[0])

    @property
    def q_signal(self) -> torch.Tensor:
        """[g, V] the draft's smooth distributions (one-hot for a lookup draft)."""
        if self.draft_logits is None:
            return torch.nn.functional.one_hot(self.draft_tokens, self.clean_logits.shape[-1]).float()
        rows = self.draft_logits
        return signal_probs(rows if isinstance(rows, torch.Tensor) else torch.stack(list(rows)), 0.0)

    def exact(self) -> torch.Tensor:
        """[g] greedy's lossless test: the target's argmax is the drafted token (vLLM's own test)."""
        return top_token(self.clean_logits[: self.num_drafted]) == self.draft_tokens

    def verify_inputs(self) -> verifying.VerifyInputs:
        """The round as the verify step reads it."""
        return verifying.VerifyInputs(self.first_position, self.draft_tokens, self.q_signal, self.hidden,
                                      self.clean_logits.float(), self.exact(), 0.0, self.mask_seed,
                                      draft_source="ngram" if self.draft_logits is None else "model")


def verify_rounds(head: verifying.Head, rule: RuleConfig, rounds: list[Round], one_pass: bool = False,
                  judge: TrainedJudge | None = None) -> list[verifying.Verified]:
    """Each round's verification under `rule` (greedy): verifying.verify over the batch, staged (the paths
    only where the rule reads them, a host read per stage) or, one_pass, every drafted position in one
    head pass and one host copy for the whole step (a device where each copy is a sync). The same
    verdicts either way (tested); Verified.emitted is the row a server writes."""
    if rule.uses_paths and rule.p is None:
        raise ValueError("p = auto calibrates on a run's own prompt before decoding; a server needs p as a number")
    return verifying.verify(head, rule, [round_.verify_inputs() for round_ in rounds], staged=not one_pass, judge=judge)
