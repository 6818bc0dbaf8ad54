"""The serving side without vLLM: a batch's verification is each request's own verify step
(serving/verify.py), the settings a request may give, the check at admission, the counters."""

from __future__ import annotations

import dataclasses
import json
import sys
from types import SimpleNamespace

import pytest
import torch

from dropmatch.decoding import acceptance, verifying
from dropmatch.decoding.config import ConfigError, RuleConfig
from dropmatch.decoding import mc_head
from dropmatch.decoding.mc_head import mask_seed
from dropmatch.decoding.sampling import sampling_probs, signal_probs
from dropmatch.decoding.server_rounds import Round, verify_rounds
from dropmatch.serving.vllm.params import check_request
from dropmatch.serving.vllm.settings import ServeSettings, request_settings
from dropmatch.serving.vllm.stats import StatsFile, read_counts
from judges import judge_dict, random_judge
import reference_rules


def rounds_of(target, num_requests: int = 6, gamma: int = 4, seed: int = 0,
              second_at: tuple[int, ...] = ()) -> list[Round]:
    """Rounds of several sequences of different lengths, their drafts the target's own top tokens with
    every other one (or those at second_at) replaced by its second choice (so the exact test rejects some,
    the rule judges them)."""
    generator = torch.Generator().manual_seed(seed)
    made = []
    for i in range(num_requests):
        prompt = torch.randint(3, 60, (1, max(5 + 3 * i, gamma + 2)), generator=generator).to(target.device)
        hidden = target.hidden(prompt[0], target.new_cache())[-(gamma + 1):]  # [gamma + 1, H]
        logits = target.logits(hidden)
        top2 = logits.topk(2, dim=-1).indices
        second = (torch.arange(gamma) % 2 == 1) if not second_at else torch.isin(torch.arange(gamma),
                                                                                   torch.tensor(second_at))
        second = second.to(target.device)
        draft = torch.where(second, top2[:gamma, 1], top2[:gamma, 0])
        draft_logits = logits[:gamma] + torch.randn(logits[:gamma].shape, generator=generator).to(target.device)
        made.append(Round(int(prompt.shape[1]) - gamma, draft, draft_logits, hidden, logits,
                          mask_seed(seed, prompt[0].tolist())))
    return made


def path_logits_of(head, rule, inputs: verifying.VerifyInputs) -> torch.Tensor | None:
    """[K, g, V] the dropout paths' logits at every drafted position, each with its own keyed masks (the
    product's randomness, drawn here as a server draws it); None for a rule that reads no paths."""
    if not rule.uses_paths:
        return None
    g = inputs.num_drafted
    if rule.p == 0.0:  # every path is the clean row
        return inputs.clean_logits[:g].unsqueeze(0).expand(rule.num_paths, *inputs.clean_logits[:g].shape)
    keys = [(inputs.mask_seed, inputs.first_position + i) for i in range(g)]
    keep = mc_head.keyed_masks(keys, rule.num_paths, rule.p, inputs.hidden.shape[-1], inputs.hidden.device,
                               inputs.hidden.dtype, rule.mask_draw)
    return head.path_logits(inputs.hidden[:g], keep, rule.p, inputs.clean_logits[:g])


def oracle_round(head, rule, inputs: verifying.VerifyInputs, judge=None) -> reference_rules.Round:
    """What the oracle reads of a round: the raw inputs, the paths' logits, the judge's scores."""
    g = inputs.num_drafted
    scores = judge.scores(inputs.hidden[1: g + 1]) if rule.uses_judge else None
    return reference_rules.Round(inputs.draft_tokens, inputs.q_signal, inputs.clean_logits, inputs.temperature,
                                 inputs.q_sample, inputs.p_sample, path_logits_of(head, rule, inputs), scores,
                                 inputs.coin, inputs.draft_source)


def by_definition(head, rule, round_: Round, judge=None) -> acceptance.Verdict:
    """A round's verdict by the oracle (tests/reference_rules.py: the definitions, no product decision code)."""
    return reference_rules.decide_round(rule, oracle_round(head, rule, round_.verify_inputs(), judge))


