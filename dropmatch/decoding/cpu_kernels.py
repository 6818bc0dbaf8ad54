"""CPU kernels for the few rows decoding multiplies, each used only where it measured faster here.

A linear layer meets one row (a draft step, an autoregressive step) or a few (a verify step's gamma + 1)
per call. torch's default (`F.linear`) is not the fastest product for every shape on every CPU: on some,
laying the product out as (W x^T)^T ("rows") or multiplying through oneDNN with a weight packed for a few
rows ("packed") is several times faster; on others, torch's default wins. Which one pays depends on the
CPU (its BLAS path, AVX-512, AMX) and the layer's shape, so the loader step (`prepare_for_cpu`) times the
three on this machine, per layer shape and per row count (one row; a few rows), and keeps torch's
default unless another takes under MARGIN of its time. The choice is logged once and recorded with every
run (`kernel_summary`); DROPMATCH_CPU_KERNELS=torch|rows|packed pins it (tests force each choice; runs
meant to compare across machines can pin `torch`). Every kernel gives the same products up to fp32
rounding.

More rows than FEW_MAX_ROWS (a prompt) always take torch's default: oneDNN caches a compiled primitive
per row count it meets, never given back, so only the few row counts of decoding reach "packed".
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections import Counter

import torch

LOG = logging.getLogger("dropmatch.kernels")
KERNELS = ("torch", "rows", "packed")
PACKED_ROWS = 8  # the row count oneDNN lays a packed weight out for, and the "few rows" measured
FEW_MAX_ROWS = 16  # more rows than this take torch's default
MARGIN = 0.8  # a hand-laid kernel must take under this share of torch's time: near-ties keep torch's


def row_linear(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] @ weight[V, H].T -> [..., V], computed as (weight @ hidden.T).T (the "rows" kernel)."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    return (weight @ rows.T).T.contiguous().reshape(*hidden.shape[:-1], weight.shape[0])


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """An opaque oneDNN copy of weight [V, H] laid out for PACKED_ROWS rows (doubles the layer's memory)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_ROWS)


def apply_kernel(kernel: str, rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 packed: torch.Tensor | None = None) -> torch.Tensor:
    """rows [n, H] -> [n, V] through one kernel of KERNELS ("packed" needs packed_weight(weight))."""
    if kernel == "packed":
        return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    if kernel == "rows":
        out = row_linear(rows, weight)
        return out if bias is None else out + bias
    return torch.nn.functional.linear(rows, weight, bias)


class ChosenLinear(torch.nn.Linear):
    """An nn.Linear (same parameters, shared, not copied) that multiplies one row with the kernel
    `one` and 2..FEW_MAX_ROWS rows with the kernel `few` (see the module's docstring); more rows, a
    changed weight (in place or by .to()) or autograd take torch's default."""

    one: str = "torch"
    few: str = "torch"
    packed: torch.Tensor | None = None
    _packed_version = -1

    @classmethod
    def sharing(cls, linear: torch.nn.Linear, one: str, few: str, packed: torch.Tensor | None) -> "ChosenLinear":
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        module.weight, module.bias = linear.weight, linear.bias
        module.one, module.few = one, few
        if packed is not None:
            module.packed, module._packed_version = packed, linear.weight._version
        return module

    def __getstate__(self):  # copy.deepcopy / pickle: an opaque oneDNN tensor cannot be copied
        return {**self.__dict__, "packed": None}

    def _apply(self, fn, recurse=True):
        self.packed = None
        return super()._apply(fn, recurse)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, hidden.shape[-1])
        count = rows.shape[0]
        kernel = self.one if count == 1 else self.few if count <= FEW_MAX_ROWS else "torch"
        if kernel == "packed" and (self.packed is None or self._packed_version != self.weight._version
                                   or torch.is_grad_enabled()):
            self.packed, kernel = None, "torch"
        if kernel == "torch":
            return torch.nn.functional.linear(hidden, self.weight, self.bias)
        out = apply_kernel(kernel, rows, self.weight, self.bias, self.packed)
        return out.reshape(*hidden.shape[:-1], self.out_features)


def _median_seconds(run, repeats: int) -> float:
    run()  # the first call pays one-off setup (oneDNN compiles a primitive)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def fastest_kernel(weight: torch.Tensor, num_rows: int, packed: torch.Tensor | None, repeats: int = 5) -> str:
    """The kernel for num_rows rows times weight [V, H] on this machine: torch's default unless
    "rows" or "packed" (where a packed copy is given) takes under MARGIN of its time."""
    rows = torch.randn(num_rows, weight.shape[1], dtype=weight.dtype)
    candidates = [kernel for kernel in KERNELS if kernel != "packed" or packed is not None]
    seconds = {kernel: _median_seconds(lambda k=kernel: apply_kernel(k, rows, weight, None, packed), repeats)
               for kernel in candidates}
    best = min(candidates, key=seconds.get)
    return best if seconds[best] < MARGIN * seconds["torch"] else "torch"


def pinned_kernel(environ=os.environ) -> str | None:
    """DROPMATCH_CPU_KERNELS (torch, rows or packed), or None: measure."""
    pinned = environ.get("DROPMATCH_CPU_KERNELS", "").strip().lower()
    if pinned and pinned not in KERNELS:
        raise ValueError(f"DROPMATCH_CPU_KERNELS must be one of {', '.join(KERNELS)}, got {pinned!r}")
    return pinned or None


