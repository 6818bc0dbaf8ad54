"""DropMatch through transformers' own door: `target.generate(..., custom_generate=<this repository>)`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_exactness import PROMPT, TEMPERATURE, TOKENS, chi_square, chi_square_quantile, detectable_bias, exact_joint

from dropmatch.config import DecodeConfig

ROOT = Path(__file__).resolve().parent.parent
REPO = str(ROOT)  # the repository transformers loads custom_generate/generate.py from


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    """(target, draft, tokenizer) as plain transformers models: a random tiny Llama and a noisy copy."""
    from tiny_models import save_pair
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir = save_pair(tmp_path_factory.mktemp("generate"), noise=0.3)
    return (AutoModelForCausalLM.from_pretrained(target_dir), AutoModelForCausalLM.from_pretrained(draft_dir),
            AutoTokenizer.from_pretrained(target_dir))


def _prompt(tokenizer, text="what is two plus three?"):
    return tokenizer(text, return_tensors="pt")


def _dropmatch(target, draft, inputs, **kwargs):
    return target.generate(**inputs, assistant_model=draft, custom_generate=REPO, trust_remote_code=True, **kwargs)


@pytest.mark.parametrize("knobs", [dict(dropmatch_rule="lossless"), dict(dropmatch_rule="dropmatch", dropmatch_p=0.0),
                                   dict(dropmatch_rule="dropmatch", dropmatch_p=0.0, dropmatch_gamma=3)])
def test_greedy_dropmatch_at_p_0_and_lossless_equal_the_targets_own_generate(hf_pair, knobs):
    """Token for token, the target's own greedy generate() (which stops where it stops)."""
    target, draft, tokenizer = hf_pair
    inputs = _prompt(tokenizer)
    expected = target.generate(**inputs, max_new_tokens=40, do_sample=False)
    got = _dropmatch(target, draft, inputs, max_new_tokens=40, do_sample=False, **knobs)
    assert got.tolist() == expected.tolist()


def test_dropmatch_at_p_0_3_accepts_some_drafts_lossy_and_counts_them(hf_pair):
    """return_dict_in_generate: the sequences, and `dropmatch` with the counts per reason (the vLLM shape)."""
    target, draft, tokenizer = hf_pair
    inputs = _prompt(tokenizer, "the quick brown fox")
    out = _dropmatch(target, draft, inputs, max_new_tokens=64, do_sample=False, dropmatch_p=0.3, dropmatch_gamma=4,
                     return_dict_in_generate=True)
    counts = out.dropmatch
    assert set(counts) == {"drafted", "accepted_exactly", "accepted_lossy", "reasons"}
    assert counts["accepted_lossy"] > 0 and counts["accepted_lossy"] == sum(
        n for reason, n in counts["reasons"].items() if reason in ("js", "majority"))
    assert counts["drafted"] == sum(counts["reasons"].values())
    lossless = _dropmatch(target, draft, inputs, max_new_tokens=64, do_sample=False, dropmatch_rule="lossless")
    assert out.sequences.shape[1] == lossless.shape[1] and out.sequences.tolist() != lossless.tolist()


class RecordingStreamer:
    """transformers' streamer protocol: put(ids) for the prompt, then for new tokens; end() once."""

    def __init__(self):
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


def test_the_streamer_gets_the_prompt_then_every_new_token_once_and_in_order(hf_pair):
    target, draft, tokenizer = hf_pair
    inputs = _prompt(tokenizer)
    streamer = RecordingStreamer()
    out = _dropmatch(target, draft, inputs, max_new_tokens=30, do_sample=False, dropmatch_p=0.3, streamer=streamer)
    prompt_length = inputs["input_ids"].shape[1]
    assert streamer.puts[0] == inputs["input_ids"][0].tolist() and streamer.ended == 1
    assert [t for put in streamer.puts[1:] for t in put] == out[0, prompt_length:].tolist()
    assert len(streamer.puts) > 3  # round by round, not once at the end


def test_eos_and_stop_strings_end_the_output_where_transformers_would(hf_pair):
    """An eos_token_id the output meets ends it at that token (kept); a stop string at the token that
    completes it."""
    target, draft, tokenizer = hf_pair
    inputs = _prompt(tokenizer)
    free = _dropmatch(target, draft, inputs, max_new_tokens=30, do_sample=False, dropmatch_rule="lossless")[0].tolist()
    new = free[inputs["input_ids"].shape[1]:]
    eos = new[5]
    stopped = _dropmatch(target, draft, inputs, max_new_tokens=30, do_sample=False, eos_token_id=eos,
                         dropmatch_rule="lossless")[0].tolist()
    assert stopped == free[: len(free) - len(new) + new.index(eos) + 1]
    stop = tokenizer.decode(new[7:9])
    cut = _dropmatch(target, draft, inputs, max_new_tokens=30, do_sample=False, stop_strings=stop, tokenizer=tokenizer,
                     dropmatch_rule="lossless")[0].tolist()
    text = tokenizer.decode(cut[inputs["input_ids"].shape[1]:])
    assert stop in text and stop not in tokenizer.decode(cut[inputs["input_ids"].shape[1]:-1])


