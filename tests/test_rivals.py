"""The training-free rivals as their authors wrote them: FLy (entropy gate, deferred window), DIVERSED's
static ensemble (greedy and sampled, as transformers defines it) and MARS (the logit ratio; sampling as
written, greedy as SecureSD's port), each from hand-made logits where its decision is certain, through the
product's verify step (docs/rivals-from-authors-code.md has the sources)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import PROMPTS

from dropmatch.decoding import acceptance
from dropmatch.decoding.config import ConfigError, DecodeConfig, RuleConfig
from dropmatch.decoding.engine import run_to_end
from dropmatch.decoding.verifying import position_signals
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


def verified(rule: RuleConfig, logits, drafted: list[int], q_rows=None, coin=None, temperature: float = 0.0,
             seed: int = 0, top_p: float = 1.0):
    """One round through the product's verify step (verifying.verify) from hand-made target logits [g + 1, V]
    (the last row the bonus row), drafts [g], and under sampling the draft's rows [g, V] and the coins [g]."""
    from dropmatch.decoding import verifying

    logits = torch.tensor(logits, dtype=torch.float32)
    g, vocab = len(drafted), logits.shape[-1]
    tokens = torch.tensor(drafted)
    q_rows = torch.full((g, vocab), 1.0 / vocab) if q_rows is None else torch.tensor(q_rows, dtype=torch.float32)
    extra = {}
    if temperature == 0.0:
        exact = logits[:g].argmax(-1) == tokens
    else:
        from dropmatch.decoding.sampling import sampling_probs
        p_sample = sampling_probs(logits, temperature, top_p)
        p_x, q_x = p_sample[:g].gather(-1, tokens[:, None])[:, 0], q_rows.gather(-1, tokens[:, None])[:, 0]
        coin = torch.tensor(coin, dtype=torch.float32)
        exact = coin * q_x < p_x
        extra = dict(coin=coin, sample_target_prob=p_x, sample_draft_prob=q_x, q_sample=q_rows, p_sample=p_sample)
    inputs = verifying.VerifyInputs(0, tokens, q_rows, torch.zeros(g + 1, 2), logits, exact, temperature, 0,
                                    top_p=top_p, **extra)
    found, = verifying.verify(None, rule, [inputs], generator=torch.Generator().manual_seed(seed))
    return found.verdict


BONUS_ROW = [0, 0, 5, 0, 0]


@pytest.mark.parametrize("z, drafted, expected, emitted", [
    ([20, 19, 0, 0, 0], 1, "mars", 2),  # r = 0.95 > 0.9: the top-2 token (the port; p2/p1 would be 0.37)
    ([1, 0.5, 0, -1, -1], 1, "rejected", 0),  # r = 0.5: no relaxation (p2/p1 = 0.61 would have passed a p-ratio)
    ([-1, -3, -5, -6, -6], 1, "mars", 2),  # the logit ratio's sign: a negative top logit gives r = 3 > 0.9
    ([20, 19, 18, 0, 0], 2, "rejected", 0),  # close, but the third token: only the top two
    ([10, 9, 0, 0, 0], 1, "rejected", 0),  # r = 0.9 exactly: strictly greater is asked
])
def test_mars_greedy_port_accepts_the_top_two_where_their_logits_are_close(z, drafted, expected, emitted):
    """SecureSD's greedy port of MARS: top-1, or top-2 where z2 / z1 > 0.9; the correction is the argmax."""
    verdict = verified(RuleConfig("mars"), [z, BONUS_ROW], [drafted])
    assert verdict.reasons == (expected,) and verdict.next_token == emitted


