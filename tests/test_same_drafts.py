"""The comparison on the same drafts: lossless SD's drafts re-judged under every rule, with intervals."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dropmatch.decoding.acceptance import BASELINE, METHOD, RULES
from dropmatch.bench.same_drafts import Judged, pool, target_view
from dropmatch.intervals import standing

PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts"
POLICIES = ("studio", "long")
LOSSY = next(name for name, rule in RULES.items() if rule.lossy)  # any lossy rule of the table


@pytest.fixture(scope="module")
def at_p_zero(tiny_dirs, tmp_path_factory) -> tuple[dict, str]:
    """(JSON document, Markdown) of one command on the tiny pair at p = 0: lossless SD's own run beside
    the comparison on the same drafts at both draft policies (gamma 3 and gamma 15)."""
    from dropmatch.bench import main

    target, draft = tiny_dirs
    folder = tmp_path_factory.mktemp("same")
    status = main(["--prompts", f"{PROMPTS / 'gsm8k_test_100.jsonl'}:2,{PROMPTS / 'mt_bench.jsonl'}:2",
                   "--max-new-tokens", "16", "--gamma", "3", "--draft-source", "model", "--rules", "lossless",
                   "--p", "0", "--reference-samples", "0", "--same-drafts", "--target", str(target), "--draft", str(draft),
                   "--json", str(folder / "out.json"), "--markdown", str(folder / "out.md")])
    assert status == 0
    return json.loads((folder / "out.json").read_text()), (folder / "out.md").read_text()


def every_rule(document: dict):
    """(policy, set, rule, figures) of every row of the comparison."""
    for policy, sets in document["same_drafts"].items():
        for name, rules in sets.items():
            for rule, figures in rules.items():
                yield policy, name, rule, figures


def test_at_p_zero_every_path_rule_gains_exactly_nothing_on_the_same_drafts(at_p_zero):
    """At p = 0 every path rule accepts exactly what the exact test accepts: gain 0 and no token beyond exact."""
    document, _ = at_p_zero
    assert document["same_drafts_info"]["settings"]["p"] == 0.0
    path_rows = [row for row in every_rule(document) if RULES[row[2]].uses_paths]
    assert {policy for policy, *_ in path_rows} == set(POLICIES) and len(path_rows) >= 2 * 2 * 4
    for policy, name, rule, figures in path_rows:
        assert figures["gain"] == {"value": 0.0, "low": 0.0, "high": 0.0, "standing": "ties"}, (policy, name, rule)
        assert figures["beyond_exact"]["value"] == 0.0 and figures["beyond_exact_tokens"] == 0, (policy, name, rule)


def test_the_lossless_rule_on_its_own_drafts_reaches_the_lossless_runs_own_tau(at_p_zero):
    """Re-judged by the lab, lossless SD's drafts give lossless SD's tau: that of the run that drafted them,
    and (the Studio's policy, the same settings) that of the benchmark's own lossless run."""
    document, _ = at_p_zero
    for policy, name, rule, figures in every_rule(document):
        if rule == BASELINE:
            assert figures["tau"]["value"] == pytest.approx(figures["run_tau"], abs=1e-12), (policy, name)
    for name, summary in document["benchmarks"].items():
        same = document["same_drafts"]["studio"][name][BASELINE]["tau"]["value"]
        assert same == pytest.approx(summary["rules"][BASELINE]["tau"], abs=1e-12), name


def test_a_rule_accepting_beyond_exact_records_what_the_target_thinks_of_each_such_token(at_p_zero):
    """Every lossy-accepted token has the clean target's probability in (0, 1] and a rank; under greedy the
    exact test accepts the target's top token, so a token beyond it ranks 2 or lower."""
    document, _ = at_p_zero
    beyond = [figures for *_, figures in every_rule(document) if figures["beyond_exact_tokens"]]
    assert beyond, "no rule accepted beyond the exact test on these drafts"
    for figures in beyond:
        probs = [p for row in figures["per_prompt"] for p in row["probs"]]
        ranks = [r for row in figures["per_prompt"] for r in row["ranks"]]
        assert len(probs) == len(ranks) == figures["beyond_exact_tokens"]
        assert all(0.0 < p <= 1.0 for p in probs) and all(r >= 2 for r in ranks)
        assert figures["target_prob"]["value"] == pytest.approx(sum(probs) / len(probs))
        assert figures["rank_median"] >= 2


def test_json_and_markdown_show_the_comparison_at_both_draft_policies_with_what_ran(at_p_zero):
    """JSON: same_drafts per policy, per prompt set, every rule with its intervals; Markdown: a table per
    policy; both say which set and how many of its prompts ran."""
    document, markdown = at_p_zero
    assert set(document["same_drafts"]) == set(POLICIES)
    for policy in POLICIES:
        assert set(document["same_drafts"][policy]) == {"gsm8k_test_100", "mt_bench"}
        for figures in document["same_drafts"][policy]["gsm8k_test_100"].values():
            for key in ("tau", "gain", "beyond_exact", "against_method"):
                assert {"value", "low", "high"} <= set(figures[key]), key
        assert document["same_drafts_info"]["policies"][policy] in markdown
    assert "gamma 15" in document["same_drafts_info"]["policies"]["long"]
    assert document["same_drafts_info"]["sets"]["gsm8k_test_100"]["label"] == "GSM8K test, 2 of 100"
    assert markdown.count("| GSM8K test, 2 of 100 |") == 3 and markdown.count("| MT-Bench, 2 of 80 |") == 3
    assert markdown.index("On lossless SD's drafts") < markdown.index("Each rule's own text")
    assert f"{METHOD} +0.0% [+0.0, +0.0]: ties against lossless SD" in markdown  # p = 0: the method is lossless


def test_the_target_view_is_the_probability_and_rank_under_the_clean_target():
    """Hand-made logits: a round's drafted tokens get softmax(logits / T) of themselves and their rank (1 = top)."""
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0], [9.0, 9.0, 9.0, 9.0]])
    rnd = SimpleNamespace(clean_logits=logits, draft_tokens=torch.tensor([2, 3]), num_drafted=2, temperature=0.5)
    probs, ranks = target_view(rnd)
    assert ranks == [2, 2]
    expected = [torch.softmax(logits[0] / 0.5, -1)[2], torch.softmax(logits[1] / 0.5, -1)[3]]
    assert probs == pytest.approx([float(p) for p in expected])
    greedy = SimpleNamespace(**{**vars(rnd), "temperature": 0.0, "draft_tokens": torch.tensor([0, 2])})
    assert target_view(greedy) == ([pytest.approx(float(torch.softmax(logits[0], -1)[0])),
                                    pytest.approx(float(torch.softmax(logits[1], -1)[2]))], [1, 1])


