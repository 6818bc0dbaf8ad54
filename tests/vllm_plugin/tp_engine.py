"""One DropMatch engine (prompt lookup, rule dropmatch at p 0.3) at a given tensor-parallel size, on a
tiny Llama the caller saved (4 attention heads: the embedded target's 9 do not divide by 2), greedy,
the first 8 written dev prompts in one batch: `run_tp` returns {"tokens": [[ids]], "counts": {reason: n}}
(the counts of the folder $DROPMATCH_VLLM_STATS_DIR). As a command it prints `RESULT ` and that JSON:

    VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 python tp_engine.py MODEL_DIR TP_SIZE

tests/vllm_plugin/test_plugin.py runs TP 2 as this command and TP 1 in start_engine.py's process (TP 2 = TP 1); the
output is what docs/serving.md keeps.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# the engine core in this process, its two ranks in processes of their own: one process fewer importing vLLM,
# and no core busy-polling the ranks' replies while they compute (the same tokens and counters)
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def run_tp(model: str, size: int) -> dict:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
    from tools.dev_set import DEV_PROMPTS  # the written dev prompts (scripts/tools/dev_set.py)
    from dropmatch.serving.vllm.stats import read_counts
    from driver import close

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [TokensPrompt(prompt_token_ids=tokenizer.encode(text)) for text in DEV_PROMPTS[:8]]
    llm = LLM(model, dtype="float32", enforce_eager=True, max_model_len=512, seed=0, tensor_parallel_size=size,
              distributed_executor_backend="mp" if size > 1 else None,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                                  "prompt_lookup_min": 1},
              additional_config={"dropmatch": {"rule": "dropmatch", "p": 0.3}})
    try:
        outputs = llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True), use_tqdm=False)
        time.sleep(1.0)  # the workers' counters reach their files within 0.2 s (stats.StatsFile)
        return {"tokens": [list(out.outputs[0].token_ids) for out in outputs], "counts": dict(read_counts())}
    finally:
        close(llm)


def main() -> int:
    print("RESULT " + json.dumps(run_tp(sys.argv[1], int(sys.argv[2]))), flush=True)
    return 0


if __name__ == "__main__":  # the TP workers are spawned: they import this file again
    raise SystemExit(main())
