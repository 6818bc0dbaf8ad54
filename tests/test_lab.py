"""The rule lab re-judges a run's drafts through the heads only, with the engine's own functions."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import PROMPTS

from dropmatch import lab
from dropmatch.decoding.config import ConfigError, DecodeConfig, RuleConfig
from dropmatch.decoding.engine import run_to_end
from dropmatch.decoding.trace import GenerationTrace

SETTINGS = [  # (decode, rule): greedy and sampled, each path rule and one without paths
    (dict(gamma=4, max_new_tokens=40), dict(rule="dropmatch", p=0.3)),
    (dict(gamma=5, max_new_tokens=40), dict(rule="naive", p=0.1, num_paths=7)),
    (dict(gamma=4, max_new_tokens=40), dict(rule="majority", p=0.4, majority_fraction=0.6, centroid="logits")),
    (dict(gamma=4, max_new_tokens=40, temperature=0.8, seed=3), dict(rule="dropmatch", p=0.3)),
    (dict(gamma=4, max_new_tokens=40, temperature=0.8, seed=5), dict(rule="js", p=0.2)),
    (dict(gamma=3, max_new_tokens=40), dict(rule="typical", typical_eps=0.1)),
]


def reasons_of(trace: GenerationTrace) -> list[list[str]]:
    """Per round with drafts (a last round may draft none), its reasons."""
    return [[d.reason for d in r.drafted] for r in trace.rounds if r.drafted]


def matrix_reasons(matrix: dict, column: int) -> list[list[str]]:
    rounds: dict[int, list[str]] = {}
    for row in matrix["rows"]:
        rounds.setdefault(row["round"], []).append(row["cells"][column]["reason"])
    return [rounds[r] for r in sorted(rounds)]


@pytest.mark.parametrize("decode, rule", SETTINGS)
def test_rejudging_a_run_with_its_own_settings_reproduces_its_decisions(far_engine, decode, rule):
    """The lab, given a run's kept states and its own settings, decides every drafted position as the
    run did (its lossy rule and the lossless test), bit for bit: one source of truth."""
    engine = far_engine
    decode_config, rule_config = DecodeConfig(**decode), RuleConfig(**rule)
    trace = run_to_end(engine.speculative(engine.encode(PROMPTS[0]), decode_config, rule_config, keep_states=True))
    assert lab.has_states(trace) and any(r.num_accepted < r.num_drafted for r in trace.rounds)
    prepared = lab.prepare(trace, engine.target, engine.draft)
    settings = lab.lab_settings(trace, **{k: v for k, v in rule.items() if k != "rule"})
    matrix = lab.rejudge(prepared, engine.target, settings, engine.services.token_text,
                         rules=("lossless", rule_config.rule))
    assert matrix_reasons(matrix, 1) == reasons_of(trace)
    assert [row["token"] for row in matrix["rows"]] == [d.token for r in trace.rounds for d in r.drafted]
    assert matrix_reasons(matrix, 0) == [lossless_reasons(states.exact) for states in trace.states if states.exact]


def test_a_run_with_counter_masks_is_rejudged_with_its_own_masks(far_engine):
    """mask_draw "counter" draws other masks than per_position's (the paths' votes differ somewhere on
    the same prompt); the run records it and the lab, from the run alone, re-judges with those masks."""
    engine, decode = far_engine, DecodeConfig(gamma=4, max_new_tokens=40)
    runs = {draw: run_to_end(engine.speculative(engine.encode(PROMPTS[0]), decode,
                                                RuleConfig("dropmatch", p=0.3, mask_draw=draw), keep_states=True))
            for draw in ("per_position", "counter")}
    trace = runs["counter"]
    assert trace.rule_config.mask_draw == "counter" and runs["per_position"].rule_config.mask_draw == "per_position"
    assert [d.path_tokens for r in trace.rounds for d in r.drafted] != \
        [d.path_tokens for r in runs["per_position"].rounds for d in r.drafted], "the two draws gave the same paths"
    settings = lab.lab_settings(trace)
    assert settings.mask_draw == "counter"
    matrix = lab.rejudge(lab.prepare(trace, engine.target, engine.draft), engine.target, settings, engine.services.token_text,
                         rules=("dropmatch",))
    assert matrix_reasons(matrix, 0) == reasons_of(trace)
    assert GenerationTrace.from_dict(json.loads(json.dumps(trace.to_dict()))).rule_config.mask_draw == "counter"


def lossless_reasons(exact: tuple[bool, ...]) -> list[str]:
    reasons = []
    for accepted in exact:
        reasons.append("exact" if accepted else "rejected")
        if not accepted:
            break
    return reasons + ["unchecked"] * (len(exact) - len(reasons))


def test_the_lab_column_of_lossless_equals_the_lossless_run_and_a_lossy_rule_accepts_more(far_engine):
    """On the lossless column's drafts, the lab's lossless column is that run's own decisions; a lossy
    rule with dropout accepts at least as much, and its counterfactual tau is reported per rule."""
    engine = far_engine
    trace = run_to_end(engine.speculative(engine.encode(PROMPTS[1]), DecodeConfig(gamma=4, max_new_tokens=40),
                                          RuleConfig("lossless"), keep_states=True))
    prepared = lab.prepare(trace, engine.target, engine.draft)
    matrix = lab.rejudge(prepared, engine.target, lab.lab_settings(None, p=0.4), engine.services.token_text)
    names = [rule["name"] for rule in matrix["rules"]]
    assert names[0] == "lossless" and {"naive", "js", "majority", "dropmatch", "typical", "fixed_js"} <= set(names)
    assert matrix_reasons(matrix, 0) == reasons_of(trace)
    summary = {row["rule"]: row for row in matrix["summary"]}
    assert summary["lossless"]["tau"] == pytest.approx(sum(r.num_accepted + 1 for r in trace.rounds) / len(trace.rounds))
    assert summary["naive"]["accepted"] > summary["lossless"]["accepted"]
    assert all(summary[name]["accepted"] >= summary["lossless"]["accepted"] for name in names)
    assert json.loads(json.dumps(matrix)) == matrix  # JSON as the API returns it


def test_states_survive_the_trace_json_round_trip_and_a_run_without_them_is_refused(tiny_engine):
    """Kept states travel in the trace JSON (the Downloads file) and re-judge the same after it;
    a trace without states gets one clear message."""
    engine = tiny_engine
    ids = engine.encode(PROMPTS[2])
    trace = run_to_end(engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=24), RuleConfig("lossless"),
                                          keep_states=True))
    again = GenerationTrace.from_dict(json.loads(json.dumps(trace.to_dict())))
    assert again == trace
    settings = lab.lab_settings(None, p=0.2)
    first = lab.rejudge(lab.prepare(trace, engine.target, engine.draft), engine.target, settings,
                        engine.services.token_text)
    second = lab.rejudge(lab.prepare(again, engine.target, engine.draft), engine.target, settings, engine.services.token_text)
    assert first["rows"] == second["rows"]
    plain = run_to_end(engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=24), RuleConfig("lossless")))
    assert plain.states == ()
    with pytest.raises(ConfigError, match="kept no states"):
        lab.prepare(plain, engine.target, engine.draft)


@pytest.mark.parametrize("source", ["ngram", "hybrid"])
def test_the_lab_reproduces_runs_drafted_by_prompt_lookup(far_engine, source):
    """Prompt-lookup rounds (one-hot draft distributions, no draft states) re-judge as the run judged."""
    engine = far_engine
    prompts = ["one two three four five one two three four five one two three", "the the the the the the the",
               "a b a b a b a b a b a b", "two plus three is five. two plus three is five. two plus"]
    decode = DecodeConfig(gamma=4, max_new_tokens=40, draft_source=source)
    for prompt in prompts:  # the first prompt whose run drafted by lookup (the far draft's text decides)
        trace = run_to_end(engine.speculative(engine.encode(prompt), decode, RuleConfig("dropmatch", p=0.3),
                                              keep_states=True))
        if any(r.draft_source == "ngram" and r.drafted for r in trace.rounds):
            break
    assert any(r.draft_source == "ngram" and r.drafted for r in trace.rounds), "no prompt drafted by lookup"
    matrix = lab.rejudge(lab.prepare(trace, engine.target, engine.draft), engine.target, lab.lab_settings(trace), engine.services.token_text, rules=("dropmatch",))
    assert matrix_reasons(matrix, 0) == reasons_of(trace)


def test_the_compare_api_returns_the_rule_lab_matrix_of_its_run(tiny_dirs):
    """/compare's JSON carries the lab's matrix for its run (the same JSON the tab draws), at the lossy
    run's own settings, over the lossless column's drafts."""
    from dropmatch.decoding.config import PairSpec, Settings
    from dropmatch.decoding.engine import Engine
    from dropmatch.ui.callbacks import compare_api
    from dropmatch.models import load_hub_pair
    from dropmatch.pair_host import Policy, PairHost

    target, draft = tiny_dirs
    studio = PairHost(loader=lambda spec: load_hub_pair(PairSpec(str(target), str(draft))), engine_factory=Engine,
                    policy=Policy(allow_local_models=True))
    try:
        *_, result = compare_api(studio, Settings(PROMPTS[0], pair="Custom hub ids", target_id=str(target),
                                              draft_id=str(draft), gamma="4", p="0.3", max_new_tokens=20,
                                              run_autoregressive=False))
    finally:
        studio.close()
    matrix = result["lab"]
    assert matrix["version"] == lab.LAB_VERSION and matrix["settings"]["p"] == pytest.approx(0.3)
    assert [rule["name"] for rule in matrix["rules"]][0] == "lossless" and len(matrix["rows"]) >= 5
    assert json.loads(json.dumps(result["lab"])) == matrix


def test_a_run_made_with_other_weights_or_dtype_is_refused_in_one_line(tiny_dirs):
    """The trace records the pair's fingerprint, device and dtype; the rule lab re-judges a run made
    with the loaded pair, and refuses one whose weights (one value changed) or dtype differ."""
    import dataclasses

    import torch

    from dropmatch.decoding.config import PairSpec
    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_hub_pair
    from dropmatch.runfile import RunRecord, mentioned_tokens
    from dropmatch.pair_host import Policy, PairHost
    from dropmatch.ui.callbacks import reverify_view

    target, draft = tiny_dirs
    studio = PairHost(loader=lambda spec: load_hub_pair(PairSpec(str(target), str(draft))), engine_factory=Engine,
                    policy=Policy(allow_local_models=True))
    engine = studio.engine(PairSpec(str(target), str(draft)))
    ids = engine.encode(PROMPTS[0])
    lossless = run_to_end(engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=16), RuleConfig("lossless"),
                                             keep_states=True))
    assert lossless.weights == engine.services.weights and (lossless.device, lossless.dtype) == ("cpu", "float32")
    assert Engine(load_hub_pair(PairSpec(str(target), str(draft)))).services.weights == engine.services.weights  # a reload agrees
    record = RunRecord(PROMPTS[0], "dropmatch", False, lossless, lossless, None,
                       {t: engine.services.token_text(t) for t in mentioned_tokens(lossless)})
    knobs = {"num_paths": 5, "p": 0.2, "majority_fraction": 0.8, "centroid": "probs", "fixed_js_threshold": 0.1, "typical_eps": 0.3}
    assert "Re-judged" in reverify_view(studio, record, knobs)["lab_status"]
    for changed in ({"dtype": "bfloat16"}, {"weights": "0" * 16 + "+" + engine.services.weights.split("+")[1]}):
        other = dataclasses.replace(record, lossless=dataclasses.replace(lossless, **changed))
        status = reverify_view(studio, other, knobs)["lab_status"]
        assert "other weights or another dtype" in status and "\n" not in status, status
    studio.close()
    altered = load_hub_pair(PairSpec(str(target), str(draft)))
    with torch.no_grad():
        next(altered.target.model.parameters()).view(-1)[0] += 1.0
    assert Engine(altered).services.weights != engine.services.weights


@pytest.mark.parametrize("pair, rule, default_rule", [
    ("far_engine", dict(rule="typical", typical_eps=0.001, typical_delta=1.0), dict(rule="typical")),
    ("tiny_engine", dict(rule="fixed_js", fixed_js_threshold=0.4), dict(rule="fixed_js")),
])
def test_the_lab_rejudges_a_run_at_its_own_knobs_without_being_told_them(request, pair, rule, default_rule):
    """A typical / fixed-JS run at knobs off their defaults: the lab, from the trace alone, decides as the run
    did; at the default knobs the same drafts are decided otherwise (so the knobs had to come from the trace)."""
    engine, decode = request.getfixturevalue(pair), DecodeConfig(gamma=4, max_new_tokens=40)
    trace = run_to_end(engine.speculative(engine.encode(PROMPTS[0]), decode, RuleConfig(**rule), keep_states=True))
    trace = GenerationTrace.from_dict(json.loads(json.dumps(trace.to_dict())))  # as a run file keeps it
    prepared = lab.prepare(trace, engine.target, engine.draft)
    own = lab.rejudge(prepared, engine.target, lab.lab_settings(trace), engine.services.token_text, rules=(rule["rule"],))
    assert matrix_reasons(own, 0) == reasons_of(trace)
    defaults = lab.rejudge(prepared, engine.target, lab.lab_settings(None, **{k: v for k, v in default_rule.items()
                                                                               if k != "rule"}),
                           engine.services.token_text, rules=(rule["rule"],))
    assert matrix_reasons(defaults, 0) != reasons_of(trace), "the knob changes no decision on this run"


def test_a_trace_keeps_every_rule_and_decode_setting_whole(far_engine):
    """Every RuleConfig and DecodeConfig field of a run is in its trace's JSON, and reads back equal."""
    engine = far_engine
    decode = DecodeConfig(gamma=3, max_new_tokens=12, temperature=0.7, top_p=0.9, seed=4, gamma_auto=False)
    rule = RuleConfig("dropmatch", p=0.2, num_paths=4, majority_fraction=0.6, typical_eps=0.05, typical_delta=0.2,
                      fixed_js_threshold=0.07, auto_agreement=0.6, rescue_argmax=True, mask_draw="counter")
    trace = run_to_end(engine.speculative(engine.encode(PROMPTS[0]), decode, rule))
    data = json.loads(json.dumps(trace.to_dict()))
    assert set(data["rule_config"]) == {f.name for f in dataclasses.fields(RuleConfig)}
    assert set(data["decode_config"]) == {f.name for f in dataclasses.fields(DecodeConfig)}
    back = GenerationTrace.from_dict(data)
    assert back.rule_config == rule and back.decode_config == decode
    assert (back.num_paths, back.temperature, back.rule_config.majority_fraction) == (4, 0.7, 0.6)