@pytest.mark.parametrize("z, drafted, q_x, coin, expected", [
    ([-1, -3, -5, -6, -6], 1, 0.9, 0.5, "mars"),  # relaxed (r = 3): accepted with no coin (lossless: p/q 0.13 < u)
    ([20, 19, 0, 0, 0], 1, 0.99, 0.9, "mars"),  # relaxed: the top-2 draft passes although u > p / q = 0.27
    ([20, 19, 18, 0, 0], 2, 0.01, 0.0, "rejected"),  # relaxed, third token: rejected though p / q = 9 > u
    ([20, 19, 0, 0, 0], 0, 0.99, 0.5, "exact"),  # relaxed, the top token: accepted, and the coin agreed (0.5 q < p)
    ([20, 19, 0, 0, 0], 0, 0.99, 0.99, "mars"),  # relaxed, the top token: accepted though the coin would reject it
    ([10, 5, 0, 0, 0], 1, 0.9, 0.5, "rejected"),  # r = 0.5: the lossless coin decides (p / q = 0.007)
])
def test_mars_under_sampling_replaces_the_coin_where_the_top_two_logits_are_close(z, drafted, q_x, coin, expected):
    """5SSjw/MARS evaluate_posterior at temperature 1: where z2 / z1 > 0.9 the top two are accepted without a
    coin and any other draft is rejected; elsewhere the lossless coin."""
    q_row = [(1 - q_x) / 4] * 5
    q_row[drafted] = q_x
    verdict = verified(RuleConfig("mars"), [z, BONUS_ROW], [drafted], [q_row], [coin], temperature=1.0)
    assert verdict.reasons == (expected,)


def test_a_mars_rejection_under_relaxation_draws_the_next_token_from_p_not_the_residual():
    """The third token drafted with q(2) = 1 is rejected where the top two are close; the residual max(0, p - q)
    would never emit token 2, MARS draws from p: 0.665 / 0.245 / 0.090 over tokens 0, 1, 2."""
    z, q_row = [20, 19, 18, 0, 0], [0.0, 0.0, 1.0, 0.0, 0.0]
    verdicts = [verified(RuleConfig("mars"), [z, BONUS_ROW], [2], [q_row], [0.0], 1.0, seed) for seed in range(400)]
    assert all(verdict.reasons == ("rejected",) for verdict in verdicts)
    emitted = [verdict.next_token for verdict in verdicts]
    share = [emitted.count(token) / len(emitted) for token in range(3)]
    assert abs(share[0] - 0.665) < 0.08 and abs(share[1] - 0.245) < 0.08 and abs(share[2] - 0.090) < 0.06


@pytest.mark.parametrize("p_row, q_row, drafted, weight, expected, emitted", [
    ([0.5, 0.4, 0.1], [0.0, 1.0, 0.0], 1, 0.5, "ensemble", 2),  # argmax v = 1 (0.7): the draft, though argmax p = 0
    ([0.5, 0.4, 0.1], [0.0, 1.0, 0.0], 0, 0.5, "rejected", 1),  # the target's top token, not argmax v: v's top emitted
    ([0.5, 0.4, 0.1], [0.0, 1.0, 0.0], 1, 0.95, "rejected", 0),  # w 0.95: v = 0.475 / 0.43: argmax v = argmax p
    ([0.6, 0.3, 0.1], [0.6, 0.3, 0.1], 0, 0.5, "exact", 2),  # both agree: the target's own choice
])
def test_the_greedy_static_ensemble_tests_the_draft_against_argmax_of_w_p_plus_1_minus_w_q(
        p_row, q_row, drafted, weight, expected, emitted):
    """transformers' _speculative_sampling under greedy: accept iff the draft is argmax v, v = w p + (1 - w) q;
    the correction is argmax v, the bonus argmax p."""
    logits = torch.tensor([p_row, [0.1, 0.1, 0.8]]).log().tolist()
    verdict = verified(RuleConfig("ensemble", ensemble_weight=weight), logits, [drafted], [q_row])
    assert verdict.reasons == (expected,) and verdict.next_token == emitted


U_ROW, C2_ROW, C3_ROW = [2.0, 1.8, 1.5, 0.0, -1.0], [0.0, 0.0, 5.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0, 0.0]
FLY_Q = [[0.025, 0.9, 0.025, 0.025, 0.025]] + [[0.125, 0.125, 0.5, 0.125, 0.125]] * 4


