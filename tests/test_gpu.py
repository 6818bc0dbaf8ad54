"""CUDA checks: bf16 loading, CUDA generators, synchronised timings, greedy identity on the GPU.
Skipped cleanly where there is no GPU; scripts/gpu_check.sh runs them on a CUDA machine."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def cuda_engine(tiny_dirs):
    from dropmatch.decoding.config import PairSpec
    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_hub_pair

    target, draft = tiny_dirs
    return Engine(load_hub_pair(PairSpec(str(target), str(draft)), torch.device("cuda")))


def test_models_load_in_bf16_on_the_gpu(cuda_engine):
    parameter = next(cuda_engine.target.model.parameters())
    assert parameter.device.type == "cuda" and parameter.dtype == torch.bfloat16


def test_lossless_greedy_matches_generate_on_the_gpu(cuda_engine):
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end
    from dropmatch.models import first_divergence, greedy_reference

    ids = cuda_engine.encode("what is two plus three?")
    trace = run_to_end(cuda_engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=32), RuleConfig("lossless")))
    reference = greedy_reference(cuda_engine.target, ids, 32, cuda_engine.stop_ids)
    found = first_divergence(cuda_engine.target, ids, reference, list(trace.output_ids))
    assert list(trace.output_ids) == reference, found.describe(cuda_engine.services.token_text) if found else "lengths differ"


def test_sampling_on_the_gpu_is_reproducible_with_a_cuda_generator(cuda_engine):
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end

    ids = cuda_engine.encode("the quick brown fox")
    decode = DecodeConfig(max_new_tokens=24, temperature=1.0, seed=5)
    runs = [run_to_end(cuda_engine.speculative(ids, decode, RuleConfig("dropmatch", p=0.2))) for _ in range(2)]
    assert runs[0].output_ids == runs[1].output_ids
    assert all(r.t_round > 0 for r in runs[0].rounds)


def test_embedded_pair_runs_on_the_gpu():
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import Engine, run_to_end
    from dropmatch.models import load_embedded_pair

    engine = Engine(load_embedded_pair(torch.device("cuda")))
    trace = run_to_end(engine.speculative(engine.encode("What is 2 + 3?"), DecodeConfig(max_new_tokens=24),
                                          RuleConfig("dropmatch", p=None)))
    assert trace.output_ids and trace.p is not None


def test_dropmatch_on_the_gpu_runs_paths_only_where_judged_and_p0_is_lossless(cuda_engine):
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end

    ids = cuda_engine.encode("count from one to ten")
    decode = DecodeConfig(gamma=4, max_new_tokens=32)
    lossless = run_to_end(cuda_engine.speculative(ids, decode, RuleConfig("lossless")))
    at_zero = run_to_end(cuda_engine.speculative(ids, decode, RuleConfig("dropmatch", p=0.0)))
    assert at_zero.output_ids == lossless.output_ids
    lossy = run_to_end(cuda_engine.speculative(ids, decode, RuleConfig("dropmatch", p=0.3)))
    for r in lossy.rounds:
        # (gamma + 1) clean rows, K rows per judged position, and at most the later positions of the
        # same stage of rows (verifying.path_signals may run rows past the rule's first rejection)
        path_rows = r.head_rows - len(r.drafted) - 1
        judgeable = sum(d.reason != "exact" and d.token != d.target_token for d in r.drafted)
        assert path_rows % 5 == 0 and sum(1 for d in r.drafted if d.path_tokens) <= path_rows // 5 <= judgeable
        assert all(not d.path_tokens for d in r.drafted if d.reason == "exact")


@pytest.fixture(scope="module")
def cuda_hf_pair(tiny_dirs):
    """(target, draft, tokenizer): the tiny pair as plain transformers models in bf16 on the GPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target, draft = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).to("cuda") for d in tiny_dirs)
    return target, draft, AutoTokenizer.from_pretrained(tiny_dirs[0])


def _generate(pair, text, **kwargs):
    from pathlib import Path

    target, draft, tokenizer = pair
    inputs = tokenizer(text, return_tensors="pt").to("cuda")
    return target.generate(**inputs, assistant_model=draft, custom_generate=str(Path(__file__).resolve().parent.parent),
                           trust_remote_code=True, **kwargs)


