"""EAGLE-3 drafts (dropmatch/decoding/eagle3.py): published formats load from tiny saved heads, a misfit head is
refused in one line, lossless SD on the head's drafts is the target's greedy output, the head's cache and
features follow the committed text, DropMatch reads q from the head, gamma = auto prices the head's own step."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from dropmatch.decoding import eagle3, verifying
from dropmatch.decoding.causal_lm import CausalLM
from dropmatch.decoding.config import ConfigError, DecodeConfig, PairSpec, RuleConfig
from dropmatch.decoding.engine import Engine, run_to_end
from dropmatch.models import load_hub_pair
from tiny_models import make_llama, save_eagle3_head, save_pair

PROMPTS = ["what is two plus three?", "write a poem about the sea", "the quick brown fox"]
LAYERS = (0, 1, 1)  # the tiny target has two layers: low, middle and high are these


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target and draft (tests/tiny_models.save_pair), loaded by the real loader."""
    target, draft = save_pair(tmp_path_factory.mktemp("eagle_pair"), noise=0.05)
    return load_hub_pair(PairSpec(str(target), str(draft)), torch.device("cpu"))


def fresh(pair):
    """The pair over a new adapter of its target model: a head binds to the adapter it is loaded for."""
    target = pair.target
    return dataclasses.replace(pair, target=CausalLM(target.model, target.name, target.vocab_size))


@pytest.fixture(scope="module")
def draft_ids(pair):
    """The head's draft vocabulary: the tokens of the target's own greedy answers (as EAGLE-3 picks its draft
    vocabulary from the target's frequent tokens) and a few others, so that its random drafts are sometimes right."""
    engine = Engine(pair)
    seen = set()
    for prompt in PROMPTS:
        decode = DecodeConfig(max_new_tokens=24)
        seen.update(run_to_end(engine.autoregressive(engine.encode(prompt), decode)).output_ids)
    return sorted(seen | {3, 4, 5})


@pytest.fixture(scope="module")
def engine(pair, draft_ids, tmp_path_factory):
    """The pair with a random head in the authors' format over its target."""
    pair = fresh(pair)
    folder = save_eagle3_head(tmp_path_factory.mktemp("head"), pair.target.model, draft_ids, LAYERS)
    return Engine(dataclasses.replace(pair, head=eagle3.load_head(folder, pair.target)))


def test_a_head_in_the_authors_format_loads_its_keys_and_maps_its_draft_vocabulary(pair, draft_ids, tmp_path):
    """SafeAILab's config.json + pytorch_model.bin (`midlayer.*`, d2t): every tensor lands where its key says, and the
    head's distribution lives on the draft vocabulary's target ids, zero elsewhere."""
    pair = fresh(pair)
    folder = save_eagle3_head(tmp_path / "eagle", pair.target.model, draft_ids, LAYERS, seed=3)
    saved = torch.load(folder / "pytorch_model.bin", weights_only=True)
    head = eagle3.load_head(folder, pair.target)
    module = head.module.state_dict()
    for key, tensor in saved.items():
        if key != "t2d":
            torch.testing.assert_close(module[key.replace("midlayer.", "layers.0.")], tensor)
    assert head.layer_ids == LAYERS and head.target_ids.tolist() == draft_ids
    probs = head.logits(torch.randn(2, head.hidden_size)).softmax(-1)
    outside = torch.ones(pair.target.vocab_size, dtype=torch.bool).index_fill(0, torch.tensor(draft_ids), False)
    assert probs[:, outside].abs().max() == 0 and torch.allclose(probs.sum(-1), torch.ones(2))


def test_a_safetensors_head_with_its_own_embedding_reads_the_authors_default_layers(tmp_path):
    """A head in the authors' format as safetensors with its own embedding and no layer ids (AngelSlim's
    Qwen3-8B head is of this family): it reads layers 2, L // 2 and L - 3 and embeds with its own table."""
    model = make_llama(64, seed=5, layers=6)
    target = CausalLM(model, "six", 64)
    folder = save_eagle3_head(tmp_path / "angelslim", model, list(range(0, 64, 3)), (2, 3, 3), safetensors=True,
                              own_embedding=True, default_layers=True)
    head = eagle3.load_head(folder, target)
    assert head.layer_ids == (2, 3, 3)
    from safetensors.torch import load_file

    torch.testing.assert_close(head.module.embed_tokens.weight, load_file(folder / "model.safetensors")["embed_tokens.weight"])


