"""Property-based tests (hypothesis) of the acceptance rules and the MC head on random logits."""

from __future__ import annotations

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dropmatch.decoding.acceptance import REASONS, RULES, Signals
from reference_rules import decide
from dropmatch.decoding.verifying import position_signals
from dropmatch.decoding.config import RuleConfig
from dropmatch.decoding.mc_head import P_GRID, calibrate_p, dropout_paths, path_stats
from dropmatch.decoding.sampling import js_divergence, sampling_probs, signal_probs
from judges import random_judge

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)  # the same examples every run


@st.composite
def rounds(draw):
    """A random verification round: hidden states, a head, draft logits and tokens."""
    seed = draw(st.integers(0, 2**31 - 1))
    vocab = draw(st.integers(2, 40))
    gamma = draw(st.integers(1, 6))
    num_paths = draw(st.integers(1, 8))
    p = draw(st.sampled_from([0.0, 0.05, 0.3, 0.7, 0.95]))
    scale = draw(st.sampled_from([0.01, 1.0, 30.0]))  # flat, ordinary and extremely peaked logits
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(gamma + 1, 8, generator=generator) * scale
    head = torch.randn(vocab, 8, generator=generator)
    q_logits = torch.randn(gamma, vocab, generator=generator) * scale
    return dict(seed=seed, vocab=vocab, gamma=gamma, num_paths=num_paths, p=p, hidden=hidden, head=head,
                q_logits=q_logits)


def verdict_for(case, rule: str, greedy: bool = True, drafted=None, centroid: str = "probs",
                judge_threshold: float = 0.5):
    generator = torch.Generator().manual_seed(case["seed"])
    masks = torch.Generator().manual_seed(case["seed"] + 1)  # the dropout masks' own stream, as in the engine
    gamma, num_paths = case["gamma"], case["num_paths"]
    clean = case["hidden"] @ case["head"].T
    paths = dropout_paths(case["hidden"], num_paths, case["p"], masks) @ case["head"].T
    stats = path_stats(paths[:, :gamma], 0.0 if greedy else 1.0, centroid)
    temperature = 0.0 if greedy else 1.0
    q_sample = sampling_probs(case["q_logits"], temperature, 1.0)
    if drafted is None:
        drafted = case["q_logits"].argmax(-1) if greedy else torch.multinomial(q_sample, 1, generator=generator)[:, 0]
    signals = position_signals(drafted, signal_probs(case["q_logits"], temperature),
                               signal_probs(clean[:gamma], temperature), stats)
    if RULES[rule].uses_judge:  # a random judge reads the hidden state after each drafted token
        scores = random_judge(case["hidden"].shape[1], case["seed"]).scores(case["hidden"][1 : gamma + 1])
        signals = Signals(**{**vars(signals), "judge_scores": scores})
    verdict = decide(RuleConfig(rule, num_paths=num_paths, p=case["p"], judge_threshold=judge_threshold), greedy,
                     signals, q_sample, sampling_probs(clean, temperature, 1.0), generator)
    return verdict, signals, stats, clean


@SETTINGS
@given(rounds(), st.sampled_from(tuple(RULES)), st.booleans())
def test_no_nan_or_inf_and_decisions_stay_in_the_allowed_set(case, rule, greedy):
    assume(("greedy" if greedy else "sampling") in RULES[rule].modes)  # the engine refuses the other mode
    verdict, signals, stats, clean = verdict_for(case, rule, greedy)
    for tensor in (stats.centroid, stats.path_js, stats.threshold, signals.js_draft_centroid,
                   signals.js_draft_target, signals.target_entropy, signals.draft_prob, signals.target_prob):
        assert torch.isfinite(tensor).all(), f"a signal is NaN or infinite under {rule} (greedy={greedy})"
    assert (stats.path_js >= 0).all() and (stats.path_js <= 0.6932).all(), f"path JS outside [0, ln 2]: {stats.path_js}"
    assert set(verdict.reasons) <= set(REASONS), f"{rule} gave a reason outside the vocabulary: {verdict.reasons}"
    assert len(verdict.reasons) == case["gamma"], f"{len(verdict.reasons)} reasons for {case['gamma']} drafted tokens"
    assert 0 <= verdict.num_accepted <= case["gamma"], f"{verdict.num_accepted} accepted of {case['gamma']}"
    assert all(r not in ("rejected", "unchecked") for r in verdict.reasons[: verdict.num_accepted]), \
        f"a rejected token inside the accepted prefix: {verdict.reasons}"
    assert all(r == "unchecked" for r in verdict.reasons[verdict.num_accepted + 1:]), \
        f"a token after the first rejection was judged: {verdict.reasons}"
    assert 0 <= verdict.next_token < case["vocab"], f"extra token {verdict.next_token} outside the vocabulary"
    assert verdict.next_kind == ("bonus" if verdict.num_accepted == case["gamma"] else "correction"), \
        f"{verdict.next_kind} after {verdict.num_accepted} of {case['gamma']} accepted"


