"""The vLLM plugin on a GPU (scripts/gpu_check.sh runs it when a CUDA vLLM venv is there): each engine
in its own process, on the embedded target (fp16 on CUDA), prompt lookup, greedy, 4 prompts.

    .venv-vllm-cuda/bin/python scripts/vllm_gpu_check.py [--out runs/gpu_check] [--cpu]

1. vLLM's V1 runner (VLLM_USE_V2_MODEL_RUNNER=0): DropMatch at p = 0 gives the very tokens of vLLM's own
   speculative decoding; at p 0.3 it runs and /metrics-style counters show lossy acceptances; and at p 0.3
   with mask_draw "counter" (a step's masks in one batched draw; verified in one pass off a CPU) it runs too.
2. vLLM's default runner (V2 on CUDA with Triton): an engine asking for DropMatch is refused in one line.

Prints one line per check and writes vllm_gpu_check.json. --cpu runs the same on vLLM's CPU build (the
V1 runner there; its V2 runner cannot start without Triton, which the report says).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ["Name three primary colours.", "What is 12 times 7? Explain step by step.",
             "List the days of the week, then again in reverse order.", "Write a haiku about autumn leaves."]
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def engine(dropmatch: dict | None, dtype: str) -> dict:
    """In this process (a child): one engine, its greedy outputs and the DropMatch counters."""
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    from dropmatch.models.loading import embedded_target_source
    from dropmatch.serving.vllm.stats import read_counts

    target = embedded_target_source()[0]
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [TokensPrompt(prompt_token_ids=tokenizer.apply_chat_template(
        [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False)) for q in QUESTIONS]
    extra = {"additional_config": {"dropmatch": dropmatch}} if dropmatch is not None else {}
    try:
        llm = LLM(target, dtype=dtype, enforce_eager=True, max_model_len=2048, seed=0, speculative_config=SPECULATIVE,
                  **extra)
    except Exception as error:  # noqa: BLE001 - the refusal is the result
        return {"started": False, "error": f"{type(error).__name__}: {' '.join(str(error).split())[:600]}"}
    outputs = llm.generate(prompts, SamplingParams(max_tokens=48, temperature=0.0), use_tqdm=False)
    import time

    time.sleep(1.0)  # the counters reach their files within 0.2 s
    return {"started": True, "tokens": [list(out.outputs[0].token_ids) for out in outputs], "counts": dict(read_counts())}


def run_child(dropmatch: dict | None, env: dict, dtype: str) -> dict:
    spec = json.dumps({"dropmatch": dropmatch, "dtype": dtype})
    env = {**os.environ, **env, "DROPMATCH_VLLM_STATS_DIR": tempfile.mkdtemp(prefix="dropmatch-gpu-check-")}
    done = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True, env=env,
                          timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"started": False, "error": f"the engine process ended without a result (exit {done.returncode}): "
                                           f"{' '.join(done.stderr.split()[-60:])}"}
    result = json.loads(lines[-1][len("RESULT "):])
    if not result["started"]:  # vLLM's message points "above": keep the lines that say why
        result["stderr_tail"] = [line for line in done.stderr.splitlines() if line.strip()][-40:]
    return result


def checks(dtype: str) -> dict:
    v1 = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    found = {"vllm_sd": run_child(None, v1, dtype), "dropmatch_p0": run_child({"rule": "dropmatch", "p": 0.0}, v1, dtype),
             "dropmatch_p03": run_child({"rule": "dropmatch", "p": 0.3}, v1, dtype),
             "dropmatch_p03_counter": run_child({"rule": "dropmatch", "p": 0.3, "mask_draw": "counter"}, v1, dtype),
             "dropmatch_default_runner": run_child({"rule": "dropmatch", "p": 0.3}, {}, dtype)}
    found["verdicts"] = {
        "p0_equals_vllm_sd": found["vllm_sd"].get("tokens") is not None
        and found["dropmatch_p0"].get("tokens") == found["vllm_sd"].get("tokens"),
        "p03_lossy_acceptances": lossy_acceptances(found["dropmatch_p03"]),
        "p03_counter_lossy_acceptances": lossy_acceptances(found["dropmatch_p03_counter"]),
        "default_runner": found["dropmatch_default_runner"].get("error") or "started (the V1 runner: nothing to refuse)",
    }
    return found


def lossy_acceptances(result: dict) -> int:
    """The drafted tokens an engine's lossy rules accepted (its counters without exact, rejected, unchecked)."""
    return sum(count for reason, count in result.get("counts", {}).items()
               if reason not in ("exact", "rejected", "unchecked"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/gpu_check")
    parser.add_argument("--cpu", action="store_true", help="vLLM's CPU build (fp32) instead of CUDA (fp16)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print("RESULT " + json.dumps(engine(spec["dropmatch"], spec["dtype"])), flush=True)
        return 0
    found = checks("float32" if args.cpu else "float16")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_gpu_check.json").write_text(json.dumps(found, indent=1) + "\n")
    verdicts = found["verdicts"]
    print(f"V1 runner, DropMatch at p = 0 equals vLLM's SD: {verdicts['p0_equals_vllm_sd']}")
    print(f"V1 runner, DropMatch at p 0.3: {verdicts['p03_lossy_acceptances']} draft tokens accepted by a lossy rule "
          f"(counters {found['dropmatch_p03'].get('counts')})")
    print(f"V1 runner, DropMatch at p 0.3 with mask_draw counter: {verdicts['p03_counter_lossy_acceptances']} accepted "
          f"by a lossy rule (counters {found['dropmatch_p03_counter'].get('counts')})")
    print(f"default runner, DropMatch asked: {verdicts['default_runner']}")
    return 0 if verdicts["p0_equals_vllm_sd"] and verdicts["p03_lossy_acceptances"] > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
