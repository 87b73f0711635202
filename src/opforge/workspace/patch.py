"""A set of file writes that lands whole or not at all, and reads as a unified diff before it lands."""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path

from opforge.workspace.atomic import write_text_atomic


@dataclass
class Patch:
    root: Path
    files: dict[str, str] = field(default_factory=dict)  # path relative to root -> new text

    def write(self, rel: str, text: str) -> None:
        self.files[rel] = text

    def current(self, rel: str) -> str | None:
        """The text a file has now: this patch's pending text, else the file's, else None."""
        if rel in self.files:
            return self.files[rel]
        path = self.root / rel
        return path.read_text() if path.is_file() else None

    def changed(self) -> dict[str, str]:
        out = {}
        for rel, text in self.files.items():
            path = self.root / rel
            if not path.is_file() or path.read_text() != text:
                out[rel] = text
        return out

    def diff(self) -> str:
        chunks = []
        for rel, text in sorted(self.changed().items()):
            path = self.root / rel
            old = path.read_text().splitlines(keepends=True) if path.is_file() else []
            chunks += difflib.unified_diff(old, text.splitlines(keepends=True),
                                           "/dev/null" if not old else f"a/{rel}", f"b/{rel}")
        return "".join(chunks)

    def apply(self) -> Applied:
        """Write every changed file; if any write fails, put back what was written and re-raise."""
        changed = self.changed()
        before = {rel: ((self.root / rel).read_text() if (self.root / rel).is_file() else None) for rel in changed}
        done: list[str] = []
        try:
            for rel, text in changed.items():
                (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(self.root / rel, text)
                done.append(rel)
        except BaseException:
            Applied(self.root, {rel: before[rel] for rel in done}).revert()
            raise
        return Applied(self.root, before)


@dataclass
class Applied:
    """What an applied patch replaced (None: the file did not exist), so that it can be taken back."""
    root: Path
    before: dict[str, str | None]

    def revert(self) -> None:
        for rel, text in self.before.items():
            path = self.root / rel
            if text is None:
                if path.is_file():
                    os.unlink(path)
            else:
                write_text_atomic(path, text)
