"""The only package that talks to transformers.

    loading.py      a pair from the hub or the embedded CPU pair; ModelLoadError
    causal_lm.py    the adapter the engine sees (ids -> hidden states -> logits, cache length and crop)
    cpu_kernels.py  few-row linear kernels on a CPU, each used where it measured faster (prepare_for_cpu)
    references.py   the target's own greedy generate() and transformers' assisted generation
"""

from ..decoding.causal_lm import CausalLM, LoadedPair, RestrictedHead, encode_prompt, pick_device, stop_token_ids, synchronize
from ..decoding.cpu_kernels import ChosenLinear, fast_dtype, kernel_summary, linear_bytes, prepare_for_cpu, row_linear
from .loading import (
    EMBEDDED_DRAFT_DIR, ModelLoadError, available_memory, build_draft_model, cache_root, embedded_target_dir,
    load_draft_weights,
    load_embedded_models, load_embedded_pair, load_embedded_target, load_hub_pair, load_pair,
)
from .references import (Divergence, assisted_generate, ensemble_assisted_generate, first_divergence, greedy_reference,
                         prompt_lookup_generate, sequence_nll)

__all__ = [
    "CausalLM", "LoadedPair", "RestrictedHead", "encode_prompt", "pick_device", "stop_token_ids", "synchronize",
    "ChosenLinear", "fast_dtype", "kernel_summary", "linear_bytes", "prepare_for_cpu", "row_linear",
    "EMBEDDED_DRAFT_DIR", "ModelLoadError", "available_memory", "build_draft_model", "cache_root", "embedded_target_dir",
    "load_draft_weights", "load_embedded_models", "load_embedded_pair", "load_embedded_target", "load_hub_pair", "load_pair",
    "Divergence", "assisted_generate", "ensemble_assisted_generate", "first_divergence", "greedy_reference",
    "prompt_lookup_generate", "sequence_nll",
]
