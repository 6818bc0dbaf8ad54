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
target NLL is at or below the reference's and its off-nucleus rate is at most 1%.
--frontier sweeps every lossy rule over its knob on the same prompts and seed (JSON key
"frontier"). --p-sweep adds DropMatch at fixed dropout rates; --peer times transformers' assisted
generation; --report writes one self-contained HTML page. Ctrl-C stops and keeps the results so far.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import tables
from .config import CENTROIDS, DRAFT_SOURCES, ConfigError, DecodeConfig, PairSpec, RuleConfig, parse_p, rule_names
from .metrics import MAX_OFF_NUCLEUS

REFERENCE_TEMPERATURE, REFERENCE_TOP_P = 0.7, 0.95
FRONTIER_P = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
FRONTIER_KNOBS = {  # the values each rule's knob is swept over; p for the path rules
    "p": FRONTIER_P,
    "fixed_js_threshold": (0.02, 0.05, 0.1, 0.2, 0.3),
    "typical_eps": (0.3, 0.2, 0.1, 0.05, 0.02),
}


class BenchError(Exception):
    """Bad benchmark input; printed as one line."""


# ---------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Item:
    """One benchmark prompt: the text sent to the model and the record it came from."""

    prompt: str
    record: dict


def detect_kind(record: dict) -> str:
    if "entry_point" in record:
        return "humaneval"
    if "instruction_id_list" in record:
        return "ifeval"
    if "question" in record and "answer" in record:
        return "gsm8k"
    if "turns" in record:
        return "mt_bench"
    return "plain"


def prompt_of(record: dict, kind: str) -> str | None:
    from .quality import HUMANEVAL_PROMPT

    if kind == "humaneval":
        return HUMANEVAL_PROMPT.format(prompt=record["prompt"])
    return record.get("prompt") or record.get("question") or (record.get("turns") or [None])[0]


def read_prompts(path: str, limit: int | None) -> tuple[str, list[Item]]:
    """(kind, items) of a JSONL file; BenchError with one line if it cannot be used.
    A limit keeps the first `limit` prompts, spread over the file's categories when its records
    have one (see spread_over_categories)."""
    file = Path(path)
    if not file.is_file():
        raise BenchError(f"prompt file not found: {path}")
    items, kind = [], None
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise BenchError(f"{path}:{number} is not a JSON line") from None
        if not isinstance(record, dict):
            raise BenchError(f"{path}:{number} is not a JSON object")
        kind = kind or detect_kind(record)
        prompt = prompt_of(record, kind)
        if not isinstance(prompt, str) or not prompt.strip():
            raise BenchError(f"{path}:{number} has no 'prompt', 'question' or 'turns'")
        items.append(Item(prompt, record))
    if not items:
        raise BenchError(f"{path} holds no prompts")
    return kind, spread_over_categories(items, limit)


def category_of(item: Item) -> str | None:
    category = item.record.get("category")
    return category if isinstance(category, str) and category else None


def spread_over_categories(items: list[Item], limit: int | None) -> list[Item]:
    """The first `limit` items, taken in turn from each category (in the order the categories
    first appear; file order within each), so that a sample of a file sorted by category (MT-Bench:
    ten writing questions, then ten roleplay, ...) covers them all. Items without a category:
    simply the first `limit`."""
    if limit is None or limit >= len(items):
        return items
    if any(category_of(item) is None for item in items):
        return items[:limit]
    queues: dict[str, list[Item]] = {}
    for item in items:
        queues.setdefault(category_of(item), []).append(item)
    chosen = []
    for rank in range(max(len(queue) for queue in queues.values())):
        chosen += [queue[rank] for queue in queues.values() if rank < len(queue)]
    position = {id(item): i for i, item in enumerate(items)}
    return sorted(chosen[:limit], key=lambda item: position[id(item)])  # file order, as without categories


