"""`opforge op-adapt check PATH`: cross-check an adapted operator's files against each other.

An adaptation writes one parameter (a dtype list, a schema, a default) into several files; an edit by hand
to one of them leaves the others behind. Each rule below compares two sides that must agree and names both
when they do not. The rules are data (RULES), grouped by what they protect, the way an op lint is:

  registration  the overload is registered, with the schema torch has for it
  kernel        the C++ kernel's signature, checks and dtype lists are the CHECKLIST's
  tests         the op-test file tests the CHECKLIST's dtypes and gradients
  doc           the API page documents exactly the schema's arguments
  derivatives   a derivatives.yaml formula differentiates arguments the schema has
  meta          a Meta (fake) function takes the schema's arguments
  op-plugin     an op-plugin kernel's C++ signature is its `func:` schema's

Two layouts are recognised: the reference opdev tree (PATH/opdev_functions.yaml, whose adaptations are
PATH/adaptations/*/checklist.json; a custom operator's is registered in custom_functions.yaml instead, its kernel
is opdev::custom::<name>) and an op-plugin checkout (PATH/op_plugin/config/op_plugin_functions.yaml, whose
op_api kernels are checked against their `func:`). Only text is read: nothing is built or imported from the tree.
"""
from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from opforge.errors import InputError

OPDEV_YAML = "opdev_functions.yaml"
CUSTOM_YAML = "custom_functions.yaml"  # the custom operators of an opdev tree (opforge.backend.custom_ops)
OP_PLUGIN_YAML = "op_plugin/config/op_plugin_functions.yaml"
OP_PLUGIN_KERNELS = "op_plugin/ops/opapi"
_SKIP_DIRS = {".git", "__pycache__", "build", ".venv", "node_modules"}


@dataclass(frozen=True)
class Finding:
    file: str  # relative to the checked tree, with /
    line: int  # 1-based
    rule: str
    message: str

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "rule": self.rule, "message": self.message}


@dataclass
class Report:
    path: Path
    layout: str  # "reference" | "op-plugin"
    findings: list[Finding] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"path": str(self.path), "layout": self.layout, "findings": [f.to_json() for f in self.findings],
                "checked": self.checked}


# (file, line, message): what a rule's function yields; the runner adds the rule's id
Hit = tuple[str, int, str]


@dataclass(frozen=True)
class Rule:
    id: str
    group: str  # what the rule protects
    scope: str  # "adaptation": run once per adaptations/*/checklist.json; "tree": once per tree; "op-plugin"
    text: str  # the two sides that must agree
    fn: Callable[..., Iterator[Hit]]


# ---------------------------------------------------------------------------------------------------------------
# Reading: schemas, C++ signatures, TORCH_CHECKs, tables, Python assignments, yaml with line numbers
# ---------------------------------------------------------------------------------------------------------------

def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _first_line(text: str | None, pattern: str, default: int = 1) -> int:
    if text is None:
        return default
    m = re.search(pattern, text, flags=re.M)
    return _line_of(text, m.start()) if m else default


@dataclass(frozen=True)
class SchemaArg:
    name: str
    type: str
    default: str | None
    kwarg_only: bool


def _strip_namespace(schema: str) -> tuple[str, str]:
    """("ns", "name.overload(...) -> ...") from "ns::name.overload(...) -> ..." ("" when there is none)."""
    head = schema.split("(", 1)[0]
    if "::" in head:
        ns, rest = schema.split("::", 1)
        return ns.strip(), rest.strip()
    return "", schema.strip()


@functools.lru_cache(maxsize=4096)
def _parse_schema(schema: str):
    """torchgen's FunctionSchema of `schema` (a namespace is dropped), or None when torchgen cannot read it."""
    from torchgen.model import FunctionSchema

    try:
        return FunctionSchema.parse(_strip_namespace(schema)[1])
    except Exception:  # noqa: BLE001  torchgen raises AssertionError, RuntimeError, ValueError for bad schemas
        return None


def _schema_args(func) -> list[SchemaArg]:
    a = func.arguments
    return ([SchemaArg(x.name, str(x.type), x.default, False) for x in a.flat_positional]
            + [SchemaArg(x.name, str(x.type), x.default, True) for x in a.flat_kwarg_only]
            + [SchemaArg(x.name, str(x.type), x.default, True) for x in a.out])


def _schema_text(schema: str) -> str:
    """A schema in one canonical spelling (torchgen's), for comparing two of them."""
    func = _parse_schema(schema)
    return str(func) if func is not None else " ".join(schema.split())


@dataclass(frozen=True)
class CppParam:
    type: str
    name: str
    default: str | None
    line: int


@dataclass(frozen=True)
class CppFunction:
    name: str  # as written: "OpdevNativeFunctions::hypot", "atan2"
    returns: str
    params: tuple[CppParam, ...]
    line: int
    definition: bool  # False: a declaration (ends with `;`)
    body: tuple[int, int] = (0, 0)  # offsets of the body's braces, in the file's text


_CPP_KEYWORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof", "else",
                 "do", "new", "delete", "throw", "static_assert", "namespace", "using", "typedef", "template"}


def _mask(text: str) -> str:
    """`text` with comments and the insides of string and character literals blanked, same length and lines:
    brackets and commas in it are then the code's own."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [c if c == "\n" else " " for c in text[i:j]]
            i = j
        elif text[i] in "\"'":
            quote, j = text[i], i + 1
            while j < n and text[j] != quote and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j, n)
            out[i + 1:j] = " " * (j - i - 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _closing(masked: str, start: int) -> int:
    """The offset of the bracket that closes the one at `start`, or -1."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    opener, closer, depth = masked[start], pairs[masked[start]], 0
    for i in range(start, len(masked)):
        if masked[i] == opener:
            depth += 1
        elif masked[i] == closer:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_top(masked: str, start: int, end: int) -> list[tuple[int, int]]:
    """(start, end) of each comma-separated part of masked[start:end], commas inside brackets kept."""
    parts, depth, begin = [], 0, start
    for i in range(start, end):
        c = masked[i]
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append((begin, i))
            begin = i + 1
    if masked[begin:end].strip():
        parts.append((begin, end))
    return parts


def _param(text: str, masked: str, start: int, end: int) -> CppParam:
    eq = -1
    depth = 0
    for i in range(start, end):
        c = masked[i]
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "=" and depth == 0:
            eq = i
            break
    decl_end = eq if eq >= 0 else end
    decl = masked[start:decl_end]
    m = re.search(r"([A-Za-z_]\w*)\s*$", decl)
    type_part, name = decl, ""
    if m and decl[:m.start()].strip() and not decl[:m.start()].rstrip().endswith("::"):
        type_part, name = decl[:m.start()], m.group(1)
    name_at = start + (m.start() if m and name else len(decl) - len(decl.lstrip()))
    default = " ".join(text[eq + 1:end].split()) if eq >= 0 else None
    return CppParam(" ".join(type_part.split()), name, default, _line_of(text, name_at))


_DEF_NAME = re.compile(r"((?:[A-Za-z_]\w*\s*::\s*)*~?[A-Za-z_]\w*)\s*\(")


