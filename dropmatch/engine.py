"""Speculative and autoregressive decoding on token ids, yielding one RoundTrace per target call.

    engine = Engine(pair)
    ids = engine.encode("What is 2 + 3?")
    trace = run_to_end(engine.speculative(ids, DecodeConfig(), RuleConfig("dropmatch")))

A round is five phases (Engine._round): draft -> verify -> judge -> commit and crop -> record.
`speculative` and `autoregressive` are generators: they yield one RoundTrace per target call (so a
UI can stream) and return the GenerationTrace. The engine knows nothing about Gradio or plots, and
nothing about transformers' caches: models.CausalLM owns those.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Generator

import torch

from . import acceptance, drafting, verifying, lab, mc_head
from .config import AUTO_GAMMA_CAP, ConfigError, DecodeConfig, RuleConfig
from .models import CausalLM, LoadedPair, encode_prompt, stop_token_ids
from .sampling import draw, sampling_probs, target_view
from .trained_judge import TrainedJudge, judge_for
from .timing import PhaseTimer
from .trace import DraftedToken, GenerationTrace, RoundStates, RoundTrace

TOP_SHOWN = 3  # top tokens kept per distribution for the step-through view
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
    """Committed tokens (prompt + output) and, per model, the tokens its cache still lacks."""

    prompt: list[int]
    output: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def pending(self, cache_length: int) -> list[int]:
        return self.tokens[cache_length:]


@dataclass
class _RunState:
    """What one speculative run carries from round to round."""

    decode: DecodeConfig
    rule: RuleConfig
    p: float | None  # the dropout rate in use (None when the rule reads no paths)
    seq: _Sequence
    target_cache: object
    drafter: drafting.Drafter
    generator: torch.Generator  # sampling and acceptance: the run's seed stream
    mask_seed: int  # keys the dropout masks with each position (mc_head.mask_seed)
    judge_cost: drafting.VerifyCost  # what gamma = auto learns of the verify step's cost
    rounds: list[RoundTrace] = field(default_factory=list)
    states: list[RoundStates] | None = None  # kept for the rule lab when asked


@dataclass
class _Verification:
    """A round's verdict, the tokens it emits (accepted drafts, then the extra token), the host copies of
    what it read (for the records), and its path rows."""

    verdict: acceptance.Verdict
    emitted: list[int]
    host: dict
    path_rows: int


class Engine:
    """Speculative and autoregressive decoding over one loaded pair, batch size 1."""

    def __init__(self, pair: LoadedPair, judge: TrainedJudge | None = None, stop_ids=None):
        """judge: the trained judge for the judge rules; by default the shipped one where it was
        trained on this target (the embedded pair), else none (those rules then refuse in one line).
        stop_ids: the tokens that end a run (default: the tokenizer's and the chat template's). A pair
        without a tokenizer (generate() given only ids) runs on ids; its traces hold no text."""
        self.pair = pair
        self.target: CausalLM = pair.target
        self.draft: CausalLM = pair.draft
        self.tokenizer = pair.tokenizer
        self.device = pair.target.device
        self.stop_ids = frozenset(stop_token_ids(pair.tokenizer, pair.target.model) if stop_ids is None else stop_ids)
        self.source_label = pair.source or pair.spec.label
        self._token_texts: dict[int, str] = {}
        self._costs: drafting.StepCosts | None = None
        self.target.prepare_paths()  # at load, not inside some later request
        self.weights = f"{self.target.fingerprint()}+{self.draft.fingerprint()}"
        self.judge = judge or judge_for(self.target.name, self.target.hidden_size)

    def computed_by(self) -> tuple[str, str, str]:
        """(weights fingerprint "target+draft", device type, the target's dtype): what a trace records
        so that the rule lab re-judges a run only with what made it."""
        return self.weights, self.device.type, str(self.target.compute_dtype).removeprefix("torch.")

    # ------------------------------------------------------------ prompts

    def encode(self, prompt: str) -> list[int]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("the prompt is empty; type a question or pick an example")
        return encode_prompt(self.tokenizer, prompt)

    def check_fits(self, prompt_ids: list[int], decode: DecodeConfig) -> None:
        """Prompt + new tokens + one draft block must fit both models' context."""
        limit = min(self.target.max_positions, self.draft.max_positions)
        needed = len(prompt_ids) + decode.max_new_tokens + decode.gamma + 1
        if len(prompt_ids) + decode.gamma + 2 > limit:
            raise ConfigError(f"the prompt is {len(prompt_ids)} tokens; this pair reads at most {limit}")
        if needed > limit:
            most = limit - len(prompt_ids) - decode.gamma - 1
            raise ConfigError(
                f"prompt ({len(prompt_ids)} tokens) + max new tokens ({decode.max_new_tokens}) exceeds "
                f"the context of {limit}; use at most {most} new tokens"
            )

    def token_text(self, token: int) -> str:
        """The text of one token id, as the UI shows it."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.tokenizer.decode([token]) if self.tokenizer else f"<{token}>"
        return text

    def decode_tokens(self, ids: list[int]) -> tuple[str, ...]:
        return tuple(self.token_text(i) for i in ids)

    @property
    def names(self) -> tuple[str, str]:
        """(target name, draft name): what a trace records as its pair."""
        return self.target.name, self.draft.name

    def rule_lab(self, trace: GenerationTrace, settings: RuleConfig) -> dict:
        """The rule lab's matrix (lab.rejudge) for a run's drafts, from its kept states, through this pair's heads."""
        prepared = lab.prepare(trace, self.target, self.draft)
        return lab.rejudge(prepared, self.target, settings, self.token_text, judge=self.judge)

    def with_judge(self, rule: RuleConfig) -> RuleConfig:
        """The rule with the judge's validation-chosen threshold filled in where it reads the judge and
        sets none; ConfigError (one line) when it reads the judge and this pair has none."""
        if not rule.uses_judge:
            return rule
        if self.judge is None:
            raise ConfigError(f"the rule {rule.rule!r} needs a trained judge for this target; "
                              "only the embedded pair ships one (assets/judge)")
        return self.judge.filled(rule)

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
        stop_reason = self._stop_reason(seq, decode, stop_event)
        while stop_reason is None:
            timer = PhaseTimer(self.device)
            timer.mark("start")
            context = seq.output[-1]
            hidden = self.target.hidden(self._ids(seq.pending(self.target.cached_length(cache))), cache)
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
                t_round=t["end"],
                head_rows=1, **_emitted_view(logits.unsqueeze(0), [token]),
            ))
            yield rounds[-1]
            stop_reason = self._stop_reason(seq, decode, stop_event)
        return self._finish("ar", RuleConfig("lossless"), None, decode, seq, rounds, stop_reason, t_prefill,
                            first_view=_emitted_view(first_logits, [first]))

    def speculative(
        self, prompt_ids: list[int], decode: DecodeConfig, rule: RuleConfig,
        stop_event: threading.Event | None = None, keep_states: bool = False,
    ) -> Run:
        """Draft gamma tokens, verify gamma + 1 positions in one target call, judge, commit, crop.
        keep_states: keep, per round, what the rule lab re-judges from (trace.states, RoundStates)."""
        self.check_fits(prompt_ids, decode)
        check_mode(rule, decode)
        rule = self.with_judge(rule)
        costs = self.step_costs() if decode.gamma_auto else None  # measured once per pair, before the clock starts
        generator = torch.Generator(device=self.device).manual_seed(decode.seed)
        space = drafting.DraftSpace(decode, generator, costs, self.target.vocab_size, self.device,
                                    self.draft.hidden_size)
        drafter = drafting.make_drafter(space, self.draft)
        prefill = PhaseTimer(self.device)
        prefill.mark("start")
        target_cache = self.target.new_cache()
        prompt_hidden = self.target.hidden(self._ids(prompt_ids), target_cache)
        first_logits = self.target.logits(prompt_hidden[-1:])
        prefill.mark("calibration")
        masks = mc_head.mask_seed(decode.seed, prompt_ids)  # the run's dropout masks: (seed, prompt, position)
        calibration = self._calibrate(rule, prompt_hidden, mc_head.mc_generator(masks, self.device))
        prefill.mark("calibrated")
        p = calibration.p if calibration is not None else (rule.p if rule.uses_paths else None)
        first = self._pick(first_logits[0], decode, generator)
        drafter.start(list(prompt_ids))
        prefill.mark("end")
        seconds = prefill.read()
        t_calibration = prefill.between("calibration", "calibrated", seconds)
        t_prefill = seconds["end"] - t_calibration
        run = _RunState(decode, rule, p, _Sequence(list(prompt_ids), [first]), target_cache, drafter, generator,
                        masks, space.judge_cost, states=[] if keep_states else None)
        stop_reason = self._stop_reason(run.seq, decode, stop_event)
        while stop_reason is None:
            remaining = decode.max_new_tokens - len(run.seq.output)
            run.rounds.append(self._round(run, limit=min(decode.gamma, remaining - 1)))  # never past max_new_tokens
            yield run.rounds[-1]
            stop_reason = self._stop_reason(run.seq, decode, stop_event)
        return self._finish("sd", rule, p, decode, run.seq, run.rounds, stop_reason, t_prefill,
                            first_view=_emitted_view(first_logits, [first]), t_calibration=t_calibration,
                            p_auto_reached=None if calibration is None else calibration.reached,
                            states=tuple(run.states or ()))

    # ------------------------------------------------------------ one round

    def _round(self, run: _RunState, limit: int) -> RoundTrace:
        timer = PhaseTimer(self.device)  # the round's phases, read once at its end
        timer.mark("start")
        # 1. Draft: at most `limit` tokens, from the run's drafter (prompt lookup or the draft model).
        draft = run.drafter.propose(run.seq.tokens, limit)
        timer.mark("drafted")
        # 2. Verify: one target call over [last emitted token] + drafts, then the clean head rows.
        committed = len(run.seq.tokens)
        context = self._ids(run.seq.pending(self.target.cached_length(run.target_cache)))
        hidden = self.target.hidden(torch.cat([context, draft.tokens]), run.target_cache)  # [g + 1, H]
        timer.mark("verified")
        clean_logits = self.target.logits(hidden)  # [g + 1, V], fp32: lossless decisions read these
        timer.mark("head")
        # 3. Judge: the lossless test, then the rule (Monte-Carlo paths only where it reads them).
        verification = self._judge(run, draft, hidden, clean_logits, timer)
        # 4. Commit and crop: the accepted drafts and the extra token; caches keep what was accepted.
        verdict = verification.verdict
        emitted = self._commit(run.seq, verification.emitted, run.decode)
        keep = committed + verdict.num_accepted
        self.target.crop(run.target_cache, min(keep, self.target.cached_length(run.target_cache)))
        run.drafter.learn(draft, verdict.num_accepted, keep)
        records = _records(verification.host, verdict.reasons)
        timer.mark("end")
        t = timer.read()
        t_mc = timer.between("mc_start", "mc_end", t)
        reached = verdict.reasons[: verdict.num_accepted + 1]
        run.judge_cost.record(t_mc, acceptance.judged_count(reached), len(reached))
        if run.states is not None:  # outside the round's time: the lab's copy is not the method's cost
            run.states.append(RoundStates.from_tensors(committed, hidden, draft.hidden, verification.host["exact"],
                                                       verification.host.get("coin")))
        # 5. Record.
        return RoundTrace(
            index=len(run.rounds), context_token=run.seq.tokens[committed - 1], drafted=records,
            emitted=tuple(emitted), extra_kind=verdict.next_kind, num_accepted=min(verdict.num_accepted, len(emitted)),
            t_draft=t["drafted"], t_forward=t["verified"] - t["drafted"], t_head=t["head"] - t["verified"],
            t_mc=t_mc, t_round=t["end"], head_rows=hidden.shape[0] + verification.path_rows,
            **_emitted_view(clean_logits[: len(emitted)], emitted), gamma=draft.requested, draft_source=draft.source,
        )

    def _judge(self, run: _RunState, draft: drafting.Draft, hidden: torch.Tensor,
               clean_logits: torch.Tensor, timer: PhaseTimer) -> _Verification:
        """The lossless test at every drafted position, then the one verify step (a batch of one:
        the rule's paths where it reads them, the scan, the extra token), then one device -> host
        copy of everything the records read."""
        decode = run.decode
        gamma = draft.num_drafted
        p_sample = sampling_probs(clean_logits, decode.temperature, decode.top_p)
        test = acceptance.lossless_test(draft.tokens, draft.q_sample, p_sample[:gamma], decode.greedy, run.generator)
        inputs = verifying.VerifyInputs(len(run.seq.tokens), draft.tokens, draft.q_signal, hidden, clean_logits,
                                        test.exact, decode.temperature, run.mask_seed, test.coin, test.p_x, test.q_x,
                                        q_sample=draft.q_sample, p_sample=p_sample)
        verified, = verifying.verify(self.target, run.rule, run.p, [inputs], staged=True, judge=self.judge,
                                     generator=run.generator, timer=timer)
        host = _to_host({**vars(verified.signals), **_tops(draft.q_signal, verified.p_signal, verified.path_probs, gamma)})
        return _Verification(verified.verdict, verified.emitted, host, verified.path_rows)

    def _commit(self, seq: _Sequence, tokens: list[int], decode: DecodeConfig) -> list[int]:
        """Append tokens to the output, cut after a stop token and at max_new_tokens."""
        kept = []
        for token in tokens[: decode.max_new_tokens - len(seq.output)]:
            kept.append(token)
            if token in self.stop_ids:
                break
        seq.output.extend(kept)
        return kept

    # ------------------------------------------------------------ costs

    @property
    def measured_costs(self) -> drafting.StepCosts | None:
        """step_costs if they were measured already, else None (never measures)."""
        return self._costs

    def step_costs(self) -> drafting.StepCosts:
        """gamma = auto's cost model for this pair on this machine, measured on first use."""
        if self._costs is None:
            self._costs = self._measure_costs()
        return self._costs

    @torch.inference_mode()
    def _measure_costs(self, context: int = 32, repeats: int = 3) -> drafting.StepCosts:
        """The best of `repeats` timings, after a context of `context` tokens: one draft step (one
        token in, its logits), and a target call over 1 and AUTO_GAMMA_CAP + 1 positions (with the
        clean logits of every position, as a round computes them)."""
        ids = self._ids([(7 * i + 11) % self.target.vocab_size for i in range(context + AUTO_GAMMA_CAP + 1)])

        def best(model: CausalLM, positions: int, rows: int) -> float:
            cache = model.new_cache()
            model.hidden(ids[:context], cache)
            times = []
            for _ in range(repeats):
                timer = PhaseTimer(self.device)
                timer.mark("start")
                model.logits(model.hidden(ids[context : context + positions], cache)[-rows:])
                timer.mark("end")
                times.append(timer.between("start", "end"))
                model.crop(cache, context)
            return min(times)

        wide = AUTO_GAMMA_CAP + 1
        one, many = best(self.target, 1, 1), best(self.target, wide, wide)
        return drafting.StepCosts(draft_step=best(self.draft, 1, 1), verify_base=one,
                                  verify_per_position=max(many - one, 0.0) / (wide - 1))

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
            output_ids=tuple(output), token_texts=self.decode_tokens(output),
            text=self.tokenizer.decode(shown, skip_special_tokens=True) if self.tokenizer else "", stop_reason=stop_reason,
            t_prefill=t_prefill, t_total=t_total, target_name=self.target.name,
            draft_name=self.draft.name if mode == "sd" else "", t_calibration=t_calibration,
            p_auto_reached=p_auto_reached, first_logprob=first_view["emitted_logprob"][0],
            first_in_nucleus=first_view["emitted_in_nucleus"][0], states=states,
            **dict(zip(("weights", "device", "dtype"), self.computed_by())),
        )


