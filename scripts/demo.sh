#!/usr/bin/env bash
# Set up, then build the demo operator through all seven stages into out/qat_symmetric_per_tensor.
# A first run by default (--quick: Level 0 at the p0 shapes scaled down to the interpreter's size, CPU timings at
# one shape); `bash scripts/demo.sh --full` verifies and times the full matrix. Other arguments go to `op run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mode=(--quick)
if [ "${1:-}" = "--full" ]; then
  mode=()
  shift
fi
.venv/bin/opforge op run examples/qat_symmetric_per_tensor --out out/qat_symmetric_per_tensor --force \
  "${mode[@]}" "$@"
