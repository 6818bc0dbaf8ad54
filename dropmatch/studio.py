"""Which pair is loaded, and who may load what: the app's one piece of model state.

Loading is lazy (first use) and one pair at a time: switching pairs frees the previous one.
Environment:
  DROPMATCH_ALLOWED_MODELS   comma-separated hub ids a user may pick (public Spaces); unset = any
  DROPMATCH_TRUST_REMOTE_CODE=1  lets transformers run a model repository's own code (off by default)
"""

from __future__ import annotations

import gc
import os
import threading
from dataclasses import dataclass, replace
from typing import Callable

from .config import EMBEDDED, ConfigError, PairSpec

PRESETS: dict[str, PairSpec | None] = {
    "Embedded CPU pair: SmolLM2-135M-Instruct + shipped draft": PairSpec(),
    "SmolLM2-1.7B-Instruct / SmolLM2-135M-Instruct (GPU)": PairSpec(
        "HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "Qwen3-8B / Qwen3-0.6B (GPU)": PairSpec("Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"),
    "Custom hub ids": None,
}
DEFAULT_PRESET = next(iter(PRESETS))


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Policy:
    allowed_models: frozenset[str] | None = None
    trust_remote_code: bool = False

    @staticmethod
    def from_env(environ=os.environ) -> "Policy":
        allowed = environ.get("DROPMATCH_ALLOWED_MODELS")
        names = frozenset(n.strip() for n in allowed.split(",") if n.strip()) if allowed else None
        return Policy(allowed_models=names, trust_remote_code=_truthy(environ.get("DROPMATCH_TRUST_REMOTE_CODE")))

    def check(self, spec: PairSpec) -> PairSpec:
        if spec.target != EMBEDDED and self.allowed_models is not None:
            for name in (spec.target, spec.draft):
                if name not in self.allowed_models:
                    raise ConfigError(f"{name!r} is not on this server's list of allowed models")
        return replace(spec, trust_remote_code=self.trust_remote_code)


def pair_from_choice(preset: str, target: str = "", draft: str = "") -> PairSpec:
    """The PairSpec for a preset name, or for the custom hub ids typed by the user."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown model pair {preset!r}")
    spec = PRESETS[preset]
    if spec is not None:
        return spec
    return PairSpec(target=(target or "").strip(), draft=(draft or "").strip())


class Studio:
    """Hands out the engine for a pair, loading it on first use (thread-safe)."""

    def __init__(self, loader: Callable[[PairSpec], object], engine_factory: Callable[[object], object],
                 policy: Policy = Policy()):
        self._loader = loader
        self._engine_factory = engine_factory
        self.policy = policy
        self._lock = threading.Lock()
        self._spec: PairSpec | None = None
        self._engine = None

    def is_loaded(self, spec: PairSpec) -> bool:
        return self._engine is not None and self._spec == self.policy.check(spec)

    def engine(self, spec: PairSpec):
        spec = self.policy.check(spec)
        with self._lock:
            if self._engine is None or self._spec != spec:
                self._engine, self._spec = None, None
                gc.collect()
                self._engine = self._engine_factory(self._loader(spec))
                self._spec = spec
            return self._engine
