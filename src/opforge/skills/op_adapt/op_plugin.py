"""The op-plugin profile: an ATen operator adapted into a checkout of Ascend's op-plugin (torch_npu's operator
layer), in that project's own layout, with every parameter read from the CHECKLIST.

The layout is the one of Ascend/op-plugin (its tree and op_plugin/config/README.md) and of the torch-npu wheel:

  op_plugin/config/op_plugin_functions.yaml   the functional overload and its out= and in-place siblings, added
                                              to `official:` in name order with `op_api: all_version` (upstream
                                              registers the whole group; each gets its own C++ function)
  op_plugin/ops/opapi/<Name>KernelNpuOpApi.cpp namespace op_api: the CHECKLIST's TORCH_CHECKs, the output through
                                              an op_infer size helper and OpPreparation::apply_tensor_without_format
                                              (out=: check_tensor), then EXEC_NPU_CMD(aclnn<Name>, ...); the
                                              in-place form calls the out= one with self as the output
  op_plugin/utils/KernelNpuOutputSize.h/.cpp  the op_infer size helper, added only when the checkout lacks it
  op_plugin/utils/KernelNpuOutputDtype.h/.cpp the op_infer dtype helper (output rule "meta" only), likewise
  test/test_base_ops/test_<name>.py           torch_npu's TestCase: every CHECKLIST dtype on the NPU against the
                                              CPU, the out= and in-place forms, and each dtype refusal
  test/core_tests/test_fake_tensor.py         a Test<Name>Meta class: FakeTensor results on "npu" against ATen's
                                              meta kernel
  test/core_tests/torch_npu_OpApi_schema_all.json  the schema baseline: `"func: <schema>": {"version": [...]}`
  docs/zh/native_APIs/torch-<overload>.md     the Chinese API page. Upstream documents only torch_npu's own APIs
                                              (docs/zh/custom_APIs/, and codegen/templates/_op_plugin_docs.py
                                              through _add_torch_npu_docstr); an ATen operator keeps torch's name,
                                              so its page goes to a folder of its own
  op_plugin/config/adaptations/<overload>/    CHECKLIST.md and checklist.json

For an ATen operator torch already has the Meta function and the derivative, so op_plugin/python/meta/
_meta_registrations.py and op_plugin/config/derivatives.yaml are left alone (recorded as such in the CHECKLIST).

The vendor library of op-plugin is CANN's aclnn: the kernel is aclnn<ClassName>. Its parameters and dtypes are
read from the opdev vendor table (native/vendor/kernels.yaml), which follows the same out= schemas; they are not
checked against CANN's own documentation here.

op-plugin cannot be built on this machine, so what can be checked is checked before anything is written: each
yaml entry parses with torchgen's FunctionSchema.parse, and each C++ definition in the kernel file has the
signature torchgen's NativeSignature gives for the schema written in the yaml. The patch lands whole or not at
all.

Not written yet (each refused with one line, nothing written): an overload already in the yaml (any of its group),
a kernel, test or doc file that exists already (another overload of the same operator goes into its file by
hand), schemas with SymInt arguments (op-plugin's `symint:` section and `_symint` kernels), custom operators.
The CHECKLIST's backward operators are checked against the overloads the checkout's yaml registers.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

from opforge.backend import build, vendor
from opforge.backend.cpp import CppBuffer, functional_overloads, native_functions, out_overloads
from opforge.errors import InputError
from opforge.skills.op_adapt.adapt import Result
from opforge.skills.op_adapt.checklist import TORCH_DTYPES, Checklist, Conflict, aten_checklist, markdown
from opforge.workspace.patch import Patch

YAML = "op_plugin/config/op_plugin_functions.yaml"
OPAPI = "op_plugin/ops/opapi"
SIZE_H = "op_plugin/utils/KernelNpuOutputSize.h"
SIZE_CPP = "op_plugin/utils/KernelNpuOutputSize.cpp"
DTYPE_H = "op_plugin/utils/KernelNpuOutputDtype.h"
DTYPE_CPP = "op_plugin/utils/KernelNpuOutputDtype.cpp"
SCHEMA_BASELINE = "test/core_tests/torch_npu_OpApi_schema_all.json"
FAKE_TENSOR_TEST = "test/core_tests/test_fake_tensor.py"
META = "op_plugin/python/meta/_meta_registrations.py"
DERIVATIVES = "op_plugin/config/derivatives.yaml"
VERSION = "all_version"

_CPP_DTYPE = {"float32": "at::kFloat", "float64": "at::kDouble", "float16": "at::kHalf",
              "bfloat16": "at::kBFloat16", "int8": "at::kChar", "uint8": "at::kByte", "int16": "at::kShort",
              "int32": "at::kInt", "int64": "at::kLong", "bool": "at::kBool"}


def is_op_plugin_checkout(repo: Path | None) -> bool:
    return repo is not None and (Path(repo) / YAML).is_file()


def _root(repo: Path | None) -> Path:
    if repo is None:
        raise InputError("--repo", "the op-plugin profile needs --repo PATH, an op-plugin checkout")
    if not is_op_plugin_checkout(repo):
        raise InputError(str(repo), f"not an op-plugin checkout (no {YAML})")
    return Path(repo).resolve()


# ---------------------------------------------------------------------------------------------------------------
# the registration yaml


def _load_yaml(text: str, where: str):
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader) or {}
    except yaml.YAMLError as exc:
        raise InputError(where, f"is not valid YAML: {' '.join(str(exc).split())}") from None


def registered(patch: Patch) -> dict[str, str]:
    """Every overload the checkout's yaml registers, with its section ("hypot.out" -> "official")."""
    data = _load_yaml(patch.current(YAML) or "", str(patch.root / YAML))
    out: dict[str, str] = {}
    for section, entries in (data.items() if isinstance(data, dict) else []):
        for e in entries if isinstance(entries, list) else []:
            if isinstance(e, dict) and isinstance(e.get("func"), str):
                out.setdefault(e["func"].split("(")[0].strip(), section)
    return out


