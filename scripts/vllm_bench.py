"""Throughput through vLLM: no speculation, vLLM's own lossless speculation, DropMatch at p = 0 (the
plugin's cost) and DropMatch at each p asked, greedy, at each concurrency, on the embedded target with
the exported draft (or prompt lookup). Runs under .venv-vllm:

    .venv-vllm/bin/python scripts/vllm_bench.py --prompts runs/distill/dev.jsonl --limit 16 \\
        --max-new-tokens 96 --concurrency 1,4,16 --p 0.1,0.2 --repeats 3 --json runs/vllm/bench.json
    dropmatch-bench --engine vllm ...        # the same, started from .venv (--p-sweep gives the rates)

Each engine runs in its own process (vLLM keeps process-wide state), with max_num_seqs = the
concurrency; the DropMatch runs share the plugin's engine. Speeds differ from one engine process to
the next by more than within one, so --rounds N starts each engine N times, in turn, and the ratio
to vLLM's SD is the median of the rounds' ratios. Per run: tokens/s (new tokens over the wall time
of the whole batch; the median of --repeats batches, their range kept), vLLM's own
speculation counters (acceptance = accepted / drafted tokens, tau = 1 + accepted / verification
steps with drafts), and the quality the target sees (target NLL, off-nucleus rate, distinct-2 of
the answers, scored by the target in fp32) against the reference band: the target's own samples
(temperature 0.7, top-p 0.95) on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


# ---------------------------------------------------------------- one engine, in a child process


def engine_runs(job: dict) -> dict:
    """Builds one engine from `job` and runs each of its variants over the prompts; what it measured."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    from dropmatch.decoding.acceptance import BASELINE

    extra = {"additional_config": {"dropmatch": {"rule": BASELINE}}} if job["plugin"] else {}
    llm = LLM(job["target"], dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
              max_num_seqs=job["concurrency"], disable_log_stats=False,
              speculative_config=speculative(job["method"], job["draft"]) if job["speculative"] else None, **extra)
    generate_all(llm, job["prompts"][:2], job["variants"][0], 8)  # warm-up: first-call costs out of the timing
    return {variant["name"]: timed(llm, job["prompts"], variant, job["max_new_tokens"], job.get("repeats", 1))
            for variant in job["variants"]}


def speculative(method: str, draft: str) -> dict:
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    return {"model": draft, "num_speculative_tokens": 4}


def generate_all(llm, prompts: list, variant: dict, max_new_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=max_new_tokens, temperature=variant.get("temperature", 0.0),
                            top_p=variant.get("top_p", 1.0), seed=variant.get("seed"),
                            extra_args={"dropmatch": variant["dropmatch"]} if variant.get("dropmatch") else None)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def counters(llm) -> dict[str, float]:
    found = {name: 0.0 for name in SPEC_COUNTERS}
    for metric in llm.get_metrics():
        if metric.name in found:
            found[metric.name] += float(metric.value)
    return found


def timed(llm, prompts: list, variant: dict, max_new_tokens: int, repeats: int) -> dict:
    """The batch `repeats` times: tokens/s is the median run's (the spread is kept), the counters
    cover every run, and a greedy batch must give the same tokens each time."""
    before = counters(llm)
    walls, runs = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        runs.append(generate_all(llm, prompts, variant, max_new_tokens))
        walls.append(time.perf_counter() - start)
    after = counters(llm)
    drafts, drafted, accepted = (after[name] - before[name] for name in SPEC_COUNTERS)
    new_tokens = sum(len(ids) for ids in runs[0])
    speeds = sorted(new_tokens / wall for wall in walls)
    return {"outputs": runs[0], "wall_s": walls, "tokens_per_s": statistics.median(speeds),
            "tokens_per_s_runs": speeds, "new_tokens": new_tokens, "repeats_identical": all(r == runs[0] for r in runs),
            "acceptance": accepted / drafted if drafted else None, "tau": 1 + accepted / drafts if drafts else None}


# ---------------------------------------------------------------- the whole benchmark


def run_job(job: dict) -> dict:
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--job", json.dumps(job)],
                          capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("JOB ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the engine for {job['label']} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1][4:])


def jobs_for(concurrency: int, args, base: dict) -> list[dict]:
    greedy = {"dropmatch": None}
    lossy = [{"name": f"dropmatch_p{p:g}", "dropmatch": {"rule": args.rule, "p": p}} for p in args.p if p > 0]
    return [
        {**base, "label": f"no speculation, C={concurrency}", "speculative": False, "plugin": False,
         "variants": [{"name": "none", **greedy}]},
        {**base, "label": f"vLLM speculation, C={concurrency}", "speculative": True, "plugin": False,
         "variants": [{"name": "vllm", **greedy}]},
        {**base, "label": f"DropMatch, C={concurrency}", "speculative": True, "plugin": True,
         "variants": [{"name": "plugin_p0", "dropmatch": {"rule": args.rule, "p": 0.0}}, *lossy]},
    ]


def read_questions(files: str, limit: int | None) -> list[str]:
    """The prompts of the files (comma-separated), `limit` per file; BenchError (one line) on a bad file."""
    from dropmatch.bench.prompts import read_prompts

    return [item.prompt for path in files.split(",") for item in read_prompts(path, limit)[1]]


def chat_prompts(target: str, questions: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False))
            for question in questions]


