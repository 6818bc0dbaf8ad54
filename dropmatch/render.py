"""HTML and sentences for the app, built from traces only (pure string functions)."""

from __future__ import annotations

import html
from typing import Callable, Sequence

from .assets import page_file
from .decoding.acceptance import KNOBS, REASONS, RULES, judges_drafts
from .decoding.config import DecodeConfig, RuleConfig
from .decoding.pair_services import BYTE_SHOWN
from .metrics import RunMetrics
from .rule_words import KNOB_HELP, REASON_WORDS, RULE_WORDS, column_title, drafted_by
from .decoding.trace import DraftedToken, RoundTrace

TokenText = Callable[[int], str]

# The kinds of emitted token that are not a drafted token's reason: (meaning, light, dark highlight, cue).
EXTRA_KINDS = {
    "correction": ("correction after a rejection", "#f8bbd0", "#7b1f4a", "overline"),
    "bonus": ("bonus token", "#fff59d", "#5c4b00", "overline dotted"),
    "target": ("target token", "#eceff1", "#37474f", "none"),
    "first": ("first token (prefill)", "#eceff1", "#37474f", "none"),
}
TEXT_ON_LIGHT, TEXT_ON_DARK = "#1a1a1a", "#f5f5f5"  # explicit: a theme's own text colour may not suit a highlight
NOT_IN_TEXT = ("unchecked",)  # reasons no token of a column wears (a rejected draft is shown struck through)


def kind_label(kind: str) -> str:
    if kind in REASONS:
        return REASON_WORDS[kind].meaning
    return EXTRA_KINDS[kind][0] if kind in EXTRA_KINDS else kind


def legend_items() -> list[tuple[str, str]]:
    """(kind, label) of the legend: every accepting reason of the rule table, then the extra tokens."""
    reasons = [(name, REASON_WORDS[name].legend if name != "rejected" else "rejected draft (struck through)")
               for name in REASONS if name not in NOT_IN_TEXT]
    return reasons + [("correction", "correction"), ("bonus", "bonus"), ("first", "prefill")]


def palette() -> dict[str, tuple[str, str, str]]:
    """kind -> (light highlight, dark highlight, text-decoration) for every reason and extra kind."""
    reasons = {name: (REASON_WORDS[name].background, REASON_WORDS[name].dark_background, REASON_WORDS[name].cue)
               for name in REASONS}
    return reasons | {kind: (light, dark, cue) for kind, (_, light, dark, cue) in EXTRA_KINDS.items()}


def css() -> str:
    """The texts' stylesheet (assets/render.css), then per reason of the rule table and per extra kind a
    highlight with an explicit text colour, a second cue (an underline style), and a dark variant under
    Gradio's `.dark` (set from the OS or the Hugging Face theme)."""
    rules = "".join(f".dm-{kind} {{ background: {light}; color: {TEXT_ON_LIGHT}; text-decoration: {cue}; "
                    "text-underline-offset: 3px; }\n"
                    f".dark .dm-{kind} {{ background: {dark}; color: {TEXT_ON_DARK}; }}\n"
                    for kind, (light, dark, cue) in palette().items())
    return page_file("render.css") + rules


def _q(text: str) -> str:
    return "“" + text.replace("\n", "⏎") + "”"


END_TEXT = "⟨end⟩"  # an end of text's place in a column: a new token like any other, so its key counts it


