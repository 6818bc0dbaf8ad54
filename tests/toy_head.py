"""A toy LM head small enough to hold in one view (the Toy head tab): a vocabulary of 6 tokens, a
hidden state h of 8 numbers, a head W [6, 8], the draft's distribution q and K keep masks.

`toy_numbers` runs the project's own functions on it (mc_head.masked_rows and path_stats,
verifying.position_signals, acceptance.scan_reasons) in float64, greedy (the smooth distributions at T = 1).
The page computes the same numbers in JavaScript (assets/toy_head.js); tests/test_toy_head.py
checks the two agree on random heads and that each of the page's presets shows what it claims.
"""

from __future__ import annotations

import dataclasses

import torch

from dropmatch.decoding import acceptance, mc_head
from dropmatch.decoding.config import RuleConfig
from dropmatch.decoding.verifying import position_signals
from dropmatch.decoding.sampling import signal_probs
from reference_rules import scan_reasons

TOY_RULES = ("lossless", "naive", "js", "majority", "dropmatch", "typical", "fixed_js")
PATH_RULES = ("naive", "js", "majority", "dropmatch")  # the rules that read the K paths, lossless at p = 0


def keep_at(draws, p: float) -> list[list[int]]:
    """draws [K, H] uniforms in [0, 1): the page's keep masks at dropout p (a coordinate kept where its draw < 1 - p),
    so the masks follow p and p = 0 keeps every coordinate (assets/toy_head.js keepOf)."""
    return [[int(u < 1 - p) for u in row] for row in draws]


def toy_numbers(weight, hidden, q_draft, keep, p: float, draft_token: int, majority_fraction: float = 0.8,
                typical_eps: float = 0.3, typical_delta: float = 0.09, fixed_js_threshold: float = 0.1) -> dict:
    """weight [V, H], hidden [H], q_draft [V] (sums to 1), keep [K, H] 0/1, p in [0, 1): every number
    the toy head shows, as plain floats: the paths' inputs, distributions and tokens, the centroid,
    each path's JS against it, the threshold, the draft's JS, the votes and each rule's reason."""
    weight, hidden, q_draft, keep = (torch.as_tensor(x, dtype=torch.float64) for x in (weight, hidden, q_draft, keep))
    masked = mc_head.masked_rows(hidden.view(1, -1), keep.unsqueeze(1), p)  # [K, 1, H]
    paths = mc_head.path_stats(masked @ weight.T, temperature=0.0)
    p_target = signal_probs(hidden.view(1, -1) @ weight.T, 0.0)  # [1, V]
    draft = torch.tensor([draft_token])
    signals = position_signals(draft, q_draft.view(1, -1), p_target, paths)
    exact = draft == signals.target_tokens
    base = RuleConfig(num_paths=int(keep.shape[0]), p=p, majority_fraction=majority_fraction,
                      typical_eps=typical_eps, typical_delta=typical_delta, fixed_js_threshold=fixed_js_threshold)
    verdicts = {rule: scan_reasons(dataclasses.replace(base, rule=rule), signals, exact)[0] for rule in TOY_RULES}
    return {
        "masked": masked[:, 0].tolist(),
        "path_probs": paths.probs[:, 0].tolist(),
        "path_tokens": paths.tokens[:, 0].tolist(),
        "centroid": paths.centroid[0].tolist(),
        "path_js": paths.path_js[:, 0].tolist(),
        "threshold": float(signals.js_threshold[0]),
        "js_draft_centroid": float(signals.js_draft_centroid[0]),
        "js_draft_target": float(signals.js_draft_target[0]),
        "target_probs": p_target[0].tolist(),
        "target_token": int(signals.target_tokens[0]),
        "majority_token": int(signals.majority_tokens[0]),
        "majority_votes": int(signals.majority_votes[0]),
        "draft_votes": int(signals.draft_votes[0]),
        "votes_needed": acceptance.votes_needed(int(keep.shape[0]), majority_fraction),
        "verdicts": verdicts,
    }
