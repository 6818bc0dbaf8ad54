"""Benchmark summaries: pooled numbers per run label (ratios of sums over prompts), the reference
band, frontier points, per-category splits, text tables and per-prompt rows."""

from __future__ import annotations

from . import tables
from ..decoding.acceptance import BASELINE
from ..metrics import (MAX_OFF_NUCLEUS, MIN_DISTINCT2_SHARE, difference, ended_by_rule, ended_early, mc_overhead,
                       per_position_acceptance, pooled)
from ..quality import outside_on_length
from .prompts import category_of
from .running import GENERATE, PEER_NAMES, REFERENCE_TEMPERATURE, REFERENCE_TOP_P, BenchmarkResult, Variant


DELTA_KEYS = ("delta_target_nll", "delta_off_nucleus_rate", "delta_distinct2")


def _div(a, b):
    return a / b if a is not None and b else None


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize_benchmark(result: BenchmarkResult) -> dict:
    """Pooled numbers per run label (ratios of sums over prompts); "vs AR" (speedup_vs_ar) against the target
    alone: transformers' generate() where --peer timed it on every prompt (`vs_ar_against` says which)."""
    ar = pooled([g.trace for g in result.ar])
    ar.update(distinct2=_mean([g.distinct2 for g in result.ar]), accuracy=_mean([g.correct for g in result.ar]))
    alone = alone_tokens_per_s(result, range(len(result.items)))
    if alone is not None:  # the engine's own autoregressive loop, against what a user runs
        ar["speedup_vs_ar"] = _div(ar["tokens_per_s"], alone)
    rules = {}
    for label, generations in result.runs.items():
        if pairs := [(i, g) for i, g in enumerate(generations) if g is not None]:
            rules[label] = _rule_stats(result, label, pairs)
    out = {"kind": result.kind, "prompts": len(result.items), "skipped": result.skipped,
           "autoregressive": ar, "rules": rules, "task_score_note": task_score_note(rules, ar),
           "vs_ar_against": tables.VS_GENERATE if alone is not None else tables.VS_OWN_LOOP}
    if (reference := reference_summary(result)) is not None:
        reference["repetition_against"] = tables.GREEDY_YARDSTICK if is_greedy(result) else tables.SAMPLED_YARDSTICK
        out["reference"] = {"target_sampled": reference}
        for stats in rules.values():
            stats["band"] = band_checks(stats, reference, stats["repetition_yardstick"])
            stats["within_reference"] = within_reference(stats, reference, stats["repetition_yardstick"])
    if categories := by_category(result):
        out["categories"] = categories
    if result.peers:
        out["peers"] = peers_summary(result, rules)
    return out


def alone_tokens_per_s(result: BenchmarkResult, indices) -> float | None:
    """transformers' generate() tokens/s on the prompts `indices` (ratio of sums of --peer's runs of the target
    alone); None where it did not run on every prompt."""
    chosen = _peer_rows(result, indices).get(GENERATE)
    return None if chosen is None else _div(sum(r["tokens"] for r in chosen), sum(r["seconds"] for r in chosen))