def test_a_head_in_the_speculators_format_loads_its_qwen3_layer(pair, draft_ids, tmp_path):
    """The speculators format (speculators_model_type eagle3, a qwen3 transformer_layer_config, `layers.0.*` keys,
    q_norm and k_norm) loads with its layer ids and query and key norms."""
    pair = fresh(pair)
    folder = save_eagle3_head(tmp_path / "spec", pair.target.model, draft_ids, (1, 1, 0), fmt="speculators")
    head = eagle3.load_head(folder, pair.target)
    from safetensors.torch import load_file

    saved = load_file(folder / "model.safetensors")
    assert head.layer_ids == (1, 1, 0)
    torch.testing.assert_close(head.module.layers[0].self_attn.q_norm.weight, saved["layers.0.self_attn.q_norm.weight"])
    decode = DecodeConfig(gamma=3, max_new_tokens=12, draft_source="eagle3")
    engine = Engine(dataclasses.replace(pair, head=head))
    ids = engine.encode(PROMPTS[0])
    assert (run_to_end(engine.speculative(ids, decode, RuleConfig("lossless"))).output_ids
            == run_to_end(engine.autoregressive(ids, decode)).output_ids)


MISFITS = {  # what is changed -> a word the refusal names
    "hidden size": (dict(target_hidden=48), "hidden size"),
    "vocabulary": (dict(config_changes={"vocab_size": 300}), "vocabulary"),
    "layer ids": (dict(config_changes={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 7]}}), "layers"),
    "a later variant": (dict(config_changes={"norm_output": True}), "norm_output"),
}


@pytest.mark.parametrize("misfit", list(MISFITS))
def test_a_head_that_does_not_fit_its_target_is_refused_in_one_line(pair, draft_ids, tmp_path, misfit):
    """A head made for another hidden size, vocabulary or depth (or a variant not computed here) is refused with
    a one-line ConfigError naming what does not fit, before anything is bound to the target."""
    changes, word = MISFITS[misfit]
    pair = fresh(pair)
    model = pair.target.model
    if "target_hidden" in changes:
        model = make_llama(model.config.vocab_size, seed=1, hidden=changes.pop("target_hidden"))
    folder = save_eagle3_head(tmp_path / "misfit", model, draft_ids, LAYERS, **changes)
    with pytest.raises(ConfigError) as refused:
        eagle3.load_head(folder, pair.target)
    message = str(refused.value)
    assert "\n" not in message and word in message, message
    assert pair.target.layers_kept == ()


@pytest.mark.parametrize("gamma_auto", [False, True])
def test_lossless_greedy_on_eagle3_drafts_is_the_targets_greedy_output(engine, gamma_auto):
    """Lossless SD drafting from the head gives the target's own greedy tokens, gamma fixed and auto, and the
    head's drafts are accepted sometimes (the accepted rounds' features feed the next round)."""
    accepted = 0
    for prompt in PROMPTS:
        ids = engine.encode(prompt)
        decode = DecodeConfig(gamma=4, gamma_auto=gamma_auto, max_new_tokens=32, draft_source="eagle3")
        trace = run_to_end(engine.speculative(ids, decode, RuleConfig("lossless")))
        assert trace.output_ids == run_to_end(engine.autoregressive(ids, decode)).output_ids, prompt
        assert {r.draft_source for r in trace.rounds} == {"eagle3"}
        accepted += sum(r.num_accepted for r in trace.rounds)
    assert accepted > 0, "no draft was ever accepted: the test would not reach the accepted rounds' features"


