"""Command-line benchmark: autoregressive + each rule on every prompt, a table and a JSON file.

    python -m dropmatch.bench --prompts assets/prompts/mt_bench.jsonl --limit 10 \\
        --max-new-tokens 128 --gamma 4 --rules lossless,dropmatch --json out.json

Prompts are read from the field `prompt`, `question` or the first of `turns`. Ctrl-C stops the
run and keeps the results so far.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import RULES, ConfigError, DecodeConfig, PairSpec, RuleConfig, parse_p


class BenchError(Exception):
    """Bad benchmark input; printed as one line."""


def read_prompts(path: str, limit: int | None) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise BenchError(f"prompt file not found: {path}")
    prompts = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise BenchError(f"{path}:{number} is not a JSON line") from None
        prompt = record.get("prompt") or record.get("question") or (record.get("turns") or [None])[0]
        if not isinstance(prompt, str) or not prompt.strip():
            raise BenchError(f"{path}:{number} has no 'prompt', 'question' or 'turns'")
        prompts.append(prompt)
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise BenchError(f"{path} holds no prompts")
    return prompts


def parse_rules(text: str) -> list[str]:
    rules = [r.strip() for r in text.split(",") if r.strip()]
    if not rules:
        raise BenchError("--rules is empty")
    for rule in rules:
        if rule not in RULES:
            raise BenchError(f"unknown rule {rule!r}; choose from {', '.join(RULES)}")
    return rules


@dataclass
class BenchResult:
    """Traces per prompt for the autoregressive baseline and each rule."""

    prompts: list[str]
    rules: list[str]
    ar: list = field(default_factory=list)
    runs: dict = field(default_factory=dict)  # rule -> [GenerationTrace]
    identical: list = field(default_factory=list)  # lossless greedy == target generate(), per prompt
    interrupted: bool = False


def run_bench(engine, prompts, rules, decode: DecodeConfig, rule_template: RuleConfig, check_identity: bool,
              progress=None) -> BenchResult:
    """Runs AR then every rule on each prompt, in that order, so machine noise hits all alike."""
    from .engine import run_to_end
    from .models import greedy_reference

    result = BenchResult(prompts=[], rules=rules, runs={rule: [] for rule in rules})
    try:
        for prompt in prompts:
            ids = engine.encode(prompt)
            engine.check_fits(ids, decode)
            ar = run_to_end(engine.autoregressive(ids, decode))
            traces = {rule: run_to_end(engine.speculative(ids, decode, _with_rule(rule_template, rule)))
                      for rule in rules}
            if check_identity and "lossless" in rules:
                reference = greedy_reference(engine.target, ids, decode.max_new_tokens, engine.stop_ids)
                result.identical.append(list(traces["lossless"].output_ids) == reference)
            result.prompts.append(prompt)
            result.ar.append(ar)
            for rule, trace in traces.items():
                result.runs[rule].append(trace)
            if progress is not None:
                progress(result)
    except KeyboardInterrupt:
        result.interrupted = True
    return result


def _with_rule(template: RuleConfig, rule: str) -> RuleConfig:
    from dataclasses import replace

    return replace(template, rule=rule)


def summary(result: BenchResult) -> dict:
    """Pooled numbers per rule (ratios of sums over prompts) and per prompt."""
    from .metrics import mc_overhead, pooled

    ar = pooled(result.ar)
    out = {"autoregressive": ar, "rules": {}}
    lossless = result.runs.get("lossless")
    for rule, traces in result.runs.items():
        stats = pooled(traces)
        stats["speedup_vs_ar"] = _div(stats["tokens_per_s"], ar["tokens_per_s"])
        if lossless:
            stats["speedup_vs_lossless"] = _div(stats["tokens_per_s"], pooled(lossless)["tokens_per_s"])
        shares = [mc_overhead(t, lossless[i] if lossless else None) for i, t in enumerate(traces)]
        shares = [s for s in shares if s is not None]
        stats["mc_overhead"] = sum(shares) / len(shares) if shares else None
        stats["p"] = _mean([t.p for t in traces if t.p is not None])
        if rule == "lossless" and traces and traces[0].temperature == 0.0 and result.identical:
            stats["identical_to_target_greedy"] = all(result.identical)
        out["rules"][rule] = stats
    return out


def _div(a, b):
    return a / b if a is not None and b else None


def _mean(values):
    return sum(values) / len(values) if values else None


def format_table(numbers: dict) -> str:
    rows = [("run", "tau", "accept", "tok/s", "vs AR", "vs lossless", "MC share", "p")]
    ar = numbers["autoregressive"]
    rows.append(("autoregressive", "1.00", "-", _f(ar["tokens_per_s"], 1), "1.00x", "-", "-", "-"))
    for rule, s in numbers["rules"].items():
        rows.append((rule, _f(s["tau"]), _f(s["acceptance_rate"]), _f(s["tokens_per_s"], 1),
                     _f(s["speedup_vs_ar"]) + "x", _f(s.get("speedup_vs_lossless")) + "x",
                     "-" if s["mc_overhead"] is None else f"{100 * s['mc_overhead']:.1f}%", _f(s["p"], 3)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def to_json(result: BenchResult, numbers: dict, settings: dict) -> dict:
    return {
        "settings": settings,
        "interrupted": result.interrupted,
        "summary": numbers,
        "prompts": [
            {
                "prompt": prompt,
                "autoregressive": result.ar[i].text,
                **{rule: result.runs[rule][i].text for rule in result.rules},
                **({"lossless_identical_to_target_greedy": result.identical[i]} if result.identical else {}),
            }
            for i, prompt in enumerate(result.prompts)
        ],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m dropmatch.bench", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", required=True, help="JSONL file with prompt / question / turns")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", default=128)
    parser.add_argument("--gamma", default=4)
    parser.add_argument("--rules", default="lossless,dropmatch")
    parser.add_argument("--target", default="embedded")
    parser.add_argument("--draft", default="embedded")
    parser.add_argument("--k", default=5, help="Monte-Carlo paths")
    parser.add_argument("--p", default="auto", help="dropout rate, or 'auto'")
    parser.add_argument("--temperature", default=0.0)
    parser.add_argument("--top-p", default=1.0)
    parser.add_argument("--seed", default=0)
    parser.add_argument("--json", default=None, help="write every number and text here")
    parser.add_argument("--no-identity-check", action="store_true",
                        help="skip comparing lossless greedy output with the target's generate()")
    return parser


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        decode = DecodeConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                              temperature=args.temperature, top_p=args.top_p, seed=args.seed)
        rule_template = RuleConfig(num_paths=args.k, p=parse_p(args.p))
        rules = parse_rules(args.rules)
        if args.limit is not None and args.limit < 1:
            raise BenchError("--limit must be at least 1")
        prompts = read_prompts(args.prompts, args.limit)
        spec = PairSpec(target=args.target, draft=args.draft)
        return _run(args, decode, rule_template, rules, prompts, spec)
    except (ConfigError, BenchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _run(args, decode, rule_template, rules, prompts, spec) -> int:
    from tqdm import tqdm

    from .engine import Engine
    from .models import ModelLoadError, load_pair

    try:
        engine = Engine(load_pair(spec))
    except ModelLoadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    warm_up(engine, decode, rule_template, rules)
    bar = tqdm(total=len(prompts), desc="prompts", unit="prompt")
    result = run_bench(engine, prompts, rules, decode, rule_template,
                       check_identity=decode.greedy and not args.no_identity_check,
                       progress=lambda r: bar.update(1))
    bar.close()
    if result.interrupted:
        print(f"interrupted: keeping {len(result.prompts)} of {len(prompts)} prompts", file=sys.stderr)
    if not result.prompts:
        print("error: no prompt finished", file=sys.stderr)
        return 1
    numbers = summary(result)
    print(format_table(numbers))
    if args.json:
        settings = {**{k: v for k, v in vars(args).items()}, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
        Path(args.json).write_text(json.dumps(to_json(result, numbers, settings), indent=2))
        print(f"wrote {args.json}")
    return 0


def warm_up(engine, decode: DecodeConfig, rule_template: RuleConfig, rules: list[str]) -> None:
    """One short run of each kind first, so that one-time allocations are not timed."""
    from dataclasses import replace

    from .engine import run_to_end

    ids = engine.encode("Hello!")
    short = replace(decode, max_new_tokens=min(8, decode.max_new_tokens))
    run_to_end(engine.autoregressive(ids, short))
    for rule in rules:
        run_to_end(engine.speculative(ids, short, _with_rule(rule_template, rule)))


if __name__ == "__main__":
    sys.exit(main())
