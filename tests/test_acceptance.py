"""Acceptance rules on hand-made logits: +10 / -inf make every decision certain."""

from __future__ import annotations

import math

import pytest
import torch

from dropmatch.decoding.acceptance import rule_accepts, votes_needed
from reference_rules import decide
from dropmatch.decoding.verifying import position_signals, votes
from dropmatch.decoding.config import RuleConfig
from dropmatch.decoding.mc_head import dropout_paths, path_stats
from dropmatch.decoding.sampling import draw, js_divergence, sampling_probs, target_view

V = 6
NEG = float("-inf")


def one_hot_logits(tokens: list[int], vocab: int = V) -> torch.Tensor:
    """[len, vocab] logits with +10 on the given token and -inf elsewhere."""
    logits = torch.full((len(tokens), vocab), NEG)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 10.0
    return logits


def greedy_round(rule: RuleConfig, drafted: list[int], q_logits, p_logits, path_logits=None):
    """Decide one greedy round from logits: q [g, V], p [g + 1, V], paths [K, g, V]."""
    generator = torch.Generator().manual_seed(0)
    g = len(drafted)
    paths = path_stats(path_logits, 0.0, rule.centroid) if path_logits is not None else None
    signals = position_signals(torch.tensor(drafted), q_logits.softmax(-1), p_logits[:g].softmax(-1), paths)
    return decide(rule, True, signals, sampling_probs(q_logits, 0.0, 1.0),
                  sampling_probs(p_logits, 0.0, 1.0), generator)


def test_lossless_greedy_accepts_exactly_the_target_argmax():
    """Greedy lossless keeps the drafted prefix that equals the target argmax, then corrects."""
    verdict = greedy_round(RuleConfig("lossless"), [1, 2, 3], one_hot_logits([1, 2, 3]),
                           one_hot_logits([1, 2, 4, 5]))
    assert verdict.num_accepted == 2
    assert verdict.reasons == ("exact", "exact", "rejected")
    assert (verdict.next_token, verdict.next_kind) == (4, "correction")


def test_all_accepted_round_emits_the_bonus_token():
    """When every draft token is accepted the target's next token comes as a bonus."""
    verdict = greedy_round(RuleConfig("lossless"), [1, 2], one_hot_logits([1, 2]), one_hot_logits([1, 2, 5]))
    assert (verdict.num_accepted, verdict.next_token, verdict.next_kind) == (2, 5, "bonus")


def test_nothing_after_the_first_rejection_is_checked():
    """A rejection ends the scan; later positions are marked unchecked even if they would match."""
    verdict = greedy_round(RuleConfig("lossless"), [0, 2, 3], one_hot_logits([0, 2, 3]),
                           one_hot_logits([1, 2, 3, 4]))
    assert verdict.reasons == ("rejected", "unchecked", "unchecked")
    assert verdict.next_token == 1


def test_naive_accepts_a_token_that_any_path_chose():
    """naive: the draft token is accepted when it is one of the K path tokens."""
    paths = torch.stack([one_hot_logits([1]), one_hot_logits([3]), one_hot_logits([1])])
    accepted = greedy_round(RuleConfig("naive"), [3], one_hot_logits([3]), one_hot_logits([1, 0]), paths)
    rejected = greedy_round(RuleConfig("naive"), [4], one_hot_logits([4]), one_hot_logits([1, 0]), paths)
    assert accepted.reasons == ("naive",) and accepted.num_accepted == 1
    assert rejected.reasons == ("rejected",) and rejected.next_token == 1


def _paths(*tokens: int) -> torch.Tensor:
    return torch.stack([one_hot_logits([t]) for t in tokens])


def test_majority_needs_nearly_all_paths_by_default():
    """majority, f = 0.8 (the default): 4 of 5 votes accept, 3 of 5 do not."""
    clean = one_hot_logits([1, 0])
    assert greedy_round(RuleConfig("majority"), [2], one_hot_logits([2]), clean, _paths(2, 2, 2, 2, 1)).reasons == ("majority",)
    assert greedy_round(RuleConfig("majority"), [2], one_hot_logits([2]), clean, _paths(2, 2, 2, 1, 1)).reasons == ("rejected",)


