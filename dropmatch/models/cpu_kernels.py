"""CPU kernels for the few rows decoding multiplies: an explicit loader step (`prepare_for_cpu`).

On a CPU (MKL), the few-row product of a token's hidden state with a transposed weight takes a slow
path, and in fp32 a single row (a matrix-vector product) is slower still than two. `row_linear`
lays the product out as (W x^T)^T; `RowLinear` is an nn.Linear that uses it for one or two rows and,
for three or more, oneDNN with a packed copy of its weight. Same products up to fp32 rounding;
docs/results-2026-11-30.md has what they were measured to save.

oneDNN (and PyTorch's ideep layer over it) caches a compiled primitive per row count, up to 1024 of
them, a few MB each, never given back: fed every prompt length a server meets, the process grows by
megabytes per new length. So only row counts from a small fixed set reach oneDNN: RowLinear pads more
than PACKED_MAX_ROWS rows with zero rows to a power of two (rows are independent in a linear layer),
and CausalLM.hidden feeds an input to a model whose blocks multiply through oneDNN (bf16 on a CPU) in
chunks of power-of-two sizes.
"""

from __future__ import annotations

import os

import torch


def row_linear(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] @ weight[V, H].T -> [..., V], computed as (weight @ hidden.T).T.

    Same product, laid out for the few rows decoding multiplies (faster on a CPU than the transposed
    right operand); one fp32 row is multiplied as two (faster than a matrix-vector product there).
    """
    rows = hidden.reshape(-1, hidden.shape[-1])
    if rows.shape[0] == 1 and weight.dtype == torch.float32 and weight.device.type == "cpu":
        out = (weight @ rows.repeat(2, 1).T)[:, :1].T.contiguous()  # a copy: a stride-0 view is slow
    else:
        out = (weight @ rows.T).T.contiguous()
    return out.reshape(*hidden.shape[:-1], weight.shape[0])


PACKED_ROWS = 8  # the row count oneDNN lays a packed weight out for
PACKED_MAX_ROWS = 16  # more rows (a prompt) are padded to a power of two (see the module's docstring)


class RowLinear(torch.nn.Linear):
    """An nn.Linear (same parameters, shared, not copied) for the few rows decoding multiplies on
    a CPU: one or two rows go through row_linear; three or more through oneDNN with a packed copy
    of the weight when pack() made one (more than PACKED_MAX_ROWS padded with zero rows to a power
    of two), otherwise through row_linear too. The packed copy is for
    inference; it is dropped when the weights change (in place, or by .to())."""

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
            num_rows = rows.shape[0]
            if num_rows > PACKED_MAX_ROWS:
                rows = torch.nn.functional.pad(rows, (0, 0, 0, (1 << (num_rows - 1).bit_length()) - num_rows))
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")[:num_rows]
            return out.reshape(*hidden.shape[:-1], self.out_features)
        out = row_linear(hidden, self.weight)
        return out if self.bias is None else out + self.bias


def use_row_linears(model: torch.nn.Module, pack: bool) -> None:
    """Swap, in place, every fp32 nn.Linear of a model on a CPU for a RowLinear sharing its
    weights (tied weights stay tied), with a packed copy of each weight when `pack`. Other dtypes
    keep nn.Linear (a bf16 draft's single rows got slower multiplied as two)."""
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




def prepare_for_cpu(model: torch.nn.Module, free_bytes: int) -> torch.nn.Module:
    """The loader step for a model that runs on a CPU: its fp32 linear layers become RowLinears,
    with packed weight copies only where four times the weights fit in `free_bytes` (the copies
    double the linear weights). A model on another device is returned as it is."""
    if next(model.parameters()).device.type == "cpu":
        use_row_linears(model, pack=4 * linear_bytes(model) < free_bytes)
    return model
