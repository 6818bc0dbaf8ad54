"""One verification step of a server's batch of greedy requests, judged by the project's own judge
step (judging.judge_stacked: the signal and path functions judge_positions reads) and decided by
its own rule functions (acceptance.rule_reasons, what acceptance.judge reads): so a request served
elsewhere gets the decisions it would get here, from the same hidden states and masks.

    verdicts = verify_greedy(head, rule, [Round(...), ...])

`head` is anything with `path_logits(hidden, keep, p, clean_logits)` (judging.Head): our
models.CausalLM, or a server's LM head (serving/vllm/runner.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .. import acceptance, judging
from ..acceptance import BONUS, CORRECTION, Verdict
from ..config import RuleConfig
from ..sampling import signal_probs, top_token


@dataclass(frozen=True)
class Round:
    """One request's drafted tokens in a batch.

    draft_tokens [g] at sequence positions first_position + i; draft_logits the draft's logits
    there ([g, V], or g rows [V] of the server's per-step tensors; None for a lookup draft, whose
    distribution is one-hot); hidden [g + 1, H] the target's final hidden states and clean_logits
    [g + 1, V] its logits at the verified positions; mask_seed keys the request's dropout masks
    (mc_head.mask_seed of its seed and prompt). lossless: the server's own greedy verdict when it
    has one, (drafts its exact test accepted, the target's token after them), which is what the
    argmax test over clean_logits gives; None: computed from clean_logits."""

    first_position: int
    draft_tokens: torch.Tensor
    draft_logits: torch.Tensor | Sequence[torch.Tensor] | None
    hidden: torch.Tensor
    clean_logits: torch.Tensor
    mask_seed: int
    lossless: tuple[int, int] | None = None

    @property
    def num_drafted(self) -> int:
        return int(self.draft_tokens.shape[0])

    def q_rows(self, start: int, end: int) -> torch.Tensor:
        """[end - start, V] the draft's smooth distributions at drafted positions start..end - 1."""
        if self.draft_logits is None:
            return torch.nn.functional.one_hot(self.draft_tokens[start:end], self.clean_logits.shape[-1]).float()
        rows = self.draft_logits[start:end]
        return signal_probs(rows if isinstance(rows, torch.Tensor) else torch.stack(list(rows)), 0.0)

    @property
    def q_signal(self) -> torch.Tensor:
        return self.q_rows(0, self.num_drafted)

    def exact(self) -> torch.Tensor:
        """[g] greedy's lossless test: the target's argmax is the drafted token."""
        return top_token(self.clean_logits[: self.num_drafted]) == self.draft_tokens

    def judge_inputs(self) -> judging.JudgeInputs:
        """The whole round as the engine's judge step reads it (judge_positions)."""
        return judging.JudgeInputs(self.first_position, self.draft_tokens, self.q_signal, self.hidden,
                                   self.clean_logits.float(), self.exact(), 0.0, self.mask_seed)

    def exact_run(self, start: int) -> tuple[int, int]:
        """From drafted position `start`: how many drafts in a row the exact test accepts, and the
        target's argmax where the run stops (the correction there, or the bonus after the last)."""
        if start == 0 and self.lossless is not None:
            return self.lossless
        targets = top_token(self.clean_logits[start:]).tolist()
        drafts = self.draft_tokens[start:].tolist()
        count = 0
        while count < len(drafts) and drafts[count] == targets[count]:
            count += 1
        return count, targets[count]


def verify_greedy(head: judging.Head, rule: RuleConfig, rounds: list[Round]) -> list[Verdict]:
    """The verdict of each round under `rule` (greedy): how many drafted tokens it accepts, why each
    ended as it did, and the token emitted after them (the target's argmax there).

    Each round is scanned left to right as acceptance.judge scans it: the exact test's run, then
    the one position it rejected, which the rule judges (its checks read that position only); where
    the rule accepts it the scan goes on. So each pass judges one position per request still
    scanning, the whole batch's positions stacked in one call: the full-vocabulary signals and
    the K head rows are computed only at positions a rule reads, and the per-request work is
    bookkeeping. The verdicts equal judge_positions + decide on each whole round (tested)."""
    if rule.uses_paths and rule.p is None:
        raise ValueError("p = auto calibrates on a run's own prompt before decoding; a server needs p as a number")
    scans = [_Scan(round_) for round_ in rounds]
    pending = [scan for scan in scans if scan.advance()]
    while pending:
        signals = judging.judge_stacked(head, rule, rule.p if rule.uses_paths else None,
                                        [scan.piece() for scan in pending])
        reasons = acceptance.rule_reasons(rule, signals)
        pending = [scan for scan, reason in zip(pending, reasons) if scan.took(reason) and scan.advance()]
    return [scan.verdict() for scan in scans]


class _Scan:
    """One round's left-to-right scan: the reasons so far, the next drafted position, the emitted token."""

    def __init__(self, round_: Round):
        self.round = round_
        self.reasons: list[str] = []
        self.start = 0
        self.target_token = -1  # the target's argmax at the position being judged
        self.emitted: tuple[int, str] | None = None

    def advance(self) -> bool:
        """Past the exact test's run from the next position; True when the scan stops at a position
        the rule judges, False when the round is decided (all drafts accepted: the bonus token)."""
        count, token = self.round.exact_run(self.start)
        self.reasons += ["exact"] * count
        self.start += count
        if self.start == self.round.num_drafted:
            self.emitted = (token, BONUS)
            return False
        self.target_token = token
        return True

    def piece(self) -> judging.JudgeInputs:
        """The judge inputs of the one drafted position being judged."""
        at, round_ = self.start, self.round
        return judging.JudgeInputs(round_.first_position + at, round_.draft_tokens[at:at + 1], round_.q_rows(at, at + 1),
                                   round_.hidden[at:at + 2], round_.clean_logits[at:at + 2].float(),
                                   torch.zeros(1, dtype=torch.bool), 0.0, round_.mask_seed)

    def took(self, reason: str) -> bool:
        """The rule's reason at the judged position; True when the scan goes on after it."""
        self.reasons.append(reason)
        if reason == "rejected":
            self.emitted = (self.target_token, CORRECTION)
            return False
        self.start += 1
        return True

    def verdict(self) -> Verdict:
        accepted = sum(reason not in ("rejected", "unchecked") for reason in self.reasons)
        reasons = tuple(self.reasons) + ("unchecked",) * (self.round.num_drafted - len(self.reasons))
        return Verdict(accepted, reasons, *self.emitted)
