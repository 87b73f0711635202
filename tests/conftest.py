"""Shared fixtures: small copies of the demo request, and one workspace built from it per session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("TRITON_INTERPRET", "1")
# checks draw their seeds from a fixed sequence here (the workspace tests run in subprocesses inherit it), so
# a run is reproducible; `OPFORGE_SEED= pytest` draws fresh ones
os.environ.setdefault("OPFORGE_SEED", "20261202")

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "qat_symmetric_per_tensor"
SMALL_P0 = [{"N": 48, "M": 80}, {"N": 33, "M": 65}]


def make_request(dest: Path, *, p0=None, edit=None, reference: str | None = None) -> Path:
    """A copy of the demo request in `dest`; `edit(doc)` may change the yaml, `reference` replaces the code."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in DEMO.iterdir():
        shutil.copy2(f, dest / f.name)
    doc = yaml.safe_load((dest / "request.yaml").read_text())
    doc["shapes"]["p0"] = p0 or SMALL_P0
    if edit:
        edit(doc)
    (dest / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    if reference is not None:
        (dest / "reference.py").write_text(reference)
    return dest


@pytest.fixture(scope="session")
def built_ws(tmp_path_factory) -> Path:
    """The demo operator (small p0 shapes) through all seven stages."""
    from opforge.orchestrator.runner import create_workspace, run_stages

    base = tmp_path_factory.mktemp("built")
    req = make_request(base / "request")
    ws = create_workspace(req, base / "ws")
    state = run_stages(ws.root)
    assert state.terminal["status"] == "SUCCESS", state.terminal
    return ws.root


@pytest.fixture
def ws_copy(built_ws, tmp_path) -> Path:
    """A private copy of the built workspace that a test may break."""
    dest = tmp_path / "ws"
    shutil.copytree(built_ws, dest)
    return dest
