"""The backend profile: the operators a backend implements and the integration points it relies on.

Sources: an op-plugin style yaml (sections of `- func:` entries), torchgen's backend yaml (`backend:`,
`supported:`, `autograd:`; torch_npu's npu_native_functions*.yaml extends it with `- func: NAME` entries that carry
options), an opforge profile yaml (`operators:`, `integration_points:`), a plain list (one
overload a line; yaml or json lists too), or `dispatch:KEY[@module]`, the operators the live dispatcher holds for
KEY after importing the backend's module. Without one, a generic PrivateUse1 backend:
every integration point, operators unknown.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from opforge.errors import InputError
from opforge.i18n import N_, Msg
from opforge.skills.pr_analysis.areas import INTEGRATION_POINTS
from opforge.skills.pr_analysis.schema_diff import op_base

ALL_POINTS = tuple(pid for pid, *_ in INTEGRATION_POINTS)
# op-plugin's sections, then those of torchgen's gen_backend_stubs yaml (as used by torch_xla and torch_npu).
BACKEND_SECTIONS = ("official", "autograd", "custom", "symint", "quant", "supported", "full_codegen", "non_native",
                    "custom_autograd", "tocpu")
_FUNC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?\(.*\)\s*->\s*\S")
_OP_NAME = re.compile(r"^(?:aten::)?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?$")


@dataclass
class Profile:
    name: str
    source: str
    dispatch_key: str = "PrivateUse1"
    operators: frozenset[str] = frozenset()
    autograd_ops: frozenset[str] = frozenset()  # overloads whose autograd the backend registers itself
    points: tuple[str, ...] = ALL_POINTS
    generic: bool = False
    # Hand-written lists: a name without an overload (`add`) covers all of its overloads (`add.Tensor`, `add.out`).
    loose: bool = False
    families: frozenset[str] = field(default=frozenset(), init=False)

    def __post_init__(self) -> None:
        self.families = frozenset(op_base(o) for o in self.operators)

    def implements(self, op: str) -> bool:
        # In op-plugin yaml and the dispatcher a name without an overload is the default overload only.
        return op in self.operators or (self.loose and op.split(".", 1)[0] in self.operators)

    def has_family(self, op: str) -> bool:
        return op_base(op) in self.families

    def relies_on(self, point: str) -> bool:
        return point in self.points

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "dispatch_key": self.dispatch_key, "generic": self.generic,
                "operators": len(self.operators), "autograd_operators": len(self.autograd_ops),
                "integration_points": list(self.points)}


def generic_profile() -> Profile:
    return Profile(name=Msg(N_("generic PrivateUse1 backend")), source=Msg(N_("(built in)")), generic=True)


def _norm(op: str) -> str:
    return op.strip().removeprefix("aten::")


def _from_dispatcher(spec: str) -> Profile:
    import torch

    key, _sep, module = spec.partition("@")
    if module:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise InputError("--backend", f"cannot import backend module {module!r}: {exc}") from None
    try:
        regs = torch._C._dispatch_get_registrations_for_dispatch_key(key)
    except Exception:
        raise InputError("--backend", f"unknown dispatch key {key!r}") from None
    ops = frozenset(_norm(r) for r in regs if r.startswith("aten::"))
    if not ops:
        raise InputError("--backend", f"no aten operators are registered for dispatch key {key!r}"
                                      + (f" after importing {module}" if module else ""))
    return Profile(name=f"{module or 'live'} ({key})", source=f"dispatch:{spec}", dispatch_key=key, operators=ops)


def _from_backend_yaml(path: Path, doc: dict) -> Profile:
    """op-plugin sections of `- func:` entries, or torchgen's backend yaml (`supported:`, `autograd:` name lists,
    torch_npu's also `- func: NAME` entries)."""
    ops: set[str] = set()
    autograd: set[str] = set()
    for section in BACKEND_SECTIONS:
        entries = doc.get(section) or []
        if not isinstance(entries, list):
            raise InputError(f"{path}: {section}", "expected a list of operator names or entries with 'func'")
        for i, e in enumerate(entries):
            # A name, or an entry whose `func` is a schema or (torch_npu's `- func: clone` with options) a name.
            func = e.get("func") if isinstance(e, dict) else e
            if isinstance(func, str) and _OP_NAME.match(func.strip()):
                key = _norm(func)
            # Shape only: op-plugin keeps entries for older torch releases that today's torchgen rejects.
            elif isinstance(func, str) and _FUNC.match(func):
                key = func.split("(", 1)[0].strip()
            else:
                raise InputError(f"{path}: {section}[{i}]", f"neither an overload name nor a schema: {func!r}")
            ops.add(key)
            if section in ("autograd", "custom_autograd"):
                autograd.add(key)
    if not ops:
        raise InputError(str(path), "the backend yaml lists no operators")
    key = doc.get("dispatch_key") or "PrivateUse1"
    return Profile(name=str(doc.get("backend") or path.stem), source=str(path), dispatch_key=str(key),
                   operators=frozenset(ops), autograd_ops=frozenset(autograd))


def _from_profile_yaml(path: Path, doc: dict) -> Profile:
    ops = doc.get("operators")
    if not isinstance(ops, list) or not all(isinstance(o, str) and _OP_NAME.match(o.strip()) for o in ops):
        raise InputError(f"{path}: operators", "expected a list of overload names such as add.Tensor")
    points = doc.get("integration_points", list(ALL_POINTS))
    if not isinstance(points, list) or any(p not in ALL_POINTS for p in points):
        bad = [p for p in (points if isinstance(points, list) else [points]) if p not in ALL_POINTS]
        raise InputError(f"{path}: integration_points", f"unknown {bad}; known: {', '.join(ALL_POINTS)}")
    key = doc.get("dispatch_key", "PrivateUse1")
    if not isinstance(key, str) or not key:
        raise InputError(f"{path}: dispatch_key", "expected a dispatch key name such as PrivateUse1")
    return Profile(name=str(doc.get("name", path.stem)), source=str(path), dispatch_key=key,
                   operators=frozenset(_norm(o) for o in ops), points=tuple(points), loose=True)


def _from_list(path: Path, text: str) -> Profile:
    ops: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not _OP_NAME.match(line):
            raise InputError(f"{path}:{n}", f"not an operator overload name: {line!r}")
        ops.add(_norm(line))
    if not ops:
        raise InputError(str(path), "the operator list is empty")
    return Profile(name=path.stem, source=str(path), operators=frozenset(ops), loose=True)


def load_profile(spec: str | None) -> Profile:
    if not spec:
        return generic_profile()
    if spec.startswith("dispatch:"):
        return _from_dispatcher(spec[len("dispatch:"):])
    path = Path(spec)
    if not path.is_file():
        raise InputError("--backend", f"no such file: {spec}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"cannot read: {exc}") from None
    if path.suffix not in (".yaml", ".yml", ".json"):
        return _from_list(path, text)
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise InputError(where, f"invalid yaml: {getattr(exc, 'problem', exc)}") from None
    if isinstance(doc, list):
        return _from_list(path, "\n".join(str(x) for x in doc))
    if not isinstance(doc, dict):
        raise InputError(str(path), "expected a mapping (op-plugin sections or 'operators:') or a list")
    if "operators" in doc:
        return _from_profile_yaml(path, doc)
    if any(s in doc for s in BACKEND_SECTIONS):
        return _from_backend_yaml(path, doc)
    raise InputError(str(path), "expected 'operators:', op-plugin sections (official, custom, ...) or a backend "
                                "yaml (supported, autograd, ...)")
