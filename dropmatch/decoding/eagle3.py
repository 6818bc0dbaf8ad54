"""EAGLE-3 drafts (Li et al., arXiv 2503.01840): a one-layer head that drafts from the target's own features.

    head = load_head(folder, pair.target, name)       # a published head, in its authors' format
    pair = dataclasses.replace(pair, head=head)        # the engine drafts with it where draft_source is "eagle3"

The head, as its authors define it (SafeAILab/EAGLE's EAGLE-3 model; vLLM's llama_eagle3; the vLLM project's
speculators): the target's inputs to three of its decoder layers (low, middle, high: by default 2, L // 2 and
L - 3 of its L layers) are concatenated per position and fused by `fc` (3 H -> H); one decoder layer reads
[input_layernorm(embedding of the next token) ; hidden_norm(feature)] (its attention input is 2 H, its residual
the feature); the final norm and `lm_head` score a draft vocabulary of Vd tokens, draft id i being target id
i + d2t[i]. The layer's output (before the norm) is the feature of the next drafted position: a chain, one
token per step, no tree.

Alignment: the head's position j reads the target's feature at position j and the token at j + 1, and predicts
the token at j + 2. After a round, the target's features of the accepted positions replace the head's own
(its cache is cropped back to the positions it read from the target, as the draft model's cache is cropped),
and the next round's first step reads them.

q is the head's distribution placed in the target's vocabulary (zero outside the draft vocabulary): a token is
a plain draw from it (its argmax when greedy), so lossless SD stays exact under greedy and sampling, and the
divergence rules read it as they read a draft model's. gamma = auto prices a step by the head's own measured
cost (Eagle3Head.step_seconds).

Formats read: the authors' (SafeAILab's `config.json` with `draft_vocab_size`, weights `pytorch_model.bin` or
`model.safetensors` with keys `midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`; AngelSlim's and SpecForge's
heads are the same) and the speculators format (`speculators_model_type` "eagle3", a `transformer_layer_config`,
keys `layers.0.*`). A head that does not fit its target is refused in one line (ConfigError).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from .acceptance import ConfigError
from .drafting import Draft, DraftSpace, _Learning
from .timing import best_seconds

if TYPE_CHECKING:  # annotations only
    from .causal_lm import CausalLM

SOURCE = "eagle3"  # the draft source's name (DecodeConfig.draft_source)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
COST_CONTEXT, COST_REPEATS = 32, 3  # step_seconds: rows read first, timings kept the best of
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")  # speculators' later variants


# ---------------------------------------------------------------- the format: config and weights


@dataclass(frozen=True)
class HeadSpec:
    """What a head's config says. layer: a transformers config of its decoder layer (sizes, norm eps, rope);
    layer_ids: the target layers whose inputs it fuses (None: the authors' default for the target's depth);
    qk_norm: a Qwen3 layer (RMSNorm on each head's queries and keys)."""

    layer: object
    draft_vocab_size: int
    target_hidden_size: int
    layer_ids: tuple[int, ...] | None
    norm_before_residual: bool = False
    qk_norm: bool = False

    @property
    def vocab_size(self) -> int:
        return int(self.layer.vocab_size)


def default_layer_ids(num_layers: int) -> tuple[int, ...]:
    """The authors' choice of low, middle and high layer for a target of num_layers layers."""
    return 2, num_layers // 2, num_layers - 3


def read_spec(config: dict) -> HeadSpec:
    """A head's config.json (either format) -> HeadSpec; ConfigError (one line) for what this module does not compute."""
    from transformers import AutoConfig

    speculators = "speculators_model_type" in config
    if speculators and config["speculators_model_type"] != SOURCE:
        raise ConfigError(f"this speculators head is {config['speculators_model_type']!r}, not an EAGLE-3 head")
    for flag in UNSUPPORTED_FLAGS:
        if config.get(flag):
            raise ConfigError(f"this EAGLE-3 head sets {flag}, a variant the Studio does not compute")
    layer_dict = dict(config.get("transformer_layer_config") or {}) if speculators else {
        key: value for key, value in config.items() if key not in ("architectures", "eagle_config")}
    model_type = layer_dict.pop("model_type", "llama")
    if model_type not in ("llama", "qwen3"):
        raise ConfigError(f"an EAGLE-3 head with a {model_type!r} layer is not supported (llama or qwen3 only)")
    try:
        layer = AutoConfig.for_model(model_type, **layer_dict)
    except (TypeError, ValueError, KeyError) as error:
        raise ConfigError(f"the EAGLE-3 head's config does not read as a {model_type} layer: {error}") from None
    if layer.num_hidden_layers != 1 or getattr(layer, "hidden_act", "silu") != "silu":
        raise ConfigError("only one-layer EAGLE-3 heads with SiLU MLPs are supported")
    ids = config.get("eagle_aux_hidden_state_layer_ids") if speculators else (
        (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    return HeadSpec(layer, int(config.get("draft_vocab_size") or layer.vocab_size),
                    int(config.get("target_hidden_size") or layer.hidden_size),
                    None if ids is None else tuple(int(i) for i in ids),
                    bool(config.get("norm_before_residual", False)), model_type == "qwen3")


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The head's tensors by our names (the authors' `midlayer.` is the speculators format's `layers.0.`)."""
    found = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not found:
        raise ConfigError(f"no EAGLE-3 weights in {folder} (expected {' or '.join(WEIGHT_FILES)})")
    from transformers.modeling_utils import load_state_dict  # either file kind, tensors only (weights_only)

    weights = {}
    for key, tensor in load_state_dict(found[0]).items():
        key = key.removeprefix("model.").replace("midlayer.", "layers.0.")
        if not key.startswith("verifier_"):  # speculators keeps the target's norm and head for training
            weights[key] = tensor
    return weights


# ---------------------------------------------------------------- the module


class RMSNorm(torch.nn.Module):
    """x / rms(x) * weight, computed in float32 and returned in x's dtype (as the authors' layers do)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        return self.weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class HeadCache:
    """The head's keys and values, [kv_heads, T, head_dim] each (None before the first step)."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[1])

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys if self.keys is None else torch.cat([self.keys, keys], 1)
        self.values = values if self.values is None else torch.cat([self.values, values], 1)

    def crop(self, length: int) -> None:
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :length], self.values[:, :length]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [heads, n, d] with cos, sin [n, d] (the rotate-half convention)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + turned * sin


class Attention(torch.nn.Module):
    """Grouped-query attention whose queries, keys and values read 2 H inputs ([embedding ; feature])."""

    def __init__(self, spec: HeadSpec):
        super().__init__()
        layer = spec.layer
        self.heads, self.kv_heads, self.head_dim = layer.num_attention_heads, layer.num_key_value_heads, layer.head_dim
        wide, bias = 2 * layer.hidden_size, bool(getattr(layer, "attention_bias", False))
        self.q_proj = torch.nn.Linear(wide, self.heads * self.head_dim, bias=bias)
        self.k_proj = torch.nn.Linear(wide, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = torch.nn.Linear(wide, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = torch.nn.Linear(self.heads * self.head_dim, layer.hidden_size, bias=bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, layer.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, layer.rms_norm_eps)
        self.qk_norm = spec.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """x [n, 2H] at the n positions after the cache's -> [n, H]; the cache grows by n."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.heads, self.head_dim)
        k = self.k_proj(x).view(n, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q.transpose(0, 1), cos, sin), rotate(k.transpose(0, 1), cos, sin)
        past = cache.length
        cache.append(k, v)
        group = self.heads // self.kv_heads
        keys, values = cache.keys.repeat_interleave(group, 0), cache.values.repeat_interleave(group, 0)
        allowed = torch.arange(past + n, device=x.device)[None, :] <= past + torch.arange(n, device=x.device)[:, None]
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)  # [heads, n, d]
        return self.o_proj(out.transpose(0, 1).reshape(n, self.heads * self.head_dim))


class MLP(torch.nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = torch.nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    """The head's one decoder layer over [input_layernorm(embedding) ; hidden_norm(feature)]."""

    def __init__(self, spec: HeadSpec):
        super().__init__()
        layer = spec.layer
        self.input_layernorm = RMSNorm(layer.hidden_size, layer.rms_norm_eps)
        self.hidden_norm = RMSNorm(layer.hidden_size, layer.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(layer.hidden_size, layer.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.mlp = MLP(layer.hidden_size, layer.intermediate_size)
        self.norm_before_residual = spec.norm_before_residual

    def forward(self, embedded, feature, cos, sin, cache: HeadCache) -> torch.Tensor:
        """embedded, feature [n, H] -> [n, H] (the residual stream: the feature, or its norm where the head says so)."""
        normed = self.hidden_norm(feature)
        residual = normed if self.norm_before_residual else feature
        mixed = torch.cat([self.input_layernorm(embedded), normed], -1)
        out = residual + self.self_attn(mixed, cos, sin, cache)
        return out + self.mlp(self.post_attention_layernorm(out))


class HeadModule(torch.nn.Module):
    """fc, the layer, norm, lm_head; d2t [Vd] as a buffer. Its parameter names are the checkpoints' keys."""

    def __init__(self, spec: HeadSpec, num_fused: int):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        layer = spec.layer
        self.fc = torch.nn.Linear(num_fused * spec.target_hidden_size, layer.hidden_size, bias=False)
        self.layers = torch.nn.ModuleList([Layer(spec)])
        self.norm = RMSNorm(layer.hidden_size, layer.rms_norm_eps)
        self.lm_head = torch.nn.Linear(layer.hidden_size, spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        self.rotary = LlamaRotaryEmbedding(layer)  # every rope type transformers knows (llama3, linear, yarn...)

    def forward(self, embedded: torch.Tensor, features: torch.Tensor, cache: HeadCache, fuse: bool) -> torch.Tensor:
        """embedded [n, H] (the tokens after the features' positions), features [n, 3 H] (the target's, fused
        here: fuse) or [n, H] (the head's own outputs) -> the layer's outputs [n, H], before the final norm."""
        if fuse:
            features = self.fc(features)
        positions = torch.arange(cache.length, cache.length + embedded.shape[0], device=embedded.device)
        cos, sin = self.rotary(features, positions[None])
        return self.layers[0](embedded, features, cos[0], sin[0], cache)


# ---------------------------------------------------------------- a head bound to its target


def check_fit(spec: HeadSpec, weights: dict[str, torch.Tensor], target: "CausalLM", layer_ids: tuple[int, ...]) -> None:
    """ConfigError (one line) where the head does not fit the target: its hidden size, vocabulary or layer ids."""
    depth = len(target.decoder.layers)
    rows, width = target.model.get_input_embeddings().weight.shape
    if spec.target_hidden_size != target.hidden_size:
        raise ConfigError(f"the EAGLE-3 head reads a target of hidden size {spec.target_hidden_size}; "
                          f"{target.name} has {target.hidden_size}")
    if "embed_tokens.weight" not in weights and width != spec.layer.hidden_size:
        raise ConfigError(f"the EAGLE-3 head embeds tokens in {spec.layer.hidden_size} dimensions and ships no "
                          f"embedding; {target.name}'s embedding has {width}")
    if spec.vocab_size != rows:
        raise ConfigError(f"the EAGLE-3 head maps into a vocabulary of {spec.vocab_size} tokens; "
                          f"{target.name} has {rows}")
    if len(layer_ids) < 1 or any(not 0 <= i < depth for i in layer_ids):
        raise ConfigError(f"the EAGLE-3 head reads target layers {list(layer_ids)}; {target.name} has layers "
                          f"0..{depth - 1}")
    fused = weights.get("fc.weight")
    if fused is not None and fused.shape[-1] != len(layer_ids) * target.hidden_size:
        raise ConfigError(f"the EAGLE-3 head fuses {fused.shape[-1]} features; {len(layer_ids)} layers of "
                          f"{target.name} give {len(layer_ids) * target.hidden_size}")


def build_module(spec: HeadSpec, weights: dict[str, torch.Tensor], num_fused: int, dtype, device) -> HeadModule:
    """The module with the checkpoint's tensors; ConfigError (one line) for a missing or misshapen one."""
    module = HeadModule(spec, num_fused)
    if "embed_tokens.weight" in weights:
        module.embed_tokens = torch.nn.Embedding(*weights["embed_tokens.weight"].shape)
    expected = module.state_dict()
    if "d2t" not in weights and spec.draft_vocab_size == spec.vocab_size:
        weights = {**weights, "d2t": expected["d2t"]}  # one vocabulary: the identity map
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ConfigError(f"the EAGLE-3 checkpoint lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    for key, tensor in expected.items():
        if tuple(weights[key].shape) != tuple(tensor.shape):
            raise ConfigError(f"the EAGLE-3 checkpoint's {key} is {tuple(weights[key].shape)}, its config says "
                              f"{tuple(tensor.shape)}")
    module.load_state_dict({key: weights[key] for key in expected})
    module.to(device=device, dtype=dtype).eval().requires_grad_(False)
    module.rotary = type(module.rotary)(spec.layer).to(device)  # made anew: its frequencies stay float32
    return module


class Eagle3Head:
    """A loaded EAGLE-3 head bound to the target it reads: the module, the layers it fuses, its token map.
    Binding sets the target's `layers_kept` (CausalLM.hidden then keeps those layers' inputs)."""

    def __init__(self, module: HeadModule, target: "CausalLM", layer_ids: tuple[int, ...], name: str):
        self.module, self.target, self.layer_ids, self.name = module, target, layer_ids, name
        self.device = target.device
        ids = torch.arange(module.d2t.shape[0], device=self.device) + module.d2t
        # Draft ids beyond the target's tokens (its embedding may have padding rows) are never proposed.
        self.columns = torch.nonzero(ids < target.vocab_size).flatten()  # [Vd'] draft ids kept
        self.target_ids = ids[self.columns]  # [Vd'] their target ids
        self._step_seconds: float | None = None
        target.layers_kept = layer_ids

    @property
    def hidden_size(self) -> int:
        return int(self.module.norm.weight.shape[0])

    def new_cache(self) -> HeadCache:
        return HeadCache()

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [n] -> [n, H]: the head's own embedding where it ships one, else the target's."""
        table = getattr(self.module, "embed_tokens", None)
        table = self.target.model.get_input_embeddings() if table is None else table
        return table(token_ids).to(self.module.norm.weight.dtype)

    @torch.inference_mode()
    def step(self, features: torch.Tensor, token_ids: torch.Tensor, cache: HeadCache, fuse: bool) -> torch.Tensor:
        """features [n, 3 H] (the target's layer inputs: fuse) or [n, H] (the head's outputs), token_ids [n]
        -> the outputs [n, H]; the cache grows by n."""
        return self.module(self.embed(token_ids), features.to(self.module.norm.weight.dtype), cache, fuse)

    @torch.inference_mode()
    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """out [..., H] -> float32 logits [..., V] in the target's vocabulary: -inf outside the draft vocabulary."""
        scores = self.module.lm_head(self.module.norm(out)).float()[..., self.columns]
        full = scores.new_full((*scores.shape[:-1], self.target.vocab_size), float("-inf"))
        full[..., self.target_ids] = scores
        return full

    def features(self, start: int, end: int) -> torch.Tensor:
        """The target's fused-layer inputs at positions start..end - 1 [end - start, 3 H], from its last call."""
        first, kept = self.target.kept_inputs
        if start < first or end > first + kept.shape[0]:
            raise RuntimeError(f"the target's last call kept positions {first}..{first + kept.shape[0] - 1}, "
                               f"not {start}..{end - 1}")
        return kept[start - first : end - first]

    @torch.inference_mode()
    def step_seconds(self) -> float:
        """One drafting step (one row through the head, its logits), measured once: the best of COST_REPEATS
        after COST_CONTEXT rows read. What gamma = auto prices a drafted token at."""
        if self._step_seconds is None:
            cache, dtype = self.new_cache(), self.module.norm.weight.dtype
            wide = torch.zeros(COST_CONTEXT, self.module.fc.in_features, device=self.device, dtype=dtype)
            ids = torch.zeros(COST_CONTEXT, dtype=torch.long, device=self.device)
            out = self.step(wide, ids, cache, fuse=True)[-1:]
            self._step_seconds = best_seconds(self.device, COST_REPEATS,
                                              lambda: self.logits(self.step(out, ids[:1], cache, fuse=False)),
                                              lambda: cache.crop(COST_CONTEXT))
        return self._step_seconds


def load_head(folder: Path, target: "CausalLM", name: str = "") -> Eagle3Head:
    """The head saved in `folder` (config.json and its weights, either format), checked against and bound to
    `target`, in the target's device and compute dtype; ConfigError (one line) where it does not fit."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read the EAGLE-3 head's config.json in {folder}: {error}") from None
    spec = read_spec(config)
    weights = read_weights(folder)
    layer_ids = spec.layer_ids or default_layer_ids(len(target.decoder.layers))
    check_fit(spec, weights, target, layer_ids)
    module = build_module(spec, weights, len(layer_ids), target.compute_dtype, target.device)
    return Eagle3Head(module, target, layer_ids, name or folder.name)


def load_named(name: str, target: "CausalLM", elsewhere: Callable[[str], Path]) -> Eagle3Head:
    """The head `name` names, bound to `target` (load_head): the folder `name`, or where it is no folder, the one
    elsewhere(name) gives or refuses in one line (the Studio's loader fetches a hub id; generate() takes folders)."""
    folder = Path(name)
    return load_head(folder if folder.is_dir() else elsewhere(name), target, name)


# ---------------------------------------------------------------- the drafter


def drafter(space: DraftSpace, head: Eagle3Head | None) -> "Eagle3Drafter":
    """The eagle3 source's drafter over the pair's head; ConfigError (one line) for a pair without one."""
    if head is None:
        raise ConfigError("the eagle3 draft source needs an EAGLE-3 head for this target (the bench's --eagle3-head)")
    return Eagle3Drafter(space, head)


class Eagle3Drafter(_Learning):
    """A chain of EAGLE-3 drafts. The head's cache holds `read` positions computed from the target's features;
    `pending` [m, 3 H] holds the target's features of the next m positions, not read yet (the accepted ones of
    the last round); a round's own positions are cropped away when it ends."""

    source = SOURCE

    def __init__(self, space: DraftSpace, head: Eagle3Head):
        super().__init__(space)
        self.head = head
        self.draft_step = head.step_seconds() if space.decode.gamma_auto else None
        self.cache = head.new_cache()
        self.read = 0
        self.pending = torch.empty(0, head.module.fc.in_features, device=head.device)

    def start(self, prompt_ids: list[int]) -> None:
        """The prompt's features, kept by the target's prefill (the call just before this one)."""
        self.pending = self.head.features(0, len(prompt_ids))

    def propose(self, tokens: list[int], limit: int) -> Draft:
        """Up to length(limit) tokens, each a plain draw from q (its argmax when greedy); the first step reads the
        pending features with the tokens that follow their positions, each later one the head's own output."""
        gamma = self.length(limit)
        if gamma <= 0:
            return self.space.one_hot([], self.source, gamma)
        following = self.space.ids(tokens[self.read + 1 : self.read + 1 + self.pending.shape[0]])
        out = self.head.step(self.pending, following, self.cache, fuse=True)[-1]  # [H]
        self.read, self.pending = self.cache.length, self.pending[:0]
        return self.chain(gamma, out, self.head.logits,
                          lambda state, token: self.head.step(state[None], token, self.cache, fuse=False)[0])

    def learn(self, draft: Draft, num_accepted: int, kept_length: int) -> None:
        """Crop the round's own positions; keep the target's features of the positions it now holds
        (kept_length: the committed tokens but the extra one) for the next round's first step."""
        super().learn(draft, num_accepted, kept_length)
        self.cache.crop(self.read)
        known = self.read + self.pending.shape[0]
        if kept_length > known:
            self.pending = torch.cat([self.pending, self.head.features(known, kept_length)])
