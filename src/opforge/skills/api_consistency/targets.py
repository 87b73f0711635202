"""Targets: the device under test, and how the same case is prepared for it and for the reference.

cuda / npu    the case's tensors moved to the device; reference: the CPU at the same dtype (and float64)
compile       torch.compile of the entry against eager, both on the CPU
half / bf16   the same program with floating tensors in float16 / bfloat16 against float64
custom:M:F    the function F of module M (a dotted name, or a .py file) called with the same inputs:
              a generated kernel, a rewritten wrapper
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.utils._pytree import tree_map

from opforge.errors import InputError
from opforge.workspace import load_module

LOWP = {"half": torch.float16, "fp16": torch.float16, "float16": torch.float16,
        "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


@dataclass
class Target:
    spec: str
    kind: str                        # device | compile | lowp | custom
    device: str = "cpu"              # where the device under test runs
    dtype: torch.dtype | None = None  # lowp only
    impl: Callable | None = None     # custom only
    impl_name: str = ""
    impl_file: str = ""              # the module's file, copied beside the repro script

    @property
    def label(self) -> str:
        return self.spec


def _npu_available() -> bool:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return False
    return bool(getattr(torch, "npu", None)) and torch.npu.is_available()


def _load_custom(ref: str, case_dir: Path | None) -> tuple[Callable, str, str]:
    mod_part, sep, fn_name = ref.rpartition(":")
    if not sep or not mod_part or not fn_name:
        raise InputError("--target", f"custom target {ref!r}: expected custom:module:function")
    extra = [str(case_dir)] if case_dir else []
    sys.path[:0] = extra
    try:
        if mod_part.endswith(".py"):
            path = Path(mod_part) if Path(mod_part).is_absolute() or not case_dir else (
                Path(mod_part) if Path(mod_part).exists() else case_dir / mod_part)
            if not path.is_file():
                raise InputError("--target", f"custom module file {mod_part} not found")
            mod = load_module(path, f"opforge_custom_{path.stem}")
        else:
            mod = importlib.import_module(mod_part)
    except InputError:
        raise
    except Exception as exc:
        raise InputError("--target", f"custom module {mod_part} does not import: {type(exc).__name__}: {exc}") from None
    finally:
        for p in extra:
            sys.path.remove(p)
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise InputError("--target", f"custom module {mod_part} has no function {fn_name}")
    return fn, f"{mod_part}:{fn_name}", getattr(mod, "__file__", "") or ""


def parse_target(spec: str, case_dir: Path | None = None) -> Target:
    s = spec.strip()
    if s in LOWP:
        return Target(s, "lowp", dtype=LOWP[s])
    if s == "compile":
        return Target(s, "compile")
    if s == "cuda" or s.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise InputError("--target", f"{s}: no CUDA (or ROCm) device is available on this machine")
        return Target(s, "device", device=s)
    if s == "npu" or s.startswith("npu:"):
        if not _npu_available():
            raise InputError("--target", f"{s}: no Ascend NPU is available (torch_npu is not installed "
                                         "or finds no device)")
        return Target(s, "device", device=s)
    if s.startswith("custom:"):
        fn, name, file = _load_custom(s[len("custom:"):], case_dir)
        return Target(s, "custom", impl=fn, impl_name=name, impl_file=file)
    raise InputError("--target", f"unknown target {s!r} (expected cuda, npu, compile, half, bf16 or "
                                 "custom:module:function)")


def _cast(obj, dtype):
    """Floating tensors, and the floating parameters and buffers of modules, to `dtype`."""
    def one(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(dtype)
        if isinstance(x, torch.nn.Module):
            return copy.deepcopy(x).to(dtype)
        return x
    return tree_map(one, obj)


def _to_device(obj, device):
    def one(x):
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, torch.nn.Module):
            return copy.deepcopy(x).to(device)
        return x
    return tree_map(one, obj)


def _fresh(obj):
    """A private copy for one call: a program that writes its inputs, or a module that updates its buffers,
    must not leak into the next run."""
    def one(x):
        if isinstance(x, torch.Tensor):
            return x.detach().clone().requires_grad_(x.requires_grad)
        if isinstance(x, torch.nn.Module):
            return copy.deepcopy(x)
        return x
    return tree_map(one, obj)


@dataclass
class Program:
    """A callable with its arguments, ready to run (a fresh copy of the inputs each time)."""
    side: str        # dut | ref | ref64
    fn: Callable
    args: tuple
    kwargs: dict
    device: str
    traceable: bool = True  # False for compiled code: under a dispatch mode Dynamo runs it eagerly

    def call(self):
        args, kwargs = _fresh((self.args, self.kwargs))
        return self.fn(*args, **kwargs)


def programs(case, target: Target, args: tuple, kwargs: dict) -> dict[str, Program]:
    """The device under test, the CPU reference at the case's own dtype, and the float64 reference."""
    if case.is_test:
        def with_params(device, dtype):
            kw = {}
            if "device" in case.pytest_params:
                kw["device"] = device
            if "dtype" in case.pytest_params:
                kw["dtype"] = dtype
            return kw
        base = torch.float32
        dut_dtype = target.dtype or base
        dut_device = target.device
        dut_fn = torch.compile(case.fn) if target.kind == "compile" else (
            target.impl if target.kind == "custom" else case.fn)
        return {"dut": Program("dut", dut_fn, (), with_params(dut_device, dut_dtype), dut_device,
                               traceable=target.kind != "compile"),
                "ref": Program("ref", case.fn, (), with_params("cpu", base), "cpu"),
                "ref64": Program("ref64", case.fn, (), with_params("cpu", torch.float64), "cpu")}
    ref = Program("ref", case.fn, args, kwargs, "cpu")
    ref64 = Program("ref64", case.fn, *_cast((args, kwargs), torch.float64), "cpu")
    if target.kind == "lowp":
        dut = Program("dut", case.fn, *_cast((args, kwargs), target.dtype), "cpu")
    elif target.kind == "device":
        dut = Program("dut", case.fn, *_to_device((args, kwargs), target.device), target.device)
    elif target.kind == "compile":
        dut = Program("dut", torch.compile(case.fn), args, kwargs, "cpu", traceable=False)
    else:
        dut = Program("dut", target.impl, args, kwargs, "cpu")
    return {"dut": dut, "ref": ref, "ref64": ref64}