def token_spans(first_token: int | None, rounds: list[RoundTrace], token_text: TokenText,
                stop_ids: frozenset[int] = frozenset(), why: Callable[[DraftedToken, str], str] | None = None,
                rejected: bool = False, texts: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """(text, kind, tooltip) for every emitted token, in order, an end of text (stop_ids) shown as END_TEXT
    with the kind of whatever emitted it. why: a drafted token's sentence (explainer), given its round's draft
    source. rejected: also each round's rejected draft, kind "rejected", just before the correction that
    replaced it. texts: the run's own text of each output token (first, then every emitted one:
    trace.token_texts), where a character split across tokens reads whole; else each token's own text."""
    def drafted_tip(d: DraftedToken, r: RoundTrace, end: str = "") -> str:
        sentence = f"\nwhy: {why(d, r.draft_source)}" if why else ""
        return tooltip(d, token_text, r.index, r.draft_source) + end + sentence

    spans, walk = [], [] if first_token is None else [(None, 0, first_token)]  # (round, slot, token) in output order
    walk += [(r, j, token) for r in rounds for j, token in enumerate(r.emitted)]
    for position, (r, j, token) in enumerate(walk):  # position: the token's in the output (first token 0)
        text = END_TEXT if token in stop_ids else texts[position] if texts else token_text(token)
        end = "\nthe end of text: the answer stops here" if token in stop_ids else ""
        if r is None:
            spans.append((text, "first", "first token, from the prefill call" + end))
        elif j < r.num_accepted:
            spans.append((text, r.drafted[j].reason, drafted_tip(r.drafted[j], r, end)))
        else:
            if rejected and j == r.num_accepted and r.extra_kind == "correction" and j < len(r.drafted):
                spans.append((_struck(token_text(r.drafted[j].token)), "rejected", drafted_tip(r.drafted[j], r)))
            spans.append((text, r.extra_kind, _extra_tooltip(r, token_text) + end))
    return spans


def _struck(text: str) -> str:
    """A rejected draft's text in a column, without the part of a character it holds (U+FFFD, or its bytes shown
    "<0xD8>": laid out among Arabic letters, bidi would split such a label); "◌" where no character is left. Its popover
    shows the bytes."""
    kept = BYTE_SHOWN.sub("", text.replace("\ufffd", ""))
    return kept or "◌" if kept == text or kept.strip() else kept + "◌"


def explainer(token_text: TokenText, decode: DecodeConfig, knobs: RuleConfig) -> Callable[[DraftedToken, str], str]:
    """explain() bound to a run's settings: the sentence each token's popover ends with, given the token's
    round's draft source."""
    return lambda d, source="model": explain(d, token_text, knobs, greedy=decode.temperature == 0, source=source)


def tooltip(d: DraftedToken, token_text: TokenText, round_index: int, source: str = "model") -> str:
    lines = [f"round {round_index}: {kind_label(d.reason)}",
             f"drafted by {drafted_by(source)}; draft prob q = {d.draft_prob:.3f}",
             f"clean target: {_q(token_text(d.target_token))} p = {d.target_token_prob:.3f}"
             f" (this token: p = {d.target_prob:.3f})"]
    if d.path_tokens:
        lines.append("K paths: " + " ".join(_q(token_text(t)) for t in d.path_tokens))
        lines.append(f"JS = {d.js:.4f}, threshold = {d.threshold:.4f}, votes = {d.draft_votes}/{len(d.path_tokens)}")
    if d.judge_score is not None:
        lines.append(f"trained judge: P(changes the answer) = {d.judge_score:.3f}")
    return "\n".join(lines)


def _extra_tooltip(r: RoundTrace, token_text: TokenText) -> str:
    if r.extra_kind == "correction":
        refused = (f" ({_q(token_text(r.drafted[r.num_accepted].token))}, struck through before it)"
                   if r.num_accepted < len(r.drafted) else "")
        return (f"round {r.index}: correction — the clean target's token where draft slot {r.num_accepted + 1}"
                f"{refused} was rejected")
    if r.extra_kind == "bonus":
        return f"round {r.index}: bonus — every drafted token was accepted; the target adds one more"
    return f"step {r.index}: the target's own token"


POPOVER = '<div class="dm-pop" role="tooltip" hidden></div>'


def text_html(spans: list[tuple[str, str, str]], cursor: bool = False) -> str:
    """The emitted text, one focusable span per token; its numbers (data-tip, one line per fact) open in a
    popover on hover, tap or keyboard focus (assets/popover.js), large enough for a projector."""
    parts = [f'<span class="dm-tok dm-{kind}" tabindex="0" data-tip="{html.escape(tip)}" '
             f'aria-label="{html.escape(text + ": " + tip.splitlines()[0])}">{_visible(text)}</span>'
             for text, kind, tip in spans]
    text = f'<div class="dm-text">{"".join(parts)}{"▌" if cursor else ""}</div>'
    kinds = [kind for _, kind, _ in spans]
    shown = [kind for kind in kinds if kind != "rejected"]
    return f'<div class="dm-text-host">{text}{POPOVER}</div>{key_html(shown)}{rejected_toggle(kinds.count("rejected"))}'


def key_html(kinds: list[str]) -> str:
    """The key under a column's text: each colour its tokens wear, named, with how many tokens wear it."""
    if not kinds:
        return ""
    labels = dict(legend_items())
    counts = {kind: kinds.count(kind) for kind in dict.fromkeys(kinds)}
    order = [kind for kind in labels if kind in counts]
    chips = "".join(f'<span class="dm-{kind}">{html.escape(labels[kind])} {counts[kind]}</span>' for kind in order)
    return f'<div class="dm-legend dm-key" aria-label="colour key">{chips}</div>'


def rejected_toggle(count: int) -> str:
    """The switch that hides or shows this column's struck-through rejected drafts (assets/popover.js
    toggles the column's dm-hide-rejected class), with how many it has."""
    if not count:
        return ""
    return (f'<button type="button" class="dm-rejected-toggle"><span class="dm-when-shown">Hide</span>'
            f'<span class="dm-when-hidden">Show</span> the {count} rejected draft{"s" if count > 1 else ""} '
            '(struck through)</button>')


def _visible(text: str) -> str:
    """A token's text as HTML that shows every character: a newline is ↵ and then the line break (an empty
    highlighted bar says nothing), a token of spaces only shows as the spaces it is."""
    return html.escape(text).replace("\n", "↵<br>")


def legend_html() -> str:
    items = "".join(f'<span class="dm-{kind}">{label}</span>' for kind, label in legend_items())
    return f'<div class="dm-legend">{items} &nbsp; (hover, tap or focus a token for its numbers)</div>'


def verdict(lossless: RunMetrics, lossy: RunMetrics, rule_label: str,
            speed_interval: tuple[float, float] | None = None, machine: str = "this machine",
            ar: RunMetrics | None = None) -> str:
    """The comparison in plain sentences: a headline of at most 30 words (target calls per token against
    lossless SD, and whether the text changed), then a paragraph of details, machine-independent facts first
    (counts and tau, the tokens only the rule accepted, the text's change as the target sees it); then the
    wall clock, as one run on `machine`, called faster or slower only beyond the run's own spread
    (speed_interval: metrics.speed_ratio_interval); then the target alone (transformers' generate()) against
    both columns and the engine's own autoregressive run `ar`, where it ran. A run whose answer ended before
    lossless SD's (ended_early) says so first, with both lengths, and is never called a win."""
    early = lossy.stop_reason == "eos" and lossy.new_tokens < lossless.new_tokens  # metrics.ended_early
    text = "its text is lossless SD's, token for token" if lossy.first_divergence is None \
        else f"its text departs from lossless SD's at token {lossy.first_divergence + 1}"
    headline = _early_headline(lossless, lossy, rule_label) if early else \
        f"{_calls_sentence(lossless, lossy, rule_label)}, and {text}."
    sentences = [f"Target calls: {lossy.target_calls} for {lossy.new_tokens} tokens against {lossless.target_calls} "
                 f"for {lossless.new_tokens}; tau {_num(lossy.tau)} against {_num(lossless.tau)}.",
                 f"{lossy.lossy_count} of its {lossy.new_tokens} tokens ({100 * lossy.lossy_share:.0f}%) were accepted "
                 "only by the rule.", _quality_sentence(lossy)]
    if lossless.tokens_per_s and lossy.tokens_per_s:
        sentences.append(_speed_sentence(lossless, lossy, speed_interval, machine))
    if early:
        sentences.append(f"{_calls_sentence(lossless, lossy, rule_label)}; fewer calls per token and more tokens per "
                         "second on a shorter answer are no win.")
    slower = [m.speedup_vs_ar for m in (lossless, lossy)]
    if all(x is not None and x < 1.0 for x in slower):
        sentences.append(f"Both SD columns ran slower than the target alone here ({slower[0]:.2f}x and "
                         f"{slower[1]:.2f}x), as transformers' generate() runs it on the same target: drafting and "
                         "verifying cost more than the tokens the rounds added (short rounds, a small target, or a "
                         "busy machine).")
    elif all(x is not None for x in slower):
        own = f"; the engine's own autoregressive run {ar.speedup_vs_ar:.2f}x" if ar and ar.speedup_vs_ar else ""
        sentences.append(f"Against the target alone (transformers' generate() on the same target): lossless SD "
                         f"{slower[0]:.2f}x, {rule_label} {slower[1]:.2f}x{own}.")
    return headline + "\n\n" + " ".join(sentence for sentence in sentences if sentence)


def cannot_act(trace) -> str:
    """Why a lossy rule acted in few rounds or none, judged over the whole run, with the fix where there is one
    ("" when nothing needs saying): the share of rounds with the drafts its declaration asks (too_few_drafts),
    and, where it accepted nothing beyond the exact test, the mismatches it refused in the rounds it could act in."""
    return " ".join(note for note in (too_few_drafts(trace), _refused_all(trace)) if note)


def _lossy_rule(trace):
    rule = RULES.get(trace.rule) if trace.mode == "sd" else None
    return rule if rule is not None and rule.lossy and trace.rounds else None


def _able(trace, rule) -> list:
    """The run's rounds that drafted what the rule needs to act (acceptance.Rule.min_drafts; else one draft)."""
    needed = rule.min_drafts(trace.rule_config) if rule.min_drafts is not None else 1
    return [r for r in trace.rounds if len(r.drafted) >= needed]


def draft_length_fix(trace) -> int | None:
    """Where under half of the run's rounds could act (acceptance.Rule.min_drafts), its authors' draft length when
    longer than the run's (gamma = auto: any); else None."""
    rule = _lossy_rule(trace)
    if rule is None or rule.min_drafts is None or 2 * len(_able(trace, rule)) >= len(trace.rounds):
        return None
    longer = rule.authors_gamma and (trace.gamma_auto or trace.gamma < rule.authors_gamma)
    return rule.authors_gamma if longer else None


def too_few_drafts(trace) -> str:
    """Under half of the run's rounds drafted what the rule needs to act (acceptance.Rule.min_drafts): how many
    did, with the fix where there is one (draft_length_fix); "" otherwise."""
    rule = _lossy_rule(trace)
    if rule is None or rule.min_drafts is None:
        return ""
    needed, rounds, could = rule.min_drafts(trace.rule_config), len(trace.rounds), len(_able(trace, rule))
    if 2 * could >= rounds:
        return ""
    mean = sum(len(r.drafted) for r in trace.rounds) / rounds
    gamma = draft_length_fix(trace)
    fix = f": use its authors' draft length {gamma}" if gamma else ""
    if not could:
        return (f"{column_title(rule.name)} could not act here: it needs at least {needed} drafts in a round, and none of "
                f"its {rounds} rounds drafted that many ({mean:.1f} on average){fix}.")
    return (f"{column_title(rule.name)} could act in only {could} of its {rounds} rounds ({could / rounds:.0%}): it needs at "
            f"least {needed} drafts in a round, and rounds drafted {mean:.1f} on average{fix}.")


def _refused_all(trace) -> str:
    """A rule that accepted nothing beyond the exact test though some rounds could act and had mismatches: how
    many it refused there, at the value of the knob it is swept by, with that knob's help (its fix)."""
    rule = _lossy_rule(trace)
    if rule is None or any(REASONS[d.reason].lossy for r in trace.rounds for d in r.drafted):
        return ""
    able = _able(trace, rule)
    refused = sum(d.reason == "rejected" for r in able for d in r.drafted)
    if not refused:
        return ""
    knob = KNOBS.get(rule.knob) if rule.knob else None
    value = None if knob is None else trace.rule_config.knobs.get(knob.name)
    at = "" if knob is None else f", at {knob.label} {'auto' if value is None else format(value, 'g')} — {KNOB_HELP[knob.name]}"
    rounds = f"all {len(able)} rounds" if len(able) > 1 else "the one round"
    mismatches = f"all {refused} mismatches" if refused > 1 else "the one mismatch"
    return (f"{column_title(rule.name)} acted in none of its {len(trace.rounds)} rounds: in {rounds} it could act in, it "
            f"refused {mismatches}{at}.")


def _speed_sentence(lossless: RunMetrics, lossy: RunMetrics, interval: tuple[float, float] | None,
                    machine: str = "this machine") -> str:
    """machine: where the run was timed ("this machine", or "recorded on <CPU>, <cores> on <date>")."""
    where = machine if machine.startswith("recorded") else f"on {machine}"
    measured = f"This run {where}: {lossy.tokens_per_s:.1f} against {lossless.tokens_per_s:.1f} tokens/s"
    if interval is None:
        return measured + " (too few rounds to measure their spread, so not called a win or a loss)."
    low, high = interval
    spread = (f"{low:.2f}x-{high:.2f}x, the 95% interval of the ratio, end to end, from resampling blocks of each "
              "column's rounds")
    if low > 1.0 or high < 1.0:
        word = "faster" if low > 1.0 else "slower"
        return f"{measured}: {word}, beyond the spread of its rounds' timings ({spread})."
    return f"{measured}: within the spread of its rounds' timings ({spread}), so not called a win or a loss."


def _early_headline(lossless: RunMetrics, lossy: RunMetrics, rule_label: str) -> str:
    """The headline of a run whose answer the rule ended before lossless SD's: said first, never a win."""
    where = "" if lossy.first_divergence is None else f" at token {lossy.first_divergence + 1}"
    how = (f"{rule_label} accepted the token its text ends with" if lossy.ended_by_rule
           else f"{rule_label}'s text departs from lossless SD's{where} and stops sooner")
    return (f"Ended the answer early ({lossy.new_tokens} tokens against {lossless.new_tokens}): {how}, so its fewer "
            "target calls are no win.")


def _calls_sentence(lossless: RunMetrics, lossy: RunMetrics, rule_label: str) -> str:
    """The headline's first clause: target calls per token against lossless SD's."""
    per_token = [m.target_calls / m.new_tokens if m.new_tokens else 0.0 for m in (lossless, lossy)]
    change = 1.0 - per_token[1] / per_token[0] if per_token[0] else 0.0
    if abs(change) < 0.005:
        return f"{rule_label} needed as many target calls per token as lossless SD"
    return f"{rule_label} needed {abs(change):.0%} {'fewer' if change > 0 else 'more'} target calls per token than lossless SD"


def _quality_sentence(lossy: RunMetrics) -> str:
    """The changed text as the target sees it ("" when the text is lossless SD's or unscored)."""
    nll, off = lossy.delta_target_nll, lossy.delta_off_nucleus_rate
    if lossy.first_divergence is None or nll is None or off is None:
        return ""
    return (f"As the target sees its text: {_num(nll, 3, sign='+')} nats/token and {_num(100 * off, 1, sign='+')} "
            "points off its top-p 0.95 nucleus against lossless SD.")


def _num(value: float | None, digits: int = 2, suffix: str = "", sign: str = "") -> str:
    return "–" if value is None else f"{value:{sign}.{digits}f}{suffix}"


def stats_html(m: RunMetrics, p_auto: bool = False, p_auto_reached: bool | None = None) -> str:
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}%"

    rows = [
        ("tau (tokens / round)", _num(m.tau)),
        ("acceptance rate", pct(m.acceptance_rate)),
        ("target calls", f"{m.target_calls}"),
        ("new tokens", f"{m.new_tokens}"),
        ("tokens/s", _num(m.tokens_per_s, 1)),
        ("wall time", _num(m.wall_s, 2, " s")),
        ("time: draft / verify / head / MC", f"{m.draft_s:.2f} / {m.verify_s:.2f} / {m.head_s:.2f} / {m.mc_s:.2f} s"),
        ("MC-head share", pct(m.mc_overhead)),
        ("speedup vs the target alone (generate())", _num(m.speedup_vs_ar, 2, "x")),
        ("target NLL (nats/token)", _num(m.target_nll, 3)),
        ("off the target's top-p 0.95 nucleus", pct(m.off_nucleus_rate)),
        ("distinct-2 (repetition: lower repeats more)", _num(m.distinct2, 3)),
    ]
    if m.p is not None:
        shown = f"auto → {m.p:g}" if p_auto else f"{m.p:g}"
        if p_auto and p_auto_reached is False:
            shown += " (no rate of the grid reached the agreement target: its smallest is used)"
        rows.append(("dropout rate p", shown))
    if m.speedup_vs_lossless is not None:
        rows.append(("speed vs lossless SD", _num(m.speedup_vs_lossless, 2, "x")))
        rows.append(("first departure from lossless",
                     "identical text" if m.first_divergence is None else f"token {m.first_divergence + 1}"))
        rows.append(("tokens accepted beyond lossless SD (only by the rule)",
                     f"{m.lossy_count} of {m.new_tokens} ({pct(m.lossy_share)})"))
        off_points = None if m.delta_off_nucleus_rate is None else 100 * m.delta_off_nucleus_rate
        rows.append(("change vs lossless: target NLL / off-nucleus / distinct-2",
                     f"{_num(m.delta_target_nll, 3, sign='+')} / {_num(off_points, 1, sign='+')} pt / "
                     f"{_num(m.delta_distinct2, 3, sign='+')}"))
    body = "".join(f"<tr><td>{k}</td><td><b>{v}</b></td></tr>" for k, v in rows)
    return f'<table class="dm-stats">{body}</table>'


