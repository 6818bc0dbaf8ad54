"""DropMatch through transformers' own door: `target.generate(..., custom_generate=<this repository>)`, and the
Hub folder scripts/deploy_generate.py stages from the package (it needs torch and transformers only)."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from test_serving import HostReads
from test_exactness import PROMPT, TEMPERATURE, TOKENS, chi_square, chi_square_quantile, detectable_bias, exact_joint

from dropmatch.decoding.config import DecodeConfig, RuleConfig, rule_keys, rule_names

ROOT = Path(__file__).resolve().parent.parent
REPO = str(ROOT)  # the repository transformers loads custom_generate/generate.py from
PACKAGE = ROOT / "dropmatch"


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    """(target folder, draft folder): a random tiny Llama and a noisy copy, with one tokenizer."""
    from tiny_models import save_pair

    return save_pair(tmp_path_factory.mktemp("generate"), noise=0.3)


def _load(pair_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (*(AutoModelForCausalLM.from_pretrained(d) for d in pair_dirs), AutoTokenizer.from_pretrained(pair_dirs[0]))


@pytest.fixture(scope="module")
def hf_pair(pair_dirs):
    """(target, draft, tokenizer) as plain transformers models."""
    return _load(pair_dirs)


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
    (dict(dropmatch_rule="fly", dropmatch_gamma=3), "can never act at dropmatch_gamma=3"),
    (dict(dropmatch_rule="fly", dropmatch_fly_window=8), "needs at least 9 drafts"),  # gamma = auto drafts at most 8
    (dict(dropmatch_rule="typical", dropmatch_typical_eps=2.0), "typical ε must be in [0, 1]"),
])
def test_what_it_cannot_do_is_a_one_line_value_error_naming_the_argument(hf_pair, bad, message):
    target, draft, tokenizer = hf_pair
    with pytest.raises(ValueError) as caught:
        _dropmatch(target, draft, _prompt(tokenizer), max_new_tokens=5, **bad)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_greedy_call_raises_no_warning(hf_pair):
    """No deprecated transformers argument, nothing else to warn about: every warning is an error here (pytest.ini
    ignores FutureWarning and DeprecationWarning, so the test sets its own filter)."""
    target, draft, tokenizer = hf_pair
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = _dropmatch(target, draft, _prompt(tokenizer), max_new_tokens=20, do_sample=False)
    assert out.shape[1] > _prompt(tokenizer)["input_ids"].shape[1]


def test_a_batch_and_a_missing_draft_are_refused_in_one_line(hf_pair):
    target, draft, tokenizer = hf_pair
    batch = {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 10]])}
    with pytest.raises(ValueError, match="batch size 1"):
        _dropmatch(target, draft, batch, max_new_tokens=5)
    with pytest.raises(ValueError, match="assistant_model"):
        target.generate(**_prompt(tokenizer), custom_generate=REPO, trust_remote_code=True, max_new_tokens=5)


def test_an_eagle3_head_drafts_in_place_of_the_assistant_and_greedy_lossless_is_the_targets_output(hf_pair, tmp_path):
    """dropmatch_eagle3_head (a folder): the head drafts (every drafted slot counted, no assistant_model needed),
    lossless SD and DropMatch at p = 0 give the target's own greedy tokens; a folder that is not there, or a head
    that does not fit the model, is one ValueError."""
    from tiny_models import save_eagle3_head

    target, draft, tokenizer = hf_pair
    head = save_eagle3_head(tmp_path / "head", target, list(range(target.config.vocab_size)), (0, 1, 1), sharpness=2.0)
    inputs = _prompt(tokenizer)
    expected = target.generate(**inputs, max_new_tokens=24, do_sample=False)
    for knobs in (dict(dropmatch_rule="lossless"), dict(dropmatch_rule="dropmatch", dropmatch_p=0.0)):
        out = target.generate(**inputs, custom_generate=REPO, trust_remote_code=True, max_new_tokens=24, do_sample=False,
                              dropmatch_eagle3_head=str(head), dropmatch_gamma=3, return_dict_in_generate=True, **knobs)
        assert out.sequences.tolist() == expected.tolist()
        # the target drafting for itself would have every draft accepted: the random head's are not
        assert out.dropmatch["accepted_exactly"] < out.dropmatch["drafted"], out.dropmatch
    with pytest.raises(ValueError, match="no folder"):
        _dropmatch(target, draft, inputs, max_new_tokens=5, dropmatch_eagle3_head=str(tmp_path / "missing"))
    misfit = save_eagle3_head(tmp_path / "misfit", target, [1, 2, 3], (0, 1, 5))
    with pytest.raises(ValueError, match="layers") as refused:
        _dropmatch(target, draft, inputs, max_new_tokens=5, dropmatch_eagle3_head=str(misfit))
    assert "\n" not in str(refused.value)


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

    from dropmatch.decoding.config import PairSpec
    from dropmatch.decoding.engine import Engine
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


# ---------------------------------------------------------------- the Hub folder: staged from the package, alone


def _deploy_script():
    """scripts/deploy_generate.py as a module (what --stage runs)."""
    spec = importlib.util.spec_from_file_location("deploy_generate", ROOT / "scripts" / "deploy_generate.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def deploy():
    return _deploy_script()


@pytest.fixture(scope="module")
def staged_folder(deploy, tmp_path_factory):
    """The Hub repository as `--stage` writes it, from this working tree."""
    folder = tmp_path_factory.mktemp("staged")
    deploy.staged(folder)
    return folder


# Each script runs in a fresh interpreter (-I, a temporary cwd) where `dropmatch` cannot be imported, wherever it is
# installed: what a Hub user has.
NO_DROPMATCH = r"""
import importlib.abc, sys