def _rule_stats(result: BenchmarkResult, label: str, pairs: list[tuple[int, object]]) -> dict:
    """One run label's pooled numbers over the prompts it ran (`pairs`: (prompt index, Generation))."""
    traces, indices = [g.trace for _, g in pairs], [i for i, _ in pairs]
    lossless_runs = result.runs.get(BASELINE)
    stats = pooled(traces)
    alone = alone_tokens_per_s(result, indices)
    if alone is None:
        alone = pooled([result.ar[i].trace for i in indices])["tokens_per_s"]
    stats["speedup_vs_ar"] = _div(stats["tokens_per_s"], alone)
    if lossless_runs:
        lossless_subset = pooled([lossless_runs[i].trace for i in indices])
        stats["speedup_vs_lossless"] = _div(stats["tokens_per_s"], lossless_subset["tokens_per_s"])
        lossless_subset["distinct2"] = _mean([lossless_runs[i].distinct2 for i in indices])
    stats["mc_overhead"] = mc_overhead(*traces)  # pooled: sum of MC time / sum of round time
    stats["p"] = _mean([t.p for t in traces])
    stats["accuracy"] = _mean([g.correct for _, g in pairs])
    stats["distinct2"] = _mean([g.distinct2 for _, g in pairs])
    stats["overlap_with_lossless"] = _mean([g.overlap_with_lossless for _, g in pairs])
    if lossless_runs:  # the change against lossless SD on the same prompts
        stats.update({f"delta_{key}": difference(stats[key], lossless_subset[key])
                      for key in ("target_nll", "off_nucleus_rate", "distinct2")})
    stats["per_position_acceptance"] = list(per_position_acceptance(*traces))
    stats.update(ending_counts(result, pairs))
    stats["repetition_yardstick"] = own_greedy_distinct2(result, indices)
    if label == BASELINE and traces[0].temperature == 0.0 and result.identical:
        stats["identical_to_target_greedy"] = all(result.identical)
        stats["identical_prompts"] = f"{sum(result.identical)}/{len(result.identical)}"
        stats["divergences"] = list(result.divergences)
    return stats


def peers_summary(result: BenchmarkResult, rules: dict) -> dict:
    """Each peer's tokens/s (ratio of sums), ours over it (the run it is held against), its identity and NLL."""
    out = {}
    for name, rows in result.peers.items():
        against = rows[0].get("ours", BASELINE)
        ours = rules.get(against, {}).get("tokens_per_s")
        theirs = _div(sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows))
        out[name] = {"name": PEER_NAMES[name], "tokens_per_s": theirs, "ours_over_peer": _div(ours, theirs),
                     "against": against, "identical_to_lossless": all(r["identical_to_lossless"] for r in rows)}
        if scored := [r for r in rows if r.get("target_nll") is not None]:  # token-weighted, as our runs' NLL is
            tokens = sum(r["tokens"] for r in scored)
            out[name]["target_nll"] = sum(r["target_nll"] * r["tokens"] for r in scored) / max(tokens, 1)
    return out


def ending_counts(result: BenchmarkResult, pairs: list[tuple[int, object]]) -> dict:
    """A rule's answers (prompt index, Generation) by how they end: ended_early, the share of prompts whose answer
    ended (an end of text) before lossless SD's (None without lossless SD's runs); length_outside, the prompts
    outside the band's length axis (quality.outside_on_length against the target's samples and lossless SD's answer;
    None without the target's own samples)."""
    lossless = result.runs.get(BASELINE)
    early = [ended_early(g.trace, lossless[i].trace) for i, g in pairs if lossless and lossless[i] is not None]
    aligned = len(result.reference) == len(result.items)  # per prompt (a merge of sets may lack some)
    # the target's own answers on the prompt: its samples and lossless SD's (the target's output exactly), so that
    # one sample longer than the greedy answer does not put the target itself outside
    samples = [[len(s.trace.output_ids) for s in result.reference[i]]
               + ([len(lossless[i].trace.output_ids)] if lossless and lossless[i] is not None else [])
               if aligned else [] for i, _ in pairs]
    outside = [outside_on_length(len(g.trace.output_ids), lengths, ended_by_rule(g.trace))
               for (_, g), lengths in zip(pairs, samples) if lengths]
    return {"ended_early": sum(early) / len(early) if early else None, "ended_early_prompts": sum(early),
            "length_outside": sum(outside) if outside else None}


def task_score_note(rules: dict, ar: dict) -> str | None:
    """Why the task-score column is empty, or None where it is shown (or the kind has no score): a score
    says something only where lossless SD (the target's own answer) scores above zero."""
    own = (rules.get(BASELINE) or ar).get("accuracy")
    return "lossless SD scores 0 here" if own == 0 else None


