"""Loading a CASE: a Python file with an entry function and an input builder, or a pytest node id.

File cases: `path.py` or `path.py::function`. The entry is, in order: the `::function`, the `--fn` option,
the module's `ENTRY` string, a function named `forward`. Inputs come from `inputs()` (or `make_inputs()`),
called once under a fixed seed: a tuple/list is positional, a dict keyword, a pair (tuple, dict) both.
`DOCUMENTED = {"precision": "why", ...}` names checks whose differences are expected (class 1).

A test function (name starting with `test`) is a pytest-style case: its `device` and `dtype` parameters
are set per side, and its return value, if any, is what is compared.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from opforge.errors import InputError

CHECKS = ("functional", "determinism", "precision", "memory")
PYTEST_PARAMS = ("device", "dtype")


@dataclass
class Case:
    name: str
    path: Path
    fn: Callable
    fn_name: str
    builder: Callable | None
    documented: dict = field(default_factory=dict)
    pytest_params: tuple = ()   # for test functions: which of device/dtype it takes
    entry_path: tuple = ()      # ("TestClass", "test_method") for a method of a test class

    @property
    def is_test(self) -> bool:
        return self.builder is None

    def build_inputs(self, seed: int) -> tuple[tuple, dict]:
        if self.builder is None:
            return (), {}
        torch.manual_seed(seed)
        try:
            got = self.builder()
        except Exception as exc:
            raise InputError(f"{self.path}:{self.builder.__name__}", f"the input builder failed: "
                                                                     f"{type(exc).__name__}: {exc}") from None
        if isinstance(got, dict):
            return (), got
        if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], (tuple, list)) and isinstance(got[1], dict):
            return tuple(got[0]), dict(got[1])
        if isinstance(got, (tuple, list)):
            return tuple(got), {}
        return (got,), {}


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InputError(str(path), "not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # sibling modules of the case (its kernels) import by name
    try:
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise InputError(str(path), f"does not import: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(str(path.parent))
    return mod


def _resolve(mod, parts: list[str], path: Path):
    """module::function, or module::TestClass::test_method (the class instantiated, as pytest does)."""
    obj = mod
    for k, part in enumerate(parts):
        obj = getattr(obj, part, None)
        if obj is None:
            raise InputError(f"{path}::{'::'.join(parts[:k + 1])}", "no such function in the case")
        if inspect.isclass(obj) and k < len(parts) - 1:
            try:
                obj = obj(methodName=parts[k + 1]) if hasattr(obj, "run") and hasattr(obj, "setUp") else obj()
            except Exception as exc:
                raise InputError(f"{path}::{part}", f"the test class does not instantiate: {exc}") from None
    if not callable(obj) or inspect.isclass(obj):
        raise InputError(f"{path}::{'::'.join(parts)}", "not a function")
    return obj


def load_case(spec: str, fn: str | None = None) -> Case:
    file_part, _, entry = str(spec).partition("::")
    parts = entry.split("::") if entry else ([fn] if fn else [])
    path = Path(file_part)
    if not path.is_file():
        raise InputError(str(spec), "no such file")
    if path.suffix != ".py":
        raise InputError(str(spec), "a CASE is a .py file or a pytest node id (file.py::test_name)")
    mod_name = f"opforge_case_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
    mod = _import(path, mod_name)
    if not parts:
        default = getattr(mod, "ENTRY", None) or ("forward" if hasattr(mod, "forward") else None)
        parts = [default] if default else []
    if not parts:
        raise InputError(str(path), "no entry function: name one with file.py::name, --fn, ENTRY = '...', "
                                    "or define forward()")
    entry = parts[-1]
    func = _resolve(mod, parts, path)
    documented = getattr(mod, "DOCUMENTED", {}) or {}
    if not isinstance(documented, dict) or any(k not in CHECKS for k in documented):
        raise InputError(f"{path}:DOCUMENTED", f"must be a dict whose keys are among {', '.join(CHECKS)}")
    name = path.stem if not str(spec).count("::") and not fn else f"{path.stem}-{entry}"
    if entry.startswith("test"):
        params = tuple(inspect.signature(func).parameters)
        extra = [p for p in params if p not in PYTEST_PARAMS]
        if extra:
            raise InputError(f"{path}::{entry}", f"test parameters {extra} are not supported "
                                                 f"(only {', '.join(PYTEST_PARAMS)})")
        return Case(name, path, func, entry, None, documented, params, tuple(parts))
    builder = getattr(mod, "inputs", None) or getattr(mod, "make_inputs", None)
    if not callable(builder):
        raise InputError(str(path), "no input builder: define inputs() returning the entry's arguments")
    return Case(name, path, func, entry, builder, documented, entry_path=tuple(parts))
