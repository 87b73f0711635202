"""CHECKLIST: every parameter of one operator's adaptation, gathered once from its sources.

For an ATen overload the sources are torchgen's schema (native_functions.yaml), the backend's vendor kernel
table (the dtypes the vendor accepts), torch's OpInfo (the dtypes torch tests, the dtype rule) and torch's
derivatives.yaml (the backward). Where two sources disagree the conflict is listed with how it was resolved;
every file the adaptation writes reads its parameters from here and nowhere else.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from opforge.backend import vendor
from opforge.backend.cpp import native_functions, out_overloads
from opforge.errors import InputError
from opforge.i18n import _
from opforge.skills.op_adapt import texts
from opforge.skills.op_adapt.texts import shown

TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool")
FLOATS = ("float32", "float64", "float16", "bfloat16")


@dataclass
class Argument:
    name: str
    type: str  # the schema's type: "Tensor", "Scalar", "int[1]", "bool"
    default: str | None  # the schema's default, as written there; None when the argument is required
    kwarg_only: bool = False

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")


@dataclass
class Constraint:
    """One rule on the inputs, with the check that enforces it in C++ (TORCH_CHECK) and in the Meta function."""
    id: str
    text: str
    cpp: str  # a C++ condition over the kernel's parameters
    meta: str  # the same condition in Python, over the Meta function's parameters
    message: str  # what both raise; tests expect it


@dataclass
class Conflict:
    field: str
    detail: str
    resolution: str


@dataclass
class Checklist:
    op: str  # "aten::copysign.Tensor"
    kind: str  # "aten" | "custom"
    schema: str
    name: str  # copysign
    overload: str  # Tensor ("" for the default overload)
    class_name: str  # Copysign: file and kernel names
    arguments: list[Argument]
    returns: str
    dtypes: list[str]
    dtype_sources: dict[str, list[str]]
    output: dict  # {"size": broadcast|same|reduce|meta, "dtype": result_type|int_to_float|bool|self, "inputs": [...]}
    constraints: list[Constraint]
    backward: dict  # {"source": ..., "formulas": {input: formula}, "differentiable": [inputs]}
    vendor_kernel: str | None
    opinfo: str | None
    opinfo_variant: str = ""
    conflicts: list[Conflict] = field(default_factory=list)
    files: list[dict] = field(default_factory=list)  # {"path", "class", "action"}: filled by the profile

    @property
    def overload_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @property
    def tensor_inputs(self) -> list[str]:
        return [a.name for a in self.arguments if a.is_tensor]

    def to_json(self) -> dict:
        return asdict(self)


def class_name_of(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.strip("_").split("_") if part)


def _arguments(func) -> list[Argument]:
    args = []
    for a in func.arguments.flat_positional:
        args.append(Argument(a.name, str(a.type), a.default, False))
    for a in func.arguments.flat_kwarg_only:
        args.append(Argument(a.name, str(a.type), a.default, True))
    return args


def _opinfo(name: str, overload: str):
    """torch's OpInfo for `name` whose samples reach `overload` (the default variant first), or None."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    from opforge.skills.op_adapt.deps import reaches

    candidates = sorted((o for o in op_db if o.name == name), key=lambda o: o.variant_test_name != "")
    for o in candidates:
        dtypes = o.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in dtypes else next(iter(sorted(dtypes, key=str)), None)
        if dtype is not None and any(reaches(o, s, overload) for s in o.sample_inputs("cpu", dtype)):
            return o
    return None


def _derivatives(schema_name: str) -> dict:
    import yaml

    from opforge.backend.cpp import torchgen_root

    path = torchgen_root().parent / "autograd" / "derivatives.yaml"
    for entry in yaml.safe_load(path.read_text()):
        if entry["name"].split("(")[0] == schema_name:
            formulas = {k: v for k, v in entry.items()
                        if k not in ("name", "result", "dispatch", "output_differentiability")}
            return {"source": "torch derivatives.yaml", "formulas": formulas,
                    "differentiable": [k for k, v in formulas.items() if "non_differentiable" not in v
                                       and not v.startswith("zeros_like")]}
    return {"source": texts.NOT_DIFFERENTIABLE, "formulas": {}, "differentiable": []}