def group(overload: str) -> list:
    """The functional overload's NativeFunctions to register: itself, its out= form, its in-place forms."""
    fns = native_functions()
    members = [fns[overload]]
    out = out_overloads().get(overload)
    if out is not None and out != overload:
        members.append(fns[out])
        members += [fns[k] for k, v in functional_overloads().items()
                    if v == overload and fns[k].func.name.name.inplace]
    return members


def _entries(text: str, section: str) -> tuple[int, int, str, list[tuple[int, str]]]:
    """(start, end, indent, [(offset, overload)]) of `section:`'s body in the yaml text."""
    m = re.search(rf"^{section}:[ \t]*(#.*)?$", text, flags=re.M)
    if m is None:
        raise InputError(YAML, f"has no top-level `{section}:` section")
    start = m.end() + 1
    nxt = re.search(r"^[^\s#-][^\n]*:", text[start:], flags=re.M)
    end = start + nxt.start() if nxt else len(text)
    body = text[start:end]
    found = [(start + e.start(), e.group(2).strip()) for e in re.finditer(r"^([ \t]*)- func:\s*([^(\n]+)\(", body,
                                                                          flags=re.M)]
    indent = re.search(r"^([ \t]*)- func:", body, flags=re.M)
    return start, end, indent.group(1) if indent else "  ", found


def add_entries(text: str, section: str, funcs: list[str]) -> str:
    """`text` with `- func:` entries for `funcs` inserted into `section` at their place in name order (the first
    entry whose name sorts after the new one), the rest of the file byte for byte as it was."""
    start, end, indent, found = _entries(text, section)
    block = [f"{indent}- func: {f}\n{indent}  op_api: {VERSION}\n" for f in funcs]
    first = funcs[0].split("(")[0]
    after = next((off for off, name in found if name > first), None)
    if after is not None:
        return text[:after] + "\n".join(block) + "\n" + text[after:]
    body_end = start + len(text[start:end].rstrip())
    head = text[:body_end] + ("\n" if body_end > start else "")
    sep = "\n" if found else ""
    return head + sep + "\n".join(block) + text[body_end + (1 if body_end > start else 0):]


def check_yaml(old: str, new: str, section: str, funcs: list[str]) -> None:
    """The patched yaml still loads, holds every entry it held, and the new entries sit in `section` and parse
    with torchgen's FunctionSchema.parse."""
    from torchgen.model import FunctionSchema

    before, after = _load_yaml(old, YAML), _load_yaml(new, YAML)
    entries = [e.get("func") for e in after.get(section) or [] if isinstance(e, dict)]
    for f in funcs:
        if f not in entries:
            raise InputError(YAML, f"the entry `{f}` did not land in `{section}:`")
        try:
            FunctionSchema.parse(f)
        except Exception as exc:  # torchgen raises AssertionError and others
            raise InputError(YAML, f"the entry `{f}` does not parse with torchgen: {exc}") from None
    for key, value in before.items():
        kept = after.get(key)
        if key == section:
            kept = [e for e in kept if not (isinstance(e, dict) and e.get("func") in funcs)]
        if kept != value:
            raise InputError(YAML, f"inserting the entries changed `{key}:`; nothing was written")


# ---------------------------------------------------------------------------------------------------------------
# the CHECKLIST, in op-plugin's terms


def _for_npu(c: Checklist) -> None:
    """The CHECKLIST's vendor kernel and checks as op-plugin writes them: aclnn<Name>, and TORCH_CHECK conditions
    over the kernel file's own helpers (dtype_in, broadcastable) instead of opdev's."""
    c.vendor_kernel = f"aclnn{c.class_name}"
    for r in c.constraints:
        if r.id.startswith("dtype_"):
            t = r.id.removeprefix("dtype_")
            r.cpp = f"dtype_in({t}, {{{', '.join(_CPP_DTYPE[d] for d in c.dtypes)}}})"
        elif r.id == "broadcast":
            r.cpp = f"broadcastable({{{', '.join(t + '.sizes()' for t in c.output['inputs'])}}})"
        else:
            raise InputError(c.op, f"the CHECKLIST constraint `{r.id}` has no op-plugin form yet")
        r.message = r.message.replace(" on opdev", " on NPU")


# ---------------------------------------------------------------------------------------------------------------
# C++


def _signature(f):
    from torchgen.api.types import NativeSignature
    from torchgen.context import native_function_manager

    with native_function_manager(f):
        sig = NativeSignature(f.func, prefix="", symint=False)
        return sig, [(a.name, a.nctype.cpp_type()) for a in sig.arguments()]


def _cpp_name(func) -> str:
    from torchgen.api import cpp

    return cpp.name(func)


def _defn(f) -> str:
    from torchgen.context import native_function_manager

    sig, _ = _signature(f)
    with native_function_manager(f):
        return sig.defn(name=_cpp_name(f.func))


def _params(f) -> str:
    return _left(", ".join(f"{t} {n}" for n, t in _signature(f)[1]))


def kernel_file(c: Checklist) -> str:
    return f"{OPAPI}/{c.class_name}KernelNpuOpApi.cpp"


def _size_call(c: Checklist, f) -> str:
    rule, tensors = c.output, c.output["inputs"]
    if rule["size"] == "broadcast":
        expr = f"op_infer::broadcast_ops_npu_output_size({tensors[0]}, {tensors[1]})"
        for t in tensors[2:]:
            expr = f"op_infer::broadcast_ops_npu_output_size({expr}, {t}.sizes())"
        return expr
    if rule["size"] == "same":
        return f"op_infer::input_same_output_size({tensors[0]})"
    return f"op_infer::{_cpp_name(f.func)}_npu_output_size({', '.join(n for n, _ in _signature(f)[1])})"