RULES_SERVED = [RuleConfig("dropmatch", p=0.3), RuleConfig("dropmatch", p=0.0),
                RuleConfig("majority", p=0.4, majority_fraction=0.6), RuleConfig("naive", p=0.2),
                RuleConfig("fixed_js", fixed_js_threshold=0.5), RuleConfig("typical", typical_eps=0.3),
                RuleConfig("dropmatch", p=0.3, mask_draw="counter"), RuleConfig("mars", mars_threshold=0.5)]


@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("rule", RULES_SERVED)
def test_a_batch_decides_what_the_definition_decides_for_each_request(tiny_engine, rule, one_pass):
    """The one verify step over a batch (staged, or every position in one pass) gives each request the
    verdict of the definition (every position's signals, then the scan), and emits its accepted drafts
    then the token after them: the row a server writes."""
    rounds = rounds_of(tiny_engine.target, num_requests=8)
    verified = verify_rounds(tiny_engine.target, rule, rounds, one_pass)
    for round_, found in zip(rounds, verified):
        assert found.verdict == by_definition(tiny_engine.target, rule, round_)
        assert found.emitted == round_.draft_tokens[:found.verdict.num_accepted].tolist() + [found.verdict.next_token]
    assert sum(found.path_rows for found in verified) > 0 or not rule.uses_paths or rule.p == 0.0


def sampled_inputs(round_: Round, coin_seed: int, temperature: float = 1.0,
                   top_p: float = 1.0) -> verifying.VerifyInputs:
    """A round as a sampled run hands it to the verify step: the lossless test drawn with its own seeded coins,
    the distributions its extra token is drawn from (temperature, then top-p)."""
    q_sample = sampling_probs(round_.draft_logits, temperature, top_p)
    p_sample = sampling_probs(round_.clean_logits, temperature, top_p)
    g = round_.num_drafted
    test = acceptance.lossless_test(round_.draft_tokens, q_sample, p_sample[:g], False,
                                    torch.Generator().manual_seed(coin_seed))
    return verifying.VerifyInputs(round_.first_position, round_.draft_tokens,
                                  signal_probs(round_.draft_logits, temperature), round_.hidden, round_.clean_logits,
                                  test.exact, temperature, round_.mask_seed, test.coin, test.p_x, test.q_x, q_sample,
                                  p_sample, top_p=top_p)


def defined_sampled(head, rule, inputs: verifying.VerifyInputs, seed: int, judge=None) -> acceptance.Verdict:
    """The sampled verdict by the oracle, on the same coins, its extra token drawn from a generator seeded as
    the verify step's."""
    return reference_rules.decide_round(rule, oracle_round(head, rule, inputs, judge),
                                        torch.Generator().manual_seed(seed))