def parse_file(text: str, default_limit: int | None) -> tuple[str, int | None]:
    """'file.jsonl' or 'file.jsonl:N' (N prompts of that file) -> (path, limit)."""
    path, _, count = text.rpartition(":") if text.rpartition(":")[2].isdigit() else (text, "", "")
    return (path, _positive(f"the count after {path}:", count)) if count else (text, default_limit)


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


@dataclass(frozen=True)
class Variant:
    """One speculative run per prompt: its label, its settings, and the knob it sets (frontier points)."""

    label: str
    rule: RuleConfig
    knob: str | None = None
    value: float | None = None


def variants(rules: list[str], template: RuleConfig, sweep: list[float], frontier: bool = False,
             auto_sweep: tuple[float, ...] = ()) -> list[Variant]:
    """Every speculative run per prompt: the named rules, the p sweep, p = auto at each agreement of
    the auto sweep, then the frontier's points."""
    runs = [Variant(rule, replace(template, rule=rule)) for rule in rules]
    runs += [Variant(f"dropmatch@p={p:g}", replace(template, rule="dropmatch", p=p), "p", p) for p in sweep]
    runs += [Variant(f"dropmatch@auto_agreement={a:g}", replace(template, rule="dropmatch", p=None, auto_agreement=a),
                     "auto_agreement", a) for a in auto_sweep]
    if frontier:
        runs += frontier_variants(template)
    labels = [run.label for run in runs]
    return [run for i, run in enumerate(runs) if run.label not in labels[:i]]  # one run per label


def frontier_variants(template: RuleConfig) -> list[Variant]:
    """Each lossy rule over its knob (FRONTIER_KNOBS); DropMatch with both centroids."""
    from .acceptance import RULES

    runs = []
    for name, rule in RULES.items():
        if not rule.lossy or rule.knob is None:
            continue
        centroids = CENTROIDS if name == "dropmatch" else (template.centroid,)
        for centroid in centroids:
            prefix = name if centroid == template.centroid else f"{name}/{centroid}"
            for value in FRONTIER_KNOBS[rule.knob]:
                config = replace(template, rule=name, centroid=centroid, **{rule.knob: value})
                runs.append(Variant(f"{prefix}@{rule.knob}={value:g}", config, rule.knob, value))
    return runs


# ---------------------------------------------------------------- running


@dataclass
class Generation:
    """One run's trace plus its quality numbers."""

    trace: object
    target_nll: float | None
    off_nucleus_rate: float | None
    distinct2: float
    correct: float | None = None  # 1/0 (or a share for IFEval); None where the kind has no score
    overlap_with_lossless: float | None = None


@dataclass
class BenchmarkResult:
    name: str
    kind: str
    items: list[Item] = field(default_factory=list)
    ar: list[Generation] = field(default_factory=list)
    runs: dict[str, list[Generation | None]] = field(default_factory=dict)
    identical: list[bool] = field(default_factory=list)
    peers: dict[str, list[dict]] = field(default_factory=dict)  # peer name -> one row per prompt
    reference: list[list[Generation]] = field(default_factory=list)  # per prompt, the target's own samples
    skipped: list[str] = field(default_factory=list)  # why prompts that do not fit were left out
    interrupted: bool = False


def score(kind: str, item: Item, text: str) -> float | None:
    from . import quality

    if kind == "gsm8k":
        return float(quality.gsm8k_correct(text, item.record["answer"]))
    if kind == "humaneval":
        return float(quality.humaneval_passes(item.record, text))
    if kind == "ifeval":
        followed, checked = quality.ifeval_followed(item.record, text)
        return followed / checked if checked else None
    return None


def generation(kind, item, trace, lossless=None) -> Generation:
    from . import metrics, quality

    return Generation(
        trace=trace,
        target_nll=metrics.target_nll(trace),
        off_nucleus_rate=metrics.off_nucleus_rate(trace),
        distinct2=quality.distinct2(trace.output_ids),
        correct=score(kind, item, trace.text),
        overlap_with_lossless=None if lossless is None else quality.token_overlap(trace.output_ids, lossless.output_ids),
    )


