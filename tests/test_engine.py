"""The speculative decoding loop on tiny random pairs saved and loaded through the real code."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import PROMPTS

from dropmatch.decoding.config import ConfigError, DecodeConfig, PairSpec, RuleConfig
from dropmatch.decoding.engine import Engine, run_to_end
from dropmatch.metrics import first_divergence, off_nucleus_rate, pooled, summarize, tau, tokens_per_s
from dropmatch.models import ModelLoadError, greedy_reference, load_hub_pair
from dropmatch.decoding.trace import GenerationTrace


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_lossless_greedy_is_token_identical_to_target_generate(tiny_engine, prompt, gamma):
    """Greedy lossless SD emits exactly the target's own greedy generate() tokens."""
    ids = tiny_engine.encode(prompt)
    decode = DecodeConfig(gamma=gamma, max_new_tokens=40)
    trace = run_to_end(tiny_engine.speculative(ids, decode, RuleConfig("lossless")))
    reference = greedy_reference(tiny_engine.target, ids, 40, tiny_engine.stop_ids)
    assert list(trace.output_ids) == reference
    assert any(r.num_accepted > 0 for r in trace.rounds), "the test pair should accept some drafts"


def test_lossless_greedy_identity_holds_with_a_poor_draft(far_engine):
    """Many rejections and corrections still give the target's greedy text."""
    ids = far_engine.encode(PROMPTS[0])
    decode = DecodeConfig(gamma=4, max_new_tokens=40)
    trace = run_to_end(far_engine.speculative(ids, decode, RuleConfig("lossless")))
    assert list(trace.output_ids) == greedy_reference(far_engine.target, ids, 40, far_engine.stop_ids)
    assert sum(r.extra_kind == "correction" for r in trace.rounds) > 3


def test_autoregressive_is_token_identical_to_target_generate(tiny_engine):
    ids = tiny_engine.encode(PROMPTS[1])
    trace = run_to_end(tiny_engine.autoregressive(ids, DecodeConfig(max_new_tokens=30)))
    assert list(trace.output_ids) == greedy_reference(tiny_engine.target, ids, 30, tiny_engine.stop_ids)
    assert tau(trace) == 1.0


@pytest.fixture(scope="module")
def far_lossless(far_engine):
    """(prompt, temperature) -> the far pair's lossless run at the settings of the p = 0 test below, made
    once and held against every rule and centroid."""
    runs = {}

    def lossless(prompt: str, decode: DecodeConfig):
        key = (prompt, decode.temperature)
        if key not in runs:
            runs[key] = run_to_end(far_engine.speculative(far_engine.encode(prompt), decode, RuleConfig("lossless")))
        return runs[key]

    return lossless


@pytest.mark.parametrize("rule", ["naive", "js", "majority", "dropmatch"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("centroid", ["probs", "logits"])
def test_every_path_rule_with_p_zero_is_lossless_sd_and_costs_no_path_work(far_engine, far_lossless, rule, temperature,
                                                                            centroid):
    """p = 0: every path is the clean target, so a path rule accepts only what lossless SD accepts,
    under greedy and sampling (same seed: the masks' stream is apart), and no path row is computed."""
    for prompt in PROMPTS[:2]:
        ids = far_engine.encode(prompt)
        decode = DecodeConfig(gamma=4, max_new_tokens=40, temperature=temperature, seed=3)
        lossless = far_lossless(prompt, decode)
        trace = run_to_end(far_engine.speculative(ids, decode, RuleConfig(rule, p=0.0, centroid=centroid)))
        assert trace.output_ids == lossless.output_ids
        assert [r.num_accepted for r in trace.rounds] == [r.num_accepted for r in lossless.rounds]
        assert [r.head_rows for r in trace.rounds] == [r.head_rows for r in lossless.rounds]


def test_mc_masks_never_shift_the_sampling_stream(tiny_engine):
    """At temperature 0.8, p = auto's calibration and the masks draw from their own stream: the
    prefill's sampled token and the first round's sampled drafts equal lossless SD's."""
    ids = tiny_engine.encode(PROMPTS[1])
    decode = DecodeConfig(gamma=4, max_new_tokens=20, temperature=0.8, seed=5)
    lossless = run_to_end(tiny_engine.speculative(ids, decode, RuleConfig("lossless")))
    lossy = run_to_end(tiny_engine.speculative(ids, decode, RuleConfig("dropmatch", p=None)))
    assert lossy.t_calibration > 0 and lossy.p is not None
    assert lossy.first_token == lossless.first_token
    assert [d.token for d in lossy.rounds[0].drafted] == [d.token for d in lossless.rounds[0].drafted]


def test_path_tokens_are_each_paths_top_token_under_sampling(tiny_engine):
    """Under sampling too, a path's token is the argmax of its distribution (its top token)."""
    ids = tiny_engine.encode(PROMPTS[2])
    trace = run_to_end(tiny_engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=30, temperature=1.5),
                                               RuleConfig("naive", p=0.3)))
    judged = [d for r in trace.rounds for d in r.drafted if d.path_tokens]
    assert judged
    for d in judged:
        for token, top in zip(d.path_tokens, d.path_top):
            best = top[0][1]  # the path's top probability; a tie (bf16 path logits) may list another id first
            assert dict(top).get(token) == best


