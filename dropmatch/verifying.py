"""The verify step in one place: what every rule reads at a round's drafted positions, the
Monte-Carlo dropout paths where a rule reads them, and the signals they give.

    inputs = VerifyInputs(first_position, draft_tokens, q_signal, hidden, clean_logits, exact, temperature, seed)
    judged = verify_positions(target, rule, p, inputs)
    reasons = acceptance.scan_reasons(rule, judged.signals, exact)

The engine judges each round with `verify_positions` (then `acceptance.decide` draws the extra
token); the rule lab (lab.py) re-judges a run's stored drafts with the very same function, so the
two never differ. `target` is anything with `path_logits(hidden, keep, p, clean_logits)`
(models.CausalLM): the head is the only part of the model a path runs through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from . import acceptance, mc_head
from .acceptance import Signals
from .config import ConfigError
from .trained_judge import TrainedJudge
from .sampling import entropy, fast_js_error, js_divergence, js_divergence_accurate, signal_probs, top_token

PATH_FIELDS = ("path_tokens", "js_draft_centroid", "js_threshold", "majority_tokens", "majority_votes", "draft_votes")


class Head(Protocol):
    def path_logits(self, hidden: torch.Tensor, keep: torch.Tensor, p: float,
                    clean_logits: torch.Tensor) -> torch.Tensor: ...

    def support_path_logits(self, hidden: torch.Tensor, keep: torch.Tensor, p: float, clean_logits: torch.Tensor,
                            support: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class VerifyInputs:
    """One round's drafted positions as the verify step reads them.

    draft_tokens [g] at sequence positions first_position + i; q_signal [g, V] the draft's smooth
    distributions; hidden [g + 1, H] and clean_logits [g + 1, V] the target's at the verified
    positions; exact [g] bool the lossless test; temperature of the run (0: greedy); mask_seed keys
    the dropout masks (with each position)."""

    first_position: int
    draft_tokens: torch.Tensor
    q_signal: torch.Tensor
    hidden: torch.Tensor
    clean_logits: torch.Tensor
    exact: torch.Tensor
    temperature: float
    mask_seed: int
    # Under sampling, the lossless test's coin [g] and the sampled p(x), q(x) [g] (acceptance.LosslessTest):
    # what the static ensemble relaxes. None when greedy, or where a caller does not keep them.
    coin: torch.Tensor | None = None
    sample_target_prob: torch.Tensor | None = None
    sample_draft_prob: torch.Tensor | None = None

    @property
    def num_drafted(self) -> int:
        return int(self.draft_tokens.shape[0])


@dataclass
class VerifiedPositions:
    """What a rule read at a round's g drafted positions: signals (path fields filled where the paths
    were computed), p_signal [g, V] the clean target's smooth distributions, the path rows computed,
    [(positions [m], path probs [K, m, V], support [m, S] or None)] (on a support, V is S + 1, the
    last column the other tokens' mass), and the Monte-Carlo time."""

    signals: Signals
    p_signal: torch.Tensor
    path_rows: int
    path_probs: list
    t_mc: float


# ---------------------------------------------------------------- signals (pure)


def position_signals(draft_tokens: torch.Tensor, q_draft: torch.Tensor, p_target: torch.Tensor,
                     paths: mc_head.PathStats | None = None, settle_on_host: bool = True) -> Signals:
    """draft_tokens [g]; q_draft, p_target [g, V] smooth distributions; paths over [K, g, V];
    settle_on_host: settle_close_calls's."""
    index = draft_tokens.unsqueeze(-1)
    target_tokens = top_token(p_target)
    signals = dict(
        draft_tokens=draft_tokens,
        target_tokens=target_tokens,
        draft_prob=q_draft.gather(-1, index).squeeze(-1),
        target_prob=p_target.gather(-1, index).squeeze(-1),
        target_token_prob=p_target.gather(-1, target_tokens.unsqueeze(-1)).squeeze(-1),
    )
    draft_entropy, target_entropy = entropy(q_draft), entropy(p_target)
    signals.update(js_draft_target=js_divergence(q_draft, p_target, draft_entropy, target_entropy),
                   target_entropy=target_entropy, target_top3_entropy=top3_entropy(p_target))
    signals.update(runner_up(p_target))
    if paths is not None:
        # At p = 0 (PathStats.of_clean_row) the centroid is p_target itself: the divergence just computed.
        known = signals["js_draft_target"] if paths.centroid is p_target else None
        signals.update(path_signals(draft_tokens, q_draft, paths, draft_entropy, known, settle_on_host))
    return Signals(**signals)


def runner_up(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """probs [g, V] -> target_runner_up [g] (each row's second likeliest token) and target_margin [g], its
    probability over the top token's (in (0, 1]; 1 when the two tie). The margin rule reads them."""
    top = probs.topk(2, dim=-1)
    return {"target_runner_up": top.indices[..., 1],
            "target_margin": top.values[..., 1] / top.values[..., 0].clamp_min(1e-30)}


def top3_entropy(probs: torch.Tensor) -> torch.Tensor:
    """probs [..., V] -> -sum p log p over each row's three likeliest tokens [...] (FLy's gate, its
    `calculate_topk_entropy(logits, 3)`; the probabilities are not renormalised, as there)."""
    top = probs.topk(min(3, probs.shape[-1]), dim=-1).values
    return -(top * top.clamp_min(1e-30).log()).sum(-1)


def votes(path_tokens: torch.Tensor, draft_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """path_tokens [K, m], draft_tokens [m] -> majority_tokens [m] (the token most paths chose; -1
    when two tokens tie at the top: a tie never picks by token id), majority_votes [m], draft_votes [m]."""
    per_path = (path_tokens.unsqueeze(0) == path_tokens.unsqueeze(1)).sum(1)  # [K, m]: votes of path k's token
    top_votes = per_path.max(0).values
    at_top = per_path == top_votes
    lowest = torch.where(at_top, path_tokens, torch.iinfo(torch.long).max).min(0).values
    highest = torch.where(at_top, path_tokens, -1).max(0).values
    return dict(
        majority_tokens=torch.where(lowest == highest, lowest, -1),
        majority_votes=top_votes,
        draft_votes=(path_tokens == draft_tokens.unsqueeze(0)).sum(0),
    )


def path_signals(draft_tokens: torch.Tensor, q_draft: torch.Tensor, paths: mc_head.PathStats,
                 draft_entropy: torch.Tensor | None = None,
                 js_draft_centroid: torch.Tensor | None = None, settle_on_host: bool = True) -> dict[str, torch.Tensor]:
    """The path fields of Signals for m positions: draft_tokens [m], q_draft [m, V], paths over [K, m, V]
    (on a reduced support the draft's distribution is reduced the same way before the divergence).
    What the caller computed already over the full vocabulary: draft_entropy [m] H(q_draft), and
    js_draft_centroid [m] (the centroid being a distribution it compared q_draft with)."""
    if paths.support is not None:
        q_draft, draft_entropy = mc_head.reduce_to_support(q_draft, paths.support), None
    if js_draft_centroid is None:
        js_draft_centroid = js_divergence(q_draft, paths.centroid, draft_entropy)
    js_draft_centroid, threshold = settle_close_calls(q_draft, paths, js_draft_centroid, settle_on_host)
    return dict(
        path_tokens=paths.tokens,
        js_draft_centroid=js_draft_centroid,
        js_threshold=threshold,
        **votes(paths.tokens, draft_tokens),
    )


def settle_close_calls(q_draft: torch.Tensor, paths: mc_head.PathStats, js_draft_centroid: torch.Tensor,
                       on_host: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(JS(q || centroid) [m], the threshold max_i JS(p_i || centroid) [m]), both again with
    js_divergence_accurate where the fast values lie closer than the fast form's error bound
    (sampling.fast_js_error): float32 cancellation can then not flip the JS rule's comparison.
    on_host: the close positions are found on the host (a sync), and only they recomputed; else
    every position is, and the close ones picked on the device (the same values, no sync)."""
    threshold = paths.threshold
    is_close = (js_draft_centroid - threshold).abs() <= fast_js_error(paths.centroid.shape[-1])
    if not on_host:
        accurate_js = js_divergence_accurate(q_draft, paths.centroid).to(js_draft_centroid.dtype)
        accurate_threshold = js_divergence_accurate(paths.probs, paths.centroid.unsqueeze(0)).max(0).values
        return (torch.where(is_close, accurate_js, js_draft_centroid),
                torch.where(is_close, accurate_threshold.to(threshold.dtype), threshold))
    close = is_close.nonzero().flatten()
    if close.numel() == 0:
        return js_draft_centroid, threshold
    js_draft_centroid, threshold = js_draft_centroid.clone(), threshold.clone()
    centroid = paths.centroid[close]
    js_draft_centroid[close] = js_divergence_accurate(q_draft[close], centroid).to(js_draft_centroid.dtype)
    path_js = js_divergence_accurate(paths.probs[:, close], centroid.unsqueeze(0))  # [K, c]
    threshold[close] = path_js.max(0).values.to(threshold.dtype)
    return js_draft_centroid, threshold


def at_positions(signals: Signals, positions: torch.Tensor) -> Signals:
    """The signals of some positions only (index [m] into the g drafted positions)."""
    fields = {}
    for name, value in vars(signals).items():
        if value is None:
            fields[name] = None
        else:
            fields[name] = value[:, positions] if name == "path_tokens" else value[positions]
    return Signals(**fields)


def with_path_parts(signals: Signals, parts: list[tuple[torch.Tensor, dict[str, torch.Tensor]]],
                    num_paths: int) -> Signals:
    """Signals whose path fields are filled at the positions of each (positions [m], path fields)
    part; elsewhere path tokens are -1, JS values NaN and votes 0, which no rule accepts."""
    g = signals.draft_tokens.shape[0]
    like = signals.draft_tokens
    full = {
        "path_tokens": like.new_full((num_paths, g), -1),
        "js_draft_centroid": signals.js_draft_target.new_full((g,), float("nan")),
        "js_threshold": signals.js_draft_target.new_full((g,), float("nan")),
        "majority_tokens": like.new_full((g,), -1),
        "majority_votes": like.new_zeros(g),
        "draft_votes": like.new_zeros(g),
    }
    for positions, part in parts:
        for name in PATH_FIELDS:
            if name == "path_tokens":
                full[name][:, positions] = part[name].to(full[name].dtype)
            else:
                full[name][positions] = part[name].to(full[name].dtype)
    return Signals(**{**vars(signals), **full})


# ---------------------------------------------------------------- the verify step


def verify_positions(target: Head, rule, p: float | None, inputs: VerifyInputs,
                    clock: Callable[[], float] | None = None, memo: dict | None = None,
                    judge: TrainedJudge | None = None) -> VerifiedPositions:
    """Everything `rule` (a config.RuleConfig) reads at one round's drafted positions, its paths
    included, at dropout rate p (None when the rule reads no paths).

    clock: a function giving seconds (synchronised with the device) that times the Monte-Carlo work
    (and the trained judge's, which is part of the verify step). memo: what was computed already for
    these positions (the signals; the paths by K, p and centroid): the lab judges several rules on the
    same positions and computes each once. judge: the trained judge, for the rules that read it."""
    p_signal, signals = _signals(inputs, memo)
    start = clock() if clock else 0.0
    if rule.uses_judge:
        signals = with_judge_scores(signals, inputs.hidden[1 : inputs.num_drafted + 1], judge)
    path_rows, path_probs = 0, []
    if rule.uses_paths and inputs.num_drafted > 0:
        signals, path_rows, path_probs = _checked_paths(target, inputs, signals, rule, p, memo)
    t_mc = clock() - start if clock else 0.0
    return VerifiedPositions(signals, p_signal, path_rows, path_probs, t_mc)


def with_judge_scores(signals: Signals, hidden_after: torch.Tensor, judge: TrainedJudge | None) -> Signals:
    """The signals of n drafted tokens with the trained judge's score of each, from hidden_after [n, H],
    the target's hidden state on reading it (VerifyInputs.hidden[i + 1] for drafted token i: AutoJudge's
    features); ConfigError (one line) without a judge."""
    if judge is None:
        raise ConfigError("the judge rules need a trained judge for this target; only the embedded pair has one")
    return Signals(**{**vars(signals), "judge_scores": judge.scores(hidden_after)})


def _signals(inputs: VerifyInputs, memo: dict | None) -> tuple[torch.Tensor, Signals]:
    """(p_signal [g, V], the signals every rule reads), memoised per round."""
    key = ("signals", inputs.first_position, inputs.num_drafted)
    if memo is not None and key in memo:
        return memo[key]
    p_signal = signal_probs(inputs.clean_logits[: inputs.num_drafted], inputs.temperature)
    signals = position_signals(inputs.draft_tokens, inputs.q_signal, p_signal)
    signals = Signals(**{**vars(signals), "exact": inputs.exact, "coin": inputs.coin,
                         "sample_target_prob": inputs.sample_target_prob, "sample_draft_prob": inputs.sample_draft_prob})
    found = p_signal, signals
    if memo is not None:
        memo[key] = found
    return found


def _checked_paths(target: Head, inputs: VerifyInputs, signals: Signals, rule, p: float, memo: dict | None):
    """Monte-Carlo paths only where the rule will read them: at the drafted positions it judges
    (acceptance.judged_by_paths: the exact test rejected them, and, by default, they are not the
    clean target's top token) that can still be reached, left to right, until the rule rejects one.
    A position is out of reach after a position that nothing can accept (the exact test rejected it
    and the rule does not judge it) or after the rule's first rejection; its path fields stay empty,
    so a view shows path data only where a rule read it.

    Stage 1 runs the K rows of the first such position; only when the rule accepts it, stage 2
    runs all the later ones at once. Usually one stage of K rows instead of K x (gamma + 1).
    At p = 0 every path is the clean row: its statistics come from that one row, no path work.
    Returns (signals with the path fields filled where read, path rows computed, [(positions, probs)]).
    """
    judged = reachable_judged(inputs.exact, acceptance.judged_by_paths(signals, rule))
    parts, probs, rows = [], [], 0
    for stage in (judged[:1], judged[1:]):
        if stage.numel() == 0:
            break
        stats, part = _stage_paths(target, inputs, signals, rule, p, stage, memo)
        rows += 0 if p == 0.0 else rule.num_paths * int(stage.numel())
        checked = Signals(**{**vars(at_positions(signals, stage)), **part})
        accepted = acceptance.rule_accepts(rule, checked)
        read = int(accepted.numel()) if bool(accepted.all()) else int((~accepted).nonzero()[0]) + 1
        parts.append((stage[:read], {name: value[:, :read] if name == "path_tokens" else value[:read]
                                     for name, value in part.items()}))
        probs.append((stage[:read], stats.probs[:, :read], None if stats.support is None else stats.support[:read]))
        if read < stage.numel() or not bool(accepted.all()):
            break
    return with_path_parts(signals, parts, rule.num_paths), rows, probs


def reachable_judged(exact: torch.Tensor, judged: torch.Tensor) -> torch.Tensor:
    """Indices [m] of the positions the rule judges (judged [g] bool, where exact [g] is False) that
    lie before the first position nothing can accept (neither exact nor judged)."""
    blocked = ~exact & ~judged
    end = int(blocked.nonzero()[0]) if bool(blocked.any()) else int(exact.numel())
    return (~exact[:end] & judged[:end]).nonzero().flatten()


def _stage_paths(target: Head, inputs: VerifyInputs, signals: Signals, rule, p: float, stage: torch.Tensor,
                 memo: dict | None) -> tuple[mc_head.PathStats, dict[str, torch.Tensor]]:
    """The paths' stats and path signals at the drafted positions `stage` [m], memoised."""
    positions = [inputs.first_position + i for i in stage.tolist()]
    key = _paths_key(inputs, positions, rule, p)
    if memo is not None and key in memo:
        return memo[key]
    support = None
    if rule.path_support and p != 0.0:  # a labelled approximation: the paths score a few tokens, not V
        support = mc_head.path_support(inputs.clean_logits[stage], inputs.q_signal[stage], inputs.draft_tokens[stage],
                                       rule.path_support)
    stats = path_stats_at(target, inputs.hidden[stage], inputs.clean_logits[stage], rule, p, inputs.temperature,
                          [(inputs.mask_seed, position) for position in positions], support)
    found = stats, path_signals(signals.draft_tokens[stage], inputs.q_signal[stage], stats)
    if memo is not None:
        memo[key] = found
    return found


def _paths_key(inputs: VerifyInputs, positions: list[int], rule, p: float) -> tuple:
    # A sequence position recurs in the next round (after a rejection): the round's first position is in the key.
    return ("paths", inputs.first_position, tuple(positions), rule.num_paths, p, rule.centroid, rule.mask_draw)


# ---------------------------------------------------------------- many sequences at once (a serving batch)


def verify_stacked(target: Head, rule, p: float | None, batch: list[VerifyInputs],
                  judge: TrainedJudge | None = None, settle_on_host: bool = True) -> Signals:
    """The signals at every drafted position of every input, stacked in order ([n], n the inputs'
    drafted positions together), the paths (when the rule reads them) at all of them in one head
    pass, each position with its own sequence's masks (mask_seed, position): the values
    verify_positions gives each position it judges, whatever else is in the batch (tested).
    settle_on_host False: no host copy (settle_close_calls).

    No stages: a server's pieces are each one position the exact test rejected (serving/verify.py),
    where the rule reads its paths anyway; verifying a batch in one pass is what makes it cheap."""
    draft_tokens = torch.cat([inputs.draft_tokens for inputs in batch])
    q_signal = torch.cat([inputs.q_signal for inputs in batch])
    clean_logits = torch.cat([inputs.clean_logits[: inputs.num_drafted] for inputs in batch])
    temperature = _one_temperature(batch)
    p_signal = signal_probs(clean_logits, temperature)
    paths = None
    if rule.uses_paths and draft_tokens.numel():
        hidden = torch.cat([inputs.hidden[: inputs.num_drafted] for inputs in batch])
        keys = [(inputs.mask_seed, inputs.first_position + i) for inputs in batch for i in range(inputs.num_drafted)]
        support = None
        if rule.path_support and p != 0.0:  # as _stage_paths: the labelled approximation, row by row
            support = mc_head.path_support(clean_logits, q_signal, draft_tokens, rule.path_support)
        paths = path_stats_at(target, hidden, clean_logits, rule, p, temperature, keys, support, p_signal)
    signals = position_signals(draft_tokens, q_signal, p_signal, paths, settle_on_host)
    signals = Signals(**{**vars(signals), "exact": torch.cat([inputs.exact for inputs in batch])})
    if rule.uses_judge:
        hidden_after = torch.cat([inputs.hidden[1 : inputs.num_drafted + 1] for inputs in batch])
        signals = with_judge_scores(signals, hidden_after, judge)
    return signals


def _one_temperature(batch: list[VerifyInputs]) -> float:
    temperatures = {inputs.temperature for inputs in batch}
    if len(temperatures) > 1:
        raise ValueError(f"one stacked verify step reads one temperature, got {sorted(temperatures)}")
    return temperatures.pop() if temperatures else 0.0


def path_stats_at(target: Head, hidden: torch.Tensor, clean_logits: torch.Tensor, rule, p: float,
                  temperature: float, keys: list[tuple[int, int]], support: torch.Tensor | None = None,
                  clean_probs: torch.Tensor | None = None) -> mc_head.PathStats:
    """PathStats over [K, n, V] of n positions (hidden [n, H], clean_logits [n, V]; keys [n] of
    (mask_seed, sequence position) key their dropout masks); over [K, n, S + 1] when support [n, S]
    names the tokens the paths score (mc_head.path_support). clean_probs [n, V]: signal_probs of
    clean_logits when the caller has it (p = 0 reads it as every path's distribution)."""
    if p == 0.0:  # every path is the clean row
        clean_probs = signal_probs(clean_logits, temperature) if clean_probs is None else clean_probs
        return mc_head.PathStats.of_clean_row(clean_logits, clean_probs, rule.num_paths)
    keep = mc_head.keyed_masks(keys, rule.num_paths, p, hidden.shape[-1], hidden.device, hidden.dtype, rule.mask_draw)
    if support is None:
        return mc_head.path_stats(target.path_logits(hidden, keep, p, clean_logits), temperature, rule.centroid)
    path_logits = target.support_path_logits(hidden, keep, p, clean_logits, support)
    tail = mc_head.tail_log_mass(clean_logits, support, temperature)
    return mc_head.path_stats(path_logits, temperature, rule.centroid, support=support, tail=tail)
