"""The trained judge: its file, its rules in the engine and the rule lab, and the mining of its labels."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import PROMPTS
from judges import judge_dict, random_judge

from dropmatch import lab
from dropmatch.decoding.config import ConfigError, DecodeConfig, PairSpec, RuleConfig
from dropmatch.decoding.engine import Engine, run_to_end
from dropmatch.models import load_hub_pair
from dropmatch.decoding.causal_lm import encode_prompt
from dropmatch.decoding.trained_judge import SHIPPED_JUDGE, JudgeFileError, TrainedJudge
from tools.mining import Miner, read_mined, walk_record
from tools.training import features_of, fit_judge

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def judged_engine(far_dirs):
    """The far pair (many mismatches) with a random judge of its hidden size, threshold 0.5."""
    pair = load_hub_pair(PairSpec(str(far_dirs[0]), str(far_dirs[1])), torch.device("cpu"))
    return Engine(pair, judge=random_judge(pair.target.hidden_size, seed=4, target=pair.target.name))


@pytest.mark.parametrize("change, message", [
    (lambda d: {**d, "format": "other"}, "is not a judge file"),
    (lambda d: {**d, "version": 9}, "judge format version 9"),
    (lambda d: {key: value for key, value in d.items() if key != "weight"}, "lacks a usable 'weight'"),
    (lambda d: {**d, "weight": d["weight"][:-1]}, "vectors of one length"),
    (lambda d: {**d, "scale": [0.0] * len(d["scale"])}, "every scale positive"),
    (lambda d: {**d, "threshold": 1.5}, "threshold must be in [0, 1]"),
])
def test_a_bad_judge_file_is_refused_in_one_line(tmp_path, change, message):
    """Each kind of bad judge file -> JudgeFileError with one line naming what is wrong."""
    path = tmp_path / "judge.json"
    path.write_text(json.dumps(change(judge_dict(8))))
    with pytest.raises(JudgeFileError) as error:
        TrainedJudge.read(path)
    assert message in str(error.value) and "\n" not in str(error.value)
    path.write_text("{not json")
    with pytest.raises(JudgeFileError, match="is not a judge file"):
        TrainedJudge.read(path)


def test_a_judge_trained_on_another_target_is_refused_in_one_line():
    """check_fits names both models; the engine takes no judge that does not fit its target."""
    judge = random_judge(8, target="SmolLM2-135M-Instruct")
    with pytest.raises(JudgeFileError, match="trained on SmolLM2-135M-Instruct .hidden size 8.; the target is"):
        judge.check_fits("other-model", 8)
    with pytest.raises(JudgeFileError):
        judge.check_fits("SmolLM2-135M-Instruct", 16)


def test_the_shipped_judge_reads_and_fits_the_embedded_target():
    """assets/judge/judge.json is a valid judge for SmolLM2-135M-Instruct (hidden size 576)."""
    judge = TrainedJudge.read(SHIPPED_JUDGE)
    judge.check_fits("SmolLM2-135M-Instruct", 576)
    assert 0.0 < judge.threshold < 1.0 and judge.validation["roc_auc"] > 0.5


def test_the_judge_rule_accepts_exactly_the_mismatches_scored_below_its_threshold(judged_engine):
    """Every judged mismatch: reason judge iff its score < threshold; exact tokens stay exact."""
    ids = judged_engine.encode(PROMPTS[0])
    trace = run_to_end(judged_engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=40), RuleConfig("judge")))
    assert trace.rule_config.judge_threshold == judged_engine.services.judge.threshold
    reasons = {"judge": 0, "rejected": 0}
    for r in trace.rounds:
        for d in r.drafted:
            if d.reason == "exact":
                assert d.token == d.target_token
            elif d.reason in reasons:
                reasons[d.reason] += 1
                assert (d.judge_score < trace.rule_config.judge_threshold) == (d.reason == "judge")
    assert reasons["judge"] > 0 and reasons["rejected"] > 0


def test_at_judge_threshold_zero_and_p_zero_the_judge_rules_are_lossless_sd(judged_engine):
    """The judge accepts nothing at threshold 0; with p = 0 the combination adds nothing either."""
    ids = judged_engine.encode(PROMPTS[1])
    decode = DecodeConfig(gamma=4, max_new_tokens=40)
    lossless = run_to_end(judged_engine.speculative(ids, decode, RuleConfig("lossless")))
    for rule in (RuleConfig("judge", judge_threshold=0.0), RuleConfig("dropmatch_judge", p=0.0, judge_threshold=0.0)):
        trace = run_to_end(judged_engine.speculative(ids, decode, rule))
        assert trace.output_ids == lossless.output_ids
        assert [r.num_accepted for r in trace.rounds] == [r.num_accepted for r in lossless.rounds]


def test_the_combination_accepts_what_either_dropmatch_or_the_judge_accepts(judged_engine):
    """dropmatch_judge's reasons on a run: each accepted mismatch by js, majority or judge, each with its own test."""
    ids = judged_engine.encode(PROMPTS[0])
    trace = run_to_end(judged_engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=40),
                                                  RuleConfig("dropmatch_judge", p=0.3)))
    seen = set()
    for r in trace.rounds:
        for d in r.drafted:
            seen.add(d.reason)
            if d.reason == "judge":
                assert d.judge_score < trace.rule_config.judge_threshold and not d.js <= d.threshold
            if d.reason == "rejected":
                assert d.judge_score >= trace.rule_config.judge_threshold and d.js > d.threshold
    assert "judge" in seen


