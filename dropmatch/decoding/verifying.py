"""The verify step in one place: what every rule reads at a round's drafted positions, the
Monte-Carlo dropout paths where a rule reads them, the scan and the emitted tokens.

    inputs = VerifyInputs(first_position, draft_tokens, q_signal, hidden, clean_logits, exact, temperature, seed)
    verified, = verify(target, rule, [inputs])
    verified.verdict.reasons, verified.emitted

`verify` is the one verification function: the engine calls it with a batch of one each round, the
rule lab with each stored round, the vLLM plugin with a server step's requests; so none can decide
differently. `target` is anything with `path_logits(hidden, keep, p, clean_logits)`
(models.CausalLM, the plugin's VllmHead): the head is the only part of the model a path runs through.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

import torch

from . import acceptance, mc_head
from .acceptance import BONUS, CORRECTION, ConfigError, Signals, Verdict
from .timing import PhaseTimer
from .trained_judge import TrainedJudge
from .sampling import (entropy, fast_js_error, js_divergence, js_divergence_accurate, sampling_probs, scaled_logits,
                       signal_probs, top_token)

PATH_FIELDS = ("path_tokens", "js_draft_centroid", "js_threshold", "majority_tokens", "majority_votes", "draft_votes")


class Head(Protocol):
    def path_logits(self, hidden: torch.Tensor, keep: torch.Tensor, p: float,
                    clean_logits: torch.Tensor) -> torch.Tensor: ...


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
    # Under sampling, the distributions the extra token is drawn from: the draft's q_sample [g, V] and the
    # target's p_sample [g + 1, V] (temperature and top-p); None where a caller needs reasons only (the lab).
    q_sample: torch.Tensor | None = None
    p_sample: torch.Tensor | None = None
    top_p: float = 1.0  # the run's nucleus: under sampling MARS and FLy read the target as its sampler processes it
    draft_source: str = "model"  # who drafted the round: "model" or "ngram" (a rule may not judge lookup drafts)

    @property
    def num_drafted(self) -> int:
        return int(self.draft_tokens.shape[0])


@dataclass
class Verified:
    """One request's verification (verify). verdict: acceptance.Verdict (num_accepted, reasons [g], the
    extra token and its kind; next_token -1 under sampling where the caller gave no q_sample / p_sample);
    emitted: the accepted drafts then the extra token (the row a server writes); signals [g] on the
    device, path fields filled where the paths were computed; p_signal [g, V] the clean target's smooth
    distributions; path_rows: the head rows the paths cost; path_probs [(slots [m], probs [K, m, V])]."""

    verdict: Verdict
    emitted: list[int]
    signals: Signals
    p_signal: torch.Tensor
    path_rows: int
    path_probs: list


# ---------------------------------------------------------------- signals (pure)


def position_signals(draft_tokens: torch.Tensor, q_draft: torch.Tensor, p_target: torch.Tensor,
                     paths: mc_head.PathStats | None = None, target_logits: torch.Tensor | None = None,
                     temperature: float = 0.0) -> Signals:
    """draft_tokens [g]; q_draft, p_target [g, V] smooth distributions; paths over [K, g, V];
    target_logits [g, V] the clean target's at the run's temperature (MARS reads their ratio)."""
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
    # MARS's runner-up: the argmax with the top token masked out (on tied top values the other tied token, as
    # 5SSjw/MARS's top-2 and SecureSD's port take it), over the logits where given.
    ranked = (p_target if target_logits is None else target_logits).float()
    signals["target_runner_up"] = top_token(ranked.scatter(-1, target_tokens.unsqueeze(-1), float("-inf")))
    if target_logits is not None:
        signals["target_logit_ratio"] = logit_ratio(target_logits, temperature)
    if paths is not None:
        # At p = 0 (PathStats.of_clean_row) the centroid is p_target itself: the divergence just computed.
        known = signals["js_draft_target"] if paths.centroid is p_target else None
        signals.update(path_signals(draft_tokens, q_draft, paths, draft_entropy, known))
    return Signals(**signals)


def logit_ratio(logits: torch.Tensor, temperature: float = 0.0) -> torch.Tensor:
    """logits [g, V] -> [g] z2' / (z1' + 1e-10) over each row's two largest processed logits z' = z / T (greedy:
    z), MARS's r (5SSjw/MARS evaluate_posterior, after its temperature warper). Float32 whatever the dtype.
    Top-p, its next processor, only removes tokens (with_processed_target: the runner-up it removed)."""
    top = scaled_logits(logits.float().topk(2, dim=-1).values, temperature)
    return top[..., 1] / (top[..., 0] + 1e-10)


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
    """The path fields of Signals for m positions: draft_tokens [m], q_draft [m, V], paths over [K, m, V].
    What the caller computed already over the full vocabulary: draft_entropy [m] H(q_draft), and
    js_draft_centroid [m] (the centroid being a distribution it compared q_draft with)."""
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
    close = is_close.nonzero().flatten() if on_host else slice(None)  # [c] the positions recomputed
    if on_host and close.numel() == 0:
        return js_draft_centroid, threshold
    centroid = paths.centroid[close]
    accurate_js = js_divergence_accurate(q_draft[close], centroid).to(js_draft_centroid.dtype)
    path_js = js_divergence_accurate(paths.probs[:, close], centroid.unsqueeze(0))  # [K, c]
    accurate_threshold = path_js.max(0).values.to(threshold.dtype)
    if not on_host:
        return (torch.where(is_close, accurate_js, js_draft_centroid),
                torch.where(is_close, accurate_threshold, threshold))
    js_draft_centroid, threshold = js_draft_centroid.clone(), threshold.clone()
    js_draft_centroid[close], threshold[close] = accurate_js, accurate_threshold
    return js_draft_centroid, threshold


def _along(name: str, positions: torch.Tensor | slice) -> tuple | torch.Tensor | slice:
    """The index of some drafted positions in the Signals field `name`: path_tokens [K, g] along its second axis."""
    return (slice(None), positions) if name == "path_tokens" else positions


def at_positions(signals: Signals, positions: torch.Tensor | slice) -> Signals:
    """The signals of some positions only (index [m] into the g drafted positions, or a slice of them)."""
    return Signals(**{name: None if value is None else value[_along(name, positions)]
                      for name, value in vars(signals).items()})


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
            full[name][_along(name, positions)] = part[name].to(full[name].dtype)
    return Signals(**{**vars(signals), **full})


# ---------------------------------------------------------------- the verify step


def verify(head: Head, rule, batch: list[VerifyInputs], *, staged: bool = True,
           judge: TrainedJudge | None = None, generator: torch.Generator | None = None,
           timer: PhaseTimer | None = None, memo: dict | None = None) -> list[Verified]:
    """The one verification step: a batch of requests' drafted positions in, per request one reason
    per drafted slot and the emitted tokens out. A slot's reason: "exact" (the lossless test accepted it:
    greedy, it is the target's argmax; sampling, the coin u < p(x) / q(x)), the name of the rule's check
    that accepted a draft the lossless test rejected (acceptance.REASONS), "rejected" (the first slot none
    accepts; the scan stops there) or "unchecked" (after it, never read); then the correction at the
    rejection (greedy: the target's argmax; sampling: a draw from the residual norm(max(0, p - q)), so the
    lossless part keeps the target's law) or the bonus after an all-accepted round.

    rule: a config.RuleConfig, every auto knob resolved (its p a number where it reads paths). staged: the
    Monte-Carlo paths only where the rule reads them, in two stacked head passes (the first judged
    slot of every request, then, where the rule accepted it, every later reachable one): fewer head
    rows, a host sync per stage. staged False: the paths at every drafted slot in one pass and no host
    read before the one copy the scans read (a device where each sync costs; its path fields are then
    filled at slots no rule read). judge: the trained judge of the judge rules. generator: the draws
    of a sampled run's extra token (its inputs then carry q_sample and p_sample). timer: marks
    "mc_start" and "mc_end" around the Monte-Carlo and trained-judge work (timing.PhaseTimer). memo:
    what an earlier call on the same batch computed (the rule lab judges many rules on one round)."""
    if not batch:
        return []
    assert not rule.uses_paths or rule.p is not None, "p = auto is resolved into the rule at a run's start"
    _check_shapes(batch)
    temperature = _one_temperature(batch)
    spans = _spans(batch)
    rows, p_signal, signals = _stacked(batch, temperature, memo)
    signals = with_rule_top(signals, rule, p_signal, rows.q_signal)
    if timer is not None:
        timer.mark("mc_start")
    if rule.uses_judge:
        signals = with_judge_scores(signals, _cat([inputs.hidden[1: inputs.num_drafted + 1] for inputs in batch]),
                                    judge)
    paths = _PathWork([], [0] * len(batch), [[] for _ in batch])
    if rule.uses_paths and spans[-1][1] > 0:
        fill = _staged_paths if staged else _paths_everywhere
        fill(paths, head, rows, spans, signals, rule, temperature, memo)
        signals = with_path_parts(signals, paths.parts, rule.num_paths)
    if timer is not None:
        timer.mark("mc_end")
    verdicts = _scans(rule, batch, spans, signals, generator, _judged_rounds(rule, batch))
    return [Verified(verdict, emitted, at_positions(signals, slice(a, b)), p_signal[a:b], rows, probs)
            for (verdict, emitted), (a, b), rows, probs in zip(verdicts, spans, paths.rows, paths.probs)]


@dataclass
class _PathWork:
    """The paths a verify step computed: parts [(stacked positions [m], path fields)] where read, and
    per request its head rows and [(its positions [m], probs [K, m, V])]."""

    parts: list
    rows: list[int]
    probs: list[list]


def _check_shapes(batch: list[VerifyInputs]) -> None:
    for inputs in batch:
        g, vocab = inputs.num_drafted, inputs.clean_logits.shape[-1]
        assert inputs.draft_tokens.dim() == 1, "draft_tokens is [g]"
        assert inputs.q_signal.shape == (g, vocab), f"q_signal is [g, V] = [{g}, {vocab}]"
        assert inputs.hidden.shape[0] == g + 1 and inputs.clean_logits.shape[0] == g + 1, "g + 1 verified rows"
        assert inputs.exact.shape == (g,) and inputs.exact.dtype == torch.bool, "exact is [g] bool"
        for name in ("coin", "sample_target_prob", "sample_draft_prob"):
            assert getattr(inputs, name) is None or getattr(inputs, name).shape == (g,), f"{name} is [g]"
        assert inputs.q_sample is None or inputs.q_sample.shape == (g, vocab), "q_sample is [g, V]"
        assert inputs.p_sample is None or inputs.p_sample.shape == (g + 1, vocab), "p_sample is [g + 1, V]"


def _spans(batch: list[VerifyInputs]) -> list[tuple[int, int]]:
    """Each request's [start, end) in the stacked drafted positions."""
    ends = list(accumulate(inputs.num_drafted for inputs in batch))
    return list(zip([0, *ends], ends))


def with_judge_scores(signals: Signals, hidden_after: torch.Tensor, judge: TrainedJudge | None) -> Signals:
    """The signals of n drafted tokens with the trained judge's score of each, from hidden_after [n, H],
    the target's hidden state on reading it (VerifyInputs.hidden[i + 1] for drafted token i: AutoJudge's
    features); ConfigError (one line) without a judge."""
    if judge is None:
        raise ConfigError("the judge rules need a trained judge for this target; only the embedded pair has one")
    return Signals(**{**vars(signals), "judge_scores": judge.scores(hidden_after)})


@dataclass(frozen=True)
class _Rows:
    """The batch's n drafted slots, stacked once per verify step: hidden [n, H] and clean_logits [n, V]
    (the target's rows before each drafted token), q_signal [n, V], and per slot its key (mask_seed,
    sequence position, the round's first position): the first two key its masks; a sequence position
    recurs in the next round (after a rejection), hence the third in a memo key."""

    hidden: torch.Tensor
    clean_logits: torch.Tensor
    q_signal: torch.Tensor
    keys: list[tuple[int, int, int]]


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat, without the copy for a batch of one (the engine's every round)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _stacked(batch: list[VerifyInputs], temperature: float, memo: dict | None) -> tuple[_Rows, torch.Tensor, Signals]:
    """(the stacked rows, p_signal [n, V], the signals every rule reads [n]) over the batch's drafted
    positions, memoised (the rule lab verifies one batch under many rules)."""
    key = ("signals", tuple((inputs.first_position, inputs.num_drafted, inputs.mask_seed) for inputs in batch))
    if memo is not None and key in memo:
        return memo[key]
    rows = _Rows(_cat([inputs.hidden[: inputs.num_drafted] for inputs in batch]),
                 _cat([inputs.clean_logits[: inputs.num_drafted] for inputs in batch]),
                 _cat([inputs.q_signal for inputs in batch]),
                 [(inputs.mask_seed, inputs.first_position + i, inputs.first_position)
                  for inputs in batch for i in range(inputs.num_drafted)])
    p_signal = signal_probs(rows.clean_logits, temperature)
    signals = position_signals(_cat([inputs.draft_tokens for inputs in batch]), rows.q_signal, p_signal,
                               target_logits=rows.clean_logits, temperature=temperature)
    signals = with_processed_target(signals, batch, _spans(batch), temperature)
    lossless = {name: _cat_or_none(batch, name) for name in ("exact", "coin", "sample_target_prob", "sample_draft_prob")}
    found = rows, p_signal, Signals(**{**vars(signals), **lossless})
    if memo is not None:
        memo[key] = found
    return found


def with_processed_target(signals: Signals, batch: list[VerifyInputs], spans, temperature: float) -> Signals:
    """Under sampling with top-p < 1, the rivals' target signals read as the sampler processes the target
    (temperature, then top-p): FLy's top-3 entropy on the processed probabilities (vLLM's); MARS's runner-up
    -1 where top-p removed it (5SSjw/MARS takes its top two after its processors; there only the top token has
    mass, and its relaxation decides as its exact test would), so that neither accepts a token the run's own
    sampler forbids."""
    if temperature == 0.0 or all(inputs.top_p >= 1.0 for inputs in batch):
        return signals
    entropy, runner = signals.target_top3_entropy.clone(), signals.target_runner_up.clone()
    for inputs, (a, b) in zip(batch, spans):
        if inputs.top_p < 1.0 and b > a:
            processed = sampling_probs(inputs.clean_logits[: b - a], temperature, inputs.top_p)
            entropy[a:b] = top3_entropy(processed)
            kept = processed.gather(-1, runner[a:b].unsqueeze(-1)).squeeze(-1) > 0
            runner[a:b] = runner[a:b].masked_fill(~kept, -1)
    return Signals(**{**vars(signals), "target_top3_entropy": entropy, "target_runner_up": runner})


def _cat_or_none(batch: list[VerifyInputs], name: str) -> torch.Tensor | None:
    """The requests' `name` [g] stacked; None where a request with drafts lacks it (a round that drafted
    nothing adds no rows, whatever it carries)."""
    parts = [getattr(inputs, name) for inputs in batch if inputs.num_drafted]
    if not parts:
        return getattr(batch[0], name)
    return None if any(part is None for part in parts) else _cat(parts)


def _staged_paths(work: _PathWork, head: Head, rows: _Rows, spans, signals: Signals, rule, temperature: float,
                  memo: dict | None) -> None:
    """Fills work with the paths only where the rule reads them: at the slots it judges (acceptance.judged_by_paths:
    the exact test rejected them and, by default, they are not the clean target's top token) that can still be
    reached, left to right, until the rule rejects one. A slot is out of reach after a slot nothing can accept or
    after the rule's first rejection; its path fields stay empty (a view shows path data only where a rule read
    it). Stage 1: the first such slot of every request, stacked in one head pass; stage 2: every later reachable
    slot of the requests whose stage 1 the rule accepted, in one more. At p = 0 every path is the clean row: no
    head work."""
    judged = acceptance.judged_by_paths(signals, rule)
    exact_host, judged_host = torch.stack([signals.exact, judged.to(torch.bool)]).tolist()  # one host read
    reach = [[a + i for i in reachable_judged(exact_host[a:b], judged_host[a:b])] for a, b in spans]
    stage = [positions[:1] for positions in reach]
    for later in (True, False):
        flat = [position for positions in stage for position in positions]
        if not flat:
            break
        stats, part, accepted = _stage(head, rows, signals, rule, temperature, flat, memo)
        at, going_on = 0, []
        for request, positions in enumerate(stage):
            ruled = accepted[at: at + len(positions)]
            read = next((i + 1 for i, ok in enumerate(ruled) if not ok), len(ruled))  # up to its first rejection
            _keep(work, request, spans[request][0], positions, read, stats, part, at, rule)
            going_on.append(reach[request][1:] if later and ruled and all(ruled) else [])
            at += len(positions)
        stage = going_on


def _keep(work: _PathWork, request: int, start: int, positions: list[int], read: int, stats: mc_head.PathStats,
          part: dict, at: int, rule) -> None:
    """Record one request's share of a stage: the head rows of its slots `positions` (none at p = 0), its first
    `read` slots' path fields and probabilities."""
    work.rows[request] += len(positions) * (rule.num_paths if rule.p != 0.0 else 0)
    if not read:
        return
    where = torch.tensor(positions[:read], dtype=torch.long, device=stats.probs.device)
    picked = slice(at, at + read)
    work.parts.append((where, {name: value[_along(name, picked)] for name, value in part.items()}))
    work.probs[request].append((where - start, stats.probs[:, picked]))


def _stage(head: Head, rows: _Rows, signals: Signals, rule, temperature: float, flat: list[int],
           memo: dict | None) -> tuple[mc_head.PathStats, dict[str, torch.Tensor], list[bool]]:
    """The paths at the stacked slots `flat` (one head pass), their path fields, and whether the rule
    accepts each (one host read)."""
    key = ("paths", tuple(rows.keys[position] for position in flat), rule.num_paths, rule.p,
           rule.centroid, rule.mask_draw)
    where = torch.tensor(flat, dtype=torch.long, device=signals.draft_tokens.device)
    memo = {} if memo is None else memo
    if key not in memo:
        memo[key] = _paths_at(head, rows, signals, rule, temperature, flat, where, settle_on_host=True)
    stats, part = memo[key]
    checked = Signals(**{**vars(at_positions(signals, where)), **part})
    return stats, part, acceptance.rule_accepts(rule, checked).tolist()


def _paths_at(head: Head, rows: _Rows, signals: Signals, rule, temperature: float, flat: list[int] | None,
              where: torch.Tensor | None, settle_on_host: bool) -> tuple[mc_head.PathStats, dict[str, torch.Tensor]]:
    """PathStats and path fields at the stacked slots `flat` (where: the same as a tensor; None: every
    slot), each slot with its own request's masks."""
    stacked = rows.hidden, rows.clean_logits, rows.q_signal, signals.draft_tokens
    hidden, clean_logits, q_signal, draft_tokens = stacked if flat is None else (tensor[where] for tensor in stacked)
    keys = [key[:2] for key in (rows.keys if flat is None else [rows.keys[position] for position in flat])]
    stats = path_stats_at(head, hidden, clean_logits, rule, temperature, keys)
    return stats, path_signals(draft_tokens, q_signal, stats, settle_on_host=settle_on_host)


def _paths_everywhere(work: _PathWork, head: Head, rows: _Rows, spans, signals: Signals, rule, temperature: float,
                      memo: dict | None) -> None:
    """Fills work with the paths at every drafted slot in one head pass, no host read (settle_close_calls on
    the device)."""
    stats, part = _paths_at(head, rows, signals, rule, temperature, None, None, settle_on_host=False)
    for request, (a, b) in enumerate(spans):
        _keep(work, request, a, list(range(a, b)), b - a, stats, part, a, rule)


def reachable_judged(exact: list[bool], judged: list[bool]) -> list[int]:
    """The slots [m] the rule judges (judged [g], where exact [g] is False) that lie before the first
    slot nothing can accept (neither exact nor judged)."""
    end = next((i for i, (ok, read) in enumerate(zip(exact, judged)) if not ok and not read), len(exact))
    return [i for i in range(end) if not exact[i] and judged[i]]


def with_rule_top(signals: Signals, rule, p_signal: torch.Tensor, q_signal: torch.Tensor) -> Signals:
    """signals with rule_top [n]: the argmax of the rule's own verification rows where it declares them (the
    greedy static ensemble's v = w p + (1 - w) q)."""
    rows = acceptance.RULES[rule.rule].correction_rows
    if rows is None or not signals.draft_tokens.numel():
        return signals
    return Signals(**{**vars(signals), "rule_top": top_token(rows(p_signal, q_signal, rule))})


def _judged_rounds(rule, batch: list[VerifyInputs]) -> torch.Tensor | None:
    """[n] bool: the drafted slots of the rounds the rule judges (acceptance.judges_drafts: the static
    ensemble not a prompt-lookup round's, which get the exact test alone); None where it judges every round."""
    judged = [acceptance.judges_drafts(rule.rule, inputs.draft_source) for inputs in batch]
    if all(judged):
        return None
    device = batch[0].draft_tokens.device
    return torch.cat([torch.full((inputs.num_drafted,), ok, dtype=torch.bool, device=device)
                      for ok, inputs in zip(judged, batch)])


def _scans(rule, batch: list[VerifyInputs], spans, signals: Signals, generator: torch.Generator | None,
           judged: torch.Tensor | None = None) -> list[tuple[Verdict, list[int]]]:
    """Each request's scan (acceptance.scan over the exact test, where the rule's own test replaces it the
    rule's verdict, acceptance.Rule.replaces_exact, then the rule's checks) and extra token, from one host copy
    of the scan's reasons, the drafted tokens and the target's argmax at every verified position. judged [n]:
    the slots the rule judges (_judged_rounds; None: all); elsewhere the exact test alone."""
    n = spans[-1][1]
    checks = _checks(rule, spans, signals) if n else []
    argmax = torch.cat([top_token(inputs.clean_logits) for inputs in batch])
    replaces = acceptance.RULES[rule.rule].replaces_exact  # replaced [n]: where it replaces the lossless test
    replaced = replaces(signals, rule, batch[0].temperature == 0.0) if replaces is not None and checks else None
    if judged is not None:
        checks = [(name, mask & judged) for name, mask in checks]
        replaced = None if replaced is None else replaced & judged
    exact = signals.exact
    if replaced is not None:  # there a draft the exact test accepted stands only where a check accepts it too
        exact = torch.where(replaced, exact & torch.stack([mask for _, mask in checks]).any(0), exact)
    codes = acceptance.scan(torch.stack([exact, *(mask for _, mask in checks)]), [b - a for a, b in spans])
    parts = [codes, signals.draft_tokens, argmax]
    parts += [] if replaced is None else [replaced, signals.rule_top if signals.rule_top is not None else argmax[:0]]
    host = torch.cat([part.long() for part in parts]).tolist()  # the one copy
    names = acceptance.scan_names(name for name, _ in checks)
    codes, drafts, argmax_host = host[:n], host[n: 2 * n], host[2 * n:]
    argmax_host, own = argmax_host[: n + len(batch)], argmax_host[n + len(batch):]
    found = []
    for request, ((a, b), inputs) in enumerate(zip(spans, batch)):
        reasons = tuple(names[code] for code in codes[a:b])
        accepted = acceptance.accepted_count(reasons)
        ruled = bool(own) and accepted < b - a and bool(own[a + accepted])  # the rule's own test rejected it
        token, kind = _extra(inputs, request, a, b, accepted, argmax_host, own[n + a + accepted] if ruled and
                             len(own) > n else None, ruled, generator)
        found.append((Verdict(accepted, reasons, token, kind), drafts[a: a + accepted] + [token]))
    return found


def _extra(inputs: VerifyInputs, request: int, a: int, b: int, accepted: int, argmax_host: list[int],
           own_top: int | None, ruled: bool, generator) -> tuple[int, str]:
    """The token after `accepted` drafts: greedy, the target's argmax (at a rejection the rule's own test made,
    the top of its own rows where it has them); sampling, a draw from the residual, or from p where the rule's
    own test rejected (no coin decided there)."""
    if inputs.temperature == 0.0:
        token = own_top if own_top is not None else argmax_host[a + request + accepted]
        return token, BONUS if accepted == b - a else CORRECTION
    q_sample = inputs.q_sample
    if ruled and q_sample is not None:
        q_sample = q_sample.clone()
        q_sample[accepted] = 0.0  # the residual of p against nothing: p itself
    return acceptance.extra_token(accepted, b - a, q_sample, inputs.p_sample, generator)


def _checks(rule, spans, signals: Signals) -> list[tuple[str, torch.Tensor]]:
    """The rule's (reason, mask [n]) over the stacked slots; per request where a check reads later slots
    of its own round (FLy's window), so that no window runs into the next request."""
    if not acceptance.RULES[rule.rule].reads_later or len(spans) == 1:
        return acceptance.rule_checks(rule, signals)
    per_request = [acceptance.rule_checks(rule, at_positions(signals, slice(a, b))) for a, b in spans]
    return [(name, torch.cat([checks[c][1] for checks in per_request])) for c, (name, _) in enumerate(per_request[0])]


def _one_temperature(batch: list[VerifyInputs]) -> float:
    temperatures = {inputs.temperature for inputs in batch}
    if len(temperatures) > 1:
        raise ValueError(f"one verify step reads one temperature, got {sorted(temperatures)}")
    return temperatures.pop()


def path_stats_at(target: Head, hidden: torch.Tensor, clean_logits: torch.Tensor, rule, temperature: float,
                  keys: list[tuple[int, int]]) -> mc_head.PathStats:
    """PathStats over [K, n, V] of n positions (hidden [n, H], clean_logits [n, V]; keys [n] of
    (mask_seed, sequence position) key their dropout masks)."""
    p = rule.p
    if p == 0.0:  # every path is the clean row
        return mc_head.PathStats.of_clean_row(clean_logits, signal_probs(clean_logits, temperature), rule.num_paths)
    keep = mc_head.keyed_masks(keys, rule.num_paths, p, hidden.shape[-1], hidden.device, hidden.dtype, rule.mask_draw)
    return mc_head.path_stats(target.path_logits(hidden, keep, p, clean_logits), temperature, rule.centroid)