def run_benchmark(engine, name, kind, items, runs, decode, check_identity, peer, sweep_limit, progress,
                  reference_samples: int = 0) -> BenchmarkResult:
    """AR, then every variant, then the peer, prompt by prompt, so machine noise hits all alike.
    Ctrl-C ends it early; the prompts that finished are kept (result.interrupted is set)."""
    result = BenchmarkResult(name, kind, runs={run.label: [] for run in runs})
    try:
        _run_items(engine, kind, items, runs, decode, check_identity, peer, sweep_limit, progress, result,
                   reference_samples)
    except KeyboardInterrupt:
        result.interrupted = True
    return result


def reference_decodes(decode: DecodeConfig, samples: int) -> list[DecodeConfig]:
    """The target's own samples that make the reference band: temperature 0.7, top-p 0.95, one seed each."""
    return [replace(decode, temperature=REFERENCE_TEMPERATURE, top_p=REFERENCE_TOP_P, seed=decode.seed + i)
            for i in range(samples)]


def _run_items(engine, kind, items, runs, decode, check_identity, peer, sweep_limit, progress, result,
               reference_samples=0) -> None:
    from .engine import run_to_end
    from .models import greedy_reference

    for index, item in enumerate(items):
        ids = engine.encode(item.prompt)
        try:
            engine.check_fits(ids, decode)
        except ConfigError as error:
            result.skipped.append(str(error))
            progress()
            continue
        ar = run_to_end(engine.autoregressive(ids, decode))
        traces = {}
        for run in runs:
            if run.knob is not None and sweep_limit is not None and index >= sweep_limit:
                continue
            traces[run.label] = run_to_end(engine.speculative(ids, decode, run.rule))
        own_samples = [run_to_end(engine.autoregressive(ids, sample)) for sample in reference_decodes(decode, reference_samples)]
        peer_rows = {}
        if peer:
            for name, (_, generate) in PEERS.items():
                tokens, seconds = generate(engine, ids, decode)
                peer_rows[name] = {"tokens": len(tokens), "seconds": seconds, "identical_to_lossless":
                                   "lossless" in traces and list(traces["lossless"].output_ids) == tokens}
        identical = None
        if check_identity and "lossless" in traces:
            reference = greedy_reference(engine.target, ids, decode.max_new_tokens, engine.stop_ids)
            identical = list(traces["lossless"].output_ids) == reference
        lossless = traces.get("lossless")
        result.items.append(item)
        result.ar.append(generation(kind, item, ar))
        result.reference.append([generation(kind, item, trace) for trace in own_samples])
        for label in result.runs:
            trace = traces.get(label)
            result.runs[label].append(None if trace is None else generation(kind, item, trace, lossless))
        if identical is not None:
            result.identical.append(identical)
        for name, row in peer_rows.items():
            result.peers.setdefault(name, []).append(row)
        progress()


# ---------------------------------------------------------------- summaries