def _dtype_statements(c: Checklist, f) -> list[str]:
    """The statements that set `output_dtype` by the CHECKLIST's dtype rule."""
    rule, tensors = c.output, c.output["inputs"]
    if rule["dtype"] == "meta":
        return [f"auto output_dtype = op_infer::{_cpp_name(f.func)}_out_dtype("
                f"{', '.join(n for n, _ in _signature(f)[1])});"]
    if rule["dtype"] == "bool":
        return ["auto output_dtype = at::kBool;"]
    if len(tensors) == 1:
        promoted = f"{tensors[0]}.scalar_type()"
    elif len(tensors) == 2:
        promoted = f"at::native::result_type({tensors[0]}, {tensors[1]})"
    else:
        promoted = f"at::native::result_type({{{', '.join(tensors)}}})"
    if rule["dtype"] == "int_to_float":
        return [f"auto promoted = {promoted};",
                "auto output_dtype = at::isIntegralType(promoted, /*includeBool=*/true) ? at::kFloat : promoted;"]
    return [f"auto output_dtype = {promoted};"]


def _vendor_args(c: Checklist, functional, root: Path) -> list[str]:
    """The aclnn call's arguments: the out= schema's, in its order (the vendor table's parameters), output last."""
    kernel = vendor.kernel_for(c.overload_name, vendor.load_kernels(root / "vendor" / "kernels.yaml"))
    if kernel is None:
        raise InputError(c.op, "the vendor table has no kernel for it")
    names = {n for n, _ in _signature(functional)[1]}
    args = []
    for p in kernel.params:
        if p.is_out:
            args.append("out")
        elif p.name in names:
            args.append(p.name)
        else:
            raise InputError(c.op, f"the vendor kernel's parameter `{p.name}` is not an argument of {c.schema}")
    return args


_HELPERS = {
    "dtype_in": """
bool dtype_in(const at::Tensor& tensor, std::initializer_list<at::ScalarType> dtypes) {
  return std::find(dtypes.begin(), dtypes.end(), tensor.scalar_type()) != dtypes.end();
}
""",
    "broadcastable": """
bool broadcastable(std::initializer_list<c10::IntArrayRef> shapes) {
  size_t ndim = 0;
  for (const auto& shape : shapes) {
    ndim = std::max(ndim, shape.size());
  }
  for (size_t i = 0; i < ndim; i++) {
    int64_t size = 1;
    for (const auto& shape : shapes) {
      if (i >= shape.size() || shape[shape.size() - 1 - i] == 1) {
        continue;
      }
      if (size != 1 && size != shape[shape.size() - 1 - i]) {
        return false;
      }
      size = shape[shape.size() - 1 - i];
    }
  }
  return true;
}
""",
}

COLUMNS = 120  # op-plugin's .clang-format: ColumnLimit 120, IndentWidth 2, braces attached, `T& x`


def _left(cpp: str) -> str:
    """torchgen's `const at::Tensor & self` as op-plugin's clang-format writes it: `const at::Tensor& self`."""
    return re.sub(r"\s+([&*])\s+", r"\1 ", cpp)


def _wrapped(buf: CppBuffer, text: str, hang: int) -> None:
    """`text` on one line, or broken at commas outside string literals with `hang` spaces of continuation."""
    depth = len(buf._indent) * buf._depth
    if depth + len(text) <= COLUMNS or '"' in text:
        buf.line(text)
        return
    parts, line = text.split(", "), ""
    for i, part in enumerate(parts):
        piece = part + (", " if i < len(parts) - 1 else "")
        if line and depth + len(line) + len(piece.rstrip()) > COLUMNS:
            buf.line(line.rstrip())
            line = " " * hang
        line += piece
    buf.line(line.rstrip())


def _literals(message: str, column: int) -> list[str]:
    """`message` as C++ string literals, one per line (adjacent literals concatenate), within the column limit."""
    room, out, rest = COLUMNS - column - 3, [], message
    while len(rest) > room and " " in rest[:room]:
        cut = rest[:room].rindex(" ") + 1
        out.append(rest[:cut])
        rest = rest[cut:]
    return [json.dumps(part) for part in [*out, rest]]


def _opener(signature: str) -> str:
    """A function's signature as the opening line of its definition, its parameters broken over lines aligned
    after the parenthesis when the line would pass the column limit."""
    if len(signature) + 2 <= COLUMNS:
        return signature
    head, _, params = signature.partition("(")
    hang = len(head) + 1 if len(head) + 1 < COLUMNS // 2 else 4
    lines, line = [], head + "("
    for i, p in enumerate(params.removesuffix(")").split(", ")):
        piece = p + (", " if i < len(params.removesuffix(")").split(", ")) - 1 else ")")
        if len(line) > hang and len(line) + len(piece.rstrip()) + 2 > COLUMNS:
            lines.append(line.rstrip())
            line = " " * hang
        line += piece
    return "\n".join([*lines, line])


