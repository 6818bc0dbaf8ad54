"""Each rule's and reason's words and colours, keyed by name: a rule is one declaration of its decision in
acceptance.py and one of its words here, which render, plots, the lab, lessons and the UI read (never the decision)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .decoding.acceptance import (BASELINE, FLY_GATE_OFF, LOSSY_END, RULES, RuleKnobs, Signals, ensemble_odds,
                                  typical_floor, votes_needed)


@dataclass(frozen=True)
class ReasonWords:
    """How a reason shows: its legend label, its tooltip's first line (meaning), a chart's marker colour, its
    tokens' highlight (light, dark theme) and a second cue (CSS text-decoration). Its sentences, which
    render.explain fills from a token's numbers, every knob's value by name and RuleWords.numbers: says (a token
    it accepted; {earlier}: the checks before it that failed), fails (a rejected token's clause), before (the
    clause {earlier} gets). reads: the DraftedToken field its sentences need."""

    legend: str
    meaning: str
    colour: str
    background: str
    dark_background: str
    cue: str
    says: str = ""
    fails: str = ""
    before: str = ""
    reads: str = ""


@dataclass(frozen=True)
class RuleWords:
    """How a rule shows: its charts' colour, its column's title (default: its label), the rule lab's line
    (signals, knobs, position) -> text, numbers (token, knobs) -> what its sentences read beyond the token's and
    the knobs', port (what differs from its authors' code), lookup_note (why Rule.judges_lookup is False),
    rival: shown beside DropMatch in the short comparisons (the field)."""

    colour: str
    title: str = ""
    lab_line: Callable[[Signals, RuleKnobs, int], str] | None = None
    numbers: Callable[[Any, RuleKnobs], dict] | None = None
    port: str = ""
    lookup_note: str = ""
    rival: bool = False


def column_title(rule: str) -> str:
    """A rule's column title: its words' title, else its label."""
    return RULE_WORDS[rule].title or RULES[rule].label


def _mars_line(s: Signals, cfg: RuleKnobs, i: int) -> str:
    rank = {int(s.target_tokens[i]): "top-1", int(s.target_runner_up[i]): "top-2"}.get(int(s.draft_tokens[i]), "not top-2")
    return f"MARS: {rank}; z2/z1 {float(s.target_logit_ratio[i]):.3f} vs {cfg.mars_threshold:g}"


def _fly_line(s: Signals, cfg: RuleKnobs, i: int) -> str:
    later = s.exact[i + 1 : i + cfg.fly_window].tolist()
    return (f"FLy: top-3 entropy {float(s.target_top3_entropy[i]):.3f} vs {cfg.fly_entropy_threshold:g}; "
            f"the next {cfg.fly_window - 1} drafts exact: {sum(later)}/{cfg.fly_window - 1}")


def _ensemble_line(s: Signals, cfg: RuleKnobs, i: int) -> str:
    if s.coin is None:
        return f"ensemble (w {cfg.ensemble_weight:g}): argmax of w p + (1 − w) q is token {int(s.rule_top[i])}"
    odds = ensemble_odds(float(s.sample_target_prob[i]), float(s.sample_draft_prob[i]), cfg.ensemble_weight)
    return f"ensemble (w {cfg.ensemble_weight:g}): coin {float(s.coin[i]):.3f} vs odds {odds:.3f}"


def judge_line(s: Signals, cfg: RuleKnobs, i: int) -> str:
    return f"judge: P(changes the answer) {float(s.judge_scores[i]):.3f} vs threshold {cfg.judge_threshold:.3f}"


def _typical_line(s: Signals, cfg: RuleKnobs, i: int) -> str:
    return f"typical: p(x) {float(s.target_prob[i]):.3f} vs floor {float(typical_floor(s.target_entropy[i], cfg)):.3f}"


def _fixed_js_line(s: Signals, cfg: RuleKnobs, i: int) -> str:
    return f"JS(draft, target) {float(s.js_draft_target[i]):.3f} vs T {cfg.fixed_js_threshold:g}"


def _path_numbers(d, cfg: RuleKnobs) -> dict:
    k = len(d.path_tokens)
    return {"needed": votes_needed(k, cfg.majority_fraction) if k else None}


def _judge_numbers(d, cfg: RuleKnobs) -> dict:
    at = "the judge's" if cfg.judge_threshold is None else f"{cfg.judge_threshold:.3f}"
    return {**_path_numbers(d, cfg), "judge_at": at}


def _fly_numbers(d, cfg: RuleKnobs) -> dict:
    """The gate's clause as it ran: off at thresholds <= FLY_GATE_OFF, else the entropy against the threshold."""
    entropy, threshold = d.target_top3_entropy, cfg.fly_entropy_threshold
    if threshold <= FLY_GATE_OFF:
        gate = f"its entropy gate is off (threshold {threshold:g} ≤ {FLY_GATE_OFF:g}, as in AMD's code)"
        gate_fails = f"({gate}) "
    else:
        shown = "unknown" if entropy is None else f"{entropy:.3f}"
        gate = f"the target is unsure here (top-3 entropy {shown} ≥ {threshold:g})"
        gate_fails = f"where the target is unsure (top-3 entropy {shown}, threshold {threshold:g}) and "
    return {"fly_entropy": entropy, "fly_later": cfg.fly_window - 1, "fly_gate": gate, "fly_gate_fails": gate_fails}


