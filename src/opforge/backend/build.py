"""Build the opdev backend: torchgen writes its registrations, the vendor table its kernels, ninja compiles.

A build is keyed by a digest of everything that goes into it (the source tree, these generators, torch's and
Python's versions), so an unchanged tree loads the library built before and a changed one builds afresh.
Compilation runs in a child process (`python -m opforge.backend.build DIR`) so that the caller can show
ninja's progress and need not load the library it builds.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import filelock

from opforge.backend import custom_ops, vendor
from opforge.errors import InputError
from opforge.workspace.atomic import write_json_atomic, write_text_atomic

NATIVE = Path(__file__).parent / "native"
BACKEND_YAML = "opdev_functions.yaml"
EXTENSION = "_opdev_C"
CFLAGS = ["-O2", "-fvisibility-inlines-hidden"]
SOURCE_SUFFIXES = (".cpp", ".h", ".yaml")
_GENERATORS = ("build.py", "vendor.py", "cpp.py", "custom_ops.py")
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")

Progress = Callable[[int, int, str], None]  # (done, total, what)


class BuildError(RuntimeError):
    """The backend did not compile; `log` is the file holding the compiler's whole output."""

    def __init__(self, message: str, log: Path | None = None):
        self.log = log
        super().__init__(message)


@dataclass(frozen=True)
class Build:
    root: Path  # the source tree
    dir: Path  # where it was built
    library: Path
    digest: str
    seconds: float  # compile time; 0.0 when the build was found in the cache
    cached: bool


def cache_root() -> Path:
    env = os.environ.get("OPFORGE_BACKEND_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "opforge" / "backend"


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES)


def digest(root: Path = NATIVE) -> str:
    import torch

    h = hashlib.sha256()
    h.update(f"torch {torch.__version__} python {sys.version_info[:2]} flags {CFLAGS}\n".encode())
    for name in _GENERATORS:
        h.update((Path(__file__).parent / name).read_bytes())
    for p in source_files(root):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def build_dir(root: Path = NATIVE) -> Path:
    return cache_root() / f"opdev-{digest(root)[:16]}"


def library_path(directory: Path) -> Path:
    return directory / "obj" / f"{EXTENSION}.so"


def cached(root: Path = NATIVE) -> Build | None:
    """The finished build of this tree, if there is one."""
    directory = build_dir(root)
    lib = library_path(directory)
    if (directory / "build.json").is_file() and lib.is_file():
        return Build(root, directory, lib, digest(root), 0.0, True)
    return None


def generate(root: Path, gen: Path) -> list[Path]:
    """Write the generated sources of `root` into `gen`: torchgen's registrations and the vendor kernels."""
    gen.mkdir(parents=True, exist_ok=True)
    # torchgen's own CLI, in a child: its parser keeps global state that a second run in one process trips on
    proc = subprocess.run([sys.executable, "-m", "torchgen.gen_backend_stubs", "-s", str(root / BACKEND_YAML),
                           "-o", str(gen)], capture_output=True, text=True)
    if proc.returncode != 0:  # torchgen reports a bad backend yaml by an assertion: its message is the last line
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        message = lines[-1].split(": ", 1)[-1] if lines else f"exit {proc.returncode}"
        raise InputError(str(root / BACKEND_YAML), f"torchgen refused it: {' '.join(message.split())}")
    kernels = vendor.load_kernels(root / "vendor" / "kernels.yaml")
    write_text_atomic(gen / "vk_kernels.h", vendor.emit_header(kernels))
    write_text_atomic(gen / "vk_kernels.cpp", vendor.emit_source(kernels))
    ops = custom_ops.load(root)
    write_text_atomic(gen / "CustomNativeFunctions.h", custom_ops.emit_header(ops))
    if ops:
        write_text_atomic(gen / "RegisterCustom.cpp", custom_ops.emit_registrations(ops))
    return sorted(gen.glob("*.cpp"))


def build(root: Path = NATIVE, *, force: bool = False, progress: Progress | None = None) -> Build:
    """Build the backend from `root` unless this exact tree is built already; returns where the library is."""
    root = Path(root).resolve()
    if not (root / BACKEND_YAML).is_file():
        raise BuildError(f"{root}: not an opdev source tree (no {BACKEND_YAML})")
    directory = build_dir(root)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(directory) + ".lock"):
        found = None if force else cached(root)
        if found:
            return found
        start = time.perf_counter()
        generated = generate(root, directory / "gen")
        sources = [p for p in source_files(root) if p.suffix == ".cpp"] + generated
        _compile(root, directory, sources, progress)
        seconds = round(time.perf_counter() - start, 1)
        write_json_atomic(directory / "build.json", {
            "digest": digest(root), "root": str(root), "seconds": seconds,
            "sources": [str(p) for p in sources],
        })
        return Build(root, directory, library_path(directory), digest(root), seconds, False)


def _compile(root: Path, directory: Path, sources: list[Path], progress: Progress | None) -> None:
    obj = directory / "obj"
    obj.mkdir(parents=True, exist_ok=True)
    # torch's cpp_extension keeps its own baton file here and waits forever while it exists; a build killed
    # mid-way leaves it behind. We hold the build lock, so no other build of this tree owns it.
    (obj / "lock").unlink(missing_ok=True)
    log_path = directory / "build.log"
    cmd = [sys.executable, "-m", "opforge.backend.build", str(root), str(directory),
           *[str(s) for s in sources]]
    lines: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            lines.append(line)
            m = _NINJA_STEP.match(line)
            if m and progress:
                done, total, what = int(m.group(1)), int(m.group(2)), m.group(3)
                progress(done, total, _compiled_file(what))
    write_text_atomic(log_path, "".join(lines))
    if proc.returncode != 0:
        first = next((ln.strip() for ln in lines if " error: " in ln or ln.startswith("error")),
                     lines[-1].strip() if lines else "no output")
        raise BuildError(f"the opdev backend did not compile: {first}", log_path)


def _compiled_file(command: str) -> str:
    """The source file a ninja command line compiles, or what it links."""
    m = re.search(r"-c (\S+\.cpp)", command)
    if m:
        return Path(m.group(1)).name
    return "link" if "-shared" in command else command.split()[0]


def _child(root: Path, directory: Path, sources: list[str]) -> None:
    from torch.utils.cpp_extension import load

    load(name=EXTENSION, sources=sources, build_directory=str(directory / "obj"),
         extra_include_paths=[str(root), str(directory / "gen")], extra_cflags=CFLAGS, verbose=True,
         is_python_module=True)


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