def explain(d: DraftedToken, token_text: TokenText, knobs: RuleConfig, greedy: bool = True,
            source: str = "model") -> str:
    """One plain sentence: which rule accepted or rejected this drafted token, and why. knobs: the run's
    RuleConfig (its rule names the tests it reads; its knobs' values fill the sentences). greedy False:
    the exact test is the lossless coin (accept with probability min(1, p / q)), not the argmax. source: the
    round's draft source; where the rule does not judge such drafts (acceptance.judges_drafts), only the
    exact test ran, and the sentence says so.
    The lossy reasons' sentences are their own (rule_words.ReasonWords.says / fails / before)."""
    tok, target = _q(token_text(d.token)), _q(token_text(d.target_token))
    if d.reason == "exact" and not greedy:
        return f"The lossless coin accepted {tok}: " + _coin(d) + "."
    if d.reason == "exact":
        return f"{tok} is the clean target's own choice (p = {d.target_token_prob:.2f}), so lossless SD accepts it too."
    if d.reason == "unchecked":
        return "Not checked: an earlier token of this round was rejected, so the rest of the draft is discarded."
    if d.reason == "rejected" and knobs.rule in RULES and not judges_drafts(knobs.rule, source):
        return (f"{tok} rejected: " + _exact_failed(d, tok, target, greedy) + f". The target's {target} is emitted "
                f"instead; {RULE_WORDS[knobs.rule].lookup_note}.")
    checks = RULES[knobs.rule].checks
    numbers = _numbers(d, tok, target, knobs)
    words = REASON_WORDS
    readable = [name for name in checks if not words[name].reads or getattr(d, words[name].reads) not in (None, ())]
    if d.reason != "rejected":
        earlier = checks[: checks.index(d.reason)] if d.reason in checks else ()
        numbers["earlier"] = "".join(words[name].before.format(**numbers) for name in earlier if name in readable)
        return words[d.reason].says.format(**numbers)
    why = [_exact_failed(d, tok, target, greedy)] + [words[name].fails.format(**numbers) for name in readable]
    return f"{tok} rejected: " + "; ".join(why) + f". The target's {target} is emitted instead."