# Where each rule accepts some mismatches on these rounds.
KNOBS_AT = {"majority_fraction": 0.5, "typical_eps": 0.3, "fixed_js_threshold": 0.3,
            "fly_entropy_threshold": 0.05, "ensemble_weight": 0.3, "mars_threshold": 0.5}


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("name", list(acceptance.RULES))
def test_verify_decides_what_the_oracle_decides_for_every_rule_greedy_and_sampled(tiny_engine, name, greedy):
    """Every rule of the table, under each mode it is defined in: the one verify step's verdict (reasons,
    extra token) equals the oracle's (tests/reference_rules.py) on the same inputs, the sampled one with the
    same seeded draws; and every lossy rule accepts some mismatch here, so its checks are compared acting."""
    # Sampled, the coin accepts most second choices here: the majority then rescues the top tokens it rejected.
    knobs = {**KNOBS_AT, "p": 0.7 if greedy else (0.1 if name == "majority" else 0.5), "judge_threshold": 0.5,
             "rescue_argmax": not greedy and name == "majority"}
    rule = RuleConfig(name, **{key: value for key, value in knobs.items()
                               if key in {knob.name for knob in acceptance.RULES[name].knobs}})
    if ("greedy" if greedy else "sampling") not in acceptance.RULES[name].modes:
        pytest.skip(f"{name} is not defined under {'greedy' if greedy else 'sampling'} decoding")
    head = tiny_engine.target
    judge = random_judge(head.hidden_size) if rule.uses_judge else None
    # FLy's window needs runs of exact drafts: one second choice per round, early enough for the window
    rounds = rounds_of(head, num_requests=24, gamma=8, second_at=(1,)) if name == "fly" else \
        rounds_of(head, num_requests=24)
    decided = []
    for i, round_ in enumerate(rounds):
        if greedy:
            found, = verifying.verify(head, rule, [round_.verify_inputs()], judge=judge)
            assert found.verdict == by_definition(head, rule, round_, judge)
        else:
            inputs = sampled_inputs(round_, coin_seed=i)
            found, = verifying.verify(head, rule, [inputs], generator=torch.Generator().manual_seed(100 + i),
                                      judge=judge)
            assert found.verdict == defined_sampled(head, rule, inputs, 100 + i, judge)
        decided += found.verdict.reasons
    assert acceptance.RULES[name].checks == () or \
        any(reason in acceptance.RULES[name].checks for reason in decided), f"{name} accepted no mismatch here"


@pytest.mark.parametrize("name", [name for name, rule in acceptance.RULES.items() if "sampling" in rule.modes])
def test_under_temperature_and_top_p_verify_decides_what_the_oracle_decides(tiny_engine, name):
    """Sampled at temperature 0.7 and top-p 0.8, where MARS and FLy read the target as the sampler processes
    it: the verify step's verdicts equal the oracle's, for every rule defined under sampling."""
    knobs = {**KNOBS_AT, "p": 0.5, "judge_threshold": 0.5}
    rule = RuleConfig(name, **{key: value for key, value in knobs.items()
                               if key in {knob.name for knob in acceptance.RULES[name].knobs}})
    head = tiny_engine.target
    judge = random_judge(head.hidden_size) if rule.uses_judge else None
    gamma, second_at = (8, (1,)) if name == "fly" else (4, ())
    for i, round_ in enumerate(rounds_of(head, num_requests=12, gamma=gamma, second_at=second_at)):
        inputs = sampled_inputs(round_, coin_seed=i, temperature=0.7, top_p=0.8)
        found, = verifying.verify(head, rule, [inputs],
                                  generator=torch.Generator().manual_seed(100 + i), judge=judge)
        assert found.verdict == defined_sampled(head, rule, inputs, 100 + i, judge)


@pytest.mark.parametrize("rule", [RuleConfig("dropmatch", p=0.3), RuleConfig("majority", p=0.4, majority_fraction=0.6)])
def test_staging_reads_fewer_head_rows_than_one_pass(tiny_engine, rule):
    """Staged, the paths run only at the positions the rule reads; in one pass at every drafted one."""
    rounds = rounds_of(tiny_engine.target, num_requests=8)
    staged = sum(found.path_rows for found in verify_rounds(tiny_engine.target, rule, rounds))
    everywhere = sum(found.path_rows for found in verify_rounds(tiny_engine.target, rule, rounds, one_pass=True))
    assert 0 < staged < everywhere == rule.num_paths * sum(round_.num_drafted for round_ in rounds)


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts the tensor operations that read a value on the host (a sync on an accelerator)."""

    READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy", "cpu"}

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def counts(self, frame) -> bool:
        """Whether a read made from this caller's frame counts (every one here; a subclass may narrow it)."""
        return True

    def entry(self, name: str, frame) -> str:
        """What a counted read is kept as: its operation's name."""
        return name

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        to_host = name == "to" and "cpu" in map(str, [*args[1:], *(kwargs or {}).values()])
        frame = sys._getframe(1)
        if (name in self.READS or to_host) and self.counts(frame):
            self.reads.append(self.entry(name, frame))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rule", [RuleConfig("dropmatch", p=0.3), RuleConfig("majority", p=0.4, majority_fraction=0.6)])
