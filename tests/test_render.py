"""What the UI shows is derived from traces: token colours, sentences, figures."""

from __future__ import annotations

from fake_engine import FakeEngine

from dropmatch.decoding.config import DecodeConfig, RuleConfig
from dropmatch.decoding.engine import run_to_end
from dropmatch.plots import all_figures
from dropmatch.render import END_TEXT, explain, step_html, text_html, token_spans

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
    spans = token_spans(lossy.first_token, list(lossy.rounds), engine.services.token_text, engine.stop_ids)
    assert "".join(text for text, _, _ in spans).strip() == PROMPT + END_TEXT  # the end of text is a new token too
    kinds = {kind for _, kind, _ in spans}
    assert {"first", "exact", "js", "correction"} <= kinds
    html = text_html(spans)
    assert html.count('class="dm-tok') == len(spans) and "data-tip=" in html and "title=" not in html


def test_a_rejected_draft_holding_part_of_a_character_shows_a_circle_in_the_column_and_its_bytes_in_the_popover():
    """Struck through among Arabic letters, a byte label such as "<0xF0><0x9F>" would be split by bidi: the column
    shows the draft's whole characters only ("◌" where there are none); its popover keeps the bytes."""
    engine, lossless, _ = traces()
    rounds = [r for r in lossless.rounds if r.extra_kind == "correction" and r.num_accepted < len(r.drafted)]
    assert rounds
    refused = {r.drafted[r.num_accepted].token for r in rounds}
    def shown(token: int) -> str:  # the refused drafts as byte tokens of an emoji
        return " <0xF0><0x9F>" if token in refused else engine.services.token_text(token)

    spans = token_spans(lossless.first_token, rounds, shown, engine.stop_ids, rejected=True)
    struck = [(text, tip) for text, kind, tip in spans if kind == "rejected"]
    assert struck and all(text == " ◌" for text, _ in struck), struck
    assert all("<0xF0><0x9F>" in tip for _, tip in struck)


def test_every_accepted_drafted_tokens_popover_ends_with_the_rules_sentence():
    from dropmatch.render import explainer

    engine, _, lossy = traces()
    why = explainer(engine.services.token_text, lossy.decode_config, lossy.rule_config)
    spans = token_spans(lossy.first_token, list(lossy.rounds), engine.services.token_text, engine.stop_ids, why)
    drafted = [tip for _, kind, tip in spans if kind in ("exact", "js")]
    assert drafted and all("\nwhy: " in tip for tip in drafted)
    assert any("JS 0.0100 ≤ threshold 0.0200" in tip for tip in drafted)


def test_a_js_acceptance_of_a_token_the_target_all_but_rules_out_says_why_js_may():
    """The teaching moment: JS compares whole distributions, so it may accept a token at target p ≈ 0."""
    import dataclasses

    engine, _, lossy = traces()
    accepted = next(d for r in lossy.rounds for d in r.drafted if d.reason == "js")
    unlikely = dataclasses.replace(accepted, target_prob=0.0004)
    assert "whole distribution" in explain(unlikely, engine.services.token_text, lossy.rule_config)
    assert "whole distribution" not in explain(dataclasses.replace(accepted, target_prob=0.3), engine.services.token_text, lossy.rule_config)


def test_each_decision_has_a_sentence_with_its_numbers():
    engine, lossless, lossy = traces()
    drafted = [d for trace in (lossy, lossless) for r in trace.rounds for d in r.drafted]
    by_reason = {d.reason: explain(d, engine.services.token_text, lossy.rule_config) for d in reversed(drafted)}  # lossy's win
    assert "JS 0.0100 ≤ threshold 0.0200" in by_reason["js"]
    assert "rejected" in by_reason["rejected"] and "paths chose it" in by_reason["rejected"]
    assert "earlier token" in by_reason["unchecked"]


def test_step_view_lists_every_path_and_the_decision():
    engine, _, lossy = traces()
    page = step_html(lossy.rounds[0], engine.services.token_text, lossy.rule_config)
    assert page.count("<th>path") == 5 and "JS / threshold" in page and "decision" in page


def test_figures_have_data_and_say_so_when_a_rule_has_no_paths():
    engine, lossless, lossy = traces()
    figures = all_figures(lossless, lossy, None, engine.services.token_text)
    assert all(fig.data for fig in figures.values())
    typical = traces("typical")[2]
    heatmap = all_figures(lossless, typical, None, engine.services.token_text)["agreement"]
    assert not heatmap.data and "no Monte-Carlo paths" in heatmap.layout.annotations[0].text.replace("<br>", " ")


def _metrics(**fields):
    from dropmatch.metrics import RunMetrics

    base = dict(label="x", p=None, new_tokens=96, rounds=66, target_calls=67, tau=1.44, drafted=100, accepted=40,
                acceptance_rate=0.4, per_position_acceptance=(), tokens_per_s=10.0, wall_s=9.6, prefill_s=0.1,
                draft_s=1.0, verify_s=5.0, head_s=1.0, mc_s=0.5, other_s=0.1, mc_overhead=0.05, lossy_share=0.0,
                lossy_count=0, speedup_vs_ar=1.2)
    return RunMetrics(**{**base, **fields})