def cpp_functions(text: str) -> list[CppFunction]:
    """Every function defined or declared outside a function body in C++ source `text` (bodies are skipped)."""
    masked = _mask(text)
    found: list[CppFunction] = []
    pos = 0
    while True:
        m = _DEF_NAME.search(masked, pos)
        if m is None:
            return found
        pos = m.end()
        name = re.sub(r"\s+", "", m.group(1))
        if name.split("::")[-1] in _CPP_KEYWORDS or (m.start() and masked[m.start() - 1] in ".>:"):
            continue
        close = _closing(masked, m.end() - 1)
        if close < 0:
            return found
        after = re.match(r"\s*(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?([{;])", masked[close + 1:])
        before = masked[:m.start()]
        cut = max(before.rfind(";"), before.rfind("{"), before.rfind("}"))
        returns = "\n".join(ln for ln in before[cut + 1:].splitlines() if not ln.strip().startswith("#"))
        returns = " ".join(re.sub(r"\b(static|inline|virtual|explicit|TORCH_API|C10_EXPORT)\b", " ",
                                  returns).split())
        if after is None or not returns or "=" in returns or "(" in returns or returns.endswith(","):
            continue
        params = tuple(_param(text, masked, s, e) for s, e in _split_top(masked, m.end(), close))
        if len(params) == 1 and params[0].type in ("void", "") and not params[0].name:
            params = ()
        is_def = after.group(1) == "{"
        body = (0, 0)
        if is_def:
            brace = close + 1 + after.end() - 1
            end = _closing(masked, brace)
            body = (brace, end if end >= 0 else len(text))
            pos = body[1] + 1
        else:
            pos = close + 1 + after.end()
        found.append(CppFunction(name, returns, params, _line_of(text, m.start()), is_def, body))


_ALIAS = re.compile(r"\busing\s+([A-Za-z_]\w*)\s*=\s*([^;]+);|\btypedef\s+([^;]+?)\s+([A-Za-z_]\w*)\s*;")


def cpp_aliases(text: str) -> dict[str, str]:
    """The type aliases `using X = T;` and `typedef T X;` that a C++ file declares."""
    out = {}
    for m in _ALIAS.finditer(_mask(text)):
        if m.group(1):
            out[m.group(1)] = m.group(2)
        else:
            out[m.group(4)] = m.group(3)
    return out


def _cpp_type(t: str, aliases: dict[str, str] | None = None) -> str:
    """A C++ type in one spelling, so that two spellings of one parameter type compare equal: spaces only
    between words, no leading :: and no std::, c10::/torch:: as at::, the optionals as one, `T const&` as
    `const T&`, no top-level const on a parameter passed by value, and the file's aliases expanded."""
    t = " ".join(t.split())
    for _ in range(3):
        for name, target in (aliases or {}).items():
            t = re.sub(rf"(?<![\w:]){re.escape(name)}\b", target, t)
    t = re.sub(r"(^|[^\w:])\s*::", r"\1", " ".join(t.split()))
    t = re.sub(r"\s*([&*<>,:()\[\]])\s*", r"\1", t)
    t = re.sub(r"\b(?:c10|torch)::", "at::", t)
    t = re.sub(r"\bat::optional\b", "optional", t)
    t = re.sub(r"\bstd::", "", t)  # a file may say `using namespace std;`
    for spelled, alias in (("OptionalArrayRef<int64_t>", "OptionalIntArrayRef"),
                           ("OptionalArrayRef<at::SymInt>", "OptionalSymIntArrayRef"),
                           ("ArrayRef<int64_t>", "IntArrayRef"), ("ArrayRef<at::SymInt>", "SymIntArrayRef")):
        t = re.sub(rf"\bat::{re.escape(spelled)}", f"at::{alias}", t)
    m = re.fullmatch(r"(?!const )(.+?)\s*const\s*([&*]+)", t)
    if m:
        t = f"const {m.group(1)}{m.group(2)}"
    if t.startswith("const ") and not t.endswith(("&", "*")):
        t = t[len("const "):]
    return t


def _cpp_default(d: str | None) -> str | None:
    if d is None:
        return None
    d = _cpp_type(d)
    return re.sub(r"\bat::nullopt\b", "nullopt", d)


def _call_args(text: str, masked: str, callee: str, start: int, end: int) -> Iterator[tuple[int, list[str]]]:
    """For each call of `callee` in text[start:end]: its offset and its arguments' text."""
    for m in re.finditer(rf"(?<![\w:.]){callee}\s*\(", masked[start:end]):
        at = start + m.start()
        open_ = start + m.end() - 1
        close = _closing(masked, open_)
        if close < 0:
            continue
        yield at, [text[s:e].strip() for s, e in _split_top(masked, open_ + 1, close)]


