#!/usr/bin/env bash
# How the embedded pair's defaults were chosen: on held-out *training-side* prompts only
# (runs/distill/dev.jsonl from `distill_draft.py devset`: GSM8K train questions and prompts written
# for the dev set, neither ever trained on), never on the evaluation sets.
#   bash scripts/tune_on_dev.sh [N_PROMPTS]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-16}"
PY=.venv/bin/python
[ -f runs/distill/dev.jsonl ] || $PY scripts/distill_draft.py devset
mkdir -p runs/tune
for gamma in 2 3 4 5; do
  $PY -m dropmatch.bench --prompts runs/distill/dev.jsonl --limit "$n" --max-new-tokens 96 --gamma "$gamma" \
    --rules lossless --no-identity-check --json "runs/tune/gamma_$gamma.json" | tail -3
done
for agreement in 0.6 0.7 0.8 0.9; do
  $PY -m dropmatch.bench --prompts runs/distill/dev.jsonl --limit "$n" --max-new-tokens 96 --gamma 3 \
    --rules lossless,dropmatch --auto-agreement "$agreement" --no-identity-check \
    --json "runs/tune/agreement_$agreement.json" | tail -3
done