@SETTINGS
@given(rounds(), st.sampled_from(tuple(RULES)))
def test_every_rule_keeps_the_lossless_greedy_prefix(case, rule):
    """Whatever the rule, the drafted tokens lossless greedy accepts are accepted too (exact wins): every rule but
    one whose own test replaces the exact match (the greedy static ensemble tests against argmax v instead)."""
    assume("greedy" in RULES[rule].modes and RULES[rule].replaces_exact is None)
    lossless, *_ = verdict_for(case, "lossless")
    lossy, *_ = verdict_for(case, rule)
    assert lossy.num_accepted >= lossless.num_accepted, f"{rule} accepted {lossy.num_accepted} < lossless {lossless.num_accepted}"
    assert lossy.reasons[: lossless.num_accepted] == ("exact",) * lossless.num_accepted, \
        f"{rule} changed the lossless prefix's reasons: {lossy.reasons}"
    if lossy.num_accepted == lossless.num_accepted and lossless.num_accepted < case["gamma"]:
        assert lossy.next_token == lossless.next_token, "the correction is not the clean argmax"


@SETTINGS
@given(rounds(), st.sampled_from(["naive", "js", "majority", "dropmatch", "dropmatch_judge"]), st.booleans(),
       st.sampled_from(["probs", "logits"]))
def test_with_p_zero_every_path_rule_decides_like_lossless_greedy_or_sampled(case, rule, greedy, centroid):
    """At p = 0 every path is the clean row: a path rule adds no acceptance, so its round (and the
    random draws it makes) equal lossless SD's, under greedy and sampling alike (the combination with
    the judge at threshold 0, where the judge accepts nothing)."""
    case = {**case, "p": 0.0}
    lossless, *_ = verdict_for(case, "lossless", greedy)
    lossy, *_ = verdict_for(case, rule, greedy, centroid=centroid, judge_threshold=0.0)
    assert lossy == lossless, f"{rule} at p = 0 (greedy={greedy}, {centroid}) differs from lossless: {lossy} vs {lossless}"


@SETTINGS
@given(rounds())
def test_dropout_paths_are_finite_and_equal_the_clean_rows_at_p_zero(case):
    generator = torch.Generator().manual_seed(case["seed"])
    paths = dropout_paths(case["hidden"], case["num_paths"], case["p"], generator)
    assert paths.shape == (case["num_paths"], case["gamma"] + 1, 8), f"paths of shape {tuple(paths.shape)}"
    assert torch.isfinite(paths).all(), "a dropout path is NaN or infinite"
    if case["p"] == 0.0:
        assert torch.equal(paths, case["hidden"].expand_as(paths)), "at p = 0 a path differs from the clean row"


@SETTINGS
@given(st.integers(0, 10_000), st.integers(2, 30))
def test_js_divergence_is_symmetric_and_bounded(seed, vocab):
    generator = torch.Generator().manual_seed(seed)
    a = torch.rand(vocab, generator=generator).softmax(-1)
    b = torch.rand(vocab, generator=generator).pow(8).softmax(-1)
    ab, ba = js_divergence(a, b), js_divergence(b, a)
    assert torch.allclose(ab, ba, atol=1e-6), f"JS not symmetric: {float(ab)} vs {float(ba)}"
    assert 0.0 <= float(ab) <= 0.6932, f"JS {float(ab)} outside [0, ln 2]"


@SETTINGS
@given(st.integers(0, 10_000), st.floats(0.5, 1.0))
def test_calibrated_p_is_on_the_grid_and_meets_its_agreement(seed, target_agreement):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(12, 16, generator=generator)
    head = torch.randn(50, 16, generator=generator)
    calibration = calibrate_p(hidden, hidden @ head.T, head, 5, target_agreement, generator)
    p, tried = calibration.p, calibration.tried
    grid = sorted(tried)
    assert all(0.0 <= a <= 1.0 for a in tried.values()), f"an agreement outside [0, 1]: {tried}"
    assert grid == list(P_GRID[: len(grid)]), f"the scan skipped grid values: {grid}"
    meeting = [q for q in grid if tried[q] >= target_agreement]
    assert calibration.reached == bool(meeting), f"reached={calibration.reached} with agreements {tried}"
    if meeting:
        # the largest tried p that meets the agreement, every smaller one meets it too, and the scan
        # went on until the next grid value missed it (or the grid ended)
        assert p == max(meeting) and meeting == grid[: len(meeting)], f"p {p} is not the largest meeting p: {tried}"
        assert len(meeting) == len(P_GRID) or tried[grid[len(meeting)]] < target_agreement, \
            f"the scan stopped at p {p} although the next grid value was not tried: {tried}"
    else:
        assert p == P_GRID[0] and grid == [P_GRID[0]], f"no p met the agreement, yet p = {p} (tried {grid})"