def test_off_nucleus_rate_is_zero_for_lossless_greedy_and_counts_forced_tokens(far_engine):
    """Lossless greedy emits the target's argmax, always inside its nucleus; a rule that accepts
    every draft of a far draft emits tokens the target puts outside it."""
    lossless, forced = [], []
    for prompt in PROMPTS:
        ids = far_engine.encode(prompt)
        decode = DecodeConfig(gamma=4, max_new_tokens=40)
        lossless.append(run_to_end(far_engine.speculative(ids, decode, RuleConfig("lossless"))))
        forced.append(run_to_end(far_engine.speculative(ids, decode, RuleConfig("fixed_js", fixed_js_threshold=1.0))))
    assert all(off_nucleus_rate(t) == 0.0 for t in lossless)
    assert pooled(forced)["off_nucleus_rate"] > 0.0
    assert pooled(forced)["target_nll"] > pooled(lossless)["target_nll"]
    assert all(len(t.output_ids) == 1 + sum(len(r.emitted_logprob) for r in t.rounds) for t in forced)


@pytest.mark.parametrize("rule, reasons", [("dropmatch", {"js", "majority"}), ("naive", {"naive"})])
def test_path_rules_with_dropout_accept_more_than_lossless(far_engine, rule, reasons):
    """With p > 0 a path rule adds acceptances on top of the exact ones, and says which test gave them."""
    runs = {"lossless": [], rule: []}
    for prompt in PROMPTS:  # pooled: one lossy acceptance changes the text after it, so one prompt may tie
        ids = far_engine.encode(prompt)
        decode = DecodeConfig(gamma=4, max_new_tokens=40)
        runs["lossless"].append(run_to_end(far_engine.speculative(ids, decode, RuleConfig("lossless"))))
        runs[rule].append(run_to_end(far_engine.speculative(ids, decode, RuleConfig(rule, num_paths=8, p=0.5,
                                                                                     majority_fraction=0.5))))
    given = {d.reason for trace in runs[rule] for r in trace.rounds for d in r.drafted}
    assert given & reasons, f"{rule} gave no acceptance of its own; reasons seen: {given}"
    lossless_tau, lossy_tau = (pooled(traces)["tau"] for traces in runs.values())
    assert lossy_tau > lossless_tau, f"{rule} tau {lossy_tau:.3f} <= lossless {lossless_tau:.3f}"


def test_same_seed_gives_same_sampled_text_and_other_seed_differs(tiny_engine):
    ids = tiny_engine.encode(PROMPTS[2])
    runs = [run_to_end(tiny_engine.speculative(ids, DecodeConfig(max_new_tokens=30, temperature=1.0, seed=s),
                                               RuleConfig("dropmatch", p=0.2))) for s in (7, 7, 8)]
    assert runs[0].output_ids == runs[1].output_ids
    assert runs[0].output_ids != runs[2].output_ids


def test_identical_draft_accepts_every_token_and_takes_the_bonus(tiny_dirs):
    """Draft == target: every round accepts gamma tokens and adds a bonus (tau = gamma + 1)."""
    target, _ = tiny_dirs
    engine = Engine(load_hub_pair(PairSpec(str(target), str(target)), torch.device("cpu")))
    ids = engine.encode(PROMPTS[0])
    trace = run_to_end(engine.speculative(ids, DecodeConfig(gamma=3, max_new_tokens=41), RuleConfig("lossless")))
    full_rounds = [r for r in trace.rounds if len(r.emitted) == 4]
    assert len(full_rounds) >= len(trace.rounds) - 1
    assert all(r.extra_kind == "bonus" for r in full_rounds)


def test_max_new_tokens_is_respected_exactly(tiny_engine):
    """A run ends at exactly max_new_tokens tokens, unless a stop token came first."""
    ids = tiny_engine.encode(PROMPTS[0])
    for limit in (1, 2, 7, 23):
        trace = run_to_end(tiny_engine.speculative(ids, DecodeConfig(gamma=5, max_new_tokens=limit),
                                                   RuleConfig("dropmatch", p=0.3)))
        if trace.stop_reason == "eos":
            assert len(trace.output_ids) <= limit and trace.output_ids[-1] in tiny_engine.stop_ids
        else:
            assert trace.stop_reason == "max_new_tokens", trace.stop_reason
            assert len(trace.output_ids) == limit, f"{len(trace.output_ids)} tokens for max_new_tokens {limit}"
        assert trace.stop_reason in ("max_new_tokens", "eos")


