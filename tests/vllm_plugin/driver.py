"""One vLLM engine on the embedded target, built in this process from a spec, its runs generated: `run`
returns what the tests compare. start_engine.py calls it for each engine of the suite, one after another
in its one process (the engine core in-process: its steps can be recorded), under .venv-vllm's python.

spec: {"speculative": null | "ngram" | "draft_model" | "eagle3", "dropmatch": null | {...engine-wide...},
       "runs": [{"name": str, "prompts": [[ids]], "max_tokens": int, "temperature": float, "seed": int|null,
                 "dropmatch": null | {...per request...}, "alone": bool}],
       "recheck": bool, "draft": the draft model's or the EAGLE-3 head's folder,
       "q_vocab": null | [ids]: the only ids a draft distribution may give mass (an EAGLE-3 head's vocabulary)}
"""

from __future__ import annotations

import sys

from dropmatch.decoding import verifying

STEPS: list = []
ROWS_CHANGED: list[int] = []  # per step: rows the plugin changed that it did not re-verify
ONE_PASS: set[bool] = set()  # how the steps were verified (runner.one_pass_on)


def record_steps() -> None:
    """Keeps every re-verified step: the rule, each request's Round and what the plugin decided (installed
    once per process: every later engine's verifier records through it)."""
    from dropmatch.serving.vllm import runner as dm_runner

    original = dm_runner._Verifier.rejudge
    if getattr(original, "records_steps", False):
        return

    def rejudge(self, output, work):
        before = output.sampled_token_ids.clone()
        ONE_PASS.add(self.one_pass)
        original(self, output, work)
        judged_rows = {row for row, _, _, _ in work}
        untouched = [row for row in range(before.shape[0]) if row not in judged_rows]
        ROWS_CHANGED.append(int((before[untouched] != output.sampled_token_ids[untouched]).any(-1).sum()))
        for row, req_id, settings, round_ in work:
            STEPS.append((req_id, settings.rule, round_, output.sampled_token_ids[row].tolist(), self.head, self.judge))

    rejudge.records_steps = True
    dm_runner._Verifier.rejudge = rejudge


def recheck(q_vocab: list[int] | None = None) -> tuple[dict, dict[str, list[int]]]:
    """Each recorded round judged alone by the project's verify step (verifying.verify, a batch of one, staged)
    with the same head, hidden rows and masks; the emitted row must match, and every emitted token
    must be the target's argmax there or accepted by the rule. Also: per request id, the sequence
    positions of the tokens the rule accepted beyond the exact test."""

    mismatches, lossy, exact, not_allowed, q_not_draft = 0, 0, 0, 0, 0
    lossy_positions: dict[str, list[int]] = {}
    by_reason: dict[str, int] = {}
    q_outside = 0  # rounds whose draft distributions give mass outside q_vocab
    for req_id, rule, round_, emitted, head, judge in STEPS:
        q_not_draft += bool((round_.q_signal.argmax(-1) != round_.draft_tokens).any())
        if q_vocab is not None:
            mass = round_.q_signal.float().cpu().sum(0)
            mass[q_vocab] = 0
            q_outside += bool((mass > 0).any())
        inputs = round_.verify_inputs()
        rule = judge.filled(rule) if rule.uses_judge else rule  # as the runner fills it
        alone, = verifying.verify(head, rule, [inputs], judge=judge)
        verdict, expected = alone.verdict, alone.emitted
        got = [token for token in emitted if token != -1]
        mismatches += got != expected
        argmax = round_.clean_logits.argmax(-1).tolist()
        for i, reason in enumerate(verdict.reasons[: verdict.num_accepted]):
            exact += reason == "exact"
            lossy += reason != "exact"
            by_reason[reason] = by_reason.get(reason, 0) + 1
            if reason != "exact":
                lossy_positions.setdefault(req_id, []).append(round_.first_position + i)
            not_allowed += reason == "exact" and got[i] != argmax[i]
    counts = {"rounds": len(STEPS), "mismatches": mismatches, "lossy": lossy, "exact": exact,
              "exact_not_argmax": not_allowed, "q_not_draft": q_not_draft, "q_outside_vocab": q_outside,
              "accepted_by": by_reason}
    return counts, lossy_positions


