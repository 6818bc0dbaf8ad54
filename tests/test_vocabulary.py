"""One vocabulary of rules and reasons: a rule registered once reaches every consumer."""

from __future__ import annotations

import pytest
import torch
from fake_engine import FakeEngine

from dropmatch.decoding import acceptance, verifying
from dropmatch.decoding.acceptance import REASONS, RULES, Reason, Rule
from dropmatch.rule_words import REASON_WORDS, RULE_WORDS, ReasonWords, RuleWords
from dropmatch.decoding.config import ConfigError, DecodeConfig, RuleConfig, rule_names
from reference_rules import decide


@pytest.fixture()
def coin_rule():
    """A fake lossy rule, 'coin', accepting every other drafted position, with a reason of its own."""
    def check(signals, cfg):
        positions = torch.arange(signals.draft_tokens.shape[0])
        return [("heads", positions % 2 == 1)]

    acceptance.register_reason(Reason("heads", lossy=True))
    REASON_WORDS["heads"] = ReasonWords("heads", "accepted by the coin", "#123456", "#abcdef", "#1a237e",
                                        "underline dotted", says="{tok} came up heads (draft p {q_x:.2f}).",
                                        fails="the coin came up tails for {tok}")
    acceptance.register_rule(Rule("coin", "coin flip", lossy=True, uses_paths=True, check=check, checks=("heads",)))
    RULE_WORDS["coin"] = RuleWords("#123456")
    yield "coin"
    RULES.pop("coin")
    REASONS.pop("heads")
    RULE_WORDS.pop("coin")
    REASON_WORDS.pop("heads")


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
    """Rule.checks (what the sentences, lessons and lab read) names exactly what its check returns (a rule
    without a check of its own tries the TESTS its checks name, so each of those must have a test)."""
    assert RULES[name].check is not acceptance.tests_in_order or set(RULES[name].checks) <= set(acceptance.TESTS)
    assert set(acceptance.TESTS) <= set(acceptance.REASONS), "a test of no reason"
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
    assert all(REASON_WORDS[reason].says and REASON_WORDS[reason].fails for reason in given), "a reason without its sentences"


def test_every_rule_and_reason_of_the_decision_table_has_its_words_and_no_more():
    """The words table (rule_words) is keyed by the decision table's names: each rule, reason and knob has one entry."""
    from dropmatch.rule_words import KNOB_HELP

    assert list(REASON_WORDS) == list(REASONS) and set(RULE_WORDS) == set(RULES) and set(KNOB_HELP) == set(acceptance.KNOBS)


CSS_COLOUR_NAMES = {"red", "green", "blue", "black", "white", "gray", "grey", "orange", "purple", "yellow", "pink",
                    "brown", "cyan", "magenta", "navy", "teal", "olive", "maroon", "lime", "silver", "gold", "crimson"}


def colour_literals(source: str) -> list[str]:
    """The string literals of a module's source that hold a colour: #rgb / #rrggbb, rgb(...), a CSS colour
    property, or a named CSS colour as the whole value."""
    import io
    import re
    import tokenize

    colour = re.compile(r"#[0-9a-fA-F]{3}(?:[0-9a-fA-F]{3})?(?![0-9A-Za-z])|rgba?\(|(?:colou?r|background)\s*:")
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING:
            value = token.string.strip("rbfuRBFU").strip("\"'")
            if colour.search(value) or value.strip().lower() in CSS_COLOUR_NAMES:
                found.append(f"line {token.start[0]}: {token.string[:60]}")
    return found


def test_the_method_package_holds_no_colour_literal():
    """No module of the method package (dropmatch/decoding/) carries a colour: a rule's colours are its words
    (rule_words.py), beside the renderer."""
    from pathlib import Path

    assert colour_literals('x = "#0d47a1"\ny = "red"\nz = f"color: {c}"') and not colour_literals('k = "#53987"')
    modules = sorted(Path(acceptance.__file__).parent.glob("*.py"))
    assert len(modules) > 10
    for path in modules:
        assert not colour_literals(path.read_text()), f"decoding/{path.name}: {colour_literals(path.read_text())}"


def test_no_module_but_the_rule_table_names_the_baseline_rule_as_a_literal():
    """Lossless SD's rule name is read from the table (acceptance.BASELINE): no comparison with, nor a rule set to,
    the literal "lossless" elsewhere in the package or the app (a column of the run file may keep that key)."""
    import re
    from pathlib import Path

    literal = re.compile(r'(==|!=)\s*"lossless"|"lossless"\s*(==|!=)|rule\s*=\s*"lossless"|RuleConfig\("lossless"'
                         r'|"rule":\s*"lossless"|label\s*!=\s*"lossless"')
    root = Path(acceptance.__file__).parents[1]
    found = [f"{path.relative_to(root.parent)}:{n}" for path in [*root.rglob("*.py"), root.parent / "app.py"]
             if path.name != "acceptance.py" for n, line in enumerate(path.read_text().splitlines(), 1)
             if literal.search(line)]
    assert not found, found