@pytest.mark.parametrize("rows, top_p, expected", [
    ([U_ROW, C2_ROW, C2_ROW, C2_ROW, C2_ROW], 1.0, ("fly",) + ("exact",) * 4),  # the window's coins all passed
    ([U_ROW, C2_ROW, C2_ROW, C2_ROW, C2_ROW], 0.35, ("rejected",) + ("unchecked",) * 4),  # top-p: p(1) = 0
    ([U_ROW, C2_ROW, C2_ROW, C2_ROW, C3_ROW], 1.0, ("fly",) + ("exact",) * 3 + ("rejected",)),  # 4 is past the window
    ([U_ROW, C2_ROW, C3_ROW, C2_ROW, C2_ROW], 1.0, ("rejected",) + ("unchecked",) * 4),  # a coin in the window failed
])
def test_fly_under_sampling_defers_a_failed_coin_as_vllms_random_kernel_does(rows, top_p, expected):
    """vLLM's FLy (PR #53987) at temperature 1, window 4 in AMD's count: position 0's coin fails (p/q 0.35 < 0.95),
    the target is unsure there (top-3 entropy 1.07) and the next 3 coins pass: it stands; never where p(x) = 0."""
    verdict = verified(RuleConfig("fly", fly_window=4), [*rows, C3_ROW], [1, 2, 2, 2, 2], FLY_Q,
                       [0.95, 0.9, 0.9, 0.9, 0.9], 1.0, top_p=top_p)
    assert verdict.reasons == expected


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


def test_mars_accepts_close_top_two_drafts_on_a_real_run(tmp_path):
    """A pair whose draft is a noisier copy of the target (noise 0.3) drafts the target's runner-up now and
    then; MARS's greedy port accepts such drafts where the top two logits are close, and only those."""
    from tiny_models import save_pair

    from dropmatch.decoding.config import PairSpec
    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_hub_pair

    target, draft = save_pair(tmp_path, noise=0.3)
    engine = Engine(load_hub_pair(PairSpec(str(target), str(draft)), torch.device("cpu")))
    accepted = []
    for prompt in PROMPTS:
        trace = run_to_end(engine.speculative(engine.encode(prompt), DecodeConfig(gamma=4, max_new_tokens=48),
                                              RuleConfig("mars", mars_threshold=0.5)))
        accepted += [d for r in trace.rounds for d in r.drafted if d.reason == "mars"]
    assert accepted and all(d.token == d.target_runner_up and d.target_logit_ratio > 0.5 for d in accepted)


def test_the_vllm_plugin_refuses_the_rivals_it_cannot_serve_in_one_line():
    from dropmatch.serving.vllm.settings import ServeSettings

    for rule, reason in (("fly", "later drafted positions"), ("ensemble", "argmax")):
        with pytest.raises(ConfigError, match=reason) as caught:
            ServeSettings().updated({"rule": rule})
        assert "\n" not in str(caught.value)
    # MARS reads one position at a time: the plugin serves it, with its knob (tests/test_serving.py decides it)
    served = ServeSettings().updated({"rule": "mars", "mars_threshold": 0.8})
    assert served.rule.rule == "mars" and served.rule.mars_threshold == 0.8


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

    from dropmatch.decoding.config import PairSpec
    from dropmatch.decoding.engine import Engine
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
    from dropmatch.runfile import Downloads, record_of
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


