"""Early stops, exact counts and rules that cannot act, on hand-built traces (issue 66, items 2-4).

A hand-built run is lossless SD's or a lossy rule's rounds written out token by token, so that a round can
end mid-way at an end of text or at the token limit exactly where a test needs it to.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dropmatch.decoding.acceptance import REASONS
from dropmatch.rule_words import REASON_WORDS
from dropmatch.decoding.config import DecodeConfig, RuleConfig
from dropmatch.metrics import lossy_count, summarize
from dropmatch.render import cannot_act, token_spans, verdict
from dropmatch.decoding.trace import DraftedToken, GenerationTrace, RoundTrace

EOS, OTHER = 2, 99  # the pair's end of text; the token the target would have chosen where a draft is not its own


def drafted(token: int, reason: str) -> DraftedToken:
    target = token if reason == "exact" else OTHER
    return DraftedToken(token=token, draft_prob=0.5, target_token=target, target_token_prob=0.6, target_prob=0.3,
                        js_target=0.05, reason=reason, target_top3_entropy=0.1, js=0.01, threshold=0.02)


def a_round(index: int, drafts: list[tuple[int, str]], emitted: tuple[int, ...], num_accepted: int,
            extra_kind: str = "correction") -> RoundTrace:
    """A round as the engine records it: every drafted slot's reason, the emitted tokens cut after an end of
    text or at the token limit, num_accepted the drafts among them."""
    return RoundTrace(index, 1, tuple(drafted(t, reason) for t, reason in drafts), emitted, extra_kind, num_accepted,
                      0.001, 0.01, 0.001, 0.0, 0.012, len(drafts) + 1)


def a_run(rule: str, rounds: list[RoundTrace], stop_reason: str, max_new_tokens: int = 40, gamma: int = 4,
          **knobs) -> GenerationTrace:
    output = (5,) + tuple(t for r in rounds for t in r.emitted)
    return GenerationTrace(
        mode="sd", rule=rule, p=None, decode_config=DecodeConfig(gamma=gamma, max_new_tokens=max_new_tokens),
        rule_config=RuleConfig(rule, **knobs), prompt_ids=(1, 1), first_token=5, rounds=tuple(rounds),
        output_ids=output, token_texts=tuple(f" t{t}" for t in output), text="", stop_reason=stop_reason,
        t_prefill=0.01, t_total=0.01 + sum(r.t_round for r in rounds), first_logprob=-0.5, first_in_nucleus=True)


def text_of(token: int) -> str:
    return f" t{token}"


def lossless_run(tokens: int) -> GenerationTrace:
    """Lossless SD's answer of `tokens` new tokens (the first included), one exact draft and a correction a round."""
    rounds, left = [], tokens - 1
    while left > 0:
        emitted = (7, 8)[:left]
        rounds.append(a_round(len(rounds), [(7, "exact"), (9, "rejected")], emitted, min(1, len(emitted))))
        left -= len(emitted)
    return a_run("lossless", rounds, "max_new_tokens")


def mars_ends_at_a_bonus_end() -> GenerationTrace:
    """MARS accepts "." (not the target's choice) as the last draft; the target's own end of text follows."""
    return a_run("mars", [a_round(0, [(7, "exact"), (9, "rejected")], (7, 8), 1),
                          a_round(1, [(7, "exact"), (30, "mars")], (7, 30, EOS), 2, "bonus")], "eos")


def test_a_lossy_acceptance_the_text_ends_with_is_a_reason_of_its_own_shown_coloured_and_explained():
    """The "." MARS accepted before the target's end of text, and an end of text the rule accepted itself, are
    lossy_end; an end the exact test accepted is not; a run file reads back with it; it has its legend, colours,
    cue, tooltip and sentence."""
    from dropmatch import plots, render

    early = mars_ends_at_a_bonus_end()
    assert [d.reason for d in early.rounds[-1].drafted] == ["exact", "lossy_end"]
    drafted_end = a_run("mars", [a_round(0, [(7, "exact"), (EOS, "mars"), (8, "mars")], (7, EOS), 2)], "eos")
    assert [d.reason for d in drafted_end.rounds[-1].drafted] == ["exact", "lossy_end", "mars"]  # cut after the end
    exact_end = a_run("mars", [a_round(0, [(7, "mars"), (8, "exact"), (EOS, "exact")], (7, 8, EOS), 3)], "eos")
    assert [d.reason for d in exact_end.rounds[-1].drafted] == ["mars", "exact", "exact"]
    assert GenerationTrace.from_dict(early.to_dict()) == early
    reason = REASON_WORDS["lossy_end"]
    assert REASONS["lossy_end"].lossy and reason.says
    css = render.css()
    assert reason.legend in render.legend_html() and f".dm-lossy_end {{ background: {reason.background};" in css
    assert f".dark .dm-lossy_end {{ background: {reason.dark_background};" in css
    why = render.explainer(text_of, early.decode_config, early.rule_config)
    spans = token_spans(early.first_token, list(early.rounds), text_of, frozenset({EOS}), why)
    tip = next(tip for _, kind, tip in spans if kind == "lossy_end")
    assert reason.meaning in tip and "the text ends with it" in tip
    chart = [t for t in plots.js_scatter(early, text_of).data if t.name == "lossy_end"]
    assert chart and chart[0].marker.color == reason.colour