def test_generation_stops_at_the_end_of_turn_token(tiny_engine):
    """A stop token in the emitted block ends the run and nothing after it is kept."""
    engine = Engine(tiny_engine.pair)
    engine.stop_ids = frozenset()  # no stop token: the run goes on to max_new_tokens
    ids = engine.encode(PROMPTS[0])
    trace = run_to_end(engine.speculative(ids, DecodeConfig(max_new_tokens=60), RuleConfig("lossless")))
    tokens = list(trace.output_ids)
    assert len(tokens) == 60 and trace.stop_reason == "max_new_tokens"
    # Force a stop: treat the 5th greedy token as end of turn; the run ends at its first occurrence.
    fifth = tokens[4]
    engine.stop_ids = frozenset({fifth})
    cut = run_to_end(engine.speculative(ids, DecodeConfig(max_new_tokens=60), RuleConfig("lossless")))
    assert list(cut.output_ids) == tokens[: tokens.index(fifth) + 1]
    assert cut.stop_reason == "eos"


@pytest.mark.parametrize("engine_name", ["tiny_engine", "far_engine"])
@pytest.mark.parametrize("rule", ["dropmatch", "naive"])
def test_mc_paths_run_only_where_the_rule_reads_them(engine_name, rule, request):
    """Path data at every position the rule judged (neither an exact match nor after the rejection)
    and nowhere else, and the head ran (gamma + 1) clean rows + K rows per position whose paths were
    computed: the judged ones, and at most the later judged ones of the same batch of rows."""
    engine = request.getfixturevalue(engine_name)
    judged = 0
    for prompt in PROMPTS:
        trace = run_to_end(engine.speculative(engine.encode(prompt), DecodeConfig(gamma=5, max_new_tokens=40),
                                              RuleConfig(rule, num_paths=5, p=0.3)))
        for r in trace.rounds:
            with_paths = [d for d in r.drafted if d.path_tokens]
            path_rows = r.head_rows - len(r.drafted) - 1
            judgeable = sum(d.reason != "exact" and d.token != d.target_token for d in r.drafted)
            assert path_rows % 5 == 0 and len(with_paths) <= path_rows // 5 <= judgeable, \
                f"{path_rows} path rows for {len(with_paths)} judged and {judgeable} judgeable positions"
            for d in r.drafted:
                if d.reason == "exact":
                    assert not d.path_tokens
                elif d.reason != "unchecked":
                    judged += 1
                    assert len(d.path_tokens) == 5 and d.threshold is not None and d.draft_votes is not None
                else:
                    assert not d.path_tokens, "path data at a position after the rejection (never read)"
    assert judged > 0  # the property was exercised


def test_a_set_stop_event_ends_the_run_before_any_round(tiny_engine):
    import threading

    event = threading.Event()
    event.set()
    stopped = run_to_end(tiny_engine.speculative(tiny_engine.encode(PROMPTS[0]), DecodeConfig(max_new_tokens=200),
                                                 RuleConfig("lossless"), stop_event=event))
    assert stopped.stop_reason == "stopped" and len(stopped.rounds) == 0


def test_auto_p_is_chosen_from_the_prompt_and_recorded(tiny_engine):
    ids = tiny_engine.encode(PROMPTS[1])
    trace = run_to_end(tiny_engine.speculative(ids, DecodeConfig(max_new_tokens=10), RuleConfig("dropmatch", p=None)))
    assert trace.p is not None and 0.0 < trace.p < 1.0


def test_trace_survives_a_json_round_trip(tiny_engine):
    ids = tiny_engine.encode(PROMPTS[0])
    trace = run_to_end(tiny_engine.speculative(ids, DecodeConfig(max_new_tokens=20), RuleConfig("dropmatch", p=0.3)))
    again = GenerationTrace.from_dict(json.loads(json.dumps(trace.to_dict())))
    assert again == trace
    assert (again.centroid, again.rule_config.majority_fraction) == ("probs", 0.8)