def test_majority_fraction_goes_down_to_a_strict_majority():
    """f = 0.5: 3 of 5 accept, 2 of 5 do not; with K = 4 a strict majority is 3 votes, never 2."""
    clean = one_hot_logits([1, 0])
    half = RuleConfig("majority", majority_fraction=0.5)
    assert greedy_round(half, [2], one_hot_logits([2]), clean, _paths(2, 2, 2, 1, 1)).reasons == ("majority",)
    assert greedy_round(half, [2], one_hot_logits([2]), clean, _paths(2, 2, 1, 1, 0)).reasons == ("rejected",)
    assert greedy_round(half, [2], one_hot_logits([2]), clean, _paths(2, 2, 3, 0)).reasons == ("rejected",)
    assert [votes_needed(k, 0.8) for k in (1, 4, 5, 9, 10)] == [1, 4, 4, 8, 8]
    assert [votes_needed(k, 0.5) for k in (1, 4, 5, 9, 10)] == [1, 3, 3, 5, 6]
    assert votes_needed(5, 0.6) == 3  # 0.6 * 5 is 3.0000000000000004 in floating point


def test_a_tie_at_the_top_of_the_vote_never_picks_by_token_id():
    """Two tokens with 2 votes each: no majority token (-1), whichever token id is smaller."""
    tied = votes(torch.tensor([[2], [2], [1], [1], [0]]), torch.tensor([1]))
    assert tied["majority_tokens"].tolist() == [-1] and tied["majority_votes"].tolist() == [2]
    assert tied["draft_votes"].tolist() == [2]
    clear = votes(torch.tensor([[2], [2], [1], [2], [0]]), torch.tensor([1]))
    assert clear["majority_tokens"].tolist() == [2] and clear["majority_votes"].tolist() == [3]


def test_path_rules_judge_only_tokens_that_are_not_the_clean_choice():
    """Under sampling the lossless coin may reject the target's own top token; a path rule does not
    overrule it (so that at p = 0 it adds nothing), while it does judge any other token."""
    paths = _paths(1, 1, 1, 1, 1)
    clean_top = position_signals(torch.tensor([1]), one_hot_logits([1]).softmax(-1),
                                 torch.tensor([[0.0, 2.0, 1.0, NEG, NEG, NEG]]).softmax(-1), path_stats(paths, 1.0))
    assert not rule_accepts(RuleConfig("naive"), clean_top).any()
    other = position_signals(torch.tensor([1]), one_hot_logits([1]).softmax(-1),
                             torch.tensor([[0.0, 1.0, 2.0, NEG, NEG, NEG]]).softmax(-1), path_stats(paths, 1.0))
    assert rule_accepts(RuleConfig("naive"), other).all()


def _soft_paths() -> torch.Tensor:
    """Two paths spread over tokens 1 and 2 (so the JS threshold is clearly above 0)."""
    return torch.tensor([[[0.0, 3.0, 1.0, NEG, NEG, NEG]], [[0.0, 1.0, 3.0, NEG, NEG, NEG]]])


def test_js_accepts_a_draft_as_close_to_the_centroid_as_the_paths_are():
    """js: accept iff JS(draft || centroid) <= max path JS."""
    paths = _soft_paths()
    close = paths.softmax(-1).mean(0).log()  # the centroid (the paths' mean distribution) itself: JS 0
    far = torch.tensor([[NEG, NEG, NEG, 10.0, NEG, NEG]])  # disjoint support: JS ln 2
    clean = one_hot_logits([1, 0])
    stats = path_stats(paths, 0.0, "probs")
    assert float(js_divergence(close.softmax(-1), stats.centroid)) < 1e-7 < float(stats.threshold)
    assert greedy_round(RuleConfig("js"), [2], close, clean, paths).reasons == ("js",)
    assert greedy_round(RuleConfig("js"), [3], far, clean, paths).reasons == ("rejected",)


def test_dropmatch_tries_js_then_majority():
    """dropmatch: JS first; when JS fails, nearly all paths (4 of 5) choosing the draft still accept."""
    # finite logits (10 on the path's token, 0 elsewhere) so the centroid is a proper distribution
    paths = torch.stack([one_hot_logits([t]).clamp_min(0.0) for t in (2, 2, 2, 2, 1)])
    clean = one_hot_logits([1, 0])
    # a draft distribution with its mass elsewhere: JS = ln 2 > threshold, yet 4 of 5 paths chose 2
    draft_far = one_hot_logits([5])
    verdict = greedy_round(RuleConfig("dropmatch"), [2], draft_far, clean, paths)
    assert verdict.reasons == ("majority",)
    centroid_like = paths.softmax(-1).mean(0).log()  # draft distribution = the centroid (mean of the paths)
    verdict = greedy_round(RuleConfig("dropmatch"), [2], centroid_like, clean, paths)
    assert verdict.reasons == ("js",)


