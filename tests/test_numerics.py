"""The JS rule's comparison against a float64 reference, on vocabulary-sized rows built to sit near
the threshold: float32 cancellation must not decide a verdict."""

from __future__ import annotations

import torch

from dropmatch.decoding.verifying import settle_close_calls
from dropmatch.decoding.mc_head import path_stats
from dropmatch.decoding.sampling import fast_js_error, js_divergence, js_divergence_accurate

V = 49_152  # the embedded target's vocabulary


def js_float64(p_a: torch.Tensor, p_b: torch.Tensor) -> torch.Tensor:
    """The reference: two KL terms in float64, 0 log 0 = 0."""
    a, b = p_a.double(), p_b.double()
    mixture = (a + b) / 2
    return 0.5 * (torch.special.xlogy(a, a / mixture).nansum(-1) + torch.special.xlogy(b, b / mixture).nansum(-1))


def confident_paths(seed: int, num_paths: int = 5, spread: float = 0.02):
    """K path distributions of one confident position (a token at ~0.99), close to one another."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, V, generator=generator) * 2.0
    logits[0, 7] += 14.0
    noise = torch.randn(num_paths, 1, V, generator=generator) * spread
    return path_stats(logits.unsqueeze(0) + noise, temperature=0.0)


def draft_at(stats, target_js: float) -> torch.Tensor:
    """q [1, V] = centroid + t (path 0 - centroid), t bisected in float64 so that JS(q || centroid) is
    target_js: a draft whose divergence sits exactly where we want it against the threshold."""
    centroid = stats.centroid.double()
    direction = stats.probs[0].double() - centroid
    low, high = 0.0, 50.0
    for _ in range(64):
        middle = (low + high) / 2
        q = (centroid + middle * direction).clamp_min(0.0)
        if float(js_float64(q / q.sum(-1, keepdim=True), centroid)) < target_js:
            low = middle
        else:
            high = middle
    q = (centroid + low * direction).clamp_min(0.0)
    return (q / q.sum(-1, keepdim=True)).float()


def test_accurate_js_equals_float64_to_1e_5_relative_where_the_fast_form_is_off_by_percents():
    """JS near 1e-5 (confident rows): the accurate form within 1e-5 of float64, the fast one within its stated bound."""
    worst_accurate, worst_fast, bound_used = 0.0, 0.0, 0.0
    for seed in range(8):
        stats = confident_paths(seed)
        reference = js_float64(stats.probs, stats.centroid.unsqueeze(0)).flatten()
        assert float(reference.max()) < 1e-3
        accurate = js_divergence_accurate(stats.probs, stats.centroid.unsqueeze(0)).flatten()
        fast = js_divergence(stats.probs, stats.centroid.unsqueeze(0)).double().flatten()
        worst_accurate = max(worst_accurate, float(((accurate - reference) / reference).abs().max()))
        worst_fast = max(worst_fast, float(((fast - reference) / reference).abs().max()))
        bound_used = max(bound_used, float((fast - reference).abs().max()) / fast_js_error(V))
    assert worst_accurate < 1e-5
    assert worst_fast > 1e-3  # why the accurate form exists: float32 cancellation, visible at this size
    assert bound_used < 0.5  # the stated bound holds with room


def test_a_comparison_closer_than_float32_can_see_is_decided_as_float64_decides_it():
    """Drafts at threshold x (1 -+ 2e-4): the settled comparison equals float64's each time; the fast one does not."""
    settled_right, fast_right, cases = 0, 0, 0
    for seed in range(6):
        stats = confident_paths(seed)
        threshold64 = float(js_float64(stats.probs, stats.centroid.unsqueeze(0)).max())
        for side in (-1, 1):
            q = draft_at(stats, threshold64 * (1 + side * 2e-4))
            truth = float(js_float64(q, stats.centroid)) <= threshold64
            fast_js = js_divergence(q, stats.centroid)
            js, threshold = settle_close_calls(q, stats, fast_js)
            on_device = settle_close_calls(q, stats, fast_js, on_host=False)  # no sync: the same values
            assert torch.equal(on_device[0], js) and torch.equal(on_device[1], threshold)
            settled_right += bool(js <= threshold) == truth
            fast_right += bool(fast_js <= stats.threshold) == truth
            cases += 1
    assert settled_right == cases
    assert fast_right < cases  # the fast form alone flips some of these verdicts


def test_far_apart_comparisons_are_left_to_the_fast_form():
    """A draft far from the threshold: the values come back unchanged (no accurate pass paid)."""
    stats = confident_paths(0)
    q = torch.full((1, V), 1.0 / V)
    fast_js = js_divergence(q, stats.centroid)
    js, threshold = settle_close_calls(q, stats, fast_js)
    assert js is fast_js and threshold is stats.threshold
    on_device = settle_close_calls(q, stats, fast_js, on_host=False)
    assert torch.equal(on_device[0], fast_js) and torch.equal(on_device[1], stats.threshold)
