"""Running a benchmark: the variants (rules, sweeps, the frontier), each prompt through the
autoregressive target, every variant, the reference samples and the peers, prompt by prompt, so
that machine noise hits all alike."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

from .. import metrics, quality
from ..decoding.acceptance import BASELINE, KNOBS, METHOD, RULES
from ..compare import generate_alone, generate_ensemble, peer_weight
from ..decoding.config import ConfigError, DecodeConfig, RuleConfig
from ..decoding.engine import run_to_end
from ..models import assisted_generate, first_divergence, greedy_reference, prompt_lookup_generate, sequence_nll
from .prompts import Item, score
from .tables import GENERATE


REFERENCE_TEMPERATURE, REFERENCE_TOP_P = 0.7, 0.95  # the target's own samples: the reference band
JUDGE_QUANTILES = (0.05, 0.25, 0.5, 0.75)  # of the judge's validation thresholds, beside its chosen one


@dataclass(frozen=True)
class Variant:
    """One speculative run per prompt: its label, its settings, and the knob it sets (frontier points)."""
    label: str
    rule: RuleConfig
    knob: str | None = None
    value: float | None = None


def variants(rules: list[str], template: RuleConfig, sweep: list[float], frontier: bool = False,
             auto_sweep: tuple[float, ...] = (), mode: str = "greedy", swept: tuple[str, ...] | None = None) -> list[Variant]:
    """Every speculative run per prompt: the named rules, the p sweep, p = auto at each agreement of the auto sweep,
    then the frontier's points (of the rules under `mode`, "greedy" or "sampling"; only the `swept` ones, if given)."""
    runs = [Variant(rule, replace(template, rule=rule)) for rule in rules]
    runs += [Variant(f"{METHOD}@p={p:g}", replace(template, rule=METHOD, p=p), "p", p) for p in sweep]
    runs += [Variant(f"{METHOD}@auto_agreement={a:g}", replace(template, rule=METHOD, p=None, auto_agreement=a),
                     "auto_agreement", a) for a in auto_sweep]
    if frontier:
        runs += [run for run in frontier_variants(template, mode) if swept is None or run.rule.rule in swept]
    labels = [run.label for run in runs]
    return [run for i, run in enumerate(runs) if run.label not in labels[:i]]  # one run per label


def frontier_variants(template: RuleConfig, mode: str = "greedy") -> list[Variant]:
    """Each lossy rule defined under `mode` over its swept knob's values (acceptance.Knob.sweep), crossed with
    every choice of the knobs it names in frontier_also (DropMatch: both centroids)."""
    runs = []
    for name, rule in RULES.items():
        if not rule.lossy or rule.knob is None or mode not in rule.modes:
            continue
        for extra in _crossed(template, rule.frontier_also):
            prefix = "/".join([name, *(str(value) for key, value in extra.items() if value != template.knobs[key])])
            for value in KNOBS[rule.knob].sweep:
                config = replace(template, rule=name, **extra, **{rule.knob: value})
                runs.append(Variant(f"{prefix}@{rule.knob}={value:g}", config, rule.knob, value))
    return runs


def _crossed(template: RuleConfig, names: tuple[str, ...]) -> list[dict]:
    """Every combination of the choices of the knobs `names` (the template's own value first)."""
    combos = [{}]
    for name in names:
        choices = sorted(KNOBS[name].choices, key=lambda choice: choice != template.knobs[name])
        combos = [{**combo, name: choice} for combo in combos for choice in choices]
    return combos


def judge_knob_values(judge) -> tuple[float, ...]:
    """The judge threshold's frontier values for a trained judge: its validation-chosen threshold and
    its validation quantiles at JUDGE_QUANTILES. Its scores sit in a narrow band (the shipped judge's
    in 0.79-0.82), so fixed values would accept all or nothing."""
    ordered = sorted(judge.thresholds)
    picked = {ordered[round(q * (len(ordered) - 1))] for q in JUDGE_QUANTILES} if ordered else set()
    return tuple(sorted(picked | {judge.threshold}))


def with_judge_knob(runs: list[Variant], judge) -> list[Variant]:
    """runs with each judge-threshold frontier sweep at the judge's own values (judge_knob_values)."""
    def judged(run: Variant) -> bool:  # a sweep of the knob the judge rules read of the judge
        return run.knob is not None and RULES[run.rule.rule].uses_judge and run.knob == RULES[run.rule.rule].knob
    kept = [run for run in runs if not judged(run)]
    sweeps = {run.label.split("@")[0]: run for run in runs if judged(run)}
    return kept + [Variant(f"{prefix}@{run.knob}={value:.4f}", replace(run.rule, **{run.knob: value}), run.knob, value)
                   for prefix, run in sweeps.items() for value in judge_knob_values(judge)]


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
    divergences: list[str] = field(default_factory=list)  # where lossless departed from generate(), and why
    peers: dict[str, list[dict]] = field(default_factory=dict)  # peer name -> one row per prompt
    reference: list[list[Generation]] = field(default_factory=list)  # per prompt, the target's own samples
    skipped: list[str] = field(default_factory=list)  # why prompts that do not fit were left out
    interrupted: bool = False