def prompts(n: int) -> list[dict[str, Judged]]:
    """n prompts' counts of two rules: lossless, and one accepting more on some prompts than on others."""
    return [{BASELINE: Judged(10, 30, 8 + i % 3, [], []),
             LOSSY: Judged(10, 30, 8 + i % 3 + (i % 4), [0.2] * (i % 4), [2] * (i % 4))} for i in range(n)]


def test_the_bootstrap_interval_holds_the_estimate_and_narrows_with_more_prompts():
    """The same spread of prompts, four times as many of them: each interval holds its estimate and narrows."""
    few, many = (pool(prompts(n), [18] * n, seed=0) for n in (8, 32))
    for key in ("tau", "gain", "beyond_exact"):
        for figures in (few, many):
            shown = figures[LOSSY][key]
            assert shown["low"] <= shown["value"] <= shown["high"], key
        width = [f[LOSSY][key]["high"] - f[LOSSY][key]["low"] for f in (few, many)]
        assert 0 < width[1] < width[0], (key, width)
    assert pool(prompts(8), [18] * 8, seed=0) == few  # seeded


def test_a_lead_or_a_trail_is_said_only_beyond_the_interval():
    """A gain leads where its whole interval lies above 0, trails below it, else ties; two intervals likewise."""
    assert standing({"low": 0.01, "high": 0.2}) == "leads"
    assert standing({"low": -0.2, "high": -0.01}) == "trails"
    assert standing({"low": 0.0, "high": 0.2}) == standing({"low": -0.1, "high": 0.1}) == "ties"
    assert standing({"low": 2.1, "high": 2.4}, {"low": 1.8, "high": 2.0}) == "leads"
    assert standing({"low": 1.5, "high": 1.7}, {"low": 1.8, "high": 2.0}) == "trails"
    assert standing({"low": 1.9, "high": 2.4}, {"low": 1.8, "high": 2.0}) == "ties"


