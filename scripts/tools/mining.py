"""Mining a trained judge's labels, as AutoJudge does (arXiv 2504.20039), one prompt's walk at a time.

Walk the target's greedy answer left to right. At each position where the draft's greedy token
differs from the answer's (a mismatch), put the draft's token in, let the target continue greedily
to the end, and compare the final answers (`answer_of`, e.g. GSM8K's number): the mismatch is
*important* when the answer changes. Where it does not, the draft's token is kept (the walk goes on
along the new continuation); where it does, the walk keeps the target's token. Each walk asks for one
continuation at a time (`Walk.job`), so that many walks share one batched decode
(models.continuations). `Walk` is pure bookkeeping; `Miner` runs the walks' continuations on a pair;
`scripts/mine_judge.py` drives it over GSM8K train questions and keeps the records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from dropmatch import quality
from dropmatch.decoding.causal_lm import encode_prompt, stop_token_ids
from tools.continuations import Job, crop_rows, greedy_continuations, prefix_rows


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


# ---------------------------------------------------------------- the walks on a pair


class Miner:
    """The walks in flight, their cached prefixes, and the batched continuations that advance them."""

    def __init__(self, pair, max_new_tokens: int, batch: int):
        self.pair, self.max_new_tokens, self.batch = pair, max_new_tokens, batch
        self.stops = frozenset(stop_token_ids(pair.tokenizer, pair.target.model))
        self.rows: dict[int, object] = {}  # walk index -> rows of prompt + response[:-1]
        self.continuation_tokens = 0

    def answer_of(self, response: list[int]):
        return quality.gsm8k_prediction(self.pair.tokenizer.decode(response, skip_special_tokens=True))

    def start(self, questions: list[tuple[int, str]]) -> list[Walk]:
        """The walks of some questions: their greedy answers, decoded together."""
        prompts = [encode_prompt(self.pair.tokenizer, question) for _, question in questions]
        jobs = [Job(prefix_rows(self.pair.target, ids[:-1]), ids[-1], self.max_new_tokens) for ids in prompts]
        walks, unfinished = [], []
        for (index, _), ids, answer in zip(questions, prompts, self._continue(jobs)):
            if not answer.tokens or answer.tokens[-1] not in self.stops:
                unfinished.append({"index": index, "prompt_ids": ids, "response": answer.tokens, "answer": None,
                                   "finished": False, "mismatches": [], "control": []})
                continue  # no final answer within the budget: nothing to compare a continuation's with
            walk = Walk(index, ids, answer.tokens, self.answer_of, self.max_new_tokens)
            self.rows[index] = answer.rows
            walks.append(walk)
        return walks, unfinished

    def draft_tokens(self, walk: Walk) -> list[int]:
        """The draft's greedy token at each answer position, the answer read so far as its prefix."""
        draft = self.pair.draft
        ids = torch.tensor(walk.prompt_ids + walk.response[:-1], dtype=torch.long, device=draft.device)
        hidden = draft.hidden(ids, draft.new_cache())[len(walk.prompt_ids) - 1:]
        return draft.logits(hidden).argmax(-1).tolist()

    def step(self, walks: list[Walk]) -> None:
        """One continuation for every walk that asks for one, decoded together."""
        for walk in walks:
            if walk.wants_draft:
                walk.set_draft_tokens(self.draft_tokens(walk))
        asks = [(walk, walk.job()) for walk in walks]
        asks = [(walk, job) for walk, job in asks if job is not None]
        if not asks:
            return
        jobs = [Job(crop_rows(self.rows[walk.index], len(walk.prompt_ids) + position), token, budget)
                for walk, (position, token, budget) in asks]
        for (walk, _), result in zip(asks, self._continue(jobs)):
            if walk.settle(result.tokens):
                self.rows[walk.index] = result.rows

    def _continue(self, jobs: list[Job]):
        results = greedy_continuations(self.pair.target, jobs, self.stops)
        self.continuation_tokens += sum(len(result.tokens) for result in results)
        return results


def walk_record(walk: Walk) -> dict:
    return {
        "index": walk.index, "prompt_ids": walk.prompt_ids, "response": walk.response,
        "answer": walk.answer, "finished": True, "mismatches": [[m.position, m.target_token, m.draft_token, int(m.important)]
                                              for m in walk.labelled()],
        "control": [[m.position, m.target_token, m.draft_token, int(m.important)]
                    for m in walk.mismatches if m.control],
    }


def read_mined(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