def check_mode(rule: RuleConfig, decode: DecodeConfig) -> None:
    """ConfigError (one line) when the rule is not defined under the run's decoding mode."""
    entry = acceptance.RULES[rule.rule]
    mode = "greedy" if decode.greedy else "sampling"
    if mode not in entry.modes:
        fix = "set a temperature above 0" if decode.greedy else "set the temperature to 0 (greedy)"
        raise ConfigError(f"the rule {rule.rule!r} ({entry.label}) is defined under {' and '.join(entry.modes)} "
                          f"decoding only: {entry.why_mode}; {fix}")


def _emitted_view(logits: torch.Tensor, tokens: list[int]) -> dict[str, tuple]:
    """The clean target's log-probability of each emitted token and whether it lies in its top-p
    0.95 nucleus (temperature 1), from the logits [n, V] the run computed anyway."""
    if not tokens:
        return {"emitted_logprob": (), "emitted_in_nucleus": ()}
    log_probs, in_nucleus = target_view(logits, torch.tensor(tokens, device=logits.device))
    return {"emitted_logprob": tuple(log_probs.tolist()), "emitted_in_nucleus": tuple(in_nucleus.tolist())}


def _tops(q_signal, p_signal, path_probs, gamma: int) -> dict[str, torch.Tensor]:
    """Top TOP_SHOWN (prob, id) of the draft, the clean target and each path, per drafted position;
    path_probs: [(positions [m], probs [K, m, V])] where paths were read (ids -1 elsewhere)."""
    tops = {}
    for name, probs in {"draft": q_signal, "target": p_signal}.items():
        if probs.shape[-1] >= TOP_SHOWN:
            tops[f"{name}_top_p"], tops[f"{name}_top_id"] = probs.topk(TOP_SHOWN, dim=-1)
    if path_probs and path_probs[0][1].shape[-1] >= TOP_SHOWN:
        num_paths = path_probs[0][1].shape[0]
        top_p = q_signal.new_zeros((num_paths, gamma, TOP_SHOWN))
        top_id = torch.full((num_paths, gamma, TOP_SHOWN), -1, dtype=torch.long, device=q_signal.device)
        for positions, probs in path_probs:
            top_p[:, positions], top_id[:, positions] = probs.topk(TOP_SHOWN, dim=-1)
        tops["path_top_p"], tops["path_top_id"] = top_p, top_id
    return tops