@pytest.mark.parametrize("bad, message", [
    (dict(dropmatch_p=1.5), "p (dropout rate) must be in [0, 1)"),
    (dict(dropmatch_rule="nope"), "unknown rule 'nope'"),
    (dict(num_beams=2), "beams not supported"),
    (dict(dropmatch_colour="red"), "unknown argument dropmatch_colour"),
    (dict(do_sample=True, top_k=5), "top_k=5"),
    (dict(repetition_penalty=1.3), "repetition_penalty"),
    (dict(dropmatch_rule="judge"), "needs a trained judge"),
    (dict(stop_strings="x"), "stop_strings needs the tokenizer"),
])
def test_what_it_cannot_do_is_a_one_line_value_error_naming_the_argument(hf_pair, bad, message):
    target, draft, tokenizer = hf_pair
    with pytest.raises(ValueError) as caught:
        _dropmatch(target, draft, _prompt(tokenizer), max_new_tokens=5, **bad)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_batch_and_a_missing_draft_are_refused_in_one_line(hf_pair):
    target, draft, tokenizer = hf_pair
    batch = {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 10]])}
    with pytest.raises(ValueError, match="batch size 1"):
        _dropmatch(target, draft, batch, max_new_tokens=5)
    with pytest.raises(ValueError, match="assistant_model"):
        target.generate(**_prompt(tokenizer), custom_generate=REPO, trust_remote_code=True, max_new_tokens=5)


RUNS = 2000
ALPHA = 1e-4


@pytest.mark.slow  # 2,000 seeded generate() calls
def test_sampling_through_generate_draws_the_targets_own_distribution(tmp_path_factory):
    """The joint of the first three sampled tokens (T 0.8, gamma 3) through generate() with DropMatch at
    p = 0 equals the target's exact one on the bigram pair (tests/test_exactness.py, where the engine itself
    is held to 6,000 runs): the door hands temperature, the rule and the seed to the engine as given."""
    knobs = dict(dropmatch_rule="dropmatch", dropmatch_p=0.0)
    from test_exactness import DRAFT_ROWS, TARGET_ROWS, _table
    from tiny_models import save_bigram_pair
    from transformers import AutoModelForCausalLM

    from dropmatch.config import PairSpec
    from dropmatch.engine import Engine
    from dropmatch.models import load_hub_pair

    target_dir, draft_dir = save_bigram_pair(tmp_path_factory.mktemp("bigram_generate"), _table(TARGET_ROWS),
                                             _table(DRAFT_ROWS))
    decode = DecodeConfig(max_new_tokens=3, temperature=TEMPERATURE, gamma=3)
    exact = exact_joint(Engine(load_hub_pair(PairSpec(str(target_dir), str(draft_dir)), torch.device("cpu"))), decode)
    target, draft = (AutoModelForCausalLM.from_pretrained(d) for d in (target_dir, draft_dir))
    run = target.load_custom_generate(REPO, trust_remote_code=True)  # what generate(custom_generate=REPO) calls
    inputs = torch.tensor([PROMPT])
    counts: dict = {}
    for seed in range(RUNS):
        out = run(model=target, inputs=inputs, assistant_model=draft, max_new_tokens=3, do_sample=True,
                  temperature=TEMPERATURE, top_k=None, eos_token_id=None, dropmatch_gamma=3, dropmatch_seed=seed, **knobs)
        key = tuple(out[0, len(PROMPT):].tolist())
        counts[key] = counts.get(key, 0) + 1
    statistic, df = chi_square(counts, exact, RUNS)
    assert detectable_bias(exact, RUNS, df, ALPHA) <= 0.035, "too few runs to catch a bias of 0.035"
    assert set(counts) <= set(exact) and all(len(key) == 3 and set(key) <= set(TOKENS) for key in counts)
    assert statistic <= chi_square_quantile(df, ALPHA), f"chi-square {statistic:.1f} (df {df})"


def readme_example() -> str:
    """The Python block of the README's "Use DropMatch in your own code" section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Use DropMatch in your own code"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow  # the embedded pair, in a fresh interpreter at the repository's root
def test_the_readmes_generate_example_runs_as_written(tmp_path):
    """Run from the repository root as a reader would; it prints the answer and the counts per reason."""
    script = tmp_path / "example.py"
    script.write_text(readme_example(), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'drafted':" in done.stdout and "'reasons':" in done.stdout, done.stdout[-2000:]
