"""The rule lab: one run's drafted tokens re-judged under every rule, through the heads only.

From each round's kept states (trace.RoundStates: the target's and the draft's final hidden states, the
lossless test's result) `prepare` recomputes the clean logits and the draft's distributions with the
models' heads, and `rejudge` judges every drafted position under every rule with the engine's own verify
step (every round in one batch): the same drafts and clean target for every rule, without running a
transformer block. A replay with the run's own settings decides exactly as the run did.

The numbers under the matrix are counterfactuals on fixed drafts: what each rule would accept of
these drafts, not what a run with that rule would have drafted next.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch

from .decoding import acceptance
from .decoding.config import LAB_P, ConfigError, RuleConfig
from .decoding.verifying import VerifyInputs, verify
from .decoding.mc_head import mask_seed
from .decoding.causal_lm import CausalLM
from .rule_words import RULE_WORDS, judge_line
from .decoding.sampling import sampling_probs, signal_probs
from .decoding.trace import GenerationTrace
from .decoding.trained_judge import TrainedJudge

LAB_VERSION = 1


def has_states(trace: GenerationTrace | None) -> bool:
    return trace is not None and trace.mode == "sd" and len(trace.states) == len(trace.rounds) > 0


@torch.inference_mode()
def prepare(trace: GenerationTrace, target: CausalLM, draft: CausalLM) -> list[VerifyInputs]:
    """Each round's inputs to the verify step again, from the run's kept states: the clean logits of
    its verified positions (one call per round, as the engine made it) and the draft's distribution
    at each drafting step (one row per call, as the engine made it), so every number is the run's own."""
    if not has_states(trace):
        raise ConfigError("this run kept no states for the rule lab (runs from the app and recorded runs do)")
    prepared = []
    for round_trace, states in zip(trace.rounds, trace.states):
        target_hidden, draft_hidden = states.tensors()
        tokens = torch.tensor([d.token for d in round_trace.drafted], dtype=torch.long, device=target.device)
        if round_trace.draft_source == "ngram":  # prompt lookup: one-hot, as the engine drafted it
            q_signal = q_sample = list(torch.nn.functional.one_hot(tokens, target.vocab_size).float())
        else:
            draft_logits = [draft.logits(row.to(draft.device)) for row in draft_hidden]
            q_signal = [signal_probs(logits, trace.temperature) for logits in draft_logits]
            q_sample = [sampling_probs(logits, trace.temperature, trace.top_p) for logits in draft_logits]
        hidden = target_hidden.to(target.device)
        clean_logits = target.logits(hidden)
        prepared.append(VerifyInputs(
            first_position=states.first_position,
            draft_tokens=tokens,
            q_signal=torch.stack(q_signal) if q_signal else torch.empty(0, target.vocab_size, device=target.device),
            hidden=hidden, clean_logits=clean_logits,
            exact=torch.tensor(states.exact, dtype=torch.bool, device=target.device),
            temperature=trace.temperature, mask_seed=mask_seed(trace.seed, trace.prompt_ids), top_p=trace.top_p,
            draft_source=round_trace.draft_source,
            **_coin_inputs(trace, states, tokens, q_sample, clean_logits),
        ))
    return prepared


def _coin_inputs(trace: GenerationTrace, states, tokens: torch.Tensor, q_sample: list, clean_logits) -> dict:
    """The lossless test's coins and the sampled p(x), q(x) of a sampled round (what the static ensemble
    relaxes), where the run kept its coins; empty otherwise."""
    if trace.temperature == 0.0 or len(states.coins) != len(states.exact) or not states.coins:
        return {}
    index = tokens.unsqueeze(-1)
    p_sample = sampling_probs(clean_logits[: len(states.coins)], trace.temperature, trace.top_p)
    return {"coin": torch.tensor(states.coins, dtype=torch.float32, device=tokens.device),
            "sample_target_prob": p_sample.gather(-1, index).squeeze(-1),
            "sample_draft_prob": torch.stack(q_sample).gather(-1, index).squeeze(-1)}


def rule_lab(services: PairServices, trace: GenerationTrace, settings: RuleConfig) -> dict:
    """The rule lab's matrix (rejudge) for a run's drafts, from its kept states, through its pair's heads."""
    prepared = prepare(trace, services.target, services.draft)
    return rejudge(prepared, services.target, settings, services.token_text, judge=services.judge)


def rules_for(prepared: list[VerifyInputs], judge: TrainedJudge | None) -> tuple[str, ...]:
    """The rules the lab can re-judge these rounds with: those defined under the run's mode (greedy or
    sampled), the judge rules with a judge, the static ensemble only where the run kept its coins."""
    greedy = not prepared or prepared[0].temperature == 0.0
    has_coins = all(rnd.coin is not None for rnd in prepared if rnd.num_drafted)
    return tuple(name for name, rule in acceptance.RULES.items()
                 if ("greedy" if greedy else "sampling") in rule.modes and (judge is not None or not rule.uses_judge)
                 and (greedy or has_coins or not rule.reads_coin))


def lab_settings(trace: GenerationTrace | None, **changes) -> RuleConfig:
    """The lab's knobs as one RuleConfig (its rule field unused): the lossy run's own, whole (its p the
    one it used, a number under p = auto; the lab's p where the run read no paths), else the defaults;
    `changes` (RuleConfig.from_mapping's names) over them; p must be a number here."""
    base = RuleConfig(p=LAB_P)
    if trace is not None and trace.mode == "sd":
        base = dataclasses.replace(trace.rule_config, p=LAB_P if trace.p is None else trace.p)
    settings = RuleConfig.from_mapping(changes, base)
    if settings.p is None:
        raise ConfigError("the rule lab needs a number for p")
    return settings


