"""Holding up under real use: many users at once, stops, load failures, long sessions."""

from __future__ import annotations

import concurrent.futures
import gc

import psutil
import pytest
from fake_engine import FakeEngine
from local_server import serve_locally, wait_for

from dropmatch.decoding.config import DecodeConfig, PairSpec, RuleConfig
from dropmatch.models import ModelLoadError
from dropmatch.pair_host import PairHost
from tools.visitors import api_client


def launch(studio: PairHost):
    import app

    demo = app.create_demo(studio)
    return serve_locally(demo)


@pytest.mark.slow  # a server: the full suite's, not the fast tier's
def test_twenty_concurrent_users_each_get_their_own_answer():
    """20 simultaneous /compare calls on loopback: all complete, none lost, none mixed up."""

    demo = launch(PairHost(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine(delay_s=0.002)))
    try:
        prompts = [f"user{i} asks about topic{i} with word{i * 7}" for i in range(20)]

        def ask(prompt: str) -> dict:
            client = api_client(demo.local_url)
            return client.predict(prompt=prompt, max_new_tokens=64, run_autoregressive=False, api_name="/compare")

        with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
            answers = list(pool.map(ask, prompts, timeout=300))
        assert len(answers) == 20
        for prompt, answer in zip(prompts, answers):
            assert answer["prompt"] == prompt
            assert answer["lossless"]["text"] == prompt and answer["lossy"]["text"] == prompt
    finally:
        demo.close()


@pytest.mark.slow  # a server: the full suite's, not the fast tier's
def test_a_cancelled_request_stops_its_run_and_frees_the_engine_for_the_next_user():
    """A long /compare run (400 tokens, 50 ms a round: over 20 s) is cancelled once it has made a
    round: its run ends (the engine's generator returns or is closed, so it can make no further
    round) and the next request is served. The waits are hang guards (60 s each), not timings."""

    engine = FakeEngine(delay_s=0.05)
    demo = launch(PairHost(loader=lambda spec: spec, engine_factory=lambda pair: engine))
    try:
        client = api_client(demo.local_url)
        long_prompt = " ".join(f"w{i}" for i in range(400))
        job = client.submit(prompt=long_prompt, max_new_tokens=400, api_name="/compare")
        assert wait_for(lambda: engine.rounds_made > 0, timeout_s=60, poll_s=0.05), "the long run never started"
        job.cancel()
        assert wait_for(lambda: engine.runs_active == 0, timeout_s=60, poll_s=0.05), "the cancelled run never ended"
        stopped_after = engine.rounds_made
        # uncancelled, the comparison makes over 130 rounds (lossless alone, at the largest gamma, 80)
        assert stopped_after < 50, f"{stopped_after} rounds: the run went on to its end"
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(client.predict, prompt="short one", run_autoregressive=False,
                                 api_name="/compare").result(timeout=60)
        assert answer["lossless"]["text"] == "short one"
        assert engine.runs_active == 0
    finally:
        demo.close()


@pytest.mark.slow  # a server: the full suite's, not the fast tier's
def test_a_model_that_fails_to_load_leaves_the_app_up_with_a_message():
    from gradio_client.exceptions import AppError

    def loader(spec: PairSpec):
        if spec.target == "broken/model":
            raise ModelLoadError("could not load 'broken/model': file missing")
        return spec

    demo = launch(PairHost(loader=loader, engine_factory=lambda pair: FakeEngine()))
    try:
        client = api_client(demo.local_url)
        with pytest.raises(AppError, match="could not load 'broken/model'"):
            client.predict(prompt="hi there", pair="Custom hub ids", target_id="broken/model",
                           draft_id="broken/model", api_name="/compare")
        answer = client.predict(prompt="still alive", run_autoregressive=False, api_name="/compare")
        assert answer["lossless"]["text"] == "still alive"
    finally:
        demo.close()