def aten_checklist(op: str, root: Path, supported: set[str]) -> Checklist:
    """The CHECKLIST of ATen overload `op` ("aten::copysign.Tensor" or "copysign.Tensor") for a tree whose
    backend yaml registers `supported`."""
    from opforge.skills.op_adapt.deps import backward_ops, reachable

    name = op.removeprefix("aten::")
    fns = native_functions()
    f = fns.get(name)
    if f is None:
        raise InputError(op, "is not an ATen operator overload (see native_functions.yaml)")
    func = f.func
    if func.is_out_fn() or func.name.name.inplace:
        raise InputError(op, "name the functional overload: its in-place and out= forms are generated from it")
    kernels = vendor.load_kernels(root / "vendor" / "kernels.yaml")
    kernel = vendor.kernel_for(name, kernels)
    if kernel is None:
        raise InputError(op, f"the vendor library has no kernel for it (nor for {out_overloads().get(name, name)}): "
                             "see `opforge backend info`")
    base = func.name.name.base
    info = _opinfo(base, name)
    conflicts: list[Conflict] = []
    vendor_dtypes = list(kernel.dtypes)
    sources = {"vendor": vendor_dtypes}
    if info is not None:
        tested = sorted(str(d).removeprefix("torch.") for d in info.supported_dtypes("cpu"))
        sources["opinfo"] = [d for d in TORCH_DTYPES if d in tested]
        dtypes = [d for d in vendor_dtypes if d in tested]
        missing = [d for d in sources["opinfo"] if d not in vendor_dtypes]
        extra = [d for d in vendor_dtypes if d not in tested]
        if missing:
            conflicts.append(Conflict("dtypes", texts.TORCH_ONLY_DTYPES.format(dtypes=", ".join(missing),
                                                                               kernel=kernel.name),
                                      texts.REFUSED))
        if extra:
            conflicts.append(Conflict("dtypes", texts.VENDOR_ONLY_DTYPES.format(dtypes=", ".join(extra)),
                                      texts.UNTESTED))
    else:
        dtypes = vendor_dtypes
    args = _arguments(func)
    tensors = [a.name for a in args if a.is_tensor]
    output = _output_rule(name, set(f.tags), args)
    backward = _derivatives(str(func.name))
    backward["ops"] = backward_ops(info, name)
    backward["missing"] = [o for o in backward["ops"] if not reachable(o, supported | {name})]
    return Checklist(
        op=f"aten::{name}", kind="aten", schema=str(func), name=base,
        overload=func.name.overload_name, class_name=class_name_of(base), arguments=args,
        returns=", ".join(str(r.type) for r in func.returns), dtypes=dtypes, dtype_sources=sources, output=output,
        constraints=_constraints(base, tensors, dtypes, output), backward=backward,
        vendor_kernel=kernel.name, opinfo=info.name if info is not None else None,
        opinfo_variant=info.variant_test_name if info is not None else "", conflicts=conflicts)


def _output_rule(overload: str, tags: set, args: list[Argument]) -> dict:
    from opforge.skills.op_adapt.deps import dtype_rule

    tensors = [a.name for a in args if a.is_tensor]
    if "pointwise" in tags and all(not a.type.startswith("Tensor?") for a in args):
        rule = dtype_rule(overload)
        if rule != "meta":
            return {"size": "broadcast" if len(tensors) > 1 else "same", "dtype": rule, "inputs": tensors}
    return {"size": "meta", "dtype": "meta", "inputs": tensors}


