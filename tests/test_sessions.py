"""What the server keeps per visitor: a closed tab's session and an idle API client's go; an open
tab's stays (sessions.SessionJanitor), through the real Gradio server."""

from __future__ import annotations

import platform
import time

import gradio as gr
import pytest
from fake_engine import FakeEngine
from local_server import serve_locally, wait_for

from dropmatch.pair_host import PairHost
from dropmatch.ui import sessions
from dropmatch.ui.sessions import SessionJanitor
from tools.visitors import BrowserVisitor, api_client  # what a tab and a client send, as in the soak


@pytest.fixture
def quick_janitor(monkeypatch):
    """Sessions go as soon as they are due: a closed tab at once, an API client after 0.2 s idle."""
    monkeypatch.setenv("DROPMATCH_SESSION_GRACE_S", "0")
    monkeypatch.setattr(sessions, "API_IDLE_S", 0.2)


@pytest.fixture
def server(quick_janitor):
    import app

    demo = app.create_demo(PairHost(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine()))
    serve_locally(demo)
    try:
        yield demo
    finally:
        demo.close()


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
def test_closed_tabs_leave_no_session_behind(server):
    """Six browser tabs, each loading the page and running, then closing: a few sessions at most
    remain (Gradio alone keeps all six, and each holds its run's views; scripts/soak_server.py
    --visit browser measures the memory over hundreds of tabs on the real pair, docs/results.md)."""
    visitor = BrowserVisitor(server.local_url)
    for i in range(6):
        visitor.visit(i)
    visitor.visit(6)  # its page load sweeps what the earlier tabs left
    assert wait_for(lambda: len(server.state_holder.session_data) <= 2), len(server.state_holder.session_data)
    assert len(server._queue.pending_messages_per_session) <= 2  # nor Gradio's queue entries of theirs


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
def test_api_clients_leave_no_session_behind(server):
    """Ten clients, one /compare each: their sessions go once idle, swept by the next call."""

    for i in range(10):
        api_client(server.local_url).predict(prompt=f"alpha beta {i}", api_name="/compare")
    time.sleep(0.3)
    api_client(server.local_url).predict(prompt="alpha beta last", api_name="/compare")
    assert len(server.state_holder.session_data) <= 2, len(server.state_holder.session_data)


def blocks_with_state():
    with gr.Blocks() as demo:
        state = gr.State(None)
    holder = gr.blocks.StateHolder() if hasattr(gr.blocks, "StateHolder") else None
    if holder is None:
        from gradio.state_holder import StateHolder

        holder = StateHolder()
    holder.set_blocks(demo)
    return demo, state, holder


def test_an_open_tab_keeps_its_session_and_a_reconnect_keeps_a_closed_one():
    demo, state, holder = blocks_with_state()
    janitor = SessionJanitor(demo, closed_grace_s=0.2, api_idle_s=0.0)
    janitor.page_opened("open-tab")
    holder["open-tab"][state._id] = "a run"
    janitor.page_opened("blip-tab")
    holder["blip-tab"][state._id] = "another run"
    janitor.page_closed("blip-tab")
    holder["blip-tab"]  # the tab reconnected and used its session again after it closed
    holder["api-client"]
    time.sleep(0.3)
    assert janitor.sweep() == 1  # the API client's
    assert set(holder.session_data) == {"open-tab", "blip-tab"}
    assert holder["open-tab"][state._id] == "a run" and holder["blip-tab"][state._id] == "another run"
    janitor.page_closed("open-tab")
    time.sleep(0.3)
    assert janitor.sweep() == 1 and "open-tab" not in holder.session_data


def test_what_a_user_did_is_kept_with_their_session_and_goes_with_it():
    demo, state, holder = blocks_with_state()
    janitor = SessionJanitor(demo, closed_grace_s=0.0)
    janitor.page_opened("tab")
    holder["tab"][state._id] = "a run"
    janitor.user_did("tab", "typed")
    janitor.user_did("tab", "ran")
    assert janitor.done_by("tab") == {"typed", "ran"} and janitor.done_by("another-tab") == frozenset()
    janitor.page_closed("tab")
    assert "tab" not in holder.session_data and janitor.done_by("tab") == frozenset() and not janitor.acts


def test_a_closed_tab_keeps_its_session_for_the_grace_period():
    demo, state, holder = blocks_with_state()
    janitor = SessionJanitor(demo, closed_grace_s=3600.0)
    janitor.page_opened("tab")
    holder["tab"][state._id] = "a run"
    janitor.page_closed("tab")
    assert janitor.sweep() == 0 and holder["tab"][state._id] == "a run"


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
def test_a_one_round_run_shows_its_results_in_the_page(server):
    """A run of one verification round (one new token) updates the page without an error (its
    step slider once got a maximum equal to its minimum, which Gradio refuses, failing the event)."""
    BrowserVisitor(server.local_url, max_new_tokens=1).visit(0)


def test_a_first_visit_computed_after_run_or_typing_lands_nothing_over_them():
    """The shipped run a first visit shows is computed once per server, slowly on a busy one: when it is ready
    after the visitor pressed Run, it updates nothing; after they typed, it leaves the prompt box alone. The
    listeners themselves, called in that order (the order a browser on CI's busy server produced)."""
    from types import SimpleNamespace

    import app
    from dropmatch.pair_host import PairHost

    demo = app.create_demo(PairHost(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine()))
    listener = {getattr(fn.fn, "__name__", None): fn.fn for fn in demo.fns.values()}
    page = lambda session: SimpleNamespace(session_hash=session, query_params={})  # noqa: E731
    untouched = listener["on_first_visit"](page("untouched"))
    prompt = next(component for component in untouched if getattr(component, "elem_id", None) == "prompt")
    assert untouched[prompt]  # a visitor who did nothing gets the recorded run's prompt
    listener["on_prompt_changed"]("my own question", page("typed"))
    typed = listener["on_first_visit"](page("typed"))
    assert prompt not in typed and len(typed) == len(untouched) - 1
    listener["on_press"](page("ran"))
    ran = listener["on_first_visit"](page("ran"))
    assert set(ran) == set(untouched) and all(update == {"__type__": "update"} for update in ran.values())


ARENAS_AFTER_THREADS = """
import ctypes, re, sys, tempfile, threading
from dropmatch.ui.sessions import cap_malloc_arenas

libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p


def arenas():
    with tempfile.NamedTemporaryFile(suffix=".xml") as report:
        stream = ctypes.c_void_p(libc.fopen(report.name.encode(), b"w"))
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        return len(re.findall("<heap nr=", open(report.name).read()))


capped = cap_malloc_arenas()
before = arenas()
together = threading.Barrier(9)
kept = []


def allocate():
    kept.append(bytearray(100_000))  # malloc'd in this thread's arena
    together.wait()
    together.wait()


threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
together.wait()
print(capped, before, arenas())
together.wait()
"""


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc arenas")
def test_new_threads_add_no_malloc_arenas_once_capped():
    """Eight threads allocating at once in a process that called cap_malloc_arenas() use at most two
    arenas, as the server's worker threads do (glibc alone gives each its own: the server's RSS climbed)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", ARENAS_AFTER_THREADS], capture_output=True, text=True, check=True)
    capped, before, after = out.stdout.split()
    assert capped == "True" and int(after) <= max(int(before), 2), out.stdout
