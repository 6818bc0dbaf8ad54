"""Visitors of a running app's server, at the protocol level: what a browser tab sends (a session, the
page and its config, the heartbeat stream held open, the page's load events, then Run, the stream read
to the end, the tab closed) and what an API user sends (/compare through gradio_client). The session test
(tests/test_sessions.py) and the memory soak (scripts/soak_server.py) drive the app with them.
"""

from __future__ import annotations

import json
import threading
import uuid

import httpx

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


REQUEST_WAIT_S = 300  # httpx's default, 5 s, is less than a busy 2-core machine may take under many clients


def api_client(url: str):
    """A gradio_client Client whose every request waits up to REQUEST_WAIT_S: a hang guard, not a timing, so
    that what a visit or a test finds does not depend on how busy the machine is."""
    from gradio_client import Client

    return Client(url, verbose=False, httpx_kwargs={"timeout": REQUEST_WAIT_S})


def visit_prompt(i: int) -> str:
    return f"Tell me about {' '.join(WORDS[: 1 + i % len(WORDS)])}, number {i}."


class ApiVisitor:
    """/compare through a gradio_client Client: a new one per visit unless one_client."""

    def __init__(self, url: str, one_client: bool):
        self.make = lambda: api_client(url)
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