def _div(a, b):
    return a / b if a is not None and b else None


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize_benchmark(result: BenchmarkResult) -> dict:
    """Pooled numbers per run label (ratios of sums over prompts)."""
    from .metrics import mc_overhead, per_position_acceptance, pooled

    ar = pooled([g.trace for g in result.ar])
    ar.update(distinct2=_mean([g.distinct2 for g in result.ar]), accuracy=_mean([g.correct for g in result.ar]))
    rules = {}
    lossless_runs = result.runs.get("lossless")
    for label, generations in result.runs.items():
        pairs = [(i, g) for i, g in enumerate(generations) if g is not None]
        if not pairs:
            continue
        traces = [g.trace for _, g in pairs]
        stats = pooled(traces)
        ar_subset = pooled([result.ar[i].trace for i, _ in pairs])
        stats["speedup_vs_ar"] = _div(stats["tokens_per_s"], ar_subset["tokens_per_s"])
        if lossless_runs:
            lossless_subset = pooled([lossless_runs[i].trace for i, _ in pairs])
            stats["speedup_vs_lossless"] = _div(stats["tokens_per_s"], lossless_subset["tokens_per_s"])
        shares = [mc_overhead(g.trace) for _, g in pairs]
        stats["mc_overhead"] = _mean(shares)
        stats["p"] = _mean([t.p for t in traces])
        stats["accuracy"] = _mean([g.correct for _, g in pairs])
        stats["distinct2"] = _mean([g.distinct2 for _, g in pairs])
        stats["overlap_with_lossless"] = _mean([g.overlap_with_lossless for _, g in pairs])
        stats["per_position_acceptance"] = list(per_position_acceptance(*traces))
        if label == "lossless" and traces[0].temperature == 0.0 and result.identical:
            stats["identical_to_target_greedy"] = all(result.identical)
            stats["identical_prompts"] = f"{sum(result.identical)}/{len(result.identical)}"
        rules[label] = stats
    out = {"kind": result.kind, "prompts": len(result.items), "skipped": result.skipped,
           "autoregressive": ar, "rules": rules}
    reference = reference_summary(result)
    if reference is not None:
        out["reference"] = {"target_sampled": reference}
        for stats in rules.values():
            stats["within_reference"] = within_reference(stats, reference)
    categories = by_category(result)
    if categories:
        out["categories"] = categories
    if result.peers:
        ours = rules.get("lossless", {}).get("tokens_per_s")
        out["peers"] = {}
        for name, rows in result.peers.items():
            theirs = _div(sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows))
            out["peers"][name] = {"name": PEERS[name][0], "tokens_per_s": theirs, "ours_over_peer": _div(ours, theirs),
                                  "identical_to_lossless": all(r["identical_to_lossless"] for r in rows)}
    return out


def reference_summary(result: BenchmarkResult) -> dict | None:
    """The reference band: the target's own samples pooled (token-weighted), or None without samples."""
    from .metrics import pooled

    samples = [g for per_prompt in result.reference for g in per_prompt]
    if not samples:
        return None
    numbers = pooled([g.trace for g in samples])
    return {"temperature": REFERENCE_TEMPERATURE, "top_p": REFERENCE_TOP_P,
            "samples": len(samples) // max(len(result.reference), 1), "target_nll": numbers["target_nll"],
            "off_nucleus_rate": numbers["off_nucleus_rate"], "accuracy": _mean([g.correct for g in samples])}


def within_reference(stats: dict, reference: dict) -> bool | None:
    """Does a run stay within the target's own variation: target NLL at or below the reference's and
    off-nucleus rate at most MAX_OFF_NUCLEUS."""
    if stats.get("target_nll") is None or reference.get("target_nll") is None:
        return None
    return stats["target_nll"] <= reference["target_nll"] and (stats.get("off_nucleus_rate") or 0.0) <= MAX_OFF_NUCLEUS


def frontier_points(summary: dict, runs: list[Variant]) -> list[dict]:
    """One point per frontier run (a run with a knob) of a benchmark summary, against its lossless run."""
    lossless = summary["rules"].get("lossless")
    points = []
    for run in runs:
        stats = summary["rules"].get(run.label)
        if run.knob is None or stats is None:
            continue
        tau_gain = _div(stats["tau"], lossless["tau"]) - 1 if lossless and _div(stats["tau"], lossless["tau"]) else None
        points.append({"label": run.label, "rule": run.rule.rule, "centroid": run.rule.centroid, "knob": run.knob,
                       "value": run.value, "p": stats.get("p"), "tau": stats["tau"], "tau_gain": tau_gain,
                       "speed_vs_lossless": stats.get("speedup_vs_lossless"), "target_nll": stats["target_nll"],
                       "off_nucleus_rate": stats["off_nucleus_rate"], "accuracy": stats["accuracy"],
                       "within_reference": stats.get("within_reference")})
    return points


