"""Checking a request when vLLM admits it (HTTP 400 with one line, before any work): its DropMatch
settings, merged over the engine's own (`additional_config={"dropmatch": ...}`), and whatever it asks
that a lossy rule cannot serve as asked. Pure Python over a SamplingParams-like object: hooks.py calls
`check_request` from vLLM's input processor; the tests call it directly.

A lossless request (rule "lossless", or an engine without DropMatch and a request that does not ask
for it) is never refused here: vLLM serves it as it would without the plugin.
"""

from __future__ import annotations

from ...decoding.config import ConfigError
from .settings import ServeSettings, request_settings

SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it is greedy

# What a lossy rule cannot serve as asked: (what the request asks, test, why), first match refused.
UNSERVED = (
    ("temperature > 0", lambda sp: getattr(sp, "temperature", 0.0) >= SAMPLING_EPS,
     "the plugin verifies greedy requests only (sampled DropMatch is not served)"),
    ("logprobs", lambda sp: getattr(sp, "logprobs", None) is not None or getattr(sp, "prompt_logprobs", None) is not None,
     "a token a lossy rule accepts has no logprob of vLLM's sampler to report"),
    ("logit_bias", lambda sp: bool(getattr(sp, "logit_bias", None)), "the rules judge the model's own logits"),
    ("min_tokens", lambda sp: getattr(sp, "min_tokens", 0) > 0, "it masks the stop tokens the rules would judge"),
    ("bad_words", lambda sp: bool(getattr(sp, "bad_words", None)), "it masks tokens the rules would judge"),
    ("allowed_token_ids", lambda sp: bool(getattr(sp, "allowed_token_ids", None)), "it masks tokens the rules would judge"),
    ("structured outputs", lambda sp: getattr(sp, "structured_outputs", None) is not None,
     "a grammar masks tokens the rules would judge"),
    ("penalties", lambda sp: bool(getattr(sp, "presence_penalty", 0.0) or getattr(sp, "frequency_penalty", 0.0)
                                  or getattr(sp, "repetition_penalty", 1.0) != 1.0),
     "presence, frequency and repetition penalties change the logits the rules judge"),
    ("watermarking", lambda sp: bool(getattr(sp, "watermarking", None)), "a watermark changes the target's logits"),
)


def effective_settings(engine: dict | None, extra_args: dict | None) -> ServeSettings | None:
    """The request's settings: the engine's (None: the engine runs without DropMatch), updated by the
    request's own; None where neither asks for DropMatch. ConfigError (one line) on bad settings, or
    on a request asking a lossy rule of an engine started without DropMatch."""
    given = request_settings(extra_args)
    if engine is None:
        if given and not ServeSettings().updated(given).lossless:
            raise ConfigError("this engine was started without DropMatch (additional_config['dropmatch']); "
                              "its requests cannot ask for a lossy rule")
        return None
    return ServeSettings().updated(engine, engine=True).updated(given)


def check_request(sampling_params, engine: dict | None = None) -> None:
    """ValueError (one line, starting "DropMatch: ") when the request's settings are malformed or its
    lossy rule cannot serve what it asks; nothing for a lossless request."""
    try:
        settings = effective_settings(engine, getattr(sampling_params, "extra_args", None))
    except ConfigError as error:
        raise ValueError(f"DropMatch: {error}") from None
    if settings is None or settings.lossless:
        return
    for what, asks, why in UNSERVED:
        if asks(sampling_params):
            raise ValueError(f"DropMatch: rule {settings.rule.rule!r} cannot serve a request with {what}: {why}; drop "
                             f"it, or ask for rule 'lossless' (vllm_xargs {{\"dropmatch_rule\": \"lossless\"}})")


def edits_target_logits(sampling_params) -> bool:
    """Whether the request asks for anything that changes vLLM's target logits or verdict (the UNSERVED
    list but temperature): the runner keeps vLLM's own verdict for such a request that slipped through."""
    return any(asks(sampling_params) for what, asks, _ in UNSERVED if what != "temperature > 0")
