"""The method's definition as a test oracle: a round decided from every position's signals at once, then the
scan (no scheduling, no staging). The product decides through verifying.verify only; tests compare it with
this definition for every rule, greedy and sampled (tests/test_serving.py), and the rule unit tests read
their hand-made signals through it."""

from __future__ import annotations

import dataclasses

import torch

from dropmatch.acceptance import (RULES, RuleKnobs, Signals, Verdict, accepted_count, extra_token, first_accepting,
                                  lossless_test, rule_accepts, rule_checks, run_scan, scan)
from dropmatch.sampling import draw


def decide(
    cfg: RuleKnobs,
    greedy: bool,
    signals: Signals,
    q_sample: torch.Tensor,
    p_sample: torch.Tensor,
    generator: torch.Generator,
    exact: torch.Tensor | None = None,
) -> Verdict:
    """q_sample [g, V], p_sample [g + 1, V]: the distributions tokens are drawn from.
    exact [g]: the lossless test's result when the caller computed it already."""
    draft_tokens = signals.draft_tokens
    num_drafted = int(draft_tokens.shape[0])
    if exact is None:  # the lossless test, run here: the rules that read it (its coin, its window) see it
        test = lossless_test(draft_tokens, q_sample, p_sample[:num_drafted], greedy, generator)
        exact = test.exact
        signals = dataclasses.replace(signals, exact=exact, coin=test.coin, sample_target_prob=test.p_x,
                                      sample_draft_prob=test.q_x)
    elif signals.exact is None:
        signals = dataclasses.replace(signals, exact=exact)
    replaced = RULES[cfg.rule].replaces_exact(signals, cfg, greedy) if RULES[cfg.rule].replaces_exact else None
    if replaced is not None:  # the rule's own test decides there: it accepts, else rejects (the coin's verdict aside)
        exact = torch.where(replaced, exact & rule_accepts(cfg, signals), exact)
    reasons = scan_reasons(cfg, signals, exact)
    num_accepted = accepted_count(reasons)
    if replaced is not None and num_accepted < num_drafted and bool(replaced[num_accepted]):
        return Verdict(num_accepted, reasons, _own_correction(signals, num_accepted, p_sample, greedy, generator),
                       "correction")
    return Verdict(num_accepted, reasons, *extra_token(num_accepted, num_drafted, q_sample, p_sample, generator, greedy))


def _own_correction(signals: Signals, at: int, p_sample: torch.Tensor, greedy: bool, generator) -> int:
    """A rejection the rule's own test made: greedy, the top of its own rows (else the target's argmax);
    sampling, a draw from p (no coin decided there, so no residual)."""
    if greedy:
        return int(signals.rule_top[at]) if signals.rule_top is not None else int(p_sample[at].argmax())
    return int(draw(p_sample[at], generator))


def scan_reasons(cfg: RuleKnobs, signals: Signals, exact: torch.Tensor) -> tuple[str, ...]:
    """The reason of each drafted position [g] (scan, with the rule's reasons of every position)."""
    num_drafted = int(signals.draft_tokens.shape[0])
    ruled = rule_reasons(cfg, signals) if num_drafted else []
    exact_list = exact.tolist()
    return run_scan(scan(num_drafted, exact_list.__getitem__), ruled.__getitem__)


def rule_reasons(cfg: RuleKnobs, signals: Signals) -> list[str]:
    """What the rule says of each position [g] by itself, the exact test aside: the reason of its
    first accepting check, else "rejected"."""
    num_drafted = int(signals.draft_tokens.shape[0])
    checks = rule_checks(cfg, signals)
    if not checks or not num_drafted:
        return ["rejected"] * num_drafted
    accepted = torch.stack([mask for _, mask in checks]).tolist()  # [checks][g]: one host copy for all checks
    rows = dict(zip([name for name, _ in checks], accepted))
    return [first_accepting(rows, i) for i in range(num_drafted)]