def test_generate_through_custom_generate_on_the_gpu_equals_the_targets_greedy_and_counts_lossy(cuda_hf_pair):
    """transformers' door on CUDA: the pair on one device, p = 0 equals the target's greedy generate(),
    p 0.3 returns its counts per reason (docs/generate.md)."""
    target, _, tokenizer = cuda_hf_pair
    expected = target.generate(**tokenizer("what is two plus three?", return_tensors="pt").to("cuda"), max_new_tokens=32,
                               do_sample=False)
    got = _generate(cuda_hf_pair, "what is two plus three?", max_new_tokens=32, do_sample=False, dropmatch_p=0.0)
    assert got.device.type == "cuda" and got.tolist() == expected.tolist()
    out = _generate(cuda_hf_pair, "what is two plus three?", max_new_tokens=32, do_sample=False, dropmatch_p=0.3,
                    return_dict_in_generate=True)
    assert out.dropmatch["drafted"] == sum(out.dropmatch["reasons"].values()) > 0


@pytest.mark.parametrize("knobs", [dict(dropmatch_rule="lossless"), dict(dropmatch_p=0.3)])
def test_generate_on_the_gpu_reads_the_host_once_a_round(cuda_hf_pair, knobs):
    """On an accelerator the verify step runs its paths in one head pass: DropMatch's own code reads the
    host (a sync) once a round, for lossless and for a path rule alike (greedy)."""
    from test_generate import PER_CALL_READS, DropMatchHostReads, RecordingStreamer

    streamer = RecordingStreamer()
    with DropMatchHostReads() as counted:
        _generate(cuda_hf_pair, "the quick brown fox", max_new_tokens=40, do_sample=False, dropmatch_gamma=4,
                  streamer=streamer, **knobs)
    rounds = len(streamer.puts) - 1
    assert rounds >= 5 and len(counted.reads) <= PER_CALL_READS + rounds, counted.reads


def test_greedy_generate_on_the_gpu_is_repeatable_and_leaves_torchs_generators_alone(cuda_hf_pair):
    """p 0.3, greedy: the same text whatever the global generators hold; neither the CPU's nor the GPU's moved."""
    outputs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        before = torch.get_rng_state(), torch.cuda.get_rng_state()
        outputs.append(_generate(cuda_hf_pair, "the quick brown fox", max_new_tokens=40, do_sample=False,
                                 dropmatch_p=0.3, dropmatch_gamma=4).tolist())
        assert all(torch.equal(a, b) for a, b in zip(before, (torch.get_rng_state(), torch.cuda.get_rng_state())))
    assert outputs[0] == outputs[1]


def test_the_unrecorded_one_pass_run_on_the_gpu_emits_the_recorded_staged_runs_tokens(cuda_engine):
    """Engine.speculative_tokens (generate()'s: one pass on CUDA) against Engine.speculative (staged, recorded)."""
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end
    from test_generate import _drain

    ids = cuda_engine.encode("the quick brown fox")
    decode = DecodeConfig(gamma=4, max_new_tokens=32)
    for rule in (RuleConfig("dropmatch", p=0.3), RuleConfig("majority", p=0.4)):
        trace = run_to_end(cuda_engine.speculative(ids, decode, rule))
        steps, output = _drain(cuda_engine.speculative_tokens(ids, decode, rule))
        assert output == trace.output_ids
        assert [step.reasons for step in steps] == [tuple(d.reason for d in r.drafted) for r in trace.rounds]


def test_a_rounds_timer_syncs_once_when_read_on_the_gpu(cuda_engine, monkeypatch):
    """timing.PhaseTimer on CUDA: a mark records an event (no sync); read() waits once; the phases of a round
    come out in order."""
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end

    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: syncs.append(args))
    ids = cuda_engine.encode("what is two plus three?")
    trace = run_to_end(cuda_engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=16), RuleConfig("dropmatch", p=0.3)))
    assert not syncs  # the engine never calls a device-wide synchronize to time a round
    for r in trace.rounds:
        assert 0 <= r.t_draft and 0 <= r.t_forward and 0 <= r.t_head and 0 <= r.t_mc
        assert r.t_draft + r.t_forward + r.t_head + r.t_mc <= r.t_round + 1e-6


@pytest.mark.parametrize("one_pass", [False, True])
def test_the_verify_step_on_the_gpu_decides_what_the_definition_decides(cuda_engine, one_pass):
    """verifying.verify on CUDA tensors (bf16), staged as the engine runs it and in one pass as the vLLM plugin
    runs it off a CPU: each request's verdict is the definition's, for every served rule."""
    from dropmatch.decoding.server_rounds import verify_rounds
    from test_serving import RULES_SERVED, by_definition, rounds_of

    rounds = rounds_of(cuda_engine.target, num_requests=8)
    assert rounds[0].hidden.device.type == "cuda"
    for rule in RULES_SERVED:
        for round_, found in zip(rounds, verify_rounds(cuda_engine.target, rule, rounds, one_pass)):
            assert found.verdict == by_definition(cuda_engine.target, rule, round_), rule