def _c_string(arg: str) -> str | None:
    """The value of a C string literal (adjacent literals joined), or None when `arg` is not one."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', arg)
    if not parts or re.sub(r'"((?:[^"\\]|\\.)*)"', "", arg).strip():
        return None
    return "".join(parts).replace('\\"', '"').replace("\\\\", "\\")


_DTYPE_OF_CPP = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
                 "Char": "int8", "Byte": "uint8", "Short": "int16", "Int": "int32", "Long": "int64", "Bool": "bool"}


def _dtype_name(item: str) -> str:
    m = re.fullmatch(r"(?:(?:at|c10|torch)::)?(?:k|ScalarType::)(\w+)", item.strip())
    return _DTYPE_OF_CPP.get(m.group(1), item.strip()) if m else item.strip()


def _python_module(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _assignment(module: ast.Module, name: str) -> ast.Assign | None:
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
    return None


def _names(node: ast.expr) -> list[str] | None:
    """("float32", ...) from `(torch.float32, ...)`, ("self", ...) from `("self", ...)`; None for anything else."""
    if not isinstance(node, (ast.Tuple, ast.List)):
        return None
    out = []
    for e in node.elts:
        if isinstance(e, ast.Attribute):
            out.append(e.attr)
        elif isinstance(e, ast.Constant) and isinstance(e.value, str):
            out.append(e.value)
        elif isinstance(e, ast.Name):
            out.append(e.id)
        else:
            return None
    return out


@dataclass(frozen=True)
class DocRow:
    name: str
    type: str
    default: str | None  # None: "required"
    line: int


def _doc_table(text: str) -> tuple[list[DocRow], int] | None:
    """The rows of a page's `| name | type | default | description |` table (in any language op-apidoc writes)
    and the line a new row would go (after the last), or None when the page has no such table."""
    from opforge.skills.op_apidoc.page import table_words

    headers, required, _headings = table_words()
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        cells = [c.strip().lower() for c in ln.strip().strip("|").split("|")]
        if ln.lstrip().startswith("|") and tuple(cells[:3]) in headers:
            rows, j = [], i + 1
            if j < len(lines) and re.fullmatch(r"\s*\|[\s|:-]*\|?\s*", lines[j]):
                j += 1
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                c = [x.strip() for x in lines[j].strip().strip("|").split("|")]
                c += [""] * (3 - len(c))
                default = c[2].strip("`")
                rows.append(DocRow(c[0].strip("`"), c[1].strip("`"),
                                   None if default.lower() in required else default, j + 1))
                j += 1
            return rows, j + 1
    return None


def _yaml_nodes(text: str):
    import yaml

    try:
        return yaml.compose(text)
    except yaml.YAMLError:
        return None


def _scalar(node) -> str | None:
    import yaml

    return node.value if isinstance(node, yaml.ScalarNode) else None


def _yaml_entries(root) -> list:
    """The mapping nodes that carry a `name:` or `func:` key: a top-level list of them, or such lists that are
    the values of a top-level mapping (op-plugin's `backward:`, `official:`, `custom:` ...)."""
    import yaml

    lists = []
    if isinstance(root, yaml.SequenceNode):
        lists.append(root)
    elif isinstance(root, yaml.MappingNode):
        lists += [v for _, v in root.value if isinstance(v, yaml.SequenceNode)]
    return [e for seq in lists for e in seq.value if isinstance(e, yaml.MappingNode)]


def _files(root: Path, pattern: str) -> list[Path]:
    out = []
    for p in sorted(root.rglob(pattern)):
        rel = p.relative_to(root).parts
        if p.is_file() and not any(part in _SKIP_DIRS or part.startswith(".") for part in rel[:-1]):
            out.append(p)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The tree and one adaptation in it
# ---------------------------------------------------------------------------------------------------------------

class Tree:
    def __init__(self, root: Path, layout: str):
        self.root = root
        self.layout = layout
        self._texts: dict[str, str | None] = {}

    def text(self, rel: str) -> str | None:
        if rel not in self._texts:
            p = self.root / rel
            try:
                self._texts[rel] = p.read_text(errors="replace") if p.is_file() else None
            except OSError:
                self._texts[rel] = None
        return self._texts[rel]

    def rel(self, p: Path) -> str:
        return p.relative_to(self.root).as_posix()

    @functools.cached_property
    def adaptations(self) -> list[Adaptation]:
        out = []
        for p in sorted((self.root / "adaptations").glob("*/checklist.json")):
            rel = self.rel(p)
            try:
                data = json.loads(self.text(rel) or "")
            except json.JSONDecodeError as exc:
                data = {"_error": f"is not JSON: {exc.msg}", "_line": exc.lineno}
            if not isinstance(data, dict):
                data = {"_error": "is not a JSON object", "_line": 1}
            out.append(Adaptation(self, rel, data))
        return out

    @functools.cached_property
    def known_schemas(self) -> dict[str, list[tuple[str, str]]]:
        """Every schema the tree defines, by bare "name.overload": [(where, schema with its namespace)]. From
        schema.json, the CHECKLISTs, custom_functions.yaml, op_plugin_functions.yaml, TORCH_LIBRARY
        `m.def("...")` in C++ and `define(...)` calls in Python; last, for an op none of those defines,
        derivatives.yaml."""
        found: dict[str, list[tuple[str, str]]] = {}

        def add(where: str, ns: str, schema: str) -> None:
            func = _parse_schema(schema)
            if func is not None:
                found.setdefault(str(func.name), []).append((where, f"{ns}::{func}" if ns else str(func)))

        try:
            baseline = json.loads(self.text("schema.json") or "{}")
        except json.JSONDecodeError:
            baseline = {}
        if isinstance(baseline, dict):
            for op, schema in baseline.items():
                if isinstance(schema, str):
                    add("schema.json", _strip_namespace(f"{op}(")[0], schema)
        for a in self.adaptations:
            if isinstance(a.data.get("schema"), str):
                add(a.path, _strip_namespace(f"{a.op}(")[0], a.data["schema"])
        for _, schema in _custom_entries(self):
            add(CUSTOM_YAML, *_strip_namespace(schema))
        if self.layout == "op-plugin":
            for _, func, _ in self.op_plugin_entries:
                add(OP_PLUGIN_YAML, "", func)
        for p in _files(self.root, "*.cpp"):
            text = self.text(self.rel(p)) or ""
            if "TORCH_LIBRARY" not in text:
                continue
            for lib in re.finditer(r"TORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)", text):
                ns, var = lib.groups()
                for d in re.finditer(rf"\b{var}\s*\.\s*def\s*\(\s*\"([^\"]+)\"", text[lib.end():]):
                    if "(" in d.group(1):
                        add(self.rel(p), ns, d.group(1))
        for rel, module in self.python_modules:
            libs = _libraries(module)
            for node in ast.walk(module):
                if not (isinstance(node, ast.Call) and _callee(node) == "define"):
                    continue
                strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if len(strings) >= 2 and "::" in strings[0]:  # torch.library.define("ns::op", "(...) -> ...")
                    add(rel, *_strip_namespace(strings[0] + strings[1]))
                elif strings and "(" in strings[0]:  # lib.define("op(...) -> ...")
                    owner = node.func.value.id if isinstance(node.func, ast.Attribute) and isinstance(
                        node.func.value, ast.Name) else None
                    add(rel, libs.get(owner, ("", ""))[0], strings[0])
        for rel, _, schema, _ in _derivative_entries(self):  # autograd's codegen reads these schemas too
            if str(getattr(_parse_schema(schema), "name", "")) not in found:
                add(rel, "", schema)
        return found

    @functools.cached_property
    def python_modules(self) -> list[tuple[str, ast.Module]]:
        """The tree's Python files that register or define operators (tests aside), parsed."""
        out = []
        for p in _files(self.root, "*.py"):
            rel = self.rel(p)
            if rel.startswith(("tests/", "test/")):
                continue
            text = self.text(rel) or ""
            if not re.search(r"register_fake|impl_abstract|\bimpl\b|define\s*\(", text):
                continue
            module = _python_module(text)
            if module is not None:
                out.append((rel, module))
        return out

    @functools.cached_property
    def op_plugin_pairs(self) -> list[_Pair]:
        return _pair_kernels(self)

    @functools.cached_property
    def op_plugin_entries(self) -> list[tuple[int, str, dict]]:
        """(line, func, entry) for each `func:` of op_plugin_functions.yaml."""
        import yaml

        root = _yaml_nodes(self.text(OP_PLUGIN_YAML) or "")
        out = []
        for node in _yaml_entries(root):
            keys = {_scalar(k): v for k, v in node.value}
            func = _scalar(keys.get("func")) if "func" in keys else None
            if func:
                entry = {k: (yaml.safe_load(yaml.serialize(v)) if k != "func" else func) for k, v in keys.items()}
                out.append((keys["func"].start_mark.line + 1, func, entry))
        return out


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _libraries(module: ast.Module) -> dict[str, tuple[str, str]]:
    """Module-level `m = Library("ns", "IMPL", "Meta")`: {"m": ("ns", "Meta")}."""
    out = {}
    for node in module.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _callee(node.value) == "Library"
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            args = [a.value for a in node.value.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if args:
                out[node.targets[0].id] = (args[0], args[2] if len(args) > 2 else "")
    return out


class Adaptation:
    """One adaptations/<overload>/checklist.json and the files it lists."""

    def __init__(self, tree: Tree, path: str, data: dict):
        self.tree = tree
        self.path = path
        self.data = data

    @property
    def ok(self) -> bool:
        return "_error" not in self.data and isinstance(self.data.get("schema"), str)

    @property
    def op(self) -> str:
        return str(self.data.get("op") or Path(self.path).parent.name)

    @property
    def overload_name(self) -> str:
        name, overload = self.data.get("name", ""), self.data.get("overload", "")
        return f"{name}.{overload}" if overload else str(name)

    def file(self, kind: str, default: str) -> str:
        for f in self.data.get("files") or []:
            if isinstance(f, dict) and f.get("class") == kind and f.get("path"):
                return str(f["path"])
        return default

    def line(self, key: str) -> int:
        """The line of `"key":` in checklist.json."""
        return _first_line(self.tree.text(self.path), rf'^\s*"{re.escape(key)}"\s*:')

    @functools.cached_property
    def func(self):
        """The schema the C++ side is generated from: torchgen's for an ATen overload, else the CHECKLIST's."""
        if self.data.get("kind", "aten") == "aten":
            from opforge.backend.cpp import native_functions

            f = native_functions().get(self.overload_name)
            if f is not None:
                return f.func
        return _parse_schema(self.data.get("schema", ""))

    @functools.cached_property
    def args(self) -> list[SchemaArg] | None:
        func = _parse_schema(self.data.get("schema", ""))
        return _schema_args(func) if func is not None else None

    @property
    def kernel_path(self) -> str:
        return self.file("C++ kernel", f"ops/{self.data.get('class_name', '')}KernelOpdev.cpp")

    @property
    def test_path(self) -> str:
        return self.file("test (op-test)", f"tests/test_{self.overload_name.replace('.', '_')}_opdev.py")

    @property
    def doc_path(self) -> str:
        return self.file("API doc (op-apidoc)", f"docs/{self.overload_name}.md")

    @functools.cached_property
    def signature(self):
        """torchgen's NativeSignature for the overload, or None."""
        if self.func is None:
            return None
        return _native_signature(self.func, symint=False)

    @functools.cached_property
    def kernel(self) -> CppFunction | None:
        """The kernel's definition in its file (`OpdevNativeFunctions::<name>(...)`; a custom operator's
        `<name>(...)` in namespace opdev::custom): of several overloads, the one closest to the NativeSignature."""
        text = self.tree.text(self.kernel_path)
        if text is None or self.signature is None:
            return None
        name, expected = self.signature
        names = {self.kernel_name} | ({name, f"custom::{name}"} if self.custom else set())
        defs = [f for f in cpp_functions(text) if f.definition and f.name in names]
        return _closest(defs, expected[1], self.kernel_aliases)

    @property
    def custom(self) -> bool:
        return self.data.get("kind") == "custom"

    @property
    def kernel_name(self) -> str:
        """The kernel's qualified C++ name: OpdevNativeFunctions::<name>, or opdev::custom::<name> for a custom
        operator (custom_functions.yaml registers those)."""
        name = self.signature[0] if self.signature else self.data.get("name", "")
        return f"opdev::custom::{name}" if self.custom else f"OpdevNativeFunctions::{name}"

    @functools.cached_property
    def kernel_aliases(self) -> dict[str, str]:
        return cpp_aliases(self.tree.text(self.kernel_path) or "")


def _native_signature(func, *, symint: bool, ilistref: bool = False,
                      const_ref: bool = False) -> tuple[str, tuple[str, list[tuple[str, str, str | None]]]] | None:
    """(C++ name, (return type, [(name, C++ type, C++ default)])) of `func` as torchgen writes a backend
    kernel's declaration, or None when torchgen cannot. `ilistref`: tensor lists as at::ITensorListRef, as
    torchgen writes them for structured kernels; `const_ref`: the yaml's use_const_ref_for_mutable_tensors."""
    from torchgen import local
    from torchgen.api import cpp
    from torchgen.api.types import NativeSignature

    try:
        with local.parametrize(use_const_ref_for_mutable_tensors=const_ref, use_ilistref_for_tensor_lists=ilistref):
            sig = NativeSignature(func, symint=symint)
            params = [(a.name, a.type, a.default) for a in sig.arguments()]
            return cpp.name(func), (sig.returns_type().cpp_type(), params)
    except Exception:  # noqa: BLE001  torchgen asserts on types it has no C++ for
        return None


def _closest(defs: list[CppFunction], expected: list[tuple[str, str, str | None]],
             aliases: dict[str, str]) -> CppFunction | None:
    def score(f: CppFunction) -> tuple:
        same = sum(p.name == n and _cpp_type(p.type, aliases) == _cpp_type(t)
                   for p, (n, t, _) in zip(f.params, expected))
        return (len(f.params) == len(expected), same)

    return max(defs, key=score) if defs else None


# ---------------------------------------------------------------------------------------------------------------
# Rules: adaptation scope (each adaptations/*/checklist.json)
# ---------------------------------------------------------------------------------------------------------------

def _checklist_readable(a: Adaptation) -> Iterator[Hit]:
    if "_error" in a.data:
        yield a.path, a.data.get("_line", 1), f"{a.data['_error']}: no file of {a.op} can be cross-checked"
    elif not isinstance(a.data.get("schema"), str):
        yield a.path, 1, "has no `schema`: no file of this adaptation can be cross-checked"


def _files_present(a: Adaptation) -> Iterator[Hit]:
    line = a.line("files")
    for f in a.data.get("files") or []:
        path = f.get("path") if isinstance(f, dict) else None
        if str(f.get("action", "") if isinstance(f, dict) else "").startswith("none"):
            continue  # recorded as not written (a derivatives.yaml when no input gets a gradient)
        if path and a.tree.text(path) is None and not (a.tree.root / path).exists():
            yield a.path, line, f"lists {path} ({f.get('class', 'file')}), which the tree does not have"


def _custom_entries(t: Tree) -> list[tuple[int, str]]:
    """(line, "ns::schema") of each `- func:` of custom_functions.yaml."""
    out = []
    for node in _yaml_entries(_yaml_nodes(t.text(CUSTOM_YAML) or "")):
        for k, v in node.value:
            if _scalar(k) == "func" and _scalar(v):
                out.append((v.start_mark.line + 1, _scalar(v)))
    return out


def _custom_entry(a: Adaptation) -> tuple[int, str] | None:
    ns = _strip_namespace(a.data["schema"])[0]
    func = _parse_schema(a.data["schema"])
    for line, schema in _custom_entries(a.tree):
        other = _parse_schema(schema)
        if other is not None and func is not None and _strip_namespace(schema)[0] == ns \
                and str(other.name) == str(func.name):
            return line, schema
    return None


def _registration_listed(a: Adaptation) -> Iterator[Hit]:
    import yaml

    if a.custom:
        if _custom_entry(a) is None:
            text = a.tree.text(CUSTOM_YAML) or ""
            yield (CUSTOM_YAML, max(1, len(text.splitlines())),
                   f"has no `- func:` for {a.op}, which {a.path} adapts (its schema is never defined, nor its "
                   "kernel registered)")
        return

    text = a.tree.text(OPDEV_YAML) or ""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        yield OPDEV_YAML, (mark.line + 1) if mark else 1, f"is not YAML, so {a.overload_name} is not registered"
        return
    supported = [s if isinstance(s, str) else (s or {}).get("func", "") for s in data.get("supported") or []]
    if a.overload_name not in supported:
        line = _first_line(text, r"^autograd:", default=len(text.splitlines()) or 1)
        yield (OPDEV_YAML, line, f"`supported` does not list {a.overload_name}, which {a.path} adapts "
                                 "(the kernel is never registered to PrivateUse1)")


def _registration_schema_baseline(a: Adaptation) -> Iterator[Hit]:
    entry = _custom_entry(a) if a.custom else None
    if entry is not None and _schema_text(entry[1]) != _schema_text(a.data["schema"]):
        yield CUSTOM_YAML, entry[0], f"defines `{entry[1]}`; {a.path} has `{a.data['schema']}`"
    text = a.tree.text("schema.json")
    try:
        baseline = json.loads(text) if text is not None else {}
    except json.JSONDecodeError as exc:
        yield "schema.json", exc.lineno, f"is not JSON ({exc.msg}), so it holds no schema for {a.op}"
        return
    line = _first_line(text, rf'^\s*"{re.escape(a.op)}"\s*:')
    got = baseline.get(a.op) if isinstance(baseline, dict) else None
    if got is None:
        yield "schema.json", 1, f"has no schema for {a.op}; {a.path} has `{a.data['schema']}`"
    elif _schema_text(str(got)) != _schema_text(a.data["schema"]):
        yield "schema.json", line, f"has `{got}` for {a.op}; {a.path} has `{a.data['schema']}`"


def _registration_schema_torchgen(a: Adaptation) -> Iterator[Hit]:
    if a.data.get("kind", "aten") != "aten":
        return
    from opforge.backend.cpp import native_functions

    f = native_functions().get(a.overload_name)
    if f is None:
        yield a.path, a.line("op"), f"names {a.op}, which torchgen's native_functions.yaml does not have"
    elif _schema_text(a.data["schema"]) != str(f.func):
        yield (a.path, a.line("schema"), f"has the schema `{a.data['schema']}`; torchgen's native_functions.yaml "
                                         f"has `{f.func}` for {a.op}")


def _kernel_signature(a: Adaptation) -> Iterator[Hit]:
    text = a.tree.text(a.kernel_path)
    if text is None or a.signature is None:
        return
    name, (returns, expected) = a.signature
    k = a.kernel
    want = f"{returns} {name}({', '.join(f'{t} {n}' for n, t, _ in expected)})"
    if k is None:
        yield (a.kernel_path, _first_line(text, r"^namespace\s+opdev"),
               f"defines no {a.kernel_name}(...); torchgen's NativeSignature for {a.op} is `{want}`")
        return
    name = a.kernel_name
    if _cpp_type(k.returns, a.kernel_aliases) != _cpp_type(returns):
        yield (a.kernel_path, k.line, f"{name} returns `{k.returns}`; torchgen's "
                                      f"NativeSignature for {a.op} returns `{returns}`")
    if len(k.params) != len(expected):
        yield (a.kernel_path, k.line,
               f"{name} takes {len(k.params)} parameters "
               f"({', '.join(p.name for p in k.params)}); torchgen's NativeSignature for {a.op} takes "
               f"{len(expected)} ({', '.join(n for n, _, _ in expected)})")
        return
    for i, (p, (n, t, _)) in enumerate(zip(k.params, expected), 1):
        if p.name != n:
            yield (a.kernel_path, p.line, f"parameter {i} of {name} is named `{p.name}`; "
                                          f"torchgen's NativeSignature for {a.op} names it `{n}`")
        if _cpp_type(p.type, a.kernel_aliases) != _cpp_type(t):
            yield (a.kernel_path, p.line, f"parameter `{p.name}` of {name} has the C++ type "
                                          f"`{p.type}`; torchgen's NativeSignature for {a.op} has `{t}`")


def _kernel_default(a: Adaptation) -> Iterator[Hit]:
    k = a.kernel
    if k is None or a.signature is None or len(k.params) != len(a.signature[1][1]):
        return  # a kernel with other parameters: kernel-signature says so
    schema_defaults = {x.name: x.default for x in a.args or []}
    for p, (n, _, d) in zip(k.params, a.signature[1][1]):
        if p.default is not None and _cpp_default(p.default) != _cpp_default(d):
            theirs = f"`{d}` (the schema's `{schema_defaults.get(n)}`)" if d is not None else "no default"
            yield (a.kernel_path, p.line, f"parameter `{p.name}` defaults to `{p.default}`; torchgen's "
                                          f"NativeSignature for {a.op} gives it {theirs}")


def _body_calls(a: Adaptation, callee: str) -> Iterator[tuple[int, list[str]]]:
    k = a.kernel
    text = a.tree.text(a.kernel_path)
    if k is None or text is None:
        return iter(())
    return _call_args(text, _mask(text), callee, k.body[0], k.body[1])


def _without_dtype_lists(cond: str) -> str:
    return re.sub(r"(dtype_in\s*\([^,]*,\s*)\{[^}]*\}", r"\1{...}", "".join(cond.split()))


def _kernel_checks(a: Adaptation) -> Iterator[Hit]:
    k = a.kernel
    if k is None:
        return
    text = a.tree.text(a.kernel_path) or ""
    checks = []  # (line, condition, message)
    for at, args in _body_calls(a, "TORCH_CHECK"):
        if args:
            checks.append((_line_of(text, at), args[0], _c_string(", ".join(args[1:]))))
    body_line = _line_of(text, k.body[0]) + 1
    for c in a.data.get("constraints") or []:
        same = [x for x in checks if x[2] == c.get("message")]
        cond = [x for x in checks if _without_dtype_lists(x[1]) == _without_dtype_lists(c.get("cpp", ""))]
        if not same and cond:
            yield (a.kernel_path, cond[0][0], f"the TORCH_CHECK of `{cond[0][1]}` raises \"{cond[0][2]}\"; "
                                              f"{a.path} constraint `{c.get('id')}` raises \"{c.get('message')}\"")
        elif not same:
            yield (a.kernel_path, body_line,
                   f"{a.kernel_name} has no TORCH_CHECK raising \"{c.get('message')}\"; "
                   f"{a.path} lists constraint `{c.get('id')}` with `TORCH_CHECK({c.get('cpp')}, ...)`")
        elif all(_without_dtype_lists(x[1]) != _without_dtype_lists(c.get("cpp", "")) for x in same):
            yield (a.kernel_path, same[0][0], f"the TORCH_CHECK raising \"{c.get('message')}\" tests `{same[0][1]}`; "
                                              f"{a.path} constraint `{c.get('id')}` tests `{c.get('cpp')}`")


def _kernel_dtypes(a: Adaptation) -> Iterator[Hit]:
    text = a.tree.text(a.kernel_path) or ""
    want = list(a.data.get("dtypes") or [])
    for at, args in _body_calls(a, r"(?:op_api::)?dtype_in"):
        if len(args) < 2 or not args[1].startswith("{"):
            continue
        got = [_dtype_name(x) for x in args[1].strip("{}").split(",") if x.strip()]
        if set(got) != set(want):
            diff = _set_difference(got, want)
            yield (a.kernel_path, _line_of(text, at),
                   f"dtype_in({args[0]}, ...) accepts {', '.join(got) or 'nothing'}; {a.path} dtypes are "
                   f"{', '.join(want)}{diff}")


def _set_difference(got: list[str], want: list[str]) -> str:
    extra = [x for x in got if x not in want]
    missing = [x for x in want if x not in got]
    parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"extra {', '.join(extra)}"] if extra else [])
    return f" ({'; '.join(parts)})" if parts else ""


