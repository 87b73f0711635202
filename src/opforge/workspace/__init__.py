"""The workspace: one folder per operator, and the names of the artifacts each stage writes in it.

A leaf package, with atomic.py (crash-safe writes, the lock) and events.py (the event log): every skill,
the runner, llm, hosts and bench build on it, so it imports nothing of opforge but errors and request
(tests/test_layers.py holds it to that).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from opforge.errors import InputError
from opforge.request import REQUEST_FILE, Request, load_request

REQUEST_COPY = "request"  # the request as it was when the run started: the workspace needs nothing else


@dataclass
class Workspace:
    root: Path
    op: str

    def path(self, rel: str) -> Path:
        return self.root / rel

    @property
    def golden(self) -> str:
        return f"{self.op}_golden.py"

    @property
    def impl(self) -> str:
        return f"{self.op}_impl.py"

    @property
    def test(self) -> str:
        return f"test_{self.op}.py"

    def stage_artifacts(self, stage: int) -> list[str]:
        """Files a stage owns (relative paths); they are hashed at completion and snapshotted."""
        return {
            1: ["SPEC.md", "spec.json"],
            2: ["API_REPORT.md", "api_report.json"],
            3: [self.golden],
            4: ["DESIGN.md", "design.json"],
            5: [self.impl, self.test, "conftest.py", "README.md", "PRECISION.md", "precision.json", "COMPILE.md",
                "compile.json"],
            6: ["PRECISION.md", "precision.json"],
            7: ["PERF.md", "perf.json", "perf.png", "README.md"],
        }[stage]

    def request(self) -> Request:
        return load_request(self.root / REQUEST_COPY)


@dataclass
class StageOutcome:
    """What a stage reports back to the runner."""

    status: str  # completed | failed | skipped | blocked
    reason: str = ""
    artifacts: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    retryable: bool = False  # a deterministic stage that failed fails the same way again


# What the runner calls for a stage: (workspace, request, state) -> outcome. The state is untyped here, as
# the leaf cannot import the orchestrator's State.
StageFn = Callable[[Workspace, Request, object], StageOutcome]


def copy_request(request_dir: Path, dest: Path) -> None:
    """Copy request.yaml and every Python file beside it (the reference and what it imports)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(request_dir.iterdir()):
        if f.is_file() and (f.name == REQUEST_FILE or f.suffix == ".py"):
            shutil.copy2(f, dest / f.name)


def os_error(path: Path, exc: OSError) -> InputError:
    """An OSError while making the folder the user named, in one line with the system's reason."""
    # a folder above names where it failed; a temporary folder of ours beside the path would only puzzle
    culprit = f" ({exc.filename})" if exc.filename and Path(exc.filename) in Path(path).absolute().parents else ""
    return InputError(str(path), f"cannot create it: {exc.strerror or exc}{culprit}")


def check_out_folder(out: Path, names: str = "the workspace folder to create") -> None:
    """Refuse, in one line naming `out`, a folder that cannot be made there: a file in its place (`names` says
    what --out should name) or above it, or a parent this user cannot write. Checked before any work, so the
    user hears at once."""
    try:
        if out.exists() and not out.is_dir():
            raise InputError(str(out), f"is a file; --out names {names}")
        above = out.absolute().parent
        while not above.exists():
            above = above.parent
        if not above.is_dir():
            raise InputError(str(out), f"cannot create it: {above} is a file, not a folder")
        if not os.access(above, os.W_OK | os.X_OK):
            raise InputError(str(out), f"cannot create it: {above} is not writable")
    except OSError as exc:  # a folder above that cannot even be looked into
        raise os_error(out, exc) from None


def load_module(path: str | Path, name: str):
    """Import a generated module (impl, golden) from its file under `name`. It stays in sys.modules: an impl
    registers torch.library ops, and its kernels must be found by Triton and by pickling."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