def head_chain_from_scratch(head: eagle3.Eagle3Head, committed: list[int], length: int) -> list[int]:
    """The head's greedy chain after `committed`, recomputed with fresh caches: the target's layer inputs over
    the committed text (all but its last token), the head over them with the tokens that follow, then its own."""
    target = head.target
    target.hidden(torch.tensor(committed[:-1]), target.new_cache())
    cache = head.new_cache()
    out = head.step(target.kept_inputs[1], torch.tensor(committed[1:]), cache, fuse=True)[-1:]
    chain = []
    for _ in range(length):
        chain.append(int(head.logits(out[0]).argmax()))
        out = head.step(out, torch.tensor(chain[-1:]), cache, fuse=False)
    return chain


def test_each_rounds_drafts_are_the_heads_chain_over_the_committed_text(engine):
    """Every round's drafts equal the head's chain recomputed from scratch over the text committed so far: the
    head's cache keeps exactly the positions it read from the target, and the features it reads next are the
    target's at the accepted positions."""
    accepted = 0
    for prompt in PROMPTS:
        ids = engine.encode(prompt)
        decode = DecodeConfig(gamma=3, max_new_tokens=32, draft_source="eagle3")
        trace = run_to_end(engine.speculative(ids, decode, RuleConfig("lossless")))
        committed = list(ids) + [trace.output_ids[0]]
        for round_trace in trace.rounds:
            drafted = [d.token for d in round_trace.drafted]
            assert drafted == head_chain_from_scratch(engine.pair.head, committed, len(drafted)), (prompt, round_trace.index)
            committed += list(round_trace.emitted)
        accepted += sum(r.num_accepted for r in trace.rounds)
    assert accepted > 0, "no round accepted a draft: the accepted positions' features were never read"


def test_dropmatch_judges_eagle3_drafts_by_the_heads_distribution(engine, monkeypatch):
    """The verify step's q (what DropMatch's JS test and lossless sampling read) is the head's distribution at the
    drafted positions, placed in the target's vocabulary: softmax of lm_head(norm(state)) on the draft ids."""
    seen = []
    real_verify = verifying.verify

    def watching(target, rule, batch, **kwargs):
        seen.extend(batch)
        return real_verify(target, rule, batch, **kwargs)

    drafts = []
    real_propose = eagle3.Eagle3Drafter.propose

    def proposing(self, tokens, limit):
        drafts.append(real_propose(self, tokens, limit))
        return drafts[-1]

    monkeypatch.setattr(verifying, "verify", watching)
    monkeypatch.setattr(eagle3.Eagle3Drafter, "propose", proposing)
    decode = DecodeConfig(gamma=3, max_new_tokens=16, temperature=0.8, draft_source="eagle3")
    run_to_end(engine.speculative(engine.encode(PROMPTS[0]), decode, RuleConfig("dropmatch", p=0.2)))
    head = engine.pair.head
    assert seen and len(seen) == len(drafts)
    for inputs, draft in zip(seen, drafts):
        scores = head.module.lm_head(head.module.norm(draft.hidden)) / decode.temperature
        expected = torch.zeros(len(draft.hidden), head.target.vocab_size)
        expected[:, head.target_ids] = scores.softmax(-1)
        torch.testing.assert_close(inputs.q_signal, expected, rtol=1e-5, atol=1e-6)
        assert inputs.draft_source == "eagle3"


def test_gamma_auto_prices_an_eagle3_step_at_the_heads_own_measured_cost(engine, monkeypatch):
    """gamma = auto drafts one token a round when the head's step is priced dear and more when it is cheap: the
    price is the head's own step (Eagle3Head.step_seconds), not the draft model's. The target's prices are
    pinned (one second a call, whatever its length), so the verdict reads no clock."""
    from dropmatch.decoding.drafting import StepCosts

    head = engine.pair.head
    assert head.step_seconds() > 0
    monkeypatch.setattr(engine.services, "_costs", StepCosts(draft_step=1.0, verify_base=1.0, verify_per_position=0.0))
    lengths = {}
    for price in (1e3, 0.0):
        monkeypatch.setattr(head, "_step_seconds", price)
        decode = DecodeConfig(gamma=6, gamma_auto=True, max_new_tokens=16, draft_source="eagle3")
        trace = run_to_end(engine.speculative(engine.encode(PROMPTS[2]), decode, RuleConfig("lossless")))
        lengths[price] = {r.gamma for r in trace.rounds[:-1]}
    assert lengths[1e3] == {1} and max(lengths[0.0]) > 1, lengths


