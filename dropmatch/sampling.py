"""Turning logits into the distributions tokens are drawn from (pure functions)."""

from __future__ import annotations

import torch


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] after temperature and nucleus (top-p) filtering.

    temperature 0 gives a one-hot on the argmax (greedy).
    """
    logits = logits.float()
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    probs = (logits / temperature).softmax(-1)
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(-1, descending=True)
    # Keep a token while the mass before it is below top_p: the top token always survives.
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return filtered / filtered.sum(-1, keepdim=True)


def signal_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The smooth distribution the divergence rules compare: softmax(logits / T), T = 1 when greedy."""
    return (logits.float() / (temperature if temperature > 0 else 1.0)).softmax(-1)


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """probs [..., V] -> one token id per row [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