def test_exact_match_wins_over_every_rule():
    """A token equal to the clean target choice is accepted as exact whatever the paths say."""
    paths = torch.stack([one_hot_logits([4]) for _ in range(5)])
    verdict = greedy_round(RuleConfig("dropmatch"), [1], one_hot_logits([1]), one_hot_logits([1, 0]), paths)
    assert verdict.reasons == ("exact",)


def test_typical_accepts_tokens_above_the_entropy_floor():
    """typical: p_target(x) > min(eps, delta * exp(-H)) accepts; a near-zero token does not."""
    # p_target = [0.705, 0.259, 0.035, 0, ...], H = 0.71: floor = min(0.3, 0.09 * e^-0.71) = 0.044
    target = torch.tensor([[3.0, 2.0, 0.0, NEG, NEG, NEG], [0.0] * V])
    ok = greedy_round(RuleConfig("typical"), [1], one_hot_logits([1]), target)  # not the argmax (0), above the floor
    low = greedy_round(RuleConfig("typical"), [2], one_hot_logits([2]), target)  # 0.035, below the floor
    bad = greedy_round(RuleConfig("typical"), [3], one_hot_logits([3]), target)
    assert ok.reasons == ("typical",), ok.reasons
    assert low.reasons == ("rejected",), low.reasons
    assert bad.reasons == ("rejected",), bad.reasons


def test_fixed_js_uses_its_threshold_against_the_clean_target():
    """fixed_js: JS(draft || target) <= T accepts; the same pair is rejected with T = 0."""
    target = torch.tensor([[3.0, 2.9, NEG, NEG, NEG, NEG], [0.0] * V])
    draft = torch.tensor([[2.9, 3.0, NEG, NEG, NEG, NEG]])
    assert greedy_round(RuleConfig("fixed_js", fixed_js_threshold=0.1), [1], draft, target).reasons == ("fixed_js",)
    assert greedy_round(RuleConfig("fixed_js", fixed_js_threshold=0.0), [1], draft, target).reasons == ("rejected",)


def test_js_divergence_is_symmetric_bounded_and_zero_on_equal():
    a = torch.tensor([0.5, 0.5, 0.0])
    b = torch.tensor([0.0, 0.0, 1.0])
    assert js_divergence(a, a).item() == pytest.approx(0.0, abs=1e-7)
    assert js_divergence(a, b).item() == pytest.approx(math.log(2), rel=1e-6)
    c = torch.tensor([0.2, 0.3, 0.5])
    assert js_divergence(a, c).item() == pytest.approx(js_divergence(c, a).item(), rel=1e-6)


def test_centroid_is_the_mean_path_distribution_with_mean_logits_as_an_option():
    """Default centroid: mean of the K path distributions; "logits": softmax of the mean logits."""
    logits = torch.tensor([[[4.0, 0.0]], [[0.0, 1.0]]])
    by_probs = path_stats(logits, 0.0)
    assert torch.allclose(by_probs.centroid, logits.softmax(-1).mean(0))
    by_logits = path_stats(logits, 0.0, "logits")
    assert torch.allclose(by_logits.centroid, logits.mean(0).softmax(-1))
    assert not torch.allclose(by_probs.centroid, by_logits.centroid)


def test_the_centroid_choice_changes_a_js_decision():
    """Paths at [0.881, 0.119] and [0.269, 0.731]. Mean of the distributions [0.575, 0.425] (threshold
    0.0618); softmax of the mean logits [0.622, 0.378] (threshold 0.0647). A draft at [0.9, 0.1] has
    JS 0.0722 to the first (rejected) and 0.0557 to the second (accepted)."""
    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 1.0]]])
    draft = torch.tensor([[0.9, 0.1]])
    p_target = torch.tensor([[0.2, 0.8]])
    decisions = {}
    for centroid in ("probs", "logits"):
        stats = path_stats(logits, 1.0, centroid)
        signals = position_signals(torch.tensor([0]), draft, p_target, stats)
        decisions[centroid] = bool(rule_accepts(RuleConfig("js", centroid=centroid), signals)[0])
        assert float(stats.threshold[0]) == pytest.approx(float(stats.path_js.max()))
    assert decisions == {"probs": False, "logits": True}