def test_metrics_count_emitted_tokens_per_round(tiny_engine):
    ids = tiny_engine.encode(PROMPTS[0])
    decode = DecodeConfig(gamma=4, max_new_tokens=30)
    ar = run_to_end(tiny_engine.autoregressive(ids, decode))
    lossless = run_to_end(tiny_engine.speculative(ids, decode, RuleConfig("lossless")))
    lossy = run_to_end(tiny_engine.speculative(ids, decode, RuleConfig("dropmatch", p=0.3)))
    m = summarize(lossy, tokens_per_s(ar), lossless=lossless)  # the target alone's rate: here the loop's own
    assert m.tau == pytest.approx((len(lossy.output_ids) - 1) / len(lossy.rounds))
    assert m.target_calls == len(lossy.rounds) + 1
    assert 0.0 <= m.acceptance_rate <= 1.0
    assert m.mc_overhead is not None and 0.0 <= m.mc_overhead < 1.0
    assert m.speedup_vs_ar == pytest.approx(tokens_per_s(lossy) / tokens_per_s(ar))
    pairs = list(zip(lossy.output_ids, lossless.output_ids))
    differing = [i for i, (a, b) in enumerate(pairs) if a != b]
    same_length = len(lossy.output_ids) == len(lossless.output_ids)
    assert m.first_divergence == (differing[0] if differing else None if same_length else len(pairs))
    assert summarize(lossless).mc_overhead is None


def test_first_divergence_is_the_first_differing_position():
    """None for the same output; the first index that differs; the shorter length for a prefix."""
    from dataclasses import replace

    from fake_engine import FakeEngine

    engine = FakeEngine()
    ids = engine.encode("a b c d e f g h")
    base = run_to_end(engine.speculative(ids, DecodeConfig(gamma=3, max_new_tokens=8), RuleConfig("lossless")))
    output = list(base.output_ids)
    changed = replace(base, output_ids=tuple(output[:3] + [output[3] + 1] + output[4:]))
    assert first_divergence(base, replace(base)) is None
    assert first_divergence(changed, base) == 3
    assert first_divergence(replace(base, output_ids=tuple(output[:5])), base) == 5


def test_empty_prompt_and_overlong_request_get_clear_errors(tiny_engine):
    with pytest.raises(ConfigError, match="empty"):
        tiny_engine.encode("   ")
    ids = tiny_engine.encode(PROMPTS[0])
    with pytest.raises(ConfigError, match="context"):
        tiny_engine.check_fits(ids, DecodeConfig(max_new_tokens=10_000))


def test_pair_with_different_tokenizers_is_refused(tmp_path, tiny_dirs):
    from tiny_models import make_llama, save_tokenizer

    other_tokenizer = save_tokenizer(tmp_path / "tok", vocab_size=300)
    other = make_llama(len(other_tokenizer), seed=3)
    other.save_pretrained(tmp_path / "other")
    other_tokenizer.save_pretrained(tmp_path / "other")
    with pytest.raises(ModelLoadError, match="do not share a tokenizer"):
        load_hub_pair(PairSpec(str(tiny_dirs[0]), str(tmp_path / "other")), torch.device("cpu"))


def test_missing_model_is_a_load_error_not_a_traceback(tmp_path):
    with pytest.raises(ModelLoadError, match="could not load"):
        load_hub_pair(PairSpec(str(tmp_path / "nowhere"), str(tmp_path / "nowhere")), torch.device("cpu"))


def test_a_pair_too_big_for_memory_is_refused_with_a_message(tiny_dirs, monkeypatch):
    from dropmatch.models import loading

    monkeypatch.setattr(loading, "available_memory", lambda device: 1000)
    with pytest.raises(ModelLoadError, match="only 0.0 GiB of memory is free"):
        load_hub_pair(PairSpec(str(tiny_dirs[0]), str(tiny_dirs[1])), torch.device("cpu"))