def kernel_source(c: Checklist, members: list, root: Path) -> str:
    functional = members[0]
    out_f = next((f for f in members if f.func.is_out_fn()), None)
    inplace = [f for f in members if f.func.name.name.inplace]
    vk = ", ".join(_vendor_args(c, functional, root))
    fname = _cpp_name(functional.func)
    checked = [(n, t) for n, t in _signature(functional)[1]
               if any(re.search(rf"\b{n}\b", r.cpp) for r in c.constraints)]
    check_call = f"check_{fname}({', '.join(n for n, _ in checked)});"
    buf = CppBuffer(indent="  ")
    buf.lines(f"""
// Licensed under the BSD 3-Clause License; see LICENSE at the root of op-plugin.
//
// {c.op} on NPU through {c.vendor_kernel}: written by opforge op-adapt from
// op_plugin/config/adaptations/{c.overload_name}/CHECKLIST.md, which holds every parameter used here
// (dtypes, checks, output rule, vendor kernel).

#include <algorithm>
#include <initializer_list>
""")
    buf.line()
    if c.output["dtype"] in ("result_type", "int_to_float"):
        buf.line("#include <ATen/native/TypeProperties.h>")
    buf.line('#include "op_plugin/OpApiInterface.h"')
    buf.line('#include "op_plugin/utils/KernelNpuOutputSize.h"')
    if c.output["dtype"] == "meta":
        buf.line('#include "op_plugin/utils/KernelNpuOutputDtype.h"')
    buf.line('#include "op_plugin/utils/op_api_common.h"')
    buf.line()
    with buf.block("namespace op_api", "} // namespace op_api", indent=False):
        buf.line("using npu_preparation = at_npu::native::OpPreparation;")
        buf.line()
        with buf.block("namespace", "} // namespace", indent=False):
            for name, text in _HELPERS.items():
                if any(r.cpp.startswith(name + "(") for r in c.constraints):
                    buf.lines(text)
                    buf.line()
            buf.line("// CHECKLIST: constraints")
            with buf.block(_opener(f"void check_{fname}({', '.join(_left(f'{t} {n}') for n, t in checked)})")):
                for r in c.constraints:
                    _wrapped(buf, f"TORCH_CHECK({r.cpp},", len("TORCH_CHECK(") + 2)
                    for literal in _literals(r.message, len(buf._indent) * buf._depth + 12):
                        buf.line(f"            {literal}")
                    buf._lines[-1] += ","
                    buf.line(f"            OPS_ERROR(ErrCode::{'TYPE' if r.id.startswith('dtype_') else 'PARAM'}));")
        buf.line()
        inputs = ", ".join(c.output["inputs"])
        if out_f is not None:
            with buf.block(_opener(_left(_defn(out_f)))):
                buf.line(check_call)
                _wrapped(buf, f"auto output_size = {_size_call(c, functional)};", 4)
                _wrapped(buf, f"npu_preparation::check_tensor({{{inputs}}}, out, out.scalar_type(), output_size);", 4)
                buf.line(f"EXEC_NPU_CMD({c.vendor_kernel}, {vk});")
                buf.line("return out;")
            buf.line()
        with buf.block(_opener(_left(_defn(functional)))):
            buf.line(check_call)
            _wrapped(buf, f"auto output_size = {_size_call(c, functional)};", 4)
            for statement in _dtype_statements(c, functional):
                _wrapped(buf, statement, 4)
            _wrapped(buf, "at::Tensor out = npu_preparation::apply_tensor_without_format(output_size, "
                          f"{c.output['inputs'][0]}.options().dtype(output_dtype));", 4)
            buf.line(f"EXEC_NPU_CMD({c.vendor_kernel}, {vk});")
            buf.line("return out;")
        for f in inplace:
            names = [n for n, _ in _signature(f)[1]]
            buf.line()
            with buf.block(_opener(_left(_defn(f)))):
                buf.line("// in place: the out= form, writing into self, which the result's shape must fit")
                _wrapped(buf, f"auto output_size = {_size_call(c, functional)};", 4)
                buf.line("TORCH_CHECK(c10::IntArrayRef(output_size) == self.sizes(),")
                buf.line(f'            "{_cpp_name(f.func)}: the result\'s shape must equal self\'s shape",')
                buf.line("            OPS_ERROR(ErrCode::PARAM));")
                buf.line(f"op_api::{_cpp_name(out_f.func)}({', '.join(names)}, self);")
                buf.line("return self;")
        buf.line()
    return buf.text()


def _normal(text: str) -> str:
    text = " ".join(text.split())
    return re.sub(r"\s*([&*<>,()])\s*", r"\1", text)


def definitions(source: str) -> dict[str, list[str]]:
    """Each namespace-level function definition in C++ `source`, by name: its normalized signature."""
    found: dict[str, list[str]] = {}
    for m in re.finditer(r"^([A-Za-z_:][\w:<>&*, ]*?[\s&*])(\w+)\(([^()]*)\)\s*\{", source, flags=re.M):
        found.setdefault(m.group(2), []).append(_normal(f"{m.group(1)}{m.group(2)}({m.group(3)})"))
    return found


def check_signatures(source: str, funcs: list[str], where: str) -> None:
    """Every schema in `funcs` (as the yaml has it) has a definition in `source` with the C++ signature torchgen's
    NativeSignature gives for it (the op_api functions op-plugin's generated OpApiInterface.h declares)."""
    from torchgen.api.types import NativeSignature
    from torchgen.context import native_function_manager
    from torchgen.model import FunctionSchema

    defined = definitions(source)
    for schema in funcs:
        func = FunctionSchema.parse(schema)
        f = native_functions().get(str(func.name))
        name = _cpp_name(func)
        if f is None:
            raise InputError(where, f"`{schema}` is not an ATen overload")
        with native_function_manager(f):
            want = _normal(NativeSignature(func, prefix="", symint=False).defn(name=name))
        have = defined.get(name, [])
        if want not in have:
            got = "; ".join(have) or "nothing"
            raise InputError(where, f"defines {got} for {name}, but `{schema}` needs `{want}`")


# ---------------------------------------------------------------------------------------------------------------
# output-size and output-dtype helpers


def _meta_body(c: Checklist, f) -> list[str]:
    lines, call = [], []
    for n, _ in _signature(f)[1]:
        arg = next(a for a in c.arguments if a.name == n)
        if arg.type == "Tensor":
            lines.append(f"  at::Tensor meta_{n} = at::empty_strided({n}.sizes(), {n}.strides(), "
                         f"{n}.options().device(at::kMeta));")
            call.append(f"meta_{n}")
        elif arg.type == "Tensor?":
            lines.append(f"  c10::optional<at::Tensor> meta_{n} = c10::nullopt;")
            lines.append(f"  if ({n}.has_value()) {{")
            lines.append(f"    meta_{n} = at::empty_strided({n}->sizes(), {n}->strides(), "
                         f"{n}->options().device(at::kMeta));")
            lines.append("  }")
            call.append(f"meta_{n}")
        elif arg.is_tensor:
            raise InputError(c.op, f"the output rule is `meta` and `{n}` is a {arg.type}: write its size helper "
                                   "by hand")
        else:
            call.append(n)
    lines.append(f"  at::Tensor meta_out = at::{_cpp_name(f.func)}({', '.join(call)});")
    return lines


