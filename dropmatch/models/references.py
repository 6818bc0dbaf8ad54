"""The yardsticks the benchmark holds our engine to: the target's own greedy generate() and
transformers' assisted generation on the same pair."""

from __future__ import annotations

import time

import torch

from .causal_lm import CausalLM, synchronize


def greedy_reference(target: CausalLM, prompt_ids: list[int], max_new_tokens: int, stop_ids) -> list[int]:
    """The target's own greedy `generate()` output, the yardstick of lossless decoding."""
    input_ids = torch.tensor([prompt_ids], device=target.device)
    with torch.inference_mode():
        out = target.model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
            do_sample=False, eos_token_id=sorted(stop_ids), pad_token_id=sorted(stop_ids)[0],
            temperature=None, top_p=None, top_k=None,
        )
    return out[0, len(prompt_ids):].tolist()


def assisted_generate(target: CausalLM, draft: CausalLM, prompt_ids: list[int], max_new_tokens: int,
                      gamma: int, stop_ids) -> tuple[list[int], float]:
    """transformers' own assisted generation on the same pair (greedy, constant gamma), timed.

    The peer we compare our engine's speed with. Returns (new tokens, seconds).
    """
    input_ids = torch.tensor([prompt_ids], device=target.device)
    config = draft.model.generation_config
    config.num_assistant_tokens = gamma
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0
    synchronize(target.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft.model,
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(stop_ids),
            pad_token_id=sorted(stop_ids)[0], temperature=None, top_p=None, top_k=None,
        )
    synchronize(target.device)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - start
