"""Predict-the-verdict lessons (pure): a run's judged slots as questions.

A lesson teaches one rule. Each slot is a drafted token the rule judged: the learner sees the text
before it, the token with its draft probability and the clean target's top tokens, and chooses one
of the rule's reasons (accepted exactly, by one of the rule's checks, or rejected); the reveal is the
trace's own record (paths, votes, JS against its threshold) and the step view's sentence
(render.explain). The page's player (assets/lessons.js) scores the answers.
"""

from __future__ import annotations

from .decoding.acceptance import RULES, votes_needed
from .render import explain, kind_label
from .decoding.trace import DraftedToken, GenerationTrace, RoundTrace

LESSON_VERSION = 1
CONTEXT_TOKENS = 24  # the text before a slot the learner reads
JS_NEAR = 0.1  # a close call: JS within this share of its threshold
# The close calls a slot may be (its "tags"): the cases a rule is learned on, named in the reveal.
CLOSE_CALLS = {
    "lookup": "a prompt-lookup draft: q is one-hot (the draft gave this token probability 1)",
    "js_near": "a close call: JS within 10% of its threshold",
    "votes_short": "a close call: one vote short of the majority the rule asks",
    "coin_rejected": "a sampled rejection where q > p: the coin accepted it with probability p / q only",
}


def rule_reasons(rule: str) -> tuple[str, ...]:
    """The reasons a rule can give a drafted token, in the order a learner chooses from:
    exact, each of the rule's own checks, rejected."""
    return ("exact", *RULES[rule].checks, "rejected")


def lesson_from_trace(trace: GenerationTrace, token_text, title: str = "", run: int = 0) -> dict:
    """A lesson (JSON-ready) of every slot the trace's rule judged (unchecked ones are not asked).
    run: the slots' run index, where a lesson is made of several runs (builtin_lessons)."""
    slots, before = [], [trace.first_token]
    for r in trace.rounds:
        for j, d in enumerate(r.drafted):
            if d.reason == "unchecked":
                break
            slots.append(_slot(d, run, r, j, before + list(r.emitted[:j]), token_text, trace))
        before += list(r.emitted)
    greedy, choices = trace.temperature == 0, rule_reasons(trace.rule)
    return {"version": LESSON_VERSION, "title": title, "rule": trace.rule, "greedy": greedy, "choices": list(choices),
            "labels": {reason: "accepted by the lossless coin" if reason == "exact" and not greedy
                       else kind_label(reason) for reason in choices},
            "close_calls": CLOSE_CALLS, "slots": slots}


def close_calls(d: DraftedToken, source: str, trace: GenerationTrace) -> list[str]:
    """The CLOSE_CALLS a judged slot is, in their table's order."""
    k = len(d.path_tokens)
    holds = {"lookup": source == "ngram",
             "js_near": d.js is not None and d.threshold and abs(d.js / d.threshold - 1) <= JS_NEAR,
             "votes_short": k and d.draft_votes == votes_needed(k, trace.rule_config.majority_fraction) - 1,
             "coin_rejected": trace.temperature > 0 and d.reason == "rejected" and d.draft_prob > d.target_prob}
    return [tag for tag in CLOSE_CALLS if holds[tag]]


def _slot(d: DraftedToken, run: int, r: RoundTrace, j: int, context: list[int], token_text,
          trace: GenerationTrace) -> dict:
    found = {"run": run, "round": r.index, "slot": j, "source": r.draft_source,
             "tags": close_calls(d, r.draft_source, trace),
             "context": "".join(token_text(t) for t in context[-CONTEXT_TOKENS:]),
             "x": token_text(d.token), "q": d.draft_prob, "p": d.target_prob,
             "target": token_text(d.target_token), "p_target_top": d.target_token_prob,
             "target_top": [[token_text(t), prob] for t, prob in d.target_top] or [[token_text(d.target_token), d.target_token_prob]],
             "answer": d.reason, "why": explain(d, token_text, trace.rule_config, trace.temperature == 0)}
    if d.path_tokens:
        found.update(paths=[token_text(t) for t in d.path_tokens], votes=d.draft_votes, js=d.js, threshold=d.threshold)
    return found


def short_lesson(lesson: dict, size: int = 20) -> dict:
    """The lesson cut to `size` slots in run order: every slot the exact test did not decide first (up to
    size - 4), the exact ones spread evenly over the run to fill the rest."""
    slots = lesson["slots"]
    judged = [i for i, s in enumerate(slots) if s["answer"] != "exact"][: max(size - 4, 0)]
    exact = [i for i, s in enumerate(slots) if s["answer"] == "exact"]
    room = min(size - len(judged), len(exact))
    spread = [exact[(k * len(exact)) // room] for k in range(room)] if room > 0 else []
    return {**lesson, "slots": [slots[i] for i in sorted(judged + spread)]}
