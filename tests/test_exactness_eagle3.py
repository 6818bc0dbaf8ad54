"""Lossless SD on EAGLE-3 drafts keeps the target's distribution: test_exactness's chi-square over the same
bigram pair, in a file of its own so that the suite's two workers share the seeded runs."""

from __future__ import annotations

import pytest

from test_exactness import EAGLE3_CONFIGS, bigram_engine, bigram_pair, check_lossless_sampling, fast_engine

__all__ = ["bigram_engine", "bigram_pair", "fast_engine"]  # test_exactness's fixtures, used here


@pytest.mark.slow  # 6,000 seeded runs a configuration
@pytest.mark.parametrize("name", list(EAGLE3_CONFIGS))
def test_lossless_sampling_on_eagle3_drafts_equals_the_targets_own_sampling(bigram_engine, fast_engine, name):
    """The joint distribution of the first three tokens of lossless SD at T = 0.8 on EAGLE-3 drafts equals the
    target's own (exact) distribution."""
    check_lossless_sampling(bigram_engine, fast_engine, name, EAGLE3_CONFIGS[name])