def test_the_rule_lab_scores_a_stored_run_as_the_engine_did(judged_engine):
    """The lab re-judges a kept run from its stored hidden states: the judge rule's reasons and scores
    are the engine's own, position by position."""
    ids = judged_engine.encode(PROMPTS[2])
    rule = RuleConfig("judge")
    trace = run_to_end(judged_engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=30), rule, keep_states=True))
    matrix = lab.rule_lab(judged_engine.services, trace, dataclasses.replace(RuleConfig(), p=0.2))
    column = [rule["name"] for rule in matrix["rules"]].index("judge")
    engine_cells = [(d.reason, round(d.judge_score, 3)) for r in trace.rounds for d in r.drafted if d.reason != "unchecked"]
    lab_cells = [(row["cells"][column]["reason"], row["cells"][column]["info"]) for row in matrix["rows"]
                 if row["cells"][column]["reason"] != "unchecked"]
    assert [reason for reason, _ in lab_cells] == [reason for reason, _ in engine_cells]
    for (reason, score), (_, info) in zip(engine_cells, lab_cells):
        if reason != "exact":
            assert f"P(changes the answer) {score:.3f}" in info


def test_without_a_judge_the_judge_rules_refuse_in_one_line(tiny_engine):
    """A pair with no trained judge: the rule asks for one, in one line, before any round."""
    assert tiny_engine.services.judge is None
    ids = tiny_engine.encode(PROMPTS[0])
    with pytest.raises(ConfigError, match="needs a trained judge for this target"):
        run_to_end(tiny_engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=8), RuleConfig("judge")))


# ---------------------------------------------------------------- mining


@pytest.fixture(scope="module")
def mining_pair(tmp_path_factory):
    """Bigram target and draft on the tiny tokenizer: after the prompt the target says "A 5 <end>",
    the draft says "B" first (the target after B still says 5: the answer stays) and "7" after B
    (the target after 7 ends: the answer becomes 7)."""
    from tiny_models import save_bigram_pair, save_tokenizer

    tokenizer = save_tokenizer(tmp_path_factory.mktemp("vocab"))
    last = encode_prompt(tokenizer, "question")[-1]
    a, b, five, seven = (tokenizer.convert_tokens_to_ids(t) for t in ("A", "B", "5", "7"))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    target = {last: {a: 5.0}, a: {five: 5.0}, b: {five: 5.0}, five: {end: 5.0}, seven: {end: 5.0}}
    draft = {last: {b: 5.0}, a: {five: 5.0}, b: {seven: 5.0}, five: {end: 5.0}, seven: {end: 5.0}}
    dirs = save_bigram_pair(tmp_path_factory.mktemp("mining"), target, draft)
    pair = load_hub_pair(PairSpec(str(dirs[0]), str(dirs[1])), torch.device("cpu"))
    return pair, dict(a=a, b=b, five=five, seven=seven, end=end)


def test_mining_labels_a_substitution_that_changes_the_answer_important_and_keeps_one_that_does_not(mining_pair):
    """The walk: B for A leaves the answer 5 (unimportant, B kept); 7 for 5 makes it 7 (important,
    5 kept); the control (A put back) changes nothing."""
    pair, ids = mining_pair
    miner = Miner(pair, max_new_tokens=8, batch=4)
    walks, unfinished = miner.start([(0, "question"), (1, "question")])
    assert unfinished == [] and [w.response for w in walks] == [[ids["a"], ids["five"], ids["end"]]] * 2
    while not all(w.over for w in walks):
        miner.step(walks)
    for walk in walks:
        assert [(m.position, m.target_token, m.draft_token, m.important) for m in walk.labelled()] == [
            (0, ids["a"], ids["b"], False), (1, ids["five"], ids["seven"], True)]
        assert [(m.position, m.important) for m in walk.mismatches if m.control] == [(0, False)]
        assert walk.response == [ids["b"], ids["five"], ids["end"]] and walk.answer == 5.0


def test_the_recipe_trains_a_judge_file_the_engine_reads(mining_pair, tmp_path):
    """mine -> fit on the tiny pair: the judge file reads as a TrainedJudge fitted to that target, and it
    scores the important mismatch above the one that kept the answer."""
    pair, ids = mining_pair
    miner = Miner(pair, max_new_tokens=8, batch=5)
    walks, _ = miner.start([(index, "question") for index in range(10)])
    while not all(w.over for w in walks):
        miner.step(walks)
    (tmp_path / "mined.jsonl").write_text("".join(json.dumps(walk_record(w)) + "\n" for w in walks))
    records = read_mined(tmp_path / "mined.jsonl")
    (tmp_path / "judge.json").write_text(json.dumps(fit_judge(records, pair.target, seed=0, val_share=0.2, recall=0.9)))
    judge = TrainedJudge.read(tmp_path / "judge.json")
    judge.check_fits(pair.target.name, pair.target.hidden_size)
    assert judge.validation["roc_auc"] == 1.0  # two kinds of mismatch, each always labelled alike
    features = features_of(pair.target, records[0])
    unimportant, important = judge.scores(torch.tensor(features)).tolist()
    assert important > unimportant
