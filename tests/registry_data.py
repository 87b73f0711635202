"""Test data taken from the package registry: torch_npu's operator yaml, read out of the torch-npu wheel.

The pr-analysis tests need a real backend profile. The torch-npu wheel on PyPI carries two:

- `torch_npu/csrc/aten/npu_native_functions.yaml`: torch_npu's own registrations (`supported:` names, some as
  `- func: clone` entries with options, `custom:` schemas, `symint:`), torchgen's backend yaml format;
- `torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml`: the same merged with op-plugin's operators for this
  torch release (torchnpugen writes it at build time), the full set of overloads torch_npu implements, in the same
  format with keys sorted (`func:` is not always an entry's first key).

`ensure()` downloads the wheel once with pip (`pip download --no-deps`, a pinned platform tag, so the same file on
every host), copies the two yaml files out of it and keeps the wheel beside them (`wheel()`: the helper's tests read
the files its knowledge cards cite); the wheel is only read as a zip, never installed or imported. The files are
cached under `.cache/registry/torch_npu-VERSION/` in the checkout (git-ignored, `OPFORGE_TEST_DATA_CACHE` moves it),
with SOURCE.json naming the wheel and its sha256; a second call downloads nothing. Offline,
`OPFORGE_TORCH_NPU_WHEEL=/path/to/torch_npu-VERSION-*.whl` reads a local copy.

`python tests/registry_data.py` (scripts/setup.sh runs it) fetches and prints the cache folder; it exits 1 with
one line saying why when the registry cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH_NPU_VERSION = "2.13.0"  # the release that matches the torch pinned in scripts/setup.sh
# The yaml is the same in every build of a release; a fixed build keeps the download the same on every host.
WHEEL_TAGS = ["--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp",
              "--abi", "cp311"]
NATIVE = "torch_npu/csrc/aten/npu_native_functions.yaml"
BY_CODEGEN = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
MEMBERS = (NATIVE, BY_CODEGEN)
WHEEL = "torch_npu.whl"


class RegistryDataError(RuntimeError):
    """The data could not be had from the registry (or the local wheel named by OPFORGE_TORCH_NPU_WHEEL)."""


def cache_dir() -> Path:
    base = os.environ.get("OPFORGE_TEST_DATA_CACHE") or ROOT / ".cache" / "registry"
    return Path(base) / f"torch_npu-{TORCH_NPU_VERSION}"


def _download(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", *WHEEL_TAGS, "--retries", "2", "--timeout", "30", "-d", str(dest),
           f"torch-npu=={TORCH_NPU_VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("torch_npu-*.whl"))
    if proc.returncode or not wheels:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise RegistryDataError(f"cannot download torch-npu=={TORCH_NPU_VERSION} from the package registry "
                                f"(pip exit {proc.returncode}: {said[-1] if said else 'no output'}); the pr-analysis "
                                "tests read torch_npu's operator yaml from that wheel. Set OPFORGE_TORCH_NPU_WHEEL "
                                "to a local copy of the wheel to work offline.")
    return wheels[0]


def _extract(wheel: Path, dest: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            missing = [m for m in MEMBERS if m not in names]
            if missing:
                raise RegistryDataError(f"{wheel.name} has no {', '.join(missing)}")
            for m in MEMBERS:
                (dest / Path(m).name).write_bytes(z.read(m))
    except zipfile.BadZipFile as exc:
        raise RegistryDataError(f"{wheel}: not a wheel ({exc})") from None
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (dest / "SOURCE.json").write_text(json.dumps({"wheel": wheel.name, "sha256": digest, "members": list(MEMBERS)},
                                                 indent=1) + "\n")


def ensure() -> Path:
    """The cache folder holding npu_native_functions.yaml and npu_native_functions_by_codegen.yaml."""
    out = cache_dir()
    if (out / "SOURCE.json").is_file() and all((out / Path(m).name).is_file() for m in (*MEMBERS, WHEEL)):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        local = os.environ.get("OPFORGE_TORCH_NPU_WHEEL")
        if local and not Path(local).is_file():
            raise RegistryDataError(f"OPFORGE_TORCH_NPU_WHEEL={local}: no such file")
        wheel = Path(local) if local else _download(tmp / "wheel")
        staged = tmp / "data"
        staged.mkdir()
        _extract(wheel, staged)
        shutil.copyfile(wheel, staged / WHEEL)
        shutil.rmtree(out, ignore_errors=True)  # a folder left half-written by an older layout
        try:
            staged.rename(out)
        except OSError:  # another process finished first
            if not (out / "SOURCE.json").is_file():
                raise
    return out


def native_yaml() -> Path:
    """torch_npu's own registrations (torchgen's backend yaml format)."""
    return ensure() / Path(NATIVE).name


def by_codegen_yaml() -> Path:
    """Every overload torch_npu implements for this torch release (its own merged with op-plugin's)."""
    return ensure() / Path(BY_CODEGEN).name


def wheel() -> Path:
    """The torch-npu wheel itself, to read other files out of."""
    return ensure() / WHEEL


if __name__ == "__main__":
    try:
        print(ensure())
    except RegistryDataError as exc:
        print(f"registry_data: {exc}", file=sys.stderr)
        sys.exit(1)