def test_a_trace_written_with_loose_settings_reads_into_whole_ones(far_engine):
    """A trace of run file version 3 (settings as loose fields, some knobs not kept) still reads: its
    loose settings fill the whole ones, the rest take their defaults."""
    engine = far_engine
    trace = run_to_end(engine.speculative(engine.encode(PROMPTS[0]), DecodeConfig(gamma=3, max_new_tokens=8),
                                          RuleConfig("majority", p=0.2, num_paths=7, majority_fraction=0.6)))
    data = json.loads(json.dumps(trace.to_dict()))
    rule, decode = data.pop("rule_config")["knobs"], data.pop("decode_config")
    data.update(num_paths=rule["num_paths"], centroid=rule["centroid"], majority_fraction=rule["majority_fraction"],
                gamma=decode["gamma"], temperature=decode["temperature"], top_p=decode["top_p"], seed=decode["seed"],
                gamma_auto=False, draft_source="model", rescue_argmax=False, judge_threshold=None,
                mask_draw="per_position")
    old = GenerationTrace.from_dict(data)
    assert old.rule_config == RuleConfig("majority", p=0.2, num_paths=7, majority_fraction=0.6)
    kept = dataclasses.replace(trace.decode_config, max_new_tokens=DecodeConfig().max_new_tokens)  # not kept then
    assert old.decode_config == kept and old.rounds == trace.rounds
