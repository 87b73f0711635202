#!/usr/bin/env bash
# Create .venv and install opforge with its test tools. Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==${OPFORGE_TORCH:-2.13.0}"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