def reference_summary(result: BenchmarkResult) -> dict | None:
    """The reference band: the target's own samples pooled (token-weighted), or None without samples."""
    samples = [g for per_prompt in result.reference for g in per_prompt]
    if not samples:
        return None
    numbers = pooled([g.trace for g in samples])
    return {"temperature": REFERENCE_TEMPERATURE, "top_p": REFERENCE_TOP_P,
            "samples": len(samples) // max(len(result.reference), 1), "target_nll": numbers["target_nll"],
            "off_nucleus_rate": numbers["off_nucleus_rate"], "distinct2": _mean([g.distinct2 for g in samples]),
            "accuracy": _mean([g.correct for g in samples])}


def is_greedy(result: BenchmarkResult) -> bool:
    return bool(result.ar) and result.ar[0].trace.temperature == 0.0


def own_greedy_distinct2(result: BenchmarkResult, indices: list[int]) -> float | None:
    """Under greedy decoding, the mean distinct-2 of the target's own greedy text on these prompts (lossless
    SD's text; the autoregressive run's, the same text, where lossless SD did not run): the repetition
    axis's yardstick, so that greedy decoding's own loops do not put a rule outside the band. None
    when sampled (the band's repetition axis then reads the target's samples)."""
    if not is_greedy(result):
        return None
    own = result.runs.get(BASELINE) or result.ar
    return _mean([own[i].distinct2 for i in indices if own[i] is not None])


def band_checks(stats: dict, reference: dict, distinct2_floor_from: float | None = None) -> dict[str, bool] | None:
    """The band's axes for a run: target NLL at or below the reference's, off-nucleus rate at
    most MAX_OFF_NUCLEUS, distinct-2 at least MIN_DISTINCT2_SHARE of the reference's (repetition), or
    of `distinct2_floor_from` where given (greedy runs: the target's own greedy text on the same
    prompts, own_greedy_distinct2), and, where the run's answers were measured against the samples'
    (ending_counts), length; None where the numbers are missing."""
    if stats.get("target_nll") is None or reference.get("target_nll") is None:
        return None
    checks = {"nll": stats["target_nll"] <= reference["target_nll"],
              "off_nucleus": (stats.get("off_nucleus_rate") or 0.0) <= MAX_OFF_NUCLEUS}
    floor_from = reference.get("distinct2") if distinct2_floor_from is None else distinct2_floor_from
    if floor_from is not None and stats.get("distinct2") is not None:
        checks["repetition"] = stats["distinct2"] >= MIN_DISTINCT2_SHARE * floor_from
    if stats.get("length_outside") is not None:  # no answer shorter than the samples' or ended by the rule
        checks["length"] = stats["length_outside"] == 0
    return checks


def within_reference(stats: dict, reference: dict, distinct2_floor_from: float | None = None) -> bool | None:
    """Does a run stay within the target's own variation: every axis of band_checks holds."""
    checks = band_checks(stats, reference, distinct2_floor_from)
    return None if checks is None else all(checks.values())


def frontier_points(summary: dict, runs: list[Variant]) -> list[dict]:
    """One point per frontier run (a run with a knob) of a benchmark summary, against its lossless run."""
    lossless = summary["rules"].get(BASELINE)
    points = []
    for run in runs:
        stats = summary["rules"].get(run.label)
        if run.knob is None or stats is None:
            continue
        tau_gain = _div(stats["tau"], lossless["tau"]) - 1 if lossless and _div(stats["tau"], lossless["tau"]) else None
        points.append({"label": run.label, "rule": run.rule.rule, "centroid": run.rule.centroid, "knob": run.knob,
                       "value": run.value, "p": stats.get("p"), "tau": stats["tau"], "tau_gain": tau_gain,
                       "speed_vs_lossless": stats.get("speedup_vs_lossless"), "target_nll": stats["target_nll"],
                       "off_nucleus_rate": stats["off_nucleus_rate"], "distinct2": stats.get("distinct2"),
                       "accuracy": stats["accuracy"], "within_reference": stats.get("within_reference"),
                       "band": stats.get("band"), **{key: stats.get(key) for key in DELTA_KEYS}})
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
                               reference=[result.reference[i] for i in chosen] if result.reference else [],
                               peers=_peer_rows(result, chosen))
        out[category] = summarize_benchmark(part)
    return out


