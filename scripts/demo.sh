#!/usr/bin/env bash
# Set up, then build the demo operator through all seven stages into out/qat_symmetric_per_tensor.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/opforge op run examples/qat_symmetric_per_tensor --out out/qat_symmetric_per_tensor --force "$@"