@pytest.mark.parametrize("path_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.02, 0.9])
def test_path_logits_equal_the_head_of_the_dropped_out_hidden_states(tiny_engine, p, path_dtype, monkeypatch):
    """Sparse (fp32 paths, few dropped entries: clean logits minus the dropped share) or dense (one
    matmul, in bf16 where the device has it), path logits are W (h * keep) / (1 - p) up to rounding."""
    from dropmatch.decoding import mc_head

    target = tiny_engine.target
    monkeypatch.setattr(target, "_path_dtype", path_dtype)
    monkeypatch.setattr(target, "_path_weight", None)
    hidden = torch.randn(1, target.head_weight.shape[1], generator=torch.Generator().manual_seed(1))
    keep = mc_head.dropout_masks(hidden, 5, p, torch.Generator().manual_seed(2))
    dropped = int(torch.count_nonzero(hidden * (1 - keep)))
    assert target.sparse_pays(dropped) == (path_dtype == torch.float32 and p == 0.02)
    expected = target.logits(hidden.unsqueeze(0) * keep / (1 - p))
    got = target.path_logits(hidden, keep, p, target.logits(hidden))
    scale = float(expected.abs().max())  # sparse at p = 0.9 divides fp32 rounding by 0.1
    tolerance = 1e-5 * scale if path_dtype == torch.float32 else 5e-2 * scale
    assert got.shape == expected.shape and float((got - expected).abs().max()) <= tolerance


def test_the_path_product_follows_the_device_and_the_count_of_dropped_entries_never_a_timing(tiny_engine,
                                                                                            monkeypatch):
    """Native bf16: always the dense bf16 pass. fp32 paths on a CPU: sparse below half the hidden
    size of dropped entries, dense from there; and nothing in the choice reads a clock."""
    import time as time_module

    target = tiny_engine.target
    half = target.hidden_size // 2
    monkeypatch.setattr(target, "_path_dtype", torch.bfloat16)
    assert not any(target.sparse_pays(n) for n in (1, half - 1, half))
    monkeypatch.setattr(target, "_path_dtype", torch.float32)
    assert [target.sparse_pays(n) for n in (1, half - 1, half, 5 * half)] == [True, True, False, False]

    def no_clock():
        raise AssertionError("the path product read a clock")

    monkeypatch.setattr(time_module, "perf_counter", no_clock)
    monkeypatch.setattr(time_module, "time", no_clock)
    target.prepare_paths()
    hidden = torch.randn(2, target.hidden_size, generator=torch.Generator().manual_seed(3))
    keep = torch.ones(5, 2, target.hidden_size)
    keep[:, :, :3] = 0.0
    target.path_logits(hidden, keep, 0.1, target.logits(hidden))


def test_two_loads_of_a_pair_take_the_same_path_precision_and_decide_every_slot_alike(tiny_dirs, tiny_engine):
    """A second load of the same weights: the same fingerprint (which names the path dtype) and, at a
    p where paths decide, the same reasons, tokens and JS values round by round."""
    again = Engine(load_hub_pair(PairSpec(str(tiny_dirs[0]), str(tiny_dirs[1])), torch.device("cpu")))
    assert again.target._path_dtype == tiny_engine.target._path_dtype
    assert again.services.computed_by() == tiny_engine.services.computed_by()
    ids = tiny_engine.encode(PROMPTS[0])
    decode, rule = DecodeConfig(gamma=4, max_new_tokens=40), RuleConfig("dropmatch", p=0.2)
    first, second = (run_to_end(engine.speculative(ids, decode, rule)) for engine in (tiny_engine, again))
    assert first.output_ids == second.output_ids
    assert [[(d.reason, d.js, d.threshold) for d in r.drafted] for r in first.rounds] == \
        [[(d.reason, d.js, d.threshold) for d in r.drafted] for r in second.rounds]
    assert sum(d.reason in ("js", "majority") for r in first.rounds for d in r.drafted) > 0


@pytest.mark.parametrize("kernel", ["torch", "rows", "packed"])
@pytest.mark.parametrize("shape", [(0, 24), (1, 24), (2, 24), (5, 24), (1, 3, 24), (17, 24), (1, 40, 24)])
def test_every_cpu_kernel_is_the_same_product_as_nn_linear_for_any_number_of_rows(shape, kernel):
    """A ChosenLinear forced to any kernel (torch's default, the (W x^T)^T layout, oneDNN with a packed
    weight) gives F.linear's numbers and shape, bias included."""
    from dropmatch.decoding.cpu_kernels import ChosenLinear
    from dropmatch.decoding.cpu_kernels import packed_weight

    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(24, 40)
    hidden = torch.randn(*shape, generator=generator)
    expected = torch.nn.functional.linear(hidden, linear.weight, linear.bias)
    packed = packed_weight(linear.weight) if kernel == "packed" else None
    module = ChosenLinear.sharing(linear, kernel, kernel, packed)
    with torch.inference_mode():
        got = module(hidden)
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert torch.allclose(got, expected, atol=1e-5)


def _engine_with_kernels(dirs, kernel, monkeypatch):
    monkeypatch.setenv("DROPMATCH_CPU_KERNELS", kernel)
    return Engine(load_hub_pair(PairSpec(str(dirs[0]), str(dirs[1])), torch.device("cpu")))


@pytest.mark.parametrize("kernel", ["rows", "packed"])
def test_each_forced_cpu_kernel_gives_the_tokens_of_torchs_default_and_is_recorded(tiny_dirs, kernel, monkeypatch):
    """Pinned by DROPMATCH_CPU_KERNELS, every fp32 layer takes that kernel; lossless SD and DropMatch
    then emit the same tokens and reasons as with torch's default everywhere, and the run records the
    choice beside the weights' fingerprint."""
    from dropmatch.decoding.cpu_kernels import ChosenLinear

    reference, forced = (_engine_with_kernels(tiny_dirs, k, monkeypatch) for k in ("torch", kernel))
    layers = [m for m in forced.target.model.modules() if isinstance(m, torch.nn.Linear)]
    assert layers and all(type(m) is ChosenLinear and (m.one, m.few) == (kernel, kernel) for m in layers)
    ids = reference.encode(PROMPTS[0])
    for rule in (RuleConfig("lossless"), RuleConfig("dropmatch", p=0.2)):
        runs = [run_to_end(e.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=32), rule)) for e in (reference, forced)]
        assert runs[0].output_ids == runs[1].output_ids
        assert [[d.reason for d in r.drafted] for r in runs[0].rounds] == [[d.reason for d in r.drafted] for r in runs[1].rounds]
    assert runs[0].kernels == "target torch | draft torch"
    assert f"1 row {kernel} / few {kernel}" in runs[1].kernels and runs[1].weights == runs[0].weights


