"""What a user runs without us: transformers' own generate() on the loaded target, timed.

The denominator of every "vs the target alone" figure (the app's verdict and stats, the bench's "vs AR"
column): the same target, prompt, token budget, stopping tokens and sampling as the run it is held against.
"""

from __future__ import annotations

import torch

from ..decoding.causal_lm import CausalLM
from .references import _timed_generate


def target_generate(target: CausalLM, prompt_ids: list[int], max_new_tokens: int, stop_ids, temperature: float,
                    top_p: float, seed: int) -> tuple[list[int], float]:
    """transformers' plain generate() on `target`: greedy at temperature 0, else sampled at the same
    temperature and top-p (top-k off), seeded with torch.manual_seed(seed); the same max_new_tokens and stop
    ids as the engine's runs. Returns (new tokens, seconds of the whole call: prefill and every step)."""
    if temperature > 0:
        torch.manual_seed(seed)
    return _timed_generate(target, prompt_ids, max_new_tokens, stop_ids, temperature, top_p)