def _test_values(a: Adaptation, name: str) -> tuple[int, list[str] | str] | None:
    """(line, the names in `name = (...)`) in the test file; a string says why there are none."""
    text = a.tree.text(a.test_path)
    if text is None:
        return None
    try:
        module = ast.parse(text)
    except SyntaxError as exc:
        return exc.lineno or 1, f"does not parse ({exc.msg}), so it has no {name}"
    node = _assignment(module, name)
    if node is None:
        return 1, f"has no {name} = (...)"
    got = _names(node.value)
    return node.lineno, got if got is not None else f"{name} is not a tuple of names"


def _tests_dtypes(a: Adaptation) -> Iterator[Hit]:
    found = _test_values(a, "DTYPES")
    if found is None:
        return
    line, got = found
    want = list(a.data.get("dtypes") or [])
    if isinstance(got, str):
        yield a.test_path, line, f"{got} to compare with {a.path} dtypes ({', '.join(want)})"
    elif set(got) != set(want) or len(got) != len(set(got)):
        yield (a.test_path, line, f"DTYPES is ({', '.join(got)}); {a.path} dtypes are ({', '.join(want)})"
                                  f"{_set_difference(got, want)}")


def _tests_grad_inputs(a: Adaptation) -> Iterator[Hit]:
    found = _test_values(a, "GRAD_INPUTS")
    if found is None:
        return
    line, got = found
    want = list((a.data.get("backward") or {}).get("differentiable") or [])
    if isinstance(got, str):
        yield (a.test_path, line, f"{got} to compare with {a.path} backward differentiable "
                                  f"({', '.join(want) or 'none'})")
    elif set(got) != set(want):
        yield (a.test_path, line, f"GRAD_INPUTS is ({', '.join(got)}); {a.path} backward differentiable is "
                                  f"({', '.join(want)}){_set_difference(got, want)}")