def test_transformers_own_generate_runs_on_torchs_default_kernels_and_ours_come_back(tiny_dirs, monkeypatch):
    """The yardstick (plain generate(), references._timed_generate) runs every layer on torch's default, as
    the model a user loads does; after it, the layers hold the kernels the loader chose."""
    from dropmatch.decoding.cpu_kernels import ChosenLinear
    from dropmatch.decoding.cpu_kernels import torch_default_kernels

    engine = _engine_with_kernels(tiny_dirs, "rows", monkeypatch)
    layers = [m for model in (engine.target.model, engine.draft.model) for m in model.modules()
              if isinstance(m, ChosenLinear)]
    with torch_default_kernels(engine.target.model, None, engine.draft.model):
        assert layers and all((m.one, m.few) == ("torch", "torch") for m in layers)
    assert all((m.one, m.few) == ("rows", "rows") for m in layers)


def test_measured_cpu_kernels_choose_among_the_known_ones_and_say_so(tiny_dirs, monkeypatch):
    """Unpinned, the loader measures each weight shape and picks one of the known kernels per row
    class; the summary names every non-default choice (or "torch"); a bad pin is one line."""
    from dropmatch.decoding.cpu_kernels import ChosenLinear, kernel_summary
    from dropmatch.decoding.cpu_kernels import KERNELS, pinned_kernel

    monkeypatch.delenv("DROPMATCH_CPU_KERNELS", raising=False)
    engine = Engine(load_hub_pair(PairSpec(str(tiny_dirs[0]), str(tiny_dirs[1])), torch.device("cpu")))
    layers = [m for m in engine.target.model.modules() if isinstance(m, ChosenLinear)]
    assert layers and all(m.one in KERNELS and m.few in KERNELS for m in layers)
    summary = kernel_summary(engine.target.model)
    assert summary == "torch" if all((m.one, m.few) == ("torch", "torch") for m in layers) else "/ few " in summary
    with pytest.raises(ValueError, match="DROPMATCH_CPU_KERNELS must be one of"):
        pinned_kernel({"DROPMATCH_CPU_KERNELS": "fast"})


def test_prompts_of_every_length_reach_onednn_at_row_counts_from_a_fixed_set(tiny_dirs, monkeypatch):
    """With oneDNN's packed kernel pinned, comparisons on prompts of 40 different lengths send it row
    counts of 1..16 only: a prompt's rows take torch's default (oneDNN keeps a primitive per row count,
    never given back: fed every length, a server grows by megabytes a new length)."""
    from dropmatch.compare import compare_stream

    engine = _engine_with_kernels(tiny_dirs, "packed", monkeypatch)
    real = torch.ops.mkldnn._linear_pointwise
    row_counts: set[int] = set()

    def spy(rows, *args):
        row_counts.add(int(rows.shape[0]))
        return real(rows, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    decode = DecodeConfig(gamma=4, max_new_tokens=4)
    prompts = [" ".join(["fox"] * length) for length in range(1, 41)]
    assert len({len(engine.encode(prompt)) for prompt in prompts}) == 40
    for prompt in prompts:
        for _ in compare_stream(engine, prompt, decode, RuleConfig("dropmatch", p=0.3), run_ar=False):
            pass
    assert row_counts and row_counts <= set(range(1, 17)), sorted(row_counts)


@pytest.mark.parametrize("length", [1, 2, 3, 16, 17, 37, 64, 100, 511, 512, 513, 1300])
def test_onednn_chunks_cover_the_input_with_sizes_from_a_fixed_set(length):
    """A bf16 CPU model is fed in power-of-two pieces of at most 512 rows, largest first, that add
    up to the input: oneDNN then meets ten row counts at most, whatever the prompt's length. An fp32
    model, or one on another device, is fed whole."""
    from dropmatch.decoding.cpu_kernels import onednn_chunks

    sizes = onednn_chunks(length, torch.device("cpu"), torch.bfloat16)
    assert sum(sizes) == length
    assert all(size in {2**k for k in range(10)} for size in sizes)
    assert sizes == sorted(sizes, reverse=True)
    assert onednn_chunks(length, torch.device("cpu"), torch.float32) == [length]
    assert onednn_chunks(length, torch.device("cuda"), torch.bfloat16) == [length]


def test_a_bf16_model_fed_in_chunks_gives_the_hidden_states_of_one_call(tiny_dirs):
    """CausalLM.hidden splits a long input for a bf16 CPU model (onednn_chunks) and appends each
    piece to the cache: the same hidden states (up to bf16 rounding) and cache length as one call."""
    from transformers import AutoModelForCausalLM

    from dropmatch.decoding.causal_lm import CausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[0], dtype=torch.bfloat16)
    lm = CausalLM(model, "tiny", model.config.vocab_size)
    ids = torch.randint(0, model.config.vocab_size, (37,), generator=torch.Generator().manual_seed(1))
    cache = lm.new_cache()
    chunked = lm.hidden(ids, cache)
    with torch.inference_mode():
        whole = model.get_decoder()(input_ids=ids.view(1, -1)).last_hidden_state[0]
    assert chunked.shape == whole.shape and lm.cached_length(cache) == 37
    assert torch.allclose(chunked.float(), whole.float(), atol=0.1, rtol=0.05)
    assert (chunked.float() - whole.float()).abs().mean() < 0.01


