"""DropMatch's counts per request in vLLM's responses: where vLLM puts its own per-request
speculative-decoding metrics (the server started with `--per-request-spec-decode-metrics summary`,
the response's `metrics.speculative_decoding`; the final chunk of a stream asked with
`stream_options={"include_usage": true}`), a `dropmatch` object:

    "dropmatch": {"drafted": 40, "accepted_exactly": 21, "accepted_lossy": 6,
                  "reasons": {"exact": 21, "js": 4, "majority": 2, "rejected": 9, "unchecked": 4}}

Only requests DropMatch re-verified have it (a lossless or sampled request has vLLM's numbers alone).

The way there, each step: the worker's runner puts the step's reasons per request on its
ModelRunnerOutput (`dropmatch_reasons`, pickled with it to the engine core under tensor
parallelism); the scheduler, before reading that output, adds them to the request's
RequestSpecDecodeMetrics; that object reaches the API server by vLLM's msgpack, which encodes a
dataclass's declared fields only, so `declare_field` declares one more field, `dropmatch`, in every
process the plugin loads in, and extends its `to_dict` (what the response is built from) with `summary`.
"""

from __future__ import annotations

import dataclasses

FIELD = "dropmatch"
STEP_ATTRIBUTE = "dropmatch_reasons"  # on ModelRunnerOutput: {request id: {reason: count}} of one step


def summary(reasons: dict[str, int]) -> dict:
    """A request's reason counts -> the response's `dropmatch` object (recorder.reason_summary)."""
    from ...decoding.recorder import reason_summary

    return reason_summary(reasons)


def add_step(requests: dict, step: dict[str, dict[str, int]]) -> None:
    """Adds one step's reasons to each request's RequestSpecDecodeMetrics (where vLLM keeps one: the
    server asked for per-request metrics and the request is still known)."""
    for req_id, reasons in step.items():
        metrics = getattr(requests.get(req_id), "spec_decode_metrics", None)
        if metrics is None:
            continue
        counts = dict(getattr(metrics, FIELD, None) or {})
        for reason, count in reasons.items():
            counts[reason] = counts.get(reason, 0) + count
        setattr(metrics, FIELD, counts)


def attach_step(model_runner_output, step: dict[str, dict[str, int]]) -> None:
    """Puts a step's reasons on the runner's output (inside vLLM's async wrapper when it has one)."""
    if step:
        setattr(getattr(model_runner_output, "_model_runner_output", model_runner_output), STEP_ATTRIBUTE, step)


def declare_field() -> None:
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics as Metrics

    if FIELD in Metrics.__dataclass_fields__:
        return
    kind = dict[str, int] | None
    declared = dataclasses.field(default=None)
    declared.name, declared.type, declared._field_type = FIELD, kind, dataclasses._FIELD
    Metrics.__dataclass_fields__[FIELD] = declared
    Metrics.__annotations__[FIELD] = kind  # msgspec reads the type hints
    setattr(Metrics, FIELD, None)
    original = Metrics.to_dict

    def to_dict(self):
        result = original(self)
        reasons = getattr(self, FIELD, None)
        if reasons:
            result[FIELD] = summary(reasons)
        return result

    Metrics.to_dict = to_dict


def count_in_scheduler() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.update_from_output
    if getattr(original, "dropmatch_hook", False):
        return

    def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        step = getattr(model_runner_output, STEP_ATTRIBUTE, None)
        if step:
            add_step(self.requests, step)
        return original(self, scheduler_output, model_runner_output, *args, **kwargs)

    update_from_output.dropmatch_hook = True
    Scheduler.update_from_output = update_from_output
