"""Speculative and autoregressive decoding on token ids, yielding one RoundTrace per target call.

    engine = Engine(pair)
    ids = engine.encode("What is 2 + 3?")
    trace = run_to_end(engine.speculative(ids, DecodeConfig(), RuleConfig("dropmatch")))

A round is five phases (Engine._round): draft -> target call -> decide (the verify step) -> commit and
crop -> record.
`speculative` and `autoregressive` are generators: they yield one RoundTrace per target call (so a
UI can stream) and return the GenerationTrace. The engine knows nothing about Gradio or plots, and
nothing about transformers' caches: causal_lm.CausalLM owns those.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Generator

import torch

from . import acceptance, drafting, eagle3, verifying, mc_head
from .config import ConfigError, DecodeConfig, RuleConfig
from .causal_lm import CausalLM, LoadedPair, encode_prompt, stop_token_ids
from .pair_services import PairServices
from .recorder import drafted_records, emitted_view, to_host, top_tokens
from .sampling import draw, sampling_probs
from .timing import PhaseTimer
from .trace import GenerationTrace, RoundStates, RoundTrace
from .trained_judge import TrainedJudge

CALIBRATION_POSITIONS = 64

Run = Generator[RoundTrace, None, GenerationTrace]


def run_to_end(run: Run) -> GenerationTrace:
    """Drive a run generator to its end and return its GenerationTrace."""
    while True:
        try:
            next(run)
        except StopIteration as stop:
            return stop.value


@dataclass
class _Sequence:
    """Committed tokens (prompt + output)."""

    prompt: list[int]
    output: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


@dataclass
class _RunState:
    """What one speculative run carries from round to round."""

    decode: DecodeConfig
    rule: RuleConfig  # every auto knob resolved (p = auto's calibrated p, the judge's threshold)
    asked: RuleConfig  # the rule as the run records it: p as asked ("auto": None), the judge's threshold filled in
    seq: _Sequence
    target_cache: object
    drafter: drafting.Drafter
    generator: torch.Generator  # sampling and acceptance: the run's seed stream
    mask_seed: int  # keys the dropout masks with each position (mc_head.mask_seed)
    verify_cost: drafting.VerifyCost  # what gamma = auto learns of the verify step's cost
    rounds: list[RoundTrace] = field(default_factory=list)
    states: list[RoundStates] | None = None  # kept for the rule lab when asked


@dataclass
class _Step:
    """A round's phases 1-4 done: the sequence length before it (committed), the draft, the target's
    hidden [g + 1, H] and clean_logits [g + 1, V] at the verified positions, the verification, and the
    tokens it emitted (cut at a stop token or max_new_tokens)."""

    committed: int
    draft: drafting.Draft
    hidden: torch.Tensor
    clean_logits: torch.Tensor
    verified: verifying.Verified
    emitted: list[int]


@dataclass(frozen=True)
class _Prefill:
    """What a speculative run's prefill leaves for its trace: the first token's logits [1, V], the
    prefill's and p = auto's calibration's seconds, and whether calibration reached its target."""

    first_logits: torch.Tensor
    t_prefill: float
    t_calibration: float
    p_auto_reached: bool | None


@dataclass(frozen=True)
class Step:
    """One round of Engine.speculative_tokens: the token fed first (the last one emitted before), the
    tokens it emitted (accepted drafts, then the extra token, cut at a stop token or max_new_tokens),
    and each drafted slot's reason (acceptance's vocabulary: exact, a lossy reason, rejected, unchecked)."""

    context_token: int
    emitted: tuple[int, ...]
    reasons: tuple[str, ...]