def test_accepted_only_by_the_rule_counts_emitted_tokens_when_a_round_ends_at_an_end_of_text():
    """A round whose verdict accepted three drafts, cut after the second (an end of text): the lossy draft cut
    after it is not one of the new tokens; the key's counts add up to the new tokens, the end included."""
    trace = a_run("mars", [a_round(0, [(7, "exact"), (EOS, "mars"), (8, "mars"), (9, "rejected")], (7, EOS), 2)], "eos")
    assert lossy_count(trace) == 1 and summarize(trace).lossy_count == 1  # the end of text itself
    kinds = [kind for _, kind, _ in token_spans(trace.first_token, list(trace.rounds), text_of, frozenset({EOS}))]
    assert len(kinds) == len(trace.output_ids) == 3 and kinds.count("lossy_end") == 1


def test_accepted_only_by_the_rule_counts_emitted_tokens_when_a_round_ends_at_the_token_limit():
    """Four drafts accepted (two by the rule's own test), cut to the two new tokens the limit leaves: one of
    them only the rule accepted; the key's counts add up to the new tokens."""
    trace = a_run("mars", [a_round(0, [(7, "exact"), (8, "mars"), (9, "mars"), (10, "mars")], (7, 8), 2, "bonus")],
                  "max_new_tokens", max_new_tokens=3)
    assert len(trace.output_ids) == 3 and lossy_count(trace) == 1
    assert sum(d.reason == "mars" for r in trace.rounds for d in r.drafted) == 3  # every drafted slot keeps its reason; only the count is of new tokens
    spans = token_spans(trace.first_token, list(trace.rounds), text_of, frozenset({EOS}))
    assert len(spans) == len(trace.output_ids)


def test_a_run_the_rule_ended_early_says_so_first_and_is_never_called_a_win():
    """9 tokens against lossless SD's 40: the verdict's first words say it ended the answer early, with both
    counts; its fewer target calls per token are no win; the band's length axis puts it outside."""
    from dropmatch.quality import outside_on_length
    from dropmatch.ui.views import verdict_markdown

    lossless = lossless_run(40)
    early = a_run("mars", [a_round(0, [(7, "exact"), (8, "exact"), (9, "exact")], (7, 8, 9, 10), 3, "bonus"),
                           a_round(1, [(7, "exact"), (8, "exact"), (30, "mars")], (7, 8, 30, EOS), 3, "bonus")], "eos")
    assert len(early.output_ids) == 9
    lossless_metrics, lossy_metrics = summarize(lossless), summarize(early, lossless=lossless)
    text = verdict(lossless_metrics, lossy_metrics, "MARS")
    assert text.startswith("Ended the answer early (9 tokens against 40)"), text
    headline = text.split("\n\n")[0]
    assert "no win" in headline and "fewer target calls per token than" not in headline
    record = SimpleNamespace(rule="mars", lossless=lossless, lossy=early, made="", ar=None, alone_tokens_per_s=None)
    assert verdict_markdown(record, lossless_metrics, lossy_metrics, None).startswith("Ended the answer early (9 tokens")
    assert not verdict(lossless_metrics, summarize(lossless, lossless=lossless), "MARS").startswith("Ended")
    assert outside_on_length(9, [30, 40], ended_by_rule=False) and outside_on_length(40, [30], ended_by_rule=True)
    assert not outside_on_length(30, [30, 40], ended_by_rule=False)


def fly_run(drafts_per_round: list[int], threshold: float = 0.3) -> GenerationTrace:
    """FLy's run (window 6: it acts only in rounds of 7 drafts or more): each round one exact draft, then a
    mismatch FLy refused."""
    rounds = [a_round(i, [(7, "exact"), (9, "rejected")] + [(8, "unchecked")] * (n - 2), (7, 8), 1)
              for i, n in enumerate(drafts_per_round)]
    return a_run("fly", rounds, "max_new_tokens", gamma=8, fly_entropy_threshold=threshold)


def test_a_rule_that_could_act_in_under_half_of_its_rounds_says_how_many_and_the_fix():
    """FLy whose one round of 14 drafted 8 (the others 2): it could act in 1 of 14, judged over the whole run,
    not silent because one round was long enough; with its authors' draft length as the fix."""
    note = cannot_act(fly_run([8] + [2] * 13))
    assert "could act in only 1 of its 14 rounds" in note and "needs at least 7 drafts" in note, note
    assert "authors' draft length 15" in note
    assert cannot_act(fly_run([8] * 7 + [2] * 7)).find("could act in only") < 0  # half of them could