def test_one_pass_reads_the_device_once_for_the_whole_batch(tiny_engine, rule, monkeypatch):
    """One pass is an accelerator's way: there the paths are never computed sparsely (a CPU's fp32 choice, whose
    count of dropped entries is a host read that is free on a CPU), so the test takes the accelerator's path choice
    on whatever CPU runs it (with or without native bf16)."""
    monkeypatch.setattr(tiny_engine.target, "_sparse_possible", lambda: False)
    rounds = rounds_of(tiny_engine.target, num_requests=8)
    for round_ in rounds:  # the inputs a server hands over, computed before the verify step
        round_.q_signal
    with HostReads() as one_pass:
        verify_rounds(tiny_engine.target, rule, rounds, one_pass=True)
    with HostReads() as staged:
        verify_rounds(tiny_engine.target, rule, rounds)
    assert one_pass.reads == ["tolist"]
    assert len(staged.reads) > 1  # what it replaces: a read per stage


@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("name", ["judge", "dropmatch_judge"])
def test_the_judge_rules_decide_in_a_batch_what_the_engines_judge_step_decides(tiny_engine, name, one_pass):
    """The trained judge's rules served: each request's verdict is the definition's with the same judge,
    which reads the target's hidden state on reading each drafted token."""
    judge = random_judge(int(tiny_engine.target.hidden_size), seed=1, threshold=0.6)
    rule = RuleConfig(name, p=0.3, judge_threshold=0.6)
    rounds = rounds_of(tiny_engine.target, num_requests=8)
    reasons = set()
    for round_, found in zip(rounds, verify_rounds(tiny_engine.target, rule, rounds, one_pass, judge)):
        assert found.verdict == by_definition(tiny_engine.target, rule, round_, judge)
        reasons.update(found.verdict.reasons)
    assert "judge" in reasons and "rejected" in reasons  # the judge decided both ways


def test_the_judge_rules_need_the_engines_judge_file_and_a_bad_one_is_refused_in_one_line(tmp_path):
    good, bad = tmp_path / "judge.json", tmp_path / "bad.json"
    good.write_text(json.dumps(judge_dict(16)))
    bad.write_text('{"format": "something else"}')
    with pytest.raises(ConfigError, match="reads a trained judge: start the engine with one"):
        ServeSettings().updated({"rule": "judge"}, engine=True)
    engine = ServeSettings().updated({"rule": "dropmatch", "judge": str(good)}, engine=True)
    assert engine.updated({"rule": "judge", "judge_threshold": 0.3}).rule.judge_threshold == 0.3
    with pytest.raises(ConfigError, match="the engine's setting"):
        engine.updated({"judge": str(good)})  # a request may not name a file on the server
    with pytest.raises(ConfigError) as refused:
        ServeSettings().updated({"rule": "judge", "judge": str(bad)}, engine=True)
    assert str(refused.value).startswith("judge: ") and "is not a judge file" in str(refused.value)
    assert "\n" not in str(refused.value)
    check_request(SimpleNamespace(temperature=0.0, extra_args={"dropmatch_rule": "dropmatch_judge"}),
                  {"rule": "dropmatch", "judge": str(good)})  # admitted: the engine has a judge
    with pytest.raises(ValueError, match="reads a trained judge"):
        check_request(SimpleNamespace(temperature=0.0, extra_args={"dropmatch_rule": "judge"}), {"rule": "dropmatch"})


def test_a_request_may_ask_for_the_counter_mask_draw_and_a_bad_draw_is_refused_in_one_line():
    """mask_draw is a rule setting like the others: engine-wide or per request (flat over HTTP), checked
    once with one line."""
    engine = ServeSettings().updated({"rule": "dropmatch", "p": 0.2}, engine=True)
    assert engine.rule.mask_draw == "per_position"
    assert engine.updated({"mask_draw": "counter"}).rule.mask_draw == "counter"
    asked = engine.updated(request_settings({"dropmatch_mask_draw": "counter"}))
    assert asked.rule.mask_draw == "counter" and asked.rule.p == 0.2
    with pytest.raises(ConfigError) as refused:
        engine.updated({"mask_draw": "philox"})
    assert str(refused.value) == "mask draw must be one of per_position, counter, got 'philox'"


