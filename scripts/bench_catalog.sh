#!/usr/bin/env bash
# Reproduce the catalog benchmark on a CUDA GPU: every catalog operator, forward and forward+backward, fused
# kernel against eager, torch.compile (default, max-autotune) and the device's copy ceiling, measured in one run.
# Writes docs/benchmarks/<date>-<device>.md and .json (date, device, torch and Triton versions in both);
# OPFORGE_BENCH_DIR names another folder. The .json is rewritten after each operator, so a run cut short keeps
# what it measured.
#
# Usage: bash scripts/bench_catalog.sh [--ops a,b] [--baselines eager,compile_default] [any `opforge bench catalog` option]
# PYTHON: the interpreter with a CUDA build of torch and Triton and opforge installed (default .venv/bin/python).
# Dropping compile_max_autotune from --baselines shortens the run most (its autotuning dominates compile time).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "error: no CUDA device visible to $PY; this script only records figures measured on a GPU" >&2
  echo "       (on a CPU, 'opforge bench catalog' reports reference timings and the cost model instead)" >&2
  exit 1
fi
device=$("$PY" -c "import re, torch; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
dir=${OPFORGE_BENCH_DIR:-docs/benchmarks}
stem="$dir/$(date -u +%Y-%m-%d)-$device"
mkdir -p "$dir"
start=$(date +%s)
"$PY" -m opforge bench catalog --json "$stem.json" --md "$stem.md" "$@"
echo "wrote $stem.md and $stem.json in $(( $(date +%s) - start )) s" >&2
