"""The vLLM suite's in-process engines, one after another in this one process (vLLM's import paid once):
engines a user starts (the plugin loaded by vLLM itself) that are refused, and engines run to the end (an
attempt with an "engine": driver.run; with "tp": tp_engine.run_tp). Prints one line,
`RESULT {"register": {...}, "msgpack": {...}, name: result}`: first, before any engine starts, what
`register()` called twice did to this fresh process ("register": the runner modules it imported, whether
every hook is installed, whether one wraps another), then DropMatch's counts through vLLM's msgpack
encoding ("msgpack"); then per attempt, {"started", "error", "text"} or the run's result.

    python start_engine.py SPEC_JSON

spec: {"target": dir, "attempts": [   (each may add "env": {name: value}, set while it runs, and
                                        "break_runner_import": bool, the plugin's runner module cannot be
                                        imported while it runs, as when vLLM changed under it)
         {"name": str, "engine": driver.py's spec} |
         {"name": str, "tp": {"model": dir, "size": 1}} (tp_engine.run_tp) |
         {"name": str, "dropmatch": null | {...}, "speculative": bool,
          "stand_in": bool (the CPU worker builds a runner class the plugin never saw; from then on, for every
          later attempt of the process: put it last)}]}
A broken runner import holds only for its own attempt, so it must come before any attempt that imports
the runner. Environment (e.g. VLLM_USE_V2_MODEL_RUNNER) comes from the caller.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import json
import os
import sys
from unittest import mock

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# the engine core and worker in this process: a refusal is this process's error, and the plugin's steps
# can be recorded (driver.record_steps)
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from driver import close, run  # noqa: E402  (after the environment above)
from tp_engine import run_tp  # noqa: E402


class BrokenImport(importlib.abc.MetaPathFinder):
    """Makes `import dropmatch.serving.vllm.runner` fail."""

    def find_spec(self, name, path=None, target=None):
        if name == "dropmatch.serving.vllm.runner":
            raise ImportError("simulated: this vLLM's runner API changed")
        return None


@contextlib.contextmanager
def runner_import_broken(broken: bool):
    """While an attempt runs: the plugin's runner module cannot be imported (where `broken`)."""
    finder = BrokenImport() if broken else None
    if finder is not None:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)


def use_a_stand_in_runner() -> None:
    """The CPU worker builds a subclass of vLLM's CPU runner made after the plugin patched the module's
    name: a runner the plugin does not cover (as another platform's or vLLM's V2 runner would be)."""
    from vllm.v1.worker import cpu_worker

    original = cpu_worker.CPUWorker.init_device

    def init_device(self):
        import torch

        original(self)
        vllms_own = next(c for c in type(self.model_runner).__mro__ if c.__name__ == "CPUModelRunner")
        self.model_runner = type("StandInRunner", (vllms_own,), {})(self.vllm_config, torch.device("cpu"))

    cpu_worker.CPUWorker.init_device = init_device


def bind_kernel_overrides_once() -> None:
    """vLLM 0.32's CPU platform binds its Triton kernel overrides at every worker start by scanning every
    loaded module, and the scan fails once llvmlite (numba's, which the prompt-lookup drafter loads) is
    among them ("'_lib_fn_wrapper' object has no attribute 'get'"): a second engine in one process would
    not start. The first start's binding holds for the process (the kernels' homes hold the overrides from
    then on), so the later starts skip it."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    bind = platform.register_triton_kernel_overrides
    bound = []

    def once(cls) -> None:
        if not bound:
            bind()
            bound.append(True)

    platform.register_triton_kernel_overrides = classmethod(once)


def register_twice() -> dict:
    """register() twice in this fresh process, as vLLM and a user's code might: which model-runner modules it
    imported (none: the plugin defers them to the worker), whether both hooks are installed, and whether
    one wraps the other (a second install would wrap the first one's wrapper)."""
    import dropmatch.serving.vllm as plugin

    plugin.register()
    plugin.register()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    runners = ("vllm.v1.worker.cpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.cpu_model_runner",
               "dropmatch.serving.vllm.runner")
    hooked = [EngineArgs.create_engine_config, WorkerWrapperBase.init_device]

    def wraps_a_hook(function) -> bool:
        return any(getattr(cell.cell_contents, "dropmatch_hook", False) for cell in function.__closure__ or ())

    return {"imported": sorted(m for m in runners if m in sys.modules),
            "installed": all(getattr(f, "dropmatch_hook", False) for f in hooked),
            "wrapped": any(wraps_a_hook(f) for f in hooked)}


def counts_through_msgpack() -> dict:
    """DropMatch's per-request counts (request_counts) over two steps, sent through vLLM's own engine-core ->
    API-server encoding: "received", the summary to_dict gives on the far side; "fresh", a new metrics
    object's to_dict (no DropMatch key where DropMatch counted nothing)."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from dropmatch.serving.vllm import request_counts

    metrics = RequestSpecDecodeMetrics.new(4)
    requests = {"a": type("Request", (), {"spec_decode_metrics": metrics})(), "b": object()}
    for step in ({"a": {"exact": 2, "js": 1, "rejected": 1}, "b": {"exact": 4}},
                 {"a": {"exact": 1, "majority": 1, "unchecked": 2}}):
        request_counts.add_step(requests, step)
    sent = EngineCoreOutputs(outputs=[EngineCoreOutput(request_id="a", new_token_ids=[1], spec_decode_metrics=metrics)])
    received = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(sent)).outputs[0].spec_decode_metrics
    return {"received": received.to_dict().get("dropmatch"), "fresh": RequestSpecDecodeMetrics.new(4).to_dict()}


def main() -> int:
    spec = json.loads(sys.argv[1])
    result = {"register": register_twice(), "msgpack": counts_through_msgpack()}
    bind_kernel_overrides_once()
    for attempt in spec["attempts"]:
        with mock.patch.dict(os.environ, attempt.get("env", {})), \
                runner_import_broken(attempt.get("break_runner_import", False)):
            result[attempt["name"]] = attempted(spec["target"], attempt)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def attempted(target: str, attempt: dict) -> dict:
    if "engine" in attempt:
        return run(attempt["engine"])
    if "tp" in attempt:
        return run_tp(attempt["tp"]["model"], attempt["tp"]["size"])
    return start(target, attempt)


def start(target: str, attempt: dict) -> dict:
    """One engine start: {"started", "error", "text"} (4 greedy tokens where it started)."""
    if attempt.get("stand_in"):
        use_a_stand_in_runner()
    from vllm import LLM, SamplingParams

    extra = {"additional_config": {"dropmatch": attempt["dropmatch"]}} if attempt.get("dropmatch") is not None else {}
    speculative = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    result = {"started": False, "error": None, "text": None}
    try:
        llm = LLM(target, dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
                  speculative_config=speculative if attempt.get("speculative", True) else None, **extra)
        result["started"] = True
        out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
        result["text"] = list(out[0].outputs[0].token_ids)
        close(llm)  # (an engine the tests expect refused: the next attempt still starts clean)
    except Exception as error:  # noqa: BLE001 - what the user would see is the result
        result["error"] = f"{type(error).__name__}: {error}"
    return result


if __name__ == "__main__":
    raise SystemExit(main())