LOW_TARGET_PROB = 0.01  # below it, a JS acceptance gets the sentence on why JS may accept such a token


def _js_note(d: DraftedToken, tok: str) -> str:
    """Why a JS test may accept a token the target all but rules out: it compares whole distributions."""
    if d.target_prob >= LOW_TARGET_PROB:
        return ""
    return (f" Note the target gives {tok} only p = {d.target_prob:.3f}: JS compares the draft's whole distribution "
            "with the target's (or the paths'), not this one token, so when both spread their mass alike the test "
            "passes even for a token the target would almost never pick.")


def _numbers(d: DraftedToken, tok: str, target: str, knobs: RuleConfig) -> dict:
    """A drafted token's numbers under the names the reasons' sentences use: the token's own, every knob's
    value by its name, and its rule's own numbers (rule_words.RuleWords.numbers)."""
    numbers = RULE_WORDS[knobs.rule].numbers
    own = {"tok": tok, "target": target, "p_target": d.target_token_prob, "p_x": d.target_prob, "q_x": d.draft_prob,
           "js": d.js, "threshold": d.threshold, "votes": d.draft_votes, "k": len(d.path_tokens),
           "js_target": d.js_target, "js_note": _js_note(d, tok), "judge_score": d.judge_score, "earlier": "",
           "js_cmp": ">" if d.js is not None and d.threshold is not None and d.js > d.threshold else "≤"}
    return {**knobs.knobs, **own, **(numbers(d, knobs) if numbers else {})}


