"""Serving the embedded target's hub id from a local folder, offline: a Hugging Face hub cache laid
out by hand (refs/main -> snapshots/<commit>/files), as huggingface_hub reads it with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

FAKE_COMMIT = "0" * 40


def fake_hub_cache(root: Path, repo_id: str, files_from: Path, commit: str = FAKE_COMMIT,
                   names: tuple[str, ...] | None = None) -> Path:
    """A hub cache under `root` whose `repo_id` snapshot at `commit` holds (links to) the files of
    `files_from` (only `names`, if given): what huggingface_hub reads offline."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for file in files_from.iterdir():
        if file.is_file() and (names is None or file.name in names):
            link = snapshot / file.name
            if not link.exists():
                os.symlink(file.resolve(), link)
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def offline_env(hub_cache: Path, model_cache: Path, **extra: str) -> dict[str, str]:
    """The environment of a process that must not reach the network and must not find a converted
    embedded target (an empty DROPMATCH_CACHE), with the hub served from `hub_cache`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GRADIO_", "DROPMATCH_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub_cache), DROPMATCH_CACHE=str(model_cache),
               GRADIO_ANALYTICS_ENABLED="False", **extra)
    return env


def listening_addresses(server: subprocess.Popen, port: int, log: Path, timeout_s: float = 600) -> list:
    """The addresses `server` listens on at `port`, once it listens (waited for up to timeout_s: a
    hang guard, it listens within seconds). A server that ends first raises, with its log's end."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the app ended before it listened:\n" + log.read_text()[-3000:])
        listening = [c.laddr for c in psutil.Process(server.pid).net_connections()
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        if listening:
            return listening
        time.sleep(0.5)
    return []