def generation(kind, item, trace, lossless=None) -> Generation:
    return Generation(
        trace=trace,
        target_nll=metrics.target_nll(trace),
        off_nucleus_rate=metrics.off_nucleus_rate(trace),
        distinct2=quality.distinct2(trace.output_ids),
        correct=score(kind, item, trace.text),
        overlap_with_lossless=None if lossless is None else quality.token_overlap(trace.output_ids, lossless.output_ids),
    )


def run_benchmark(engine, name, kind, items, runs, decode, check_identity, peer, sweep_limit, progress,
                  reference_samples: int) -> BenchmarkResult:
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
               reference_samples) -> None:
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
        for name, (_, generate, ours) in (active_peers(decode, runs) if peer else {}).items():
            tokens, seconds = generate(engine, ids, decode)
            peer_rows[name] = {"tokens": len(tokens), "seconds": seconds, "ours": ours,
                               "identical_to_lossless": BASELINE in traces and list(traces[BASELINE].output_ids) == tokens,
                               **_peer_quality(engine, ids, tokens, decode)}
        identical = None
        if check_identity and BASELINE in traces:
            reference = greedy_reference(engine.target, ids, decode.max_new_tokens, engine.stop_ids)
            identical = list(traces[BASELINE].output_ids) == reference
            if not identical:
                found = first_divergence(engine.target, ids, reference, list(traces[BASELINE].output_ids))
                why = found.describe(engine.services.token_text) if found else "one output is a prefix of the other"
                result.divergences.append(f"prompt {len(result.items)}: {why}")
        lossless = traces.get(BASELINE)
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


def _assisted(engine, ids, decode: DecodeConfig):
    return assisted_generate(engine.target, engine.draft, ids, decode.max_new_tokens,
                             None if decode.gamma_auto else decode.gamma, engine.stop_ids)


def _prompt_lookup(engine, ids, decode: DecodeConfig):
    return prompt_lookup_generate(engine.target, ids, decode.max_new_tokens, engine.stop_ids)


def _peer_quality(engine, ids, tokens: list[int], decode: DecodeConfig) -> dict:
    """The peer's text as the target sees it (under greedy its tokens are compared with lossless SD's instead)."""
    if decode.greedy or not tokens:
        return {}
    return {"target_nll": sequence_nll(engine.target, ids, tokens)}


# The peers --peer times on the same prompts, in the same process, right after our runs of each prompt:
# key -> (the name reports show, the timed run). Greedy: held against lossless SD. GENERATE, the target alone
# as a user runs it, runs greedy or sampled as the run: every "vs AR" figure's denominator (summary.py).
PEERS = {"assisted": ("transformers assisted generation", _assisted),
         "prompt_lookup": ("transformers prompt-lookup decoding", _prompt_lookup)}
ENSEMBLE_PEER = "ensemble_assisted"
PEER_NAMES = {GENERATE: "transformers generate() (the target alone)",
              **{key: shown for key, (shown, _) in PEERS.items()},
              ENSEMBLE_PEER: "transformers assisted generation, static ensemble (assistant_ensemble_weight)"}


def active_peers(decode: DecodeConfig, runs) -> dict:
    """key -> (shown name, timed run(engine, ids, decode), the label of our run it is held against).
    Always transformers' plain generate() (greedy or sampled as the run), against lossless SD. Greedy:
    transformers' assisted generation and prompt lookup, against lossless SD. Sampling: transformers' static
    ensemble at the weight of our first `ensemble` run, against that run (none without one)."""
    alone = {GENERATE: (PEER_NAMES[GENERATE], generate_alone, BASELINE)}
    if decode.greedy:
        return {**alone, **{key: (shown, generate, BASELINE) for key, (shown, generate) in PEERS.items()}}
    ensemble = next((run for run in runs if RULES[run.rule.rule].peer == ENSEMBLE_PEER and run.knob is None), None)
    if ensemble is None:
        return alone
    return {**alone, ENSEMBLE_PEER: (PEER_NAMES[ENSEMBLE_PEER],
                                     partial(generate_ensemble, weight=peer_weight(ensemble.rule)), ensemble.label)}


def warm_up(engine, decode: DecodeConfig, runs, peer: bool = False) -> None:
    """One short run of each kind first (each peer's too, with `peer`), so that no run's one-time costs are
    timed: every timed run of a prompt, ours and the peers', starts warm."""
    ids = engine.encode("Hello!")
    short = replace(decode, max_new_tokens=min(8, decode.max_new_tokens))
    run_to_end(engine.autoregressive(ids, short))
    for run in runs:
        run_to_end(engine.speculative(ids, short, run.rule))
    for _, generate, _ in (active_peers(decode, runs) if peer else {}).values():
        generate(engine, ids, short)
