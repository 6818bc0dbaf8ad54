"""The method's own settings, one click (or one word) away: in Settings (the UI and the API) and the CLI."""

from __future__ import annotations

import pytest

from dropmatch.bench import build_parser
from dropmatch.bench.cli import apply_preset
from dropmatch.decoding.config import METHOD_SETTINGS, ConfigError, Settings


def test_the_method_preset_gives_dropmatch_with_k5_p03_and_the_mean_centroid():
    """Settings(preset="method") parses to the method's operating point whatever its other knobs say."""
    decode, rule = Settings(prompt="x", preset="method", k=9, p="auto", centroid="logits", rule="typical").parse()
    assert (rule.rule, rule.num_paths, rule.p, rule.centroid, rule.majority_fraction) == ("dropmatch", 5, 0.3, "probs", 0.8)
    assert Settings(prompt="x").parse()[1].p is None  # no preset: the defaults stand


def test_an_unknown_preset_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="unknown preset 'paper'; choose one of method"):
        Settings(prompt="x", preset="paper").parse()


def test_the_benchmark_preset_sets_the_knobs_and_leaves_the_rules_to_rules():
    """dropmatch-bench --preset method: K 5, p 0.3, probs, 0.8 over the flags; --rules untouched."""
    args = build_parser().parse_args(["--prompts", "x.jsonl", "--preset", "method", "--k", "7", "--rules", "lossless,js"])
    apply_preset(args)
    assert (args.k, args.p, args.centroid, args.majority_fraction) == (5, "0.3", "probs", 0.8)
    assert args.rules == "lossless,js"
    assert METHOD_SETTINGS["rule"] == "dropmatch"