def test_a_cpu_model_gets_chosen_linears_with_its_weights_shared_and_its_logits_kept(tiny_dirs):
    """The loader step prepare_for_cpu swaps an fp32 CPU model's nn.Linear layers for ChosenLinear:
    same Parameter objects (a tied head stays tied), the same logits up to rounding, packed copies
    only where memory is plentiful (and dropped when the weights change), bf16 layers left as they are."""
    import copy

    from transformers import AutoModelForCausalLM

    from dropmatch.decoding.cpu_kernels import ChosenLinear, linear_bytes, prepare_for_cpu

    def load(**kwargs):
        return AutoModelForCausalLM.from_pretrained(tiny_dirs[0], **kwargs).eval()

    packed_pin = {"DROPMATCH_CPU_KERNELS": "packed"}
    model = load()
    model.lm_head.weight = model.get_input_embeddings().weight  # tied, as SmolLM2's head is
    ids = torch.tensor([[5, 17, 42, 9, 3]])
    with torch.inference_mode():
        before = model(ids).logits
    weights = {name: parameter for name, parameter in model.named_parameters()}
    prepare_for_cpu(model, free_bytes=2**40, environ=packed_pin)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is ChosenLinear and m.packed is not None for m in linears)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert all(weights[name] is parameter for name, parameter in model.named_parameters())
    with torch.inference_mode():
        assert torch.allclose(model(ids).logits, before, atol=1e-5)
    assert copy.deepcopy(model).lm_head.packed is None  # copies (and pickles) leave the opaque copy out
    with torch.no_grad():  # changed weights: the packed copies are dropped, not used stale
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)
        model.model.layers[1].mlp.up_proj.to("cpu")
    with torch.inference_mode():
        model(ids[:, :3])
    assert model.model.layers[0].mlp.down_proj.packed is None and model.model.layers[1].mlp.up_proj.packed is None
    tight = load()
    prepare_for_cpu(tight, free_bytes=4 * linear_bytes(model), environ=packed_pin)
    tight_linears = [m for m in tight.modules() if isinstance(m, torch.nn.Linear)]
    assert all(type(m) is ChosenLinear and m.packed is None and m.few == "torch" for m in tight_linears)
    bf16 = load(dtype=torch.bfloat16)
    prepare_for_cpu(bf16, free_bytes=2**40, environ=packed_pin)
    assert all(type(m) is torch.nn.Linear for m in bf16.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("draw", ["per_position", "counter"])
def test_dropout_masks_depend_on_the_seed_the_prompt_and_the_position_only(draw):
    """The mask key changes with the seed and with the prompt's token ids; a position's masks are the
    same whichever other positions are drawn with it, under either draw."""
    from dropmatch.decoding.mc_head import keyed_masks, mask_seed

    key = mask_seed(0, [1, 2, 3])
    assert mask_seed(0, (1, 2, 3)) == key
    assert len({key, mask_seed(0, [1, 2, 4]), mask_seed(1, [1, 2, 3]), mask_seed(0, [1, 2, 3, 0])}) == 4
    together = keyed_masks([(key, 5), (key, 6)], 5, 0.3, 64, draw=draw)
    alone = keyed_masks([(key, 6)], 5, 0.3, 64, draw=draw)
    assert torch.equal(together[:, 1:], alone), "a position's masks depend on the positions drawn with it"
    other_prompt = keyed_masks([(mask_seed(0, [1, 2, 4]), 5)], 5, 0.3, 64, draw=draw)
    assert not torch.equal(together[:, :1], other_prompt), "two prompts drew the same masks at position 5"
    assert not torch.equal(together[:, :1], together[:, 1:]), "two positions drew the same masks"


def _lowbias32(word: int) -> int:
    """The 32-bit mixer written with Python integers (an independent reference for mc_head._hash32)."""
    word ^= word >> 16
    word = (word * 0x7FEB352D) & 0xFFFFFFFF
    word ^= word >> 15
    word = (word * 0x846CA68B) & 0xFFFFFFFF
    return word ^ (word >> 16)


def test_counter_masks_are_the_keyed_hash_bit_for_bit():
    """The counter draw is exactly its formula, checked unit by unit with Python integers (so it holds on
    any device that computes the same integer ops): unit (k, h) of a position kept iff
    hash(hash((k * H + h) ^ a) ^ b) >= round(p * 2^32), (a, b) from the position's key."""
    from dropmatch.decoding.mc_head import _position_key, keyed_masks

    keys, num_paths, hidden, p = [(12345, 0), (2**63 - 25, 7), (3, 2**20)], 3, 40, 0.3
    masks = keyed_masks(keys, num_paths, p, hidden, draw="counter")
    for i, (key, position) in enumerate(keys):
        full = _position_key(key, position)
        word_a = _lowbias32(full & 0xFFFFFFFF)
        word_b = _lowbias32((full >> 32) ^ word_a)
        expected = [[_lowbias32(_lowbias32((k * hidden + h) ^ word_a) ^ word_b) >= round(p * 2**32)
                     for h in range(hidden)] for k in range(num_paths)]
        assert masks[:, i].tolist() == [[float(kept) for kept in row] for row in expected], f"position {i}"


@pytest.mark.parametrize("p", [0.05, 0.3, 0.7])
def test_counter_masks_keep_each_unit_at_one_minus_p_and_paths_independent(p):
    """Over 300 positions x 5 paths x 576 units: the kept share is 1 - p, two paths of a position agree
    as independent draws do ((1-p)^2 + p^2), and neighbouring positions' and units' masks as well (within
    0.005, over 4 standard errors of each share)."""
    from dropmatch.decoding.mc_head import keyed_masks

    masks = keyed_masks([(99, position) for position in range(300)], 5, p, 576, draw="counter")
    independent = (1 - p) ** 2 + p ** 2
    assert abs(float(masks.mean()) - (1 - p)) < 0.005
    assert abs(float((masks[0] == masks[1]).float().mean()) - independent) < 0.005
    assert abs(float((masks[:, 1:] == masks[:, :-1]).float().mean()) - independent) < 0.005
    assert abs(float((masks[:, :, 1:] == masks[:, :, :-1]).float().mean()) - independent) < 0.005


def test_a_greedy_mismatch_names_its_first_divergence_and_the_targets_margin_there(tiny_engine):
    """first_divergence finds the first differing token and recomputes the target's logit margin
    between the two tokens there; a margin within bf16 rounding is called a near-tie."""
    from dropmatch.models import Divergence, first_divergence, greedy_reference

    ids = tiny_engine.encode(PROMPTS[0])
    reference = greedy_reference(tiny_engine.target, ids, 12, tiny_engine.stop_ids)
    assert len(reference) > 5
    assert first_divergence(tiny_engine.target, ids, reference, reference) is None
    changed = list(reference)
    changed[5] = (reference[5] + 1) % tiny_engine.target.vocab_size
    found = first_divergence(tiny_engine.target, ids, reference, changed)
    logits = tiny_engine.target.model(input_ids=torch.tensor([ids + reference[:5]])).logits[0, -1]
    assert (found.index, found.expected, found.got) == (5, reference[5], changed[5])
    assert found.margin == pytest.approx(float(logits[reference[5]] - logits[changed[5]]), abs=1e-4) and found.margin > 0
    assert "not a near-tie" in found.describe() and "near-tie (within bf16" in Divergence(3, 1, 2, 0.05).describe()


def test_a_rounds_phases_are_read_from_one_timer_and_nest_in_the_round(tiny_engine, monkeypatch):
    """Each round reads its one PhaseTimer once (timing.py: one sync on a GPU, none per phase), and its phases
    (draft, forward, head, the Monte-Carlo work) lie inside the round's time."""
    from dropmatch.decoding import timing

    reads = []
    read = timing.PhaseTimer.read
    monkeypatch.setattr(timing.PhaseTimer, "read", lambda self: reads.append(tuple(self.marks)) or read(self))
    ids = tiny_engine.encode("what is two plus three?")
    trace = run_to_end(tiny_engine.speculative(ids, DecodeConfig(gamma=4, max_new_tokens=16), RuleConfig("dropmatch", p=0.3)))
    rounds = [marks for marks in reads if "drafted" in marks]
    assert len(rounds) == len(trace.rounds)
    assert all(marks == ("start", "drafted", "verified", "head", "mc_start", "mc_end", "end") for marks in rounds)
    for r in trace.rounds:
        assert min(r.t_draft, r.t_forward, r.t_head, r.t_mc) >= 0
        assert r.t_draft + r.t_forward + r.t_head + r.t_mc <= r.t_round + 1e-9