def score(target: str, prompts: list, outputs: list) -> dict:
    """Target NLL and off-nucleus rate (pooled over tokens) and mean distinct-2 of the answers."""
    import torch
    from transformers import AutoModelForCausalLM

    from dropmatch.quality import distinct2
    from dropmatch.decoding.sampling import target_view

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    log_probs, off = [], 0
    with torch.inference_mode():
        for prompt, answer in zip(prompts, outputs):
            if not answer:
                continue
            ids = torch.tensor([prompt + answer])
            logits = model(ids).logits[0, len(prompt) - 1: -1]
            chosen, in_nucleus = target_view(logits, torch.tensor(answer))
            log_probs += chosen.tolist()
            off += int((~in_nucleus).sum())
    return {"target_nll": -sum(log_probs) / len(log_probs), "off_nucleus_rate": off / len(log_probs),
            "distinct2": sum(distinct2(a) for a in outputs if a) / max(sum(1 for a in outputs if a), 1)}


DEFAULT_PROMPTS = "runs/distill/dev.jsonl"  # the written dev prompts + GSM8K train (scripts/distill_draft.py devset)


def benchmark(args) -> dict:
    from dropmatch.models.loading import embedded_target_source

    questions = read_questions(args.prompts, args.limit)  # a bad prompt file stops it before any model work
    target = embedded_target_source()[0]
    prompts = chat_prompts(target, questions)
    draft = str(export_draft()) if args.method == "draft_model" else None
    base = {"target": target, "draft": draft, "method": args.method, "prompts": prompts,
            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats}
    reference = reference_band(base, prompts, max(args.concurrency))
    runs = []
    for concurrency in args.concurrency:
        measured: dict[str, list[dict]] = {}
        for round_ in range(args.rounds):  # the engines in turn, so that a slow spell of the machine hits all
            for job in jobs_for(concurrency, args, {**base, "concurrency": concurrency}):
                print(f"running {job['label']} (round {round_ + 1} of {args.rounds}) ...", file=sys.stderr, flush=True)
                for name, found in run_job(job).items():
                    measured.setdefault(name, []).append(found)
        runs += [{"name": name, "concurrency": concurrency, **merged(found)} for name, found in measured.items()]
    return summarize(runs, reference, target, prompts, args)


def merged(measured: list[dict]) -> dict:
    """One variant's measurements from its engine processes (one per round) as one run: tokens/s the
    median of the processes' medians (each kept, in round order), the outputs and counters of the
    first (greedy outputs must not differ: repeats_identical covers every process)."""
    first = measured[0]
    return {**first, "tokens_per_s": statistics.median(m["tokens_per_s"] for m in measured),
            "tokens_per_s_rounds": [m["tokens_per_s"] for m in measured],
            "tokens_per_s_runs": sorted(speed for m in measured for speed in m["tokens_per_s_runs"]),
            "wall_s": [wall for m in measured for wall in m["wall_s"]],
            "repeats_identical": all(m["repeats_identical"] and m["outputs"] == first["outputs"] for m in measured)}


def ratio_to(run: dict, baseline: dict) -> tuple[float, list[float]]:
    """tokens/s against a baseline's: the median of the per-round ratios (each round's processes ran
    one after the other), and those ratios."""
    ratios = [mine / theirs for mine, theirs in zip(run.get("tokens_per_s_rounds", [run["tokens_per_s"]]),
                                                   baseline.get("tokens_per_s_rounds", [baseline["tokens_per_s"]]))]
    return statistics.median(ratios), ratios


def reference_band(base: dict, prompts: list, concurrency: int) -> dict:
    from dropmatch.bench.running import REFERENCE_TEMPERATURE, REFERENCE_TOP_P

    job = {**base, "label": "reference samples", "concurrency": concurrency, "speculative": False, "plugin": False,
           "repeats": 1,
           "variants": [{"name": "reference", "dropmatch": None, "temperature": REFERENCE_TEMPERATURE,
                         "top_p": REFERENCE_TOP_P, "seed": 0}]}
    print("running the reference samples ...", file=sys.stderr, flush=True)
    samples = run_job(job)["reference"]["outputs"]
    return {"temperature": REFERENCE_TEMPERATURE, "top_p": REFERENCE_TOP_P,
            **score(base["target"], prompts, samples)}


