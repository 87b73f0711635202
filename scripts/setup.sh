#!/usr/bin/env bash
# Create .venv, install opforge with its test tools and fetch the tests' registry data. Idempotent: a second
# run installs and downloads nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==${OPFORGE_TORCH:-2.13.0}"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
# test data from the package registry: torch_npu's operator yaml, read out of the torch-npu wheel (never installed)
# into .cache/registry/ (git-ignored); cached, so a second run downloads nothing. See tests/registry_data.py.
.venv/bin/python tests/registry_data.py >/dev/null
# the reference PrivateUse1 backend (opdev) the toolbox's tests run on: compiled once, then cached by content
# under ~/.cache/opforge/backend (OPFORGE_BACKEND_CACHE moves it)
.venv/bin/opforge backend build
