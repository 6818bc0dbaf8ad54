"""ZeroGPU, the way the `spaces` package runs it (read from spaces 0.51.3's source).

On a ZeroGPU Space (`spaces` importable, SPACES_ZERO_GPU set) a function decorated with
`spaces.GPU` does not run where it is called: its arguments are pickled onto a queue, a worker
process forked from the main one (and kept for later calls while idle) unpickles them and runs the
function, and each result (each item of a generator) is pickled back. CUDA exists only inside that
worker; in the main process `.to("cuda")` is recorded and the weights are packed when the app
launches, so a model must be moved to "cuda" in the main process before launch. Hence:

- `app.py` imports `spaces` before anything imports torch;
- the default pair loads in the main process before launch (`start`), and the PairHost then runs
  model work inline (no private thread: the worker runs its call in a thread of its own);
- the GPU functions below are module-level and take small picklable arguments (Settings, a
  PairSpec, a trace): they reach the models through this module's state (`_STATE`), which the
  fork inherits. A worker forked before a pair switch holds the old pair: the function checks the
  pair it was asked for and loads it there when it differs;
- their `duration` is sized from the pair and max_new_tokens (a shorter request queues sooner).

Off ZeroGPU `spaces.GPU` returns the function itself, and none of this changes how the app runs.
"""

from __future__ import annotations

import importlib.util
import os

from .. import lab
from ..decoding.config import PairSpec, Settings
from .streaming import stream_comparison

_STATE: dict = {}  # {"host": PairHost}: set once by start(), inherited by the forked GPU workers

# Seconds a round-trip costs and seconds per generated token per run (a GPU, batch 1, Python loop), by a
# name in the pair's target ("embedded": the embedded pair's); generous, as a GPU call past its duration is cut off.
_FIXED_S = 15.0
_PER_TOKEN_S = {"embedded": 0.03, "SmolLM2-1.7B-Instruct": 0.04, "Qwen3-8B": 0.07}
MIN_DURATION_S, MAX_DURATION_S = 20, 180


def active() -> bool:
    """Whether this process runs on ZeroGPU (the spaces package's own switch)."""
    on = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
    return on and importlib.util.find_spec("spaces") is not None


def serves(host) -> bool:
    """Whether this host's model work goes through the GPU functions below: an inline host
    (zerogpu.start's) on ZeroGPU; an inline host elsewhere (tests) runs in the caller."""
    return host.inline and active()


def start(host, spec: PairSpec) -> None:
    """Load `spec` in the main process (its weights go to "cuda" here, before launch, as ZeroGPU
    needs) and keep the host where the GPU workers find it."""
    host.engine(spec)
    _STATE["host"] = host


def compare_duration(settings: Settings) -> int:
    """The GPU seconds to ask for one comparison: fixed cost plus tokens x runs x per-token cost."""
    spec = settings.pair_spec()
    per_token = next((cost for name, cost in _PER_TOKEN_S.items() if name in spec.target), 0.05)
    runs = 4 if settings.run_autoregressive else 2  # the baselines: the engine's loop, then generate()
    seconds = _FIXED_S + settings.max_new_tokens * runs * per_token
    return int(min(max(seconds, MIN_DURATION_S), MAX_DURATION_S))


def _gpu(duration):
    """spaces.GPU(duration=...) where `spaces` is importable (a no-op off ZeroGPU), else as is."""
    try:
        import spaces
    except ImportError:
        return lambda fn: fn
    return spaces.GPU(duration=duration)


def _engine(spec: PairSpec):
    host = _STATE.get("host")
    if host is None:
        raise RuntimeError("the GPU functions need zerogpu.start() first")
    return host.engine(spec)  # the loaded one; loads here only if this worker holds another pair


@_gpu(compare_duration)
def compare_on_gpu(settings: Settings):
    """The generation of one comparison (streaming.stream_comparison): partial views, then the
    RunRecord, all plain data that pickles back to the main process."""
    decode, rule = settings.parse()
    engine = _engine(settings.pair_spec())
    yield from stream_comparison(engine, settings.prompt, decode, rule, bool(settings.run_autoregressive))


@_gpu(MIN_DURATION_S)
def rule_lab_on_gpu(spec: PairSpec, trace, settings) -> dict:
    """The rule lab's re-judge of a run's drafts through the heads of its pair (lab.rule_lab)."""
    return lab.rule_lab(_engine(spec).services, trace, settings)