def _helpers(c: Checklist, functional, size_h: str) -> list[tuple[str, str, str, str, str]]:
    """(header, source, marker, declaration, definition) of each helper the CHECKLIST's output rule calls; the
    marker (name and parameter types) tells whether a header declares it already."""
    size_t = "c10::SmallVector<int64_t, SIZE>" if re.search(r"\bSIZE\s*=", size_h) else "c10::SmallVector<int64_t, 8>"
    rule = c.output
    out = []
    if rule["size"] == "broadcast":
        shapes = f"{size_t} broadcast_ops_npu_output_size(c10::IntArrayRef shape1, c10::IntArrayRef shape2)"
        pair = f"{size_t} broadcast_ops_npu_output_size(const at::Tensor& self, const at::Tensor& other)"
        out.append((SIZE_H, SIZE_CPP, "broadcast_ops_npu_output_size(c10::IntArrayRef", shapes,
                    f"{_opener(shapes)} {{\n  return {size_t}(at::infer_size(shape1, shape2));\n}}\n"))
        out.append((SIZE_H, SIZE_CPP, "broadcast_ops_npu_output_size(const at::Tensor", pair,
                    f"{_opener(pair)} {{\n  return broadcast_ops_npu_output_size(self.sizes(), other.sizes());\n}}\n"))
    elif rule["size"] == "same":
        decl = "c10::IntArrayRef input_same_output_size(const at::Tensor& input)"
        out.append((SIZE_H, SIZE_CPP, "input_same_output_size(", decl,
                    f"{_opener(decl)} {{\n  return input.sizes();\n}}\n"))
    else:
        name = _cpp_name(functional.func)
        body = "\n".join(_meta_body(c, functional))
        decl = f"{size_t} {name}_npu_output_size({_params(functional)})"
        out.append((SIZE_H, SIZE_CPP, f"{name}_npu_output_size({_params(functional)})", decl,
                    f"{_opener(decl)} {{\n  // ATen's meta kernel for {c.op}: the output's size, without data\n"
                    f"{body}\n  return {size_t}(meta_out.sizes().begin(), meta_out.sizes().end());\n}}\n"))
        decl = f"at::ScalarType {name}_out_dtype({_params(functional)})"
        out.append((DTYPE_H, DTYPE_CPP, f"{name}_out_dtype({_params(functional)})", decl,
                    f"{_opener(decl)} {{\n  // ATen's meta kernel for {c.op}: the output's dtype, without data\n"
                    f"{body}\n  return meta_out.scalar_type();\n}}\n"))
    return out


def _insert_before_closing(text: str, addition: str, where: str) -> str:
    """`addition` before the last line that closes a namespace (`}` at column 0) of `text`."""
    closing = list(re.finditer(r"^}[^\n]*$", text, flags=re.M))
    if not closing:
        raise InputError(where, "has no closing `}` of namespace op_infer to add the helper before")
    at = closing[-1].start()
    return text[:at] + addition + "\n" + text[at:]


def _new_header(path: str) -> str:
    guard = "OP_PLUGIN_" + re.sub(r"\W", "_", Path(path).stem).upper()
    return (f"#ifndef {guard}\n#define {guard}\n\n#include <ATen/ATen.h>\n\nnamespace op_infer {{\n}} "
            f"// namespace op_infer\n#endif // {guard}\n")


def _new_source(header: str) -> str:
    return f'#include "{header}"\n\nnamespace op_infer {{\n}} // namespace op_infer\n'


def plan_helpers(c: Checklist, functional, patch: Patch) -> list[tuple[str, str, str]]:
    """Add the output helpers the checkout lacks; the files rows for the CHECKLIST."""
    rows = []
    for header, source, marker, decl, defn in _helpers(c, functional, patch.current(SIZE_H) or ""):
        h = patch.current(header)
        name = marker.split("(")[0]
        if h is not None and _normal(marker) in _normal(h):
            row = (header, "output helper", f"none: the checkout has {name}")
            if row not in rows:
                rows.append(row)
            continue
        h = h if h is not None else _new_header(header)
        hidden = "OP_PLUGIN_HIDDEN " if "OP_PLUGIN_HIDDEN" in h else ""
        patch.write(header, _insert_before_closing(h, f"{_opener(hidden + decl)};\n", header))
        s = patch.current(source)
        s = s if s is not None else _new_source(header)
        patch.write(source, _insert_before_closing(s, defn, source))
        rows.append((header, "output helper", f"declare {name}"))
        rows.append((source, "output helper", f"define {name}"))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# tests, schema baseline, API page


_PY_DEFAULTS = {"Mean": "1", "Sum": "2", "contiguous_format": "torch.contiguous_format", "true": "True",
                "false": "False"}  # schema defaults that are not Python


def _inputs_code(c: Checklist, shapes: list[str]) -> tuple[list, list]:
    """(positional, keyword) arguments of a call, each as (Argument, Python expression): tensors of `shapes`,
    schema defaults for positional arguments that have one; keyword-only arguments with a default are left out."""
    positional, keyword, i = [], [], 0
    for a in c.arguments:
        if a.is_tensor and (a.default is None or not a.kwarg_only):
            expr = f"make({shapes[i]}, dtype)" if a.default is None or a.type == "Tensor" else "None"
            i += 1
        elif a.default is not None:
            if a.kwarg_only:
                continue
            expr = _PY_DEFAULTS.get(a.default, a.default)
        elif a.type.startswith(("Scalar", "float")):
            expr = "0.5"
        elif a.type.startswith("int["):
            expr = "[1]"
        elif a.type.startswith(("int", "SymInt")):
            expr = "1"
        elif a.type.startswith("bool"):
            expr = "False"
        else:
            expr = "None"
        (keyword if a.kwarg_only else positional).append((a, expr))
    return positional, keyword


