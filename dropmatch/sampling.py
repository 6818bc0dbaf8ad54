"""Distributions and divergences (pure functions, below every other module of the package).

Turning logits into the distributions tokens are drawn from; JS divergence and entropy, which
the rules (acceptance.py) and the Monte-Carlo paths (mc_head.py) both read."""

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
    if temperature > 0 and temperature != 1.0:
        return (logits.float() / temperature).softmax(-1)
    return logits.float().softmax(-1)  # x / 1 is x: one vocabulary-sized temporary fewer


def top_token(values: torch.Tensor) -> torch.Tensor:
    """values [..., V] -> the index of each row's maximum [...]: argmax's result (its first maximum,
    NaN counting as the largest; tested), by max(), which a CPU computes in a third of the time."""
    return values.max(-1).indices


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """probs [..., V] -> one token id per row [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


NUCLEUS_TOP_P = 0.95  # the off-nucleus yardstick: the target's top-p 0.95 nucleus at temperature 1


def target_view(logits: torch.Tensor, tokens: torch.Tensor, top_p: float = NUCLEUS_TOP_P) -> tuple[torch.Tensor, torch.Tensor]:
    """How the clean target sees emitted tokens: logits [n, V] (temperature 1), tokens [n] ->
    (log-probability [n], in its top-p nucleus [n] bool). A token is in the nucleus when the
    tokens more likely than it hold less than top_p of the mass (as sampling_probs keeps them)."""
    log_probs = logits.float().log_softmax(-1)
    chosen = log_probs.gather(-1, tokens.view(-1, 1))
    probs = log_probs.exp()
    mass_above = (probs * (log_probs > chosen)).sum(-1)
    return chosen.view(-1), mass_above < top_p


def _log(probs: torch.Tensor) -> torch.Tensor:
    """log with 0 -> log(tiny): finite, and 0 * log stays 0. (torch.xlogy is ~10x slower on CPU.)
    The log is taken in place of the clamped copy: one vocabulary-sized temporary, not two."""
    return probs.clamp_min(torch.finfo(probs.dtype).tiny).log_()


def js_divergence(p_a: torch.Tensor, p_b: torch.Tensor, entropy_a: torch.Tensor | None = None,
                  entropy_b: torch.Tensor | None = None) -> torch.Tensor:
    """Jensen-Shannon divergence (natural log) over the last axis; broadcasts; >= 0, <= ln 2.

    As H(m) - (H(a) + H(b)) / 2 with m = (a + b) / 2: three logs and three dot products, several
    times faster on a CPU than summing two KL terms. Exactly 0 when a == b (m == a bit for bit).
    entropy_a, entropy_b: H(a), H(b) (entropy()) when the caller has them already.
    """
    mixture = (p_a + p_b).mul_(0.5)
    entropy_a = entropy(p_a) if entropy_a is None else entropy_a
    entropy_b = entropy(p_b) if entropy_b is None else entropy_b
    return (entropy(mixture) - 0.5 * (entropy_a + entropy_b)).clamp_min(0.0)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """probs [..., V] -> entropy [...] (natural log)."""
    return -torch.linalg.vecdot(probs, _log(probs))
