"""The training-free rivals as rules of the table: FLy (entropy gate, deferred window), DIVERSED's
static ensemble and the margin rule (MARS-style), each from hand-made distributions where its decision
is certain."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import PROMPTS

from dropmatch import acceptance
from dropmatch.config import ConfigError, DecodeConfig, RuleConfig
from dropmatch.engine import run_to_end
from dropmatch.verifying import position_signals
from reference_rules import scan_reasons

UNSURE = [0.40, 0.35, 0.25, 0.0]  # top-3 entropy 1.08: the target barely prefers token 0
SURE = [0.97, 0.01, 0.01, 0.01]  # top-3 entropy 0.12 (below FLy's 0.3)


def fly_round(first_row, drafted, exact):
    """Signals of a greedy round over a 4-token vocabulary: the target's row at position 0 is
    `first_row`, every later row sure of token 0; `exact` [g] the lossless test."""
    g = len(drafted)
    p_target = torch.tensor([first_row] + [SURE] * (g - 1))
    q_draft = torch.full((g, 4), 0.25)
    signals = position_signals(torch.tensor(drafted), q_draft, p_target)
    return dataclasses.replace(signals, exact=torch.tensor(exact))


def reasons(rule: RuleConfig, signals) -> tuple[str, ...]:
    return scan_reasons(rule, signals, signals.exact)


def test_fly_lets_a_mismatch_stand_where_the_target_is_unsure_and_the_next_five_drafts_are_exact():
    signals = fly_round(UNSURE, [1, 0, 0, 0, 0, 0, 0, 0], [False] + [True] * 7)
    assert reasons(RuleConfig("fly"), signals) == ("fly",) + ("exact",) * 7


@pytest.mark.parametrize("first_row, exact, why", [
    (SURE, [False] + [True] * 7, "the target is sure of its own token there"),
    (UNSURE, [False, True, True, False, True, True, True, True], "a later draft in the window is not the target's"),
])
def test_fly_rejects_where_its_gate_or_its_window_fails(first_row, exact, why):
    signals = fly_round(first_row, [1] + [0] * 7, exact)
    assert reasons(RuleConfig("fly"), signals)[0] == "rejected", why


def test_fly_lets_no_mismatch_stand_in_the_rounds_last_window_positions():
    """AMD-AGI/FLy: updated_accept[:, -win_len:] keeps only exact verdicts there; with 6 drafts and a
    window of 6 no position may be tolerated, with 7 only the first."""
    six = fly_round(UNSURE, [1, 0, 0, 0, 0, 0], [False] + [True] * 5)
    assert reasons(RuleConfig("fly"), six)[0] == "rejected"
    seven = fly_round(UNSURE, [1, 0, 0, 0, 0, 0, 0], [False] + [True] * 6)
    assert reasons(RuleConfig("fly"), seven)[0] == "fly"


def test_fly_at_an_unreachable_entropy_threshold_is_lossless():
    signals = fly_round(UNSURE, [1] + [0] * 7, [False] + [True] * 7)
    assert reasons(RuleConfig("fly", fly_entropy_threshold=1e9), signals) == \
        reasons(RuleConfig("lossless"), signals)


def ensemble_round(p_x: float, q_x: float, coin: float):
    """One sampled drafted position whose lossless coin is `coin` against p(x) / q(x)."""
    signals = position_signals(torch.tensor([1]), torch.tensor([[1 - q_x, q_x]]), torch.tensor([[1 - p_x, p_x]]))
    exact = torch.tensor([coin * q_x < p_x])
    return dataclasses.replace(signals, exact=exact, coin=torch.tensor([coin]), sample_target_prob=torch.tensor([p_x]),
                               sample_draft_prob=torch.tensor([q_x]))


@pytest.mark.parametrize("coin, weight, expected", [
    (0.1, 0.5, "exact"),  # under p / q = 0.2: the lossless coin accepts
    (0.4, 0.5, "ensemble"),  # between 0.2 and the ensemble's odds 1 - w + w p / q = 0.6
    (0.7, 0.5, "rejected"),  # above 0.6
    (0.4, 1.0, "rejected"),  # w = 1: v = p, the lossless coin alone
    (0.83, 0.2, "ensemble"),  # w 0.2: odds 0.8 + 0.2 * 0.2 = 0.84
    (0.85, 0.2, "rejected"),
])
def test_the_static_ensemble_accepts_with_odds_min_1_1_minus_w_plus_w_p_over_q(coin, weight, expected):
    """p(x) 0.1, q(x) 0.5, the lossless test's own coin against the ensemble's odds."""
    assert reasons(RuleConfig("ensemble", ensemble_weight=weight), ensemble_round(0.1, 0.5, coin)) == (expected,)


def margin_round(target_row, drafted: int):
    """One greedy drafted position over a 4-token vocabulary whose clean target row is `target_row`."""
    signals = position_signals(torch.tensor([drafted]), torch.full((1, 4), 0.25), torch.tensor([target_row]))
    return dataclasses.replace(signals, exact=torch.tensor([drafted == int(torch.tensor(target_row).argmax())]))


@pytest.mark.parametrize("target_row, drafted, ratio, expected", [
    ([0.40, 0.35, 0.25, 0.0], 1, 0.5, "margin"),  # the runner-up, p2 / p1 = 0.875 > 0.5
    ([0.40, 0.35, 0.25, 0.0], 2, 0.5, "rejected"),  # third, however close: only the runner-up
    ([0.60, 0.25, 0.15, 0.0], 1, 0.5, "rejected"),  # the runner-up, but p2 / p1 = 0.42: a clear preference
    ([0.60, 0.25, 0.15, 0.0], 1, 0.4, "margin"),  # the same at a looser ratio
    ([0.40, 0.35, 0.25, 0.0], 0, 0.5, "exact"),  # the target's own choice: the exact test's
    ([0.40, 0.35, 0.25, 0.0], 1, 1.0, "rejected"),  # ratio 1: no runner-up beats its top token (lossless)
])
def test_the_margin_rule_accepts_the_runner_up_only_where_the_target_barely_prefers_its_top(
        target_row, drafted, ratio, expected):
    assert reasons(RuleConfig("margin", margin_ratio=ratio), margin_round(target_row, drafted)) == (expected,)


def test_the_margin_rules_sentences_name_the_runner_up_and_its_ratio(tiny_engine):
    from dropmatch import render
    from dropmatch.trace import DraftedToken

    accepted = DraftedToken(token=1, draft_prob=0.3, target_token=0, target_token_prob=0.4, target_prob=0.35,
                            js_target=0.1, reason="margin", target_runner_up=1, target_margin=0.875)
    text = render.explain(accepted, lambda t: f"t{t}", RuleConfig("margin"), greedy=True)
    assert "runner-up" in text and "0.88 > 0.5" in text
    third = dataclasses.replace(accepted, token=2, target_prob=0.25, reason="rejected")
    text = render.explain(third, lambda t: f"t{t}", RuleConfig("margin"), greedy=True)
    assert "rejected" in text and "not the runner-up" in text


def test_the_rivals_refuse_the_mode_they_are_not_defined_under_in_one_line(tiny_engine):
    ids = tiny_engine.encode(PROMPTS[0])
    with pytest.raises(ConfigError, match="defined under sampling decoding only") as greedy:
        run_to_end(tiny_engine.speculative(ids, DecodeConfig(max_new_tokens=8), RuleConfig("ensemble")))
    with pytest.raises(ConfigError, match="defined under greedy decoding only") as sampled:
        run_to_end(tiny_engine.speculative(ids, DecodeConfig(max_new_tokens=8, temperature=0.8), RuleConfig("fly")))
    with pytest.raises(ConfigError, match="defined under greedy decoding only") as margin:
        run_to_end(tiny_engine.speculative(ids, DecodeConfig(max_new_tokens=8, temperature=0.8), RuleConfig("margin")))
    assert "\n" not in str(greedy.value) + str(sampled.value) + str(margin.value)


def test_at_their_lossless_ends_the_rivals_runs_equal_lossless_sd(tiny_engine):
    """The ensemble at w = 1 (sampled, same seed) and FLy at an unreachable threshold (greedy) emit what
    lossless SD emits, token for token."""
    ids = tiny_engine.encode(PROMPTS[1])
    sampled = DecodeConfig(gamma=4, max_new_tokens=40, temperature=0.8, seed=3)
    lossless = run_to_end(tiny_engine.speculative(ids, sampled, RuleConfig("lossless")))
    ensemble = run_to_end(tiny_engine.speculative(ids, sampled, RuleConfig("ensemble", ensemble_weight=1.0)))
    assert ensemble.output_ids == lossless.output_ids
    greedy = DecodeConfig(gamma=8, max_new_tokens=40)
    lossless = run_to_end(tiny_engine.speculative(ids, greedy, RuleConfig("lossless")))
    fly = run_to_end(tiny_engine.speculative(ids, greedy, RuleConfig("fly", fly_entropy_threshold=1e9)))
    assert fly.output_ids == lossless.output_ids
    margin = run_to_end(tiny_engine.speculative(ids, greedy, RuleConfig("margin", margin_ratio=1.0)))
    assert margin.output_ids == lossless.output_ids


def test_at_their_defaults_the_rivals_accept_beyond_lossless_on_a_real_run(far_engine):
    """The rule fires on a real pair's drafts: the ensemble at w 0.5 under sampling, FLy at its defaults
    with long drafts; each lossy acceptance is explained by its own sentence."""
    from dropmatch import render

    ids = far_engine.encode(PROMPTS[0])
    ensemble = run_to_end(far_engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=48, temperature=1.0, seed=1),
                                                 RuleConfig("ensemble")))
    accepted = [d for r in ensemble.rounds for d in r.drafted if d.reason == "ensemble"]
    assert accepted and all(d.coin is not None for d in accepted)
    sentence = render.explain(accepted[0], far_engine.services.token_text, ensemble.rule_config, greedy=False)
    assert "static ensemble verifies against v = 0.5 p" in sentence


def test_the_margin_rule_accepts_runners_up_on_a_real_run(tmp_path):
    """A pair whose draft is a noisier copy of the target (noise 0.3) drafts the target's runner-up now and
    then; at the default ratio the margin rule accepts such drafts, and only such drafts."""
    from tiny_models import save_pair

    from dropmatch.config import PairSpec
    from dropmatch.engine import Engine
    from dropmatch.models import load_hub_pair

    target, draft = save_pair(tmp_path, noise=0.3)
    engine = Engine(load_hub_pair(PairSpec(str(target), str(draft)), torch.device("cpu")))
    accepted = []
    for prompt in PROMPTS:
        trace = run_to_end(engine.speculative(engine.encode(prompt), DecodeConfig(gamma=4, max_new_tokens=48),
                                              RuleConfig("margin")))
        accepted += [d for r in trace.rounds for d in r.drafted if d.reason == "margin"]
    assert accepted and all(d.token == d.target_runner_up and d.target_margin > 0.5 for d in accepted)


def test_the_vllm_plugin_refuses_the_rivals_it_cannot_serve_in_one_line():
    from dropmatch.serving.vllm.settings import ServeSettings

    for rule, reason in (("fly", "later drafted positions"), ("ensemble", "sampling only")):
        with pytest.raises(ConfigError, match=reason) as caught:
            ServeSettings().updated({"rule": rule})
        assert "\n" not in str(caught.value)
    # margin reads one position at a time: the plugin serves it, with its knob (tests/test_serving.py decides it)
    served = ServeSettings().updated({"rule": "margin", "margin_ratio": 0.3})
    assert served.rule.rule == "margin" and served.rule.margin_ratio == 0.3


def ensemble_distribution(p_row: torch.Tensor, q_row: torch.Tensor, weight: float) -> torch.Tensor:
    """[V] the emitted token's distribution after one drafted slot verified by the static ensemble (the
    DIVERSED paper's): the draft x ~ q kept with probability min(1, 1 - w + w p(x) / q(x)), else a draw
    from norm(max(0, p - q))."""
    odds = torch.where(q_row > 0, (1 - weight + weight * p_row / q_row.clamp_min(1e-30)).clamp(max=1.0),
                       torch.zeros_like(q_row))
    kept = q_row * odds
    residual = (p_row - q_row).clamp_min(0)
    residual = residual / residual.sum() if float(residual.sum()) > 0 else p_row
    return kept + (1 - kept.sum()) * residual


@pytest.mark.slow  # 3,000 seeded runs of ours, 1,500 calls of transformers' assisted generation
def test_our_ensemble_and_transformers_assistant_ensemble_weight_draw_the_static_ensembles_distribution(
        tmp_path_factory):
    """On the bigram pair (tests/test_exactness.py) at T = 1, w = 0.5: the token our engine emits after one
    drafted slot, and the token transformers' assisted generation with assistant_ensemble_weight emits after
    one, each follow the static ensemble's distribution for their context (chi-square, alpha 1e-4)."""
    from test_exactness import DRAFT_ROWS, PROMPT, TARGET_ROWS, TOKENS, _table, chi_square, chi_square_quantile
    from tiny_models import fast_bigram_pair, save_bigram_pair
    from transformers import AutoModelForCausalLM

    from dropmatch.config import PairSpec
    from dropmatch.engine import Engine
    from dropmatch.models import load_hub_pair

    weight, alpha = 0.5, 1e-4
    target_dir, draft_dir = save_bigram_pair(tmp_path_factory.mktemp("bigram_ensemble"), _table(TARGET_ROWS),
                                             _table(DRAFT_ROWS))
    pair = load_hub_pair(PairSpec(str(target_dir), str(draft_dir)), torch.device("cpu"))

    def row(model, previous: int) -> torch.Tensor:
        ids = torch.tensor(PROMPT[:-1] + [previous])
        return model.logits(model.hidden(ids, model.new_cache())[-1]).softmax(-1)

    # Ours: t1 is the target's own draw at the prefill, t2 the token after one drafted slot.
    engine = Engine(fast_bigram_pair(pair))
    decode = DecodeConfig(gamma=1, max_new_tokens=3, temperature=1.0)  # 3: room for one drafted slot after t1
    exact, counts, runs = {}, {}, 3000
    for first in TOKENS:
        p_first = float(row(pair.target, PROMPT[-1])[first])
        after = ensemble_distribution(row(pair.target, first), row(pair.draft, first), weight)
        exact.update({(first, second): p_first * float(after[second]) for second in TOKENS})
    for seed in range(runs):
        trace = run_to_end(engine.speculative(PROMPT, dataclasses.replace(decode, seed=seed),
                                              RuleConfig("ensemble", ensemble_weight=weight)))
        key = tuple(trace.output_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    statistic, df = chi_square(counts, exact, runs)
    assert statistic <= chi_square_quantile(df, alpha), f"ours: chi-square {statistic:.1f} (df {df})"

    # transformers: its first new token comes from verifying one assistant token.
    target, draft = (AutoModelForCausalLM.from_pretrained(d) for d in (target_dir, draft_dir))
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    after_prompt = ensemble_distribution(row(pair.target, PROMPT[-1]), row(pair.draft, PROMPT[-1]), weight)
    theirs, calls = {}, 1500
    inputs = torch.tensor([PROMPT])
    for seed in range(calls):
        torch.manual_seed(seed)
        out = target.generate(inputs, attention_mask=torch.ones_like(inputs), assistant_model=draft, do_sample=True,
                              temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=2, num_assistant_tokens=1,
                              assistant_ensemble_weight=weight, pad_token_id=0)
        token = int(out[0, len(PROMPT)])
        theirs[(token,)] = theirs.get((token,), 0) + 1
    expected = {(token,): float(after_prompt[token]) for token in TOKENS}
    statistic, df = chi_square(theirs, expected, calls)
    assert statistic <= chi_square_quantile(max(df, 1), alpha), f"transformers: chi-square {statistic:.1f} (df {df})"


def test_the_ensemble_column_gets_transformers_own_static_ensemble_as_its_peer_row(tiny_engine, tmp_path):
    """A live comparison with the ensemble rule runs transformers' assistant_ensemble_weight on the same pair
    and settings after the columns; its row shows under the ensemble column; a run file does not keep it."""
    from dropmatch.compare import compare_stream
    from dropmatch.record import Downloads, record_of
    from dropmatch.ui.views import finished_view

    decode = DecodeConfig(gamma=3, max_new_tokens=12, temperature=1.0, seed=2)
    phases = []
    for state in compare_stream(tiny_engine, PROMPTS[0], decode, RuleConfig("ensemble"), run_ar=True):
        phases.append(state.phase)  # one Comparison, updated as the run goes
    assert "peer" in phases and phases[-1] == "done"
    peer = state.peer
    assert peer["weight"] == 0.5 and peer["tokens"] > 0 and peer["seconds"] > 0 and peer["target_nll"] > 0
    record = record_of(state, tiny_engine)
    view = finished_view(record, Downloads(tmp_path))
    assert "Peer: transformers' own static ensemble" in view["lossy_stats"] and "assistant_ensemble_weight=0.5" in \
        view["lossy_stats"]
    assert "peer" not in record.to_dict()
    lossless = list(compare_stream(tiny_engine, PROMPTS[0], DecodeConfig(gamma=3, max_new_tokens=8),
                                   RuleConfig("dropmatch", p=0.1), run_ar=False))[-1]
    assert lossless.peer is None  # only the ensemble has transformers' own implementation to stand beside
