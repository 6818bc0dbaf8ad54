"""From a round's tensors to its records: the emitted tokens' view under the clean target, the top
tokens the step-through view shows, one device -> host copy, and one DraftedToken per drafted position.
The engine records each round through these, outside the verify step and after it; a run that keeps
no records (Engine.speculative_tokens, generate()'s) calls none of them. reason_summary: the one shape
every entry point reports a run's reason counts in.
"""

from __future__ import annotations

import torch

from .acceptance import lossy_reasons
from .sampling import target_view
from .trace import DraftedToken

TOP_SHOWN = 3  # top tokens kept per distribution for the step-through view


def emitted_view(logits: torch.Tensor, tokens: list[int]) -> dict[str, tuple]:
    """The clean target's log-probability of each emitted token and whether it lies in its top-p
    0.95 nucleus (temperature 1), from the logits [n, V] the run computed anyway."""
    if not tokens:
        return {"emitted_logprob": (), "emitted_in_nucleus": ()}
    log_probs, in_nucleus = target_view(logits, torch.tensor(tokens, device=logits.device))
    return {"emitted_logprob": tuple(log_probs.tolist()), "emitted_in_nucleus": tuple(in_nucleus.tolist())}


def top_tokens(q_signal, p_signal, path_probs, gamma: int) -> dict[str, torch.Tensor]:
    """Top TOP_SHOWN (prob, id) of the draft, the clean target and each path, per drafted position;
    path_probs: [(positions [m], probs [K, m, V])] where paths were read (ids -1 elsewhere)."""
    tops = {}
    for name, probs in {"draft": q_signal, "target": p_signal}.items():
        if probs.shape[-1] >= TOP_SHOWN:
            tops[f"{name}_top_p"], tops[f"{name}_top_id"] = probs.topk(TOP_SHOWN, dim=-1)
    if path_probs and path_probs[0][1].shape[-1] >= TOP_SHOWN:
        num_paths = path_probs[0][1].shape[0]
        top_p = q_signal.new_zeros((num_paths, gamma, TOP_SHOWN))
        top_id = torch.full((num_paths, gamma, TOP_SHOWN), -1, dtype=torch.long, device=q_signal.device)
        for positions, probs in path_probs:
            top_p[:, positions], top_id[:, positions] = probs.topk(TOP_SHOWN, dim=-1)
        tops["path_top_p"], tops["path_top_id"] = top_p, top_id
    return tops


def to_host(tensors: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """Moves many small tensors to the CPU in one copy (one sync on a GPU), dtypes kept; tensors already
    there are returned as they are (packing them into one copy would cost a fifth of a tiny pair's round)."""
    present = {name: t for name, t in tensors.items() if t is not None}
    if all(t.device.type == "cpu" for t in present.values()):
        return dict(tensors)
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in present.values()]).cpu()
    out, offset = dict.fromkeys(tensors), 0
    for name, tensor in present.items():
        out[name] = flat[offset : offset + tensor.numel()].reshape(tensor.shape).to(tensor.dtype)
        offset += tensor.numel()
    return out


# DraftedToken's fields -> the round's tensor each is read from: _READ's always, _PATH_READ's where the paths
# were read at that position, _OPTIONAL_READ's where the run computed them (None elsewhere).
_READ = {"token": "draft_tokens", "draft_prob": "draft_prob", "target_token": "target_tokens",
         "target_token_prob": "target_token_prob", "target_prob": "target_prob", "js_target": "js_draft_target",
         "target_top3_entropy": "target_top3_entropy"}
_PATH_READ = {"js": "js_draft_centroid", "threshold": "js_threshold", "majority_token": "majority_tokens",
              "majority_votes": "majority_votes", "draft_votes": "draft_votes"}
_OPTIONAL_READ = {"judge_score": "judge_scores", "coin": "coin", "sample_target_prob": "sample_target_prob",
                  "sample_draft_prob": "sample_draft_prob", "target_runner_up": "target_runner_up",
                  "target_logit_ratio": "target_logit_ratio"}


def _pairs(ids: torch.Tensor, probs: torch.Tensor) -> tuple[tuple[int, float], ...]:
    return tuple(zip(ids.tolist(), probs.tolist()))


def drafted_records(host: dict, reasons: tuple[str, ...]) -> tuple[DraftedToken, ...]:
    """One DraftedToken per drafted position from the host copies of the round's tensors; path
    fields only where the paths were computed (path token ids are -1 elsewhere)."""
    value = {name: (t.tolist() if isinstance(t, torch.Tensor) else None) for name, t in host.items()
             if not name.endswith(("_top_p", "_top_id"))}
    records = []
    for i, reason in enumerate(reasons):
        has_paths = value["path_tokens"] is not None and value["path_tokens"][0][i] >= 0
        records.append(DraftedToken(
            reason=reason,
            **{field: value[name][i] for field, name in _READ.items()},
            **{field: value[name][i] if has_paths else None for field, name in _PATH_READ.items()},
            **{field: value[name][i] if value.get(name) is not None else None
               for field, name in _OPTIONAL_READ.items()},
            path_tokens=tuple(row[i] for row in value["path_tokens"]) if has_paths else (),
            draft_top=_pairs(host["draft_top_id"][i], host["draft_top_p"][i]) if "draft_top_id" in host else (),
            target_top=_pairs(host["target_top_id"][i], host["target_top_p"][i]) if "target_top_id" in host else (),
            path_top=tuple(_pairs(host["path_top_id"][k, i], host["path_top_p"][k, i])
                           for k in range(host["path_top_id"].shape[0])) if has_paths and "path_top_id" in host else (),
        ))
    return tuple(records)


def reason_summary(reasons: dict[str, int]) -> dict:
    """Reason counts -> the one shape every entry point reports them in (the vLLM plugin's per-request
    `dropmatch` object, generate()'s `out.dropmatch`): drafted = every reason counted."""
    lossy = set(lossy_reasons())
    return {"drafted": sum(reasons.values()), "accepted_exactly": reasons.get("exact", 0),
            "accepted_lossy": sum(count for reason, count in reasons.items() if reason in lossy),
            "reasons": dict(sorted(reasons.items()))}
