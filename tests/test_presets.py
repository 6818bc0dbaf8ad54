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


def test_the_methods_operating_point_is_written_once_as_the_knobs_defaults(monkeypatch):
    """The preset, the app's note, generate()'s default rule and the vLLM plugin's read the knobs' defaults: a
    changed default changes what generate() and the plugin run."""
    import dataclasses

    from dropmatch.decoding import acceptance
    from dropmatch.decoding.hf_generate import default_rule
    from dropmatch.serving.vllm.settings import ServeSettings
    from dropmatch.ui.listeners import method_note

    knobs = acceptance.KNOBS
    assert (METHOD_SETTINGS["k"], float(METHOD_SETTINGS["p"]), METHOD_SETTINGS["majority_fraction"]) == \
        (knobs["num_paths"].default, knobs["p"].default, knobs["majority_fraction"].default)
    assert f"K {knobs['num_paths'].default} paths, p {knobs['p'].default:g}" in method_note()
    monkeypatch.setitem(knobs, "p", dataclasses.replace(knobs["p"], default=0.25))
    assert default_rule().p == 0.25 and ServeSettings().rule.p == 0.25


def test_the_decode_fields_are_knobs_checked_by_the_knobs_code():
    """Every DecodeConfig field has its Knob (config.DECODE_KNOBS), and a bad value is that knob's one-line error."""
    import dataclasses

    from dropmatch.decoding.config import DECODE_KNOBS, DecodeConfig

    assert [f.name for f in dataclasses.fields(DecodeConfig)] == list(DECODE_KNOBS)
    for name, bad in (("gamma", 0), ("top_p", 0.0), ("temperature", 9), ("seed", -1), ("draft_source", "x")):
        with pytest.raises(ConfigError) as error:
            DecodeConfig(**{name: bad})
        with pytest.raises(ConfigError) as direct:
            DECODE_KNOBS[name].check(bad)
        assert str(error.value) == str(direct.value)
