"""One verification step of a server's batch of greedy requests, judged by the project's own judge
step (verifying.verify_stacked: the signal and path functions verify_positions reads) and decided by
its own rule functions and its one scan (acceptance.rule_reasons and acceptance.scan, what
acceptance.scan_reasons runs): so a request served elsewhere gets the decisions it would get here, from
the same hidden states and masks.

    verdicts = verify_greedy(head, rule, [Round(...), ...])

`head` is anything with `path_logits(hidden, keep, p, clean_logits)` (verifying.Head): our
models.CausalLM, or a server's LM head (serving/vllm/runner.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .. import acceptance, verifying
from ..acceptance import BONUS, CORRECTION, Verdict
from ..config import RuleConfig
from ..sampling import signal_probs, top_token
from ..trained_judge import TrainedJudge


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

    def verify_inputs(self) -> verifying.VerifyInputs:
        """The whole round as the engine's verify step reads it (verify_positions)."""
        return verifying.VerifyInputs(self.first_position, self.draft_tokens, self.q_signal, self.hidden,
                                   self.clean_logits.float(), self.exact(), 0.0, self.mask_seed)

    def is_exact(self) -> Callable[[int], bool]:
        """Greedy's lossless test at drafted position i: the server's own verdict where it has one (its
        run of accepted drafts ends at the first it rejected), the argmax of clean_logits past it."""
        argmax_test: list[bool] = []

        def at(i: int) -> bool:
            if self.lossless is not None and i <= self.lossless[0]:
                return i < self.lossless[0]
            if not argmax_test:  # one host copy per round, only where the scan passes the server's verdict
                argmax_test.extend(self.exact().tolist())
            return argmax_test[i]

        return at

    def emitted_after(self, reasons: tuple[str, ...]) -> tuple[int, str]:
        """The token after the accepted drafts: the target's argmax at the rejected position (correction),
        or after the last draft (bonus); the server's own where its verdict covers that position."""
        accepted = acceptance.accepted_count(reasons)
        kind = BONUS if accepted == self.num_drafted else CORRECTION
        if self.lossless is not None and accepted == self.lossless[0]:
            return self.lossless[1], kind
        return int(top_token(self.clean_logits[accepted])), kind

    def piece(self, at: int) -> verifying.VerifyInputs:
        """The judge inputs of drafted position `at` alone."""
        return verifying.VerifyInputs(self.first_position + at, self.draft_tokens[at:at + 1], self.q_rows(at, at + 1),
                                   self.hidden[at:at + 2], self.clean_logits[at:at + 2].float(),
                                   torch.zeros(1, dtype=torch.bool), 0.0, self.mask_seed)


def verify_greedy(head: verifying.Head, rule: RuleConfig, rounds: list[Round], one_pass: bool = False,
                  judge: TrainedJudge | None = None) -> list[Verdict]:
    """The verdict of each round under `rule` (greedy): how many drafted tokens it accepts, why each
    ended as it did, and the token emitted after them (the target's argmax there).

    one_pass: every drafted position of the batch judged in one stacked call, and everything the
    scans read copied to the host at once (`verify_in_one_pass`); the same verdicts (tested), for a
    device where each host copy is a sync; else, as follows. judge: the trained judge the judge
    rules read (from the target's hidden state on reading each drafted token, Round.hidden).

    Each round is scanned left to right as acceptance.scan_reasons scans it: the exact test's run, then
    the one position it rejected, which the rule judges (its checks read that position only); where
    the rule accepts it the scan goes on. So each pass judges one position per request still
    scanning, the whole batch's positions stacked in one call: the full-vocabulary signals and
    the K head rows are computed only at positions a rule reads, and the per-request work is
    bookkeeping. The verdicts equal verify_positions + decide on each whole round (tested)."""
    if rule.uses_paths and rule.p is None:
        raise ValueError("p = auto calibrates on a run's own prompt before decoding; a server needs p as a number")
    if one_pass:
        return verify_in_one_pass(head, rule, rounds, judge)[0]
    scans = [acceptance.scan(round_.num_drafted, round_.is_exact()) for round_ in rounds]
    reasons: list[tuple[str, ...] | None] = [None] * len(rounds)
    asked = {i: _step(scans[i], None, reasons, i) for i in range(len(rounds))}
    pending = {i: at for i, at in asked.items() if at is not None}
    while pending:  # one pass: the position each unfinished scan asks about, judged in one stacked call
        signals = verifying.verify_stacked(head, rule, rule.p if rule.uses_paths else None,
                                        [rounds[i].piece(at) for i, at in pending.items()], judge)
        ruled = acceptance.rule_reasons(rule, signals)
        asked = {i: _step(scans[i], reason, reasons, i) for i, reason in zip(pending, ruled)}
        pending = {i: at for i, at in asked.items() if at is not None}
    return [Verdict(acceptance.accepted_count(found), found, *round_.emitted_after(found))
            for round_, found in zip(rounds, reasons)]


