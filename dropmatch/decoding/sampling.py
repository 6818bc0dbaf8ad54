"""Distributions and divergences (pure functions, below every other module of the package).

Turning logits into the distributions tokens are drawn from; JS divergence and entropy, which
the rules (acceptance.py) and the Monte-Carlo paths (mc_head.py) both read."""

from __future__ import annotations

import math

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


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [..., V] / T, in float32, or float64 where they are float64 (the toy head checks the page's numbers
    to 1e-9 against these). T is the run's temperature, and 1 when greedy (0), where the divergence rules still
    need a distribution, not a one-hot: the one place this rule is written. x / 1 is x: no copy made then."""
    wide = logits if logits.dtype == torch.float64 else logits.float()
    return wide / temperature if temperature > 0 and temperature != 1.0 else wide


def signal_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The smooth distribution the divergence rules compare: softmax(logits / T), T = 1 when greedy."""
    return scaled_logits(logits, temperature).softmax(-1)


def top_token(values: torch.Tensor) -> torch.Tensor:
    """values [..., V] -> the index of each row's maximum [...]: argmax's result (its first maximum,
    NaN counting as the largest; tested), by max(), which a CPU computes in a third of the time."""
    return values.max(-1).indices


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """probs [..., V] -> one token id per row [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


NUCLEUS_TOP_P = 0.95  # the off-nucleus yardstick: the target's top-p 0.95 nucleus at temperature 1


def target_view(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How the clean target sees emitted tokens: logits [n, V] (temperature 1), tokens [n] ->
    (log-probability [n], in its top-p nucleus [n] bool). A token is in the nucleus when the
    tokens more likely than it hold less than NUCLEUS_TOP_P of the mass (as sampling_probs keeps them)."""
    log_probs = logits.float().log_softmax(-1)
    chosen = log_probs.gather(-1, tokens.view(-1, 1))
    probs = log_probs.exp()
    mass_above = (probs * (log_probs > chosen)).sum(-1)
    return chosen.view(-1), mass_above < NUCLEUS_TOP_P


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


def js_divergence_accurate(p_a: torch.Tensor, p_b: torch.Tensor) -> torch.Tensor:
    """JS(a || b) as js_divergence, float64 [...], without its cancellation: with s = a + b and
    d = (a - b) / s per token, JS = 1/2 sum(a log1p(d) + b log1p(-d)), summed in float64. Each token's
    term is a difference of two numbers of size s |d| / 2, so the sum's error is a few float32 epsilons
    times sum(s |d|) = 2 TV(a, b), far under JS itself (tested against float64 to 1e-5 relative on
    vocabulary-sized rows near a threshold). Several times slower: used where a comparison is close."""
    p_a, p_b = (x if x.dtype == torch.float64 else x.float() for x in (p_a, p_b))
    ratio = (p_a - p_b) / (p_a + p_b).clamp_min(torch.finfo(torch.float32).tiny)
    ratio = ratio.clamp_(-1.0 + 2.0**-24, 1.0 - 2.0**-24)  # 0 * log1p(-1) would be NaN; the term is 0
    terms = p_a * torch.log1p(ratio) + p_b * torch.log1p(-ratio)
    return (0.5 * terms.sum(-1, dtype=torch.float64)).clamp_min(0.0)


def fast_js_error(vocab_size: int) -> float:
    """A bound on js_divergence's absolute error over vocab_size tokens: H(m) - (H(a) + H(b)) / 2
    subtracts entropies of up to ln V, each a float32 sum carrying a few epsilons per nat; 32 float32
    epsilons per nat of the three entropies (tests/test_acceptance.py measures the largest error against
    float64, on vocabulary-sized rows, at a small fraction of this). Two JS values closer than this are
    compared again with js_divergence_accurate."""
    return 32.0 * torch.finfo(torch.float32).eps * (2.0 + 2.0 * math.log(max(vocab_size, 2)))


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """probs [..., V] -> entropy [...] (natural log). log 0 is read as log(tiny): finite, and 0 * log stays 0
    (torch.xlogy is ~10x slower on CPU); the log is taken in place of the clamped copy: one vocabulary-sized
    temporary, not two."""
    return -torch.linalg.vecdot(probs, probs.clamp_min(torch.finfo(probs.dtype).tiny).log_())