def _call_code(positional, keyword, rename=lambda a, e: e) -> str:
    return ", ".join([rename(a, e) for a, e in positional] + [f"{a.name}={rename(a, e)}" for a, e in keyword])


def test_file(c: Checklist) -> str:
    suffix = f"_{c.overload.lower()}" if c.overload else ""
    return f"test/test_base_ops/test_{c.name}{suffix}.py"


def _shapes(c: Checklist) -> list[list[str]]:
    n = len(c.tensor_inputs)
    if c.output["size"] == "broadcast":
        return [["(4, 3)"] * n, ["(2, 1, 3)"] + ["(4, 3)"] * (n - 1), ["(5, 1)"] + ["(1, 6)"] * (n - 1)]
    return [["(4, 3)"] * n, ["(2, 3, 5)"] * n]


def _ov(c: Checklist, f) -> str:
    return f"torch.ops.aten.{f.func.name.name}.{f.func.name.overload_name or 'default'}"


def test_source(c: Checklist, members: list) -> str:
    functional = members[0]
    pos, kw = _inputs_code(c, [f"shapes[{i}]" for i in range(len(c.tensor_inputs))])
    out_f = next((f for f in members if f.func.is_out_fn()), None)
    inplace = next((f for f in members if f.func.name.name.inplace), None)
    refused = [d for d in TORCH_DTYPES if d not in c.dtypes][:2]
    dtype_msgs = {r.id.removeprefix("dtype_"): r.message for r in c.constraints if r.id.startswith("dtype_")}
    cls = f"Test{c.class_name}{c.overload.replace('_', '')}"
    lines = [
        f'"""Tests of {c.op} on NPU (op_api, {c.vendor_kernel}), written by opforge op-adapt from',
        f"op_plugin/config/adaptations/{c.overload_name}/CHECKLIST.md: the dtypes, shapes and messages come from it.",
        '"""',
        "import re",
        "",
        "import torch",
        "import torch_npu  # noqa: F401  (the npu device)",
        "",
        "from torch_npu.testing.testcase import TestCase, run_tests",
        "",
        f"OP = {_ov(c, functional)}",
        f"OUT = {_ov(c, out_f) if out_f is not None else 'None'}",
        f"INPLACE = {_ov(c, inplace) if inplace is not None else 'None'}",
        f"DTYPES = [{', '.join('torch.' + d for d in c.dtypes)}]  # CHECKLIST: dtypes",
        f"REFUSED = [{', '.join('torch.' + d for d in refused)}]  # not in the CHECKLIST: the kernel refuses them",
        f"REFUSAL = {next(iter(dtype_msgs.values()), '')!r}  # CHECKLIST: constraint {next(iter(dtype_msgs), '')}",
        "LOW_PRECISION = (torch.float16, torch.bfloat16)",
        f"# CHECKLIST: output size {c.output['size']} of {', '.join(c.output['inputs'])}",
        f"SHAPES = [{', '.join('(' + ', '.join(s) + ',)' for s in _shapes(c))}]",
        "",
        "",
        "def make(shape, dtype):",
        "    if dtype.is_floating_point:",
        "        return torch.rand(shape, dtype=torch.float32).mul(4).sub(2).to(dtype)",
        "    if dtype == torch.bool:",
        "        return torch.randint(0, 2, shape).bool()",
        "    return torch.randint(-5, 6, shape).to(dtype)",
        "",
        "",
        "def inputs(shapes, dtype):",
        '    """The positional and keyword arguments of one call, on the CPU."""',
        f"    return [{', '.join(e for _, e in pos)}], {{{', '.join(repr(a.name) + ': ' + e for a, e in kw)}}}",
        "",
        "",
        "def mapped(fn, call):",
        "    args, kwargs = call",
        "    fn = lambda a, fn=fn: fn(a) if isinstance(a, torch.Tensor) else a  # noqa: E731",
        "    return [fn(a) for a in args], {k: fn(v) for k, v in kwargs.items()}",
        "",
        "",
        "def to(device, call):",
        "    return mapped(lambda t: t.to(device), call)",
        "",
        "",
        f"class {cls}(TestCase):",
        "    def cpu_op_exec(self, call):",
        "        # float16 and bfloat16 run in float32 on the CPU, then round to the dtype ATen's meta kernel gives",
        "        args, kwargs = to('meta', call)",
        "        dtype = OP(*args, **kwargs).dtype",
        "        args, kwargs = mapped(lambda t: t.float() if t.dtype in LOW_PRECISION else t, call)",
        "        return OP(*args, **kwargs).to(dtype)",
        "",
        "    def npu_op_exec(self, call):",
        "        args, kwargs = to('npu', call)",
        "        return OP(*args, **kwargs).cpu()",
        "",
        f"    def test_{c.name}_dtypes_match_cpu(self):",
        "        for dtype in DTYPES:",
        "            for shapes in SHAPES:",
        "                call = inputs(shapes, dtype)",
        "                cpu_output = self.cpu_op_exec(call)",
        "                npu_output = self.npu_op_exec(call)",
        "                self.assertEqual(npu_output.dtype, cpu_output.dtype)",
        "                self.assertRtolEqual(cpu_output, npu_output)",
        "",
    ]
    if out_f is not None:
        lines += [
            f"    def test_{c.name}_out_matches_cpu(self):",
            "        for dtype in DTYPES:",
            "            call = inputs(SHAPES[-1], dtype)",
            "            cpu_output = self.cpu_op_exec(call)",
            "            out = torch.empty(0, dtype=cpu_output.dtype).npu()",
            "            args, kwargs = to('npu', call)",
            "            result = OUT(*args, **kwargs, out=out)",
            "            self.assertTrue(result is out)",
            "            self.assertRtolEqual(cpu_output, out.cpu())",
            "",
        ]
    if inplace is not None:
        lines += [
            f"    def test_{c.name}_inplace_matches_cpu(self):",
            "        for dtype in DTYPES:",
            "            call = inputs(SHAPES[0], dtype)",
            "            cpu_output = self.cpu_op_exec(call)",
            "            args, kwargs = to('npu', call)",
            "            result = INPLACE(*args, **kwargs)",
            "            self.assertTrue(result is args[0])",
            "            self.assertRtolEqual(cpu_output, args[0].cpu())",
            "",
        ]
    lines += [
        f"    def test_{c.name}_refuses_other_dtypes(self):",
        "        for dtype in REFUSED:",
        "            with self.assertRaisesRegex(RuntimeError, re.escape(REFUSAL)):",
        "                args, kwargs = to('npu', inputs(SHAPES[0], dtype))",
        "                OP(*args, **kwargs)",
        "",
        "",
        'if __name__ == "__main__":',
        "    run_tests()",
        "",
    ]
    return "\n".join(lines)


