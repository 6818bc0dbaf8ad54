"""The same-drafts comparison (DESIGN.md §1, "on the same drafts"): lossless SD runs once per prompt with
its states kept, and every rule defined under the run's mode re-judges those drafts with the rule lab's
code (lab.prepare, lab.rejudge: the one verify step the engine calls; lab.rules_for says which rules, the
judge rules where the pair has a trained judge). Every rule reads the same drafts and the same clean
target, so the figures isolate the rule; a trajectory run's tau measures the rule and the text it led to.

Per rule and prompt set: the tau it would reach on those drafts (its accepted prefix + 1 per round), the
share of drafted tokens it accepts beyond the exact test (accepted where the lossless test rejected), and
what it accepted as the target sees it (the clean target's probability and rank of each such token).

Pooled as the benchmark's other figures, with paired bootstrap intervals over prompts (intervals.py), at every
draft policy of one command (policies): the Studio's, a long fixed draft (--same-drafts-gamma, so that a rule
with a window has room) and, where the pair has an EAGLE-3 head, the head's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .. import lab
from ..decoding.acceptance import BASELINE, METHOD, RULES
from ..decoding.config import ConfigError, DecodeConfig, RuleConfig
from ..decoding.eagle3 import SOURCE as EAGLE3  # the third policy's key and draft source, where the pair has a head
from ..decoding.engine import run_to_end
from ..intervals import LEVEL, RESAMPLES, gain, ratio, resample_picks, standing
from ..decoding.sampling import signal_probs
from .prompts import PromptSet

LONG_GAMMA = 15  # FLy's authors' spd_k
POOLING = "ratio of sums over the prompts of a set"
INTERVAL = f"{LEVEL:.0%} percentile bootstrap over prompts, {RESAMPLES} resamples, seeded with --seed"


@dataclass(frozen=True)
class Policy:
    """A draft policy of the comparison: its JSON key, its decode settings, and how reports name it."""
    key: str
    decode: DecodeConfig
    shown: str


def policies(decode: DecodeConfig, long_gamma: int = LONG_GAMMA, head: bool = False) -> list[Policy]:
    """The Studio's draft policy (the command's own gamma and draft source), a long fixed draft from the
    draft model (ConfigError where long_gamma is out of range), and where the pair has an EAGLE-3 head (and
    the Studio's policy drafts otherwise) the head's chain at the Studio's gamma."""
    gamma = "auto" if decode.gamma_auto else decode.gamma
    long = replace(decode, gamma=long_gamma, gamma_auto=False, draft_source="model")
    chosen = [Policy("studio", decode, f"the Studio's policy: gamma {gamma}, {decode.draft_source} drafts"),
              Policy("long", long, f"a long fixed draft: gamma {long_gamma}, draft-model drafts")]
    if head and decode.draft_source != EAGLE3:
        chosen.append(Policy(EAGLE3, replace(decode, draft_source=EAGLE3), f"EAGLE-3 drafts: gamma {gamma}, the head's chain"))
    return chosen


@dataclass
class Judged:
    """One rule on one prompt's drafts, summed over the rounds; per lossy-accepted token (accepted by the
    rule where the lossless test rejected it), in draft order, the clean target's probability and rank."""
    rounds: int
    drafted: int
    accepted: int
    probs: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)

    @property
    def beyond(self) -> int:
        return len(self.probs)


def target_view(rnd) -> tuple[list[float], list[int]]:
    """(probabilities, ranks) of a prepared round's drafted tokens under the clean target: the probability
    at the run's temperature as the rules read it (softmax(logits / T), T = 1 under greedy), the rank in
    the target's distribution (1 = its top token; tied logits share the best rank). rnd: lab.prepare's
    VerifyInputs (clean_logits [g + 1, V], draft_tokens [g])."""
    logits = rnd.clean_logits[: rnd.num_drafted].float()
    index = rnd.draft_tokens.unsqueeze(-1)
    ranks = (logits > logits.gather(-1, index)).sum(-1) + 1
    probs = signal_probs(logits, rnd.temperature).gather(-1, index).squeeze(-1)
    return probs.tolist(), ranks.tolist()


def judged_by_rule(prepared: list, matrix: dict) -> dict[str, Judged]:
    """{rule: Judged} from the lab's matrix (lab.rejudge) over the prepared rounds it judged."""
    views = [target_view(rnd) for rnd in prepared]
    exact = [rnd.exact.tolist() for rnd in prepared]
    out = {}
    for j, rule in enumerate(matrix["rules"]):
        accepted = [(row["round"], row["slot"]) for row in matrix["rows"] if row["cells"][j]["accepted"]]
        beyond = [(r, i) for r, i in accepted if not exact[r][i]]
        out[rule["name"]] = Judged(len(prepared), len(matrix["rows"]), len(accepted),
                                   [views[r][0][i] for r, i in beyond], [views[r][1][i] for r, i in beyond])
    return out


def rule_settings(trace, template: RuleConfig) -> RuleConfig:
    """The knobs the rules re-judge with: the command's (the lossless run carries them), its p where it is a
    number, else the rule lab's p (p = auto calibrates per lossy run; the lab needs a number)."""
    return lab.lab_settings(trace) if template.p is None else lab.lab_settings(trace, p=template.p)


