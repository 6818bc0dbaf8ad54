"""Monte-Carlo dropout on the LM-head input (pure tensor functions, no model).

The transformer blocks run once. Only the final hidden states h [n, H] are perturbed:
h^(i) = h * m^(i) / (1 - p), m^(i) ~ Bernoulli(1 - p). The engine runs paths only at the
positions the rule judges; CausalLM.path_logits computes them (in one dense matmul, or sparsely from
the clean logits: the device's capability and a count decide, never a timing).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch

from .sampling import js_divergence, scaled_logits, top_token

CENTROIDS = ("probs", "logits")  # mean of the path distributions (the method's) / softmax of the mean logits


def mask_seed(seed: int, prompt_ids) -> int:
    """The key of a run's dropout masks: its seed and a hash of its prompt's token ids. With one seed
    for a whole benchmark, every prompt still draws its own masks, and a request's masks never
    depend on what else runs beside it (a batch, another visitor)."""
    digest = hashlib.blake2b(struct.pack(f"<{len(prompt_ids)}q", *prompt_ids), digest_size=8,
                             key=struct.pack("<Q", seed % 2**64)).digest()
    return int.from_bytes(digest, "little") % (2**63 - 1)


def mc_generator(key: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The random stream of p = auto's calibration masks for a run's mask key (mask_seed), apart from
    the stream that sampling and acceptance draw from (as the drafted positions' masks are, see
    keyed_masks): so drawing masks never shifts a sampled token, and at p = 0 a path rule's run
    equals lossless SD's."""
    derived = (key * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(derived)


# How the drafted positions' masks are drawn (RuleConfig.mask_draw). "per_position": a torch generator
# seeded with each position's key, one draw per position (MT19937 on a CPU, the device's own generator
# elsewhere); every recorded run uses it. "counter": a keyed integer hash of (position key, path, unit),
# every position of a step in one batched draw and the same bits on every device (a labelled option:
# other masks than per_position's, so other decisions).
MASK_DRAWS = ("per_position", "counter")


def keyed_masks(keys: list[tuple[int, int]], num_paths: int, p: float, hidden_size: int,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                draw: str = "per_position") -> torch.Tensor:
    """K Bernoulli(1 - p) keep masks [K, n, H] for n drafted tokens, keys [n] of (a run's mask key,
    the token's sequence position).

    Each position draws from a stream keyed by (the run's mask key, position) alone, apart from
    sampling's: so a position's paths are the same whichever other positions (or runs, in a served
    batch) are computed with it, and the rule lab re-judges a run's drafts with the very paths the
    engine drew. draw: one of MASK_DRAWS."""
    if draw == "counter":
        return counter_masks(keys, num_paths, p, hidden_size, device).to(dtype)
    if draw != "per_position":
        raise ValueError(f"mask draw must be one of {MASK_DRAWS}, got {draw!r}")
    generator = torch.Generator(device=device)
    columns = []
    for key, position in keys:
        generator.manual_seed(_position_key(key, int(position)))
        keep = torch.full((num_paths, 1, hidden_size), 1.0 - p, device=device, dtype=torch.float32)
        columns.append(torch.bernoulli(keep, generator=generator))
    return torch.cat(columns, 1).to(dtype)


def _position_key(key: int, position: int) -> int:
    return (key * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % (2**63 - 1)


def counter_masks(keys: list[tuple[int, int]], num_paths: int, p: float, hidden_size: int,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """keyed_masks' "counter" draw: [K, n, H] bool, unit (k, h) of position i kept iff
    hash32(hash32((k * H + h) ^ a_i) ^ b_i) >= round(p * 2^32), with (a_i, b_i) two 32-bit words of
    the position's key (_position_key). Integer ops only (no generator, no float), so the bits are the
    same on every device and for any batch: P(keep) = 1 - p to within 2^-32. The whole step is one
    fixed chain of elementwise ops, whatever n: no reseed and no launch per position."""
    position_keys = torch.tensor([_position_key(key, int(position)) for key, position in keys],
                                 dtype=torch.int64, device=device)  # [n], each in [0, 2^63)
    word_a = _hash32(position_keys & _LOW32)
    word_b = _hash32((position_keys >> 32) ^ word_a)
    units = torch.arange(num_paths * hidden_size, dtype=torch.int64, device=device)  # [K * H]
    bits = _hash32(_hash32(units.view(1, -1) ^ word_a.view(-1, 1)) ^ word_b.view(-1, 1))  # [n, K * H]
    kept = bits >= round(p * 2**32)
    return kept.view(-1, num_paths, hidden_size).transpose(0, 1)


_LOW32 = 0xFFFFFFFF


def _hash32(words: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (xor-shift, multiply, twice: the "lowbias32" constants) on int64 words
    in [0, 2^32), elementwise; every product stays below 2^63, so no op overflows on any device."""
    words = words ^ (words >> 16)
    words = _times32(words, 0x7FEB352D)
    words = words ^ (words >> 15)
    words = _times32(words, 0x846CA68B)
    return words ^ (words >> 16)


def _times32(words: torch.Tensor, factor: int) -> torch.Tensor:
    """words * factor mod 2^32 for int64 words in [0, 2^32): the factor in two 16-bit halves."""
    low = words * (factor & 0xFFFF)
    high = ((words * (factor >> 16)) & 0xFFFF) << 16
    return (low + high) & _LOW32


def dropout_masks(hidden: torch.Tensor, num_paths: int, p: float, generator: torch.Generator) -> torch.Tensor:
    """K Bernoulli(1 - p) keep masks [K, n, H] (0/1, hidden's dtype) for hidden [n, H]."""
    keep = torch.full((num_paths, *hidden.shape), 1.0 - p, device=hidden.device, dtype=torch.float32)
    return torch.bernoulli(keep, generator=generator).to(hidden.dtype)


def masked_rows(hidden: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """The Monte-Carlo paths' head inputs h * m / (1 - p) (inverted dropout: the expectation kept):
    hidden [n, H], keep [K, n, H] 0/1 -> [K, n, H] in hidden's dtype. The one place this is written:
    the engine's head, the calibration and the vLLM plugin all call it."""
    return hidden.unsqueeze(0) * keep.to(hidden.dtype) / (1.0 - p)


def dropout_paths(hidden: torch.Tensor, num_paths: int, p: float, generator: torch.Generator) -> torch.Tensor:
    """hidden [n, H] -> K dropout copies [K, n, H] (inverted dropout, expectation kept)."""
    if p == 0.0:
        return hidden.unsqueeze(0).expand(num_paths, *hidden.shape)
    return masked_rows(hidden, dropout_masks(hidden, num_paths, p, generator), p)


@dataclass(frozen=True)
class PathStats:
    """What the K paths say at each judged position.

    probs [K, g, V] path distributions; tokens [K, g] each path's top token (its argmax, under
    greedy and sampling alike); centroid [g, V]; path_js [K, g] = JS(path || centroid);
    threshold [g] = max over paths of path_js.
    """

    probs: torch.Tensor
    tokens: torch.Tensor
    centroid: torch.Tensor
    path_js: torch.Tensor
    threshold: torch.Tensor

    @classmethod
    def of_clean_row(cls, clean_logits: torch.Tensor, clean_probs: torch.Tensor, num_paths: int) -> "PathStats":
        """p = 0: every path is the clean row, clean_logits [g, V] with clean_probs [g, V] its
        distribution (at the run's temperature): the paths' tokens are its argmax, their centroid is
        clean_probs itself (the same tensor, so a caller may reuse what it computed from it), JS 0."""
        zeros = clean_probs.new_zeros(clean_probs.shape[:-1])
        one = cls(probs=clean_probs.unsqueeze(0), tokens=top_token(clean_logits).unsqueeze(0), centroid=clean_probs,
                  path_js=zeros.unsqueeze(0), threshold=zeros)
        return one.expanded(num_paths)

    def expanded(self, num_paths: int) -> "PathStats":
        """The stats of one path repeated as K identical paths (views, no copies): p = 0."""
        return PathStats(probs=self.probs.expand(num_paths, *self.probs.shape[1:]),
                         tokens=self.tokens.expand(num_paths, *self.tokens.shape[1:]), centroid=self.centroid,
                         path_js=self.path_js.expand(num_paths, *self.path_js.shape[1:]), threshold=self.threshold)


def path_stats(path_logits: torch.Tensor, temperature: float, centroid: str = "probs") -> PathStats:
    """path_logits [K, g, V] -> PathStats. temperature 0 (greedy) reads the logits at 1.

    centroid "probs": the mean of the K path distributions (the method's centroid); "logits": the
    softmax of the mean logits (sharper; a labelled option)."""
    if centroid not in CENTROIDS:
        raise ValueError(f"centroid must be one of {CENTROIDS}, got {centroid!r}")
    scaled = scaled_logits(path_logits, temperature)
    tokens = top_token(path_logits)
    probs = scaled.softmax(-1)
    if probs.shape[0] == 1:
        # One path (p = 0 repeats the clean row) is its own centroid, either way: JS exactly 0, no vocabulary pass.
        mean, path_js = probs[0], probs.new_zeros(probs.shape[:-1])
    else:
        mean = probs.mean(0) if centroid == "probs" else scaled.mean(0).softmax(-1)
        path_js = js_divergence(probs, mean.unsqueeze(0))
    return PathStats(probs=probs, tokens=tokens, centroid=mean, path_js=path_js, threshold=path_js.max(0).values)


P_GRID = (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5)


@dataclass(frozen=True)
class Calibration:
    """p = auto's choice: p, the agreement measured at each grid value tried, and whether any grid
    value reached the target (when none did, p is the grid's smallest)."""

    p: float
    tried: dict[float, float]
    reached: bool


def calibrate_p(
    hidden: torch.Tensor, clean_logits: torch.Tensor, head_weight: torch.Tensor, num_paths: int,
    target_agreement: float, generator: torch.Generator, grid: tuple[float, ...] = P_GRID, top_k: int = 64,
) -> Calibration:
    """The largest p of the grid whose paths still agree with the clean argmax at target_agreement.

    hidden [n, H] (prompt positions), clean_logits [n, V] (the model's own head on them),
    head_weight [V, H]. Data-free: it reads only the prompt's own hidden states. Each path's argmax
    is searched among the clean top_k tokens of its position (where it lies unless p is very
    large): the n x top_k head rows are gathered once, never the whole head copied, and only the
    masks and one small product change with p. The scan stops at the first miss.
    """
    candidates = clean_logits.topk(min(top_k, clean_logits.shape[-1]), dim=-1).indices  # [n, k]
    candidate_weight = head_weight.detach()[candidates].float()  # [n, k, H]
    hidden = hidden.float()
    chosen, tried = None, {}
    for p in grid:
        paths = dropout_paths(hidden, num_paths, p, generator)  # [K, n, H]
        path_logits = torch.einsum("knh,nch->knc", paths, candidate_weight)
        tried[p] = float((path_logits.argmax(-1) == 0).float().mean())  # column 0 is the clean argmax
        if tried[p] < target_agreement:
            break
        chosen = p
    return Calibration(p=grid[0] if chosen is None else chosen, tried=tried, reached=chosen is not None)
