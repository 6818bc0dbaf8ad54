"""Time a new user's first click: from `python app.py` to both columns done, in a real browser.

Starts the app on a free port (the embedded pair; with --cold, an empty model cache, so the GGUF is
converted again), opens the page as soon as the server answers, clicks the first GSM8K example, sets
96 new tokens, clicks Run, and prints the seconds since the start until both columns were done (the
status moves on to the autoregressive baseline) and until the whole run was done.

    python scripts/first_click.py [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_listening(url: str, server: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the server ended before it listened")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not listen in time")


def first_click(cold: bool, max_new_tokens: int = 96) -> dict:
    from playwright.sync_api import sync_playwright

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False"}
    cache = tempfile.TemporaryDirectory(prefix="dropmatch-cold-cache-") if cold else None
    if cache is not None:
        env["DROPMATCH_CACHE"] = cache.name
    example = next(e["prompt"] for e in json.loads((ROOT / "assets" / "prompts" / "examples.json").read_text())
                   if e["category"] == "math")
    start = time.monotonic()
    server = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_until_listening(url, server)
        listening = time.monotonic() - start
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url)
            try:  # the page is ready when it shows the shipped run (a user reads it before clicking)
                page.wait_for_function("() => /recorded run/i.test(document.querySelector('#status')?.innerText || '')",
                                       timeout=30_000)
            except Exception:  # noqa: BLE001 - no shipped runs: go on
                pass
            page.get_by_text(example[:40]).first.click()
            page.wait_for_function("(start) => [...document.querySelectorAll('textarea')].some("
                                   "t => t.value.startsWith(start))", arg=example[:20], timeout=30_000)
            tokens_box = page.get_by_label("max new tokens", exact=False).first
            tokens_box.fill(str(max_new_tokens))
            tokens_box.press("Enter")
            page.click("#run-button")
            clicked = time.monotonic() - start
            page.wait_for_function("() => /autoregressive baseline|Done|⚠️/.test("
                                   "document.querySelector('#status')?.innerText || '')", timeout=600_000)
            columns = time.monotonic() - start
            page.wait_for_function("() => /Done|⚠️/.test(document.querySelector('#status')?.innerText || '')",
                                   timeout=600_000)
            done = time.monotonic() - start
            status = page.inner_text("#status")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        if cache is not None:
            cache.cleanup()
    return {"cache": "empty" if cold else "warm", "listening_s": round(listening, 1), "clicked_s": round(clicked, 1),
            "both_columns_s": round(columns, 1), "done_s": round(done, 1), "status": status[:80]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold", action="store_true", help="an empty model cache (the GGUF is converted again)")
    args = parser.parse_args()
    print(json.dumps(first_click(args.cold)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