def test_labels_say_which_set_and_how_many_of_its_prompts_ran():
    """A set's label names it as readers know it and says how many of the file's prompts ran."""
    from dropmatch.bench.prompts import load_set, set_title

    assert load_set(str(PROMPTS / "gsm8k_test_100.jsonl"), 10).label(10) == "GSM8K test, 10 of 100"
    assert load_set(str(PROMPTS / "humaneval_40.jsonl"), 6).label(6) == "HumanEval, 6 of 40"
    assert (set_title("mt_bench"), set_title("ifeval_20"), set_title("multilingual_chat")) == (
        "MT-Bench", "IFEval", "multilingual chat")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_on_prompt_lookup_drafts_the_static_ensemble_reaches_exactly_lossless_sds_tau(tiny_engine, temperature):
    """The ensemble never judges prompt-lookup drafts (transformers refuses it there): re-judging lossless SD's
    lookup drafts, it accepts exactly what the exact test accepts, and each of its cells says why."""
    from dropmatch import lab
    from dropmatch.bench.same_drafts import judge_prompt
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end

    ids = tiny_engine.encode("one two three one two three one two three one two")
    decode = DecodeConfig(gamma=4, max_new_tokens=40, draft_source="ngram", temperature=temperature, seed=5)
    judged, _, _ = judge_prompt(tiny_engine, ids, decode, RuleConfig(p=0.3, ensemble_weight=0.1))
    assert judged[BASELINE].drafted > 0
    assert (judged["ensemble"].accepted, judged["ensemble"].beyond) == (judged[BASELINE].accepted, 0)
    trace = run_to_end(tiny_engine.speculative(ids, decode, RuleConfig(BASELINE), keep_states=True))
    matrix = lab.rejudge(lab.prepare(trace, tiny_engine.target, tiny_engine.draft), tiny_engine.target,
                         lab.lab_settings(trace), tiny_engine.services.token_text, rules=("ensemble",))
    assert all("never judges prompt-lookup drafts" in row["cells"][0]["info"] for row in matrix["rows"]
               if row["cells"][0]["reason"] != "unchecked")


def test_a_pair_with_an_eagle3_head_adds_its_drafts_as_a_third_policy(tiny_dirs, tmp_path):
    """With --eagle3-head the comparison re-judges EAGLE-3's drafts too: a third policy where every rule reads the
    head's chain, lossless SD re-judged there reaches the tau of the run that drafted it, and at p = 0 no path
    rule gains on those drafts either."""
    from transformers import AutoModelForCausalLM

    from dropmatch.bench import main
    from tiny_models import save_eagle3_head

    target, draft = tiny_dirs
    model = AutoModelForCausalLM.from_pretrained(str(target))
    head = save_eagle3_head(tmp_path / "head", model, list(range(model.config.vocab_size)), (0, 1, 1), sharpness=2.0)
    status = main(["--prompts", f"{PROMPTS / 'mt_bench.jsonl'}:2", "--max-new-tokens", "12", "--gamma", "3",
                   "--draft-source", "model", "--p", "0", "--reference-samples", "0", "--same-drafts-only",
                   "--target", str(target), "--draft", str(draft), "--eagle3-head", str(head),
                   "--json", str(tmp_path / "out.json")])
    assert status == 0
    document = json.loads((tmp_path / "out.json").read_text())
    assert set(document["same_drafts"]) == {*POLICIES, "eagle3"}
    assert "EAGLE-3" in document["same_drafts_info"]["policies"]["eagle3"]
    rows = document["same_drafts"]["eagle3"]["mt_bench"]
    assert set(rows) == set(document["same_drafts"]["studio"]["mt_bench"])
    assert rows[BASELINE]["tau"]["value"] == pytest.approx(rows[BASELINE]["run_tau"], abs=1e-12)
    for rule, figures in rows.items():
        if RULES[rule].uses_paths:
            assert figures["beyond_exact_tokens"] == 0, rule
