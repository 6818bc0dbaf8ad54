"""Resident memory of a running server over many visitors (a public Space must not grow without bound).

Starts `python app.py` on the embedded pair on a free port (or, with --bare, a bare Gradio app of the
same shape: scripts/bare_gradio_app.py), sends WARM_UP visits, then N more, and prints the server's RSS
growth. A visit is one of:

  api       a new gradio_client.Client calls /compare (6 new tokens, prompts of varied length), as N
            separate API users would (--one-client: all through one client)
  browser   what a browser tab sends, at the protocol level: a new session, the page and its config,
            the heartbeat stream held open, the page's load events, then Run with 6 new tokens, the
            stream read to the end, the tab closed

    python scripts/soak_server.py [--visit api|browser] [--requests 500] [--warm-up 20] [--bare]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def visit_prompt(i: int) -> str:
    return f"Tell me about {' '.join(WORDS[: 1 + i % len(WORDS)])}, number {i}."


def start_server(bare: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False"}
    command = [sys.executable, "scripts/bare_gradio_app.py" if bare else "app.py"]
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the server ended before it listened")
        try:
            if httpx.get(url + "config", timeout=5).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    server.terminate()
    raise RuntimeError("the server did not listen within 600 s")


class ApiVisitor:
    """/compare through a gradio_client Client: a new one per visit unless one_client."""

    def __init__(self, url: str, one_client: bool):
        from gradio_client import Client

        self.make = lambda: Client(url, verbose=False)
        self.client = self.make() if one_client else None

    def visit(self, i: int) -> None:
        client = self.client or self.make()
        client.predict(prompt=visit_prompt(i), max_new_tokens=6, api_name="/compare")


class BrowserVisitor:
    """One browser tab, as the Gradio frontend speaks to the server: read from the page's own config."""

    def __init__(self, url: str, max_new_tokens: int = 6):
        self.url = url
        self.max_new_tokens = max_new_tokens
        self.api = url + "gradio_api/"
        config = httpx.get(url + "config", timeout=30).json()
        self.values = {c["id"]: c.get("props", {}).get("value") for c in config["components"]}
        self.tokens_id = self._component(config, "label", "max new tokens")
        self.prompt_id = self._component(config, "label", "Prompt")
        self.load_events = [d for d in config["dependencies"]
                            if d.get("backend_fn") and any(t[1] == "load" for t in d["targets"])]
        run_id = self._component(config, "elem_id", "run-button", required=False)
        self.run_event = next((d for d in config["dependencies"] if [run_id, "click"] in d["targets"]), None)

    @staticmethod
    def _component(config: dict, prop: str, value: str, required: bool = True) -> int | None:
        found = [c["id"] for c in config["components"] if c.get("props", {}).get(prop) == value]
        if required and not found:
            raise RuntimeError(f"the page has no component whose {prop} is {value!r}")
        return found[0] if found else None

    def visit(self, i: int) -> None:
        session = uuid.uuid4().hex[:11]
        with httpx.Client(timeout=120) as http:
            http.get(self.url)
            http.get(self.url + "config")
            with httpx.stream("GET", f"{self.api}heartbeat/{session}", timeout=None) as beat:
                # The tab is open while its heartbeat stream is; leaving the block closes it, as closing the tab does.
                reader = threading.Thread(target=self._drain, args=(beat,), daemon=True)
                reader.start()
                for event in self.load_events:
                    self._call(http, session, event, {})
                if self.run_event is not None:
                    self._call(http, session, self.run_event, {self.tokens_id: self.max_new_tokens, self.prompt_id: visit_prompt(i)})

    @staticmethod
    def _drain(stream: httpx.Response) -> None:
        try:
            for _ in stream.iter_lines():
                pass
        except (httpx.HTTPError, RuntimeError, ValueError):  # closed by the visit's end
            return

    def _call(self, http: httpx.Client, session: str, event: dict, overrides: dict) -> None:
        data = [overrides.get(cid, self.values.get(cid)) for cid in event["inputs"]]
        body = {"data": data, "fn_index": event["id"], "trigger_id": event["targets"][0][0] or None,
                "session_hash": session, "event_data": None}
        event_id = http.post(self.api + "queue/join", json=body).raise_for_status().json()["event_id"]
        with http.stream("GET", self.api + "queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed" and message.get("event_id") == event_id:
                    if not message.get("success", True):
                        raise RuntimeError(f"event {event['id']} failed: {message.get('output')}")
                    return


def soak(visitor, process: psutil.Process, requests: int, warm_up: int, every: int) -> float:
    before = None
    for i in range(warm_up + requests):
        if i == warm_up:
            before = process.memory_info().rss
        visitor.visit(i)
        if before is not None and (i - warm_up) % every == every - 1:
            print(f"{i - warm_up + 1} visits: +{(process.memory_info().rss - before) / 2**20:.1f} MB", flush=True)
    return (process.memory_info().rss - before) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--visit", choices=("api", "browser"), default="api")
    parser.add_argument("--one-client", action="store_true", help="api visits through one client")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--warm-up", type=int, default=20)
    parser.add_argument("--bare", action="store_true", help="a bare Gradio app of the same shape")
    parser.add_argument("--every", type=int, default=50, help="print the growth every this many visits")
    args = parser.parse_args()
    try:
        server, url = start_server(args.bare)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        visitor = BrowserVisitor(url) if args.visit == "browser" else ApiVisitor(url, args.one_client)
        growth = soak(visitor, psutil.Process(server.pid), args.requests, args.warm_up, args.every)
        what = "bare Gradio app" if args.bare else "app.py"
        print(f"RSS growth of {what} over {args.requests} {args.visit} visits after {args.warm_up}: {growth:.1f} MB")
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