@pytest.mark.parametrize("weight", [0.5, 0.3])
def test_the_greedy_static_ensemble_equals_transformers_token_for_token(far_dirs, weight):
    """transformers 5.23's assisted generation with assistant_ensemble_weight, greedy, a constant draft length
    of 4 and no confidence stop, on the same tiny pair: our engine emits the same tokens. Our first token comes
    from the prefill (the target's own, for every rule), transformers verifies a draft there too: it continues
    from the prompt and our first token, so every token compared went through the rule's verification."""
    from transformers import AutoModelForCausalLM

    from dropmatch.decoding.config import PairSpec
    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_hub_pair

    target_dir, draft_dir = far_dirs
    engine = Engine(load_hub_pair(PairSpec(str(target_dir), str(draft_dir)), torch.device("cpu")))
    ids = engine.encode(PROMPTS[0])
    ours = run_to_end(engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=24, draft_source="model"),
                                         RuleConfig("ensemble", ensemble_weight=weight)))
    target, draft = (AutoModelForCausalLM.from_pretrained(path).eval() for path in (target_dir, draft_dir))
    draft.generation_config.update(num_assistant_tokens=4, num_assistant_tokens_schedule="constant",
                                   assistant_confidence_threshold=0.0)
    prompt = torch.tensor([ids + [ours.first_token]])
    theirs = target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=draft, do_sample=False,
                             max_new_tokens=23, assistant_ensemble_weight=weight, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=23)
    assert any(d.reason == "ensemble" for r in ours.rounds for d in r.drafted)  # the rule acted
    assert list(ours.output_ids)[0] == ours.first_token
    assert list(ours.output_ids)[1:] == theirs[0, prompt.shape[1]:].tolist()


# ---------------------------------------------------------------- each rival only where its authors run it


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_mars_accepts_the_other_of_two_tied_top_logits(temperature):
    """Logits [5, 5, 1, 0]: tokens 0 and 1 tie at the top (r = 1); MARS's top-2 and SecureSD's port accept a
    draft of token 1 (the runner-up is the argmax with the top-1 masked out, never a topk index order)."""
    z = [5.0, 5.0, 1.0, 0.0]
    q_row = [0.005, 0.99, 0.0025, 0.0025]
    verdict = verified(RuleConfig("mars"), [z, [0, 0, 5, 0]], [1], [q_row], [0.99], temperature)
    assert verdict.reasons == ("mars",)


def test_mars_reads_its_top_two_after_top_p_and_never_accepts_a_token_top_p_removed():
    """z [20, 19, 0, 0, 0] at T = 1 is p = 0.73 / 0.27: r = 0.95 relaxes, but top-p 0.7 leaves token 0 alone
    (5SSjw/MARS takes its top two after TopPLogitsWarper): a draft of token 1 is rejected, token 0 emitted."""
    q_row = [0.025, 0.9, 0.025, 0.025, 0.025]
    verdict = verified(RuleConfig("mars"), [[20, 19, 0, 0, 0], BONUS_ROW], [1], [q_row], [0.5], 1.0, top_p=0.7)
    assert verdict.reasons == ("rejected",) and verdict.next_token == 0
    relaxed = verified(RuleConfig("mars"), [[20, 19, 0, 0, 0], BONUS_ROW], [1], [q_row], [0.5], 1.0, top_p=0.8)
    assert relaxed.reasons == ("mars",)  # top-p 0.8 keeps both: the relaxation stands


def test_mars_declares_and_explains_its_residual_departure_from_the_authors():
    """The sampled standard branch's residual (over the tempered, top-p'd q) differs from the authors' (p
    lowered at the rejected token only): the rule's declaration says so, and so does a rejection's sentence."""
    from dropmatch import render
    from dropmatch.decoding.trace import DraftedToken

    from dropmatch.rule_words import RULE_WORDS

    assert "max(0, p(x) − q(x))" in RULE_WORDS["mars"].port
    token = DraftedToken(token=1, reason="rejected", draft_prob=0.9, target_prob=0.1, target_token=0, js_target=0.1,
                         target_token_prob=0.8, coin=0.9, target_logit_ratio=0.5, target_runner_up=1)
    sentence = render.explain(token, str, RuleConfig("mars"), greedy=False)
    assert "the authors' code lowers p at the rejected token only" in sentence


VERY_SURE = [0.9998, 0.0001, 0.0001, 0.0]  # top-3 entropy 0.002