@pytest.mark.slow  # 55 comparisons: the full suite's, not the fast tier's
def test_fifty_runs_in_one_process_keep_memory_flat(tiny_engine):
    """Resident memory after 50 more comparisons stays within a few MB of where it was after 5."""
    from dropmatch.compare import compare_stream

    process = psutil.Process()
    decode = DecodeConfig(gamma=4, max_new_tokens=12)
    rule = RuleConfig("dropmatch", p=0.3)

    def one_run(i: int) -> None:
        for _ in compare_stream(tiny_engine, f"the quick brown fox {i}", decode, rule, run_ar=i % 5 == 0):
            pass

    for i in range(5):  # warm-up: allocator pools and caches settle
        one_run(i)
    gc.collect()
    before = process.memory_info().rss
    for i in range(50):
        one_run(i)
    gc.collect()
    growth_mb = (process.memory_info().rss - before) / 2**20
    print(f"RSS growth over 50 runs: {growth_mb:.1f} MB")
    assert growth_mb < 30, f"memory grew by {growth_mb:.1f} MB over 50 runs"


def test_no_code_of_the_app_runs_a_shell_or_evaluates_text():
    """No eval/exec/os.system/shell=True/Popen in app.py or any module of the package, subpackages
    included (quality.py's sandbox is the one place that runs model-written code, on purpose)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    sources = [root / "app.py", *sorted((root / "dropmatch").rglob("*.py"))]
    assert any(path.parent.name == "ui" for path in sources) and any(path.parent.name == "vllm" for path in sources)
    forbidden = re.compile(r"(?<![.\w])eval\(|(?<![.\w])exec\(|os\.system|shell=True|subprocess\.Popen\(")
    for path in sources:
        if path.name == "quality.py":
            continue  # the HumanEval sandbox runs model code in a limited child process on purpose
        assert not forbidden.search(path.read_text()), path


@pytest.mark.slow  # a server: the full suite's, not the fast tier's
def test_the_app_opens_no_file_a_user_named(tmp_path):
    """Through the served app: a prompt that is a file's path, and custom model ids that name a model
    folder on this machine, open nothing under that folder (every open and directory listing of the
    process is recorded by an audit hook while the requests run); the ids are refused in one line."""
    import sys

    from gradio_client.exceptions import AppError

    folder = tmp_path / "user-named"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    secret = folder / "secret.txt"
    secret.write_text("do not read")
    opened: list[str] = []
    recording = [False]

    def audit(event: str, args: tuple) -> None:
        if recording[0] and event in ("open", "os.listdir", "os.scandir") and args and args[0] is not None:
            opened.append(str(args[0]))

    sys.addaudithook(audit)  # hooks cannot be removed: this one records only while `recording`
    demo = launch(PairHost(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine()))
    try:
        client = api_client(demo.local_url)
        recording[0] = True
        answer = client.predict(prompt=str(secret), run_autoregressive=False, api_name="/compare")
        assert answer["lossless"]["text"] == str(secret)  # the path is text to the app, nothing more
        with pytest.raises(AppError, match="is not a hub id"):
            client.predict(prompt=str(secret), pair="Custom hub ids", target_id=str(folder), draft_id=str(folder),
                           api_name="/compare")
        recording[0] = False
    finally:
        recording[0] = False
        demo.close()
    touched = [path for path in opened if "user-named" in path]
    assert not touched, touched


def test_a_gpu_without_bf16_gets_fp16_and_the_cpu_float32():
    """bf16 only where the GPU computes it (a T4 has none); the CPU pair stays float32."""
    import torch

    from dropmatch.models.loading import _dtype_for

    class Cuda:
        def __init__(self, bf16: bool):
            self.bf16 = bf16

        def is_bf16_supported(self) -> bool:
            return self.bf16

    assert _dtype_for(torch.device("cuda", 0), Cuda(True)) is torch.bfloat16
    assert _dtype_for(torch.device("cuda", 0), Cuda(False)) is torch.float16
    assert _dtype_for(torch.device("cpu"), Cuda(True)) is torch.float32


def test_the_fast_dtype_can_be_pinned_and_refuses_a_typo():
    import pytest
    import torch

    from dropmatch.decoding.cpu_kernels import fast_dtype

    assert fast_dtype(torch.device("cpu"), {"DROPMATCH_FAST_DTYPE": "float32"}) is torch.float32
    assert fast_dtype(torch.device("cpu"), {"DROPMATCH_FAST_DTYPE": "bfloat16"}) is torch.bfloat16
    with pytest.raises(ValueError, match="DROPMATCH_FAST_DTYPE"):
        fast_dtype(torch.device("cpu"), {"DROPMATCH_FAST_DTYPE": "fp8"})