class Engine:
    """Speculative and autoregressive decoding over one loaded pair, batch size 1. The pair's services
    (token text, fingerprints, the trained judge, step costs, the rule lab) are `engine.services`."""

    def __init__(self, pair: LoadedPair, judge: TrainedJudge | None = None, stop_ids=None, prepare_paths: bool = True):
        """judge: the trained judge for the judge rules (default: PairServices'). stop_ids: the tokens
        that end a run (default: the tokenizer's and the chat template's). A pair without a tokenizer
        (generate() given only ids) runs on ids; its traces hold no text. prepare_paths: make the head's
        copies for the Monte-Carlo paths now (a server's memory stays flat); False: on first use (an
        engine for one call, generate()'s, whose rule may read no paths)."""
        self.pair = pair
        self.target: CausalLM = pair.target
        self.draft: CausalLM = pair.draft
        self.tokenizer = pair.tokenizer
        self.device = pair.target.device
        self.stop_ids = frozenset(stop_token_ids(pair.tokenizer, pair.target.model) if stop_ids is None else stop_ids)
        self.services = PairServices(pair, judge)
        if prepare_paths:
            self.target.prepare_paths()  # at load, not inside some later request

    # ------------------------------------------------------------ prompts

    def encode(self, prompt: str) -> list[int]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("the prompt is empty; type a question or pick an example")
        return encode_prompt(self.tokenizer, prompt)

    def check_fits(self, prompt_ids: list[int], decode: DecodeConfig) -> None:
        """Prompt + new tokens + one draft block must fit both models' context."""
        limit = min(self.target.max_positions, self.draft.max_positions)
        most = limit - len(prompt_ids) - decode.gamma - 1  # the new tokens that fit
        if most < 1:
            raise ConfigError(f"the prompt is {len(prompt_ids)} tokens; this pair reads at most {limit}")
        if decode.max_new_tokens > most:
            raise ConfigError(f"prompt ({len(prompt_ids)} tokens) + max new tokens ({decode.max_new_tokens}) exceeds "
                              f"the context of {limit}; use at most {most} new tokens")

    # ------------------------------------------------------------ runs

    def autoregressive(
        self, prompt_ids: list[int], decode: DecodeConfig, stop_event: threading.Event | None = None
    ) -> Run:
        """The target alone, one token per call, with the same instrumentation (tau = 1)."""
        self.check_fits(prompt_ids, decode)
        generator = torch.Generator(device=self.device).manual_seed(decode.seed)
        prefill = PhaseTimer(self.device)
        prefill.mark("start")
        cache = self.target.new_cache()
        hidden = self.target.hidden(self._ids(prompt_ids), cache)
        first_logits = self.target.logits(hidden[-1:])
        first = self._pick(first_logits[0], decode, generator)
        prefill.mark("end")
        t_prefill = prefill.between("start", "end")
        seq = _Sequence(list(prompt_ids), [first])
        rounds: list[RoundTrace] = []
        while (stop_reason := self._stop_reason(seq, decode, stop_event)) is None:
            timer = PhaseTimer(self.device)
            timer.mark("start")
            context = seq.output[-1]
            hidden = self.target.hidden(self._ids(seq.tokens[self.target.cached_length(cache):]), cache)
            timer.mark("forward")
            logits = self.target.logits(hidden[-1])
            timer.mark("head")
            token = self._pick(logits, decode, generator)
            seq.output.append(token)
            timer.mark("end")
            t = timer.read()
            rounds.append(RoundTrace(
                index=len(rounds), context_token=context, drafted=(), emitted=(token,), extra_kind="target",
                num_accepted=0, t_draft=0.0, t_forward=t["forward"], t_head=t["head"] - t["forward"], t_mc=0.0,
                t_round=t["end"], head_rows=1, **emitted_view(logits.unsqueeze(0), [token]),
            ))
            yield rounds[-1]
        return self._finish("ar", RuleConfig(acceptance.BASELINE), None, decode, seq, rounds, stop_reason, t_prefill,
                            first_view=emitted_view(first_logits, [first]))

    def speculative(
        self, prompt_ids: list[int], decode: DecodeConfig, rule: RuleConfig,
        stop_event: threading.Event | None = None, keep_states: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> Run:
        """Draft gamma tokens, run gamma + 1 positions in one target call, decide, commit, crop, record.
        keep_states: keep, per round, what the rule lab re-judges from (trace.states, RoundStates).
        progress(tokens read, prompt tokens): how far the target has read the prompt (CausalLM.hidden)."""
        run, start = self._start(prompt_ids, decode, rule, keep_states, progress)
        while (stop_reason := self._stop_reason(run.seq, decode, stop_event)) is None:
            run.rounds.append(self._round(run, limit=self._limit(run)))
            yield run.rounds[-1]
        return self._finish("sd", run.asked, run.rule.p if run.rule.uses_paths else None, decode, run.seq,
                            run.rounds, stop_reason, start.t_prefill,
                            first_view=emitted_view(start.first_logits, [run.seq.output[0]]),
                            t_calibration=start.t_calibration, p_auto_reached=start.p_auto_reached,
                            states=tuple(run.states or ()))

    def speculative_tokens(
        self, prompt_ids: list[int], decode: DecodeConfig, rule: RuleConfig, stop_event: threading.Event | None = None,
        one_pass: bool | None = None,
    ) -> Generator[Step, None, tuple[int, ...]]:
        """The same run as `speculative` (the same tokens, reasons and random streams) without its records:
        no top-token lists, no host copies beyond the verify step's own reads, no token texts or
        fingerprints. Yields one Step per round; returns the output ids (the first token included).
        What generate() runs: a caller that keeps no trace pays for none. one_pass: the verify step's
        paths at every drafted slot in one head pass and one host read a round (verifying.verify's
        staged False: the same verdicts); default: on an accelerator, where each read is a sync."""
        one_pass = self.device.type != "cpu" if one_pass is None else one_pass
        run, _ = self._start(prompt_ids, decode, rule, keep_states=False)
        while self._stop_reason(run.seq, decode, stop_event) is None:
            timer = PhaseTimer(self.device) if decode.gamma_tuned_for_rule else None  # gamma reads the verify cost
            step = self._step(run, self._limit(run), timer, staged=not one_pass)
            if timer is not None:
                self._learn_verify_cost(run, step.verified.verdict, timer, timer.read())
            yield Step(run.seq.tokens[step.committed - 1], tuple(step.emitted), step.verified.verdict.reasons)
        return tuple(run.seq.output)

    def _start(self, prompt_ids: list[int], decode: DecodeConfig, rule: RuleConfig, keep_states: bool,
               progress: Callable[[int, int], None] | None = None) -> tuple[_RunState, _Prefill]:
        """Checks, the prefill (the prompt through both models, p = auto's calibration, the first token)
        and the run's state: what both kinds of run share."""
        self.check_fits(prompt_ids, decode)
        check_mode(rule, decode)
        rule = self.services.with_judge(rule)
        costs = self.services.step_costs() if decode.gamma_auto else None  # measured once per pair, before the clock starts
        generator = torch.Generator(device=self.device).manual_seed(decode.seed)
        space = drafting.DraftSpace(decode, generator, costs, self.target.vocab_size, self.device,
                                    self.draft.hidden_size)
        drafter = (eagle3.drafter(space, self.pair.head) if decode.draft_source == eagle3.SOURCE
                   else drafting.make_drafter(space, self.draft))
        prefill = PhaseTimer(self.device)
        prefill.mark("start")
        target_cache = self.target.new_cache()
        # The progress callback only where a caller asked (a head given to the engine may not take it).
        read = {"progress": progress} if progress is not None else {}
        prompt_hidden = self.target.hidden(self._ids(prompt_ids), target_cache, **read)
        first_logits = self.target.logits(prompt_hidden[-1:])
        prefill.mark("calibration")
        masks = mc_head.mask_seed(decode.seed, prompt_ids)  # the run's dropout masks: (seed, prompt, position)
        calibration = self._calibrate(rule, prompt_hidden, mc_head.mc_generator(masks, self.device))
        prefill.mark("calibrated")
        first = self._pick(first_logits[0], decode, generator)
        drafter.start(list(prompt_ids))
        prefill.mark("end")
        seconds = prefill.read()
        t_calibration = prefill.between("calibration", "calibrated", seconds)
        self.services.note_prefill(len(prompt_ids), seconds["end"] - t_calibration)
        resolved = rule if calibration is None else rule.replace(p=calibration.p)
        run = _RunState(decode, resolved, rule, _Sequence(list(prompt_ids), [first]), target_cache, drafter, generator,
                        masks, space.verify_cost, states=[] if keep_states else None)
        return run, _Prefill(first_logits, seconds["end"] - t_calibration, t_calibration,
                             None if calibration is None else calibration.reached)

    @staticmethod
    def _limit(run: _RunState) -> int:
        """The most tokens the next round may draft: gamma, and never past max_new_tokens."""
        return min(run.decode.gamma, run.decode.max_new_tokens - len(run.seq.output) - 1)

    # ------------------------------------------------------------ one round

    def _round(self, run: _RunState, limit: int) -> RoundTrace:
        """One round, phases 1-4 (_step), then 5. Record: one device -> host copy of what the records
        read, the drafted slots' records, the round's times."""
        timer = PhaseTimer(self.device)  # the round's phases, read once at its end
        step = self._step(run, limit, timer)
        verdict, draft, hidden = step.verified.verdict, step.draft, step.hidden
        host = to_host({**vars(step.verified.signals),
                        **top_tokens(draft.q_signal, step.verified.p_signal, step.verified.path_probs, draft.num_drafted)})
        records = drafted_records(host, verdict.reasons)
        timer.mark("end")
        t = timer.read()
        t_mc = self._learn_verify_cost(run, verdict, timer, t)
        if run.states is not None:  # outside the round's time: the lab's copy is not the method's cost
            run.states.append(RoundStates.from_tensors(step.committed, hidden, draft.hidden, host["exact"],
                                                       host.get("coin")))
        return RoundTrace(
            index=len(run.rounds), context_token=run.seq.tokens[step.committed - 1], drafted=records,
            emitted=tuple(step.emitted), extra_kind=verdict.next_kind,
            num_accepted=min(verdict.num_accepted, len(step.emitted)),
            t_draft=t["drafted"], t_forward=t["verified"] - t["drafted"], t_head=t["head"] - t["verified"],
            t_mc=t_mc, t_round=t["end"], head_rows=hidden.shape[0] + step.verified.path_rows,
            **emitted_view(step.clean_logits[: len(step.emitted)], step.emitted), gamma=draft.requested,
            draft_source=draft.source,
        )

    def _step(self, run: _RunState, limit: int, timer: PhaseTimer | None, staged: bool = True) -> _Step:
        """A round's phases 1-4 (timer: marks their ends, or None to time nothing; staged: verifying.verify's)."""
        mark = timer.mark if timer is not None else (lambda name: None)
        mark("start")
        # 1. Draft: at most `limit` tokens, from the run's drafter (prompt lookup or the draft model).
        draft = run.drafter.propose(run.seq.tokens, limit)
        mark("drafted")
        # 2. Target call: one call over [last emitted token] + drafts, then the clean head rows.
        committed = len(run.seq.tokens)
        context = self._ids(run.seq.tokens[self.target.cached_length(run.target_cache):])
        hidden = self.target.hidden(torch.cat([context, draft.tokens]), run.target_cache)  # [g + 1, H]
        mark("verified")
        clean_logits = self.target.logits(hidden)  # [g + 1, V], fp32: lossless decisions read these
        mark("head")
        # 3. Decide: the lossless test, then the verify step (Monte-Carlo paths only where the rule reads them).
        verified = self._decide(run, draft, hidden, clean_logits, timer, staged)
        # 4. Commit and crop: the accepted drafts and the extra token; caches keep what was accepted.
        emitted = self._commit(run.seq, verified.emitted, run.decode)
        keep = committed + verified.verdict.num_accepted
        self.target.crop(run.target_cache, min(keep, self.target.cached_length(run.target_cache)))
        run.drafter.learn(draft, verified.verdict.num_accepted, keep)
        return _Step(committed, draft, hidden, clean_logits, verified, emitted)

    @staticmethod
    def _learn_verify_cost(run: _RunState, verdict: acceptance.Verdict, timer: PhaseTimer, seconds: dict) -> float:
        """Record the round's Monte-Carlo seconds and its judged and reached slots (gamma = auto reads
        them); returns those seconds."""
        t_mc = timer.between("mc_start", "mc_end", seconds)
        reached = verdict.reasons[: verdict.num_accepted + 1]
        run.verify_cost.record(t_mc, acceptance.judged_count(reached), len(reached))
        return t_mc

    def _decide(self, run: _RunState, draft: drafting.Draft, hidden: torch.Tensor,
                clean_logits: torch.Tensor, timer: PhaseTimer | None, staged: bool) -> verifying.Verified:
        """The lossless test at every drafted position, then the one verify step (a batch of one: the
        rule's paths where it reads them, the scan, the extra token)."""
        decode = run.decode
        p_sample = sampling_probs(clean_logits, decode.temperature, decode.top_p)
        test = acceptance.lossless_test(draft.tokens, draft.q_sample, p_sample[: draft.num_drafted], decode.greedy,
                                        run.generator)
        inputs = verifying.VerifyInputs(len(run.seq.tokens), draft.tokens, draft.q_signal, hidden, clean_logits,
                                        test.exact, decode.temperature, run.mask_seed, test.coin, test.p_x, test.q_x,
                                        q_sample=draft.q_sample, p_sample=p_sample, top_p=decode.top_p,
                                        draft_source=draft.source)
        judge = self.services.judge if run.rule.uses_judge else None
        verified, = verifying.verify(self.target, run.rule, [inputs], staged=staged, judge=judge,
                                     generator=run.generator, timer=timer)
        return verified

    def _commit(self, seq: _Sequence, tokens: list[int], decode: DecodeConfig) -> list[int]:
        """Append tokens to the output, cut after a stop token and at max_new_tokens."""
        kept = []
        for token in tokens[: decode.max_new_tokens - len(seq.output)]:
            kept.append(token)
            if token in self.stop_ids:
                break
        seq.output.extend(kept)
        return kept

    # ------------------------------------------------------------ helpers

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def _pick(self, logits: torch.Tensor, decode: DecodeConfig, generator: torch.Generator) -> int:
        if decode.greedy:
            return int(logits.argmax())
        return int(draw(sampling_probs(logits, decode.temperature, decode.top_p), generator))

    def _calibrate(self, rule: RuleConfig, prompt_hidden: torch.Tensor, masks) -> mc_head.Calibration | None:
        """p = auto's choice from the prompt's own last positions; None when p is fixed or unused."""
        if not rule.uses_paths or rule.p is not None:
            return None
        positions = prompt_hidden[-CALIBRATION_POSITIONS:]
        return mc_head.calibrate_p(positions, self.target.logits(positions), self.target.head_weight,
                                   rule.num_paths, rule.auto_agreement, masks)

    def _stop_reason(self, seq: _Sequence, decode: DecodeConfig, stop_event) -> str | None:
        if seq.output and seq.output[-1] in self.stop_ids:
            return "eos"
        if len(seq.output) >= decode.max_new_tokens:
            return "max_new_tokens"
        if stop_event is not None and stop_event.is_set():
            return "stopped"
        return None

    def _finish(self, mode, rule, p, decode, seq, rounds, stop_reason, t_prefill, first_view,
                t_calibration=0.0, p_auto_reached=None, states=()) -> GenerationTrace:
        # The run's own time: prefill + calibration + rounds. Time spent by the caller between rounds
        # (another run interleaved with this one, a UI update) is not this run's.
        t_total = t_prefill + t_calibration + sum(r.t_round for r in rounds)
        output = seq.output
        shown = output[:-1] if output and output[-1] in self.stop_ids else output
        return GenerationTrace(
            mode=mode, rule=rule.rule if mode == "sd" else "autoregressive", p=p, decode_config=decode,
            rule_config=rule, prompt_ids=tuple(seq.prompt), first_token=output[0], rounds=tuple(rounds),
            output_ids=tuple(output), token_texts=self.services.stream_texts(output),
            text=self.tokenizer.decode(shown, skip_special_tokens=True) if self.tokenizer else "", stop_reason=stop_reason,
            t_prefill=t_prefill, t_total=t_total, target_name=self.target.name,
            draft_name=self.draft.name if mode == "sd" else "", t_calibration=t_calibration,
            p_auto_reached=p_auto_reached, first_logprob=first_view["emitted_logprob"][0],
            first_in_nucleus=first_view["emitted_in_nucleus"][0], states=states,
            **dict(zip(("weights", "device", "dtype"), self.services.computed_by())), kernels=self.services.kernels,
        )


def check_mode(rule: RuleConfig, decode: DecodeConfig) -> None:
    """ConfigError (one line) when the rule is not defined under the run's decoding mode."""
    entry = acceptance.RULES[rule.rule]
    mode = "greedy" if decode.greedy else "sampling"
    if mode not in entry.modes:
        fix = "set a temperature above 0" if decode.greedy else "set the temperature to 0 (greedy)"
        raise ConfigError(f"the rule {rule.rule!r} ({entry.label}) is defined under {' and '.join(entry.modes)} "
                          f"decoding only; {fix}")