class NoDropmatch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "dropmatch":
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoDropmatch())
"""
STAGED_RUN = NO_DROPMATCH + r"""
import json, pathlib
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.dynamic_module_utils import check_imports, get_relative_imports

folder, target_dir, draft_dir = sys.argv[1:4]
code = pathlib.Path(folder, "custom_generate")
target, draft = (AutoModelForCausalLM.from_pretrained(d) for d in (target_dir, draft_dir))
inputs = AutoTokenizer.from_pretrained(target_dir)("the quick brown fox", return_tensors="pt")
own = target.generate(**inputs, max_new_tokens=40, do_sample=False)
ours = dict(assistant_model=draft, custom_generate=folder, trust_remote_code=True, do_sample=False)
at_p0 = target.generate(**inputs, max_new_tokens=40, dropmatch_p=0.0, **ours)
lossy = target.generate(**inputs, max_new_tokens=64, dropmatch_p=0.3, dropmatch_gamma=4, return_dict_in_generate=True,
                        **ours)
for module in code.glob("*.py"):  # what transformers checks of each module it downloads from the Hub
    check_imports(module)
print(json.dumps({"own": own.tolist(), "p0": at_p0.tolist(), "counts": lossy.dropmatch,
                  "named": sorted(get_relative_imports(code / "generate.py")),
                  "dropmatch": sorted(m for m in sys.modules if m.partition(".")[0] == "dropmatch")}))
"""


def _run_fresh(script_text: str, args: list, tmp_path: Path) -> subprocess.CompletedProcess:
    """script_text run in a fresh interpreter (-I) in tmp_path, offline, with args."""
    script = tmp_path / "run.py"
    script.write_text(script_text, encoding="utf-8")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-I", str(script), *map(str, args)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.slow  # a fresh interpreter loading transformers
def test_the_staged_folder_runs_where_the_dropmatch_package_cannot_be_imported(staged_folder, pair_dirs, tmp_path):
    """custom_generate=<the staged folder>: greedy at p 0 is the target's own generate(), p 0.3 counts lossy
    acceptances; generate.py names every module beside it (what transformers downloads from the Hub)."""
    done = _run_fresh(STAGED_RUN, [staged_folder, *pair_dirs], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["p0"] == found["own"] and found["dropmatch"] == []
    assert found["counts"]["accepted_lossy"] > 0
    modules = {path.stem for path in (staged_folder / "custom_generate").glob("*.py")} - {"generate"}
    assert set(found["named"]) == modules


MISMATCHED_RUN = NO_DROPMATCH + r"""
import json
from transformers import AutoModelForCausalLM, AutoTokenizer

