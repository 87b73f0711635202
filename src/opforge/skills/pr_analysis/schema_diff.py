"""Operator-level differences between two versions of native_functions.yaml (and derivatives.yaml).

Both files are long yaml lists whose entries start at column 0 (`- func:`, `- name:`). Splitting the text at
those lines and parsing only the entries whose text differs keeps a diff of two 15k-line files to milliseconds;
schemas are compared with torchgen's own model (`FunctionSchema.parse`), the one PyTorch generates code from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

import yaml
from torchgen.model import FunctionSchema

from opforge.i18n import N_, Msg

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Keys whose kernels serve every backend: a change here moves work onto, or off, an out-of-tree backend.
COMPOSITE_KEYS = frozenset({"CompositeImplicitAutograd", "CompositeExplicitAutograd",
                            "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutogradNestedTensor"})
IMPLICIT = "CompositeImplicitAutograd"


@dataclass
class Entry:
    key: str
    line: int  # 1-based line of the entry's first line
    text: str


@dataclass
class OpChange:
    op: str  # overload key: name or name.overload (the new one for a rename)
    change: str  # added | removed | renamed | changed
    kinds: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    old: str | None = None  # schema text
    new: str | None = None
    old_op: str | None = None  # for a rename
    line: int = 0  # where the entry is: new file, or old file for a removal
    schema_differs: bool = False
    dispatch_keys_changed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"op": self.op, "change": self.change, "kinds": self.kinds, "details": self.details,
                "old": self.old, "new": self.new, "old_op": self.old_op, "line": self.line,
                "schema_differs": self.schema_differs, "dispatch_keys_changed": self.dispatch_keys_changed}


# The entry's schema field, whether it opens the item (`- func: ...`, PyTorch's layout) or follows other keys
# (`  func: ...`, as a yaml dumper that sorts keys writes it).
_KEY_RE = {f: re.compile(rf"^(?:- |  ){f}:[ \t]*['\"]?([^('\"\s]+)", re.M) for f in ("func", "name")}


def _key(chunk: str, field: str) -> str | None:
    m = _KEY_RE[field].search(chunk)
    return m.group(1) if m else None


def _items(text: str) -> list[str]:
    # Top-level list items start at column 0; str.split on a plain separator runs in C, ten times faster than a
    # regex split with a look-ahead.
    return ["- " + p for p in ("\n" + text).split("\n- ")[1:]]


def _changed_entries(old_text: str, new_text: str, field: str) -> tuple[dict[str, Entry], dict[str, Entry]]:
    """Entries whose text is on one side only. Unchanged entries cancel out as whole strings, in C, so a diff
    costs a split and two set look-ups per entry instead of a parse."""
    old, new = _items(old_text), _items(new_text)
    so, sn = set(old), set(new)

    def entries(chunks: list[str], other: set[str], text: str) -> dict[str, Entry]:
        out = {}
        for c in chunks:
            if c not in other:
                k = _key(c, field)
                if k is not None:
                    out[k] = Entry(k, text.count("\n", 0, text.find(c)) + 1, c)
        return out

    return entries(old, sn, old_text), entries(new, so, new_text)


def _split(text: str, field: str) -> dict[str, Entry]:
    """Every entry of a file with its line number."""
    entries: dict[str, Entry] = {}
    line, pos = 1, 0
    for chunk in _items(text):
        at = text.find(chunk, pos)
        line += text.count("\n", pos, at)
        pos = at
        key = _key(chunk, field)
        if key is not None:
            entries[key] = Entry(key, line, chunk)
    return entries


@lru_cache(maxsize=8)
def split_native(text: str) -> dict[str, Entry]:
    return _split(text, "func")


@lru_cache(maxsize=8)
def split_derivatives(text: str) -> dict[str, Entry]:
    return _split(text, "name")


def _load(entry: Entry) -> dict:
    try:
        doc = yaml.load(entry.text, Loader=_Loader)
    except yaml.YAMLError:
        return {}
    return doc[0] if isinstance(doc, list) and doc and isinstance(doc[0], dict) else {}


@lru_cache(maxsize=16384)
def parse_schema(func: str) -> FunctionSchema | None:
    try:
        return FunctionSchema.parse(func)
    except Exception:  # torchgen raises AssertionError/RuntimeError on schemas it does not accept
        return None


def _signature(fs: FunctionSchema) -> str:
    return f"({fs.arguments}) -> {fs.returns if len(fs.returns) != 1 else fs.returns[0]}"


def _expand_dispatch(entry: dict) -> dict[str, str]:
    out: dict[str, str] = {}
    disp = entry.get("dispatch")
    if isinstance(disp, dict):
        for keys, kernel in disp.items():
            for k in str(keys).split(","):
                out[k.strip()] = str(kernel)
    if entry.get("structured_delegate"):
        out["structured_delegate"] = str(entry["structured_delegate"])
    # No dispatch section and no delegate: codegen registers the op as CompositeImplicitAutograd.
    return out or {IMPLICIT: "(implicit)"}


def _tags(entry: dict) -> set[str]:
    tags = entry.get("tags") or []
    return {str(t) for t in ([tags] if isinstance(tags, str) else tags)}


def classify_schema(old: FunctionSchema, new: FunctionSchema) -> tuple[list[str], list[str]]:
    """Kinds of change between two schemas of one overload, and a readable detail for each."""
    kinds: list[str] = []
    details: list[str] = []

    def add(kind: str, detail: str) -> None:
        if kind not in kinds:
            kinds.append(kind)
        details.append(detail)

    oa = {a.name: a for a in old.arguments.flat_all}
    na = {a.name: a for a in new.arguments.flat_all}
    okw = {a.name for a in old.arguments.flat_kwarg_only} | {a.name for a in old.arguments.out}
    nkw = {a.name for a in new.arguments.flat_kwarg_only} | {a.name for a in new.arguments.out}
    gone = [n for n in oa if n not in na]
    came = [n for n in na if n not in oa]
    # Same count, same types, same places: the arguments were renamed, not replaced.
    if gone and len(gone) == len(came):
        opos = [a.name for a in old.arguments.flat_all]
        npos = [a.name for a in new.arguments.flat_all]
        if all(str(oa[g].type) == str(na[c].type) and opos.index(g) == npos.index(c) for g, c in zip(gone, came)):
            for g, c in zip(gone, came):
                add("argument_renamed", Msg(N_("argument {old!r} renamed to {new!r}"), old=g, new=c))
            gone, came = [], []
    for n in came:
        a = na[n]
        if a.default is not None:
            add("argument_added_with_default", Msg(N_("argument {type} {name}={default} added"),
                                                   type=str(a.type), name=n, default=a.default))
        else:
            add("argument_added_without_default", Msg(N_("argument {type} {name} added without a default"),
                                                      type=str(a.type), name=n))
    for n in gone:
        add("argument_removed", Msg(N_("argument {type} {name} removed"), type=str(oa[n].type), name=n))
    for n in oa:
        if n not in na:
            continue
        a, b = oa[n], na[n]
        if str(a.type) != str(b.type):
            add("argument_type_changed", Msg(N_("argument {name!r}: type {old} -> {new}"), name=n,
                                             old=str(a.type), new=str(b.type)))
        if a.default != b.default:
            add("argument_default_changed", Msg(N_("argument {name!r}: default {old} -> {new}"), name=n,
                                                old=a.default, new=b.default))
        if str(a.annotation) != str(b.annotation):
            add("alias_annotation_changed", Msg(N_("argument {name!r}: alias {old} -> {new}"), name=n,
                                                old=str(a.annotation), new=str(b.annotation)))
        if (n in okw) != (n in nkw):
            add("argument_kwarg_only_changed",
                Msg(N_("argument {name!r} became keyword-only") if n in nkw else
                    N_("argument {name!r} is no longer keyword-only"), name=n))
    common_old = [a.name for a in old.arguments.flat_all if a.name in na]
    common_new = [a.name for a in new.arguments.flat_all if a.name in oa]
    if common_old != common_new:
        add("argument_reordered", Msg(N_("arguments reordered: {names}"), names=", ".join(common_new)))
    if [str(r) for r in old.returns] != [str(r) for r in new.returns]:
        add("return_changed", Msg(N_("returns {old} -> {new}"), old=_rets(old), new=_rets(new)))
    if not kinds and str(old) != str(new):
        add("schema_changed", f"{old} -> {new}")
    return kinds, details


def _rets(fs: FunctionSchema) -> str:
    r = [str(x) for x in fs.returns]
    return r[0] if len(r) == 1 else f"({', '.join(r)})"


def _compare(key: str, old_e: Entry, new_e: Entry) -> OpChange | None:
    old_d, new_d = _load(old_e), _load(new_e)
    if old_d == new_d:
        return None
    ch = OpChange(op=key, change="changed", old=str(old_d.get("func")), new=str(new_d.get("func")), line=new_e.line)
    ofs, nfs = parse_schema(ch.old), parse_schema(ch.new)
    if ofs is not None and nfs is not None:
        if str(ofs) != str(nfs):
            ch.schema_differs = True
            ch.kinds, ch.details = classify_schema(ofs, nfs)
    elif ch.old != ch.new:
        ch.schema_differs = True
        ch.kinds, ch.details = ["schema_changed"], [f"{ch.old} -> {ch.new}"]
    od, nd = _expand_dispatch(old_d), _expand_dispatch(new_d)
    if od != nd:
        moved = sorted({k for k in od.keys() | nd.keys() if od.get(k) != nd.get(k)})
        ch.dispatch_keys_changed = moved
        ch.kinds.append("dispatch_changed")
        ch.details.append(Msg(N_("dispatch {keys}"), keys=", ".join(
            f"+{k}" if k not in od else f"-{k}" if k not in nd else f"~{k}" for k in moved)))
    ot, nt = _tags(old_d), _tags(new_d)
    if ot != nt:
        ch.kinds.append("tags_changed")
        ch.details.append(Msg(N_("tags {tags}"), tags=", ".join([f"+{t}" for t in sorted(nt - ot)]
                                                                + [f"-{t}" for t in sorted(ot - nt)])))
    skip = {"func", "dispatch", "tags", "structured_delegate"}
    for k in sorted((old_d.keys() | new_d.keys()) - skip):
        if old_d.get(k) != new_d.get(k):
            ch.kinds.append(f"field_changed:{k}")
            ch.details.append(f"{k}: {old_d.get(k)!r} -> {new_d.get(k)!r}")
    return ch if ch.kinds else None


def _func(e: Entry) -> str:
    """The schema of an entry; read off its first line when it holds it whole, the yaml way otherwise."""
    first = e.text.split("\n", 1)[0].split(" #", 1)[0].strip()
    if first.startswith("- func:"):
        first = first[len("- func:"):].strip()
        if first.count("(") == first.count(")") and "->" in first and not first.startswith(("'", '"')):
            return first
    return str(_load(e).get("func"))


def _pair_renames(removed: list[OpChange], added: list[OpChange]) -> list[OpChange]:
    """Pairs a removed and an added overload with the same signature and the same base name or overload name."""
    def sig(text: str | None) -> str | None:
        fs = parse_schema(text or "")
        return _signature(fs) if fs is not None else None

    out: list[OpChange] = []
    used_a: set[int] = set()
    for r in removed:
        rs = sig(r.old)
        rbase, _sep, rov = r.op.partition(".")
        cands = [i for i, a in enumerate(added) if i not in used_a and rs is not None and sig(a.new) == rs
                 and (a.op.partition(".")[0] == rbase or a.op.partition(".")[2] == rov)]
        if len(cands) == 1:
            a = added[cands[0]]
            used_a.add(cands[0])
            out.append(OpChange(op=a.op, change="renamed", kinds=["renamed"],
                                details=[Msg(N_("{old} renamed to {new}"), old=r.op, new=a.op)],
                                old=r.old, new=a.new, old_op=r.op, line=a.line, schema_differs=True))
        else:
            out.append(r)
    out.extend(a for i, a in enumerate(added) if i not in used_a)
    return out


def diff_native(old_text: str, new_text: str) -> list[OpChange]:
    """Every overload added, removed, renamed or changed between two texts of native_functions.yaml."""
    old, new = _changed_entries(old_text, new_text, "func")
    changed: list[OpChange] = []
    removed: list[OpChange] = []
    added: list[OpChange] = []
    for key, e in old.items():
        if key not in new:
            removed.append(OpChange(op=key, change="removed", kinds=["removed"],
                                    details=[Msg(N_("{op} removed"), op=key)], old=_func(e), line=e.line,
                                    schema_differs=True))
        else:
            c = _compare(key, e, new[key])
            if c:
                changed.append(c)
    for key, e in new.items():
        if key not in old:
            added.append(OpChange(op=key, change="added", kinds=["added"], details=[Msg(N_("{op} added"), op=key)],
                                  new=_func(e), line=e.line, schema_differs=True))
    return sorted(changed + _pair_renames(removed, added), key=lambda c: (c.op, c.change))


@dataclass
class DerivativeChange:
    op: str
    change: str  # added | removed | changed
    details: list[str]
    line: int


def diff_derivatives(old_text: str, new_text: str) -> list[DerivativeChange]:
    """Derivative entries whose formulas changed, keyed by the overload they differentiate."""
    old, new = _changed_entries(old_text, new_text, "name")
    out: list[DerivativeChange] = []
    for key in sorted(old.keys() | new.keys()):
        o, n = old.get(key), new.get(key)
        if o is None:
            out.append(DerivativeChange(key, "added", [Msg(N_("derivative formula added"))], n.line))
        elif n is None:
            out.append(DerivativeChange(key, "removed", [Msg(N_("derivative formula removed"))], o.line))
        else:
            od, nd = _load(o), _load(n)
            if od == nd:
                continue
            keys = sorted(k for k in od.keys() | nd.keys() if od.get(k) != nd.get(k))
            out.append(DerivativeChange(key, "changed", [Msg(N_("formula for {name!r} changed"), name=k)
                                                        for k in keys], n.line))
    return out


def op_base(key: str) -> str:
    """The operator family of an overload key: `add_.Tensor`, `add.out` -> `add`."""
    name = key.split("::")[-1].split(".", 1)[0]
    return re.sub(r"_$", "", name)
