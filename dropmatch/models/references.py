"""The yardsticks the benchmark holds our engine to: the target's own greedy generate(), and the
peers on the same pair: transformers' assisted generation (greedy, and sampled with its static ensemble)
and its prompt-lookup decoding."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from ..decoding.causal_lm import CausalLM, synchronize
from ..decoding.cpu_kernels import torch_default_kernels


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


# Two logits closer than this are a near-tie: bf16 keeps 8 bits of mantissa, so at a logit of 16-32 one
# rounding step is 0.0625-0.125, and the two kernels (one forward over many positions, or one at a time)
# may round them apart.
NEAR_TIE_LOGITS = 0.125


@dataclass(frozen=True)
class Divergence:
    """Where two greedy outputs of one prompt first differ, and how close the target was to a tie there."""

    index: int  # the first differing new token
    expected: int  # the reference's token (the target's own generate())
    got: int
    margin: float  # the target's logit of `expected` minus that of `got`, recomputed in fp32

    @property
    def near_tie(self) -> bool:
        return abs(self.margin) <= NEAR_TIE_LOGITS

    def describe(self, token_text=str) -> str:
        verdict = ("a near-tie (within bf16 rounding), not a decoding bug" if self.near_tie
                   else "not a near-tie: a real mismatch")
        return (f"first divergence at new token {self.index}: generate() chose {token_text(self.expected)!r}, this "
                f"run {token_text(self.got)!r}; the target's logit margin there is {self.margin:.4f}: {verdict}")


def first_divergence(target: CausalLM, prompt_ids: list[int], expected: list[int], got: list[int]) -> Divergence | None:
    """The first new token where `got` departs from `expected` (both continuations of prompt_ids), with
    the target's logit margin between the two tokens there (one fp32 forward over the shared prefix);
    None when one is a prefix of the other."""
    index = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), None)
    if index is None:
        return None
    ids = torch.tensor([list(prompt_ids) + list(expected[:index])], device=target.device)
    with torch.inference_mode():
        logits = target.model(input_ids=ids).logits[0, -1].float()
    return Divergence(index, int(expected[index]), int(got[index]),
                      float(logits[expected[index]] - logits[got[index]]))


def assisted_generate(target: CausalLM, draft: CausalLM, prompt_ids: list[int], max_new_tokens: int,
                      gamma: int | None, stop_ids) -> tuple[list[int], float]:
    """transformers' own assisted generation on the same pair (greedy), timed: a constant gamma, or
    with gamma None the library's own default schedule (its answer to gamma = auto).
    Returns (new tokens, seconds)."""
    with _draft_length(draft, gamma, assistant_confidence_threshold=0.0):
        return _timed_generate(target, prompt_ids, max_new_tokens, stop_ids, assistant_model=draft.model)


def ensemble_assisted_generate(target: CausalLM, draft: CausalLM, prompt_ids: list[int], max_new_tokens: int,
                               gamma: int | None, stop_ids, weight: float, temperature: float, top_p: float,
                               seed: int) -> tuple[list[int], float]:
    """transformers' own static-ensemble verification (assisted generation with `assistant_ensemble_weight`,
    DIVERSED's rule), sampled at the same temperature and top-p on the same pair, timed; seeded with
    torch.manual_seed(seed) (its draws are not ours, so its tokens are a sample of the same rule, not a copy).
    Temperature 0 is greedy (transformers then keeps a draft where it is the mixture's argmax; sampling
    refuses a temperature of 0). Returns (new tokens, seconds)."""
    torch.manual_seed(seed)
    with _draft_length(draft, gamma):
        return _timed_generate(target, prompt_ids, max_new_tokens, stop_ids, temperature, top_p,
                               assistant_model=draft.model, assistant_ensemble_weight=weight)


@contextlib.contextmanager
def _draft_length(draft: CausalLM, gamma: int | None, **settings):
    """Within the block, the draft's generation config drafts a constant gamma with `settings` (gamma
    None: the library's own schedule, nothing changed); restored after."""
    config = draft.model.generation_config
    changes = {} if gamma is None else {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                                        **settings}
    saved = {name: getattr(config, name, None) for name in changes}
    config.update(**changes)
    try:
        yield
    finally:
        config.update(**saved)


def sequence_nll(target: CausalLM, prompt_ids: list[int], tokens: list[int]) -> float:
    """Mean NLL (nats/token) of `tokens` after the prompt under the clean target at temperature 1, as our runs'
    target NLL (metrics.target_nll) reads them: one forward over prompt + tokens, in fp32."""
    ids = torch.tensor([list(prompt_ids) + list(tokens)], device=target.device)
    with torch.inference_mode():
        logits = target.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    log_probs = logits.log_softmax(-1).gather(-1, torch.tensor(tokens, device=target.device).unsqueeze(-1))
    return float(-log_probs.mean())


def prompt_lookup_generate(target: CausalLM, prompt_ids: list[int], max_new_tokens: int, stop_ids,
                           num_tokens: int = 10) -> tuple[list[int], float]:
    """transformers' prompt-lookup decoding (`prompt_lookup_num_tokens`, the target alone), greedy,
    timed. Returns (new tokens, seconds)."""
    return _timed_generate(target, prompt_ids, max_new_tokens, stop_ids, prompt_lookup_num_tokens=num_tokens)


def _timed_generate(target: CausalLM, prompt_ids: list[int], max_new_tokens: int, stop_ids,
                    temperature: float = 0.0, top_p: float = 1.0, **options):
    """Greedy at temperature 0, else sampled at temperature and top_p (top-k off). The models run torch's default
    kernels (cpu_kernels.torch_default_kernels), as the plain models a user loads do: our measured kernels are ours."""
    sampling = (dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0
                else dict(do_sample=False, temperature=None, top_p=None, top_k=None))
    input_ids = torch.tensor([prompt_ids], device=target.device)
    synchronize(target.device)
    start = time.perf_counter()
    with torch.inference_mode(), torch_default_kernels(target.model, options.get("assistant_model")):
        out = target.model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
            eos_token_id=sorted(stop_ids), pad_token_id=sorted(stop_ids)[0], **sampling, **options,
        )
    synchronize(target.device)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - start
