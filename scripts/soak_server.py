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
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from tools.visitors import ApiVisitor, BrowserVisitor

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