def summarize(runs: list[dict], reference: dict, target: str, prompts: list, args) -> dict:
    from dropmatch.bench.summary import band_checks

    by_key = {(run["name"], run["concurrency"]): run for run in runs}
    for run in runs:
        run.update(score(target, prompts, run["outputs"]))
        run["band"] = band_checks(run, reference)
        baseline = by_key.get(("none", run["concurrency"]))
        run["identical_to_no_speculation"] = sum(a == b for a, b in zip(run["outputs"], baseline["outputs"]))
        vllm = by_key.get(("vllm", run["concurrency"]))
        run["tokens_per_s_vs_vllm"], run["tokens_per_s_vs_vllm_rounds"] = ratio_to(run, vllm)
        if run["acceptance"] is not None and vllm["acceptance"]:
            run["acceptance_vs_vllm"] = run["acceptance"] / vllm["acceptance"]
    settings = {"prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
                "method": args.method, "rule": args.rule, "p": args.p, "repeats": args.repeats, "rounds": args.rounds,
                "num_prompts": len(prompts)}
    return {"settings": settings, "reference": reference, "runs": runs}


def export_draft() -> Path:
    out = ROOT / "runs" / "vllm" / "draft"
    if not (out / "model.safetensors").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "export_draft_vllm.py"), str(out)], check=True)
    return out


def table(document: dict) -> str:
    lines = ["| C | run | tokens/s | vs vLLM SD | acceptance | tau | identical to no SD | target NLL | off-nucleus "
             "| distinct-2 | band |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda value, spec: "-" if value is None else format(value, spec)  # noqa: E731
    for run in document["runs"]:
        band = run["band"] or {}
        spread = run.get("tokens_per_s_runs", [])
        speed = f"{run['tokens_per_s']:.1f}" + (f" ({spread[0]:.1f}-{spread[-1]:.1f})" if len(spread) > 1 else "")
        if not run.get("repeats_identical", True):
            speed += " (repeats differ!)"
        ratios = sorted(run.get("tokens_per_s_vs_vllm_rounds", []))
        ratio = f"{run['tokens_per_s_vs_vllm']:.2f}x" + (f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else "")
        lines.append(f"| {run['concurrency']} | {run['name']} | {speed} | "
                     f"{ratio} | {fmt(run['acceptance'], '.3f')} | {fmt(run['tau'], '.2f')} | "
                     f"{run['identical_to_no_speculation']}/{len(run['outputs'])} | {run['target_nll']:.3f} | "
                     f"{run['off_nucleus_rate']:.3%} | {run['distinct2']:.3f} | "
                     f"{', '.join(k for k, ok in band.items() if not ok) or 'inside'} |")
    ref = document["reference"]
    lines.append(f"\nreference band (target samples, T {ref['temperature']}, top-p {ref['top_p']}): target NLL "
                 f"{ref['target_nll']:.3f}, off-nucleus {ref['off_nucleus_rate']:.3%}, distinct-2 {ref['distinct2']:.3f}")
    return "\n".join(lines)


def dropout_rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(0.0 <= rate < 1.0 for rate in rates):
        raise argparse.ArgumentTypeError(f"{text!r}: dropout rates in [0, 1), comma-separated, e.g. 0.1,0.2")
    return rates


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, at least 1")
    return int(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default=DEFAULT_PROMPTS, help="prompt files, comma-separated")
    parser.add_argument("--limit", type=int, default=16, help="prompts per file")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--concurrency", default="1,4,16", type=lambda text: [int(c) for c in text.split(",")])
    parser.add_argument("--method", choices=("draft_model", "ngram"), default="draft_model")
    parser.add_argument("--rule", default="dropmatch")
    parser.add_argument("--p", default=[0.3], type=dropout_rates,
                        help="DropMatch's dropout rates, comma-separated: one run each on the plugin's engine")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each batch (tokens/s: the median)")
    parser.add_argument("--rounds", type=positive, default=1,
                        help="engine processes per configuration, run in turn (speeds vary from process to process; "
                             "the ratio to vLLM's SD is the median of the rounds' ratios)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--job", help=argparse.SUPPRESS)  # one engine's runs, in a child process
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.job:
        print("JOB " + json.dumps(engine_runs(json.loads(args.job))), flush=True)
        return 0
    from dropmatch.bench.prompts import BenchError

    try:
        document = benchmark(args)
    except BenchError as error:
        hint = " (the dev prompts: python scripts/distill_draft.py devset)" if args.prompts == DEFAULT_PROMPTS else ""
        print(f"error: {error}{hint}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(table(document))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
