#!/usr/bin/env bash
# Everything a short session on a CUDA GPU should check, in order of what it proves:
#   1. every catalog kernel on the device against float64 (the CPU runs them only in Triton's interpreter),
#      column sums over the device's SM count, and inputs with leading dimensions;
#   2. the catalog benchmark: fused kernels against eager and torch.compile, and the copy ceiling, in one run
#      (scripts/bench_catalog.sh: docs/benchmarks/<date>-<device>.md and .json);
#   3. few long rows shared by several programs (ROW_SPLIT) against one program a row block:
#      docs/benchmarks/<date>-row-split.json.
# Usage: bash scripts/gpu_session.sh [options for `opforge bench catalog`, e.g. --baselines eager,compile_default]
# PYTHON: the interpreter with a CUDA build of torch, Triton and opforge (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OPFORGE_TEST_DEVICE=cuda TRITON_INTERPRET=0 "$PY" -m pytest -q -p no:cacheprovider tests/test_catalog.py \
  -k "matches_float64 or leading_dimensions"
bash scripts/bench_catalog.sh "$@"
mkdir -p docs/benchmarks
"$PY" benchmarks/bench_row_split.py --json "docs/benchmarks/$(date +%F)-row-split.json"
