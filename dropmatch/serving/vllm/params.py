"""Checking a request's DropMatch settings when vLLM admits it (HTTP 400 with one line, before any
work), through the logits-processor hook vLLM offers for that: `validate_params`. The processor
itself changes no logits (it is registered under `vllm.logits_processors` for its check alone)."""

from __future__ import annotations

import torch

from ...config import ConfigError
from .settings import ServeSettings, request_settings

try:  # the base class when vLLM is there; tests of the check itself need no vLLM
    from vllm.v1.sample.logits_processor import LogitsProcessor as _Base
except ImportError:  # pragma: no cover - only outside a vLLM venv
    _Base = object


def check_request(sampling_params) -> None:
    """ValueError (one line) when a request's DropMatch settings are malformed, or ask a lossy rule of
    a sampled request (DropMatch in vLLM verifies greedy requests; sampled ones keep vLLM's sampler)."""
    try:
        given = request_settings(getattr(sampling_params, "extra_args", None))
        settings = ServeSettings().updated(given)
    except ConfigError as error:
        raise ValueError(f"DropMatch: {error}") from None
    if given and not settings.lossless and sampling_params.temperature >= 1e-5:
        raise ValueError("DropMatch: a lossy rule verifies greedy requests only (temperature 0); this request samples "
                         f"at temperature {sampling_params.temperature:g}: drop its DropMatch settings or set "
                         "temperature 0")
    if given and not settings.lossless and edits_target_logits(sampling_params):
        raise ValueError("DropMatch: a lossy rule judges the model's own logits; this request's penalties, bad words "
                         "or allowed tokens change them: drop those or its DropMatch settings")


def edits_target_logits(sampling_params) -> bool:
    """Whether vLLM's rejection sampler changes the request's target logits before its argmax
    (penalties, bad words, allowed tokens): the rules judge the model's own logits, so such a
    request keeps vLLM's own verdict."""
    return bool(getattr(sampling_params, "presence_penalty", 0.0) or getattr(sampling_params, "frequency_penalty", 0.0)
                or getattr(sampling_params, "repetition_penalty", 1.0) != 1.0
                or getattr(sampling_params, "bad_words", None) or getattr(sampling_params, "allowed_token_ids", None))


class DropMatchParams(_Base):
    """No-op logits processor whose validate_params checks a request's DropMatch settings."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        check_request(sampling_params)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update) -> None:
        pass
