"""A draft that reads the target's hidden states (EAGLE-style FeatureDraft) in the engine, on tiny models."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS
from tiny_models import perturbed_copy

from dropmatch.config import DecodeConfig, PairSpec, RuleConfig
from dropmatch.engine import Engine, run_to_end
from dropmatch.models import (
    FEATURE_KIND, CausalLM, FeatureDraft, LoadedPair, build_feature_net, draft_in_dtype, greedy_reference,
    load_hub_pair,
)


class SpyFeatureDraft(FeatureDraft):
    """Records every call: (cache length before, token ids, features read, hidden states returned)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def hidden(self, input_ids, cache, target_features=None):
        start = cache.get_seq_length()
        out = super().hidden(input_ids, cache, target_features)
        self.calls.append((start, input_ids.tolist(), target_features.clone(), out.clone()))
        return out


def feature_pair(target_dir, noise: float, spy: bool = False) -> LoadedPair:
    """The tiny target and a FeatureNet with all its layers: a (noisy) copy of the target that
    ignores the features (fuse = [I, 0]), so it drafts well and the plumbing can be checked."""
    hub = load_hub_pair(PairSpec(str(target_dir), str(target_dir)), torch.device("cpu"))
    target_model = hub.target.model
    config = {**target_model.config.to_dict(), "draft_kind": FEATURE_KIND}
    net = build_feature_net(config, target_model)
    copy = perturbed_copy(target_model, noise, seed=5) if noise else target_model
    net.model.get_decoder().layers.load_state_dict(copy.get_decoder().layers.state_dict())
    net.model.get_decoder().norm.load_state_dict(copy.get_decoder().norm.state_dict())
    hidden_size = target_model.config.hidden_size
    with torch.no_grad():
        net.fuse.weight.zero_()
        net.fuse.weight[:, :hidden_size] = torch.eye(hidden_size)
        net.fuse.bias.zero_()
    draft = (SpyFeatureDraft if spy else FeatureDraft)(net, "feature-draft", hub.target.vocab_size)
    return LoadedPair(target=hub.target, draft=draft, tokenizer=hub.tokenizer, spec=hub.spec)


@pytest.mark.parametrize("kind", ["plain", "feature"])
def test_a_bf16_draft_leaves_the_fp32_target_untouched_and_lossless_output_identical(tiny_dirs, kind):
    """draft_in_dtype (what the embedded pair does on a CPU with native bf16): the draft computes
    in bf16, the target it shares its embedding with stays fp32 and gives the same states."""
    target_dir, draft_dir = tiny_dirs
    if kind == "feature":
        pair = feature_pair(target_dir, noise=0.05)
        pair.draft.net = draft_in_dtype(pair.draft.net, torch.bfloat16)
    else:
        pair = load_hub_pair(PairSpec(str(target_dir), str(draft_dir)), torch.device("cpu"))
        pair.draft = CausalLM(draft_in_dtype(pair.draft.model, torch.bfloat16), "bf16 draft", pair.draft.vocab_size)
    engine = Engine(pair)
    ids = engine.encode(PROMPTS[0])
    ids_tensor = torch.tensor(ids)
    target_states = engine.target.hidden(ids_tensor, engine.target.new_cache())
    assert target_states.dtype == torch.float32 and engine.target.model.get_input_embeddings().weight.dtype == torch.float32
    reference = load_hub_pair(PairSpec(str(target_dir), str(target_dir)), torch.device("cpu")).target
    assert torch.equal(target_states, reference.hidden(ids_tensor, reference.new_cache()))
    assert torch.equal(engine.target.logits(target_states), reference.logits(target_states))
    features = torch.zeros(len(ids), target_states.shape[-1])
    draft_states = engine.draft.hidden(ids_tensor, engine.draft.new_cache(), features if kind == "feature" else None)
    assert draft_states.dtype == torch.bfloat16 and engine.draft.logits(draft_states).dtype == torch.float32
    trace = run_to_end(engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=40), RuleConfig("lossless")))
    assert list(trace.output_ids) == greedy_reference(engine.target, ids, 40, engine.stop_ids)
    assert sum(r.num_accepted for r in trace.rounds) > 0


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_lossless_greedy_with_a_feature_draft_is_token_identical_to_target_generate(tiny_dirs, prompt, gamma):
    engine = Engine(feature_pair(tiny_dirs[0], noise=0.05))
    ids = engine.encode(prompt)
    trace = run_to_end(engine.speculative(ids, DecodeConfig(gamma=gamma, max_new_tokens=40), RuleConfig("lossless")))
    assert list(trace.output_ids) == greedy_reference(engine.target, ids, 40, engine.stop_ids)
    assert sum(r.num_accepted for r in trace.rounds) > 0


def test_a_feature_draft_reads_the_targets_hidden_state_before_each_committed_token(tiny_dirs):
    """Every committed token is fed to the draft once, with the target's own final hidden state
    of the position before it (what one full target forward computes); drafted tokens are fed
    one at a time with the draft's own estimate from the call before."""
    pair = feature_pair(tiny_dirs[0], noise=0.05, spy=True)
    engine = Engine(pair)
    ids = engine.encode(PROMPTS[0])
    trace = run_to_end(engine.speculative(ids, DecodeConfig(gamma=3, max_new_tokens=40), RuleConfig("lossless")))
    tokens = list(ids) + list(trace.output_ids)
    full = engine.target.hidden(torch.tensor(tokens[:-1]), engine.target.new_cache())  # [len - 1, H]
    before = torch.cat([torch.zeros(1, full.shape[1]), full])  # row t: the feature before token t
    real_end, own, previous_out = 0, 0, None
    for start, fed, features, out in pair.draft.calls:
        real = fed == tokens[start : start + len(fed)] and torch.allclose(
            features, before[start : start + len(fed)], atol=1e-4)
        if real:
            assert start == real_end, "committed tokens are fed in order, each once"
            real_end = start + len(fed)
        else:
            assert len(fed) == 1 and torch.equal(features, previous_out[-1:])
            own += 1
        previous_out = out
    assert real_end >= len(tokens) - len(trace.rounds[-1].emitted) and own > 0
    assert sum(r.num_accepted for r in trace.rounds) > len(trace.rounds)  # accepted drafts were fed again


def test_a_feature_draft_refuses_to_run_without_features(tiny_dirs):
    draft = feature_pair(tiny_dirs[0], noise=0.0).draft
    with pytest.raises(ValueError, match="hidden state"):
        draft.hidden(torch.tensor([1, 2]), draft.new_cache())


def test_a_plain_draft_does_not_read_target_features(tiny_engine):
    assert isinstance(tiny_engine.draft, CausalLM) and not tiny_engine.draft.reads_target_features


def test_the_benchmark_skips_the_peer_for_a_feature_draft_and_says_so(tiny_dirs, tiny_engine, capsys):
    """transformers' assisted generation cannot feed a draft the target's hidden states."""
    from dropmatch.bench import peer_runs

    assert not peer_runs(True, DecodeConfig(), feature_pair(tiny_dirs[0], noise=0.0).draft)
    assert "--peer skipped" in capsys.readouterr().err
    assert peer_runs(True, DecodeConfig(), tiny_engine.draft)
    assert not peer_runs(False, DecodeConfig(), tiny_engine.draft)
