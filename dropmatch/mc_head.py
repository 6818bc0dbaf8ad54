"""Monte-Carlo dropout on the LM-head input (pure tensor functions, no model).

The transformer blocks run once. Only the final hidden states h [n, H] are perturbed:
h^(i) = h * m^(i) / (1 - p), m^(i) ~ Bernoulli(1 - p). The engine runs paths only at the
positions the rule judges, and CausalLM.path_logits computes them from the clean logits minus
the dropped entries' share (a sparse product) when few entries are dropped, else in one dense
matmul (see there for the costs measured on this project's CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def dropout_masks(hidden: torch.Tensor, num_paths: int, p: float, generator: torch.Generator) -> torch.Tensor:
    """K Bernoulli(1 - p) keep masks [K, n, H] (0/1, hidden's dtype) for hidden [n, H]."""
    keep = torch.full((num_paths, *hidden.shape), 1.0 - p, device=hidden.device, dtype=torch.float32)
    return torch.bernoulli(keep, generator=generator).to(hidden.dtype)


def dropout_paths(hidden: torch.Tensor, num_paths: int, p: float, generator: torch.Generator) -> torch.Tensor:
    """hidden [n, H] -> K dropout copies [K, n, H] (inverted dropout, expectation kept)."""
    if p == 0.0:
        return hidden.unsqueeze(0).expand(num_paths, *hidden.shape)
    return hidden.unsqueeze(0) * dropout_masks(hidden, num_paths, p, generator) / (1.0 - p)


@dataclass(frozen=True)
class PathStats:
    """What the K paths say at each drafted position.

    probs [K, g, V] path distributions; centroid [g, V] = softmax(mean of path logits);
    path_js [K, g] = JS(path || centroid); threshold [g] = max over paths of path_js.
    """

    probs: torch.Tensor
    centroid: torch.Tensor
    path_js: torch.Tensor
    threshold: torch.Tensor


def path_stats(path_logits: torch.Tensor, temperature: float) -> PathStats:
    """path_logits [K, g, V] -> PathStats. temperature 0 (greedy) reads the logits at 1."""
    from .acceptance import js_divergence

    scale = temperature if temperature > 0 else 1.0
    scaled = path_logits.float() / scale
    probs = scaled.softmax(-1)
    centroid = scaled.mean(0).softmax(-1)  # mean of the logits, not of the probabilities
    path_js = js_divergence(probs, centroid.unsqueeze(0))
    return PathStats(probs=probs, centroid=centroid, path_js=path_js, threshold=path_js.max(0).values)


P_GRID = (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5)


def path_agreement(
    hidden: torch.Tensor, head_weight: torch.Tensor, num_paths: int, p: float,
    generator: torch.Generator, top_k: int = 64,
) -> float:
    """Share of (path, position) pairs whose argmax equals the clean argmax.

    hidden [n, H] (prompt positions), head_weight [V, H]. Each path's argmax is searched among
    the clean top_k tokens of its position, which is where it lies unless p is very large,
    so the cost is n * top_k head rows instead of the whole vocabulary per path.
    """
    head_weight = head_weight.detach()
    clean_logits = hidden.float() @ head_weight.float().T  # [n, V]
    candidates = clean_logits.topk(min(top_k, clean_logits.shape[-1]), dim=-1).indices  # [n, k]
    candidate_weight = head_weight.float()[candidates]  # [n, k, H]
    paths = dropout_paths(hidden.float(), num_paths, p, generator)  # [K, n, H]
    path_logits = torch.einsum("knh,nch->knc", paths, candidate_weight)
    return float((path_logits.argmax(-1) == 0).float().mean())  # column 0 is the clean argmax


def calibrate_p(
    hidden: torch.Tensor, head_weight: torch.Tensor, num_paths: int, target_agreement: float,
    generator: torch.Generator, grid: tuple[float, ...] = P_GRID,
) -> tuple[float, dict[float, float]]:
    """The largest p of the grid whose paths still agree with the clean argmax at target_agreement.

    Data-free: it reads only the prompt's own hidden states (the prefill computes them anyway).
    Returns (p, {p: agreement}) for the grid values tried; the scan stops at the first miss.
    """
    chosen, tried = grid[0], {}
    for p in grid:
        tried[p] = path_agreement(hidden, head_weight, num_paths, p, generator)
        if tried[p] < target_agreement:
            break
        chosen = p
    return chosen, tried