def speculative_config(kind: str | None, draft_dir: str | None) -> dict | None:
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    if kind == "draft_model":
        return {"model": draft_dir, "num_speculative_tokens": 4}
    if kind == "eagle3":
        return {"method": "eagle3", "model": draft_dir, "num_speculative_tokens": 4}
    return None


def generate(llm, run: dict) -> list:
    """vLLM's RequestOutputs of the run, one per prompt (per sample for `samples`)."""
    from vllm import SamplingParams, TokensPrompt

    extra = {"dropmatch": run["dropmatch"]} if run.get("dropmatch") is not None else None
    params = SamplingParams(max_tokens=run["max_tokens"], temperature=run.get("temperature", 0.0),
                            seed=run.get("seed"), extra_args=extra)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in run["prompts"]]
    if run.get("samples"):  # the first prompt, `samples` times in one batch (unseeded: vLLM's CPU build
        # fails a seeded request's verification with "CPU Generator does not use offset")
        return llm.generate(prompts[:1] * run["samples"], params, use_tqdm=False)
    if run.get("alone"):
        return [llm.generate([prompt], params, use_tqdm=False)[0] for prompt in prompts]
    return llm.generate(prompts, params, use_tqdm=False)


def drafted_tokens(llm) -> float:
    """vLLM's own count of drafted tokens it verified so far."""
    return sum(float(m.value) for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_draft_tokens")


def run(spec: dict) -> dict:
    """The engine `spec` describes, built in this process, its runs made: what the tests compare."""
    from vllm import LLM

    ONE_PASS.clear()
    if spec.get("dropmatch") is not None:
        record_steps()
    extra = {"additional_config": {"dropmatch": spec["dropmatch"]}} if spec.get("dropmatch") is not None else {}
    llm = LLM(spec["target"], dtype="float32", enforce_eager=True, max_model_len=2048, seed=0, disable_log_stats=False,
              speculative_config=speculative_config(spec.get("speculative"), spec.get("draft")), **extra)
    try:
        result = {"outputs": {}, "steps": {}, "drafted": {}}
        for run_ in spec["runs"]:
            generate_run(llm, run_, spec.get("recheck", False), result, spec.get("q_vocab"))
        result["one_pass"] = sorted(ONE_PASS)
        result["runner_imported"] = "dropmatch.serving.vllm.runner" in sys.modules
        return result
    finally:
        close(llm)


def close(llm) -> None:
    """An engine whose core runs in this process shut down now (its distributed groups destroyed, the garbage
    collector unfrozen), so that the process's next engine starts clean: vLLM freezes the collector after a
    start, and a dropped engine collected later, in the middle of the next one's start, would destroy that
    one's groups (tensor parallel 2: the core's shutdown also ends its ranks' processes)."""
    from vllm.v1.engine.core_client import InprocClient

    if isinstance(llm.llm_engine.engine_core, InprocClient):
        llm.llm_engine.engine_core.shutdown()


def generate_run(llm, run_: dict, with_recheck: bool, result: dict, q_vocab: list[int] | None = None) -> None:
    """One run of the spec on `llm`, its outputs, counts and (with_recheck) rechecked steps added to result."""
    STEPS.clear()
    ROWS_CHANGED.clear()
    before = drafted_tokens(llm)
    outputs = generate(llm, run_)
    result["outputs"][run_["name"]] = [list(map(int, out.outputs[0].token_ids)) for out in outputs]
    result["drafted"][run_["name"]] = drafted_tokens(llm) - before
    result.setdefault("steps_with_rows", {})[run_["name"]] = [len(ROWS_CHANGED), sum(ROWS_CHANGED)]
    if with_recheck:
        counts, positions = recheck(q_vocab)
        result["steps"][run_["name"]] = counts
        # the engine core's request id is the output's id plus "-" and a random suffix
        by_output = {}
        for req_id, found in positions.items():
            by_output.setdefault(req_id.rsplit("-", 1)[0], []).extend(found)
        result.setdefault("lossy_positions", {})[run_["name"]] = [sorted(by_output.get(out.request_id, []))
                                                                  for out in outputs]