def test_a_rule_that_acted_in_no_round_says_why_from_its_declaration():
    """FLy at a draft length long enough, accepting nothing: the verdict says it refused every mismatch of the
    rounds it could act in, at its swept knob's value, with the knob's help (a lower threshold tolerates more)."""
    note = cannot_act(fly_run([8] * 14, threshold=0.6))
    assert "acted in none of its 14 rounds" in note and "all 14 mismatches" in note, note
    assert "FLy entropy threshold 0.6" in note and "a lower threshold tolerates more" in note


def test_the_bench_reports_per_rule_the_share_of_prompts_ended_early_and_the_band_sees_length():
    """Two prompts, the rule's answer ended early on one: its share is 50% in the summary, the tables and the
    report's verdicts (no win); the band's length axis puts it outside; lossless SD ended none early."""
    from dropmatch.bench.prompts import Item
    from dropmatch.bench.report import markdown_table, verdicts
    from dropmatch.bench.running import BenchmarkResult, Generation
    from dropmatch.bench.summary import summarize_benchmark

    def made(trace):
        return Generation(trace, 0.5, 0.0, 1.0)

    lossless, early = lossless_run(40), mars_ends_at_a_bonus_end()
    result = BenchmarkResult("set", "plain", items=[Item("a", {}), Item("b", {})], ar=[made(lossless)] * 2,
                             runs={"lossless": [made(lossless)] * 2, "dropmatch": [made(lossless), made(early)]},
                             reference=[[made(lossless)], [made(lossless)]])
    summary = summarize_benchmark(result)
    rules = summary["rules"]
    assert rules["dropmatch"]["ended_early"] == 0.5 and rules["lossless"]["ended_early"] == 0.0
    assert rules["dropmatch"]["band"]["length"] is False and rules["lossless"]["band"]["length"] is True
    document = {"settings": {"command": "python -m dropmatch.bench ..."}, "benchmarks": {"set": summary}}
    said = " ".join(verdicts(document))
    assert "no win: it ended 1 answer early" in said and "dropmatch 1 (50%)" in said, said
    assert "50.0%" in markdown_table(document) and "outside: length" in markdown_table(document)


def test_a_sample_longer_than_the_greedy_answer_leaves_lossless_sd_inside_the_length_axis():
    """The target's own answers on a prompt are its samples and lossless SD's: a greedy answer of 20 tokens against
    one sample of 40 keeps lossless SD inside, and a rule's answer of the same 20 tokens too; shorter than both is
    outside."""
    from dropmatch.bench.prompts import Item
    from dropmatch.bench.running import BenchmarkResult, Generation
    from dropmatch.bench.summary import summarize_benchmark

    def made(trace):
        return Generation(trace, 0.5, 0.0, 1.0)

    greedy, sample, shorter = lossless_run(20), lossless_run(40), lossless_run(12)
    result = BenchmarkResult("set", "plain", items=[Item("a", {}), Item("b", {})], ar=[made(greedy)] * 2,
                             runs={"lossless": [made(greedy)] * 2, "dropmatch": [made(greedy)] * 2,
                                   "mars": [made(greedy), made(shorter)]},
                             reference=[[made(sample)], [made(sample)]])
    rules = summarize_benchmark(result)["rules"]
    assert rules["lossless"]["band"]["length"] is True and rules["dropmatch"]["band"]["length"] is True
    assert rules["mars"]["band"]["length"] is False and rules["mars"]["length_outside"] == 1


@pytest.mark.slow
def test_the_sky_prompt_under_mars_on_the_embedded_pair_says_it_ended_the_answer_early():
    """The issue's reproduction: "Explain why the sky is blue in three sentences.", 40 tokens, MARS (hybrid drafts,
    gamma 8): MARS accepts a "." the target's own end of text follows; the verdict says so first."""
    import os

    import torch

    from dropmatch.decoding.config import Settings
    from dropmatch.decoding.engine import Engine, run_to_end
    from dropmatch.models import load_embedded_pair

    os.environ["HF_HUB_OFFLINE"] = "1"
    engine = Engine(load_embedded_pair(torch.device("cpu")))
    prompt = "Explain why the sky is blue in three sentences."
    decode, rule = Settings(prompt, rule="mars", max_new_tokens=40, gamma="8").parse()
    ids = engine.encode(prompt)
    lossless = run_to_end(engine.speculative(ids, decode, RuleConfig("lossless")))
    mars = run_to_end(engine.speculative(ids, decode, rule))
    assert mars.stop_reason == "eos" and len(mars.output_ids) < len(lossless.output_ids)
    text = verdict(summarize(lossless), summarize(mars, lossless=lossless), "MARS")
    assert text.startswith(f"Ended the answer early ({len(mars.output_ids)} tokens against {len(lossless.output_ids)})")
    assert sum(d.reason == "lossy_end" for r in mars.rounds for d in r.drafted) == 1
