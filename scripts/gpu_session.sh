#!/usr/bin/env bash
# Everything a short session on a CUDA GPU should check, in order of what it proves, each step time-boxed so
# that one slow step cannot eat the others' time:
#   1. the machine: GPU, driver, torch, Triton (env.txt);
#   2. every catalog kernel on the device against float64 (the CPU runs them only in Triton's interpreter),
#      column sums over the device's SM count, inputs with leading dimensions, and the GEMM stages' products
#      with their epilogues, forward and backward (catalog-float64.xml);
#   3. the catalog benchmark: fused kernels against eager and torch.compile, and the copy ceiling, in one run
#      (scripts/bench_catalog.sh: <date>-<device>.md and .json, the .json rewritten after each operator);
#   4. few long rows shared by several programs (ROW_SPLIT) against one program a row block (row-split.json).
# Usage: bash scripts/gpu_session.sh [options for `opforge bench catalog`, e.g. --baselines eager,compile_default]
# PYTHON: the interpreter with a CUDA build of torch, Triton and opforge (default .venv/bin/python).
# OPFORGE_BENCH_DIR: where the figures go (default docs/benchmarks).
# OPFORGE_CHECK_S, OPFORGE_BENCH_S, OPFORGE_SPLIT_S: seconds allowed to steps 2, 3 and 4 (default 240, none, 90).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
dir=${OPFORGE_BENCH_DIR:-docs/benchmarks}
mkdir -p "$dir"
failed=0
step() { echo "== $1 ($(date -u +%T))" >&2; }

step "machine"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  "$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0]); print('torch', torch.__version__,
'cuda', torch.version.cuda); print('triton', triton.__version__); p = torch.cuda.get_device_properties(0);
print('device', p.name, 'SMs', p.multi_processor_count, 'memory GiB', round(p.total_memory / 2**30))"
} | tee "$dir/env.txt" || failed=1

step "catalog kernels against float64 on the GPU"
workers=()
"$PY" -c "import xdist" 2>/dev/null && workers=(-n 8)  # compiling the kernels dominates: spread it over cores
OPFORGE_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout "${OPFORGE_CHECK_S:-240}" "$PY" -m pytest -q -p no:cacheprovider \
  "${workers[@]}" tests/test_catalog.py tests/test_gemm.py tests/test_attention.py \
  -k "matches_float64 or leading_dimensions or test_gemm or test_attention" \
  --junitxml "$dir/catalog-float64.xml" -o junit_family=xunit2 || failed=1

step "catalog benchmark"
OPFORGE_BENCH_DIR=$dir timeout "${OPFORGE_BENCH_S:-0}" bash scripts/bench_catalog.sh "$@" || failed=1

step "row split"
timeout "${OPFORGE_SPLIT_S:-90}" "$PY" benchmarks/bench_row_split.py --json "$dir/$(date -u +%F)-row-split.json" \
  || failed=1
step "done (failed=$failed)"
exit $failed
