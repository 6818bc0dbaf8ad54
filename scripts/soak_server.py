"""Resident memory of a running server over many /compare requests (issue: a public Space must not
grow without bound). Starts `python app.py` on the embedded pair on a free port, sends WARM_UP requests,
then N more (6 new tokens each, prompts of varied length), and prints the server's RSS growth.

    python scripts/soak_server.py [--requests 100] [--warm-up 20]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--warm-up", type=int, default=20)
    parser.add_argument("--every", type=int, default=25, help="print the growth every this many requests")
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        client = None
        while client is None:
            if server.poll() is not None:
                print("error: the server ended", file=sys.stderr)
                return 1
            try:
                client = Client(f"http://127.0.0.1:{port}/", verbose=False)
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(1)
        process = psutil.Process(server.pid)
        before = None
        for i in range(args.warm_up + args.requests):
            if i == args.warm_up:
                before = process.memory_info().rss
            prompt = f"Tell me about {' '.join(WORDS[: 1 + i % len(WORDS)])}, number {i}."
            client.predict(prompt=prompt, max_new_tokens=6, api_name="/compare")
            if before is not None and (i - args.warm_up) % args.every == args.every - 1:
                print(f"{i - args.warm_up + 1} requests: +{(process.memory_info().rss - before) / 2**20:.1f} MB", flush=True)
        print(f"RSS growth over {args.requests} requests after {args.warm_up}: "
              f"{(process.memory_info().rss - before) / 2**20:.1f} MB")
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
