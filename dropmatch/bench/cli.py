"""Command-line benchmark: autoregressive + each rule on every prompt; a table, JSON, HTML report.

    python -m dropmatch.bench --prompts assets/prompts/mt_bench.jsonl --limit 10 \\
        --max-new-tokens 128 --gamma 4 --rules lossless,dropmatch --json out.json

Several prompt files may be given, comma-separated; each is a benchmark of its own kind, known
from its fields: GSM8K (question + answer), HumanEval (entry_point), IFEval (instruction_id_list),
MT-Bench (turns, first turn used) or plain (prompt). Every generation gets quality figures as the
target sees them (target NLL and the off-nucleus rate, see dropmatch.metrics), distinct-2, overlap
with the lossless answer and, where the kind allows, an accuracy.

The yardstick: --reference-samples N samples of the target alone per prompt (temperature 0.7,
top-p 0.95) give a reference band; a lossy run "stays within the target's own variation" when its
target NLL is at or below the reference's, its off-nucleus rate is at most 1%, and its distinct-2 is at
least 90% of the target's own (greedy runs: lossless SD's greedy text; sampled runs: the samples').
Task scores show only where lossless SD scores above zero; labels say how many of a file's prompts ran.
--frontier sweeps every lossy rule over its knob on the same prompts and seed (JSON key
"frontier"). --same-drafts adds the comparison on the same drafts: lossless SD once per prompt (at the
Studio's draft policy and at a long fixed draft, --same-drafts-gamma), its drafts re-judged under every rule
of the run's mode with the rule lab's code, with 95% bootstrap intervals over prompts (JSON key
"same_drafts"); --same-drafts-only runs that comparison alone. --p-sweep adds DropMatch at fixed dropout rates; --peer times transformers' plain
generate() on the target (JSON benchmarks[set]["peers"]["generate"]: the target alone, the "vs AR" column's
denominator; without --peer that column reads the engine's own autoregressive loop and says so), its assisted
generation and prompt-lookup decoding (greedy) or its static ensemble (sampling, with --rules ensemble); --report writes one self-contained HTML page. Ctrl-C stops and keeps the results so far.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..decoding.acceptance import BASELINE, KNOBS, METHOD, RULES
from ..decoding.config import (DEFAULTS, DRAFT_SOURCES, HEAD_DRAFT_SOURCES, ConfigError, PairSpec, PRESET_SETTINGS,
                               RuleConfig, configs_from, parse_p, rule_names)
from ..decoding.engine import Engine
from ..rule_words import KNOB_HELP
from ..models import ModelLoadError, load_pair
from ..quality import SandboxUnavailable, sandbox_command
from .report import markdown_table, write_report
from .prompts import BenchError, _positive, _whole, load_set, parse_file
from .same_drafts import LONG_GAMMA, policies, run_same_drafts
from .running import run_benchmark, variants, warm_up, with_judge_knob
from .summary import format_same_drafts, format_table, frontier_points, pooled_over_benchmarks, per_prompt, summarize_benchmark


def parse_rules(text: str) -> list[str]:
    rules = [r.strip() for r in text.split(",") if r.strip()]
    if not rules:
        raise BenchError("--rules is empty")
    for rule in rules:
        if rule not in rule_names():
            raise BenchError(f"unknown rule {rule!r}; choose from {', '.join(rule_names())}")
    return rules


def parse_sweep(text: str | None) -> list[float]:
    if not text:
        return []
    values = []
    for part in text.split(","):
        value = parse_p(part.strip())
        if value is None:
            raise BenchError("--p-sweep takes numbers, e.g. 0,0.1,0.2")
        RuleConfig(p=value)  # range check
        values.append(value)
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m dropmatch.bench", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", required=True, help="JSONL file(s), comma-separated; FILE:N takes N prompts")
    parser.add_argument("--limit", default=None, help="prompts per file (where FILE:N does not say)")
    parser.add_argument("--max-new-tokens", default=DEFAULTS.max_new_tokens)
    parser.add_argument("--gamma", default=DEFAULTS.gamma, help="draft length, or 'auto' (per round, from measured costs)")
    parser.add_argument("--draft-source", default=DEFAULTS.draft_source, choices=DRAFT_SOURCES + HEAD_DRAFT_SOURCES,
                        help="model: the draft model; ngram: prompt lookup; hybrid: lookup where it matches, else the "
                             "model; eagle3: the EAGLE-3 head of --eagle3-head")
    parser.add_argument("--eagle3-head", default="", help="an EAGLE-3 head over the target (folder or hub id; the "
                                                          "authors' or the speculators format), for --draft-source eagle3")
    parser.add_argument("--rules", default="lossless,dropmatch")
    parser.add_argument("--target", default="embedded")
    parser.add_argument("--draft", default="embedded")
    for knob in KNOBS.values():  # every rule knob of the table, by its key (RuleConfig.from_mapping checks it)
        parser.add_argument(f"--{knob.user_key.replace('_', '-')}", dest=knob.user_key,
                            default=getattr(DEFAULTS, knob.user_key), choices=knob.choices or None,
                            help=f"{KNOB_HELP[knob.name]} (rules: {', '.join(n for n, r in RULES.items() if knob in r.knobs)})")
    parser.add_argument("--preset", default="", choices=("", *PRESET_SETTINGS),
                        help="method: the method's own " + ", ".join(f"{key} {value}" for key, value in
                                                                      PRESET_SETTINGS["method"].items()
                                                                      if key != "rule") + " (over --k, --p, ...)")
    parser.add_argument("--reference-samples", default=3,
                        help="samples of the target alone per prompt for the reference band (T 0.7, top-p 0.95); 0: off")
    parser.add_argument("--frontier", action="store_true",
                        help="sweep every lossy rule over its knob on the same prompts (JSON key 'frontier')")
    parser.add_argument("--frontier-rules", default="",
                        help="with --frontier: sweep only these rules (comma-separated; default: every lossy rule)")
    parser.add_argument("--same-drafts", action="store_true",
                        help="also compare every rule on the same drafts: lossless SD's, re-judged by the rule lab "
                             "(JSON key 'same_drafts'), at this command's draft policy and at --same-drafts-gamma")
    parser.add_argument("--same-drafts-only", action="store_true",
                        help="the same-drafts comparison alone: no autoregressive, rule, reference or peer runs")
    parser.add_argument("--same-drafts-gamma", default=LONG_GAMMA,
                        help="the same-drafts comparison's long fixed draft (draft model), beside the Studio's policy")
    parser.add_argument("--p-sweep", default=None, help="extra DropMatch runs at these fixed p, e.g. 0,0.1,0.2")
    parser.add_argument("--auto-sweep", default=None,
                        help="extra DropMatch runs at p = auto aiming at these agreements, e.g. 0.8,0.9,0.95")
    parser.add_argument("--sweep-limit", default=None, help="run the sweep on the first N prompts of each file")
    parser.add_argument("--temperature", default=DEFAULTS.temperature)
    parser.add_argument("--top-p", default=DEFAULTS.top_p)
    parser.add_argument("--seed", default=DEFAULTS.seed)
    parser.add_argument("--peer", action="store_true",
                        help="also run transformers' peers: its plain generate() on the target (the target alone: "
                             "the denominator of every 'vs AR' figure); greedy, assisted generation and prompt lookup; "
                             "sampling, its static ensemble at our ensemble rule's weight")
    parser.add_argument("--json", default=None, help="write every number and text here")
    parser.add_argument("--report", default=None, help="write a self-contained HTML report here")
    parser.add_argument("--markdown", default=None, help="write the results table (Markdown) here")
    parser.add_argument("--no-identity-check", action="store_true",
                        help="skip comparing lossless greedy output with the target's generate()")
    parser.add_argument("--engine", choices=("studio", "vllm"), default="studio",
                        help="vllm: through vLLM's CPU build in .venv-vllm (no SD, vLLM's SD, DropMatch), at --concurrency")
    parser.add_argument("--concurrency", default="1,4,16", help="--engine vllm: requests served at once, comma-separated")
    parser.add_argument("--repeats", default=None, help="--engine vllm: timed batches per engine (tokens/s: their median)")
    parser.add_argument("--rounds", default=None,
                        help="--engine vllm: start each engine this many times, in turn (ratios: the rounds' median)")
    return parser


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message}\n")


def apply_preset(args) -> None:
    """--preset's knobs over the parsed flags (its rule aside: --rules still says which rules run)."""
    for name, value in PRESET_SETTINGS.get(args.preset, {}).items():
        if name != "rule":
            setattr(args, name, value)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.engine == "vllm":
            return _through_vllm(args)
        apply_preset(args)
        decode, template = configs_from(vars(args))
        rules = parse_rules(args.rules)
        if args.frontier and BASELINE not in rules:
            rules.insert(0, BASELINE)  # the frontier's origin
        auto_sweep = tuple(RuleConfig(auto_agreement=a).auto_agreement for a in (args.auto_sweep or "").split(",") if a.strip())
        mode = "greedy" if decode.greedy else "sampling"
        for name in rules:
            if mode not in RULES[name].modes:
                raise BenchError(f"--rules: {name!r} is defined under {' and '.join(RULES[name].modes)} decoding only; "
                                 f"this run is {mode}")
        swept = tuple(parse_rules(args.frontier_rules)) if args.frontier_rules else None
        runs = variants(rules, template, parse_sweep(args.p_sweep), args.frontier, auto_sweep, mode, swept)
        args.reference_samples = _whole("--reference-samples", args.reference_samples, 0)
        limit = _positive("--limit", args.limit)
        sweep_limit = _positive("--sweep-limit", args.sweep_limit)
        files = [parse_file(f.strip(), limit) for f in args.prompts.split(",") if f.strip()]
        if not files:
            raise BenchError("--prompts is empty")
        benchmarks = [load_set(f, n) for f, n in files]
        args.same_drafts = args.same_drafts or args.same_drafts_only
        if args.same_drafts:
            try:
                policies(decode, args.same_drafts_gamma)  # its range check, before any model loads
            except ConfigError as error:
                raise BenchError(f"--same-drafts-gamma: {error}") from None
        if not args.same_drafts_only and any(prompt_set.kind == "humaneval" for prompt_set in benchmarks):
            sandbox_command(Path("/"))  # HumanEval runs model-written code: no sandbox, no run (before any model loads)
        if args.draft_source in HEAD_DRAFT_SOURCES and not args.eagle3_head:
            raise BenchError(f"--draft-source {args.draft_source} needs --eagle3-head (a folder or hub id of the head)")
        spec = PairSpec(target=args.target, draft=args.draft, head=args.eagle3_head)
        return _run(args, decode, template, runs, benchmarks, spec, sweep_limit)
    except (ConfigError, BenchError, SandboxUnavailable, ModelLoadError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _through_vllm(args) -> int:
    """The vLLM benchmark (scripts/vllm_bench.py, a checkout's tool) in its own venv, with this command's settings."""
    root = Path(__file__).resolve().parents[2]
    python = root / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        raise BenchError("--engine vllm needs .venv-vllm: run bash scripts/setup.sh --vllm")
    return subprocess.call([str(python), str(root / "scripts" / "vllm_bench.py"), *vllm_bench_args(args)])


def vllm_bench_args(args) -> list[str]:
    """This command's settings as scripts/vllm_bench.py arguments (BenchError or ConfigError on a bad --p-sweep)."""
    lossy = [rule for rule in args.rules.split(",") if rule.strip() and rule.strip() != BASELINE]
    p = f"{KNOBS['p'].default:g}" if str(args.p) == "auto" else str(args.p)  # vLLM runs no per-prompt calibration
    if args.p_sweep:
        p = ",".join(str(value) for value in parse_sweep(args.p_sweep))
    forwarded = ["--prompts", args.prompts, "--max-new-tokens", str(args.max_new_tokens),
                 "--concurrency", args.concurrency, "--p", p, "--rule", (lossy or [METHOD])[0].strip()]
    for flag, value in (("--limit", args.limit), ("--repeats", args.repeats), ("--rounds", args.rounds),
                        ("--json", args.json)):
        if value:
            forwarded += [flag, str(value)]
    return forwarded


def _run(args, decode, template, runs, benchmarks, spec, sweep_limit) -> int:
    engine = Engine(load_pair(spec))
    runs = runnable(engine, runs)
    started = time.time()
    results, interrupted = [], False
    if not args.same_drafts_only:
        warm_up(engine, decode, runs, args.peer)
        results, interrupted = _run_benchmarks(engine, args, decode, runs, benchmarks, sweep_limit)
        results = [r for r in results if r.items]
    same = None
    if args.same_drafts and not interrupted:
        same = _same_drafts(engine, args, decode, template, benchmarks)
        interrupted = same[2]
    if not results and not (same and same[0].get("studio")):
        print("error: no prompt finished", file=sys.stderr)
        return 1
    document = _document(args, results, runs, interrupted, time.time() - started, benchmarks, same)
    for name, numbers in document["benchmarks"].items():
        print(format_table(name, numbers))
    if same:
        print(format_same_drafts(document))
    _write_outputs(args, document)
    return 130 if interrupted else 0


def _same_drafts(engine, args, decode, template, benchmarks) -> tuple[dict, dict, bool]:
    """The comparison on the same drafts (same_drafts.run_same_drafts) over every prompt set, under one progress bar."""
    with tqdm(total=sum(len(prompt_set.items) for prompt_set in benchmarks), desc="same drafts", unit="prompt") as bar:
        same = run_same_drafts(engine, benchmarks, decode, template, int(args.same_drafts_gamma), lambda: bar.update(1))
    if same[2]:
        print("\ninterrupted: keeping the prompts that finished", file=sys.stderr)
    return same


def runnable(engine, runs: list) -> list:
    """The runs this pair can make: the frontier's points of the judge rules need a trained judge (a
    named --rules judge without one is refused by the engine, in one line), and sweep its threshold
    over the judge's own values."""
    dropped = [run for run in runs if run.knob and run.rule.uses_judge and engine.services.judge is None]
    if dropped:
        print(f"note: no trained judge for this target: the frontier leaves out {len(dropped)} judge-rule points",
              file=sys.stderr)
        return [run for run in runs if run not in dropped]
    return with_judge_knob(runs, engine.services.judge) if engine.services.judge is not None else runs


def _run_benchmarks(engine, args, decode, runs, benchmarks, sweep_limit):
    """(results, interrupted): every benchmark in turn, under one progress bar; Ctrl-C keeps what finished."""
    results = []
    with tqdm(total=sum(len(prompt_set.items) for prompt_set in benchmarks), desc="prompts", unit="prompt") as bar:
        for prompt_set in benchmarks:
            result = run_benchmark(engine, prompt_set.name, prompt_set.kind, prompt_set.items, runs, decode,
                                   check_identity=decode.greedy and not args.no_identity_check,
                                   peer=args.peer, sweep_limit=sweep_limit,
                                   progress=lambda: bar.update(1), reference_samples=args.reference_samples)
            results.append(result)
            if result.interrupted:
                print("\ninterrupted: keeping the prompts that finished", file=sys.stderr)
                break
    return results, any(result.interrupted for result in results)


def _document(args, results, runs, interrupted: bool, wall_s: float, benchmarks=(), same=None) -> dict:
    """The JSON document: settings, pooled rules, each benchmark (labelled with what ran), per-prompt rows,
    reference, frontier; the comparison on the same drafts and what it ran (same_drafts_info) where run."""
    sets = {prompt_set.name: prompt_set for prompt_set in benchmarks}
    summaries = {r.name: summarize_benchmark(r) for r in results}
    for name, summary in summaries.items():
        if name in sets:
            summary["label"] = sets[name].label(summary["prompts"])
    overall = pooled_over_benchmarks(results) if results else {"rules": {}}
    document = {
        "settings": {**vars(args), "command": "python -m dropmatch.bench " + " ".join(sys.argv[1:]),
                     "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(), "wall_s": wall_s},
        "interrupted": interrupted,
        "rules": overall["rules"],
        "benchmarks": summaries,
        "prompts": {r.name: per_prompt(r) for r in results},
    }
    if same is not None:
        document["same_drafts"], document["same_drafts_info"] = same[0], same[1]
    if "reference" in overall:
        document["reference"] = overall["reference"]
    if args.frontier and results:
        document["frontier"] = [{"benchmark": name, **point} for name, numbers in {"all": overall, **summaries}.items()
                                for point in frontier_points(numbers, runs)]
    return document


def _write_outputs(args, document: dict) -> None:
    for path, write in ((args.json, lambda file: file.write_text(json.dumps(document, indent=2))),
                        (args.report, lambda file: write_report(document, file)),
                        (args.markdown, lambda file: file.write_text(markdown_table(document) + "\n"))):
        if path:
            write(Path(path))
            print(f"wrote {path}")


def machine() -> str:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return f"{platform.machine()}, {os.cpu_count()} cores, {device}, torch {torch.__version__}, {torch.get_num_threads()} threads"