def _doc(a: Adaptation) -> tuple[list[DocRow], int] | None:
    text = a.tree.text(a.doc_path)
    if text is None or a.args is None:
        return None
    from opforge.skills.op_apidoc.page import table_words

    headings = "|".join(re.escape(h) for h in table_words()[2])
    return _doc_table(text) or ([], _first_line(text, rf"^(?:{headings})"))


def _doc_undocumented(a: Adaptation) -> Iterator[Hit]:
    table = _doc(a)
    if table is None:
        return
    rows, end = table
    documented = {r.name: r for r in rows}
    previous = None
    for x in a.args:
        if x.name in documented:
            previous = documented[x.name]
            continue
        line = previous.line + 1 if previous else (rows[0].line if rows else end)
        yield (a.doc_path, line, f"undocumented argument: the parameters table has no row for `{x.name}` (`{x.type}`, "
                                 f"{_default_words(x.default)}); the schema `{a.data['schema']}` has it")


def _default_words(d: str | None) -> str:
    return f"default `{d}`" if d is not None else "required"


def _doc_unknown(a: Adaptation) -> Iterator[Hit]:
    table = _doc(a)
    if table is None:
        return
    names = {x.name for x in a.args}
    for r in table[0]:
        if r.name not in names:
            yield (a.doc_path, r.line, f"documents an argument that does not exist: `{r.name}` is not in the "
                                       f"schema `{a.data['schema']}`")