def choose_kernels(model: torch.nn.Module, pack: bool, pinned: str | None = None) -> int:
    """Swap, in place, every fp32 nn.Linear of a CPU model for a ChosenLinear sharing its weights
    (tied weights stay tied), its kernels measured once per distinct weight shape (or `pinned`);
    packed copies are made only where `pack` allows and the measurement chose them. Other dtypes keep
    nn.Linear. Returns the number of layers swapped."""
    pack = pack and torch.backends.mkldnn.is_available()
    plans: dict[tuple[int, ...], tuple[str, str]] = {}
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not (type(child) is torch.nn.Linear and child.weight.device.type == "cpu"
                    and child.weight.dtype == torch.float32):
                continue
            shape = tuple(child.weight.shape)
            if shape not in plans:
                plans[shape] = _plan(child.weight, packed_weight(child.weight) if pack else None, pinned)
            one, few = plans[shape]
            packed = packed_weight(child.weight) if "packed" in (one, few) else None
            setattr(parent, name, ChosenLinear.sharing(child, one, few, packed))
            swapped += 1
    return swapped


def _plan(weight: torch.Tensor, packed: torch.Tensor | None, pinned: str | None) -> tuple[str, str]:
    """(kernel for one row, kernel for a few rows) of one weight shape."""
    if pinned is not None:
        usable = pinned if pinned != "packed" or packed is not None else "torch"
        return usable, usable
    return fastest_kernel(weight, 1, packed), fastest_kernel(weight, PACKED_ROWS, packed)


def kernel_summary(model: torch.nn.Module) -> str:
    """What the loader chose, for a run's record: "torch" when every layer takes torch's default,
    else the layers per (one-row kernel, few-rows kernel), e.g. "1 row rows / few packed: 31; torch: 180"."""
    counts = Counter(f"1 row {m.one} / few {m.few}" for m in model.modules()
                     if isinstance(m, ChosenLinear) and (m.one, m.few) != ("torch", "torch"))
    if not counts:
        return "torch"
    return "; ".join(f"{key}: {count}" for key, count in sorted(counts.items())) + "; other layers torch"


def linear_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights of a model's nn.Linear layers (what packing them would copy)."""
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(w.numel() * w.element_size() for w in weights.values())


def onednn_chunks(length: int, device: torch.device, dtype: torch.dtype) -> list[int]:
    """Sizes to feed `length` input rows in, so that a model multiplying through oneDNN (bf16 on a
    CPU) meets only row counts from a fixed set: the powers of two in `length` (largest first; at
    most 512 rows a piece), e.g. 37 -> [32, 4, 1]. A model multiplying otherwise is fed whole."""
    if device.type != "cpu" or dtype == torch.float32 or length <= 1:
        return [length]
    sizes = [512] * (length // 512)
    rest = length % 512
    return sizes + [1 << bit for bit in reversed(range(rest.bit_length())) if rest >> bit & 1]


FAST_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def fast_dtype(device: torch.device, environ=os.environ) -> torch.dtype:
    """The dtype for the Monte-Carlo path rows and the embedded draft: bf16 where the hardware
    multiplies it natively. DROPMATCH_FAST_DTYPE=float32 (or bfloat16) pins it: bf16 kernels differ
    between CPUs (AMX, AVX-512 BF16), so runs meant to compare across machines pin float32."""
    pinned = environ.get("DROPMATCH_FAST_DTYPE", "").strip().lower()
    if pinned:
        if pinned not in FAST_DTYPES:
            raise ValueError(f"DROPMATCH_FAST_DTYPE must be one of {', '.join(FAST_DTYPES)}, got {pinned!r}")
        return FAST_DTYPES[pinned]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32


def prepare_for_cpu(model: torch.nn.Module, free_bytes: int, environ=os.environ) -> torch.nn.Module:
    """The loader step for a model that runs on a CPU: its fp32 linear layers become ChosenLinears,
    each shape's kernels measured here (or pinned by DROPMATCH_CPU_KERNELS), packed weight copies
    allowed only where four times the weights fit in `free_bytes` (a copy doubles a layer's weights).
    The choice is logged once. A model on another device is returned as it is."""
    if next(model.parameters()).device.type == "cpu":
        pinned = pinned_kernel(environ)
        if choose_kernels(model, pack=4 * linear_bytes(model) < free_bytes, pinned=pinned):
            LOG.info("CPU kernels (%s): %s", "pinned" if pinned else "measured here", kernel_summary(model))
    return model


@contextlib.contextmanager
def torch_default_kernels(*models: torch.nn.Module | None):
    """Within the block, every ChosenLinear of the models (None: none) takes torch's default, as the plain
    model a user loads does (the yardstick of transformers' own generate())."""
    layers = [m for model in models if model is not None for m in model.modules() if isinstance(m, ChosenLinear)]
    chosen = [(m.one, m.few) for m in layers]
    for layer in layers:
        layer.one = layer.few = "torch"
    try:
        yield
    finally:
        for layer, (one, few) in zip(layers, chosen):
            layer.one, layer.few = one, few
