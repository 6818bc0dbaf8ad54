"""An engine with no weights: deterministic rounds made from the prompt's own words.

It speaks the Engine interface the app uses (encode, check_fits, speculative, autoregressive,
stop_ids, and services: token_text, measured_costs), so the UI can be tested in seconds and its texts
checked exactly.
"""

from __future__ import annotations

import time

from dropmatch.decoding.config import ConfigError, DecodeConfig, RuleConfig
from dropmatch.decoding.trace import DraftedToken, GenerationTrace, RoundTrace

EOS = 0


class FakeServices:
    """The fake pair's services: its words as token texts; no step costs measured (a test may set them)."""

    source_label = None

    def __init__(self, engine: "FakeEngine"):
        self.token_text = engine.token_text
        self.stream_texts = lambda ids: tuple(map(engine.token_text, ids))  # whole words: no character is split
        self.measured_costs = None
        self.prefill = None  # (tokens, seconds) of the longest prompt read: the fake reads in no time


class FakeEngine:
    def __init__(self, delay_s: float = 0.0, reason_for: dict[str, str] | None = None, auto_gamma: int | None = None,
                 max_context: int = 4096):
        self.max_context = max_context  # prompt + new tokens it holds (check_fits refuses more)
        self.reason_for = reason_for or {}  # the reason a lossy rule gives (default "js")
        self.auto_gamma = auto_gamma  # the drafts a round makes under gamma = auto (None: the cap, decode.gamma)
        self.words = ["<eos>"]
        self.ids: dict[str, int] = {}
        self.stop_ids = frozenset({EOS})
        self.delay_s = delay_s
        self.rounds_made = 0  # every round of every run, counted as it is made
        self.runs_active = 0  # speculative runs started and not yet ended (returned, stopped or closed)
        self.services = FakeServices(self)

    def _id(self, word: str) -> int:
        if word not in self.ids:
            self.ids[word] = len(self.words)
            self.words.append(word)
        return self.ids[word]

    def token_text(self, token: int) -> str:
        return "" if token == EOS else " " + self.words[token]

    def encode(self, prompt: str) -> list[int]:
        if not prompt.strip():
            raise ConfigError("the prompt is empty; type a question or pick an example")
        return [self._id(w) for w in prompt.split()]

    def check_fits(self, prompt_ids, decode: DecodeConfig) -> None:
        if len(prompt_ids) + decode.max_new_tokens > self.max_context:
            raise ConfigError("too long for the fake engine")

    def answer(self, prompt_ids) -> list[int]:
        """What the 'target' says: the prompt's words echoed back, then EOS."""
        return list(prompt_ids) + [EOS]

    def autoregressive(self, prompt_ids, decode, stop_event=None):
        answer = self.answer(prompt_ids)[: decode.max_new_tokens]
        rounds = []
        for i, token in enumerate(answer[1:]):
            time.sleep(self.delay_s)
            rounds.append(RoundTrace(i, answer[i], (), (token,), "target", 0, 0.0, 0.01, 0.002, 0.0, 0.012, 1))
            yield rounds[-1]
        return self._trace("ar", RuleConfig("lossless"), None, decode, prompt_ids, answer, rounds)

    def speculative(self, prompt_ids, decode, rule: RuleConfig, stop_event=None, keep_states=False, progress=None):
        """Rounds of gamma drafts: lossless accepts half of each round, lossy rules all but the last.
        It has no hidden states to keep (keep_states is ignored): the rule lab says so. The prompt is
        read at once (progress, when given, hears it whole)."""
        if progress is not None:
            progress(len(prompt_ids), len(prompt_ids))
        self.runs_active += 1
        try:
            return (yield from self._speculative(prompt_ids, decode, rule, stop_event))
        finally:
            self.runs_active -= 1

    def _speculative(self, prompt_ids, decode, rule: RuleConfig, stop_event):
        answer = self.answer(prompt_ids)[: decode.max_new_tokens]
        lossy = rule.rule != "lossless"
        p = (0.1 if rule.p is None else rule.p) if rule.uses_paths else None
        rounds, position = [], 1
        while position < len(answer):
            if stop_event is not None and stop_event.is_set():
                break
            time.sleep(self.delay_s)
            self.rounds_made += 1
            cap = self.auto_gamma if decode.gamma_auto and self.auto_gamma else decode.gamma
            gamma = min(cap, len(answer) - position)
            accept = gamma - 1 if lossy else gamma // 2
            drafted = []
            for j in range(gamma):
                token = answer[position + j] if j < accept or not lossy else self._id("wrong")
                lossy_reason = self.reason_for.get(rule.rule, "js")
                reason = (lossy_reason if lossy and j % 2 else "exact") if j < accept else ("rejected" if j == accept else "unchecked")
                drafted.append(self._drafted(token, answer[position + j], reason, rule))
            emitted = tuple(answer[position : position + accept + 1])
            rounds.append(RoundTrace(len(rounds), answer[position - 1], tuple(drafted), emitted,
                                     "correction" if accept < gamma else "bonus", accept,
                                     0.003 * gamma, 0.02, 0.004, 0.001 if p else 0.0, 0.03, 6))
            position += len(emitted)
            yield rounds[-1]
        return self._trace("sd", rule, p, decode, prompt_ids, answer, rounds)

    def _drafted(self, token, target, reason, rule: RuleConfig) -> DraftedToken:
        paths = (target,) * (rule.num_paths - 1) + (token,) if rule.uses_paths else ()
        top = ((target, 0.6), (token, 0.3))
        return DraftedToken(
            token=token, draft_prob=0.5, target_token=target, target_token_prob=0.6, target_prob=0.3,
            js_target=0.05, reason=reason, path_tokens=paths,
            js=0.01 if rule.uses_paths else None, threshold=0.02 if rule.uses_paths else None,
            majority_token=target if rule.uses_paths else None,
            majority_votes=len(paths) - 1 if rule.uses_paths else None,
            draft_votes=1 if rule.uses_paths else None, draft_top=top, target_top=top,
            path_top=tuple(top for _ in paths),
        )

    def _trace(self, mode, rule, p, decode, prompt_ids, answer, rounds) -> GenerationTrace:
        output = [answer[0]] + [t for r in rounds for t in r.emitted]
        shown = [t for t in output if t != EOS]
        return GenerationTrace(
            mode=mode, rule=rule.rule if mode == "sd" else "autoregressive", p=p, decode_config=decode,
            rule_config=rule, prompt_ids=tuple(prompt_ids), first_token=answer[0], rounds=tuple(rounds), output_ids=tuple(output),
            token_texts=tuple(self.token_text(t) for t in output),
            text="".join(self.token_text(t) for t in shown).strip(),
            stop_reason="eos" if output[-1] == EOS else "max_new_tokens",
            t_prefill=0.01, t_total=0.01 + sum(r.t_round for r in rounds), target_name="fake", draft_name="fake",
        )