def by_category(result: BenchmarkResult) -> dict[str, dict]:
    """{category: summarize_benchmark of its prompts} when the prompts come from two categories or
    more (MT-Bench), else {}: a pooled number can hide that a rule helps on one kind of prompt only."""
    categories = [category_of(item) for item in result.items]
    if None in categories or len(set(categories)) < 2:
        return {}
    out = {}
    for category in dict.fromkeys(categories):
        chosen = [i for i, c in enumerate(categories) if c == category]
        part = BenchmarkResult(result.name, result.kind, items=[result.items[i] for i in chosen],
                               ar=[result.ar[i] for i in chosen],
                               runs={label: [runs[i] for i in chosen] for label, runs in result.runs.items()},
                               identical=[result.identical[i] for i in chosen] if result.identical else [],
                               reference=[result.reference[i] for i in chosen] if result.reference else [])
        out[category] = summarize_benchmark(part)
    return out


def format_table(name: str, numbers: dict) -> str:
    rows = [row[:-1] for row in [tables.HEADER, *tables.summary_rows(numbers, dash="-", peer=False)]]  # no overlap
    skipped = f", {len(numbers['skipped'])} skipped: too long" if numbers.get("skipped") else ""
    lines = [f"== {name} ({numbers['kind']}, {numbers['prompts']} prompts{skipped})", *_aligned(rows)]
    for peer in numbers.get("peers", {}).values():
        lines.append(f"peer: {peer['name']} {_f(peer['tokens_per_s'], 1)} tok/s; ours/peer = {_f(peer['ours_over_peer'])}")
    by_kind = tables.category_rows(numbers, dash="-")
    if by_kind:
        lines += ["by category:", *_aligned([tables.CATEGORY_HEADER, *by_kind])]
    return "\n".join(lines)


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Text lines of a table, each column padded to its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]


def _f(value, digits: int = 2) -> str:
    return tables.number(value, digits, dash="-")


def pooled_over_benchmarks(results: list[BenchmarkResult]) -> dict:
    """Every prompt of every benchmark together: the engine issue's per-rule fields."""
    merged = BenchmarkResult("all", "mixed", runs={label: [] for label in results[0].runs})
    for result in results:
        merged.items += result.items
        merged.ar += result.ar
        merged.identical += result.identical
        merged.reference += result.reference
        for label in merged.runs:
            merged.runs[label] += result.runs[label]
    return summarize_benchmark(merged)