def _ensemble_numbers(d, cfg: RuleKnobs) -> dict:
    """Greedy: the test against argmax v. Sampling: the odds from the probabilities the decision read, the
    sampled (temperature, top-p) p(x) and q(x)."""
    w = f"{cfg.ensemble_weight:g}"
    v = f"v = {w} p + (1 − {w}) q"
    if d.coin is None:
        return {"ensemble_says": f"{{tok}} is the top token of {v} (DIVERSED's static ensemble, as transformers "
                                 "verifies greedy drafts), so it is accepted.",
                "ensemble_fails": f"it is not the top token of {v}"}
    p_x = d.target_prob if d.sample_target_prob is None else d.sample_target_prob
    q_x = d.draft_prob if d.sample_draft_prob is None else d.sample_draft_prob
    odds = ensemble_odds(p_x, q_x, cfg.ensemble_weight)
    return {"ensemble_says": f"The lossless coin rejected {{tok}}, but the static ensemble verifies against {v}: its "
                             f"odds min(1, 1 − w + w p / q) = {odds:.2f}, and the same coin passes them.",
            "ensemble_fails": f"against {v} its odds {odds:.2f} did not pass the coin either"}


MARS_RESIDUAL = ("where z2 / z1 is at most the threshold, a sampled rejection draws from lossless SD's residual "
                 "norm(max(0, p − q)) over the draft's tempered, top-p'd q; the authors' code lowers p at the "
                 "rejected token only, to max(0, p(x) − q(x))")


def _mars_numbers(d, cfg: RuleKnobs) -> dict:
    ratio = d.target_logit_ratio
    if ratio is None:
        says = ""
    elif ratio <= cfg.mars_threshold:
        says = f"MARS relaxes only where z2 / z1 > {cfg.mars_threshold:g} (here {ratio:.3f})"
        if d.coin is not None:
            says += f" (our port: {MARS_RESIDUAL})"
    elif d.target_runner_up == -1:
        says = "top-p left only the target's top token here, so MARS accepts that one alone"
    else:
        says = f"MARS accepts only the target's top two tokens where z2 / z1 > {cfg.mars_threshold:g} (here {ratio:.3f})"
    return {"mars_ratio": ratio, "mars_says": says}


