"""The reference score of a lesson (the oracle the page's player, assets/lessons.js, is checked against):
a learner's answers against the slots' reasons, with the confusions grouped by (answered, truth) and each
told in one sentence from the slots' numbers. Written apart from the page's code, in Python."""

from __future__ import annotations

from dataclasses import dataclass

from dropmatch.decoding.acceptance import REASONS


@dataclass(frozen=True)
class Confusion:
    """Slots where the learner chose `answered` and the rule gave `truth`, and what they had in common."""

    answered: str
    truth: str
    count: int
    sentence: str


def score(lesson: dict, answers: list[str]) -> dict:
    """answers[i] for lesson slot i -> {"right", "asked", "best_streak", "confusions": [Confusion...]}."""
    slots = lesson["slots"][: len(answers)]
    right = streak = best = 0
    wrong: dict[tuple[str, str], list[dict]] = {}
    for slot, answer in zip(slots, answers):
        if answer == slot["answer"]:
            right, streak = right + 1, streak + 1
            best = max(best, streak)
        else:
            streak = 0
            wrong.setdefault((answer, slot["answer"]), []).append(slot)
    confusions = [Confusion(a, t, len(s), _sentence(a, t, s, lesson)) for (a, t), s in wrong.items()]
    confusions.sort(key=lambda c: (-c.count, c.answered, c.truth))
    return {"right": right, "asked": len(slots), "best_streak": best, "confusions": confusions}


def _js_said(slots: list[dict]) -> str | None:
    ratios = [s["js"] / s["threshold"] for s in slots if s.get("js") is not None and s.get("threshold")]
    if not ratios:
        return None
    low, high = min(ratios), max(ratios)
    span = f"{low:.2g}x" if abs(high - low) < 0.05 else f"{low:.2g}-{high:.2g}x"
    return f"their JS was {span} the threshold (JS accepts at 1x or less)"


def _majority_said(slots: list[dict]) -> str | None:
    if not all("votes" in s for s in slots):
        return None
    votes = sorted({s["votes"] for s in slots})
    return f"the draft had {'/'.join(map(str, votes))} of {len(slots[0]['paths'])} path votes"


SAID = {"js": _js_said, "majority": _majority_said}  # a reason with a sentence of its own numbers


def _sentence(answered: str, truth: str, slots: list[dict], lesson: dict) -> str:
    labels, n = lesson["labels"], len(slots)
    head = f"you chose “{labels.get(answered, answered)}” for {n} slot{'s' if n > 1 else ''} that the rule marked “{labels.get(truth, truth)}”"
    for reason in [name for name in REASONS if name in (answered, truth) and name in SAID]:
        said = SAID[reason](slots)
        if said:
            return f"{head}: {said}"
    if "exact" in (answered, truth) and not lesson.get("greedy", True):
        odds = [min(1.0, s["p"] / s["q"]) if s["q"] > 0 else 1.0 for s in slots]
        low, high = min(odds), max(odds)
        span = f"{low:.2f}" if high - low < 0.005 else f"{low:.2f}-{high:.2f}"
        return f"{head}: the coin accepted them with probability min(1, p / q) = {span}"
    if "exact" in (answered, truth):
        return f"{head}: the exact test accepts only the clean target's own top token"
    return head
