#!/usr/bin/env bash
# Set up, then run the project's tests. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests
.venv/bin/python -m pytest -q "$@"