_FAKE_HEADER = '''import torch
import torch_npu  # noqa: F401

from torch.testing._internal.common_utils import TestCase, run_tests


if __name__ == "__main__":
    run_tests()
'''


def fake_class(c: Checklist) -> str:
    cls = f"Test{c.class_name}{c.overload.replace('_', '')}Meta"
    shapes = _shapes(c)[1]
    pos, kw = _inputs_code(c, shapes)
    defs, metas = [], {}
    for a, expr in pos + kw:
        if expr.startswith("make("):
            var = f"{a.name}_" if a.name == "self" else a.name
            shape = expr.removeprefix("make(").removesuffix(", dtype)")
            defs.append(f"            {var} = torch.randn{shape}.npu()")
            metas[a.name] = (var, f'torch.empty({shape}, device="meta")')
    npu_call = _call_code(pos, kw, lambda a, e: metas[a.name][0] if a.name in metas else e)
    meta_call = _call_code(pos, kw, lambda a, e: metas[a.name][1] if a.name in metas else e)
    op = _ov(c, native_functions()[c.overload_name])
    return "\n".join([
        f"class {cls}(TestCase):",
        f"    # {c.op}: opforge op-adapt, op_plugin/config/adaptations/{c.overload_name}/CHECKLIST.md",
        f"    def test_{c.name}{'_' + c.overload.lower() if c.overload else ''}_fake_tensor_matches_meta(self):",
        "        with torch._subclasses.fake_tensor.FakeTensorMode():",
        *defs,
        f"            result = {op}({npu_call})",
        f"        expected = {op}({meta_call})",
        "        self.assertTrue(isinstance(result, torch._subclasses.fake_tensor.FakeTensor))",
        '        self.assertEqual(result.device.type, "npu")',
        "        self.assertEqual(result.shape, expected.shape)",
        "        self.assertEqual(result.dtype, expected.dtype)",
        "",
    ])


def add_fake_test(text: str | None, c: Checklist) -> str:
    text = text if text is not None else _FAKE_HEADER
    block = fake_class(c)
    name = block.split("(")[0].removeprefix("class ")
    if re.search(rf"^class {name}\(", text, flags=re.M):
        raise InputError(FAKE_TENSOR_TEST, f"already has a class {name}; adapt a change with --modify")
    if not re.search(r"\bTestCase\b", text):
        raise InputError(FAKE_TENSOR_TEST, "imports no TestCase to derive the new class from")
    main = re.search(r'^if __name__ == ["\']__main__["\']:', text, flags=re.M)
    if main is None:
        return text.rstrip("\n") + "\n\n\n" + block
    head = text[: main.start()].rstrip("\n")
    return head + "\n\n\n" + block + "\n\n" + text[main.start():]


def add_schemas(text: str | None, funcs: list[str]) -> str:
    """The baseline with `"func: <schema>": {"version": ["all_version"]}` appended for each new schema, written
    as the file writes its entries; existing entries untouched."""
    old = json.loads(text) if text is not None else {}
    new = [f for f in funcs if f"func: {f}" not in old]
    entries = ",\n".join(f'  {json.dumps("func: " + f)}: {{\n    "version": [{json.dumps(VERSION)}]\n  }}'
                         for f in new)
    if not new:
        return text if text is not None else "{}\n"
    if text is None or not old:
        result = "{\n" + entries + "\n}\n"
    else:
        at = text.rstrip().rfind("}")
        result = text[:at].rstrip() + ",\n" + entries + "\n}" + text[at + 1:]
    loaded = json.loads(result)
    if any(loaded.get(k) != v for k, v in old.items()) or any(f"func: {f}" not in loaded for f in new):
        raise InputError(SCHEMA_BASELINE, "adding the schemas would change existing entries; nothing was written")
    return result


def doc_file(c: Checklist) -> str:
    return f"docs/zh/native_APIs/torch-{c.overload_name}.md"


_SIZE_ZH = {"broadcast": "各输入广播后的shape", "same": "与{0}相同", "meta": "由ATen的meta函数推导"}
_DTYPE_ZH = {"result_type": "按PyTorch类型提升规则（torch.result_type）确定",
             "int_to_float": "按类型提升规则确定，整数输入提升为float32", "bool": "bool",
             "meta": "由ATen的meta函数推导"}