def test_a_lossy_acceptance_mid_round_is_followed_by_the_rest_of_the_round(tiny_engine):
    """After the rule accepts a position the exact test rejected, the later ones are judged too."""
    rule = RuleConfig("fixed_js", fixed_js_threshold=0.5)
    rounds = rounds_of(tiny_engine.target)
    continued = 0
    for round_, found in zip(rounds, verify_rounds(tiny_engine.target, rule, rounds)):
        verdict = found.verdict
        assert verdict == by_definition(tiny_engine.target, rule, round_)
        continued += "fixed_js" in verdict.reasons[:-1] and verdict.reasons[-1] != "unchecked"
    assert continued > 0


@pytest.mark.parametrize("one_pass", [False, True])
def test_at_p0_a_batch_verifies_losslessly(tiny_engine, one_pass):
    """Every path is the clean row: greedy verdicts accept exactly the argmax prefix."""
    rounds = rounds_of(tiny_engine.target)
    for round_, found in zip(rounds, verify_rounds(tiny_engine.target, RuleConfig("dropmatch", p=0.0), rounds, one_pass)):
        argmax = round_.clean_logits.argmax(-1)
        matches = (argmax[: len(round_.draft_tokens)] == round_.draft_tokens).tolist() + [False]
        assert found.verdict.num_accepted == matches.index(False)
        assert found.verdict.next_token == int(argmax[found.verdict.num_accepted])


@pytest.mark.parametrize("one_pass", [False, True])
def test_a_requests_verification_does_not_depend_on_its_batch(tiny_engine, one_pass):
    """The same request judged beside others, beside other others or alone: the same verdict and the same
    signals (each position keyed by its own request's masks)."""
    rule = RuleConfig("dropmatch", p=0.3)
    rounds, others = rounds_of(tiny_engine.target), rounds_of(tiny_engine.target, seed=5)
    first = verify_rounds(tiny_engine.target, rule, rounds, one_pass)
    mixed = verify_rounds(tiny_engine.target, rule, [others[0], rounds[2], others[3], rounds[4]], one_pass)
    for in_batch, (index, round_) in zip((mixed[1], mixed[3]), ((2, rounds[2]), (4, rounds[4]))):
        alone, = verify_rounds(tiny_engine.target, rule, [round_], one_pass)
        assert in_batch.verdict == first[index].verdict == alone.verdict
        for name, value in vars(in_batch.signals).items():
            expected = getattr(alone.signals, name)
            assert (value is None) == (expected is None), name
            if value is not None:
                assert torch.allclose(value.float(), expected.float(), atol=1e-6, equal_nan=True), name


def test_settings_apply_over_the_engines_and_refuse_bad_ones_in_one_line():
    engine = ServeSettings().updated({"rule": "majority", "p": 0.2, "k": 7})
    assert (engine.rule.rule, engine.rule.p, engine.rule.num_paths) == ("majority", 0.2, 7)
    assert engine.updated({"p": 0.1}).rule.num_paths == 7
    assert ServeSettings().rule.rule == "dropmatch" and ServeSettings().rule.p == 0.3
    for bad, words in [({"p": 2}, "p (dropout rate) must be in [0, 1)"), ({"p": "auto"}, "give p as a number"),
                       ({"tau": 1}, "unknown DropMatch setting 'tau'"), ({"rule": "magic"}, "unknown rule"),
                       ({"seed": "x"}, "seed must be an integer"), ({"k": 0}, "K (paths)"),
                       ({"rule": "judge"}, "reads a trained judge: start the engine with one"),
                       ({"rule": "dropmatch_judge"}, "reads a trained judge")]:
        with pytest.raises(ConfigError, match=None) as raised:
            ServeSettings().updated(bad)
        assert words in str(raised.value) and "\n" not in str(raised.value)


