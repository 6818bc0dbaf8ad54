"""DropMatch inside vLLM's V1 model runner (vLLM 0.32; the CPU runner subclasses the GPU one).

`DropMatchRunner` goes before vLLM's runner class in the MRO (register() builds the subclasses) and
changes one thing: after vLLM's rejection sampler has verified a step's drafts, the greedy requests
that asked for a lossy rule are re-verified by the one verify step (server_rounds.verify_rounds), from
the very rows vLLM computed: the target's final hidden states at the verified positions (kept from the
forward pass), its logits there, and the LM head for the K Monte-Carlo paths (`model.compute_logits` on
the judged rows only). Everything else is vLLM's own:
sampled requests, requests asking for logprobs, rule "lossless", and every engine without
`additional_config={"dropmatch": ...}`.

The draft's distributions (the JS rules read them): a lookup draft (method "ngram") is one-hot, as in
our engine; a draft model's (method "draft_model") or an EAGLE-3 head's (method "eagle3", its logits
placed in the target's vocabulary by vLLM, -inf outside the head's) come from the logits of vLLM's greedy
drafting step, kept when it drafts (its tokens unchanged) and turned into distributions only at the
positions judged. Methods that give neither serve only the rules that do not read them.

Nothing of a step is copied: the rows are views of the step's own tensors, which vLLM's rejection
sampler reads without changing (it indexes copies of the logits: vllm/v1/sample/rejection_sampler.py,
0.32). The exact test is greedy's argmax test on those logits, vLLM's own; a re-verified row replaces
vLLM's with the accepted drafts and the target's token after them.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from itertools import accumulate

import torch

from ...decoding.acceptance import RULES
from ...decoding.config import ConfigError
from ...decoding.mc_head import mask_seed, masked_rows
from ...decoding.server_rounds import Round, verify_rounds
from .params import SAMPLING_EPS, edits_target_logits
from .request_counts import attach_step
from .settings import ServeSettings, read_judge, request_settings
from .stats import StatsFile

LOG = logging.getLogger("dropmatch.vllm")
CAPTURED_METHODS = ("draft_model", "eagle3")  # their greedy drafting step is wrapped to keep its logits
ONE_PASS_ENV = "DROPMATCH_VLLM_ONE_PASS"  # "1": one host copy per step, "0": staged; unset: by the device


def one_pass_on(device) -> bool:
    """Whether the verify step judges every drafted position at once with one host copy (off a CPU,
    where each copy is a sync) or staged (fewer head rows; on a CPU a copy costs nothing)."""
    given = os.environ.get(ONE_PASS_ENV, "")
    if given in ("0", "1"):
        return given == "1"
    return torch.device(device).type != "cpu"


class VllmHead:
    """verifying.Head over a vLLM model: path rows go through `compute_logits` (the LM head, gathered
    over tensor-parallel ranks), hidden [n, H] and keep [K, n, H] -> logits [K, n, V]."""

    def __init__(self, model):
        self.model = model

    def path_logits(self, hidden: torch.Tensor, keep: torch.Tensor, p: float, clean_logits: torch.Tensor):
        rows = masked_rows(hidden, keep, p)
        num_paths, n, width = rows.shape
        return self.model.compute_logits(rows.reshape(num_paths * n, width)).float().reshape(num_paths, n, -1)


class DropMatchRunner:
    """The mixin: sample_tokens keeps the hidden rows, _sample re-verifies, propose keeps the draft's
    distributions. Off (vLLM unchanged) unless the engine's additional_config has "dropmatch"."""

    def load_model(self, *args, **kwargs):
        super().load_model(*args, **kwargs)
        given = (self.vllm_config.additional_config or {}).get("dropmatch")
        self.dropmatch = None if given is None else _Verifier.start(self, given)

    def sample_tokens(self, grammar_output):
        verifier = getattr(self, "dropmatch", None)
        if verifier is None:
            return super().sample_tokens(grammar_output)
        state = self.execute_model_state
        verifier.hidden = state.sample_hidden_states if state is not None else None
        verifier.step_reasons = {}
        try:
            output = super().sample_tokens(grammar_output)
        finally:
            verifier.hidden = None
        attach_step(output, verifier.step_reasons)  # the response's per-request counts (request_counts.py)
        return output

    def _sample(self, logits, spec_decode_metadata):
        verifier = getattr(self, "dropmatch", None)
        if verifier is None or spec_decode_metadata is None:
            return super()._sample(logits, spec_decode_metadata)
        work = verifier.collect(self, logits, spec_decode_metadata)  # before vLLM's sampler may edit logits
        output = super()._sample(logits, spec_decode_metadata)
        verifier.rejudge(output, work)
        return output

    def propose_draft_token_ids(self, *args, **kwargs):
        verifier = getattr(self, "dropmatch", None)
        if verifier is None or verifier.draft_steps is None:
            return super().propose_draft_token_ids(*args, **kwargs)
        verifier.draft_steps = []
        drafted = super().propose_draft_token_ids(*args, **kwargs)
        verifier.keep_draft_rows(self, self.input_batch.req_ids)
        return drafted