def judge_prompt(engine, ids: list[int], decode: DecodeConfig, template: RuleConfig) -> tuple[dict[str, Judged], int,
                                                                                                 dict | None]:
    """Lossless SD once on a prompt (its states kept), its drafts re-judged under every rule the lab allows:
    ({rule: Judged}, the run's own emitted tokens over its rounds (its tau's numerator), the knobs used);
    ({}, 0, None) where the run made no round (its first token ended it)."""
    trace = run_to_end(engine.speculative(ids, decode, replace(template, rule=BASELINE), keep_states=True))
    if not trace.rounds:
        return {}, 0, None
    prepared = lab.prepare(trace, engine.target, engine.draft)
    matrix = lab.rejudge(prepared, engine.target, rule_settings(trace, template), engine.services.token_text,
                         judge=engine.services.judge)
    return judged_by_rule(prepared, matrix), sum(len(r.emitted) for r in trace.rounds), matrix["settings"]


# ---------------------------------------------------------------- pooling with intervals


def pool(prompts: list[dict[str, Judged]], emitted: list[int], seed: int) -> dict[str, dict]:
    """{rule: figures with intervals} of one prompt set. prompts: per prompt, {rule: Judged} (a prompt whose
    run made no round has none, and counts nothing); emitted: per prompt, lossless SD's own emitted tokens."""
    picks = resample_picks(len(emitted), seed, RESAMPLES)
    judged = {rule: [by_rule.get(rule, Judged(0, 0, 0)) for by_rule in prompts]
              for rule in dict.fromkeys(rule for by_rule in prompts for rule in by_rule)}
    taus = {rule: ratio(_sum(rows, "accepted") + _sum(rows, "rounds"), _sum(rows, "rounds"), picks)
            for rule, rows in judged.items()}
    out = {}
    for rule, rows in judged.items():
        ranks = [rank for row in rows for rank in row.ranks]
        figures = {"label": RULES[rule].label, "lossy": RULES[rule].lossy, "prompts": len(rows),
                   "rounds": int(_sum(rows, "rounds").sum()), "drafted": int(_sum(rows, "drafted").sum()),
                   "accepted": int(_sum(rows, "accepted").sum()), "beyond_exact_tokens": len(ranks),
                   "tau": taus[rule].shown(),
                   "beyond_exact": ratio(_sum(rows, "beyond"), _sum(rows, "drafted"), picks).shown(),
                   "target_prob": ratio(np.array([sum(row.probs) for row in rows]), _sum(rows, "beyond"), picks).shown(),
                   "rank_median": float(np.median(ranks)) if ranks else None,
                   "top2_share": sum(rank <= 2 for rank in ranks) / len(ranks) if ranks else None,
                   "per_prompt": [vars(row) for row in rows]}
        for key, other in (("gain", BASELINE), ("against_method", METHOD)):
            shown = gain(taus[rule], taus[other]).shown() if other in taus else None
            figures[key] = None if shown is None else {**shown, "standing": standing(shown)}
        if rule == BASELINE:
            figures["run_tau"] = ratio(np.array(emitted, float), _sum(rows, "rounds"), picks).value
        out[rule] = figures
    return out


def _sum(rows: list[Judged], name: str) -> np.ndarray:
    """One number per prompt [n]: the field `name` of each prompt's Judged."""
    return np.array([getattr(row, name) for row in rows], dtype=float)


# ---------------------------------------------------------------- the run


def run_same_drafts(engine, sets: list[PromptSet], decode: DecodeConfig, template: RuleConfig, long_gamma: int,
                    progress=lambda: None) -> tuple[dict, dict, bool]:
    """The comparison over every prompt set at every draft policy: (same_drafts {policy: {set: {rule:
    figures}}}, what ran {policies, sets with their labels, knobs, pooling, interval}, interrupted).
    A prompt runs at every policy or at none (one that does not fit the long draft is skipped at
    all); Ctrl-C keeps the prompts that finished."""
    chosen = policies(decode, long_gamma, head=getattr(engine.pair, "head", None) is not None)
    # per policy and set, what each prompt gave: ({rule: Judged}, lossless SD's own emitted tokens)
    runs = {policy.key: {prompt_set.name: [] for prompt_set in sets} for policy in chosen}
    skipped: dict[str, list[str]] = {}
    settings, interrupted = None, False
    try:
        for prompt_set in sets:
            skipped[prompt_set.name] = []
            for item in prompt_set.items:
                settings = _run_prompt(engine, engine.encode(item.prompt), prompt_set.name, chosen, template, runs,
                                       skipped[prompt_set.name]) or settings
                progress()
    except KeyboardInterrupt:
        interrupted = True
    ran = {name: len(run) for name, run in runs[chosen[0].key].items()}
    info = {"policies": {policy.key: policy.shown for policy in chosen}, "mode": "greedy" if decode.greedy else "sampling",
            "settings": settings, "pooling": POOLING, "interval": INTERVAL,
            "sets": {s.name: {"label": s.label(ran[s.name]), "ran": ran[s.name], "of": s.total, "skipped": skipped[s.name]}
                     for s in sets if s.name in skipped}}
    document = {key: {name: pool([by_rule for by_rule, _ in run], [emitted for _, emitted in run], decode.seed)
                      for name, run in by_set.items() if run} for key, by_set in runs.items()}
    return document, info, interrupted


def _run_prompt(engine, ids: list[int], name: str, chosen: list[Policy], template: RuleConfig, runs: dict,
                skipped: list[str]) -> dict | None:
    """One prompt at every policy, into runs[policy][name] (all or none): the knobs the rules read, or
    None where the prompt does not fit a policy's draft (the reason appended to `skipped`)."""
    try:
        for policy in chosen:
            engine.check_fits(ids, policy.decode)
    except ConfigError as error:
        skipped.append(str(error))
        return None
    results = {policy.key: judge_prompt(engine, ids, policy.decode, template) for policy in chosen}
    for key, (by_rule, emitted, _) in results.items():
        runs[key][name].append((by_rule, emitted))
    return next(iter(results.values()))[2]