def per_prompt(result: BenchmarkResult) -> list[dict]:
    rows = []
    for i, item in enumerate(result.items):
        row = {"prompt": item.prompt, "autoregressive": result.ar[i].trace.text}
        if category_of(item):
            row["category"] = category_of(item)
        for label, generations in result.runs.items():
            g = generations[i]
            if g is not None:
                row[label] = {"text": g.trace.text, "correct": g.correct, "target_nll": g.target_nll,
                              "off_nucleus_rate": g.off_nucleus_rate, "distinct2": g.distinct2, "p": g.trace.p}
        if result.identical:
            row["lossless_identical_to_target_greedy"] = result.identical[i]
        rows.append(row)
    return rows


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m dropmatch.bench", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", required=True, help="JSONL file(s), comma-separated; FILE:N takes N prompts")
    parser.add_argument("--limit", default=None, help="prompts per file (where FILE:N does not say)")
    parser.add_argument("--max-new-tokens", default=128)
    parser.add_argument("--gamma", default="auto", help="draft length, or 'auto' (per round, from measured costs)")
    parser.add_argument("--draft-source", default="hybrid", choices=DRAFT_SOURCES,
                        help="model: the draft model; ngram: prompt lookup; hybrid: lookup where it matches, else the model")
    parser.add_argument("--draft-confidence", default=0.0,
                        help="stop drafting a round once the draft's probability of its token is below this (0: off)")
    parser.add_argument("--rules", default="lossless,dropmatch")
    parser.add_argument("--target", default="embedded")
    parser.add_argument("--draft", default="embedded")
    parser.add_argument("--k", default=5, help="Monte-Carlo paths")
    parser.add_argument("--p", default="auto", help="dropout rate, or 'auto'")
    parser.add_argument("--auto-agreement", default=RuleConfig.auto_agreement, help="path agreement that p=auto aims for")
    parser.add_argument("--centroid", default=RuleConfig.centroid, choices=CENTROIDS,
                        help="the paths' centroid: mean of their distributions (the method's), or softmax of the mean logits")
    parser.add_argument("--majority-fraction", default=RuleConfig.majority_fraction,
                        help="majority needs ceil(f * K) path votes (0.5: a strict majority; default 0.8, 4 of 5)")
    parser.add_argument("--reference-samples", default=3,
                        help="samples of the target alone per prompt for the reference band (T 0.7, top-p 0.95); 0: off")
    parser.add_argument("--frontier", action="store_true",
                        help="sweep every lossy rule over its knob on the same prompts (JSON key 'frontier')")
    parser.add_argument("--p-sweep", default=None, help="extra DropMatch runs at these fixed p, e.g. 0,0.1,0.2")
    parser.add_argument("--auto-sweep", default=None,
                        help="extra DropMatch runs at p = auto aiming at these agreements, e.g. 0.8,0.9,0.95")
    parser.add_argument("--sweep-limit", default=None, help="run the sweep on the first N prompts of each file")
    parser.add_argument("--temperature", default=0.0)
    parser.add_argument("--top-p", default=1.0)
    parser.add_argument("--seed", default=0)
    parser.add_argument("--peer", action="store_true",
                        help="also time transformers' assisted generation and its prompt-lookup decoding")
    parser.add_argument("--json", default=None, help="write every number and text here")
    parser.add_argument("--report", default=None, help="write a self-contained HTML report here")
    parser.add_argument("--markdown", default=None, help="write the results table (Markdown) here")
    parser.add_argument("--no-identity-check", action="store_true",
                        help="skip comparing lossless greedy output with the target's generate()")
    return parser


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message}\n")


def check_sandbox() -> None:
    """HumanEval runs model-written code: refuse before any model loads when the sandbox is missing."""
    from .quality import SandboxUnavailable, sandbox_command

    try:
        sandbox_command(Path("/"))
    except SandboxUnavailable as error:
        raise BenchError(str(error)) from None