def doc_source(c: Checklist) -> str:
    from opforge.skills.op_apidoc.page import description

    dtypes = "、".join(c.dtypes)
    lines = [f"# {c.op}", "", "## 功能描述", "",
             f"`{c.op}`在昇腾NPU上的实现（op_api），调用CANN的`{c.vendor_kernel}`。", "",
             f"PyTorch说明：{description(c)}", "", "## 函数原型", "", "```", c.schema, "```", "", "## 参数说明", ""]
    for a in c.arguments:
        kind = "关键字参数，" if a.kwarg_only else ""
        if a.default is not None:
            line = f"- **{a.name}**（`{a.type}`，默认值为`{a.default}`）：{kind}可选参数。"
        else:
            line = f"- **{a.name}**（`{a.type}`）：{kind}必选参数。"
        if a.is_tensor:
            line += f"数据类型支持{dtypes}，数据格式支持ND。"
        lines.append(line)
    size = _SIZE_ZH[c.output["size"]].format(c.output["inputs"][0])
    lines += ["", "## 返回值说明", "",
              f"- `{c.returns}`：shape为{size}；数据类型{_DTYPE_ZH[c.output['dtype']]}。", "", "## 约束说明", ""]
    for r in c.constraints:
        if r.id.startswith("dtype_"):
            lines.append(f"- `{r.id.removeprefix('dtype_')}`的数据类型须为{dtypes}，否则报错：`{r.message}`")
        elif r.id == "broadcast":
            lines.append(f"- {'、'.join('`' + t + '`' for t in c.output['inputs'])}的shape须可广播，"
                         f"否则报错：`{r.message}`")
    lines += ["", "## 支持的型号", "",
              f"以CANN中`{c.vendor_kernel}`支持的产品型号为准（opforge适配时未在设备上验证）。", "",
              "## 调用示例", "", "```python", "import torch", "import torch_npu", ""]
    pos, kw = _inputs_code(c, ["(2, 3)"] * len(c.tensor_inputs))
    names = {}
    for a, expr in pos + kw:
        if expr.startswith("make("):
            names[a.name] = f"{a.name}_" if a.name == "self" else a.name
            lines.append(f"{names[a.name]} = torch.randn(2, 3, dtype=torch.{c.dtypes[0]}).npu()")
    op = _ov(c, native_functions()[c.overload_name])
    lines += [f"result = {op}({_call_code(pos, kw, lambda a, e: names.get(a.name, e))})",
              "print(result.shape, result.dtype)", "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------


def plan(op: str, patch: Patch, confirm: Callable[[Conflict], bool] | None = None) -> tuple[Checklist, list[str]]:
    """The CHECKLIST of ATen overload `op` and every file of its adaptation in `patch`; the yaml entries added."""
    name = op.removeprefix("aten::")
    have = registered(patch)
    fns = native_functions()
    if name in fns:
        taken = [str(f.func.name) for f in group(name) if str(f.func.name) in have]
        if taken:
            raise InputError(op, f"already adapted in {YAML} ({', '.join(taken)}); use --modify")
    c = aten_checklist(op, build.NATIVE, {k for k in have if k in fns})
    members = group(c.overload_name)
    for f in members:
        if "SymInt" in str(f.func):
            raise InputError(op, "its schema has SymInt arguments: the op-plugin profile does not write `symint:` "
                                 "kernels yet")
    for conflict in c.conflicts:
        if confirm is not None and not confirm(conflict):
            raise InputError("--interactive", f"stopped at a conflict ({conflict.field}: {conflict.detail}); "
                                              "nothing was written")
    _for_npu(c)
    for rel in (kernel_file(c), test_file(c), doc_file(c)):
        if patch.current(rel) is not None:
            raise InputError(str(patch.root / rel), "exists already; adapt a change to it with --modify")
    funcs = [str(f.func) for f in members]
    old = patch.current(YAML)
    patch.write(YAML, add_entries(old, "official", funcs))
    check_yaml(old, patch.current(YAML), "official", funcs)
    functional = members[0]
    patch.write(kernel_file(c), kernel_source(c, members, build.NATIVE))
    check_signatures(patch.current(kernel_file(c)), funcs, kernel_file(c))
    helper_rows = plan_helpers(c, functional, patch)
    patch.write(test_file(c), test_source(c, members))
    patch.write(FAKE_TENSOR_TEST, add_fake_test(patch.current(FAKE_TENSOR_TEST), c))
    patch.write(SCHEMA_BASELINE, add_schemas(patch.current(SCHEMA_BASELINE), funcs))
    patch.write(doc_file(c), doc_source(c))
    names = ", ".join(str(f.func.name) for f in members)
    rows = [(YAML, "registration yaml", f"add {names} to official: (op_api: {VERSION})"),
            (kernel_file(c), "C++ kernel (op_api)", f"create: checks, output allocation, {c.vendor_kernel}"),
            *helper_rows,
            (test_file(c), "test (torch_npu TestCase)", "create"),
            (FAKE_TENSOR_TEST, "fake-tensor test", f"add class {fake_class(c).split('(')[0].removeprefix('class ')}"),
            (SCHEMA_BASELINE, "schema baseline", f"add {len(funcs)} schema(s)"),
            (doc_file(c), "API doc (zh)", "create"),
            (META, "Meta function", "none: torch has it"),
            (DERIVATIVES, "backward", "none: torch has it (its derivatives.yaml)")]
    folder = f"op_plugin/config/adaptations/{c.overload_name}"
    rows.append((f"{folder}/CHECKLIST.md", "checklist", "create"))
    c.files = [{"path": p, "class": k, "action": a} for p, k, a in rows]
    patch.write(f"{folder}/CHECKLIST.md", markdown(c))
    patch.write(f"{folder}/checklist.json", json.dumps(c.to_json(), indent=2, ensure_ascii=False) + "\n")
    return c, funcs


def adapt(op: str, repo: Path | None, *, dry_run: bool = False,
          confirm: Callable[[Conflict], bool] | None = None) -> Result:
    """Adapt ATen overload `op` into the op-plugin checkout `repo`; with `dry_run` only plan it (the diff)."""
    patch = Patch(_root(repo))
    c, _ = plan(op, patch, confirm)
    result = Result(c, [], sorted(patch.files), patch.diff(), None)
    if not dry_run:
        patch.apply()
    return result
