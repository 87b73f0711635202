"""The corpora the helper answers from, each a root and the files under it that say something a backend developer
asks about. Paths are relative to the root (`torch/utils/backend_registration.py`), so a citation reads the same
on every machine.

  torch      the installed torch (its site-packages folder): Python source, torchgen's yaml, the graph-break
             registry, and the C++ headers of c10, ATen (not the 7,000 generated per-op headers), torch/csrc and the
             extension API (torch/library.h: TORCH_LIBRARY)
  torch-npu  the torch-npu wheel, read as a zip: never imported (it needs the Ascend stack)
  opforge    opforge's own package: its Python, SKILL.md files and docs, and the README beside a source checkout
  PATH       any folder: every file of a kind the chunker knows
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import InputError

NPU_VERSION = "2.13.0"
KNOWN = (".py", ".h", ".hpp", ".cuh", ".yaml", ".yml", ".md", ".rst")
SKIP_DIRS = {"__pycache__", ".git", ".venv", "node_modules", "third_party"}
TORCH_HEADERS = ("torch/include/c10/", "torch/include/ATen/", "torch/include/torch/csrc/",
                 # the C++ extension API: TORCH_LIBRARY, custom classes
                 "torch/include/torch/library.h", "torch/include/torch/custom_class.h",
                 "torch/include/torch/extension.h", "torch/include/torch/script.h")


@dataclass(frozen=True)
class File:
    path: str  # relative to its corpus's root
    data: bytes


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opforge" / "helper"


def _walk(root: Path, under: str = "") -> Iterator[Path]:
    for folder, dirs, files in os.walk(root / under):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            yield Path(folder, name)


def torch_files() -> Iterator[File]:
    import torch

    root = Path(torch.__file__).resolve().parents[1]
    for package in ("torch", "torchgen"):
        for p in _walk(root, package):
            rel = p.relative_to(root).as_posix()
            if rel.startswith("torch/include/"):
                if not rel.startswith(TORCH_HEADERS) or rel.startswith("torch/include/ATen/ops/") \
                        or not rel.endswith((".h", ".hpp", ".cuh")):
                    continue
            elif not (rel.endswith((".py", ".yaml")) or rel.endswith("graph_break_registry.json")):
                continue
            yield File(rel, p.read_bytes())


def npu_wheel(given: Path | None = None) -> Path:
    """The torch-npu wheel: the one given, else the one in the cache, else downloaded there from the package
    registry (`pip download --no-deps`, this interpreter's platform)."""
    if given is not None:
        if not zipfile.is_zipfile(given):
            raise InputError("--npu-wheel", f"{given} is not a wheel (a zip file)")
        return given
    folder = cache_dir() / "wheels"
    found = sorted(folder.glob(f"torch_npu-{NPU_VERSION}-*.whl"))
    if found:
        return found[-1]
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                           f"torch-npu=={NPU_VERSION}", "-d", str(folder)], capture_output=True, text=True)
    found = sorted(folder.glob(f"torch_npu-{NPU_VERSION}-*.whl"))
    if proc.returncode != 0 or not found:
        raise InputError("--corpus", f"torch-npu: no wheel given (--npu-wheel) and pip download failed: "
                                     f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:] or ['no output']}")
    return found[-1]


def wheel_files(wheel: Path) -> Iterator[File]:
    try:
        with zipfile.ZipFile(wheel) as z:
            for info in sorted(z.infolist(), key=lambda i: i.filename):
                name = info.filename
                if info.is_dir() or ".dist-info/" in name or not name.endswith(KNOWN):
                    continue
                yield File(name, z.read(info))
    except zipfile.BadZipFile as exc:
        raise InputError("--npu-wheel", f"{wheel} is not a readable wheel: {exc}") from exc


def opforge_files() -> Iterator[File]:
    import opforge

    package = Path(opforge.__file__).resolve().parent
    root = package.parent
    cards = package / "skills" / "helper" / "knowledge"  # the cards point at passages; they are none themselves
    for p in _walk(root, "opforge"):
        if p.suffix in (".py", ".md", ".yaml") and p.parent != cards:
            yield File(p.relative_to(root).as_posix(), p.read_bytes())
    readme = root.parent / "README.md"  # a source checkout's README (src/ layout)
    if root.name == "src" and readme.is_file():
        yield File("README.md", readme.read_bytes())


def folder_files(root: Path) -> Iterator[File]:
    for p in _walk(root):
        if p.suffix in KNOWN:
            yield File(p.relative_to(root).as_posix(), p.read_bytes())


def resolve(names: list[str], npu_wheel_path: Path | None = None) -> dict[str, tuple[str, callable]]:
    """Corpus name -> (its root, for citations; a function that yields its files). A folder's corpus is named
    by the folder's absolute path."""
    out = {}
    for name in names:
        if name == "torch":
            import torch

            out[name] = (str(Path(torch.__file__).resolve().parents[1]), torch_files)
        elif name == "torch-npu":
            wheel = npu_wheel(npu_wheel_path)
            out[name] = (str(wheel), lambda wheel=wheel: wheel_files(wheel))
        elif name == "opforge":
            import opforge

            out[name] = (str(Path(opforge.__file__).resolve().parents[1]), opforge_files)
        else:
            root = Path(name).expanduser()
            if not root.is_dir():
                raise InputError("--corpus", f"{name!r} is neither torch, torch-npu, opforge nor a folder")
            root = root.resolve()
            out[str(root)] = (str(root), lambda root=root: folder_files(root))
    return out
