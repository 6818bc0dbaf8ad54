"""The vLLM integration's own suite (tests/vllm_plugin: the plugin on the embedded target through vLLM's
CPU build, in-process engines and `vllm serve`), run under .venv-vllm, which scripts/setup.sh
--test makes: vLLM pins another transformers than the app's, so it cannot share .venv."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.slow
def test_the_vllm_integration_suite_passes_under_its_own_venv():
    assert VLLM_PYTHON.exists(), "no .venv-vllm: run bash scripts/setup.sh --test (or --vllm)"
    done = subprocess.run([str(VLLM_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/vllm_plugin"], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-10000:] + done.stderr[-3000:]