def _to_host(tensors: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """Moves many small tensors to the CPU in one copy (one sync on a GPU), dtypes kept; tensors already
    there are returned as they are (packing them into one copy would cost a fifth of a tiny pair's round)."""
    present = {name: t for name, t in tensors.items() if t is not None}
    if all(t.device.type == "cpu" for t in present.values()):
        return dict(tensors)
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in present.values()]).cpu()
    out, offset = dict.fromkeys(tensors), 0
    for name, tensor in present.items():
        out[name] = flat[offset : offset + tensor.numel()].reshape(tensor.shape).to(tensor.dtype)
        offset += tensor.numel()
    return out


def _pairs(ids: torch.Tensor, probs: torch.Tensor) -> tuple[tuple[int, float], ...]:
    return tuple(zip(ids.tolist(), probs.tolist()))


def _records(host: dict, reasons: tuple[str, ...]) -> tuple[DraftedToken, ...]:
    """One DraftedToken per drafted position from the host copies of the round's tensors; path
    fields only where the paths were computed (path token ids are -1 elsewhere)."""
    if not reasons:
        return ()
    value = {name: (t.tolist() if isinstance(t, torch.Tensor) else None) for name, t in host.items()
             if not name.endswith(("_top_p", "_top_id"))}
    records = []
    for i, reason in enumerate(reasons):
        has_paths = value["path_tokens"] is not None and value["path_tokens"][0][i] >= 0
        records.append(DraftedToken(
            token=value["draft_tokens"][i],
            draft_prob=value["draft_prob"][i],
            target_token=value["target_tokens"][i],
            target_token_prob=value["target_token_prob"][i],
            target_prob=value["target_prob"][i],
            js_target=value["js_draft_target"][i],
            reason=reason,
            path_tokens=tuple(row[i] for row in value["path_tokens"]) if has_paths else (),
            js=value["js_draft_centroid"][i] if has_paths else None,
            threshold=value["js_threshold"][i] if has_paths else None,
            majority_token=value["majority_tokens"][i] if has_paths else None,
            majority_votes=value["majority_votes"][i] if has_paths else None,
            draft_votes=value["draft_votes"][i] if has_paths else None,
            judge_score=value["judge_scores"][i] if value.get("judge_scores") is not None else None,
            target_top3_entropy=value["target_top3_entropy"][i],
            coin=value["coin"][i] if value.get("coin") is not None else None,
            target_runner_up=value["target_runner_up"][i] if value.get("target_runner_up") is not None else None,
            target_margin=value["target_margin"][i] if value.get("target_margin") is not None else None,
            draft_top=_pairs(host["draft_top_id"][i], host["draft_top_p"][i]) if "draft_top_id" in host else (),
            target_top=_pairs(host["target_top_id"][i], host["target_top_p"][i]) if "target_top_id" in host else (),
            path_top=tuple(_pairs(host["path_top_id"][k, i], host["path_top_p"][k, i])
                           for k in range(host["path_top_id"].shape[0])) if has_paths and "path_top_id" in host else (),
        ))
    return tuple(records)