def _exact_failed(d: DraftedToken, tok: str, target: str, greedy: bool) -> str:
    if greedy:
        return f"the target prefers {target} (p = {d.target_token_prob:.2f}; {tok} has p = {d.target_prob:.3f})"
    if d.draft_prob <= d.target_prob:  # only top-p can make a sure acceptance a rejection
        return "the lossless coin rejected it: top-p left it outside the target's nucleus (p = 0 there)"
    return f"the lossless coin rejected it ({_coin(d)})"


def _coin(d: DraftedToken) -> str:
    """The lossless coin's odds for a drafted token: min(1, p(x) / q(x)) (Leviathan et al.)."""
    if d.draft_prob <= d.target_prob:
        return f"p = {d.target_prob:.3f} ≥ q = {d.draft_prob:.3f}, so it is accepted for sure"
    return f"p = {d.target_prob:.3f} < q = {d.draft_prob:.3f}, so it is accepted with probability p / q = {d.target_prob / d.draft_prob:.2f}"


def _majority_text(d: DraftedToken, token_text: TokenText) -> str:
    if d.majority_token is None or d.majority_token < 0:
        return f"no single top token: a tie at {d.majority_votes} votes"
    return f"majority {html.escape(_q(token_text(d.majority_token)))} {d.majority_votes}"


