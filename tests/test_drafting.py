"""Prompt lookup, the draft-length choice of gamma = auto, and the runs they drive."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS

from dropmatch.decoding import drafting
from dropmatch.decoding.config import AUTO_GAMMA_CAP, ConfigError, DecodeConfig, RuleConfig
from dropmatch.decoding.engine import run_to_end
from dropmatch.models import greedy_reference


def test_lookup_proposes_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix():
    tokens = [1, 2, 3, 9, 1, 2, 3, 4, 5, 6, 1, 2, 3]
    assert drafting.lookup(tokens, 3) == [4, 5, 6]  # the latest earlier "1 2 3", not the first
    assert drafting.lookup(tokens, 1) == [4]
    assert drafting.lookup([5, 6, 7, 8], 4) == []  # nothing recurs
    assert drafting.lookup([4, 1, 2, 7, 2], 2) == [7, 2]  # only a 1-gram recurs
    assert drafting.lookup([4, 1, 2, 7, 2], 2, min_n=2) == []  # hybrid trusts 2-grams and longer only
    assert drafting.lookup([1, 2, 1, 2], 0) == []


def test_slot_acceptance_counts_the_rounds_that_reached_each_slot():
    acceptance = drafting.SlotAcceptance()
    assert acceptance.rate(0) == pytest.approx(0.5)  # the prior
    acceptance.record(num_drafted=4, num_accepted=2)  # slots 0, 1 accepted, 2 rejected, 3 unreached
    acceptance.record(num_drafted=4, num_accepted=4)
    assert acceptance.tries == [2, 2, 2, 1] and acceptance.accepts == [2, 2, 1, 1]
    assert acceptance.rate(0) == pytest.approx(3 / 4)


def test_gamma_auto_drafts_long_when_drafts_are_cheap_and_accepted_and_short_when_not():
    costs = drafting.StepCosts(draft_step=0.004, verify_base=0.040, verify_per_position=0.003)
    good, poor = drafting.SlotAcceptance(), drafting.SlotAcceptance()
    for _ in range(50):
        good.record(8, 8)
        poor.record(8, 0)
    assert drafting.choose_gamma(good, costs, cap=8) == 8
    assert drafting.choose_gamma(poor, costs, cap=8) == 1
    assert drafting.choose_gamma(good, costs, cap=3) == 3
    expensive = drafting.StepCosts(draft_step=0.040, verify_base=0.040, verify_per_position=0.0)
    middling = drafting.SlotAcceptance(accepts=[70.0] * 8, tries=[100.0] * 8)  # 0.7 at every slot
    assert drafting.choose_gamma(middling, expensive, cap=8) == 1  # a draft step as dear as a target call
    assert drafting.choose_gamma(middling, costs, cap=8) == 3


def test_gamma_and_draft_source_settings_are_checked():
    assert DecodeConfig.parse_gamma("auto") == {"gamma": AUTO_GAMMA_CAP, "gamma_auto": True}
    assert DecodeConfig.parse_gamma("3") == {"gamma": 3, "gamma_auto": False}
    with pytest.raises(ConfigError, match="gamma"):
        DecodeConfig.parse_gamma("lots")
    with pytest.raises(ConfigError, match="draft source"):
        DecodeConfig(draft_source="oracle")


@pytest.mark.parametrize("source", ["model", "ngram", "hybrid"])
@pytest.mark.parametrize("gamma_auto", [False, True])
def test_lossless_greedy_stays_identical_to_generate_with_every_draft_source_and_gamma(far_engine, source, gamma_auto):
    """Prompt lookup's one-hot drafts and gamma = auto change what is drafted, never the output."""
    engine = far_engine
    for prompt in (PROMPTS[0], "red green blue red green blue red green blue red"):
        ids = engine.encode(prompt)
        decode = DecodeConfig(gamma=6 if gamma_auto else 3, gamma_auto=gamma_auto, max_new_tokens=40,
                              draft_source=source)
        trace = run_to_end(engine.speculative(ids, decode, RuleConfig("lossless")))
        assert list(trace.output_ids) == greedy_reference(engine.target, ids, 40, engine.stop_ids)
        assert all(r.gamma is not None and r.num_drafted <= r.gamma <= decode.gamma for r in trace.rounds)
        looked_up = any(r.draft_source == "ngram" for r in trace.rounds)
        if source == "model":
            assert not looked_up
        elif source == "ngram":  # 1-grams recur in any text of this length
            assert looked_up
        assert trace.gamma_auto == gamma_auto and trace.draft_source == source


def test_step_costs_are_measured_once_per_pair_and_are_positive(tiny_engine):
    costs = tiny_engine.services.step_costs()
    assert costs is tiny_engine.services.step_costs()
    assert costs.draft_step > 0 and costs.verify_base > 0 and costs.verify_per_position >= 0


