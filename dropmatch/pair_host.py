"""Which pair is loaded, and who may load what: the app's one piece of model state.

One pair in memory at a time: switching pairs drops every reference to the previous engine before
the next one loads (and, on CUDA, returns its memory to the allocator). All model work (loading,
and every generation through `iterate`) runs on one long-lived thread: the web server hands requests
to a pool of threads, and each new thread that runs the model grows the process by its own
thread-local buffers (about 0.1-0.4 MB a request, never given back). `preload` queues loading a pair
on that thread at launch, so that the first Run waits only for what is left.
Environment:
  DROPMATCH_ALLOWED_MODELS       comma-separated hub ids a user may pick (public Spaces); unset = any hub id
  DROPMATCH_ALLOW_LOCAL_MODELS=1 lets users name local folders as models (off: the web app loads hub ids only)
  DROPMATCH_TRUST_REMOTE_CODE=1  lets transformers run a model repository's own code (off by default)
"""

from __future__ import annotations

import gc
import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch

from .decoding.config import DEFAULT_PRESET, EMBEDDED, PRESETS, ConfigError, PairSpec, pair_from_choice

__all__ = ["DEFAULT_PRESET", "PRESETS", "LoadStatus", "Policy", "PairHost", "is_hub_id", "pair_from_choice"]

SPACE_MAX_NEW_TOKENS = 512
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # namespace/name


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Policy:
    """Who may load what, and how long one run may be. On a Space (SPACE_ID set) the pairs are the
    presets' unless DROPMATCH_ALLOWED_MODELS lists others, and a run generates at most
    SPACE_MAX_NEW_TOKENS tokens (the UI's slider's top) unless DROPMATCH_MAX_NEW_TOKENS says otherwise."""

    allowed_models: frozenset[str] | None = None
    trust_remote_code: bool = False
    allow_local_models: bool = False
    max_new_tokens: int | None = None  # None: only DecodeConfig's own bound

    @staticmethod
    def from_env(environ=os.environ) -> "Policy":
        allowed = environ.get("DROPMATCH_ALLOWED_MODELS")
        names = frozenset(n.strip() for n in allowed.split(",") if n.strip()) if allowed else None
        on_space = bool(environ.get("SPACE_ID"))
        if names is None and on_space:
            names = frozenset(name for spec in PRESETS.values() if spec is not None and spec.target != EMBEDDED
                              for name in (spec.target, spec.draft, spec.head) if name)
        cap = environ.get("DROPMATCH_MAX_NEW_TOKENS") or (str(SPACE_MAX_NEW_TOKENS) if on_space else "")
        return Policy(allowed_models=names, trust_remote_code=_truthy(environ.get("DROPMATCH_TRUST_REMOTE_CODE")),
                      allow_local_models=_truthy(environ.get("DROPMATCH_ALLOW_LOCAL_MODELS")),
                      max_new_tokens=int(cap) if cap.strip().isdigit() else None)

    def check_length(self, max_new_tokens: int) -> None:
        if self.max_new_tokens is not None and max_new_tokens > self.max_new_tokens:
            raise ConfigError(f"this server generates at most {self.max_new_tokens} new tokens a run "
                              f"(asked: {max_new_tokens})")

    def check(self, spec: PairSpec) -> PairSpec:
        if spec.target != EMBEDDED:
            for name in filter(None, (spec.target, spec.draft, spec.head)):  # a head is a model it loads too
                if not self.allow_local_models and not is_hub_id(name):
                    raise ConfigError(f"{name!r} is not a hub id (namespace/name); this server loads models from the "
                                      "hub only (DROPMATCH_ALLOW_LOCAL_MODELS=1 allows local folders)")
                if self.allowed_models is not None and name not in self.allowed_models:
                    raise ConfigError(f"{name!r} is not on this server's list of allowed models")
        return replace(spec, trust_remote_code=self.trust_remote_code)


def is_hub_id(name: str) -> bool:
    """namespace/name, and not a folder on this machine (transformers would read a local folder of
    that name before asking the hub)."""
    return bool(HUB_ID.match(name)) and ".." not in name and not os.path.exists(name)


@dataclass(frozen=True)
class LoadStatus:
    """What the host is doing: idle, loading (since `started`), ready, or failed (with `error`)."""

    state: str
    label: str = ""
    started: float = 0.0
    error: str = ""

    def line(self) -> str:
        if self.state == "loading":
            return f"Loading **{self.label}** … {time.monotonic() - self.started:.0f} s"
        if self.state == "ready":
            return f"**{self.label}** is loaded."
        if self.state == "failed":
            return f"⚠️ {self.error}"
        return ""