def _doc_type(a: Adaptation) -> Iterator[Hit]:
    table = _doc(a)
    if table is None:
        return
    rows = {r.name: r for r in table[0]}
    for x in a.args:
        r = rows.get(x.name)
        if r is not None and "".join(r.type.split()) != "".join(x.type.split()):
            yield a.doc_path, r.line, f"documents `{x.name}` as `{r.type}`; the schema has `{x.type}`"


def _doc_default(a: Adaptation) -> Iterator[Hit]:
    table = _doc(a)
    if table is None:
        return
    rows = {r.name: r for r in table[0]}
    for x in a.args:
        r = rows.get(x.name)
        if r is not None and r.default != x.default:
            yield (a.doc_path, r.line, f"documents `{x.name}` as {_default_words(r.default)}; the schema has "
                                       f"{_default_words(x.default)}")


# ---------------------------------------------------------------------------------------------------------------
# Rules: tree scope (derivatives.yaml, Meta/fake registrations), any layout
# ---------------------------------------------------------------------------------------------------------------

_NOT_ARGUMENTS = re.compile(r"name|version|dispatch|output_differentiability|result\d*")


def _derivative_entries(t: Tree) -> Iterator[tuple[str, int, str, list[tuple[int, str]]]]:
    """(file, line of `name:`, schema, [(line, formula key)]) of every entry of every derivatives.yaml."""
    for p in _files(t.root, "derivatives.yaml"):
        rel = t.rel(p)
        for node in _yaml_entries(_yaml_nodes(t.text(rel) or "")):
            pairs = [(_scalar(k), k, v) for k, v in node.value]
            name = next(((_scalar(v), k.start_mark.line + 1) for key, k, v in pairs if key == "name"), None)
            if name is None or not name[0]:
                continue
            keys = [(k.start_mark.line + 1, key) for key, k, _ in pairs
                    if key and not _NOT_ARGUMENTS.fullmatch(key)]
            yield rel, name[1], name[0], keys


def _derivatives_arguments(t: Tree) -> Iterator[Hit]:
    for rel, line, schema, keys in _derivative_entries(t):
        func = _parse_schema(schema)
        if func is None:
            yield rel, line, f"`{schema}` is not a schema torchgen can read, so its formulas name no argument"
            continue
        names = [x.name for x in _schema_args(func)]
        for key_line, key in keys:
            for k in (s.strip() for s in key.split(",")):
                if k and k not in names:
                    yield (rel, key_line, f"the formula key `{k}` names no argument of `{schema}` "
                                          f"(arguments: {', '.join(names)})")


def _derivatives_schema(t: Tree) -> Iterator[Hit]:
    for rel, line, schema, _ in _derivative_entries(t):
        func = _parse_schema(schema)
        known = [k for k in t.known_schemas.get(str(func.name), []) if not k[0].endswith("derivatives.yaml")
                 ] if func is not None else None
        if not known:
            continue
        mine = str(func)
        if all(_schema_text(s) != mine for _, s in known):
            where, other = known[0]
            yield rel, line, f"the entry's schema is `{schema}`; {where} has `{other}`"


