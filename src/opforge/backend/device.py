"""Importing this module makes the opdev device available to torch: `torch.randn(3, device="opdev")`.

It loads the backend library (building it first if this source tree was never built), names PrivateUse1
"opdev", registers this module as `torch.opdev` and gives tensors, modules and storages their `.opdev()`
methods. OPDEV_ROOT selects another source tree (an adaptation's copy of native/); a process holds one.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

from opforge.backend import DEVICE, build

ROOT = Path(os.environ.get("OPDEV_ROOT") or build.NATIVE)


def _progress(done: int, total: int, what: str) -> None:
    print(f"opdev: building the backend [{done}/{total}] {what}", file=sys.stderr, flush=True)


def _load():
    found = build.build(ROOT, progress=_progress)
    spec = importlib.util.spec_from_file_location(build.EXTENSION, found.library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return found, module


BUILD, _C = _load()


def _load_python_registrations() -> None:
    """The tree's python/*.py: custom operators' Meta functions and autograd, registered once the library has
    defined their schemas."""
    for path in sorted((ROOT / "python").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"opdev_registrations.{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device) -> None:
    _C.set_device(torch.device(DEVICE, device).index if not isinstance(device, int) else device)


def synchronize(device=None) -> None:
    """Kernels run synchronously on the host: nothing is ever pending."""


def memory_stats(device=None) -> dict:
    return _C.memory_stats(_index(device))


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["peak_allocated_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def _index(device) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return current_device() if d.index is None else d.index


_GENERATORS: dict[int, torch.Generator] = {}


def _generator(device=None) -> torch.Generator:
    index = _index(device)
    if index not in _GENERATORS:
        _GENERATORS[index] = _C.default_generator(index)
    return _GENERATORS[index]


def manual_seed(seed: int) -> None:
    _generator().manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _generator(i).manual_seed(seed)


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    _generator(device).set_state(state)


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() != DEVICE:
        torch.utils.rename_privateuse1_backend(DEVICE)
    if not hasattr(torch, DEVICE):
        torch._register_device_module(DEVICE, sys.modules[__name__])
    if not hasattr(torch.Tensor, DEVICE):
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)


_register()
_load_python_registrations()