folder, target_dir, draft_dir = sys.argv[1:4]
target, draft = (AutoModelForCausalLM.from_pretrained(d) for d in (target_dir, draft_dir))
tokenizer = AutoTokenizer.from_pretrained(target_dir)
inputs = tokenizer("what is two plus three?", return_tensors="pt")
errors = []
for given in ({}, {"tokenizer": tokenizer}):
    try:
        target.generate(**inputs, assistant_model=draft, custom_generate=folder, trust_remote_code=True,
                        max_new_tokens=8, do_sample=False, **given)
        errors.append(None)
    except Exception as error:
        errors.append([type(error).__name__, str(error)])
print(json.dumps(errors))
"""


@pytest.mark.slow  # a fresh interpreter loading transformers
def test_a_draft_of_another_vocabulary_is_one_value_error_from_the_staged_folder(staged_folder, pair_dirs, tmp_path):
    """A draft whose vocabulary is smaller than the target's, with and without tokenizer=: one ValueError line
    before anything runs (as transformers' assisted generation gives), never an IndexError from an embedding."""
    from tiny_models import make_llama

    draft_dir = tmp_path / "small_draft"
    make_llama(vocab_size=100, seed=3).save_pretrained(draft_dir)
    done = _run_fresh(MISMATCHED_RUN, [staged_folder, pair_dirs[0], draft_dir], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for kind, message in json.loads(done.stdout.strip().splitlines()[-1]):
        assert kind == "ValueError" and "\n" not in message and "the draft must share the target's tokenizer" in message


def test_the_staged_requirements_name_torch_and_transformers_only_and_the_tested_transformers_range(deploy,
                                                                                                    staged_folder):
    """One specifier a line (transformers' loader reads only a line's first): a lower bound on torch, and on
    transformers the lowest tested version and an upper bound above every tested one."""
    from packaging.version import Version

    lines = (staged_folder / "custom_generate" / "requirements.txt").read_text().split()
    assert [re.match(r"[a-z]+", line).group() for line in lines] == ["torch", "transformers", "transformers"]
    assert all(re.fullmatch(r"[a-z]+(>=|<)[\d.]+", line) for line in lines)
    tested = sorted(map(Version, deploy.TESTED["transformers"]))
    assert lines[1] == f"transformers>={tested[0].major}.{tested[0].minor}"
    assert lines[2].startswith("transformers<") and tested[-1] < Version(lines[2].split("<")[1])


def _card_example(folder: Path, target_dir: Path, draft_dir: Path, deploy) -> str:
    """The staged card's Python example on the tiny pair: the models it names and the Hub repository replaced."""
    card = (folder / "README.md").read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    for name, local in (("HuggingFaceTB/SmolLM2-1.7B-Instruct", target_dir), ("HuggingFaceTB/SmolLM2-135M-Instruct",
                                                                             draft_dir), (deploy.HUB_REPO, folder)):
        assert f'"{name}"' in example, name
        example = example.replace(f'"{name}"', repr(str(local)))
    return example


@pytest.mark.slow  # a fresh interpreter loading transformers
def test_the_staged_cards_example_loads_a_target_and_a_draft_and_runs(deploy, staged_folder, pair_dirs, tmp_path):
    """The card's example as a Hub reader runs it (the tiny pair in place of SmolLM2's, the staged folder in place
    of the Hub repository): it prints the answer and the counts per reason."""
    done = _run_fresh(NO_DROPMATCH + _card_example(staged_folder, *pair_dirs, deploy), [], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'drafted':" in done.stdout and "'reasons':" in done.stdout, done.stdout[-2000:]


def test_the_staged_card_names_no_path_of_this_repository_and_ships_the_licence(deploy, staged_folder):
    """A Hub reader has the folder, not the Studio: no tests/, scripts/, docs/, assets/, .venv or other file of
    this repository that the folder lacks; the judge rules (no judge ships there) left out; the tested versions
    and the Apache-2.0 licence, whose text sits beside the card."""
    card = (staged_folder / "README.md").read_text(encoding="utf-8")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    ours = {path.split("/")[0] + ("/" if "/" in path else "") for path in tracked} | {".venv/", "runs/"}
    foreign = sorted(name for name in ours if not (staged_folder / name).exists())
    found = [name for name in foreign  # a folder as `name/`, a file by its whole name
             if re.search(r"(?<![\w/.-])" + re.escape(name) + ("" if name.endswith("/") else r"(?![\w-])"), card)]
    assert not found and "clone" not in card, found
    assert "`judge`" not in card and "`dropmatch_judge`" not in card and "dropmatch_judge_threshold" not in card
    assert all(version in card for versions in deploy.TESTED.values() for version in versions)
    assert "license: apache-2.0" in card and (staged_folder / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()


def test_the_staged_folder_is_the_method_package_file_for_file_and_generate_py(staged_folder):
    """custom_generate/ holds every module of dropmatch/decoding/ byte for byte (no header, no import rewritten)
    and generate.py, nothing else."""
    package = {path.name: path.read_bytes() for path in (ROOT / "dropmatch" / "decoding").glob("*.py")
               if path.name != "__init__.py"}
    staged = {path.name: path.read_bytes() for path in (staged_folder / "custom_generate").glob("*.py")}
    assert set(staged) == set(package) | {"generate.py"}
    assert {name: text for name, text in staged.items() if name != "generate.py"} == package


def test_the_package_imports_the_standard_library_torch_and_transformers_only_and_staging_refuses_more(deploy,
                                                                                                      tmp_path):
    """What generate() stages imports its siblings, the standard library, torch and transformers (numpy is
    transformers' own requirement); a module reaching the Studio is refused at staging, in one line."""
    files = deploy.package_files()
    assert {"hf_generate.py", "engine.py", "verifying.py", "config.py", "acceptance.py", "mc_head.py",
            "causal_lm.py"} <= {path.name for path in files}
    siblings = {path.stem for path in files}
    assert [line for path in files for line in deploy.outside_imports(path, siblings)] == []
    for stray in ("from ..lab import rule_lab", "from .. import lab", "import gradio", "from dropmatch import lab"):
        copy = tmp_path / stray.replace(" ", "_").replace(".", "-") / deploy.PACKAGE
        shutil.copytree(ROOT / deploy.PACKAGE, copy)
        with (copy / "engine.py").open("a", encoding="utf-8") as file:
            file.write(f"\n\ndef _door():\n    {stray}\n")
        with pytest.raises(ValueError, match="engine.py line") as refused:
            deploy.staged_modules(copy.parent.parent)
        assert "\n" not in str(refused.value)


# ---------------------------------------------------------------- no surprises in the caller's process


def _model_state(model) -> tuple:
    """What a call must leave as it was: each module's training flag and attributes (names, values by
    identity), each parameter's and buffer's identity and requires_grad."""
    modules = [(name, module.training, {key: id(value) for key, value in vars(module).items()})
               for name, module in model.named_modules()]
    tensors = [(name, id(t), t.requires_grad) for name, t in (*model.named_parameters(), *model.named_buffers())]
    return modules, tensors


def test_a_call_leaves_the_models_training_flags_requires_grad_and_attributes_as_they_were(pair_dirs):
    """A target in training mode with a frozen embedding, a draft as loaded: both as they were after a lossy
    call, a sampled one and gamma = auto's first (measuring) call; no gradient was recorded."""
    target, draft, tokenizer = _load(pair_dirs)
    target.train()
    target.get_input_embeddings().weight.requires_grad_(False)
    before = _model_state(target), _model_state(draft)
    inputs = _prompt(tokenizer, "the quick brown fox")
    _dropmatch(target, draft, inputs, max_new_tokens=20, do_sample=False, dropmatch_p=0.3)
    _dropmatch(target, draft, inputs, max_new_tokens=20, do_sample=True, dropmatch_p=0.3, top_k=0, dropmatch_gamma=3)
    assert (_model_state(target), _model_state(draft)) == before
    assert target.training and all(p.grad is None for p in (*target.parameters(), *draft.parameters()))


def test_no_engine_is_kept_on_the_models_or_keeps_them_alive(pair_dirs, monkeypatch):
    """gamma = auto's measured costs are kept beside the models, weakly: the second call measures nothing,
    and the models go when the caller drops them."""
    from dropmatch.decoding import pair_services

    measured = []
    real = pair_services.measure_step_costs
    monkeypatch.setattr(pair_services, "measure_step_costs", lambda *a, **k: measured.append(1) or real(*a, **k))
    target, draft, tokenizer = _load(pair_dirs)
    keys = set(vars(target)), set(vars(draft))
    for _ in range(2):
        _dropmatch(target, draft, _prompt(tokenizer), max_new_tokens=10, do_sample=False, dropmatch_p=0.3)
    assert (set(vars(target)), set(vars(draft))) == keys and measured == [1]
    alive = weakref.ref(target), weakref.ref(draft)
    del target, draft
    gc.collect()
    assert [ref() for ref in alive] == [None, None]


def test_greedy_at_p_0_3_is_a_function_of_the_inputs_and_dropmatch_seed(hf_pair):
    """Whatever torch's global generator holds, the same call gives the same text; dropmatch_seed (default 0)
    keys the dropout masks, so another seed may accept other drafts."""
    target, draft, tokenizer = hf_pair
    inputs = _prompt(tokenizer, "the quick brown fox")

    def call(**seed):
        return _dropmatch(target, draft, inputs, max_new_tokens=48, do_sample=False, dropmatch_p=0.3,
                          dropmatch_gamma=4, **seed)[0].tolist()

    outputs = []
    for global_seed in (1, 2, 3):
        torch.manual_seed(global_seed)
        outputs.append(call())
    assert outputs[0] == outputs[1] == outputs[2] == call(dropmatch_seed=0)
    assert len({tuple(call(dropmatch_seed=seed)) for seed in range(1, 6)} | {tuple(outputs[0])}) > 1


def test_torch_global_generator_is_untouched_by_greedy_calls_and_by_sampled_calls_given_a_seed(hf_pair):
    target, draft, tokenizer = hf_pair
    inputs = _prompt(tokenizer)
    torch.manual_seed(11)
    before = torch.get_rng_state()
    _dropmatch(target, draft, inputs, max_new_tokens=20, do_sample=False, dropmatch_p=0.3)
    _dropmatch(target, draft, inputs, max_new_tokens=20, do_sample=False, dropmatch_rule="lossless")
    _dropmatch(target, draft, inputs, max_new_tokens=20, do_sample=True, top_k=0, dropmatch_p=0.3, dropmatch_seed=4)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_sampled_call_without_a_seed_draws_it_from_torchs_generator_as_transformers_sampling_does(hf_pair):
    """torch.manual_seed makes it repeatable; the draw moves the global generator, as transformers' own sampling does."""
    target, draft, tokenizer = hf_pair
    inputs = _prompt(tokenizer)
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        before = torch.get_rng_state()
        runs.append(_dropmatch(target, draft, inputs, max_new_tokens=20, do_sample=True, top_k=0, dropmatch_p=0.3)[0].tolist())
        assert not torch.equal(torch.get_rng_state(), before)
    assert runs[0] == runs[1]


# ---------------------------------------------------------------- only the work the call needs


class DropMatchHostReads(HostReads):
    """Counts the tensor operations DropMatch's own code makes that read a value on the host (a sync on an
    accelerator): the caller's frame lies in the package. The models' forward passes read what they read in
    any generate(). Kept as "operation file:line"."""

    def counts(self, frame) -> bool:
        return str(PACKAGE) in frame.f_code.co_filename

    def entry(self, name: str, frame) -> str:
        return f"{name} {Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


PER_CALL_READS = 3  # the prompt's ids and its attention mask, the first token


@pytest.mark.parametrize("knobs, per_round", [
    (dict(dropmatch_rule="lossless"), 1),  # the scan's one copy
    (dict(dropmatch_p=0.3), 6),  # + the slots to judge, and per stage (at most two) the close calls and its verdicts
])
def test_host_reads_per_round_are_bounded(hf_pair, knobs, per_round):
    target, draft, tokenizer = hf_pair
    streamer = RecordingStreamer()
    with DropMatchHostReads() as counted:
        _dropmatch(target, draft, _prompt(tokenizer, "the quick brown fox"), max_new_tokens=40, do_sample=False,
                   dropmatch_gamma=4, streamer=streamer, **knobs)
    rounds = len(streamer.puts) - 1
    assert rounds >= 10 and len(counted.reads) <= PER_CALL_READS + per_round * rounds, counted.reads


def test_a_call_records_nothing_it_does_not_return(hf_pair, monkeypatch):
    """No top-token lists, host copies, token views or weight fingerprints: out.dropmatch needs the reasons only."""
    from dropmatch.decoding import engine
    from dropmatch.decoding.causal_lm import CausalLM

    def refused(*args, **kwargs):
        raise AssertionError("a record generate() does not return")

    for name in ("top_tokens", "to_host", "drafted_records", "emitted_view"):
        monkeypatch.setattr(engine, name, refused)
    monkeypatch.setattr(CausalLM, "fingerprint", refused)
    target, draft, tokenizer = hf_pair
    out = _dropmatch(target, draft, _prompt(tokenizer, "the quick brown fox"), max_new_tokens=40, do_sample=False,
                     dropmatch_p=0.3, dropmatch_gamma=4, return_dict_in_generate=True)
    assert out.dropmatch["accepted_lossy"] > 0


@pytest.mark.parametrize("rule", [RuleConfig("dropmatch", p=0.3), RuleConfig("lossless")])
def test_the_unrecorded_run_decides_as_the_recorded_one_staged_or_in_one_pass(hf_pair, rule, monkeypatch):
    """Engine.speculative_tokens (generate()'s) emits the recorded run's tokens with its reasons, staged and in
    one pass; one pass reads the host once a round where the paths take an accelerator's choice (never sparse: a
    CPU's fp32 way, whose count of dropped entries is a host read, free on a CPU)."""
    from dropmatch.decoding.engine import run_to_end
    from dropmatch.decoding.hf_generate import engine_for

    target, draft, tokenizer = hf_pair
    engine = engine_for(target, draft, frozenset())
    ids = _prompt(tokenizer, "the quick brown fox")["input_ids"][0].tolist()
    decode = DecodeConfig(max_new_tokens=40, gamma=4, seed=0)
    trace = run_to_end(engine.speculative(ids, decode, rule))
    recorded = [tuple(d.reason for d in r.drafted) for r in trace.rounds]
    for one_pass in (False, True):
        steps, output = _drain(engine.speculative_tokens(ids, decode, rule, one_pass=one_pass))
        assert output == trace.output_ids and [step.reasons for step in steps] == recorded
    with monkeypatch.context() as patched, DropMatchHostReads() as counted:
        patched.setattr(engine.target, "_sparse_possible", lambda: False)
        steps, _ = _drain(engine.speculative_tokens(ids, decode, rule, one_pass=True))
    assert len(counted.reads) == 1 + len(steps), counted.reads  # the first token, then the scan's copy


def _drain(run) -> tuple[list, tuple]:
    steps = []
    while True:
        try:
            steps.append(next(run))
        except StopIteration as done:
            return steps, done.value


# ---------------------------------------------------------------- the documentation


def test_the_argument_tables_list_every_rule_and_knob_generate_accepts_as_the_rule_table_declares_them(deploy):
    """docs/generate.md's rule table is the one --docs derives from acceptance.RULES now, and its arguments are
    exactly RuleConfig.from_mapping's names and generate()'s own: it cannot go stale."""
    from dropmatch.decoding.hf_generate import OWN_KEYS

    guide = (ROOT / "docs" / "generate.md").read_text(encoding="utf-8")
    assert deploy.with_rule_table(guide) == guide, "run `python scripts/deploy_generate.py --docs`"
    listed = re.findall(r"^\| `dropmatch_(\w+)`", guide[guide.index("## Arguments"):], re.M)
    assert sorted(listed) == sorted((*rule_keys(), *OWN_KEYS))
    rule_row = next(line for line in guide.splitlines() if line.startswith("| `dropmatch_rule`"))
    assert not [name for name in rule_names() if f"`{name}`" not in rule_row]