def test_gamma_auto_shortens_rounds_for_a_poor_draft(far_engine, tiny_engine, monkeypatch):
    """With the costs of a draft ten times cheaper than the target (the tiny pairs' own measured costs
    are about equal, which makes gamma 1 right for both), the far draft, often rejected, gets shorter
    rounds than the close one."""
    costs = drafting.StepCosts(draft_step=0.004, verify_base=0.040, verify_per_position=0.003)
    for engine in (far_engine, tiny_engine):
        monkeypatch.setattr(engine.services, "_costs", costs)
    decode = DecodeConfig(gamma=8, gamma_auto=True, max_new_tokens=60)
    far = run_to_end(far_engine.speculative(far_engine.encode(PROMPTS[0]), decode, RuleConfig("lossless")))
    close = run_to_end(tiny_engine.speculative(tiny_engine.encode(PROMPTS[0]), decode, RuleConfig("lossless")))

    def mean_gamma(trace):
        asked = [r.gamma for r in trace.rounds[5:] if r.gamma]
        return sum(asked) / len(asked)

    assert mean_gamma(far) < mean_gamma(close)


def test_hybrid_takes_a_lookup_only_where_it_is_expected_to_pay(far_engine):
    """Under gamma = auto, hybrid compares the two sources' expected tokens per second: with the
    lookup's own acceptance at zero and the model's perfect, every round goes to the model even where
    the text repeats; with fixed gamma a matching lookup is always taken."""
    engine = far_engine
    costs = drafting.StepCosts(draft_step=0.004, verify_base=0.040, verify_per_position=0.003)
    ids = engine.encode("red green blue red green blue red green blue red green blue")

    def hybrid(decode):
        space = drafting.DraftSpace(decode, torch.Generator(), costs if decode.gamma_auto else None,
                                    engine.target.vocab_size, engine.device, engine.draft.hidden_size)
        drafter = drafting.make_drafter(space, engine.draft)
        drafter.start(ids)
        return drafter

    text = ids + ids[:1]  # the prompt and a first token, as a round sees them
    auto = hybrid(DecodeConfig(gamma=8, gamma_auto=True, draft_source="hybrid"))
    auto.lookup.acceptance = drafting.SlotAcceptance(accepts=[0.0] * 8, tries=[100.0] * 8)
    auto.model.acceptance = drafting.SlotAcceptance(accepts=[100.0] * 8, tries=[100.0] * 8)
    assert not auto.lookup_pays(proposed=4, limit=8)
    assert auto.propose(text, 8).source == "model"
    auto.lookup.acceptance = drafting.SlotAcceptance(accepts=[100.0] * 8, tries=[100.0] * 8)
    assert auto.lookup_pays(proposed=4, limit=8)
    assert auto.propose(text, 8).source == "ngram"
    fixed = hybrid(DecodeConfig(gamma=4, draft_source="hybrid"))
    assert fixed.lookup_pays(proposed=4, limit=4)
    assert fixed.propose(text, 4).source == "ngram"


def test_gamma_auto_counts_the_judge_steps_measured_cost_at_the_slots_a_round_reaches():
    """The same acceptance and step costs: a verify step that costs as much as a verify call per reached
    slot makes gamma = auto draft shorter than a free one; VerifyCost's figures are the recorded ratios."""
    acceptance = drafting.SlotAcceptance()
    for _ in range(50):
        acceptance.record(6, 3)  # slots 0-2 accepted, slot 3 rejected, 4-5 never reached
    costs = drafting.StepCosts(draft_step=0.002, verify_base=0.02, verify_per_position=0.001)
    free = drafting.choose_gamma(acceptance, costs, 8)
    dear = drafting.choose_gamma(acceptance, costs, 8, verify_per_slot=0.02)
    assert dear < free
    assert drafting.expected_reached(acceptance, 1) == 1.0
    assert drafting.expected_reached(acceptance, 3) == pytest.approx(1 + acceptance.rate(0) * (1 + acceptance.rate(1)))
    cost = drafting.VerifyCost()
    assert cost.per_reached_slot() == 0.0
    cost.record(seconds=0.03, judged=3, reached=10)
    assert cost.per_position() == pytest.approx(0.01) and cost.per_reached_slot() == pytest.approx(0.003)


def test_a_runs_rounds_teach_gamma_auto_the_judge_steps_cost(tiny_engine, monkeypatch):
    """The engine records each round's MC seconds, judged positions and reached slots into the run's VerifyCost."""
    recorded = []
    monkeypatch.setattr(drafting.VerifyCost, "record", lambda self, *args: recorded.append(args))
    ids = tiny_engine.encode(PROMPTS[0])
    trace = run_to_end(tiny_engine.speculative(ids, DecodeConfig(gamma=4, gamma_auto=True, max_new_tokens=30),
                                               RuleConfig("dropmatch", p=0.3)))
    assert len(recorded) == len(trace.rounds)
    for (seconds, judged, reached), r in zip(recorded, trace.rounds):
        assert seconds == r.t_mc and reached == min(r.num_accepted + 1, len(r.drafted))
        assert judged == sum(d.reason not in ("exact", "unchecked") for d in r.drafted)
