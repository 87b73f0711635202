"""A custom operator (a schema and a PyTorch reference for its math) adapted into an opdev tree.

The reference is the only source of the math: its forward and its autograd backward are traced to ATen and
written as two vendor kernels (vendor/custom/<Name>.cpp), called by the operator's kernel and by a
`<name>_backward` operator. Files:

  custom_functions.yaml               both schemas (the build defines them and registers their kernels)
  vendor/custom/<Name>.h, .cpp        the vendor kernels, from the traced reference
  ops/<Name>KernelOpdev.cpp           checks, output allocation, vendor calls
  python/<ns>_<name>.py               Meta (fake) functions and autograd registration
  derivatives.yaml                    which inputs get gradients, through which backward operator
  schema.json, tests/, docs/, adaptations/<ns>.<name>/CHECKLIST.md  as for ATen operators
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from opforge.backend import vendor
from opforge.backend.cpp import CppBuffer
from opforge.backend.custom_ops import CUSTOM_YAML, parse_schema, signature
from opforge.errors import InputError
from opforge.skills.op_adapt import fx_cpp, texts
from opforge.skills.op_adapt.checklist import (
    _CPP_DTYPE,
    FLOATS,
    Argument,
    Checklist,
    Constraint,
    class_name_of,
    markdown,
)
from opforge.workspace import load_module
from opforge.workspace.patch import Patch


def load_reference(spec: str | None):
    """`FILE:FN` -> (the function, the file)."""
    if not spec or ":" not in spec:
        raise InputError("--reference", "a custom operator needs its PyTorch reference as FILE:FUNCTION")
    file, _, fn_name = spec.rpartition(":")
    path = Path(file)
    if not path.is_file():
        raise InputError("--reference", f"{file}: no such file")
    try:
        module = load_module(path, f"opforge_reference_{path.stem}")
    except Exception as exc:
        raise InputError("--reference", f"{file} does not import: {exc}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise InputError("--reference", f"{file} has no function {fn_name}")
    return fn, path


def _example_args(c: Checklist, dtype: torch.dtype, shape, base: float, requires_grad: bool = False) -> list:
    g = torch.Generator().manual_seed(0)
    args = []
    for a in c.arguments:
        if a.type == "Tensor":
            args.append(torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).requires_grad_(requires_grad))
        elif a.type == "float":
            args.append(0.731 + base)
        elif a.type == "int":
            args.append(3 + int(base * 2))
    return args


def custom_checklist(schema_text: str, reference: str | None) -> tuple[Checklist, object, Path]:
    op = parse_schema(schema_text, "OP")
    fn, ref_path = load_reference(reference)
    func = op.func
    if [str(r.type) for r in func.returns] != ["Tensor"]:
        raise InputError("OP", f"{schema_text}: only operators returning one Tensor are adapted for now")
    args = [Argument(a.name, str(a.type), a.default, a in func.arguments.flat_kwarg_only)
            for a in func.arguments.flat_non_out]
    odd = [a for a in args if a.type not in ("Tensor", "float", "int")]
    if odd:
        raise InputError("OP", f"argument {odd[0].name} has type {odd[0].type}: custom operators take Tensor, "
                               "float and int arguments for now")
    tensors = [a.name for a in args if a.is_tensor]
    if not tensors:
        raise InputError("OP", "a custom operator needs a Tensor argument")
    base = func.name.name.base
    c = Checklist(op=f"{op.namespace}::{base}", kind="custom", schema=f"{op.namespace}::{op.schema}", name=base,
                  overload="", class_name=class_name_of(base), arguments=args, returns="Tensor", dtypes=[],
                  dtype_sources={}, output={"size": "same", "dtype": "self", "inputs": tensors}, constraints=[],
                  backward={}, vendor_kernel=f"vk{class_name_of(base)}", opinfo=None)
    # dtypes: those the reference runs in, giving a result shaped and typed like its first input
    runs = []
    for d in FLOATS:
        dtype = getattr(torch, d)
        try:
            out = fn(*_example_args(c, dtype, (4, 8), 0.0))
        except Exception:
            continue
        if isinstance(out, torch.Tensor) and out.shape == (4, 8) and out.dtype == dtype:
            runs.append(d)
    if not runs:
        raise InputError("--reference", "the reference gives no result shaped and typed like its first input for "
                                        "any float dtype")
    c.dtypes, c.dtype_sources = runs, {"reference": runs}
    for t in tensors:
        c.constraints.append(Constraint(
            id=f"dtype_{t}", text=texts.DTYPE_RULE.format(tensor=t, dtypes=", ".join(runs)),
            cpp=f"op_api::dtype_in({t}, {{{', '.join('at::k' + _CPP_DTYPE[d] for d in runs)}}})",
            meta=f"{t}.dtype in ({', '.join('torch.' + d for d in runs)},)",
            message=f"{base}: {t} must have dtype in [{' '.join(runs)}] on opdev"))
    if len(tensors) > 1:
        first = tensors[0]
        c.constraints.append(Constraint(
            id="same_shape", text=texts.SAME_SHAPE_RULE.format(tensors=", ".join(tensors)),
            cpp=" && ".join(f"{t}.sizes() == {first}.sizes()" for t in tensors[1:]),
            meta=" and ".join(f"{t}.shape == {first}.shape" for t in tensors[1:]),
            message=f"{base}: {', '.join(tensors)} must have the same shape"))
    grads = _differentiable(fn, c)
    c.backward = {"source": texts.TRACED, "differentiable": grads,
                  "formulas": {t: f"{base}_backward(grad, {', '.join(a.name for a in args)})[{i}]"
                               for i, t in enumerate(grads)},
                  "ops": [], "missing": []}
    return c, fn, ref_path


def _differentiable(fn, c: Checklist) -> list[str]:
    args = _example_args(c, torch.float32, (4, 8), 0.0, requires_grad=True)
    out = fn(*args)
    if not out.requires_grad:
        return []
    tensor_args = [(a.name, v) for a, v in zip(c.arguments, args) if a.is_tensor]
    grads = torch.autograd.grad(out, [v for _, v in tensor_args], torch.ones_like(out), allow_unused=True)
    return [name for (name, _), g in zip(tensor_args, grads) if g is not None]


def _backward_schema(c: Checklist) -> str:
    ns = c.op.split("::")[0]
    params = ", ".join(f"{a.type} {a.name}" + (f"={a.default}" if a.default is not None else "")
                       for a in c.arguments)
    outs = ", ".join("Tensor" for _ in c.backward["differentiable"])
    return f"{ns}::{c.name}_backward(Tensor grad, {params}) -> ({outs})" if len(c.backward["differentiable"]) > 1 \
        else f"{ns}::{c.name}_backward(Tensor grad, {params}) -> Tensor"


def _vendor_kernel(name: str, c: Checklist, graphs, params: list[str], outs: list[str], inputs: list[str]) -> str:
    """One extern "C" vendor kernel over the traced graph."""
    scalars = {i: a.name for i, a in enumerate(c.arguments) if not a.is_tensor}
    body = fx_cpp.emit_body(graphs, params, {i + (len(params) - len(c.arguments)): n for i, n in scalars.items()},
                            outs, f"--reference ({name})")
    scalar_decl = {a.name: ("double" if a.type == "float" else "int64_t") for a in c.arguments if not a.is_tensor}
    sig_params = [f"{scalar_decl[p]} {p}" if p in scalar_decl else f"const vkTensor* {p}" for p in inputs]
    sig_params += [f"const vkTensor* {o}" for o in outs]
    buf = CppBuffer()
    dtypes = ", ".join(vendor.DTYPES[d] for d in c.dtypes)
    tensor_inputs = [p for p in inputs if p not in scalar_decl]
    with buf.block(f'extern "C" vkStatus {name}({", ".join(sig_params)})'):
        buf.line(f'vkStatus dtypes_ok = vk::check_dtypes("{name}", {{{", ".join(tensor_inputs)}}}, {{{dtypes}}});')
        with buf.block("if (dtypes_ok != VK_SUCCESS)"):
            buf.line("return dtypes_ok;")
        with buf.block(f'return vk::guarded("{name}", [&]', "});"):
            for p in tensor_inputs:
                buf.line(f"at::Tensor {p}_host = vk::host({p});")
            for ln in body:
                buf.line(ln)
    return buf.text(), ", ".join(sig_params)


def plan(c: Checklist, fn, ref_path: Path, patch: Patch, test_source: str, doc_source: str) -> None:
    ns = c.op.split("::")[0]
    tensors = c.tensor_inputs
    names = [a.name for a in c.arguments]
    existing = patch.current(CUSTOM_YAML) or ""
    if re.search(rf"func: {re.escape(ns)}::{re.escape(c.name)}\(", existing):
        raise InputError(c.op, f"is already in {patch.root / CUSTOM_YAML}: adapt a change to it with --modify")
    bwd_schema = _backward_schema(c)
    grads = c.backward["differentiable"]
    # forward and backward traced from the reference
    fwd_graphs = fx_cpp.trace(fn, lambda shape, base: _example_args(c, torch.float32, shape, base), "--reference")

    def fwd_bwd(grad, *args):
        out = fn(*args)
        wanted = [a for a, arg in zip(args, c.arguments) if arg.name in grads]
        return torch.autograd.grad(out, wanted, grad)

    def bwd_args(shape, base):
        args = _example_args(c, torch.float32, shape, base, requires_grad=True)
        return [torch.randn(shape), *args]

    bwd_graphs = fx_cpp.trace(fwd_bwd, bwd_args, "--reference") if grads else None
    fwd_c, fwd_sig = _vendor_kernel(c.vendor_kernel, c, fwd_graphs, [f"{n}_host" if n in tensors else n
                                                                     for n in names], ["out"], names)
    header = CppBuffer()
    header.line(f"// Vendor kernels of {c.op}, written by opforge op-adapt from the traced reference")
    header.line(f"// ({ref_path.name}). The library's C interface: descriptors in, status out.")
    header.line("#pragma once")
    header.line()
    header.line('#include "vendor/vk.h"')
    header.line()
    header.line(f'extern "C" vkStatus {c.vendor_kernel}({fwd_sig});')
    source = CppBuffer()
    source.line(f"// {c.op}: the reference's forward" + (" and backward" if grads else "") + ", traced to ATen.")
    source.line('#include "vendor/vk_core.h"')
    source.line(f'#include "vendor/custom/{c.class_name}.h"')
    source.line()
    kernels = [fwd_c]
    if grads:
        bwd_c, bwd_sig = _vendor_kernel(f"{c.vendor_kernel}Backward", c, bwd_graphs,
                                        ["grad_host"] + [f"{n}_host" if n in tensors else n for n in names],
                                        [f"grad_{g}" for g in grads], ["grad"] + names)
        header.line(f'extern "C" vkStatus {c.vendor_kernel}Backward({bwd_sig});')
        kernels.append(bwd_c)
    for op_name in sorted(set(re.findall(r"at::(\w+)\(", "".join(kernels)))):
        source.line(f"#include <ATen/ops/{op_name}.h>")
    for k in kernels:
        source.line()
        source.lines(k)
    patch.write(f"vendor/custom/{c.class_name}.h", header.text())
    patch.write(f"vendor/custom/{c.class_name}.cpp", source.text())
    # registration
    entry = f"- func: {c.schema}\n" + (f"- func: {bwd_schema}\n" if grads else "")
    patch.write(CUSTOM_YAML, (existing or "# Custom operators of this tree (see opforge.backend.custom_ops).\n")
                + entry)
    patch.write(f"ops/{c.class_name}KernelOpdev.cpp", _kernel_source(c, bwd_schema if grads else None))
    patch.write(f"python/{ns}_{c.name}.py", _python_source(c, bwd_schema if grads else None))
    if grads:
        derivs = patch.current("derivatives.yaml") or "# Backward formulas of this tree's custom operators.\n"
        params = ", ".join(a.name for a in c.arguments)
        patch.write("derivatives.yaml", derivs + f"- name: {c.schema.split('::', 1)[1]}\n"
                    f"  {', '.join(grads)}: {c.name}_backward(grad, {params})\n")
    baseline = json.loads(patch.current("schema.json") or "{}")
    baseline[c.op] = c.schema
    if grads:
        baseline[f"{ns}::{c.name}_backward"] = bwd_schema
    patch.write("schema.json", json.dumps(dict(sorted(baseline.items())), indent=2) + "\n")
    test_file = f"tests/test_{ns}_{c.name}_opdev.py"
    patch.write(test_file, test_source)
    patch.write(f"tests/reference_{ns}_{c.name}.py", ref_path.read_text())
    if patch.current("tests/conftest.py") is None:
        from opforge.skills.op_adapt.reference import CONFTEST

        patch.write("tests/conftest.py", CONFTEST)
    patch.write(f"docs/{ns}.{c.name}.md", doc_source)
    c.files = [{"path": CUSTOM_YAML, "class": "registration yaml", "action": "add the schemas"},
               {"path": f"ops/{c.class_name}KernelOpdev.cpp", "class": "C++ kernel",
                "action": "create: checks, output allocation, vendor calls"},
               {"path": f"vendor/custom/{c.class_name}.cpp", "class": "vendor kernel",
                "action": "create: the traced reference"},
               {"path": f"python/{ns}_{c.name}.py", "class": "Meta registration", "action": "create: fake, autograd"},
               {"path": "derivatives.yaml", "class": "derivatives", "action": "add the backward" if grads else
                "none: no input gets a gradient"},
               {"path": "schema.json", "class": "schema baseline", "action": "add the schemas"},
               {"path": test_file, "class": "test (op-test)", "action": "create"},
               {"path": f"docs/{ns}.{c.name}.md", "class": "API doc (op-apidoc)", "action": "create"},
               {"path": f"adaptations/{ns}.{c.name}/CHECKLIST.md", "class": "checklist", "action": "create"}]
    patch.write(f"adaptations/{ns}.{c.name}/CHECKLIST.md", markdown(c))
    patch.write(f"adaptations/{ns}.{c.name}/checklist.json", json.dumps(c.to_json(), indent=2) + "\n")


def _kernel_source(c: Checklist, bwd_schema: str | None) -> str:
    op = parse_schema(c.schema, "OP")
    sig = signature(op)
    names = [a.name for a in sig.arguments()]
    first = c.tensor_inputs[0]
    buf = CppBuffer()
    buf.line(f"// {c.op} on opdev: adapted by opforge op-adapt from adaptations/{c.op.replace('::', '.')}/"
             "CHECKLIST.md.")
    buf.line('#include "ops/OpApi.h"')
    buf.line(f'#include "vendor/custom/{c.class_name}.h"')
    buf.line()
    buf.line('#include "CustomNativeFunctions.h"')
    buf.line()
    with buf.block("namespace opdev::custom", "} // namespace opdev::custom", indent=False):
        buf.line()
        with buf.block(sig.defn(name=c.name)):
            for r in c.constraints:
                buf.line(f'TORCH_CHECK({r.cpp}, "{r.message}");')
            buf.line(f"at::Tensor out = op_api::empty({first}.sizes(), {first}.scalar_type(), {first});")
            buf.line(f"EXEC_OPDEV_CMD({c.vendor_kernel}, {', '.join(names)}, out);")
            buf.line("return out;")
        if bwd_schema:
            bop = parse_schema(bwd_schema, "OP")
            bsig = signature(bop)
            grads = c.backward["differentiable"]
            buf.line()
            with buf.block(bsig.defn(name=f"{c.name}_backward")):
                for g in grads:
                    buf.line(f"at::Tensor grad_{g} = op_api::empty({g}.sizes(), {g}.scalar_type(), {g});")
                outs = ", ".join(f"grad_{g}" for g in grads)
                buf.line(f"EXEC_OPDEV_CMD({c.vendor_kernel}Backward, grad, {', '.join(names)}, {outs});")
                buf.line(f"return {{{outs}}};" if len(grads) > 1 else f"return {outs};")
        buf.line()
    return buf.text()


def _python_source(c: Checklist, bwd_schema: str | None) -> str:
    ns = c.op.split("::")[0]
    params = ", ".join(a.name + (f"={_py_default(a.default)}" if a.default is not None else "")
                       for a in c.arguments)
    first = c.tensor_inputs[0]
    grads = c.backward["differentiable"]
    lines = [f'"""{c.op} on opdev: its Meta (fake) function' + (" and autograd" if grads else "")
             + f", from adaptations/{ns}.{c.name}/CHECKLIST.md."
             + '"""', "import torch", "",
             f"DTYPES = ({', '.join('torch.' + d for d in c.dtypes)},)  # CHECKLIST: dtypes", "", "",
             f'@torch.library.register_fake("{ns}::{c.name}")',
             f"def {c.name}_meta({params}):"]
    for r in c.constraints:
        meta = r.meta.replace(f"({', '.join('torch.' + d for d in c.dtypes)},)", "DTYPES")
        lines.append(f"    torch._check({meta}, lambda: {r.message!r})")
    lines.append(f"    return {first}.new_empty({first}.shape)")
    if bwd_schema:
        outs = ", ".join(f"{g}.new_empty({g}.shape)" for g in grads)
        lines += ["", "", f'@torch.library.register_fake("{ns}::{c.name}_backward")',
                  f"def {c.name}_backward_meta(grad, {params}):", f"    return {outs}", "", "",
                  "def _setup_context(ctx, inputs, output):",
                  f"    {', '.join(a.name for a in c.arguments)}, = inputs",
                  f"    ctx.save_for_backward({', '.join(c.tensor_inputs)})"]
        lines += [f"    ctx.{a.name} = {a.name}" for a in c.arguments if not a.is_tensor]
        lines += ["", "", "def _backward(ctx, grad):",
                  f"    {', '.join(c.tensor_inputs)}, = ctx.saved_tensors",
                  f"    grads = torch.ops.{ns}.{c.name}_backward(grad, "
                  + ", ".join(a.name if a.is_tensor else f"ctx.{a.name}" for a in c.arguments) + ")"]
        if len(grads) == 1:
            lines.append("    grads = (grads,)")
        lines.append("    by_name = dict(zip(" + repr(tuple(grads)) + ", grads))")
        lines.append("    return " + ", ".join(f"by_name.get({a.name!r})" for a in c.arguments)
                     + ("," if len(c.arguments) == 1 else ""))
        lines += ["", "", f'torch.library.register_autograd("{ns}::{c.name}", _backward, '
                  "setup_context=_setup_context)"]
    return "\n".join(lines) + "\n"


def _py_default(default: str) -> str:
    return {"True": "True", "False": "False", "None": "None"}.get(default, default)
