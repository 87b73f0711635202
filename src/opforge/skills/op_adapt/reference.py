"""The reference profile: an operator adapted into an opdev source tree, the way op-plugin adapts one into
torch_npu. Files, all read from the CHECKLIST:

  opdev_functions.yaml                the overload registered (torchgen derives its in-place and out= forms)
  ops/<Name>KernelOpdev.cpp           checks, output allocation, the vendor call
  schema.json                         the schema baseline: every adapted overload's schema
  tests/test_<name>_opdev.py          op-test
  docs/<name>.md                      op-apidoc
  adaptations/<overload>/CHECKLIST.md the parameters, and checklist.json
"""
from __future__ import annotations

import json
import re

from opforge.backend import build
from opforge.backend.cpp import CppBuffer, native_functions
from opforge.errors import InputError
from opforge.skills.op_adapt.checklist import Checklist, markdown
from opforge.workspace.patch import Patch

YAML = build.BACKEND_YAML
SCHEMA_BASELINE = "schema.json"


CONFTEST = '''"""Registers opdev before any test module imports torch.testing, whose device-type tests list the
backends available when it is first imported."""
import opforge.backend.device  # noqa: F401
'''


def kernel_file(c: Checklist) -> str:
    return f"ops/{c.class_name}KernelOpdev.cpp"


def registered(patch: Patch) -> list[str]:
    """The overloads the tree's backend yaml registers (to PrivateUse1)."""
    import yaml

    data = yaml.safe_load(patch.current(YAML) or "") or {}
    return list(data.get("supported") or [])


def _register(patch: Patch, overload: str) -> None:
    text = patch.current(YAML)
    m = re.search(r"^autograd:", text, flags=re.M)
    if m is None:
        raise InputError(str(patch.root / YAML), "has no `autograd:` key to close the supported list")
    patch.write(YAML, text[: m.start()] + f"- {overload}\n" + text[m.start():])


def _output(c: Checklist, buf: CppBuffer, call_args: list[str]) -> None:
    rule = c.output
    tensors = ", ".join(rule["inputs"])
    if rule["size"] == "meta":
        f = native_functions()[c.overload_name]
        from torchgen.api import cpp

        meta_args = [f"op_api::meta({a})" if a in c.tensor_inputs else a for a in call_args]
        buf.line("// ATen's Meta kernel gives the output's size and dtype for these arguments")
        buf.line(f"at::Tensor shape = at::{cpp.name(f.func)}({', '.join(meta_args)});")
        buf.line(f"at::Tensor out = op_api::empty(shape.sizes(), shape.scalar_type(), {rule['inputs'][0]});")
        return
    first = rule["inputs"][0]
    size = f"output_size::broadcast({{{tensors}}})" if rule["size"] == "broadcast" else f"{first}.sizes()"
    dtype = {"result_type": f"op_api::result_type({{{tensors}}})",
             "int_to_float": f"op_api::int_to_float(op_api::result_type({{{tensors}}}))",
             "bool": "at::kBool"}[rule["dtype"]]
    buf.line(f"at::Tensor out = op_api::empty({size}, {dtype}, {rule['inputs'][0]});")


NAMESPACE_END = "} // namespace opdev"


def kernel_function(c: Checklist, root) -> str:
    """The kernel of one overload: the CHECKLIST's checks, the output allocation, the vendor call."""
    from torchgen.api.types import NativeSignature

    from opforge.backend import vendor

    f = native_functions()[c.overload_name]
    sig = NativeSignature(f.func, symint=False)
    names = [a.name for a in sig.arguments()]
    kernel = vendor.load_kernels(root / "vendor" / "kernels.yaml")[c.vendor_kernel]
    buf = CppBuffer()
    buf.line(f"// {c.op}: from adaptations/{c.overload_name}/CHECKLIST.md (dtypes, checks, output, vendor kernel)")
    with buf.block(sig.defn(name=f"OpdevNativeFunctions::{f.func.name.name}")):
        for r in c.constraints:
            buf.line(f'TORCH_CHECK({r.cpp}, "{r.message}");')
        _output(c, buf, names)
        vk_args = ["out" if p.is_out else p.name for p in kernel.params]
        buf.line(f"EXEC_OPDEV_CMD({c.vendor_kernel}, {', '.join(vk_args)});")
        buf.line("return out;")
    return buf.text()


def kernel_source(c: Checklist, root, existing: str | None = None) -> str:
    """The kernel file with `c`'s function: a new file, or `existing` (the file of the operator's other
    overloads, one file per operator as op-plugin has it) with the function added before its namespace ends."""
    function = kernel_function(c, root)
    header = f"#include <ATen/ops/{native_functions()[c.overload_name].root_name}.h>"
    if existing is not None:
        if c.output["size"] == "meta" and header not in existing:
            existing = existing.replace('#include "PrivateUse1NativeFunctions.h"',
                                        f'{header}\n\n#include "PrivateUse1NativeFunctions.h"', 1)
        head, sep, tail = existing.rpartition(NAMESPACE_END)
        if not sep:
            raise InputError(kernel_file(c), f"has no `{NAMESPACE_END}` line to add {c.op} before")
        return f"{head}{function}\n{sep}{tail}"
    buf = CppBuffer()
    buf.line(f"// aten::{c.name} on opdev: each overload's kernel follows its CHECKLIST (adaptations/).")
    buf.line('#include "ops/OpApi.h"')
    buf.line('#include "ops/OutputSize.h"')
    buf.line()
    if c.output["size"] == "meta":
        buf.line(header)
        buf.line()
    buf.line('#include "PrivateUse1NativeFunctions.h"')
    buf.line()
    buf.line("namespace opdev {")
    buf.line()
    buf.lines(function)
    buf.line()
    buf.line(NAMESPACE_END)
    return buf.text()


def plan(c: Checklist, patch: Patch, *, test_source: str, doc_source: str) -> None:
    """Add `c`'s files to `patch` and record them in the CHECKLIST."""
    if c.overload_name in registered(patch):
        raise InputError(c.op, f"is already registered in {patch.root / YAML}: adapt a change to it with --modify")
    _register(patch, c.overload_name)
    baseline = json.loads(patch.current(SCHEMA_BASELINE) or "{}")
    baseline[c.op] = c.schema
    files = [(YAML, "registration yaml", "add the overload to `supported`"),
             (kernel_file(c), "C++ kernel", ("add the overload's function" if patch.current(kernel_file(c))
                                             else "create") + ": checks, output allocation, vendor call"),
             (SCHEMA_BASELINE, "schema baseline", "add the schema"),
             (f"tests/test_{c.overload_name.replace('.', '_')}_opdev.py", "test (op-test)", "create"),
             (f"docs/{c.overload_name}.md", "API doc (op-apidoc)", "create")]
    patch.write(kernel_file(c), kernel_source(c, patch.root, patch.current(kernel_file(c))))
    patch.write(SCHEMA_BASELINE, json.dumps(dict(sorted(baseline.items())), indent=2) + "\n")
    patch.write(files[3][0], test_source)
    if patch.current("tests/conftest.py") is None:
        patch.write("tests/conftest.py", CONFTEST)
    patch.write(files[4][0], doc_source)
    c.files = [{"path": p, "class": k, "action": a} for p, k, a in files]
    folder = f"adaptations/{c.overload_name}"
    c.files += [{"path": f"{folder}/CHECKLIST.md", "class": "checklist", "action": "create"}]
    patch.write(f"{folder}/CHECKLIST.md", markdown(c))
    patch.write(f"{folder}/checklist.json", json.dumps(c.to_json(), indent=2) + "\n")