@pytest.mark.parametrize("threshold, expected", [(0.005, "fly"), (0.01, "fly"), (0.02, "rejected")])
def test_fly_turns_its_entropy_gate_off_at_thresholds_up_to_0_01_as_amds_code_does(threshold, expected):
    """AMD-AGI/FLy: entropy_thre <= 1e-2 is no gate; above it the gate holds where the target is sure."""
    signals = fly_round(VERY_SURE, [1] + [0] * 7, [False] + [True] * 7)
    assert reasons(RuleConfig("fly", fly_entropy_threshold=threshold), signals)[0] == expected


def test_flys_sentence_says_its_gate_was_off_where_it_was_and_never_calls_a_sure_target_unsure():
    """At a threshold <= 0.01 FLy's gate is off: an acceptance there says so and does not claim the target was
    unsure (entropy 0.002 is not >= 0.005); above it the sentence reads the entropy against the threshold."""
    from dropmatch import render
    from dropmatch.decoding.trace import DraftedToken

    token = DraftedToken(token=1, reason="fly", draft_prob=0.9, target_prob=0.0001, target_token=0, js_target=0.1,
                         target_token_prob=0.9998, target_top3_entropy=0.002)
    off = render.explain(token, str, RuleConfig("fly", fly_entropy_threshold=0.005))
    assert "gate is off" in off and "unsure" not in off
    on = render.explain(dataclasses.replace(token, target_top3_entropy=0.4), str,
                        RuleConfig("fly", fly_entropy_threshold=0.3))
    assert "unsure here (top-3 entropy 0.400 ≥ 0.3)" in on and "gate is off" not in on


NUCLEUS_ROW = torch.tensor([0.5, 0.45, 0.05, 1e-9, 1e-9]).log().tolist()  # top-3 entropy 0.86; top-p 0.9: 0.69


@pytest.mark.parametrize("top_p, expected", [
    (1.0, ("fly",) + ("exact",) * 4),  # the unprocessed row: top-3 entropy 0.86 >= 0.8
    (0.9, ("rejected",) + ("unchecked",) * 4),  # processed (tokens 0 and 1 left): entropy 0.69 < 0.8
])
def test_fly_under_sampling_reads_the_entropy_of_the_processed_probabilities_as_vllm_does(top_p, expected):
    """vLLM's FLy reads the entropy on the probabilities its sampler draws from (temperature, then top-p)."""
    verdict = verified(RuleConfig("fly", fly_window=4, fly_entropy_threshold=0.8), [NUCLEUS_ROW, *[C2_ROW] * 4, C3_ROW],
                       [1, 2, 2, 2, 2], FLY_Q, [0.95, 0.9, 0.9, 0.9, 0.9], 1.0, top_p=top_p)
    assert verdict.reasons == expected


def lookup_verified(rule: RuleConfig, p_row, drafted: int, coin, temperature: float, source: str):
    """One round with a one-hot q (a prompt-lookup draft) through the verify step, drafted by `source`."""
    from dropmatch.decoding import verifying

    logits = torch.tensor([p_row, [0.1, 0.1, 0.8]]).log()
    tokens = torch.tensor([drafted])
    q_rows = torch.nn.functional.one_hot(tokens, 3).float()
    p_sample = logits.softmax(-1)
    extra = {}
    if temperature == 0.0:
        exact = logits[:1].argmax(-1) == tokens
    else:
        coin = torch.tensor([coin])
        p_x = p_sample[:1, drafted]
        exact = coin < p_x
        extra = dict(coin=coin, sample_target_prob=p_x, sample_draft_prob=torch.ones(1), q_sample=q_rows,
                     p_sample=p_sample)
    inputs = verifying.VerifyInputs(0, tokens, q_rows, torch.zeros(2, 2), logits, exact, temperature, 0,
                                    draft_source=source, **extra)
    found, = verifying.verify(None, rule, [inputs], generator=torch.Generator().manual_seed(0))
    return found.verdict