def _whole(name: str, value, least: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise BenchError(f"{name} must be a whole number, got {value!r}") from None
    if number < least:
        raise BenchError(f"{name} must be {'0 or more' if least == 0 else f'at least {least}'}")
    return number


def _count(name: str, value) -> int:
    return _whole(name, value, 0)


def _positive(name: str, value) -> int | None:
    return None if value is None else _whole(name, value, 1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        decode = DecodeConfig(**DecodeConfig.parse_gamma(args.gamma), max_new_tokens=args.max_new_tokens,
                              temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                              draft_confidence=args.draft_confidence, draft_source=args.draft_source)
        template = RuleConfig(num_paths=args.k, p=parse_p(args.p), auto_agreement=args.auto_agreement,
                              centroid=args.centroid, majority_fraction=args.majority_fraction)
        rules = parse_rules(args.rules)
        if args.frontier and "lossless" not in rules:
            rules.insert(0, "lossless")  # the frontier's origin
        auto_sweep = tuple(RuleConfig(auto_agreement=a).auto_agreement for a in (args.auto_sweep or "").split(",") if a.strip())
        runs = variants(rules, template, parse_sweep(args.p_sweep), args.frontier, auto_sweep)
        args.reference_samples = _count("--reference-samples", args.reference_samples)
        limit = _positive("--limit", args.limit)
        sweep_limit = _positive("--sweep-limit", args.sweep_limit)
        files = [parse_file(f.strip(), limit) for f in args.prompts.split(",") if f.strip()]
        if not files:
            raise BenchError("--prompts is empty")
        benchmarks = [(Path(f).stem, *read_prompts(f, n)) for f, n in files]
        if any(kind == "humaneval" for _, kind, _ in benchmarks):
            check_sandbox()
        spec = PairSpec(target=args.target, draft=args.draft)
        return _run(args, decode, runs, benchmarks, spec, sweep_limit)
    except (ConfigError, BenchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _run(args, decode, runs, benchmarks, spec, sweep_limit) -> int:
    from tqdm import tqdm

    from .engine import Engine
    from .models import ModelLoadError, load_pair

    try:
        engine = Engine(load_pair(spec))
    except ModelLoadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    peer = peer_runs(args.peer, decode)
    started = time.time()
    warm_up(engine, decode, runs)
    total = sum(len(items) for _, _, items in benchmarks)
    bar = tqdm(total=total, desc="prompts", unit="prompt")
    results, interrupted = [], False
    for name, kind, items in benchmarks:
        result = run_benchmark(engine, name, kind, items, runs, decode,
                               check_identity=decode.greedy and not args.no_identity_check,
                               peer=peer, sweep_limit=sweep_limit,
                               progress=lambda: bar.update(1), reference_samples=args.reference_samples)
        results.append(result)
        if result.interrupted:
            interrupted = True
            print("\ninterrupted: keeping the prompts that finished", file=sys.stderr)
            break
    bar.close()
    results = [r for r in results if r.items]
    if not results:
        print("error: no prompt finished", file=sys.stderr)
        return 1
    summaries = {r.name: summarize_benchmark(r) for r in results}
    overall = pooled_over_benchmarks(results)
    for name, numbers in summaries.items():
        print(format_table(name, numbers))
    document = {
        "settings": {**vars(args), "command": "python -m dropmatch.bench " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(),
                     "wall_s": time.time() - started},
        "interrupted": interrupted,
        "rules": overall["rules"],
        "benchmarks": summaries,
        "prompts": {r.name: per_prompt(r) for r in results},
    }
    if "reference" in overall:
        document["reference"] = overall["reference"]
    if args.frontier:
        document["frontier"] = [{"benchmark": name, **point} for name, numbers in {"all": overall, **summaries}.items()
                                for point in frontier_points(numbers, runs)]
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2))
        print(f"wrote {args.json}")
    if args.report:
        from .report import write_report

        write_report(document, Path(args.report))
        print(f"wrote {args.report}")
    if args.markdown:
        from .report import markdown_table

        Path(args.markdown).write_text(markdown_table(document) + "\n")
        print(f"wrote {args.markdown}")
    return 130 if interrupted else 0


def machine() -> str:
    import os

    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return f"{platform.machine()}, {os.cpu_count()} cores, {device}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def _assisted(engine, ids, decode: DecodeConfig):
    from .models import assisted_generate

    return assisted_generate(engine.target, engine.draft, ids, decode.max_new_tokens,
                             None if decode.gamma_auto else decode.gamma, engine.stop_ids)


def _prompt_lookup(engine, ids, decode: DecodeConfig):
    from .models import prompt_lookup_generate

    return prompt_lookup_generate(engine.target, ids, decode.max_new_tokens, engine.stop_ids)


# The peers --peer times on the same prompts, in the same process, right after our runs of each prompt:
# key -> (the name reports show, the timed run).
PEERS = {"assisted": ("transformers assisted generation", _assisted),
         "prompt_lookup": ("transformers prompt-lookup decoding", _prompt_lookup)}


def peer_runs(requested: bool, decode: DecodeConfig) -> bool:
    """Whether to time the peers: asked for, and greedy (their only mode here)."""
    return requested and decode.greedy


def warm_up(engine, decode: DecodeConfig, runs) -> None:
    """One short run of each kind first, so that one-time allocations are not timed."""
    from .engine import run_to_end

    ids = engine.encode("Hello!")
    short = replace(decode, max_new_tokens=min(8, decode.max_new_tokens))
    run_to_end(engine.autoregressive(ids, short))
    for run in runs:
        run_to_end(engine.speculative(ids, short, run.rule))


if __name__ == "__main__":
    sys.exit(main())