class _Inline:
    """An executor that runs each call at once in the caller's thread (ZeroGPU: see ui/zerogpu.py)."""

    def submit(self, fn: Callable, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as error:  # noqa: BLE001 - handed to the caller, as an executor would
            future.set_exception(error)
        return future

    def shutdown(self, wait: bool = True) -> None:
        """Nothing runs apart from the caller: nothing to stop."""


class PairHost:
    """Hands out the engine for a pair, loading it on first use or ahead of time, and runs all model
    work on its one model thread (thread-safe: the thread serialises it).

    inline=True (ZeroGPU): model work runs in the caller's thread instead, and gamma = auto's step
    costs are measured on first use rather than at load (at load, in ZeroGPU's main process, there
    is no GPU to time)."""

    def __init__(self, loader: Callable[[PairSpec], object], engine_factory: Callable[[object], object],
                 policy: Policy = Policy(), inline: bool = False):
        self._loader = loader
        self._engine_factory = engine_factory
        self.policy = policy
        self.inline = inline
        self._worker = _Inline() if inline else ThreadPoolExecutor(max_workers=1, thread_name_prefix="dropmatch-model")
        self._spec: PairSpec | None = None
        self._engine = None
        self.status = LoadStatus("idle")

    def is_loaded(self, spec: PairSpec) -> bool:
        return self._engine is not None and self._spec == self.policy.check(spec)

    def preload(self, spec: PairSpec) -> Future:
        """Queue loading `spec` on the model thread; a failure is kept in `status` (and raised again on use)."""
        return self._worker.submit(self._load_quietly, self.policy.check(spec))

    def engine(self, spec: PairSpec):
        """The engine for `spec`, loading it (on the model thread) when another pair or none is loaded."""
        return self._worker.submit(self._engine_for, self.policy.check(spec)).result()

    def loaded_spec(self) -> PairSpec | None:
        """The spec of the pair in memory (policy applied), or None."""
        return self._spec

    def loaded_engine(self):
        """The engine of the pair in memory, or None; never loads."""
        return self._engine

    def call(self, fn: Callable, *args):
        """fn(*args) on the model thread (work that reads the loaded models)."""
        return self._worker.submit(fn, *args).result()

    def iterate(self, generator, waiting: Callable[[], object] | None = None, every_s: float = 0.5) -> Iterator:
        """The items of a generator that runs the model, each computed on the model thread; while one
        is being computed, every `every_s` seconds what waiting() says, where it says something (not
        None): a long prompt's reading progress. The next item is asked for only when this one is taken."""
        finished = object()
        try:
            while True:
                future = self._worker.submit(next, generator, finished)
                while waiting is not None and not wait([future], timeout=every_s).done:
                    note = waiting()
                    if note is not None:
                        yield note
                item = future.result()
                if item is finished:
                    return
                yield item
        finally:  # a caller that stops asking (a cancelled request) ends the run on the model thread, after
            try:  # any step in flight, not whenever the generator is garbage-collected
                self._worker.submit(generator.close)
            except RuntimeError:  # the model thread is shut down (PairHost.close): no step is in flight
                generator.close()

    def close(self) -> None:
        """Drop the pair and end the model thread. A process that keeps running torch work elsewhere (a test
        session) needs it gone: the thread keeps its own OpenMP team of torch threads, which slows the others."""
        self._worker.shutdown(wait=True)
        self._release()

    def _load_quietly(self, spec: PairSpec) -> None:
        with suppress(Exception):  # the status line says it; a Run raises it again
            self._engine_for(spec)

    def _engine_for(self, spec: PairSpec):
        if self._engine is None or self._spec != spec:
            self._release()
            self.status = LoadStatus("loading", spec.label, time.monotonic())
            try:
                self._engine = self._engine_factory(self._loader(spec))
                measure = getattr(self._engine.services, "step_costs", None)  # a stand-in may not measure
                if measure is not None and not self.inline:  # gamma = auto's costs, timed at load rather than in the first run
                    measure()
            except Exception as error:
                self.status = LoadStatus("failed", spec.label, error=str(error))
                raise
            self._spec = spec
            self.status = LoadStatus("ready", self._engine.services.source_label or spec.label)
        return self._engine

    def _release(self) -> None:
        """Drop the current engine before another loads: one pair in memory at a time."""
        self._engine, self._spec = None, None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