REASON_WORDS: dict[str, ReasonWords] = {
    "exact": ReasonWords("exact", "accepted: target's own choice", "#2e7d32", "#c8e6c9", "#1b5e20", "none"),
    "js": ReasonWords("JS", "accepted by JS", "#1565c0", "#bbdefb", "#0d47a1", "underline solid",
        says="{tok} is not the target's choice {target}, but the draft's distribution is as close to the paths' "
             "centroid as the paths themselves: JS {js:.4f} ≤ threshold {threshold:.4f}.{js_note}",
        fails="JS {js:.4f} {js_cmp} threshold {threshold:.4f}",
        before="failed the JS test ({js:.4f} > {threshold:.4f}), but ", reads="path_tokens"),
    "majority": ReasonWords("majority", "accepted by majority", "#6a1b9a", "#e1bee7", "#4a148c", "underline double",
        says="{tok} {earlier}{votes} of {k} dropout paths chose it: at least the {needed} the majority "
                         "rule asks, and no other token has as many.",
        fails="{votes} of {k} paths chose it (the majority rule asks {needed})", reads="path_tokens"),
    "naive": ReasonWords("naive", "accepted by naive (a path chose it)", "#ef6c00", "#ffe0b2", "#8a3c00",
        "underline dashed", says="{tok} is one of the K path tokens ({votes} of {k} paths chose it).",
        fails="none of the {k} paths chose it", reads="path_tokens"),
    "typical": ReasonWords("typical", "accepted by typical acceptance", "#8d6e63", "#d7ccc8", "#4e342e",
        "underline dotted", says="{tok} has target probability {p_x:.3f}, above the typical-acceptance floor.",
        fails="its target probability {p_x:.3f} is below the typical-acceptance floor"),
    "fixed_js": ReasonWords("fixed JS", "accepted by fixed-threshold JS", "#00838f", "#b2ebf2", "#005662",
        "underline wavy",
        says="JS(draft ‖ target) = {js_target:.4f} is under the fixed threshold, so {tok} is accepted.{js_note}",
        fails="JS(draft ‖ target) = {js_target:.4f} is above the fixed threshold"),
    "judge": ReasonWords("judge", "accepted by the trained judge (scored unimportant)", "#ad1457", "#f8bbd0",
        "#880e4f", "overline",
        says="{tok} is not the target's choice {target}, but the trained judge scores this mismatch unimportant: "
             "P(it changes the answer) = {judge_score:.3f} < threshold {judge_at}.",
        fails="the judge scores it important (P = {judge_score:.3f} ≥ {judge_at})", reads="judge_score"),
    "fly": ReasonWords("FLy", "accepted by FLy (an unsure target; the next drafts agree)", "#f9a825", "#fff59d", "#6d5200",
        "overline dashed",
        says="{tok} is not the target's choice {target}, but {fly_gate} and the next {fly_later} drafted tokens are "
             "the target's own choices, so FLy lets the mismatch stand.",
        fails="FLy lets a mismatch stand only {fly_gate_fails}where the next {fly_later} drafted tokens of the round "
              "are the target's", reads="target_top3_entropy"),
    "ensemble": ReasonWords("ensemble", "accepted by the static ensemble (DIVERSED)", "#9e9d24", "#f0f4c3", "#4b4b00",
        "overline double", says="{ensemble_says}", fails="{ensemble_fails}"),
    "mars": ReasonWords("MARS", "accepted by MARS (the target's top two logits are close)", "#5d4037", "#ffccbc",
        "#4e2a1e", "underline dashed",
        says="The target's top two logits are close here (z2 / z1 = {mars_ratio:.3f} > {mars_threshold:g}), so "
             "MARS accepts either of its top two tokens without a coin: {tok} is one of them.",
        fails="{mars_says}", reads="target_logit_ratio"),
    # Not a check's: a lossy acceptance the text ends with (trace.with_lossy_end relabels it, whatever check gave it).
    LOSSY_END: ReasonWords("ended by the rule", "accepted only by the rule, and the text ends with it", "#212121", "#b39ddb",
        "#311b92", "underline overline",
        says="{tok} is not what lossless SD would emit here (the target's choice is {target}, p = {p_target:.2f}; "
             "{tok} has p = {p_x:.3f}), but the rule accepted it, and the text ends with it: an end of text the "
             "exact test would not have reached here.",
        fails="the text does not end here"),
    "rejected": ReasonWords("rejected", "rejected", "#c62828", "#ffcdd2", "#8e0000", "line-through"),
    "unchecked": ReasonWords("unchecked", "not checked (after a rejection)", "#bdbdbd", "#eceff1", "#37474f", "none"),
}


