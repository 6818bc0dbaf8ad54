"""The vLLM integration's own suite (tests/vllm_plugin: the plugin on the embedded target through vLLM's
CPU build, in-process engines and `vllm serve`), run under .venv-vllm, which scripts/setup.sh
--test makes: vLLM pins another transformers than the app's, so it cannot share .venv.

The suite starts as soon as pytest has collected this test (conftest: in the session's main process, also
when pytest-xdist's workers run the tests) and runs beside the rest of the session;
this test, in whichever worker runs it, waits for the suite's exit status file and reads its output."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SUITE_ENV = "DROPMATCH_VLLM_SUITE_DIR"  # set by the session's main process; its workers inherit it


def start_suite(folder: Path) -> subprocess.Popen:
    """The vLLM suite in its own process group (with its engines' processes): its output goes to folder/log,
    its exit status to folder/rc when it ends."""
    # its own options: pytest.ini's (pytest-xdist's among them) are this venv's, and .venv-vllm has no xdist
    script = '"$0" -m pytest -q -p no:cacheprovider -o addopts=-ra tests/vllm_plugin > "$1" 2>&1; echo $? > "$2"'
    # one engine at a time beside the session's workers: more processes on two cores cost more CPU in all
    env = {**os.environ, "DROPMATCH_VLLM_ENGINES_AT_ONCE": "1"}
    return subprocess.Popen(["/bin/sh", "-c", script, str(VLLM_PYTHON), str(folder / "log"), str(folder / "rc")],
                            cwd=ROOT, start_new_session=True, env=env)


def wait_for_suite(folder: Path, guard_s: float = 3600) -> tuple[int, str]:
    """(exit status, output) of the suite started into `folder`, waited for up to guard_s (a guard against a
    suite that never ends, not a time budget)."""
    rc_file, deadline = folder / "rc", time.monotonic() + guard_s
    while not rc_file.exists() or not rc_file.read_text().strip():
        assert time.monotonic() < deadline, f"the vLLM suite did not end within {guard_s:.0f} s"
        time.sleep(1)
    return int(rc_file.read_text()), (folder / "log").read_text(errors="replace")


@pytest.mark.slow
def test_the_vllm_integration_suite_passes_under_its_own_venv():
    assert VLLM_PYTHON.exists(), "no .venv-vllm: run bash scripts/setup.sh --test (or --vllm)"
    given = os.environ.get(SUITE_ENV)
    if given and Path(given).is_dir():  # made when the session started the suite
        folder = Path(given)
    else:  # run outside a session that started it
        folder = Path(tempfile.mkdtemp(prefix="dropmatch-vllm-suite-"))
        start_suite(folder)
    returncode, output = wait_for_suite(folder)
    print(output[-6000:])
    assert returncode == 0, output[-13000:]