def test_a_request_gives_settings_nested_or_flat_not_both():
    assert request_settings({"dropmatch": {"p": 0.1}}) == {"p": 0.1}
    assert request_settings({"dropmatch_p": 0.1, "other": 1}) == {"p": 0.1}
    assert request_settings({"other": 1}) is None and request_settings(None) is None
    with pytest.raises(ConfigError, match="not both"):
        request_settings({"dropmatch": {"p": 0.1}, "dropmatch_k": 3})


GREEDY = dict(temperature=0.0, extra_args=None, logprobs=None, prompt_logprobs=None, logit_bias=None, min_tokens=0,
              bad_words=None, allowed_token_ids=None, structured_outputs=None, presence_penalty=0.0,
              frequency_penalty=0.0, repetition_penalty=1.0, watermarking=None)
ASKS = {"temperature > 0": {"temperature": 0.8}, "logprobs": {"logprobs": 2}, "logit_bias": {"logit_bias": {5: 2.0}},
        "min_tokens": {"min_tokens": 3}, "bad_words": {"bad_words": ["x"]}, "allowed_token_ids": {"allowed_token_ids": [1]},
        "structured outputs": {"structured_outputs": object()}, "penalties": {"repetition_penalty": 1.2}}
LOSSY_ENGINE = {"rule": "dropmatch", "p": 0.3}


def request(**given) -> SimpleNamespace:
    return SimpleNamespace(**{**GREEDY, **given})


@pytest.mark.parametrize("asks", list(ASKS))
def test_what_a_lossy_rule_cannot_serve_is_refused_in_one_line_and_served_when_lossless(asks):
    with pytest.raises(ValueError, match=rf"^DropMatch: rule 'dropmatch' cannot serve a request with {asks}: [^\n]+$"):
        check_request(request(**ASKS[asks]), LOSSY_ENGINE)  # the engine's own rule, the request asks nothing of it
    check_request(request(**ASKS[asks], extra_args={"dropmatch_rule": "lossless"}), LOSSY_ENGINE)
    check_request(request(**ASKS[asks]), {"rule": "lossless"})  # a lossless engine serves it
    check_request(request(**ASKS[asks]), None)  # and so does an engine without DropMatch
    with pytest.raises(ValueError, match="rule 'majority' cannot serve"):
        check_request(request(**ASKS[asks], extra_args={"dropmatch_rule": "majority"}), {"rule": "lossless"})


def test_admission_reads_the_engines_settings_under_the_requests():
    check_request(request(), LOSSY_ENGINE)
    check_request(request(extra_args={"dropmatch_k": 3}), LOSSY_ENGINE)
    with pytest.raises(ValueError, match="^DropMatch: p"):
        check_request(request(extra_args={"dropmatch_p": -1}), LOSSY_ENGINE)
    with pytest.raises(ValueError, match="^DropMatch: this engine was started without DropMatch"):
        check_request(request(extra_args={"dropmatch_rule": "majority"}), None)
    check_request(request(extra_args={"dropmatch_rule": "lossless"}), None)
    with pytest.raises(ValueError, match="^DropMatch: unknown DropMatch setting"):
        check_request(request(), {"rule": "dropmatch", "q": 1})


def test_the_counters_of_all_workers_add_up(tmp_path):
    for name, reasons in (("worker-1.json", ["exact", "majority", "rejected"]), ("worker-2.json", ["exact", "js"])):
        stats = StatsFile(tmp_path / name)
        stats.add(reasons)
        stats.write()
    (tmp_path / "worker-3.json").write_text("{trunc")  # a worker mid-write is read next time
    assert read_counts(tmp_path) == {"exact": 2, "majority": 1, "rejected": 1, "js": 1}


