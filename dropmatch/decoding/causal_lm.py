"""The causal-LM adapter the engine sees: token ids in, final hidden states out (with a KV cache),
a separate `logits(hidden)` so that clean rows and Monte-Carlo rows share the model's own head, and
the cache operations (length, crop) so that the engine never touches transformers' cache objects.
"""

from __future__ import annotations

import hashlib
import inspect
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from .config import PairSpec
from .mc_head import masked_rows
from .cpu_kernels import fast_dtype, kernel_summary, onednn_chunks

PREFILL_CHUNK = 512  # rows a CPU reads at a time when the caller follows a long input's progress
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")


def pick_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so that wall-clock timings mean something on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RestrictedHead(torch.nn.Module):
    """An LM head that scores only some token ids (a frequency-restricted draft head).

    Every other token gets logit -inf, i.e. probability 0: the draft never proposes it, and
    rejection sampling stays exact. As a module it also works inside transformers' generate().
    weight [S, H] are the rows of the full head for `rows` [S]; output [..., vocab_size].
    """

    def __init__(self, weight: torch.Tensor, rows: torch.Tensor, vocab_size: int):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.register_buffer("rows", rows.long(), persistent=False)
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = torch.nn.functional.linear(hidden, self.weight)
        full = scores.new_full((*scores.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.rows] = scores
        return full


class CausalLM:
    """A causal LM seen as: ids -> final hidden states (with a KV cache), hidden -> logits.

    The model is used as it is given and never changed: its training flag, requires_grad and attributes
    stay the caller's (generate() wraps the user's own model; the Studio's loader hands over models it
    froze itself). Every product runs under torch.inference_mode, so no autograd graph is ever built."""

    def __init__(self, model, name: str, vocab_size: int):
        self.model = model
        self.name = name
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.decoder = model.get_decoder()
        # transformers 5.25 renamed the decoder's past_key_values to cache (the old name warns, then goes in 5.40)
        self.cache_name = "cache" if "cache" in inspect.signature(self.decoder.forward).parameters else "past_key_values"
        # The blocks' dtype: the decoder's last parameter (its final norm), not the first, which may
        # be an input embedding shared with a model that computes in another dtype.
        self.compute_dtype = list(self.decoder.parameters())[-1].dtype
        self.head = model.get_output_embeddings()
        plain = isinstance(self.head, torch.nn.Linear) and self.head.bias is None
        self._head_weight = self.head.weight if plain else None  # None: call the module itself
        self._path_dtype = fast_dtype(self.device)
        self._path_weight = None  # a low-precision copy of the head, made on first use
        self._head_columns = None  # the head transposed [H, V], made on first sparse use
        self._fingerprint: str | None = None
        self._softcap = getattr(model.config, "final_logit_softcapping", None)
        self._logit_scale = getattr(model.config, "logit_scale", None)
        self._logits_scaling = getattr(model.config, "logits_scaling", None)
        # An EAGLE-3 head reads the inputs of some decoder layers (eagle3.Eagle3Head sets them): hidden()
        # then keeps them, (first position, [n, len(layers_kept) * H]), for the positions of its last call.
        self.layers_kept: tuple[int, ...] = ()
        self.kept_inputs: tuple[int, torch.Tensor] | None = None

    def fingerprint(self) -> str:
        """A short hash of the weights as they compute here: every parameter's name, shape, dtype and
        an evenly spaced sample of its values, plus the device type and the path dtype. Two loads of
        the same file agree; other weights (the hub's original instead of the dequantised GGUF), another
        dtype or bf16 paths against fp32 ones differ. Computed once (a few ms)."""
        if self._fingerprint is None:
            digest = hashlib.blake2b(digest_size=8)
            digest.update(f"{self.device.type}|paths:{self._path_dtype}".encode())
            for name, tensor in sorted(self.model.state_dict().items()):
                flat = tensor.detach().reshape(-1)
                sample = flat[:: max(flat.numel() // 4096, 1)][:4096].float().cpu()
                digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}".encode())
                digest.update(sample.numpy().tobytes())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    @property
    def kernels(self) -> str:
        """The CPU kernels the loader chose for this model's linear layers (cpu_kernels.kernel_summary)."""
        return kernel_summary(self.model)

    @property
    def head_weight(self) -> torch.Tensor:
        """[V', H]: the rows the head scores (V' = vocab, or the restricted rows of a draft)."""
        return self.head.weight.detach()

    @property
    def hidden_size(self) -> int:
        return int(self.head.weight.shape[-1])

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", None) or 1_000_000)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def hidden(self, input_ids: torch.Tensor, cache, progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """input_ids [n] (appended after what the cache holds) -> final hidden states [n, H].
        A long input to a model that multiplies through oneDNN goes in chunks of fixed sizes
        (cpu_kernels.onednn_chunks: oneDNN keeps memory per row count it meets). progress(rows read,
        n): called after each chunk; given it, a CPU reads in chunks of at most PREFILL_CHUNK rows, so
        that a long prompt's reading can be followed (the same hidden states: tests/test_prefill.py)."""
        total = int(input_ids.numel())
        sizes = onednn_chunks(total, self.device, self.compute_dtype)
        if progress is not None and self.device.type == "cpu":
            sizes = [min(PREFILL_CHUNK, size - start) for size in sizes for start in range(0, size, PREFILL_CHUNK)]
        parts, kept, read = [], [], 0
        first = cache.get_seq_length() if self.layers_kept else 0
        layers = {"output_hidden_states": True} if self.layers_kept else {}
        for chunk in input_ids.split(sizes):
            out = self.decoder(input_ids=chunk.view(1, -1), use_cache=True, **{self.cache_name: cache}, **layers)
            parts.append(out.last_hidden_state[0])
            if layers:  # hidden_states[i]: the input of layer i
                kept.append(torch.cat([out.hidden_states[i][0] for i in self.layers_kept], -1))
            read += int(chunk.numel())
            if progress is not None:
                progress(read, total)
        if kept:
            self.kept_inputs = (first, torch.cat(kept))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., vocab_size] in float32, the model's own post-processing kept.
        The product runs in the head's dtype (a bf16 draft may share the target's fp32 head)."""
        return self._postprocess(self.head(hidden.to(self.head.weight.dtype)).float())

    @torch.inference_mode()
    def path_logits(self, hidden: torch.Tensor, keep: torch.Tensor, p: float, clean_logits: torch.Tensor) -> torch.Tensor:
        """Logits [K, n, V] of the Monte-Carlo paths h * keep / (1 - p), for hidden [n, H],
        keep [K, n, H] (0/1 dropout masks) and the clean rows' logits [n, V].

        The precision follows the device's capability alone (fast_dtype, in the fingerprint every
        trace records), never a timing, so two loads on one machine judge a slot alike: where the
        hardware multiplies bf16 natively, all rows go through the head in one bf16 matmul (the
        dropout noise is orders of magnitude above bf16 rounding). Elsewhere the product is fp32, and
        on a CPU with few dropped entries (a count, not a timing: sparse_pays) it is computed from the
        clean logits: W (h * keep) / (1 - p) = (W h - W (h * (1 - keep))) / (1 - p), where the second
        product reads only the head columns of the dropped entries."""
        if self._sparse_possible():  # counting the dropped entries is a sync: only where sparse may run
            dropped = hidden.unsqueeze(0) * (1.0 - keep)  # [K, n, H]
            if self.sparse_pays(int(torch.count_nonzero(dropped))):
                return self._sparse_path_logits(dropped, clean_logits, p)
        return self._dense_path_logits(hidden.unsqueeze(0), keep, p)

    def _dense_path_logits(self, hidden: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
        """All path rows through the head in one matmul, in the path dtype: hidden [1, n, H], keep [K, n, H]."""
        path_hidden = masked_rows(hidden[0], keep, p)
        if self._head_weight is None or self._path_dtype == self._head_weight.dtype:
            return self.logits(path_hidden)
        self._make_path_weight()
        path_logits = torch.nn.functional.linear(path_hidden.to(self._path_dtype), self._path_weight)
        return self._postprocess(path_logits.float())

    def _make_path_weight(self) -> None:
        if self._path_weight is None and self._head_weight is not None and self._path_dtype != self._head_weight.dtype:
            self._path_weight = self._head_weight.detach().to(self._path_dtype)

    def prepare_paths(self) -> None:
        """Made once, at load (the engine calls it), so that a server's memory does not jump at the
        first prompt whose paths need it: the head's low-precision copy for dense path rows (the
        embedded target's: 57 MB in bf16), or, where the sparse fp32 product may run, the head
        transposed (113 MB for the embedded target)."""
        self._make_path_weight()
        if self._sparse_possible() and self._head_columns is None:
            self._head_columns = self._head_weight.detach().T.contiguous()  # [H, V]

    def _sparse_path_logits(self, dropped: torch.Tensor, clean_logits: torch.Tensor, p: float) -> torch.Tensor:
        """(W h - W dropped) / (1 - p) for dropped [K, n, H] (the entries dropout removed), clean_logits [n, V]."""
        if self._head_columns is None:
            self._head_columns = self._head_weight.detach().T.contiguous()  # [H, V]
        with warnings.catch_warnings():  # "sparse CSR support is in beta": the product used here is plain
            warnings.simplefilter("ignore", UserWarning)
            flat = dropped.reshape(-1, dropped.shape[-1]).to_sparse_csr()
        removed = (flat @ self._head_columns).reshape(*dropped.shape[:-1], -1)
        return (clean_logits.unsqueeze(0) - removed[..., : self.vocab_size]) / (1.0 - p)

    def sparse_pays(self, num_dropped: int) -> bool:
        """Whether the sparse product runs for num_dropped dropped entries: it reads one fp32 head
        column per entry where the dense fp32 pass reads all hidden_size of them once, and a sparse
        product streams about half as fast, so it pays below half the columns. A count, the same on
        every machine."""
        return self._sparse_possible() and num_dropped < self.hidden_size // 2

    def _sparse_possible(self) -> bool:
        """fp32 paths (no native bf16 on this device) through a plain head without logit
        post-processing (the identity needs a linear head), on a CPU (on a GPU the dense pass is cheap)."""
        linear = self._head_weight is not None and not (self._softcap or self._logit_scale or self._logits_scaling)
        return linear and self.device.type == "cpu" and self._path_dtype == torch.float32

    def _postprocess(self, logits: torch.Tensor) -> torch.Tensor:
        if self._logit_scale is not None:  # Cohere
            logits = logits * self._logit_scale
        if self._logits_scaling is not None:  # Granite
            logits = logits / self._logits_scaling
        if self._softcap is not None:  # Gemma 2/3
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits[..., : self.vocab_size]

    @staticmethod
    def cached_length(cache) -> int:
        """Positions the cache holds."""
        return cache.get_seq_length()

    @staticmethod
    def crop(cache, length: int) -> None:
        """Keep the first `length` positions of the cache (drop rejected draft positions)."""
        surplus = cache.get_seq_length() - length
        if surplus > 0:
            cache.crop(-surplus)  # transformers 5 takes the number of tokens to remove


@dataclass
class LoadedPair:
    target: CausalLM
    draft: CausalLM
    tokenizer: object
    spec: PairSpec
    source: str = ""  # where the weights came from, for the status line (empty: the spec says it)
    head: object = None  # an EAGLE-3 head over the target (eagle3.Eagle3Head): draft_source "eagle3" drafts with it


# ---------------------------------------------------------------- prompts and stop tokens


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """The prompt as token ids, through the chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def stop_token_ids(tokenizer, model=None) -> tuple[int, ...]:
    """EOS ids of the tokenizer and generation config, plus the chat template's end of turn."""
    generation_config = getattr(model, "generation_config", None)
    ids = {*as_ids(tokenizer.eos_token_id), *as_ids(getattr(generation_config, "eos_token_id", None))}
    vocab = tokenizer.get_vocab()
    template = getattr(tokenizer, "chat_template", None) or ""
    ids.update(vocab[token] for token in END_OF_TURN_TOKENS if token in vocab and token in template)
    return tuple(sorted(ids))


def as_ids(value) -> list[int]:
    """A token-id setting (an eos_token_id: None, one id or several) as a list of ids."""
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]

