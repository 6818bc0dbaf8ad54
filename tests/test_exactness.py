"""Lossless speculative sampling is exact through the engine's whole loop: later draft slots, the
bonus token, top-p, prompt-lookup, hybrid and EAGLE-3 drafts, gamma = auto and draft confidence.

The pair is two bigram Llamas (tests/tiny_models.make_bigram_llama) living on three tokens, so the
target's own sampling distribution of a continuation is exact (a product of its rows, read from the
target itself) and the joint of the first three generated tokens has 27 cells. Many seeded runs of
the engine give an empirical joint; a chi-square test compares it with the exact one.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

from dropmatch.decoding import eagle3
from dropmatch.decoding.config import DecodeConfig, PairSpec, RuleConfig
from dropmatch.decoding.engine import Engine, run_to_end
from dropmatch.models import load_hub_pair
from dropmatch.decoding.sampling import sampling_probs

TOKENS = (10, 11, 12)
TEMPERATURE = 0.8
# Rows as probabilities at TEMPERATURE (logits = T * log p). The draft disagrees with the target and
# puts 0.15-0.25 on some tokens, so that a draft confidence of 0.3 falls between its probabilities.
TARGET_ROWS = {10: (0.5, 0.3, 0.2), 11: (0.2, 0.5, 0.3), 12: (0.3, 0.2, 0.5)}
DRAFT_ROWS = {10: (0.2, 0.2, 0.6), 11: (0.6, 0.25, 0.15), 12: (0.25, 0.6, 0.15)}
PROMPT = [10, 11, 12, 10, 12, 11, 10, 11]  # recurring n-grams: prompt lookup proposes often
RUNS = 6000
ALPHA = 1e-4  # per configuration; the suite runs a handful


def _table(rows: dict) -> dict:
    return {previous: {token: TEMPERATURE * math.log(p) for token, p in zip(TOKENS, probs)}
            for previous, probs in rows.items()}


@pytest.fixture(scope="module")
def bigram_pair(tmp_path_factory):
    """The bigram pair as the real loader loads it (real Llamas, the real adapter)."""
    from tiny_models import save_bigram_pair

    target, draft = save_bigram_pair(tmp_path_factory.mktemp("bigram"), _table(TARGET_ROWS), _table(DRAFT_ROWS))
    return load_hub_pair(PairSpec(str(target), str(draft)), torch.device("cpu"))


@pytest.fixture(scope="module")
def bigram_engine(bigram_pair):
    """The engine over the real adapter: what the exact joint is read from."""
    return Engine(bigram_pair)


@pytest.fixture(scope="module")
def fast_engine(bigram_pair, tmp_path_factory):
    """The same pair with its decoders replaced by the table they compute (tiny_models.fast_bigram_pair):
    what the thousands of seeded runs go through; with a random EAGLE-3 head over its target whose draft
    vocabulary holds two of the three tokens and one the target never gives (the eagle3 source)."""
    from tiny_models import fast_bigram_pair, save_eagle3_head

    fast = fast_bigram_pair(bigram_pair)
    folder = save_eagle3_head(tmp_path_factory.mktemp("bigram_head"), fast.target.model, [4, 10, 11], (0, 0, 0),
                              hidden=16, sharpness=0.5)  # narrow (thousands of runs); smooth drafts, varied q
    return Engine(replace(fast, head=eagle3.load_head(folder, fast.target)))


def test_the_fast_bigram_pair_computes_the_real_models_hidden_states_and_logits(bigram_pair):
    """Every token of the three after the prompt: the table's hidden row and logits equal the real
    decoder's, for target and draft, so the sampled runs below are runs of the real pair."""
    from tiny_models import fast_bigram_pair

    fast = fast_bigram_pair(bigram_pair)
    ids = torch.tensor(PROMPT + list(TOKENS) * 2)
    for real, quick in ((bigram_pair.target, fast.target), (bigram_pair.draft, fast.draft)):
        real.layers_kept = quick.layers_kept = (0, 0)  # what an EAGLE-3 head reads, as the engine's runs keep it
        real_hidden, quick_hidden = real.hidden(ids, real.new_cache()), quick.hidden(ids, quick.new_cache())
        real.layers_kept = ()
        torch.testing.assert_close(quick_hidden, real_hidden, rtol=0, atol=1e-6)
        torch.testing.assert_close(quick.logits(quick_hidden), real.logits(real_hidden), rtol=0, atol=1e-4)
        torch.testing.assert_close(quick.kept_inputs[1], real.kept_inputs[1], rtol=0, atol=1e-6)


