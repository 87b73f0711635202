"""ruff, codespell and clang-format, each run through its own CLI on a file's current text (stdin), read back
through its machine-readable output. Nothing here writes a file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import InputError
from opforge.i18n import N_, Msg

INSTALL_HINT = "not installed: pip install 'opforge[ci]'"


@dataclass
class Diagnostic:
    """One ruff finding; `fix` is ruff's JSON fix object or None."""

    code: str
    message: str
    row: int
    col: int
    end_row: int
    fix: dict | None


@dataclass
class Typo:
    row: int
    wrong: str
    right: str                   # as codespell prints it: "a, b" for several candidates
    reason: str                  # codespell's note when the dictionary disables the fix

    @property
    def single(self) -> bool:
        return "," not in self.right and not self.reason


def find_tool(name: str) -> str:
    # Prefer the tool installed beside this interpreter: the versions pinned with opforge.
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise InputError(name, INSTALL_HINT)
    return found


class Linters:
    """Runs the tools in `repo` (so each reads the project's own configuration) and logs every command."""

    def __init__(self, repo: Path, log):
        self.repo = repo
        self.log = log
        self._bins: dict[str, str] = {}
        self._typos: dict[tuple[str, str], list[Typo]] = {}
        self._seen: dict[tuple, subprocess.CompletedProcess] = {}

    def _bin(self, name: str) -> str:
        if name not in self._bins:
            self._bins[name] = find_tool(name)
        return self._bins[name]

    def _run(self, argv: list[str], text: str, label: str) -> subprocess.CompletedProcess:
        # the same command on the same text gives the same answer: the final checks reuse the last step's runs
        key = (tuple(argv), text)
        if key not in self._seen:
            proc = subprocess.run(argv, cwd=self.repo, input=text.encode("utf-8"), capture_output=True)
            self.log(argv, proc.returncode, stdin=label)
            self._seen[key] = proc
        return self._seen[key]

    # ruff
    def ruff_check(self, rel: str, text: str) -> list[Diagnostic]:
        # --no-fix: a project's `fix = true` would otherwise make ruff print fixed source instead of the report
        argv = [self._bin("ruff"), "check", "--no-fix", "--output-format", "json", "--force-exclude", "--no-cache",
                "--stdin-filename", rel, "-"]
        proc = self._run(argv, text, rel)
        if proc.returncode not in (0, 1):
            raise InputError(rel, f"ruff check failed: {_first_line(proc.stderr)}")
        out = []
        for d in json.loads(proc.stdout or b"[]"):
            loc, end = d.get("location") or {}, d.get("end_location") or {}
            out.append(Diagnostic(code=d.get("code") or "syntax-error", message=d["message"],
                                  row=loc.get("row", 1), col=loc.get("column", 1),
                                  end_row=end.get("row", loc.get("row", 1)), fix=d.get("fix")))
        return out

    def ruff_format(self, rel: str, text: str, line_range: tuple[int, int] | None = None) -> str | None:
        """The formatted text, or None when ruff cannot format it (a syntax error)."""
        argv = [self._bin("ruff"), "format", "--force-exclude", "--no-cache", "--stdin-filename", rel]
        if line_range:
            # ruff's range ends before the given line: a-(b+1) covers lines a..b
            argv += ["--range", f"{line_range[0]}-{line_range[1] + 1}"]
        proc = self._run(argv + ["-"], text, rel)
        if proc.returncode != 0:
            return None
        return proc.stdout.decode("utf-8")

    # codespell
    def codespell(self, texts: dict[str, str]) -> dict[str, list[Typo]]:
        """Typos of many files' current texts in one codespell run (its start-up is most of its time).

        The texts are copied under a temporary folder with their relative paths, and codespell runs in the
        repository so that it reads the project's configuration. Results are remembered per text."""
        todo = {rel: t for rel, t in texts.items() if (rel, t) not in self._typos}
        if todo:
            with tempfile.TemporaryDirectory(prefix="ci-fix-") as tmp:
                paths = {}
                for rel, text in todo.items():
                    p = Path(tmp, rel)
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_bytes(text.encode("utf-8"))
                    paths[str(p)] = rel
                argv = [self._bin("codespell"), "--", *paths]
                proc = subprocess.run(argv, cwd=self.repo, capture_output=True, stdin=subprocess.DEVNULL)
                self.log(argv, proc.returncode, stdin=Msg(N_("copies of {n} file(s) under {folder}"), n=len(paths),
                                                          folder=tmp))
                if proc.returncode not in (0, 65):
                    raise InputError("codespell", f"failed: {_first_line(proc.stderr)}")
                found = parse_codespell(proc.stdout.decode("utf-8", "replace"), paths)
            for rel, text in todo.items():
                self._typos[(rel, text)] = found.get(rel, [])
        return {rel: self._typos[(rel, t)] for rel, t in texts.items()}

    # clang-format
    def clang_format(self, path: Path, text: str, lines: list[tuple[int, int]] | None,
                     sort_includes: bool | None) -> list[tuple[int, int, str]]:
        """Replacements (byte offset, byte length, new text) in the project's style; [] without a .clang-format."""
        argv = [self._bin("clang-format"), "--style=file", "--fallback-style=none", "--output-replacements-xml",
                f"--assume-filename={path}"]
        if sort_includes is not None:
            argv.append(f"--sort-includes={'true' if sort_includes else 'false'}")
        for a, b in lines or []:
            argv.append(f"--lines={a}:{b}")
        proc = self._run(argv, text, str(path.relative_to(self.repo)))
        if proc.returncode != 0:
            raise InputError(str(path.relative_to(self.repo)), f"clang-format failed: {_first_line(proc.stderr)}")
        root = ET.fromstring(proc.stdout)
        return [(int(r.get("offset")), int(r.get("length")), r.text or "") for r in root.iter("replacement")]


CS_FIX = re.compile(r"^(\d+): (.+?) ==> (.+?)(?: \| (.*))?$")


def parse_codespell(out: str, paths: dict[str, str]) -> dict[str, list[Typo]]:
    """codespell's report, one 'PATH:LINE: wrong ==> right[ | reason]' per typo, keyed by relative path."""
    found: dict[str, list[Typo]] = {}
    by_length = sorted(paths, key=len, reverse=True)
    for line in out.splitlines():
        path = next((p for p in by_length if line.startswith(p + ":")), None)
        if path is None:
            continue
        m = CS_FIX.match(line[len(path) + 1:])
        if m:
            found.setdefault(paths[path], []).append(
                Typo(int(m.group(1)), m.group(2), m.group(3).strip(), (m.group(4) or "").strip()))
    return found


def _first_line(err: bytes) -> str:
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return lines[0] if lines else "no message"
