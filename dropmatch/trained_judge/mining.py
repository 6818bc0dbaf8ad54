"""Mining a trained judge's labels, as AutoJudge does (arXiv 2504.20039), one prompt's walk at a time.

Walk the target's greedy answer left to right. At each position where the draft's greedy token
differs from the answer's (a mismatch), put the draft's token in, let the target continue greedily
to the end, and compare the final answers (`answer_of`, e.g. GSM8K's number): the mismatch is
*important* when the answer changes. Where it does not, the draft's token is kept (the walk goes on
along the new continuation); where it does, the walk keeps the target's token. Each walk asks for one
continuation at a time (`Walk.job`), so that many walks share one batched decode
(models.continuations); `scripts/mine_judge.py` drives them. Pure bookkeeping: no model here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Mismatch:
    """At answer position `position` the target's token and the draft's differ; important: putting the
    draft's token in changed the final answer. control: a job that put the target's own token back
    (its label measures the batched decode's own noise, and trains nothing)."""

    position: int
    target_token: int
    draft_token: int
    important: bool
    control: bool = False


@dataclass
class Walk:
    """One prompt's walk. response: the current greedy answer (token ids after the prompt); the walk
    asks for the draft's greedy tokens on it (`wants_draft`), then for one continuation at a time."""

    index: int
    prompt_ids: list[int]
    response: list[int]
    answer_of: Callable[[list[int]], object]
    max_new_tokens: int
    with_control: bool = True
    mismatches: list[Mismatch] = field(default_factory=list)
    cursor: int = 0
    draft_tokens: list[int] | None = None  # the draft's greedy token at each answer position
    pending: Mismatch | None = None

    def __post_init__(self):
        self.answer = self.answer_of(self.response)

    @property
    def wants_draft(self) -> bool:
        return self.draft_tokens is None

    @property
    def over(self) -> bool:
        """No continuation pending and no mismatch left after the cursor."""
        return not self.wants_draft and self.pending is None and self._next_mismatch() is None

    def set_draft_tokens(self, draft_tokens: list[int]) -> None:
        if len(draft_tokens) != len(self.response):
            raise ValueError(f"{len(draft_tokens)} draft tokens for an answer of {len(self.response)}")
        self.draft_tokens = list(draft_tokens)

    def job(self) -> tuple[int, int, int] | None:
        """(answer position t, the token to put there, the continuation's budget) of the next
        continuation, or None when the walk is over. The first one, when with_control, puts the
        target's own token at the first mismatch (the control)."""
        position = self._next_mismatch()
        if position is None:
            return None
        target_token, draft_token = self.response[position], self.draft_tokens[position]
        control = self.with_control and not any(m.control for m in self.mismatches)
        token = target_token if control else draft_token
        self.pending = Mismatch(position, target_token, draft_token, important=False, control=control)
        return position, token, self.max_new_tokens - position - 1

    def settle(self, continuation: list[int]) -> bool:
        """Record the pending job's result (the greedy tokens after the put-in token); True when the
        draft's token was kept (the response changed, so the draft's tokens are wanted again)."""
        pending, self.pending = self.pending, None
        put = pending.target_token if pending.control else pending.draft_token
        candidate = self.response[: pending.position] + [put] + list(continuation)
        important = self.answer_of(candidate) != self.answer
        self.mismatches.append(Mismatch(pending.position, pending.target_token, pending.draft_token, important,
                                        pending.control))
        if pending.control:
            return False  # the control only measures; the walk visits this mismatch again for real
        self.cursor = pending.position + 1
        if important:
            return False
        self.response = candidate
        self.draft_tokens = None
        return True

    def _next_mismatch(self) -> int | None:
        for position in range(self.cursor, len(self.response)):
            if self.draft_tokens[position] != self.response[position]:
                return position
        return None

    def labelled(self) -> list[Mismatch]:
        """The mismatches that train a judge (the control left out)."""
        return [m for m in self.mismatches if not m.control]