def test_a_step_without_kept_hidden_states_is_left_to_vllms_sampler(caplog):
    from types import SimpleNamespace

    from dropmatch.serving.vllm.runner import _Verifier

    verifier = _Verifier.__new__(_Verifier)  # no vLLM here: only the state collect() reads
    verifier.hidden, verifier.warned = None, set()
    metadata = SimpleNamespace(num_draft_tokens=[2], cu_num_draft_tokens=torch.tensor([2]),
                               draft_token_ids=torch.tensor([5, 6]))
    with caplog.at_level("WARNING", logger="dropmatch.vllm"):
        assert verifier.collect(None, torch.zeros(3, 10), metadata) == []
        assert verifier.collect(None, torch.zeros(3, 10), metadata) == []
    assert [record.message for record in caplog.records] == [
        "DropMatch: this step's hidden states were not kept; verified losslessly"]


def test_the_vllm_benchmark_runs_every_rate_on_the_plugins_engine_and_refuses_bad_rates():
    import vllm_bench as bench

    args = bench.parse_args(["--p", "0,0.1,0.25", "--concurrency", "4", "--repeats", "3"])
    jobs = bench.jobs_for(4, args, {"concurrency": 4, "repeats": args.repeats})
    assert [[variant["name"] for variant in job["variants"]] for job in jobs] == [
        ["none"], ["vllm"], ["plugin_p0", "dropmatch_p0.1", "dropmatch_p0.25"]]
    assert [job["plugin"] for job in jobs] == [False, False, True]
    assert jobs[2]["variants"][2]["dropmatch"] == {"rule": "dropmatch", "p": 0.25}
    for bad in ("0.1,x", "1.0", "-0.1", ""):
        with pytest.raises(SystemExit):
            bench.parse_args(["--p", bad])


def test_the_vllm_table_gives_the_median_speed_with_its_range_and_flags_unequal_repeats():
    import vllm_bench as bench

    run = {"concurrency": 4, "name": "vllm", "tokens_per_s": 20.0, "tokens_per_s_runs": [19.0, 20.0, 23.5],
           "tokens_per_s_vs_vllm": 1.0, "acceptance": 0.2, "tau": 1.8, "identical_to_no_speculation": 2,
           "outputs": [[1], [2]], "target_nll": 0.5, "off_nucleus_rate": 0.0, "distinct2": 0.9, "band": {},
           "repeats_identical": True}
    reference = {"temperature": 0.7, "top_p": 0.95, "target_nll": 0.6, "off_nucleus_rate": 0.0, "distinct2": 0.9}
    assert "| 4 | vllm | 20.0 (19.0-23.5) | 1.00x |" in bench.table({"runs": [run], "reference": reference})
    run["repeats_identical"] = False
    assert "(repeats differ!)" in bench.table({"runs": [run], "reference": reference})


def test_the_counters_reach_the_file_soon_without_the_step_writing_it(tmp_path):
    """write_soon only signals: the writer thread puts the counts in the file (waited for up to 60 s,
    1,200 of its 50 ms periods: a guard against a writer that never writes, not a timing)."""
    from local_server import wait_for

    stats = StatsFile(tmp_path / "worker-1.json", every=0.05)
    stats.add(["exact", "js"])
    stats.write_soon()
    stats.add(["js"])
    stats.write_soon()
    assert wait_for(lambda: read_counts(tmp_path) == {"exact": 1, "js": 2}, timeout_s=60, poll_s=0.02), read_counts(tmp_path)
    assert stats.writer is not None and stats.writer.daemon