def exact_joint(engine: Engine, decode: DecodeConfig, length: int = 3) -> dict[tuple[int, ...], float]:
    """The target's own sampling distribution of the first `length` tokens after PROMPT (temperature
    and top-p applied), from the target's logits at every prefix."""
    joint = {}
    for continuation in itertools.product(TOKENS, repeat=length):
        ids = torch.tensor(PROMPT + list(continuation[:-1]))
        hidden = engine.target.hidden(ids, engine.target.new_cache())
        probs = sampling_probs(engine.target.logits(hidden[len(PROMPT) - 1:]), decode.temperature, decode.top_p)
        joint[continuation] = math.prod(float(probs[i, token]) for i, token in enumerate(continuation))
    return joint


def sampled_joint(engine: Engine, decode: DecodeConfig, runs: int, length: int = 3) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(runs):
        trace = run_to_end(engine.speculative(PROMPT, replace(decode, seed=seed), RuleConfig("lossless")))
        key = tuple(trace.output_ids[:length])
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi_square(counts: dict, exact: dict, runs: int) -> tuple[float, int]:
    """(Pearson's statistic, degrees of freedom) over the cells expected at least 5 times, the rest
    pooled into one; a sampled sequence the target cannot produce counts against the test."""
    expected = {cell: runs * p for cell, p in exact.items()}
    big = [cell for cell, e in expected.items() if e >= 5]
    rest_expected = runs - sum(expected[cell] for cell in big)
    rest_count = runs - sum(counts.get(cell, 0) for cell in big)
    statistic = sum((counts.get(cell, 0) - expected[cell]) ** 2 / expected[cell] for cell in big)
    if rest_expected > 0:
        statistic += (rest_count - rest_expected) ** 2 / rest_expected
    elif rest_count:
        statistic = math.inf  # tokens the target gives probability 0
    return statistic, len(big) - (0 if rest_expected > 0 else 1)


def chi_square_quantile(df: int, alpha: float) -> float:
    """The upper-alpha quantile of chi-square(df) (Wilson-Hilferty; within a few per cent for df >= 10)."""
    z = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(1.0 - alpha)).item()
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def detectable_bias(exact: dict, runs: int, df: int, alpha: float) -> float:
    """The smallest mass moved between the two likeliest cells whose expected statistic (df plus the
    noncentrality) reaches the test's threshold: what this many runs can catch."""
    first, second = sorted(exact.values(), reverse=True)[:2]
    excess = chi_square_quantile(df, alpha) - df
    return math.sqrt(excess / (runs * (1 / first + 1 / second)))


CONFIGS = {  # every draft source, gamma fixed and auto, top-p < 1
    "model, gamma 3": dict(gamma=3, draft_source="model"),
    "model, gamma auto, top-p 0.75": dict(gamma=8, gamma_auto=True, draft_source="model", top_p=0.75),
    "ngram, gamma 3": dict(gamma=3, draft_source="ngram"),
    "hybrid, gamma auto, top-p 0.75": dict(gamma=8, gamma_auto=True, draft_source="hybrid", top_p=0.75),
}
# EAGLE-3's chain (later slots, the bonus) at a fixed length; gamma = auto's choice is the same code as above.
# Its own file (test_exactness_eagle3.py) runs it, so the suite's two workers share the seeded runs.
EAGLE3_CONFIGS = {"eagle3, gamma 3, top-p 0.75": dict(gamma=3, draft_source="eagle3", top_p=0.75)}


@pytest.mark.slow  # 6,000 seeded runs a configuration
@pytest.mark.parametrize("name", list(CONFIGS))
def test_lossless_sampling_through_the_engine_equals_the_targets_own_sampling(bigram_engine, fast_engine, name):
    """The joint distribution of the first three tokens of lossless SD at T = 0.8 equals the
    target's own (exact) distribution, for every draft source, gamma = auto and top-p."""
    check_lossless_sampling(bigram_engine, fast_engine, name, CONFIGS[name])


def check_lossless_sampling(bigram_engine, fast_engine, name: str, config: dict) -> None:
    """Pearson's chi-square of RUNS seeded runs of `config` against the exact joint, at ALPHA."""
    decode = DecodeConfig(max_new_tokens=4, temperature=TEMPERATURE, **config)
    exact = exact_joint(bigram_engine, decode)
    counts = sampled_joint(fast_engine, decode, RUNS)
    statistic, df = chi_square(counts, exact, RUNS)
    threshold = chi_square_quantile(df, ALPHA)
    assert detectable_bias(exact, RUNS, df, ALPHA) <= 0.02, "too few runs to catch a bias of 0.02"
    worst = max(exact, key=lambda cell: abs(counts.get(cell, 0) / RUNS - exact[cell]))
    assert statistic <= threshold, (
        f"{name}: chi-square {statistic:.1f} > {threshold:.1f} (df {df}); worst cell {worst}: "
        f"{counts.get(worst, 0) / RUNS:.4f} sampled vs {exact[worst]:.4f} exact")