def step_html(r: RoundTrace, token_text: TokenText, knobs: RuleConfig, greedy: bool = True) -> str:
    """One verification round: draft tokens, each path's top tokens, JS, votes, and why."""
    if not r.drafted:
        return "<p>This round drafted nothing (the last token before max new tokens).</p>"

    def top(pairs):  # a one-hot (prompt lookup) shows its one token, not two zeros
        shown = [(t, p) for i, (t, p) in enumerate(pairs) if i == 0 or p > 0]
        return "<br>".join(f"{html.escape(_q(token_text(t)))} {p:.2f}" for t, p in shown)

    num_paths = max(len(d.path_tokens) for d in r.drafted)
    head = ("<tr><th>slot</th><th>draft (top)</th><th>clean target (top)</th>"
            + "".join(f"<th>path {k + 1}</th>" for k in range(num_paths))
            + ("<th>JS / threshold</th><th>votes</th>" if num_paths else "") + "<th>decision</th></tr>")
    rows = []
    for j, d in enumerate(r.drafted):
        cells = [f"{j + 1}", top(d.draft_top), top(d.target_top)]
        if num_paths and not d.path_tokens:
            # the paths are run only where the rule reads them
            reason = "exact match" if d.reason == "exact" else "after a rejection"
            cells += [f'<span class="muted">not run ({reason})</span>'] + [""] * (num_paths + 1)
        elif num_paths:
            cells += [top(path) for path in d.path_top] or [""] * num_paths
            cells += [f"{d.js:.4f} / {d.threshold:.4f}", f"{d.draft_votes}/{num_paths} ({_majority_text(d, token_text)})"]
        decision = (f'<b class="dm-tok dm-{d.reason}">{d.reason}</b>'
                    f'<div class="why">{html.escape(explain(d, token_text, knobs, greedy, r.draft_source))}</div>')
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + f'<td class="why-cell">{decision}</td></tr>')
    emitted = " ".join(html.escape(_q(token_text(t))) for t in r.emitted)
    source = drafted_by(r.draft_source)
    if knobs.rule in RULES and not judges_drafts(knobs.rule, r.draft_source):
        source += f" ({RULE_WORDS[knobs.rule].lookup_note})"
    asked = f" (γ asked: {r.gamma})" if r.gamma is not None and r.gamma != len(r.drafted) else ""
    summary = (f"<p>Round {r.index}: {len(r.drafted)} tokens drafted by {source}{asked}; {r.num_accepted} "
               f"accepted, then a {r.extra_kind} token. Emitted: {emitted}</p>")
    return (f'<div class="dm-step">{summary}<div class="dm-scroll"><table>{head}{"".join(rows)}</table></div>'
            '</div>')