@torch.inference_mode()
def rejudge(prepared: list[VerifyInputs], target: CausalLM, settings: RuleConfig,
            token_text: Callable[[int], str], rules: tuple[str, ...] | None = None,
            judge: TrainedJudge | None = None) -> dict:
    """The lab's matrix (JSON-ready): one row per drafted token, one cell per rule, and per rule the
    share of drafted tokens it accepts and its acceptance length per round on these drafts. The judge
    rules take part where a trained judge is given (it reads the run's stored hidden states)."""
    start = time.perf_counter()
    rules = rules or rules_for(prepared, judge)
    if judge is not None:
        settings = judge.filled(settings)
    memo: dict = {}
    columns = []  # per rule: per round, (reasons, host signals)
    for name in rules:
        cfg = dataclasses.replace(settings, rule=name)
        column = []
        for verified in verify(target, cfg, prepared, memo=memo, judge=judge):  # every round in one batch
            signals = acceptance.Signals(**{k: None if v is None else v.cpu() for k, v in vars(verified.signals).items()})
            column.append((verified.verdict.reasons, signals))
        columns.append((cfg, column))
    return {
        "version": LAB_VERSION,
        "settings": dict(settings.knobs),  # every knob of the one RuleConfig, as the rules read them
        "rules": [{"name": name, "label": acceptance.RULES[name].label, "lossy": acceptance.RULES[name].lossy}
                  for name in rules],
        "rows": _rows(prepared, columns, token_text),
        "summary": [_summary(cfg.rule, column) for cfg, column in columns],
        "seconds": time.perf_counter() - start,
    }


def _rows(prepared, columns, token_text) -> list[dict]:
    rows = []
    for r, rnd in enumerate(prepared):
        for i, token in enumerate(rnd.draft_tokens.tolist()):
            cells = []
            for cfg, column in columns:
                reasons, signals = column[r]
                reason = reasons[i]
                info = cell_info(cfg, signals, i, reason, token_text)
                if not acceptance.judges_drafts(cfg.rule, rnd.draft_source) and reason != "unchecked":
                    info += "\n" + RULE_WORDS[cfg.rule].lookup_note
                cells.append({"reason": reason, "accepted": reason not in acceptance.NOT_ACCEPTED, "info": info})
            rows.append({"round": r, "slot": i, "token": token, "text": token_text(token), "cells": cells})
    return rows


def _summary(rule: str, column) -> dict:
    drafted = sum(len(reasons) for reasons, _ in column)
    accepted = sum(acceptance.accepted_count(reasons) for reasons, _ in column)
    return {"rule": rule, "drafted": drafted, "accepted": accepted, "share": accepted / drafted if drafted else 0.0,
            "tau": (accepted + len(column)) / len(column) if column else 0.0}


def cell_info(cfg: RuleConfig, signals: acceptance.Signals, i: int, reason: str, token_text) -> str:
    """The numbers the rule read at position i, as a hover line."""
    if reason == "unchecked":
        return "not reached: this rule rejected an earlier token of the round"
    lines = [f"draft q(x) {float(signals.draft_prob[i]):.3f}, target p(x) {float(signals.target_prob[i]):.3f}; "
             f"target's top {token_text(int(signals.target_tokens[i]))!r} ({float(signals.target_token_prob[i]):.3f})"]
    if reason == "exact":
        lines.append("accepted by the lossless test")
    elif RULE_WORDS[cfg.rule].lab_line is not None:
        lines.append(RULE_WORDS[cfg.rule].lab_line(signals, cfg, i))
    if cfg.uses_paths and reason != "exact":
        lines.append(_path_info(cfg, signals, i, token_text))
    if cfg.uses_judge and reason != "exact" and signals.judge_scores is not None:
        lines.append(judge_line(signals, cfg, i))
    return "\n".join(lines)


def _path_info(cfg: RuleConfig, signals: acceptance.Signals, i: int, token_text) -> str:
    if signals.path_tokens is None or int(signals.path_tokens[0, i]) < 0:
        if not bool(acceptance.judged_by_paths(signals, cfg)[i]):
            return "paths not read: the draft is the target's top token (the lossless test decides)"
        return "paths not read: an earlier token of the round could not be accepted"
    paths = " ".join(repr(token_text(int(t))) for t in signals.path_tokens[:, i])
    needed = acceptance.votes_needed(cfg.num_paths, cfg.majority_fraction)
    majority = int(signals.majority_tokens[i])
    majority_text = token_text(majority) if majority >= 0 else "(tie)"
    return (f"paths: {paths}\nJS(draft, centroid) {float(signals.js_draft_centroid[i]):.3f} vs threshold "
            f"{float(signals.js_threshold[i]):.3f}; majority {majority_text!r} {int(signals.majority_votes[i])}/"
            f"{cfg.num_paths} (needs {needed}); draft's votes {int(signals.draft_votes[i])}")


def weights_mismatch(trace: GenerationTrace, computed_by: Callable[[], tuple[str, str, str]]) -> str | None:
    """One line saying why the loaded pair cannot re-judge this run (other weights, device or dtype:
    its decisions would silently differ), or None when it can. computed_by: the loaded engine's
    (weights, device, dtype) (Engine.computed_by). A run written before fingerprints were recorded
    cannot be checked, and is re-judged as it is."""
    if not trace.weights:
        return None
    made, here = (trace.weights, trace.device, trace.dtype), computed_by()
    if made == here:
        return None
    return (f"this run was made with other weights or another dtype (weights {made[0]} on {made[1]}, {made[2]}; "
            f"loaded here: {here[0]} on {here[1]}, {here[2]}): re-verifying it here would not reproduce its "
            "decisions, so the rule lab shows the run's own matrix only.")
