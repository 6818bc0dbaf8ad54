"""ZeroGPU as `spaces` runs it, through an emulator that forks a worker and pickles every argument
and result (tests/zerogpu_emulator), on the tiny pair; and the real `spaces` package outside
ZeroGPU, where its decorator must change nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EMULATOR = Path(__file__).resolve().parent / "zerogpu_emulator"

ON_ZEROGPU = """
import json, os, sys
import spaces  # the emulator, first on sys.path; app.py would import it first as well
import app  # noqa: F401 (what a Space runs: its imports must not touch torch before spaces)
from dropmatch.decoding.config import PairSpec, Settings
from dropmatch.decoding.engine import Engine, run_to_end
from dropmatch.models import load_hub_pair
from dropmatch.runfile import Downloads
from dropmatch.pair_host import Policy, PairHost
from dropmatch.ui import callbacks, zerogpu

target, draft = sys.argv[1], sys.argv[2]
loaded_in = []

def loader(spec):
    loaded_in.append(os.getpid())
    return load_hub_pair(PairSpec(spec.target, spec.draft))

studio = PairHost(loader, Engine, Policy(allow_local_models=True), inline=True)
spec = PairSpec(target, draft)
zerogpu.start(studio, spec)
settings = Settings("What is 2 + 3?", pair="Custom hub ids", target_id=target, draft_id=draft, gamma="auto",
                    max_new_tokens=12, run_autoregressive=False, p="0.3")
views = list(callbacks.run_comparison(studio, Downloads(), settings))
record = views[-1]["last_run"]
lab_status = callbacks.reverify_view(studio, record, {"num_paths": 5, "p": 0.2, "majority_fraction": 0.8, "centroid": "probs", "fixed_js_threshold": 0.1, "typical_eps": 0.3})["lab_status"]
endpoint = callbacks.settings_endpoint(lambda s: callbacks.compare_api(studio, s))
api = list(endpoint(prompt="What is 2 + 3?", pair="Custom hub ids", target_id=target, draft_id=draft,
                    max_new_tokens=12, run_autoregressive=False))
# a client that goes away: the generator is closed after two items, the worker stops and is reused
long = zerogpu.compare_on_gpu(Settings("Count to fifty.", pair="Custom hub ids", target_id=target,
                                       draft_id=draft, max_new_tokens=400, run_autoregressive=False))
next(long), next(long)
long.close()
again = list(callbacks.run_comparison(studio, Downloads(), settings))
from dropmatch.decoding.config import DecodeConfig, RuleConfig
engine = studio.loaded_engine()
here = run_to_end(engine.speculative(engine.encode("What is 2 + 3?"), DecodeConfig(gamma=4, max_new_tokens=12),
                                     RuleConfig("lossless")))
try:
    spaces.GPU(duration=10)(lambda e: 1)(engine)
    refused = ""
except spaces.ArgumentError as error:
    refused = str(error)
print(json.dumps({
    "main_pid": os.getpid(), "loaded_in": loaded_in, "calls": spaces.calls, "status": views[-1]["status"],
    "again": again[-1]["status"], "lab_status": lab_status, "api_text": api[-1]["lossless"]["text"],
    "lossless_text": record.lossless.text, "here_text": here.text, "refused": refused,
    "costs_measured": engine.services.measured_costs is not None,
}))
"""


def _emulated(code: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EMULATOR), str(ROOT)]), "SPACES_ZERO_GPU": "true",
           "DROPMATCH_ALLOW_LOCAL_MODELS": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
def test_on_emulated_zerogpu_the_pair_loads_in_the_main_process_and_the_model_work_runs_in_the_worker(tiny_dirs):
    target, draft = map(str, tiny_dirs)
    out = _emulated(ON_ZEROGPU, target, draft)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["loaded_in"] == [found["main_pid"]]  # once, before any GPU call, never in a worker
    functions = [call["function"] for call in found["calls"]]
    assert functions.count("compare_on_gpu") == 4 and functions.count("rule_lab_on_gpu") == 1, functions
    assert all(call["worker_pid"] != found["main_pid"] for call in found["calls"])
    assert len({call["worker_pid"] for call in found["calls"]}) < len(found["calls"])  # an idle worker is reused
    assert all(20 <= call["duration"] <= 180 for call in found["calls"])
    assert found["status"].startswith("Done") and found["again"].startswith("Done"), found
    assert "Re-judged" in found["lab_status"], found["lab_status"]
    assert found["lossless_text"] == found["here_text"] == found["api_text"]  # the worker decodes as here
    assert "is a Engine" in found["refused"], found["refused"]  # an engine is never an argument
    assert not found["costs_measured"]  # gamma = auto's costs were timed in the worker, not at load here


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
def test_the_emulator_refuses_spaces_imported_after_torch():
    out = _emulated("import torch\nimport spaces\n")
    assert out.returncode != 0 and "must be imported before torch" in out.stderr


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
def test_app_imports_nothing_heavy_before_spaces():
    """app.py's own imports, with the emulator as `spaces`, load no torch before spaces."""
    out = _emulated("import app, sys; print(list(sys.modules).index('spaces') < list(sys.modules).index('torch')"
                    " if 'torch' in sys.modules else True)")
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]


def test_the_real_spaces_decorator_is_a_no_op_outside_zerogpu(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    spaces = pytest.importorskip("spaces")  # requirements-dev.txt pins it
    from dropmatch.ui import zerogpu

    def generate():
        yield 1

    assert spaces.GPU(duration=30)(generate) is generate
    assert not zerogpu.active()
    assert zerogpu.compare_on_gpu.__name__ == "compare_on_gpu" and getattr(zerogpu.compare_on_gpu, "zerogpu", 0) == 0


def test_the_gpu_duration_grows_with_tokens_and_pair_within_bounds():
    from dropmatch.decoding.config import Settings
    from dropmatch.ui import zerogpu

    small = zerogpu.compare_duration(Settings("x", max_new_tokens=32))
    large = zerogpu.compare_duration(Settings("x", max_new_tokens=512))
    big_pair = zerogpu.compare_duration(Settings("x", pair="Qwen3-8B / Qwen3-0.6B (GPU)", max_new_tokens=256))
    assert zerogpu.MIN_DURATION_S <= small < large <= zerogpu.MAX_DURATION_S
    assert big_pair > zerogpu.compare_duration(Settings("x", max_new_tokens=256))