def test_the_eagle3_source_without_a_head_is_refused_in_one_line(pair):
    """Drafting from eagle3 on a pair that has no head is a one-line ConfigError, not a traceback."""
    engine = Engine(pair)
    with pytest.raises(ConfigError, match="EAGLE-3 head"):
        run_to_end(engine.speculative(engine.encode(PROMPTS[0]), DecodeConfig(draft_source="eagle3"),
                                      RuleConfig("lossless")))


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_the_heads_layer_is_transformers_decoder_layer_with_2h_projections(model_type):
    """The head's layer computes what transformers' own Llama / Qwen3 decoder layer computes with q, k, v widened to
    2 H (how speculators and vLLM build EAGLE-3's layer) over [input_layernorm(embedding) ; hidden_norm(feature)],
    the feature as residual, llama3 rope scaling; row by row through its cache as in one call."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    config = AutoConfig.for_model(model_type, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=8, num_hidden_layers=1, vocab_size=50,
                                  max_position_embeddings=1024, rope_theta=500000.0,
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    ours = eagle3.HeadModule(eagle3.HeadSpec(config, 50, 32, LAYERS, qk_norm=model_type == "qwen3"), len(LAYERS))
    with torch.no_grad():
        for parameter in ours.parameters():
            parameter.normal_(0, 0.3)
    reference = (LlamaDecoderLayer if model_type == "llama" else Qwen3DecoderLayer)(config, 0)
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(reference.self_attn, name, torch.nn.Linear(64, getattr(ours.layers[0].self_attn, name).out_features,
                                                           bias=False))
    weights = {key.removeprefix("layers.0."): value for key, value in ours.state_dict().items() if key.startswith("layers.0.")}
    hidden_norm = eagle3.RMSNorm(32, config.rms_norm_eps)
    hidden_norm.weight.data = weights.pop("hidden_norm.weight")
    reference.load_state_dict(weights)
    n, embedded, feature = 7, torch.randn(7, 32), torch.randn(7, 32)
    cos, sin = ours.rotary(feature, torch.arange(n)[None])
    with torch.no_grad():
        mixed = torch.cat([reference.input_layernorm(embedded), hidden_norm(feature)], -1)[None]
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
        attended = feature[None] + reference.self_attn(hidden_states=mixed, position_embeddings=(cos, sin),
                                                       attention_mask=causal)[0]
        expected = (attended + reference.mlp(reference.post_attention_layernorm(attended)))[0]
        at_once = ours.layers[0](embedded, feature, cos[0], sin[0], eagle3.HeadCache())
        cache = eagle3.HeadCache()
        by_row = torch.cat([ours.layers[0](embedded[i:i + 1], feature[i:i + 1], cos[0, i:i + 1], sin[0, i:i + 1], cache)
                            for i in range(n)])
    torch.testing.assert_close(at_once, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(by_row, expected, rtol=1e-5, atol=1e-5)


def test_a_head_loaded_in_bfloat16_keeps_its_rotary_frequencies_in_float32():
    """A head loaded in a bf16 target's dtype computes in bf16 but keeps its rope frequencies as made, in float32
    (rounded to bf16 they would turn positions far into a long prompt)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("llama", hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                  num_key_value_heads=2, num_hidden_layers=1, vocab_size=50, rope_theta=500000.0)
    spec = eagle3.HeadSpec(config, 50, 32, (0,))
    module = eagle3.HeadModule(spec, 1)
    made = module.rotary.inv_freq.clone()
    loaded = eagle3.build_module(spec, dict(module.state_dict()), 1, torch.bfloat16, torch.device("cpu"))
    assert loaded.fc.weight.dtype == torch.bfloat16
    assert loaded.rotary.inv_freq.dtype == torch.float32 and torch.equal(loaded.rotary.inv_freq, made)