def test_dropout_paths_perturb_only_with_p_above_zero():
    """K copies of the hidden states; p = 0 gives the clean rows exactly, p > 0 differs."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(4, 8)
    paths = dropout_paths(hidden, 5, 0.3, generator)
    assert paths.shape == (5, 4, 8) and not torch.equal(paths[0], hidden)
    assert torch.equal(dropout_paths(hidden, 5, 0.0, generator)[3], hidden)


def test_dropout_keeps_the_expected_hidden_state():
    """Inverted dropout: the mean over many paths approaches the clean hidden state."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 16)
    rows = dropout_paths(hidden, 4000, 0.3, generator).reshape(-1, 16)
    assert torch.allclose(rows.mean(0), hidden[0], atol=0.1)
    zero_share = (rows == 0).float().mean().item()
    assert zero_share == pytest.approx(0.3, abs=0.02)


def test_lossless_sampling_follows_the_target_distribution():
    """Rejection sampling: the first emitted token is distributed as p_target (vLLM-style histogram)."""
    generator = torch.Generator().manual_seed(1)
    p_logits = torch.tensor([[1.0, 0.0, -1.0, 2.0, 0.5], [0.0] * 5])
    q_logits = torch.tensor([[0.0, 2.0, 0.0, -1.0, 1.0]])
    p_sample = sampling_probs(p_logits, 1.0, 1.0)
    q_sample = sampling_probs(q_logits, 1.0, 1.0)
    draws = 20000
    counts = torch.zeros(5)
    rule = RuleConfig("lossless")
    for _ in range(draws):
        token = draw(q_sample[0], generator)
        signals = position_signals(token.view(1), q_sample, p_sample[:1])
        verdict = decide(rule, False, signals, q_sample, p_sample, generator)
        counts[int(token) if verdict.num_accepted == 1 else verdict.next_token] += 1
    empirical = counts / draws
    assert torch.allclose(empirical, p_sample[0], atol=0.012), (empirical, p_sample[0])
    # The draft distribution is far from it: the test would fail if drafts were accepted blindly.
    assert (q_sample[0] - p_sample[0]).abs().max() > 0.2


def test_top_p_keeps_the_smallest_nucleus():
    probs = sampling_probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, 0.7)
    assert torch.allclose(probs, torch.tensor([[0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]]))


def test_target_view_reads_log_probability_and_nucleus_membership():
    """Probabilities [0.6, 0.3, 0.08, 0.02]: the top-p 0.95 nucleus is the first three tokens."""
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.08, 0.02]])).expand(4, 4)
    log_probs, in_nucleus = target_view(logits, torch.tensor([0, 1, 2, 3]))
    assert torch.allclose(log_probs, torch.log(torch.tensor([0.6, 0.3, 0.08, 0.02])))
    assert in_nucleus.tolist() == [True, True, True, False]


@pytest.mark.parametrize("rescue", [False, True])
def test_a_top_token_draft_the_sampled_coin_rejects_is_rescued_by_the_paths_only_when_asked(rescue):
    """Sampling, draft = the clean target's top token, q one-hot on it (accepted with p(x) = 0.4), every
    path on it: by default the coin alone decides (rejected 60% of the time, p = 0 equals lossless);
    with rescue_argmax the majority of the paths accepts every rejection the coin made."""
    p_logits = torch.log(torch.tensor([[0.4, 0.35, 0.25, 1e-9, 1e-9, 1e-9], [1 / 6] * 6]))
    q_sample = torch.nn.functional.one_hot(torch.tensor([0]), V).float()
    p_sample = sampling_probs(p_logits, 1.0, 1.0)
    stats = path_stats(p_logits[:1].unsqueeze(0).expand(5, 1, V), 1.0)  # every path is the clean row
    rule = RuleConfig("dropmatch", p=0.0, rescue_argmax=rescue)
    generator = torch.Generator().manual_seed(3)
    reasons = []
    for _ in range(400):
        signals = position_signals(torch.tensor([0]), q_sample, p_sample[:1], stats)
        reasons.append(decide(rule, False, signals, q_sample, p_sample, generator).reasons[0])
    exact_share = reasons.count("exact") / len(reasons)
    assert exact_share == pytest.approx(0.4, abs=0.08), f"the coin accepted {exact_share:.2f}, not 0.4"
    if rescue:
        assert set(reasons) == {"exact", "majority"}, set(reasons)
    else:
        assert set(reasons) == {"exact", "rejected"}, set(reasons)