def _constraints(name: str, tensors: list[str], dtypes: list[str], output: dict) -> list[Constraint]:
    rules = []
    allowed = " ".join(dtypes)
    for t in tensors:
        cpp_types = ", ".join(f"at::k{_CPP_DTYPE[d]}" for d in dtypes)
        py_types = ", ".join(f"torch.{d}" for d in dtypes)
        rules.append(Constraint(
            id=f"dtype_{t}", text=texts.DTYPE_RULE.format(tensor=t, dtypes=", ".join(dtypes)),
            cpp=f"op_api::dtype_in({t}, {{{cpp_types}}})", meta=f"{t}.dtype in ({py_types},)",
            message=f"{name}: {t} must have dtype in [{allowed}] on opdev"))
    if output["size"] == "broadcast" and len(tensors) > 1:
        rules.append(Constraint(
            id="broadcast", text=texts.BROADCAST_RULE.format(tensors=", ".join(tensors)),
            cpp=f"output_size::broadcastable({{{', '.join(tensors)}}})",
            meta=f"_broadcastable({', '.join(tensors)})",
            message=f"{name}: the shapes of {', '.join(tensors)} cannot be broadcast together"))
    return rules


_CPP_DTYPE = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int8": "Char",
              "uint8": "Byte", "int16": "Short", "int32": "Int", "int64": "Long", "bool": "Bool"}


def markdown(c: Checklist) -> str:
    """CHECKLIST.md: the single source of every parameter, in the order the adaptation uses them."""
    none = _("none")
    lines = [_("# CHECKLIST: {op}").format(op=c.op), "",
             _("Every file of this adaptation takes its parameters from here (checklist.json is the same, for "
               "tools)."),
             "", _("## Schema"), "", f"`{c.schema}`", "",
             _("| argument | type | default | keyword-only |"), "|---|---|---|---|"]
    for a in c.arguments:
        default = "`" + a.default + "`" if a.default is not None else _("required")
        keyword = _("yes") if a.kwarg_only else _("no")
        lines.append(f"| {a.name} | `{a.type}` | {default} | {keyword} |")
    lines += ["", _("Returns `{type}`.").format(type=c.returns), "", _("## Dtypes"), "",
              _("Adapted: {dtypes}.").format(dtypes=", ".join(c.dtypes)), ""]
    for source, ds in c.dtype_sources.items():
        lines.append(f"- {source}: {', '.join(ds)}")
    lines += ["", _("## Output"), "",
              _("- size: **{size}** of {inputs}").format(size=c.output["size"], inputs=", ".join(c.output["inputs"])),
              _("- dtype: **{dtype}**").format(dtype=c.output["dtype"]), "", _("## Constraints"), "",
              _("| id | rule | C++ (TORCH_CHECK) | Meta (torch._check) | message |"), "|---|---|---|---|---|"]
    for r in c.constraints:
        lines.append(f"| {r.id} | {shown(r.text)} | `{r.cpp.replace('|', '&#124;')}` | `{r.meta}` | {r.message} |")
    lines += ["", _("## Backward"), "", _("Source: {source}.").format(source=shown(c.backward["source"])), ""]
    for inp, formula in c.backward["formulas"].items():
        lines.append(f"- d/d{inp}: `{formula}`")
    lines.append(_("- inputs that get gradients: {inputs}").format(
        inputs=", ".join(c.backward["differentiable"]) or none))
    if c.backward.get("ops"):
        lines.append(_("- operators the backward runs (recorded on the CPU): {ops}").format(
            ops=", ".join(c.backward["ops"])))
        lines.append(_("- of those, missing on the backend: {ops}").format(
            ops=", ".join(c.backward["missing"]) or none))
    lines += ["", _("## Vendor kernel"), "", f"`{c.vendor_kernel}`" if c.vendor_kernel else none, ""]
    lines += [_("## Conflicts between sources"), ""]
    if c.conflicts:
        lines += [_("| field | what disagrees | resolution |"), "|---|---|---|"]
        lines += [f"| {x.field} | {shown(x.detail)} | {shown(x.resolution)} |" for x in c.conflicts]
    else:
        lines.append(none)
    lines += ["", _("## Files"), "", _("| file | class | action |"), "|---|---|---|"]
    lines += [f"| {f['path']} | {f['class']} | {f['action']} |" for f in c.files]
    return "\n".join(lines) + "\n"