class _Verifier:
    """What the runner keeps for DropMatch: the engine-wide settings, the head, the hidden rows of
    the step being sampled, the draft's distributions per request, the counters."""

    def __init__(self, runner, settings: ServeSettings, method: str | None, judge=None):
        self.settings = settings
        self.method = method
        self.judge = judge  # the engine's trained judge (trained_judge.TrainedJudge), or None
        self.head = VllmHead(runner.get_model())
        self.one_pass = one_pass_on(runner.device)
        self.hidden = None
        self.draft_steps: list[torch.Tensor] | None = None  # the draft's logits [batch, V], one per drafted position
        self.draft_rows: dict[str, int] = {}  # request id -> its row in those, for the drafts being verified
        self.drafted: list[torch.Tensor] = []  # the draft_steps the drafts being verified came from
        self.per_request: dict[str, ServeSettings | None] = {}  # None: a request whose settings are refused
        self.mask_seeds: dict[str, int] = {}
        self.step_reasons: dict[str, dict[str, int]] = {}  # this step's reasons per re-verified request
        # Under tensor parallelism every rank re-verifies the same rows (same masks, gathered logits) and
        # emits the same tokens; one of them counts, or /metrics would count each token once per rank.
        self.stats = StatsFile.for_this_process() if _counting_rank() else None
        self.warned: set[str] = set()

    @classmethod
    def start(cls, runner, given: dict) -> "_Verifier":
        try:
            settings = ServeSettings().updated(given, engine=True)
        except ConfigError as error:
            raise ValueError(f"additional_config['dropmatch']: {error}") from None
        spec = runner.speculative_config
        method = spec.method if spec is not None else None
        verifier = cls(runner, settings, method, _fitting_judge(settings, runner.model_config.get_hidden_size()))
        if method in CAPTURED_METHODS:
            verifier.capture_drafts(runner.drafter)
        elif method != "ngram" and RULES[settings.rule.rule].reads_draft:
            raise ValueError(f"DropMatch's rule {settings.rule.rule!r} reads the draft's distribution, which "
                             f"speculative method {method!r} does not give; use method 'ngram', 'draft_model' or "
                             "'eagle3', or a rule that reads none (majority, naive, typical)")
        LOG.info("DropMatch on: rule %s, p %s, K %d (method %s; verify %s)", settings.rule.rule, settings.rule.p,
                 settings.rule.num_paths, method, "in one pass" if verifier.one_pass else "staged")
        if method in CAPTURED_METHODS:
            LOG.info("%s", memory_line(runner.model_config.get_vocab_size(), spec.num_speculative_tokens,
                                       runner.scheduler_config.max_num_seqs))
        return verifier

    def capture_drafts(self, drafter) -> None:
        """Wraps the drafter's greedy step (vLLM's SpecDecodeBaseProposer._greedy_sample, the draft model's and
        EAGLE-3's): the same argmax tokens, and its logits over the target's vocabulary kept."""
        if getattr(drafter, "use_local_argmax_reduction", False) or getattr(drafter, "use_heterogeneous_vocab", False):
            raise ValueError("DropMatch needs the drafter's full logits: turn off local argmax reduction "
                             "and use a draft with the target's vocabulary")
        self.draft_steps = []

        def greedy_sample(hidden_states: torch.Tensor) -> torch.Tensor:
            logits = drafter.model.compute_logits(hidden_states)
            self.draft_steps.append(logits)
            return logits.argmax(dim=-1)

        drafter._greedy_sample = greedy_sample

    def keep_draft_rows(self, runner, req_ids: list) -> None:
        """After a propose: the rows of the draft's logits that a rule will read (the greedy DropMatch
        requests whose rule reads the draft's distribution), copied out of the step's tensors, which are
        then let go; and which kept row is whose."""
        steps, self.draft_steps = self.draft_steps, []
        rows = steps[0].shape[0] if steps else 0
        wanted = [(row, req_id) for row, req_id in enumerate(req_ids[:rows]) if self.reads_draft(runner, req_id)]
        self.draft_rows = {req_id: kept for kept, (_, req_id) in enumerate(wanted)}
        self.drafted = []
        if wanted:
            index = torch.tensor([row for row, _ in wanted], device=steps[0].device)
            self.drafted = [step.index_select(0, index) for step in steps]

    def reads_draft(self, runner, req_id: str) -> bool:
        settings = self.request(runner, req_id)
        return settings is not None and RULES[settings.rule.rule].reads_draft

    # ------------------------------------------------------------ one step

    def collect(self, runner, logits: torch.Tensor, metadata) -> list:
        """The requests of this step to re-verify: (batch row, request id, settings, Round)."""
        if self.hidden is None:  # a vLLM path that samples without sample_tokens: nothing to re-verify from
            self._warn("no-hidden", "DropMatch: this step's hidden states were not kept; verified losslessly")
            return []
        batch = runner.input_batch
        work = []
        cu_drafts = list(accumulate(metadata.num_draft_tokens))  # cu_num_draft_tokens, from the host's list
        for row, (req_id, drafted) in enumerate(zip(batch.req_ids, metadata.num_draft_tokens)):
            settings = self.request(runner, req_id)
            if settings is None or drafted == 0:
                continue
            first_draft = cu_drafts[row] - drafted
            draft_tokens = metadata.draft_token_ids[first_draft:first_draft + drafted].long()
            found, draft_logits = self.draft_logits(req_id, drafted)
            if not found:
                continue
            if req_id not in self.mask_seeds:
                self.mask_seeds[req_id] = mask_seed(settings.seed, runner.requests[req_id].prompt_token_ids or [])
            rows = slice(first_draft + row, first_draft + row + drafted + 1)  # each request's drafts, then a bonus row
            work.append((row, req_id, settings, Round(
                int(batch.num_tokens_no_spec[row]), draft_tokens, draft_logits, self.hidden[rows], logits[rows],
                self.mask_seeds[req_id])))
        return work

    def request(self, runner, req_id: str) -> ServeSettings | None:
        """The request's settings where DropMatch verifies it; None where vLLM's own sampler does (or it is gone)."""
        params = getattr(runner.requests.get(req_id), "sampling_params", None)
        if params is None or params.temperature >= SAMPLING_EPS or params.logprobs is not None:
            return None
        if edits_target_logits(params):  # refused at admission (params.py); vLLM's own verdict if it slips through
            self._warn(req_id, f"request {req_id}: asks what a lossy rule cannot serve (params.UNSERVED); "
                               "verified losslessly")
            return None
        if req_id not in self.per_request:
            try:
                self.per_request[req_id] = self.settings.updated(request_settings(params.extra_args))
            except ConfigError as error:  # validated at admission (params.py); kept lossless if it slips through
                self._warn(req_id, f"request {req_id}: {error}; verified losslessly")
                self.per_request[req_id] = None
        settings = self.per_request[req_id]
        return None if settings is None or settings.lossless else settings

    def draft_logits(self, req_id: str, drafted: int) -> tuple[bool, tuple | None]:
        """(whether the request can be judged, its draft's logits rows [V] at the drafted positions,
        None for a lookup draft whose distribution is one-hot, or where the rule reads none)."""
        settings = self.per_request[req_id]
        if not RULES[settings.rule.rule].reads_draft or self.method == "ngram":
            return True, None  # Round's one-hot stand-in: no check of this rule reads it, or it is the lookup draft's
        row = self.draft_rows.get(req_id)  # kept where the method's drafting step is captured (CAPTURED_METHODS)
        if row is not None and len(self.drafted) >= drafted:
            return True, tuple(step[row] for step in self.drafted[:drafted])
        why = ("no draft distribution kept for this step" if self.method in CAPTURED_METHODS else f"rule "
               f"{settings.rule.rule!r} reads the draft's distribution, which method {self.method!r} does not give")
        self._warn(req_id, f"request {req_id}: {why}; verified losslessly")
        return False, None

    def rejudge(self, output, work: list) -> None:
        """Writes each re-verified request's row of output.sampled_token_ids: its accepted drafts, then
        the target's token after them, then vLLM's placeholder (-1)."""
        if len(self.per_request) > 4096:  # finished requests' settings (parsed again if still running)
            self.per_request.clear()
            self.mask_seeds.clear()
            self.warned.clear()
        if not work:
            return
        sampled = output.sampled_token_ids
        by_rule: dict = {}
        for row, req_id, settings, round_ in work:
            by_rule.setdefault(settings.rule, []).append((row, req_id, round_))
        rows, lines = [], []
        for rule, items in by_rule.items():
            if rule.uses_judge:
                rule = self.judge.filled(rule)  # the judge's validation-chosen threshold where the request set none
            found = verify_rounds(self.head, rule, [round_ for _, _, round_ in items], self.one_pass, self.judge)
            for (row, req_id, _), verified in zip(items, found):
                rows.append(row)
                lines.append(verified.emitted + [-1] * (sampled.shape[1] - len(verified.emitted)))
                self.step_reasons[req_id] = dict(Counter(verified.verdict.reasons))
                if self.stats is not None:
                    self.stats.add(verified.verdict.reasons)
        # every rewritten row in one copy to the device
        sampled[torch.tensor(rows, device=sampled.device)] = torch.tensor(lines, dtype=sampled.dtype, device=sampled.device)
        if self.stats is not None:
            self.stats.write_soon()

    def _warn(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            LOG.warning(message)


def memory_line(vocab_size: int, gamma: int, max_requests: int) -> str:
    """The start log's line: the memory the plugin holds outside vLLM's profile (the draft's logits rows
    of the greedy DropMatch requests whose rule reads them, float32 per drafted token)."""
    per_token = vocab_size * 4
    most = per_token * gamma * max_requests
    return (f"DropMatch keeps the draft model's logits of each greedy DropMatch request whose rule reads them: "
            f"{per_token / 1e3:.0f} kB per drafted token, {per_token * gamma / 1e6:.2f} MB per request at gamma "
            f"{gamma}; at most {most / 1e6:.0f} MB for {max_requests} requests, outside vLLM's memory profile")


def _fitting_judge(settings: ServeSettings, hidden_size: int):
    """The engine's judge (None where it names none); ValueError (one line) unless it reads this
    model's hidden size (its own name is the Studio's label of the model, which vLLM does not know)."""
    if settings.judge is None:
        return None
    judge = read_judge(settings.judge)
    if judge.hidden_size != hidden_size:
        raise ValueError(f"additional_config['dropmatch']['judge']: this judge was trained on {judge.target} (hidden "
                         f"size {judge.hidden_size}); this model's hidden size is {hidden_size}")
    LOG.info("DropMatch's judge: %s, trained on %s, threshold %.3f", settings.judge, judge.target, judge.threshold)
    return judge


def _counting_rank() -> bool:
    """Whether this worker is the first rank of its tensor-parallel group (the one that counts)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0
    except (ImportError, AssertionError, AttributeError):  # no parallel group set up: a single worker
        return True