@pytest.mark.parametrize("temperature, p_row, coin", [
    (0.0, [0.5, 0.4, 0.1], None),  # greedy: argmax v = 1 (0.7 against 0.25) would accept the lookup draft
    (1.0, [0.998, 0.001, 0.001], 0.3),  # sampled: odds 1 - w + w p / 1 = 0.5005 would pass the coin 0.3
])
def test_the_static_ensemble_gives_prompt_lookup_drafts_the_exact_test(temperature, p_row, coin):
    """transformers refuses assistant_ensemble_weight with prompt lookup: a lookup round under the ensemble
    gets the exact test (the draft 1 rejected, the target's token 0 emitted); a model round is judged."""
    rule = RuleConfig("ensemble")
    assert lookup_verified(rule, p_row, 1, coin, temperature, "model").reasons == ("ensemble",)
    looked_up = lookup_verified(rule, p_row, 1, coin, temperature, "ngram")
    assert looked_up.reasons == ("rejected",) and looked_up.next_token == 0
    assert not acceptance.judges_drafts("ensemble", "ngram") and acceptance.judges_drafts("mars", "ngram")


@pytest.mark.parametrize("decode", [DecodeConfig(gamma=4, max_new_tokens=40, draft_source="ngram"),
                                    DecodeConfig(gamma=4, max_new_tokens=40, draft_source="ngram", temperature=1.0,
                                                 seed=5)])
def test_an_ensemble_run_on_prompt_lookup_drafts_is_lossless_sd(tiny_engine, decode):
    """Every round prompt lookup drafts gets the exact test under the ensemble: its run emits lossless SD's
    tokens, greedy and sampled (same seed), and its round view says why."""
    from dropmatch import render

    ids = tiny_engine.encode("one two three one two three one two three one two")
    lossless = run_to_end(tiny_engine.speculative(ids, decode, RuleConfig("lossless")))
    ensemble = run_to_end(tiny_engine.speculative(ids, decode, RuleConfig("ensemble", ensemble_weight=0.1)))
    assert any(r.drafted for r in ensemble.rounds)
    assert ensemble.output_ids == lossless.output_ids
    assert not any(d.reason == "ensemble" for r in ensemble.rounds for d in r.drafted)
    step = render.step_html(next(r for r in ensemble.rounds if r.drafted), tiny_engine.services.token_text,
                            ensemble.rule_config, decode.greedy)
    assert "never judges prompt-lookup drafts" in step


def test_a_rejected_lookup_drafts_popover_under_the_ensemble_names_the_exact_test_only():
    """A prompt-lookup round under the ensemble ran the exact test alone: the rejection's sentence (popover,
    step view) says so and quotes no ensemble odds; the same token from a model round reads the ensemble's."""
    from dropmatch import render
    from dropmatch.decoding.trace import DraftedToken

    token = DraftedToken(token=1, reason="rejected", draft_prob=1.0, target_prob=0.1, target_token=0, js_target=0.1,
                         target_token_prob=0.8)
    why = render.explainer(str, DecodeConfig(), RuleConfig("ensemble"))
    looked_up, drafted = why(token, "ngram"), why(token, "model")
    assert "never judges prompt-lookup drafts" in looked_up and looked_up != drafted
    assert "never judges prompt-lookup drafts" not in drafted


def test_a_run_file_records_p_auto_only_for_a_rule_that_reads_p(tiny_engine):
    """p = auto calibrates the dropout rate of the path rules; a rule that reads no p (MARS here) is not p = auto."""
    from dropmatch.compare import compare_stream
    from dropmatch.runfile import record_of

    decode = DecodeConfig(gamma=3, max_new_tokens=6)
    for rule, expected in ((RuleConfig("mars", p=None), False), (RuleConfig("dropmatch", p=None), True)):
        *_, state = compare_stream(tiny_engine, PROMPTS[0], decode, rule, run_ar=False)
        assert record_of(state, tiny_engine).p_auto is expected, rule.rule