RULE_WORDS: dict[str, RuleWords] = {
    BASELINE: RuleWords("#455a64"),
    "naive": RuleWords("#ef6c00"),
    "js": RuleWords("#42a5f5"),
    "majority": RuleWords("#6a1b9a", numbers=_path_numbers),
    "dropmatch": RuleWords("#0d47a1", title="DropMatch", numbers=_path_numbers),
    "typical": RuleWords("#8d6e63", lab_line=_typical_line),
    "fixed_js": RuleWords("#00838f", lab_line=_fixed_js_line),
    "judge": RuleWords("#ad1457", title="trained judge", numbers=_judge_numbers, rival=True),
    "dropmatch_judge": RuleWords("#827717", numbers=_judge_numbers),
    "fly": RuleWords("#2e7d32", title="FLy", lab_line=_fly_line, numbers=_fly_numbers, rival=True,
                     port="sampling: vLLM's random kernel (pull request #53987) with AMD's window count"),
    "ensemble": RuleWords("#c0ca33", title="static ensemble", lab_line=_ensemble_line, numbers=_ensemble_numbers,
                          rival=True, lookup_note="the static ensemble never judges prompt-lookup drafts "
                          "(transformers refuses assistant_ensemble_weight with prompt lookup; against a one-hot q it "
                          "would accept any token the target gives mass): a lookup round gets the exact test"),
    "mars": RuleWords("#c62828", title="MARS", lab_line=_mars_line, numbers=_mars_numbers, rival=True,
                      port="greedy: the authors' code is exact match; the top-2 acceptance under greedy is SecureSD's "
                           f"port. Sampling, our residual: {MARS_RESIDUAL}"),
}


# Each knob's help, by knob name: a control's info, the CLI's --help, generate()'s argument table.
KNOB_HELP: dict[str, str] = {
    "num_paths": "Monte-Carlo dropout paths on the LM head",
    "p": "dropout rate on the LM-head input, or auto (calibrated per prompt)",
    "centroid": "probs: mean of the path distributions (the method's); logits: softmax of the mean logits (an option)",
    "mask_draw": "per_position (every recorded run's) or counter (a server's step in one batched draw; other masks)",
    "auto_agreement": "p = auto: the largest p whose paths keep the clean argmax at this share of the prompt",
    "rescue_argmax": "sampling: the paths also judge a top-token draft the lossless coin rejected (p = 0 then is not "
                     "lossless SD)",
    "majority_fraction": "ceil(f * K) votes, never fewer than a strict majority: 0.8 = 4 of 5 (\"nearly all\")",
    "judge_threshold": "accept a mismatch the judge scores below it, or auto (chosen on its validation split)",
    "typical_eps": "typical acceptance's probability floor: min(ε, δ exp(-H))",
    "typical_delta": "typical acceptance's entropy factor: min(ε, δ exp(-H))",
    "fixed_js_threshold": "accept iff JS(draft ‖ target) ≤ T (Fuzzy SD)",
    "fly_window": "FLy's window, the position itself counted (AMD's win_len; vLLM's fly_window_size is one less): it "
                  "needs at least window + 1 drafts in a round",
    "fly_entropy_threshold": "FLy's gate: the target's top-3 entropy at least this (a lower threshold tolerates more)",
    "ensemble_weight": "the static ensemble's weight on the target: v = w p + (1 - w) q; 1 is lossless SD",
    "mars_threshold": "MARS relaxes where the target's top two logits have z2 / z1 above it (its relaxation_threshold)",
}

# Who drafted a round, by draft source (RoundTrace.draft_source): popovers, Step through and Replay say it.
DRAFTED_BY: dict[str, str] = {
    "model": "the draft model",
    "ngram": "prompt lookup (n-grams of the text so far; one-hot q)",
    "eagle3": "the EAGLE-3 head (the target's own features)",
}


def drafted_by(source: str) -> str:
    """The words for a round's draft source ("model", "ngram", "eagle3")."""
    return DRAFTED_BY.get(source, DRAFTED_BY["model"])
