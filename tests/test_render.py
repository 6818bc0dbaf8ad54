"""What the UI shows is derived from traces: token colours, sentences, figures."""

from __future__ import annotations

from fake_engine import FakeEngine

from dropmatch.config import DecodeConfig, RuleConfig
from dropmatch.engine import run_to_end
from dropmatch.plots import all_figures
from dropmatch.render import explain, step_html, text_html, token_spans

PROMPT = "one two three four five six seven eight nine ten"


def traces(rule: str = "dropmatch"):
    engine = FakeEngine()
    ids = engine.encode(PROMPT)
    decode = DecodeConfig(gamma=4, max_new_tokens=64)
    lossless = run_to_end(engine.speculative(ids, decode, RuleConfig("lossless")))
    lossy = run_to_end(engine.speculative(ids, decode, RuleConfig(rule, p=0.2)))
    return engine, lossless, lossy


def test_every_emitted_token_gets_a_colour_and_the_text_reads_back():
    engine, lossless, lossy = traces()
    spans = token_spans(lossy.first_token, list(lossy.rounds), engine.token_text, engine.stop_ids)
    assert "".join(text for text, _, _ in spans).strip() == PROMPT
    kinds = {kind for _, kind, _ in spans}
    assert {"first", "exact", "js", "correction"} <= kinds
    html = text_html(spans)
    assert html.count('class="dm-tok') == len(spans) and "title=" in html


def test_each_decision_has_a_sentence_with_its_numbers():
    engine, lossless, lossy = traces()
    drafted = [d for trace in (lossy, lossless) for r in trace.rounds for d in r.drafted]
    by_reason = {d.reason: explain(d, engine.token_text) for d in reversed(drafted)}  # lossy's win
    assert "JS 0.0100 ≤ threshold 0.0200" in by_reason["js"]
    assert "rejected" in by_reason["rejected"] and "paths chose it" in by_reason["rejected"]
    assert "earlier token" in by_reason["unchecked"]


def test_step_view_lists_every_path_and_the_decision():
    engine, _, lossy = traces()
    page = step_html(lossy.rounds[0], engine.token_text)
    assert page.count("<th>path") == 5 and "JS / threshold" in page and "decision" in page


def test_figures_have_data_and_say_so_when_a_rule_has_no_paths():
    engine, lossless, lossy = traces()
    figures = all_figures(lossless, lossy, None, engine.token_text)
    assert all(fig.data for fig in figures.values())
    typical = traces("typical")[2]
    heatmap = all_figures(lossless, typical, None, engine.token_text)["agreement"]
    assert not heatmap.data and "no Monte-Carlo paths" in heatmap.layout.annotations[0].text
