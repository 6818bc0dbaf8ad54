"""A rule is one declaration: a rule and its knob registered in a test reach every consumer, and the page
does what it says with a run's knobs."""

from __future__ import annotations

import json

import gradio as gr
import pytest
import torch
from conftest import PROMPTS

from dropmatch.decoding import acceptance
from dropmatch import lab
from dropmatch.decoding.acceptance import Knob, Reason, Rule
from dropmatch.rule_words import KNOB_HELP, REASON_WORDS, RULE_WORDS, ReasonWords, RuleWords
from dropmatch.decoding.config import DecodeConfig, RuleConfig, Settings
from dropmatch.decoding.engine import run_to_end

TOY_KNOB = "toy_floor"


def _toy_check(signals, cfg):
    return [("toy", signals.target_prob >= cfg.toy_floor)]


@pytest.fixture()
def toy_rule():
    """'toy': accept a mismatch the clean target gives at least `toy_floor`; one knob, declared here only."""
    knob = Knob(TOY_KNOB, 0.5, "toy floor", low=0.0, high=1.0, sweep=(0.9, 0.02), lab=True, slider=(0.0, 1.0, 0.05))
    # Its decision (acceptance), then its words (rule_words): the two declarations, nothing else.
    rules, knobs = dict(acceptance.RULES), dict(acceptance.KNOBS)
    acceptance.register_reason(Reason("toy", lossy=True))
    acceptance.register_rule(Rule("toy", "toy floor", lossy=True, uses_paths=False, check=_toy_check, knobs=(knob,),
                                  knob=TOY_KNOB, checks=("toy",)))
    REASON_WORDS["toy"] = ReasonWords("toy", "accepted by the toy floor", "#0000aa", "#ccccff", "#000066", "underline",
                                      says="{tok} clears the toy floor {toy_floor:g}.",
                                      fails="{tok} is under the toy floor {toy_floor:g}")
    RULE_WORDS["toy"] = RuleWords("#0000aa")
    KNOB_HELP[TOY_KNOB] = "accept a mismatch the target gives at least this"
    yield "toy"
    for table, before in ((acceptance.RULES, rules), (acceptance.KNOBS, knobs)):  # the table as it was
        table.clear()
        table.update(before)
    for table in (acceptance.REASONS, REASON_WORDS, RULE_WORDS):
        table.pop("toy")
    KNOB_HELP.pop(TOY_KNOB)


def test_a_rule_and_its_knob_declared_once_reach_every_consumer(toy_rule, tiny_dirs, tiny_engine, tmp_path, capsys):
    """Settings, the CLI (help and a run with its frontier), the vLLM keys, generate()'s keywords, the app's
    choices and controls, the lab's matrix, the run file: each finds the toy rule and its knob."""
    from dropmatch.bench import build_parser, main
    from dropmatch.bench.running import variants
    from dropmatch.decoding.hf_generate import generate
    from dropmatch.runfile import RunRecord, mentioned_tokens
    from dropmatch.serving.vllm.settings import ServeSettings
    from dropmatch.ui.layout import build_layout
    from dropmatch.ui.views import lossy_rule_choices

    assert RuleConfig.from_mapping({"rule": "toy", TOY_KNOB: 0.2}).toy_floor == 0.2
    assert Settings("hi", rule="toy", toy_floor=0.3).parse()[1].toy_floor == 0.3
    with pytest.raises(ValueError, match="toy floor must be in"):
        RuleConfig("toy", toy_floor=2)
    cli_help = " ".join(build_parser().format_help().split())
    assert "--toy-floor" in cli_help and "the target gives at least this (rules: toy)" in cli_help
    assert ServeSettings().updated({"rule": "toy", TOY_KNOB: 0.1}).rule.toy_floor == 0.1
    assert ("toy floor", "toy") in lossy_rule_choices()
    with gr.Blocks():
        ui = build_layout()
    assert TOY_KNOB in ui.rule_knobs and TOY_KNOB in ui.lab_knobs
    frontier = [run for run in variants(["lossless"], RuleConfig(), [], frontier=True) if run.rule.rule == "toy"]
    assert [run.value for run in frontier] == [0.9, 0.02]

    target, draft = tiny_dirs
    out = tmp_path / "toy.json"
    capsys.readouterr()
    status = main(["--prompts", str(_prompt_file(tmp_path)), "--max-new-tokens", "8", "--gamma", "3", "--rules",
                   "lossless,toy", "--toy-floor", "0.02", "--frontier", "--frontier-rules", "toy",
                   "--reference-samples", "0", "--target", str(target), "--draft", str(draft), "--json", str(out)])
    assert status == 0, capsys.readouterr().err[-2000:]
    document = json.loads(out.read_text())
    assert "toy" in document["rules"] and {p["knob"] for p in document["frontier"]} == {TOY_KNOB}

    from transformers import AutoModelForCausalLM, AutoTokenizer
    hf_target, hf_draft = (AutoModelForCausalLM.from_pretrained(path) for path in (target, draft))
    inputs = AutoTokenizer.from_pretrained(target)(PROMPTS[0], return_tensors="pt")
    out = generate(hf_target, **inputs, assistant_model=hf_draft, max_new_tokens=8, do_sample=False,
                   dropmatch_rule="toy", dropmatch_toy_floor=0.02, return_dict_in_generate=True)
    assert set(out.dropmatch["reasons"]) <= {"exact", "toy", "rejected", "unchecked"}

    engine = tiny_engine
    ids = engine.encode(PROMPTS[0])
    decode = DecodeConfig(gamma=3, max_new_tokens=12)
    lossless = run_to_end(engine.speculative(ids, decode, RuleConfig("lossless"), keep_states=True))
    toy = run_to_end(engine.speculative(ids, decode, RuleConfig("toy", toy_floor=0.02)))
    matrix = lab.rejudge(lab.prepare(lossless, engine.target, engine.draft), engine.target, lab.lab_settings(toy),
                         engine.services.token_text)
    assert "toy" in [rule["name"] for rule in matrix["rules"]] and matrix["settings"][TOY_KNOB] == 0.02
    tokens = {t: engine.services.token_text(t) for t in mentioned_tokens(lossless, toy)}
    record = RunRecord(PROMPTS[0], "toy", False, lossless, toy, None, tokens, matrix)
    back = RunRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert back.lossy == toy and back.lossy.rule_config.toy_floor == 0.02 and back.lab == matrix
    from dropmatch import render  # its words: the legend, the stylesheet, the tooltips

    assert render.kind_label("toy") == "accepted by the toy floor" and ".dm-toy { background: #ccccff;" in render.css()