LAB_MARKS = {"exact": "✓", "rejected": "✗", "unchecked": "·"}


def lab_html(matrix: dict, disagreements_only: bool = False) -> str:
    """The rule lab's matrix: one row per drafted token (rounds separated by a rule), one column per
    rule; a cell's colour is its reason, its hover the numbers the rule read. disagreements_only:
    only the rows where the rules do not all decide alike."""
    rules = matrix["rules"]
    head = "".join(f"<th title=\"{html.escape(rule['label'])}\">{html.escape(_short(rule))}</th>" for rule in rules)
    body = []
    for row in matrix["rows"]:
        if disagreements_only and len({cell["accepted"] for cell in row["cells"]}) == 1:
            continue
        cells = "".join(f'<td class="dm-{c["reason"]}" title="{html.escape(kind_label(c["reason"]))}\n'
                        f'{html.escape(c["info"])}">{LAB_MARKS.get(c["reason"], "✓")}</td>' for c in row["cells"])
        first = row["slot"] == 0 or disagreements_only
        start = ' class="round-start"' if first else ""
        round_cell = str(row["round"]) if first else ""
        body.append(f"<tr{start}><td>{round_cell}</td><td>{row['slot'] + 1}</td>"
                    f'<td class="tok">{html.escape(_q(row["text"]))}</td>{cells}</tr>')
    if not body:
        return "<p>The rules decide every drafted token alike here.</p>" if disagreements_only and matrix["rows"] \
            else "<p>No drafted tokens in this run.</p>"
    return (f'<div class="dm-lab"><table><tr><th>round</th><th>slot</th><th>drafted</th>{head}</tr>'
            f'{"".join(body)}</table></div>')


def _short(rule: dict) -> str:
    """A matrix column's heading: the rule's short column title (its label is the heading's hover)."""
    known = RULES.get(rule["name"])
    return RULE_WORDS[known.name].title or known.label.split(" (")[0] if known else rule["label"]


def lab_summary_html(matrix: dict) -> str:
    """Per rule, on these drafts: accepted / drafted and the acceptance length per round it would give."""
    labels = {rule["name"]: rule["label"] for rule in matrix["rules"]}
    rows = "".join(
        f"<tr><td>{html.escape(labels[s['rule']])}</td><td>{s['accepted']} / {s['drafted']}</td>"
        f"<td>{100 * s['share']:.0f}%</td><td>{s['tau']:.2f}</td></tr>" for s in matrix["summary"])
    return ('<table class="dm-lab-summary"><tr><th>rule</th><th>accepted / drafted</th><th>share</th>'
            f'<th>tau on these drafts</th></tr>{rows}</table>')
