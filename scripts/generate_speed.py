"""Time DropMatch through transformers' door against the target alone (plain generate()) and transformers'
own assisted generation: one pair, one draft.

    .venv/bin/python scripts/generate_speed.py                       # 3 dev prompts, 96 new tokens, 5 runs each
    .venv/bin/python scripts/generate_speed.py --prompts 6 --threads 2

The embedded pair as plain transformers models (dropmatch.models.load_embedded_models, CPU), greedy, on the
dev set's written prompts (scripts/tools/dev_set.py's DEV_PROMPTS, through the chat template). Per prompt: one
untimed call of each method, then `--runs` rounds of the four calls in a rotating order; each method's
median seconds, and the ratio of medians to plain generate()'s within the prompt (so a slower or busier
stretch of the machine weighs on all four alike). The methods:
  generate      target.generate(): the target alone, what a user runs without a draft (every speedup's base)
  transformers  target.generate(assistant_model=draft): transformers' assisted generation, its own draft-length
                schedule (what a user gets)
  lossless      generate(custom_generate=<the Hub folder, staged now>, dropmatch_rule="lossless"): gamma = auto
  DropMatch     generate(custom_generate=...) at its defaults (rule dropmatch, p 0.3, gamma = auto)
Prints a markdown table (docs/generate.md keeps it) and refuses a lossless text that is not transformers' own.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("generate", "transformers", "lossless", "DropMatch")


def method_kwargs(method: str, draft, folder: Path) -> dict:
    """generate()'s keywords for one method (greedy throughout); folder: the staged Hub repository."""
    ours = dict(custom_generate=str(folder), trust_remote_code=True)
    return {"generate": {}, "transformers": dict(assistant_model=draft),
            "lossless": dict(assistant_model=draft, dropmatch_rule="lossless", **ours),
            "DropMatch": dict(assistant_model=draft, **ours)}[method]


def timed(target, inputs, max_new_tokens: int, kwargs: dict) -> tuple[float, list[int]]:
    """(seconds, new token ids) of one greedy generate() call."""
    start = time.perf_counter()
    out = target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    seconds = time.perf_counter() - start
    sequences = out.sequences if hasattr(out, "sequences") else out
    return seconds, sequences[0, inputs["input_ids"].shape[1]:].tolist()


def measure_prompt(target, draft, folder: Path, inputs, max_new_tokens: int, runs: int) -> dict:
    """{method: (median seconds, new tokens)} for one prompt: a warm-up call each, then `runs` rotating rounds."""
    kwargs = {method: method_kwargs(method, draft, folder) for method in METHODS}
    texts = {method: timed(target, inputs, max_new_tokens, kwargs[method])[1] for method in METHODS}
    if not texts["lossless"] == texts["transformers"] == texts["generate"]:
        raise SystemExit("lossless through custom_generate wrote another text than transformers' greedy: not lossless")
    seconds: dict[str, list[float]] = {method: [] for method in METHODS}
    for run in range(runs):
        for method in METHODS[run % len(METHODS):] + METHODS[: run % len(METHODS)]:
            seconds[method].append(timed(target, inputs, max_new_tokens, kwargs[method])[0])
    return {method: (statistics.median(seconds[method]), len(texts[method])) for method in METHODS}


def table(rows: list[tuple[str, dict]]) -> str:
    """The markdown table: per prompt plain generate()'s median, then each method's and its speedup over it
    (generate()'s seconds / the method's), then the geometric means of the speedups."""
    lines = ["| prompt | new tokens | generate() (s) | transformers assisted (s) | speedup | lossless (s) | speedup "
             "| DropMatch p 0.3 (s) | speedup |", "|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {method: [] for method in METHODS[1:]}
    for prompt, found in rows:
        base = found["generate"][0]
        cells = []
        for method in ratios:
            ratios[method].append(base / found[method][0])
            cells.append(f"{found[method][0]:.2f} | {ratios[method][-1]:.2f}x")
        lines.append(f"| {prompt[:48]} | {found['lossless'][1]} / {found['DropMatch'][1]} | {base:.2f} | "
                     + " | ".join(cells) + " |")
    mean = {method: math.exp(statistics.fmean(map(math.log, values))) for method, values in ratios.items()}
    lines.append("| geometric mean | | | " + " | ".join(f"| **{mean[method]:.2f}x**" for method in ratios) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=3, help="the first N written dev prompts (default 3)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=5, help="timed calls per method and prompt (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    from dropmatch.models import load_embedded_models

    sys.path.insert(0, str(ROOT / "scripts"))
    from deploy_generate import staged
    from tools.dev_set import DEV_PROMPTS

    target, draft, tokenizer = load_embedded_models(torch.device("cpu"))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        staged(Path(folder))
        for prompt in DEV_PROMPTS[: args.prompts]:
            inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                   return_tensors="pt", return_dict=True)
            rows.append((prompt, measure_prompt(target, draft, Path(folder), inputs, args.max_new_tokens, args.runs)))
            print(f"done: {prompt}", file=sys.stderr, flush=True)
    print(table(rows))
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads {args.threads}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}; greedy, {args.max_new_tokens} new tokens "
          f"at most, median of {args.runs} runs per prompt; new tokens: lossless / DropMatch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