@pytest.mark.parametrize("centroid", ["probs", "logits"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_single_paths_divergence_to_its_centroid_is_exactly_zero(centroid, temperature):
    """p = 0 judges one clean row repeated: its stats skip the JS pass, are exactly zero, and equal
    (to rounding) what the JS pass gives for two copies of the same row."""
    clean_logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 4
    stats = path_stats(clean_logits.unsqueeze(0), temperature, centroid)
    assert torch.equal(stats.centroid, stats.probs[0]) and not stats.path_js.any() and not stats.threshold.any()
    general = path_stats(clean_logits.unsqueeze(0).expand(2, -1, -1), temperature, centroid)  # the JS pass
    torch.testing.assert_close(stats.centroid, general.centroid, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(stats.probs[0], general.probs[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(stats.threshold, general.threshold, rtol=0, atol=1e-6)


@pytest.mark.parametrize("centroid", ["probs", "logits"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_clean_rows_stats_are_what_one_path_of_it_gives(centroid, temperature):
    """PathStats.of_clean_row (p = 0) reuses the clean distribution: the same stats, bit for bit, as
    path_stats over the clean row repeated K times, its centroid the very tensor it was given."""
    from dropmatch.decoding.mc_head import PathStats
    from dropmatch.decoding.sampling import signal_probs

    clean_logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2)) * 4
    clean_probs = signal_probs(clean_logits, temperature)
    reused = PathStats.of_clean_row(clean_logits, clean_probs, 5)
    computed = path_stats(clean_logits.unsqueeze(0), temperature, centroid).expanded(5)
    for name in ("probs", "tokens", "centroid", "path_js", "threshold"):
        assert torch.equal(getattr(reused, name), getattr(computed, name)), name
    assert reused.centroid is clean_probs and reused.tokens.shape == (5, 3)


def test_the_top_token_is_argmax_with_ties_and_nans():
    """sampling.top_token (max's index) returns what argmax does: the first maximum, NaN the largest."""
    from dropmatch.decoding.sampling import top_token

    generator = torch.Generator().manual_seed(3)
    values = torch.randint(0, 3, (64, 4099), generator=generator).float()  # ties everywhere
    values[5, 100:200:9] = float("nan")
    for rows in (values, values.softmax(-1), values[0], values[:, :7]):
        assert torch.equal(top_token(rows), rows.argmax(-1))


def _scan_by_definition(tests: list[list[bool]], names: tuple[str, ...]) -> tuple[str, ...]:
    """Left to right: the first test accepting a slot names it; the first slot none accepts is rejected, the rest unchecked."""
    reasons: list[str] = []
    for slot in zip(*tests):
        if reasons and reasons[-1] in ("rejected", "unchecked"):
            reasons.append("unchecked")
        else:
            reasons.append(next((name for name, ok in zip(names, slot) if ok), "rejected"))
    return tuple(reasons)


def test_the_tensor_scan_over_a_batch_of_rounds_is_the_left_to_right_scan_of_each():
    """acceptance.scan (accepted prefix as a cumulative product, the reason by an argmax) gives, round by round of
    a stacked batch of uneven rounds (an empty one too), the reasons the left-to-right definition gives."""
    from dropmatch.decoding.acceptance import scan, scan_names

    generator = torch.Generator().manual_seed(0)
    names = scan_names(("js", "majority"))
    for trial in range(200):
        lengths = torch.randint(0, 6, (int(torch.randint(1, 5, (1,), generator=generator)),), generator=generator)
        lengths = lengths.tolist()
        tests = torch.rand((3, sum(lengths)), generator=generator) < 0.35 + 0.5 * (trial % 3) / 2
        codes = scan(tests, lengths).tolist()
        start = 0
        for length in lengths:
            found = tuple(names[code] for code in codes[start: start + length])
            assert found == _scan_by_definition(tests[:, start: start + length].tolist(), names[:3]), (trial, length)
            start += length
