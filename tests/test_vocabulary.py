"""One vocabulary of rules and reasons: a rule registered once reaches every consumer."""

from __future__ import annotations

import pytest
import torch
from fake_engine import FakeEngine

from dropmatch.decoding import acceptance, verifying
from dropmatch.decoding.acceptance import REASONS, RULES, Reason, Rule
from dropmatch.decoding.config import ConfigError, DecodeConfig, RuleConfig, rule_names
from reference_rules import decide


@pytest.fixture()
def coin_rule():
    """A fake lossy rule, 'coin', accepting every other drafted position, with a reason of its own."""
    def check(signals, cfg):
        positions = torch.arange(signals.draft_tokens.shape[0])
        return [("heads", positions % 2 == 1)]

    acceptance.register_reason(Reason("heads", "heads", "accepted by the coin", "#123456", "#abcdef", "#1a237e",
                                      "underline dotted", lossy=True, says="{tok} came up heads (draft p {q_x:.2f}).",
                                      fails="the coin came up tails for {tok}"))
    acceptance.register_rule(Rule("coin", "coin flip", lossy=True, uses_paths=True, colour="#123456", check=check,
                                  checks=("heads",)))
    yield "coin"
    RULES.pop("coin")
    REASONS.pop("heads")


def test_a_registered_rule_reaches_config_metrics_render_plots_and_the_ui(coin_rule):
    """Config accepts it, the fake engine's run reports its reason, the lossy share counts it, the
    legend, stylesheet and tooltips name it, the JS chart colours it, the UI offers it."""
    from dropmatch import metrics, plots, render
    from dropmatch.ui.views import lossy_rule_choices
    from dropmatch.compare import compare_stream

    assert coin_rule in rule_names() and RuleConfig(coin_rule).rule == coin_rule
    with pytest.raises(ConfigError, match="unknown rule"):
        RuleConfig("dice")
    signals = verifying.position_signals(torch.tensor([1, 2, 3]), torch.full((3, 4), 0.25), torch.eye(4)[[0, 0, 0]])
    verdict = decide(RuleConfig(coin_rule), True, signals, torch.full((3, 4), 0.25),
                                torch.eye(4)[[0, 0, 0, 0]], torch.Generator(), checks=acceptance.RULES[coin_rule].check)
    assert verdict.reasons == ("rejected", "unchecked", "unchecked")  # position 0 is tails

    engine = FakeEngine(reason_for={coin_rule: "heads"})
    *_, state = compare_stream(engine, "a b c d e f g h", DecodeConfig(max_new_tokens=8), RuleConfig(coin_rule))
    lossy = state.lossy.trace
    assert any(d.reason == "heads" for r in lossy.rounds for d in r.drafted)
    assert metrics.lossy_share(lossy) > 0 and "heads" in acceptance.lossy_reasons()
    css = render.css()  # its highlight, an explicit text colour, its cue, and its dark variant
    assert "heads" in render.legend_html() and ".dm-heads { background: #abcdef; color: " in css
    assert "text-decoration: underline dotted;" in css and ".dark .dm-heads { background: #1a237e;" in css
    spans = render.token_spans(lossy.first_token, list(lossy.rounds), engine.services.token_text)
    assert any(kind == "heads" and "accepted by the coin" in tip for _, kind, tip in spans)
    accepted = next(d for r in lossy.rounds for d in r.drafted if d.reason == "heads")
    assert render.explain(accepted, engine.services.token_text, RuleConfig(coin_rule)) == \
        f"“{engine.services.token_text(accepted.token)}” came up heads (draft p {accepted.draft_prob:.2f})."
    rejected = next(d for r in lossy.rounds for d in r.drafted if d.reason == "rejected")
    assert "the coin came up tails for" in render.explain(rejected, engine.services.token_text, RuleConfig(coin_rule))
    heads = [t for t in plots.js_scatter(lossy, engine.services.token_text).data if t.name == "heads"]
    assert heads and heads[0].marker.color == "#123456"
    assert (RULES[coin_rule].label, coin_rule) in lossy_rule_choices()


@pytest.mark.parametrize("name", list(RULES))
def test_a_rule_declares_the_reasons_its_check_gives_in_order(name):
    """Rule.checks (what the sentences, lessons and lab read) names exactly what its check function returns."""
    signals = verifying.position_signals(torch.tensor([1, 2]), torch.full((2, 4), 0.25), torch.eye(4)[[0, 0]])
    paths = torch.zeros(5, 2, dtype=torch.long)
    signals = acceptance.Signals(**{**vars(signals), "path_tokens": paths, "js_draft_centroid": torch.zeros(2),
                                    "js_threshold": torch.zeros(2), "majority_tokens": torch.zeros(2, dtype=torch.long),
                                    "majority_votes": torch.zeros(2, dtype=torch.long),
                                    "draft_votes": torch.zeros(2, dtype=torch.long), "judge_scores": torch.zeros(2),
                                    "exact": torch.zeros(2, dtype=torch.bool), "coin": torch.zeros(2),
                                    "target_top3_entropy": torch.zeros(2), "sample_target_prob": torch.zeros(2),
                                    "sample_draft_prob": torch.full((2,), 0.5), "target_logit_ratio": torch.ones(2),
                                    "rule_top": torch.zeros(2, dtype=torch.long)})
    given = tuple(reason for reason, _ in RULES[name].check(signals, RuleConfig(name, judge_threshold=0.5)))
    assert given == RULES[name].checks
    assert all(REASONS[reason].says and REASONS[reason].fails for reason in given), "a reason without its sentences"