def _prompt_file(folder):
    path = folder / "toy_prompts.jsonl"
    path.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n")
    return path


def test_the_lab_keeps_every_knob_of_the_run_when_a_control_moves(tiny_dirs):
    """Moving p re-judges at the run's own MARS threshold, FLy threshold and majority share, not the defaults."""
    from dropmatch.decoding.config import PairSpec
    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_hub_pair
    from dropmatch.runfile import RunRecord, mentioned_tokens
    from dropmatch.pair_host import Policy, PairHost
    from dropmatch.ui.callbacks import reverify_view

    spec = PairSpec(*map(str, tiny_dirs))
    studio = PairHost(loader=lambda _: load_hub_pair(spec), engine_factory=Engine, policy=Policy(allow_local_models=True))
    try:
        engine = studio.engine(spec)
        ids, decode = engine.encode(PROMPTS[0]), DecodeConfig(gamma=3, max_new_tokens=8)
        run = RuleConfig("mars", mars_threshold=0.8, fly_entropy_threshold=0.7, majority_fraction=0.6)
        lossless = run_to_end(engine.speculative(ids, decode, RuleConfig("lossless"), keep_states=True))
        lossy = run_to_end(engine.speculative(ids, decode, run))
        record = RunRecord(PROMPTS[0], "mars", False, lossless, lossy, None,
                           {t: engine.services.token_text(t) for t in mentioned_tokens(lossless, lossy)})
        settings = reverify_view(studio, record, {"p": 0.25})["lab_matrix"]["settings"]
    finally:
        studio.close()
    assert settings["p"] == 0.25
    assert (settings["mars_threshold"], settings["fly_entropy_threshold"], settings["majority_fraction"]) == (0.8, 0.7, 0.6)


def test_the_ensembles_sentence_reads_the_probabilities_its_decision_read():
    """Under top-p the coin compares the sampled p(x), q(x): the popover's odds are theirs, not the clean ones."""
    from dropmatch.render import explain
    from dropmatch.decoding.trace import DraftedToken

    token = DraftedToken(token=1, draft_prob=0.5, target_token=2, target_token_prob=0.6, target_prob=0.1,
                         js_target=0.1, reason="ensemble", coin=0.8, sample_target_prob=0.3, sample_draft_prob=0.4)
    sentence = explain(token, {1: "cat", 2: "dog"}.get, RuleConfig("ensemble"), greedy=False)
    assert "= 0.88" in sentence  # min(1, 0.5 + 0.5 * 0.3 / 0.4); the clean p / q would say 0.60
    assert torch.isclose(torch.tensor(acceptance.ensemble_odds(0.3, 0.4, 0.5)), torch.tensor(0.875))


def test_shipped_runs_are_todays_version_with_every_setting_and_say_where_they_were_made():
    """Each run in assets/recorded: the current run-file version, every knob of the table in its settings,
    the machine and date it was recorded on, and a lab listing every rule of its mode (the judge's too)."""
    from dropmatch.decoding.acceptance import KNOBS, RULES
    from dropmatch.assets import RECORDED_DIR
    from dropmatch.runfile import RUN_VERSION, read_recorded_run

    paths = sorted(RECORDED_DIR.glob("*.json"))
    assert len(paths) >= 3
    for path in paths:
        data = json.loads(path.read_text())
        assert data["version"] == RUN_VERSION, f"{path.name} is version {data['version']}: record it again"
        for name in ("lossless", "lossy"):
            assert set(data[name]["rule_config"]["knobs"]) == set(KNOBS), f"{path.name} {name} lacks a setting"
        record = read_recorded_run(path)
        assert record.made and " cores, 20" in record.made
        mode = "greedy" if record.lossless.temperature == 0 else "sampling"
        assert {rule["name"] for rule in record.lab["rules"]} == {n for n, r in RULES.items() if mode in r.modes}