def _meta_functions(t: Tree) -> Iterator[tuple[str, ast.FunctionDef, str, int]]:
    """(file, function, "ns::op[.overload]", decorator line) of each Meta or fake registration."""
    for rel, module in t.python_modules:
        libs = _libraries(module)
        for node in ast.walk(module):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for d in node.decorator_list:
                if not isinstance(d, ast.Call):
                    continue
                strings = [a.value for a in d.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                callee = _callee(d)
                op = None
                if callee in ("register_fake", "impl_abstract") and strings:
                    op = strings[0]
                elif callee == "impl" and d.args:
                    first = d.args[0]
                    if isinstance(first, ast.Name) and first.id in libs and libs[first.id][1] == "Meta" and strings:
                        op = f"{libs[first.id][0]}::{strings[0]}"  # @impl(m, "op") with m a Meta Library
                    elif len(strings) >= 2 and "::" in strings[0] and strings[1] == "Meta":
                        op = strings[0]  # @torch.library.impl("ns::op", "Meta")
                if op:
                    yield rel, node, op, d.lineno


def _schema_for(t: Tree, op: str) -> tuple[str, str] | None:
    ns, rest = _strip_namespace(op + "(")
    name = rest[:-1].removesuffix(".default")
    known = t.known_schemas.get(name) or []
    same_ns = [k for k in known if _strip_namespace(k[1])[0] in (ns, "")]
    return (same_ns or known or [None])[0]


def _meta_schema(t: Tree) -> Iterator[Hit]:
    for rel, fn, op, line in _meta_functions(t):
        if _schema_for(t, op) is None:
            yield (rel, line, f"{fn.name} is registered as the Meta function of {op}, whose schema the tree does "
                              "not define (schema.json, a CHECKLIST, TORCH_LIBRARY m.def or a define() call)")


def _meta_parameters(t: Tree) -> Iterator[Hit]:
    for rel, fn, op, _ in _meta_functions(t):
        found = _schema_for(t, op)
        func = _parse_schema(found[1]) if found else None
        if func is None:
            continue
        params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        got = [p.arg for p in params]
        want = [x.name for x in _schema_args(func)]
        if got != want:
            first = next((p for p, w in zip(params, want) if p.arg != w), None)
            yield (rel, first.lineno if first else fn.lineno,
                   f"{fn.name}, the Meta function of {op}, takes ({', '.join(got)}); the schema `{found[1]}` "
                   f"({found[0]}) has ({', '.join(want)})")


# ---------------------------------------------------------------------------------------------------------------
# Rules: op-plugin layout (op_plugin_functions.yaml `func:` against op_plugin/ops/opapi/*.cpp)
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class _Pair:
    file: str
    kernel: CppFunction
    yaml_line: int
    func: str
    expected: tuple[str, list[tuple[str, str, str | None]]]  # (returns, params) of the closest symint variant
    aliases: dict[str, str] = field(default_factory=dict)  # the kernel file's type aliases


def _op_plugin_pairs(t: Tree) -> list[_Pair]:
    """Each hand-written op_api kernel paired with the `func:` entry it implements: the entry whose C++ types it
    has, else the one (same name and parameter count) it is closest to."""
    return t.op_plugin_pairs


def _op_api_name(k: CppFunction) -> str:
    """The C++ name of the overload an op_api kernel implements: op-plugin names a SymInt kernel `<name>_symint`."""
    return k.name.removeprefix("op_api::").removesuffix("_symint")


def _pair_kernels(t: Tree) -> list[_Pair]:
    by_name: dict[str, list[tuple[int, str, list]]] = {}
    for line, func_text, entry in t.op_plugin_entries:
        if "op_api" not in entry or "gen_opapi" in entry:  # acl_op only, or generated: no hand-written kernel
            continue
        func = _parse_schema(func_text)
        if func is None:
            continue
        const_ref = bool(entry.get("use_const_ref_for_mutable_tensors"))
        variants = [s for s in (_native_signature(func, symint=sym, ilistref=ilist, const_ref=const_ref)
                                for ilist in (False, True) for sym in (False, True)) if s]
        if variants:
            by_name.setdefault(variants[0][0], []).append((line, func_text, [v[1] for v in variants]))
    kernels = []  # (file, kernel, aliases)
    folder = t.root / OP_PLUGIN_KERNELS
    for p in sorted(folder.glob("*.cpp")) if folder.is_dir() else []:
        rel = t.rel(p)
        text = t.text(rel) or ""
        aliases = cpp_aliases(text)
        kernels += [(rel, k, aliases) for k in cpp_functions(text) if _op_api_name(k) in by_name]

    def fits(k: CppFunction, aliases: dict, variant) -> bool:
        return [_cpp_type(x.type, aliases) for x in k.params] == [_cpp_type(x[1]) for x in variant[1]]

    pairs: list[_Pair] = []
    matched: set[str] = set()  # the schemas some kernel has exactly (a schema may be listed in two sections)
    loose = []
    for rel, k, aliases in kernels:
        entries = by_name[_op_api_name(k)]
        exact = [(e, v) for e in entries for v in e[2] if fits(k, aliases, v)]
        if exact:
            (line, func_text, _), variant = exact[0]
            matched.add(_schema_text(func_text))
            pairs.append(_Pair(rel, k, line, func_text, variant, aliases))
        else:
            loose.append((rel, k, aliases, entries))
    # A kernel with no entry of its types implements the entry of its name that no kernel has (closest first);
    # when every such entry has its kernel, it is a helper or an overload torchgen cannot read: not judged.
    for rel, k, aliases, entries in loose:
        free = [(e, v) for e in entries if _schema_text(e[1]) not in matched for v in e[2]]
        if not free:
            continue
        (line, func_text, _), variant = max(free, key=lambda ev, k=k: (
            len(ev[1][1]) == len(k.params), sum(x.name == n for x, (n, _, _) in zip(k.params, ev[1][1]))))
        pairs.append(_Pair(rel, k, line, func_text, variant, aliases))
    return pairs


def _op_plugin_signature(t: Tree) -> Iterator[Hit]:
    for pr in _op_plugin_pairs(t):
        k, (returns, expected) = pr.kernel, pr.expected
        where = f"{OP_PLUGIN_YAML}:{pr.yaml_line} `{pr.func}`"
        if len(k.params) != len(expected):
            yield (pr.file, k.line, f"{k.name} takes {len(k.params)} parameters "
                                    f"({', '.join(p.name for p in k.params)}); {where} gives {len(expected)} "
                                    f"({', '.join(n for n, _, _ in expected)})")
            continue
        for p, (n, ty, _) in zip(k.params, expected):
            if _cpp_type(p.type, pr.aliases) != _cpp_type(ty):
                yield (pr.file, p.line, f"parameter `{p.name}` of {k.name} has the C++ type `{p.type}`; "
                                        f"{where} gives `{ty}`")
        if _cpp_type(k.returns, pr.aliases) != _cpp_type(returns) and k.definition:
            yield pr.file, k.line, f"{k.name} returns `{k.returns}`; {where} gives `{returns}`"


def _op_plugin_names(t: Tree) -> Iterator[Hit]:
    for pr in _op_plugin_pairs(t):
        k, expected = pr.kernel, pr.expected[1]
        if len(k.params) != len(expected):
            continue
        for i, (p, (n, _, _)) in enumerate(zip(k.params, expected), 1):
            if p.name and p.name != n:
                yield (pr.file, p.line, f"parameter {i} of {k.name} is named `{p.name}`; "
                                        f"{OP_PLUGIN_YAML}:{pr.yaml_line} `{pr.func}` names it `{n}`")


def _op_plugin_defaults(t: Tree) -> Iterator[Hit]:
    for pr in _op_plugin_pairs(t):
        k, expected = pr.kernel, pr.expected[1]
        if len(k.params) != len(expected):
            continue
        for p, (n, _, d) in zip(k.params, expected):
            if p.default is not None and _cpp_default(p.default) != _cpp_default(d):
                theirs = f"the default `{d}`" if d is not None else "no default"
                yield (pr.file, p.line, f"parameter `{p.name}` of {k.name} defaults to `{p.default}`; "
                                        f"{OP_PLUGIN_YAML}:{pr.yaml_line} `{pr.func}` gives `{n}` {theirs}")


RULES: tuple[Rule, ...] = (
    Rule("checklist-readable", "registration", "adaptation",
         "checklist.json is JSON with a schema", _checklist_readable),
    Rule("checklist-files", "registration", "adaptation",
         "every file the CHECKLIST lists exists", _files_present),
    Rule("registration-listed", "registration", "adaptation",
         "opdev_functions.yaml `supported` lists the adapted overload (a custom operator: custom_functions.yaml "
         "defines it)", _registration_listed),
    Rule("registration-schema", "registration", "adaptation",
         "schema.json's (and custom_functions.yaml's) schema for the op equals the CHECKLIST's",
         _registration_schema_baseline),
    Rule("registration-torchgen", "registration", "adaptation",
         "the CHECKLIST's schema equals torchgen's native_functions.yaml schema", _registration_schema_torchgen),
    Rule("kernel-signature", "kernel", "adaptation",
         "the kernel's parameter names and C++ types are torchgen's NativeSignature", _kernel_signature),
    Rule("kernel-default", "kernel", "adaptation",
         "a C++ parameter's default equals the schema's (as NativeSignature.decl() writes it)", _kernel_default),
    Rule("kernel-check", "kernel", "adaptation",
         "every CHECKLIST constraint has its TORCH_CHECK, condition and message", _kernel_checks),
    Rule("kernel-dtypes", "kernel", "adaptation",
         "each op_api::dtype_in(x, {...}) list equals the CHECKLIST dtypes", _kernel_dtypes),
    Rule("tests-dtypes", "tests", "adaptation",
         "the test file's DTYPES equals the CHECKLIST dtypes (any order)", _tests_dtypes),
    Rule("tests-grad-inputs", "tests", "adaptation",
         "the test file's GRAD_INPUTS equals the CHECKLIST backward differentiable", _tests_grad_inputs),
    Rule("doc-undocumented", "doc", "adaptation",
         "every schema argument has a row in the doc's parameters table", _doc_undocumented),
    Rule("doc-unknown-argument", "doc", "adaptation",
         "every row of the parameters table is a schema argument", _doc_unknown),
    Rule("doc-type", "doc", "adaptation",
         "a documented argument's type is the schema's", _doc_type),
    Rule("doc-default", "doc", "adaptation",
         "a documented argument's default is the schema's (`required` when it has none)", _doc_default),
    Rule("derivatives-argument", "derivatives", "tree",
         "each derivatives.yaml formula key names an argument of the entry's schema", _derivatives_arguments),
    Rule("derivatives-schema", "derivatives", "tree",
         "a derivatives.yaml entry's schema equals the one the tree registers", _derivatives_schema),
    Rule("meta-schema", "meta", "tree",
         "a Meta/fake function is registered for an op whose schema the tree defines", _meta_schema),
    Rule("meta-parameters", "meta", "tree",
         "a Meta/fake function's parameter names are the schema's argument names, in order", _meta_parameters),
    Rule("op-plugin-signature", "op-plugin", "op-plugin",
         "an op_api kernel's C++ types and parameter count are its func: schema's", _op_plugin_signature),
    Rule("op-plugin-parameter-name", "op-plugin", "op-plugin",
         "an op_api kernel's parameter names are its func: schema's", _op_plugin_names),
    Rule("op-plugin-default", "op-plugin", "op-plugin",
         "a C++ default of an op_api kernel equals its func: schema's", _op_plugin_defaults),
)


# ---------------------------------------------------------------------------------------------------------------
# Running the rules, and the command
# ---------------------------------------------------------------------------------------------------------------

def layout_of(path: Path) -> str:
    if (path / OPDEV_YAML).is_file():
        return "reference"
    if (path / OP_PLUGIN_YAML).is_file():
        return "op-plugin"
    raise InputError(str(path), f"not an adapted tree: it has neither {OPDEV_YAML} (the reference opdev layout) "
                                f"nor {OP_PLUGIN_YAML} (op-plugin)")


def run(path: Path) -> Report:
    """Every rule over the tree at `path`."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(str(path), "not a directory" if path.exists() else "no such directory")
    layout = layout_of(path)
    tree = Tree(path, layout)
    report = Report(path, layout)
    hits: list[Finding] = []
    for rule in RULES:
        if rule.scope == "adaptation":
            if layout != "reference":
                continue
            for a in tree.adaptations:
                if not a.ok and rule.id != "checklist-readable":
                    continue
                hits += [Finding(f, max(1, ln), rule.id, msg) for f, ln, msg in rule.fn(a)]
        elif rule.scope == "tree" or rule.scope == layout:
            hits += [Finding(f, max(1, ln), rule.id, msg) for f, ln, msg in rule.fn(tree)]
    report.findings = sorted(set(hits), key=lambda f: (f.file, f.line, f.rule, f.message))
    if layout == "reference":
        report.checked = [a.op for a in tree.adaptations]
    else:
        report.checked = sorted({pr.func.split("(")[0] for pr in _op_plugin_pairs(tree)})
    return report


def check(path: Path) -> list[Finding]:
    """The disagreements between the files of the adaptations in the tree at `path`."""
    return run(path).findings


def check_command(path: Path | None, as_json: bool) -> None:
    import typer

    from opforge.i18n import _

    if path is None:
        report_where, what = "PATH", "missing: give the adapted tree to cross-check (`opforge op-adapt check PATH`)"
        _fail(report_where, what, as_json)
    try:
        report = run(path)
    except InputError as exc:
        _fail(exc.where, exc.what, as_json)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    elif report.findings:
        for f in report.findings:
            typer.echo(f"{path / f.file}:{f.line}: [{f.rule}] {f.message}")
    else:
        ok = (_("OK: {path}: {n} adaptation(s) cross-checked, no disagreement") if report.layout == "reference"
              else _("OK: {path}: {n} op_api kernel(s) cross-checked, no disagreement"))
        typer.echo(ok.format(path=path, n=len(report.checked)))
    if report.findings:
        raise typer.Exit(1)


def _fail(where: str, what: str, as_json: bool):
    import typer

    from opforge.errors import report_error

    report_error(typer.echo, where, what, as_json=as_json)
    raise typer.Exit(2)