def _peer_rows(result: BenchmarkResult, chosen: list[int]) -> dict[str, list[dict]]:
    """The peers' rows of the prompts `chosen` (peers that ran on every prompt: one row per prompt)."""
    return {name: [rows[i] for i in chosen] for name, rows in result.peers.items() if len(rows) == len(result.items)}


def format_table(name: str, numbers: dict) -> str:
    rows = [row[:-1] for row in [tables.HEADER, *tables.summary_rows(numbers, dash="-", peer=False)]]  # no overlap
    skipped = f", {len(numbers['skipped'])} skipped: too long" if numbers.get("skipped") else ""
    lines = [f"== {numbers.get('label', name)} ({numbers['kind']}, {numbers['prompts']} prompts{skipped}; "
             f"each rule's own text; {tables.vs_ar_caption(numbers)})", *_aligned(rows)]
    lines += [f"peer: {peer['name']} {tables.number(peer['tokens_per_s'], 1, '-')} tok/s; ours/peer = "
              f"{tables.number(peer['ours_over_peer'], dash='-')}" for peer in numbers.get("peers", {}).values()]
    if by_kind := tables.category_rows(numbers, dash="-"):
        lines += ["by category:", *_aligned([tables.CATEGORY_HEADER, *by_kind])]
    return "\n".join(lines)


def format_same_drafts(document: dict) -> str:
    """The comparison on the same drafts as text tables, one per draft policy."""
    lines = []
    for policy in document.get("same_drafts", {}):
        rows = tables.same_drafts_rows(document, policy, dash="-")
        lines += [f"== {tables.same_drafts_caption(document, policy)}", *_aligned([tables.SAME_DRAFTS_HEADER, *rows])]
    return "\n".join(lines)


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Text lines of a table, each column padded to its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]


def pooled_over_benchmarks(results: list[BenchmarkResult]) -> dict:
    """Every prompt of every benchmark together: the engine issue's per-rule fields."""
    merged = BenchmarkResult("all", "mixed", runs={label: [] for label in results[0].runs})
    for result in results:
        for name in ("items", "ar", "identical", "reference"):  # per prompt, in the sets' order
            getattr(merged, name).extend(getattr(result, name))
        merged.divergences += [f"{result.name} {line}" for line in result.divergences]
        for label in merged.runs:
            merged.runs[label] += result.runs[label]
    for name in results[0].peers:  # a peer that ran on every prompt of every set
        if all(len(result.peers.get(name, [])) == len(result.items) for result in results):
            merged.peers[name] = [row for result in results for row in result.peers[name]]
    return summarize_benchmark(merged)


def per_prompt(result: BenchmarkResult) -> list[dict]:
    rows = []
    peers = _peer_rows(result, range(len(result.items)))
    for i, item in enumerate(result.items):
        row = {"prompt": item.prompt, "autoregressive": result.ar[i].trace.text}
        if category_of(item):
            row["category"] = category_of(item)
        for label, generations in result.runs.items():
            g = generations[i]
            if g is not None:
                row[label] = {"text": g.trace.text, "correct": g.correct, "target_nll": g.target_nll,
                              "off_nucleus_rate": g.off_nucleus_rate, "distinct2": g.distinct2, "p": g.trace.p,
                              # per prompt, so a set's tau and speed ratios can carry intervals over prompts
                              "emitted": sum(len(r.emitted) for r in g.trace.rounds), "rounds": len(g.trace.rounds),
                              "wall_s": g.trace.t_total}
        if result.identical:
            row["lossless_identical_to_target_greedy"] = result.identical[i]
        # the loop's and the peers' own clocks, so ratios against generate() carry intervals over prompts too
        row["autoregressive_timing"] = {"emitted": len(result.ar[i].trace.output_ids), "wall_s": result.ar[i].trace.t_total}
        row["peers"] = {name: {"tokens": rows[i]["tokens"], "seconds": rows[i]["seconds"]} for name, rows in peers.items()}
        rows.append(row)
    return rows
