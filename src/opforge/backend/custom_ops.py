"""Custom operators of an opdev tree (custom_functions.yaml): their schemas defined with the dispatcher and their
kernels registered to PrivateUse1, the way torchgen registers the ATen ones.

    - func: myops::scaled_silu(Tensor x, Tensor w, float alpha=1.0) -> Tensor

Each operator's kernel is `opdev::custom::<name>` (declared in the generated CustomNativeFunctions.h) with the C++
signature torchgen gives the schema; its Python side (Meta function, autograd) lives in python/<ns>_<name>.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from opforge.backend.cpp import CppBuffer
from opforge.errors import InputError

CUSTOM_YAML = "custom_functions.yaml"


@dataclass(frozen=True)
class CustomOp:
    namespace: str
    schema: str  # without the namespace: "scaled_silu(Tensor x, ...) -> Tensor"

    @property
    def func(self):
        from torchgen.model import FunctionSchema

        return FunctionSchema.parse(self.schema)

    @property
    def name(self) -> str:
        return str(self.func.name)

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.schema}"


def parse_schema(text: str, where: str) -> CustomOp:
    """`ns::name(args) -> returns`, checked by torchgen's parser; an InputError naming `where` otherwise."""
    from torchgen.model import FunctionSchema

    ns, sep, rest = text.strip().partition("::")
    if not sep or not ns.isidentifier():
        raise InputError(where, f"{text!r} is not a schema `namespace::name(arguments) -> returns`")
    try:
        FunctionSchema.parse(rest)
    except Exception as exc:  # torchgen raises AssertionError or AttributeError on malformed text
        raise InputError(where, f"{text!r} is not a valid schema: {exc or type(exc).__name__}") from None
    return CustomOp(ns, rest)


def load(root: Path) -> list[CustomOp]:
    path = Path(root) / CUSTOM_YAML
    if not path.is_file():
        return []
    data = yaml.safe_load(path.read_text()) or []
    if not isinstance(data, list):
        raise InputError(str(path), "must be a list of `- func: ns::schema` entries")
    return [parse_schema(str(entry.get("func", "")) if isinstance(entry, dict) else "", f"{path}: entry {i + 1}")
            for i, entry in enumerate(data)]


def signature(op: CustomOp):
    from torchgen.api.types import NativeSignature

    return NativeSignature(op.func, symint=False)


def emit_header(ops: list[CustomOp]) -> str:
    buf = CppBuffer()
    buf.lines("""
// Generated from custom_functions.yaml: the custom operators' kernels. Do not edit.
#pragma once

#include <ATen/Tensor.h>
""")
    with buf.block("namespace opdev::custom", "} // namespace opdev::custom", indent=False):
        for op in ops:
            buf.line(f"{signature(op).decl(name=op.func.name.name.base)};")
    return buf.text()


def emit_registrations(ops: list[CustomOp]) -> str:
    buf = CppBuffer()
    buf.lines("""
// Generated from custom_functions.yaml: schemas defined with the dispatcher, kernels registered to PrivateUse1.
#include <torch/library.h>

#include "CustomNativeFunctions.h"
""")
    for ns in sorted({op.namespace for op in ops}):
        buf.line()
        with buf.block(f"TORCH_LIBRARY_FRAGMENT({ns}, m)", "}"):
            for op in ops:
                if op.namespace == ns:
                    buf.line(f'm.def("{op.schema}");')
        buf.line()
        with buf.block(f"TORCH_LIBRARY_IMPL({ns}, PrivateUse1, m)", "}"):
            for op in ops:
                if op.namespace == ns:
                    base = op.func.name.name.base
                    buf.line(f'm.impl("{op.name}", TORCH_FN(opdev::custom::{base}));')
    return buf.text()