def test_the_app_names_eagle3_drafts_in_the_verdict_popovers_step_view_and_replay(engine, tmp_path):
    """A comparison on EAGLE-3 drafts, shown as the app shows it: the verdict says so first, every drafted token's
    popover and the Step-through view say the head drafted it, Replay's rounds carry the same words; lossless SD's
    column is the target's greedy text."""
    from dropmatch.render import step_html, tooltip
    from dropmatch.replay import replay_payload
    from dropmatch.runfile import Downloads
    from dropmatch.rule_words import drafted_by
    from dropmatch.ui import views
    from dropmatch.ui.streaming import stream_comparison

    decode = DecodeConfig(gamma=3, max_new_tokens=16, draft_source="eagle3")
    *_, record = stream_comparison(engine, PROMPTS[0], decode, RuleConfig("dropmatch", p=0.3), run_ar=False)
    greedy = run_to_end(engine.autoregressive(engine.encode(PROMPTS[0]), DecodeConfig(max_new_tokens=16)))
    assert record.lossless.output_ids == greedy.output_ids
    words = drafted_by("eagle3")
    assert "EAGLE-3 head" in words and words != drafted_by("model")
    view = views.finished_view(record, Downloads(tmp_path))
    assert view["verdict"].startswith("**On EAGLE-3 drafts**")
    rounds = [r for r in record.lossy.rounds if r.drafted]
    assert rounds and all(r.draft_source == "eagle3" for r in rounds)
    assert all(words in tooltip(d, record.token_text, r.index, r.draft_source) for r in rounds for d in r.drafted)
    assert f"drafted by {words}" in step_html(rounds[0], record.token_text, record.lossy.rule_config)
    payload = replay_payload(record, "eagle")
    assert {r["drafted_by"] for column in payload["columns"] for r in column["rounds"] if r["drafted"]} == {words}


def test_a_pair_offers_eagle3_drafts_only_where_it_has_a_head():
    """The presets with a head (and custom hub ids) offer eagle3; a pair without one hides it, and eagle3 asked of
    such a pair is refused in one line before anything loads; the custom head id reaches the pair's spec."""
    from dropmatch.decoding.config import PRESETS, Settings
    from dropmatch.ui import views

    with_head = [name for name, spec in PRESETS.items() if spec is not None and spec.head]
    assert len(with_head) == 2 and all("EAGLE-3" in name for name in with_head)
    assert all("eagle3" in views.draft_source_choices(name) for name in with_head + ["Custom hub ids"])
    assert "eagle3" not in views.draft_source_choices(Settings().pair)
    *_, radio = views.pair_view(Settings().pair, "eagle3")
    assert radio["value"] == Settings().draft_source and "eagle3" not in radio["choices"]
    with pytest.raises(ConfigError, match="need a pair with an EAGLE-3 head") as refused:
        Settings("hi", draft_source="eagle3").pair_spec()
    assert "\n" not in str(refused.value)
    spec = Settings("hi", pair="Custom hub ids", target_id="t", draft_id="d", head_id=" h ",
                    draft_source="eagle3").pair_spec()
    assert spec.head == "h" and "EAGLE-3 h" in spec.label
    assert "eagle3" in views.draft_source_choices(None)  # a restored run's source stays a valid choice


def test_a_servers_model_rules_check_the_eagle3_head_as_they_check_the_pair():
    """A head is a model the server loads: it must be a hub id on the allowed list (or a local folder where
    allowed), as target and draft must; on a Space the presets' heads are on the list."""
    from dropmatch.decoding.config import PRESETS, PairSpec
    from dropmatch.pair_host import Policy

    policy = Policy(allowed_models=frozenset({"a/target", "a/draft", "a/head"}))
    assert policy.check(PairSpec("a/target", "a/draft", head="a/head")).head == "a/head"
    with pytest.raises(ConfigError, match="'b/head' is not on this server's list"):
        policy.check(PairSpec("a/target", "a/draft", head="b/head"))
    with pytest.raises(ConfigError, match="not a hub id"):
        Policy().check(PairSpec("a/target", "a/draft", head="/tmp/some/folder"))
    on_space = Policy.from_env({"SPACE_ID": "x/y"})
    assert {spec.head for spec in PRESETS.values() if spec is not None and spec.head} <= on_space.allowed_models