def test_rounds_of_engine_processes_merge_into_one_run_and_pair_their_ratios():
    """--rounds: a variant's processes give one run (median speed, every run kept, outputs checked
    across processes), and its ratio to vLLM's SD is the median of the per-round ratios."""
    import vllm_bench as bench

    def process(speed, outputs=((1, 2),)):
        return {"tokens_per_s": speed, "tokens_per_s_runs": [speed - 1, speed], "wall_s": [1.0, 1.0],
                "outputs": [list(o) for o in outputs], "repeats_identical": True, "acceptance": 0.2, "tau": 1.6}

    vllm = bench.merged([process(10.0), process(20.0), process(12.0)])
    plugin = bench.merged([process(9.0), process(21.0), process(11.4)])
    assert vllm["tokens_per_s"] == 12.0 and vllm["tokens_per_s_rounds"] == [10.0, 20.0, 12.0]
    assert len(vllm["tokens_per_s_runs"]) == 6 and vllm["repeats_identical"]
    ratio, ratios = bench.ratio_to(plugin, vllm)
    assert ratios == pytest.approx([0.9, 1.05, 0.95]) and ratio == pytest.approx(0.95)
    assert not bench.merged([process(10.0), process(10.0, outputs=((1, 3),))])["repeats_identical"]
    assert bench.parse_args(["--rounds", "3"]).rounds == 3
    for bad in ("0", "x", "-1"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--rounds", bad])


def test_the_verify_step_cost_script_times_each_rate_staged_and_in_one_pass():
    """scripts/verify_step_cost.py on a small head, run as a user runs it: per rate, a line of milliseconds
    a step staged and one in one pass, the one pass computing the paths at every drafted position."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "verify_step_cost.py"
    done = subprocess.run([sys.executable, str(script), "--requests", "3", "--vocab", "300", "--hidden", "16",
                           "--steps", "2", "--p", "0,0.2"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["p 0 staged  ", "p 0 one pass", "p 0.2 staged  ", "p 0.2 one pass"]
    assert all("ms a step of 3 requests" in line for line in lines)
    assert lines[-1].endswith(f"{3 * 4 * RuleConfig('dropmatch').num_paths} path rows")  # 3 requests, gamma 4


def _engine(dropmatch) -> SimpleNamespace:
    return SimpleNamespace(additional_config={} if dropmatch is None else {"dropmatch": dropmatch})


def test_an_engine_asking_for_dropmatch_where_the_plugin_cannot_act_is_refused_in_one_line():
    from dropmatch.serving.vllm import hooks

    assert hooks.refusal(_engine(None), "tpu", uses_v2_runner=True) is None  # an engine without DropMatch: never
    assert hooks.refusal(_engine({"p": 0.3}), "cpu", uses_v2_runner=False) is None
    assert hooks.refusal(_engine({"p": 0.3}), "cuda", uses_v2_runner=False) is None
    reasons = {
        "v2": hooks.refusal(_engine({"p": 0.3}), "cuda", uses_v2_runner=True),
        "platform": hooks.refusal(_engine({"p": 0.3}), "tpu", uses_v2_runner=False),
        "setting": hooks.refusal(_engine({"k": 0}), "cpu", uses_v2_runner=False),
    }
    assert "set VLLM_USE_V2_MODEL_RUNNER=0" in reasons["v2"]
    assert "runs on tpu" in reasons["platform"]
    assert "K (paths)" in reasons["setting"]
    assert all(r.startswith("DropMatch: ") and "\n" not in r for r in reasons.values())


def test_a_hook_that_failed_to_install_refuses_dropmatch_engines_only(monkeypatch):
    from dropmatch.serving.vllm import hooks

    monkeypatch.setattr(hooks, "PROBLEMS", ["hook_workers: no module named vllm.v1.worker.worker_base"])
    assert hooks.refusal(_engine(None), "cpu", uses_v2_runner=False) is None
    assert "could not hook vLLM in this process (hook_workers: no module" in hooks.refusal(_engine({}), "cpu", False)


def test_the_start_log_states_the_memory_the_plugin_keeps_outside_vllms_profile():
    from dropmatch.serving.vllm.runner import memory_line

    line = memory_line(vocab_size=152_064, gamma=4, max_requests=256)  # a 152k vocabulary, 256 requests
    assert "608 kB per drafted token" in line and "2.43 MB per request at gamma 4" in line
    assert "at most 623 MB for 256 requests" in line and "\n" not in line
