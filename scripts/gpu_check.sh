#!/usr/bin/env bash
# GPU readiness check (< 5 minutes on one CUDA GPU): the GPU-marked tests, then one short benchmark
# of the embedded pair on CUDA (bf16), LIMIT prompts per file (default 5). Run from the repository root after scripts/setup.sh --test.
#   bash scripts/gpu_check.sh [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu_check}"
mkdir -p "$out"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
status=0
$PY -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" || status=$?  # the benchmark runs anyway
$PY -m dropmatch.bench --prompts assets/prompts/gsm8k_test_100.jsonl,assets/prompts/mt_bench.jsonl --limit "${LIMIT:-5}" \
  --max-new-tokens 96 --gamma 4 --rules lossless,dropmatch --peer --json "$out/gpu_bench.json" 2>&1 | tee "$out/gpu_bench.log"
# The vLLM plugin on the GPU (V1 runner: p = 0 equals vLLM's SD, a lossy run; the V2 runner refused), where a
# CUDA vLLM venv was made (docs/serving.md, "On a GPU").
if [ -x .venv-vllm-cuda/bin/python ]; then
  .venv-vllm-cuda/bin/python scripts/vllm_gpu_check.py --out "$out" 2>&1 | tee "$out/vllm_gpu_check.log" || status=$?
else
  echo "gpu_check: no .venv-vllm-cuda, the vLLM plugin's GPU check is skipped (docs/serving.md: On a GPU)"
fi
if [ "$status" -ne 0 ]; then
  echo "gpu_check: a GPU check failed (exit $status); see $out/gpu_tests.log and $out/vllm_gpu_check.log" >&2
fi
exit "$status"
