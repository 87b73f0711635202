"""The vendor kernel library's table (native/vendor/kernels.yaml) and the C++ it is built from.

Each kernel computes one ATen out= overload. Its C signature follows the overload's schema, one
parameter per argument in schema order; the types below are the whole vocabulary a kernel may use.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from opforge.backend.cpp import CppBuffer, native_functions, out_overloads
from opforge.errors import InputError

NATIVE = Path(__file__).parent / "native"
KERNELS_YAML = NATIVE / "vendor" / "kernels.yaml"

DTYPES = {  # dtype name in kernels.yaml -> vkDataType
    "float32": "VK_DT_FLOAT", "float16": "VK_DT_FLOAT16", "bfloat16": "VK_DT_BFLOAT16",
    "float64": "VK_DT_DOUBLE", "int8": "VK_DT_INT8", "uint8": "VK_DT_UINT8", "int16": "VK_DT_INT16",
    "int32": "VK_DT_INT32", "int64": "VK_DT_INT64", "bool": "VK_DT_BOOL",
    "complex64": "VK_DT_COMPLEX64", "complex128": "VK_DT_COMPLEX128",
}

# schema type -> (C parameter type, expression that turns the parameter into the ATen argument)
PARAM_TYPES = {
    "Tensor": ("const vkTensor*", "vk::host({n})"),
    "Tensor?": ("const vkTensor*", "vk::host_opt({n})"),
    "Scalar": ("vkScalar", "vk::scalar({n})"),
    "Scalar?": ("const vkScalar*", "vk::scalar_opt({n})"),
    "int": ("int64_t", "{n}"),
    "int?": ("const int64_t*", "vk::opt({n})"),
    "float": ("double", "{n}"),
    "float?": ("const double*", "vk::opt({n})"),
    "bool": ("bool", "{n}"),
    "bool?": ("const bool*", "vk::opt({n})"),
    "int[]": ("vkIntArray", "vk::ints({n})"),
    "int[]?": ("const vkIntArray*", "vk::ints_opt({n})"),
    "ScalarType": ("int32_t", "vk::to_scalar_type({n})"),
    "ScalarType?": ("const int32_t*", "vk::dtype_opt({n})"),
    "str": ("const char*", "c10::string_view({n})"),
    "str?": ("const char*", "vk::str_opt({n})"),
}


def schema_type(arg) -> str:
    """The vocabulary key of a torchgen Argument: `Tensor(a!)` is "Tensor", `SymInt[1]?` is "int[]?"."""
    text = str(arg.type).replace("SymInt", "int")
    optional = text.endswith("?")
    base = text.rstrip("?")
    if base.endswith("]"):
        base = base[: base.index("[")] + "[]"
    return base + ("?" if optional else "")


@dataclass(frozen=True)
class Param:
    name: str
    schema_type: str
    c_type: str
    is_out: bool


@dataclass(frozen=True)
class Kernel:
    name: str  # vkCopysign
    aten: str  # copysign.out
    dtypes: tuple[str, ...]
    params: tuple[Param, ...]
    cpp_call: str  # at::copysign_outf
    header: str  # ATen/ops/copysign.h

    @property
    def inputs(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if not p.is_out)

    def c_signature(self) -> str:
        args = ", ".join(f"{p.c_type} {p.name}" for p in self.params)
        return f"vkStatus {self.name}({args})"


def _kernel(path: Path, name: str, entry) -> Kernel:
    from torchgen.api import cpp

    where = f"{path}: kernels.{name}"
    if not isinstance(entry, dict):
        raise InputError(where, "must be a mapping with `aten` and `dtypes`")
    aten = entry.get("aten")
    f = native_functions().get(str(aten))
    if f is None:
        raise InputError(where, f"aten::{aten} is not an ATen overload")
    if not f.func.is_out_fn():
        raise InputError(where, f"aten::{aten} is not an out= overload")
    dtypes = entry.get("dtypes")
    if not isinstance(dtypes, list) or not dtypes or any(d not in DTYPES for d in dtypes):
        raise InputError(where, f"dtypes must be a list of {', '.join(DTYPES)}")
    outs = {a.name for a in f.func.arguments.out}
    params = []
    for a in f.func.arguments.flat_all:
        key = schema_type(a)
        if key not in PARAM_TYPES:
            raise InputError(where, f"argument {a.name} has type {a.type}, which the vendor interface cannot carry")
        params.append(Param(a.name, key, PARAM_TYPES[key][0], a.name in outs))
    return Kernel(name, aten, tuple(entry["dtypes"]), tuple(params),
                  f"at::{cpp.name(f.func, faithful_name_for_out_overloads=True)}",
                  f"ATen/ops/{f.root_name}.h")


def load_kernels(path: Path = KERNELS_YAML) -> dict[str, Kernel]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(str(path), f"cannot read the vendor kernel table: {exc}") from None
    kernels = data.get("kernels") if isinstance(data, dict) else None
    if not isinstance(kernels, dict):
        raise InputError(str(path), "needs a `kernels` mapping of vk names to {aten, dtypes}")
    return {name: _kernel(path, name, entry) for name, entry in kernels.items()}


def kernel_for(aten_overload: str, kernels: dict[str, Kernel]) -> Kernel | None:
    """The vendor kernel that computes `aten_overload` (or its out= form), if the library has one."""
    out = out_overloads().get(aten_overload, aten_overload)
    return next((k for k in kernels.values() if k.aten == out), None)


def emit_header(kernels: dict[str, Kernel]) -> str:
    buf = CppBuffer()
    buf.lines("""
// Generated from vendor/kernels.yaml: the vendor library's kernels. Do not edit.
#pragma once

#include "vendor/vk.h"
""")
    with buf.block('extern "C"', '} // extern "C"'):
        for k in kernels.values():
            buf.line(f"// aten::{k.aten}; dtypes: {', '.join(k.dtypes)}")
            buf.line(f"{k.c_signature()};")
    return buf.text()


def emit_source(kernels: dict[str, Kernel]) -> str:
    buf = CppBuffer()
    buf.line("// Generated from vendor/kernels.yaml: each kernel runs its ATen out= overload on")
    buf.line("// host aliases of the descriptors' memory. Do not edit.")
    buf.line('#include "vendor/vk_core.h"')
    buf.line('#include "vk_kernels.h"')
    buf.line()
    for header in sorted({k.header for k in kernels.values()}):
        buf.line(f"#include <{header}>")
    for k in kernels.values():
        buf.line()
        with buf.block(f'extern "C" {k.c_signature()}'):
            tensors = ", ".join(p.name for p in k.inputs if p.schema_type.startswith("Tensor"))
            dtypes = ", ".join(DTYPES[d] for d in k.dtypes)
            buf.line(f'vkStatus dtypes_ok = vk::check_dtypes("{k.name}", {{{tensors}}}, {{{dtypes}}});')
            with buf.block("if (dtypes_ok != VK_SUCCESS)"):
                buf.line("return dtypes_ok;")
            with buf.block(f'return vk::guarded("{k.name}", [&]', "});"):
                args = []
                for p in k.params:
                    expr = PARAM_TYPES[p.schema_type][1].format(n=p.name)
                    if p.schema_type == "Tensor":  # out= calls take tensors by non-const reference
                        buf.line(f"at::Tensor {p.name}_host = {expr};")
                        expr = f"{p.name}_host"
                    args.append(expr)
                buf.line(f"{k.cpp_call}({', '.join(args)});")
    return buf.text()