def _step(steps, reason: str | None, reasons: list, index: int) -> int | None:
    """Advance a scan with the reason of the position it asked about (None: start it); the next position
    it asks about, or None when it ended (its reasons then in reasons[index])."""
    try:
        return next(steps) if reason is None else steps.send(reason)
    except StopIteration as done:
        reasons[index] = done.value
        return None


def verify_in_one_pass(head: verifying.Head, rule: RuleConfig, rounds: list[Round],
                       judge: TrainedJudge | None = None) -> tuple[list[Verdict], list[list[int]]]:
    """verify_greedy with one device-to-host copy: (the verdicts, each round's emitted tokens: its
    accepted drafts, then the token after them, the row a server writes).

    The rule's signals at every drafted position of every round (one verify_stacked call; its
    close-call check without a sync), then one int64 tensor of the rule's check masks, the exact
    test, the target's argmax at every verified position and the drafted tokens, copied at once; the
    scans run on the host over it. The paths are computed at every drafted position, where the
    incremental scan computes them at the positions it reaches: more head rows, no sync per pass.
    The server's own verdict (Round.lossless) is not read: the exact test is computed, the same test."""
    if not rounds:
        return [], []
    signals = verifying.verify_stacked(head, rule, rule.p if rule.uses_paths else None,
                                    [round_.verify_inputs() for round_ in rounds], judge, settle_on_host=False)
    checks = acceptance.rule_checks(rule, signals)
    exact = torch.cat([round_.exact() for round_ in rounds])  # [n]
    parts = [torch.stack([mask for _, mask in checks]).flatten()] if checks else []
    parts += [exact, torch.cat([top_token(round_.clean_logits) for round_ in rounds]),
              torch.cat([round_.draft_tokens for round_ in rounds])]
    host = torch.cat([part.long() for part in parts]).tolist()  # the one copy
    n, c = int(exact.shape[0]), len(checks)
    masks = {name: host[i * n:(i + 1) * n] for i, (name, _) in enumerate(checks)}
    argmax_from = (c + 1) * n
    drafts = host[argmax_from + n + len(rounds):]
    return _host_scans(rounds, masks, host[c * n:argmax_from], host[argmax_from:argmax_from + n + len(rounds)], drafts)


def _host_scans(rounds: list[Round], masks: dict[str, list[int]], exact: list[int], argmax: list[int],
                drafts: list[int]) -> tuple[list[Verdict], list[list[int]]]:
    """Each round's scan over host lists: masks {check: [n]} in the rule's order, exact [n] and drafts
    [n] over the rounds' drafted positions in order, argmax [n + rounds] over their verified positions."""
    verdicts, lines, first = [], [], 0
    for index, round_ in enumerate(rounds):
        g = round_.num_drafted

        reasons = acceptance.run_scan(acceptance.scan(g, lambda i, at=first: bool(exact[at + i])),
                                      lambda i, at=first: acceptance.first_accepting(masks, at + i))
        accepted = acceptance.accepted_count(reasons)
        next_token = argmax[first + index + accepted]  # round `index` starts at first + index there
        verdicts.append(Verdict(accepted, reasons, next_token, BONUS if accepted == g else CORRECTION))
        lines.append(drafts[first:first + accepted] + [next_token])
        first += g
    return verdicts, lines