def test_the_verdict_says_target_calls_per_token_the_rules_own_share_and_the_texts_change():
    """Numbers per token (the two columns may stop at different lengths), each taken from the metrics."""
    from dropmatch.render import verdict

    lossless = _metrics(new_tokens=63, target_calls=47, tau=1.35)
    lossy = _metrics(new_tokens=96, target_calls=67, tau=1.44, lossy_count=4, lossy_share=4 / 96, first_divergence=10,
                     delta_target_nll=0.05, delta_off_nucleus_rate=0.003)
    text = verdict(lossless, lossy, "DropMatch")
    assert text.startswith("DropMatch needed 6% fewer target calls per token than lossless SD, and its text departs "
                           "from lossless SD's at token 11.\n\nTarget calls: 67 for 96 tokens against 47 for 63; tau "
                           "1.44 against 1.35.")
    assert "4 of its 96 tokens (4%) were accepted only by the rule." in text
    assert "departs from lossless SD's at token 11" in text and "+0.050 nats/token" in text and "+0.3 points" in text
    assert "too few rounds to measure their spread" in text and "slower than the target alone" not in text


def test_a_speed_difference_is_called_only_beyond_the_spread_the_runs_rounds_show():
    from dropmatch.render import verdict

    lossless, lossy = _metrics(tokens_per_s=10.0), _metrics(tokens_per_s=12.0)
    assert ": faster, beyond the spread" in verdict(lossless, lossy, "DropMatch", (1.1, 1.3))
    assert ": slower, beyond the spread" in verdict(lossless, lossy, "DropMatch", (0.8, 0.95))
    text = verdict(lossless, lossy, "DropMatch", (0.9, 1.4))
    assert "within the spread of its rounds' timings (0.90x-1.40x" in text and "not called a win or a loss" in text


def _timed_trace(seconds_per_round: list[float], tokens: int = 2):
    import dataclasses

    engine, lossless, _ = traces()
    template = lossless.rounds[0]
    rounds = tuple(dataclasses.replace(template, index=i, emitted=(template.emitted[0],) * tokens, t_round=t)
                   for i, t in enumerate(seconds_per_round))
    # consistent end to end (what the interval resamples): no prefill time, every round's tokens in the output
    output = (lossless.output_ids[0],) + tuple(token for r in rounds for token in r.emitted)
    return dataclasses.replace(lossless, rounds=rounds, output_ids=output, t_prefill=0.0, t_calibration=0.0,
                               t_total=sum(seconds_per_round))


def test_the_speed_interval_comes_from_resampling_each_columns_rounds():
    from dropmatch.metrics import speed_ratio_interval

    steady, twice = _timed_trace([0.1] * 20), _timed_trace([0.05] * 20)
    low, high = speed_ratio_interval(steady, twice)
    assert abs(low - 2.0) < 1e-9 and abs(high - 2.0) < 1e-9  # no spread: exactly twice as fast
    noisy = _timed_trace(([0.02] * 5 + [0.18] * 5) * 2)  # as fast on average, in very uneven stretches
    low, high = speed_ratio_interval(steady, noisy)
    assert low < 1.0 < high  # rounds this uneven cannot tell the two apart
    assert speed_ratio_interval(_timed_trace([0.1] * 3), twice) is None


def test_the_verdict_says_when_both_sd_columns_ran_slower_than_the_target_alone():
    from dropmatch.render import verdict

    text = verdict(_metrics(speedup_vs_ar=0.75), _metrics(speedup_vs_ar=0.84, first_divergence=None), "DropMatch")
    assert "as many target calls per token" in text and "its text is lossless SD's, token for token." in text
    assert "Both SD columns ran slower than the target alone here (0.75x and 0.84x)" in text


def test_a_newline_token_shows_as_a_return_arrow_then_the_line_break():
    page = text_html([("Hello", "exact", "t"), ("\n", "js", "t"), ("world", "exact", "t")])
    assert '<span class="dm-tok dm-js" tabindex="0" data-tip="t" aria-label="\n: t">↵<br></span>' in page


def test_the_frontiers_legend_names_rules_and_knobs_as_a_reader_does():
    from dropmatch.plots import frontier_figure

    point = dict(rule="fixed_js", centroid="probs", knob="fixed_js_threshold", label="fixed_js@0.1", tau_gain=0.1,
                 target_nll=0.6, off_nucleus_rate=0.01, speed_vs_lossless=1.0)
    names = {trace.name.replace("<br>", " ") for trace in frontier_figure([point], None, None).data}
    assert names == {"fixed-threshold JS (Fuzzy SD): threshold swept"}
