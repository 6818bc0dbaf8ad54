"""The vLLM integration's own suite (tests/vllm_plugin: the plugin on the embedded target through vLLM's
CPU build, in-process engines and `vllm serve`), run under .venv-vllm, which scripts/setup.sh
--test makes: vLLM pins another transformers than the app's, so it cannot share .venv.

The suite starts as soon as pytest has collected this test (conftest.pytest_collection_finish), at a lower
priority, and runs beside the rest of the session in the time it leaves a core idle (much of it: browser
waits, subprocesses, single-threaded Python); this test waits for it and reads its result."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


NICENESS = 10  # the suite's processes yield a core to the session's own tests (two torch threads sharing one
# core with an engine wait on each other at every op: measured, a 10 s test took 97 s at equal priority)


def start_suite() -> tuple[subprocess.Popen, Path]:
    """The vLLM suite in its own process (and its engines' processes) at a lower priority, its output in a
    file: (the process, the file)."""
    log = Path(tempfile.mkstemp(prefix="dropmatch-vllm-suite-", suffix=".log")[1])
    with open(log, "w") as out:
        process = subprocess.Popen([str(VLLM_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/vllm_plugin"],
                                   cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(NICENESS))
    return process, log


@pytest.mark.slow
def test_the_vllm_integration_suite_passes_under_its_own_venv(request):
    assert VLLM_PYTHON.exists(), "no .venv-vllm: run bash scripts/setup.sh --test (or --vllm)"
    started = getattr(request.config, "dropmatch_vllm_suite", None) or start_suite()
    process, log = started
    try:
        returncode = process.wait(timeout=3600)  # a guard against a suite that never ends
    finally:
        if process.poll() is None:
            process.kill()
    output = log.read_text(errors="replace")
    print(output[-6000:])
    assert returncode == 0, output[-13000:]
