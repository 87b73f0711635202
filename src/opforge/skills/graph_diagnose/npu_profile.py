"""The torch_npu profile, learned from a torch-npu wheel's sources read as data (never imported): which ops
its graph modes (torchair's GE converters, npugraph_ex) ship no converter for, the error messages its converter
layer raises (as patterns, with where they are raised), and the environment and log variables it reads. With
a profile, `graph diagnose` and `graph logs` conclude on torchair's errors as they do on torch's.

    opforge graph learn-npu torch_npu-2.13.0-...whl [--out FILE]
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import string
import zipfile
from pathlib import Path

GRAPH_PACKAGES = ("torch_npu/dynamo/torchair/", "torch_npu/dynamo/npugraph_ex/", "torch_npu/npu/npugraph_ex/",
                  "torch_npu/npu/_npugraph")
NOT_IMPLEMENTED = re.compile(r"^(?P<op>torch\.ops\.[\w.]+) ge_converter is not implemented")
ENV_READERS = {("os", "getenv"), ("environ", "get")}
PROFILE_ENV = "OPFORGE_NPU_PROFILE"  # where `graph diagnose` looks for a learned profile


def default_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "opforge" / "torch_npu_profile.json"


def _strings(node: ast.AST, names: dict[str, str]) -> str | None:
    """A string expression's text: constants, `+` of strings, implicit concatenation, names of earlier ones."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _strings(node.left, names), _strings(node.right, names)
        return a + b if a is not None and b is not None else None
    if isinstance(node, ast.Name):
        return names.get(node.id)
    return None


def _template_pattern(template: str) -> str:
    """A message template with {placeholders} as a regular expression with named groups."""
    out, seen = [], set()
    for literal, field, _, _ in string.Formatter().parse(template):
        out.append(re.escape(literal))
        if field is not None:
            name = re.sub(r"\W", "_", field) or "value"
            out.append(f"(?P={name})" if name in seen else f"(?P<{name}>.+?)")
            seen.add(name)
    return "".join(out)


def _raised_pattern(node: ast.AST) -> str | None:
    """A raised message as a regular expression: its constant parts literal, each formatted value any text.
    None for a message too generic to tell apart (under three words of its own)."""
    parts = node.values if isinstance(node, ast.JoinedStr) else [node]
    out, words = [], 0
    for part in parts:
        text = _strings(part, {})
        if text is not None:
            out.append(re.escape(text))
            words += len(text.split())
        else:
            out.append(".+?")
    return "".join(out) if words >= 3 else None


def learn(wheel: Path) -> dict:
    """Read the wheel's graph-mode sources: converters that raise "not implemented", the converter layer's error
    messages, and the environment variables read."""
    not_implemented, messages, env, raised = {}, [], {}, []
    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), "")
        version = m["version"] if (m := re.match(r"[^/-]+-(?P<version>[^/-]+)\.dist-info/", meta)) else None
        for name in z.namelist():
            if not (name.endswith(".py") and name.startswith(GRAPH_PACKAGES)):
                continue
            try:
                tree = ast.parse(z.read(name).decode("utf-8", errors="replace"))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                    text = _strings(node.exc.args[0], {})
                    m = NOT_IMPLEMENTED.match(text or "")
                    if m:
                        not_implemented[m["op"]] = {"file": name, "line": node.lineno}
                    elif (pattern := _raised_pattern(node.exc.args[0])) is not None:
                        raised.append({"pattern": pattern, "file": name, "line": node.lineno,
                                       "exception": getattr(node.exc.func, "id", None)})
                elif isinstance(node, ast.ClassDef) and node.name.endswith("ErrorMsg"):
                    consts: dict[str, str] = {}
                    for stmt in node.body:
                        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
                                isinstance(stmt.targets[0], ast.Name):
                            text = _strings(stmt.value, consts)
                            if text is None:
                                continue
                            consts[stmt.targets[0].id] = text
                            if not stmt.targets[0].id.startswith("_"):
                                messages.append({"id": stmt.targets[0].id, "template": text,
                                                 "pattern": _template_pattern(text),
                                                 "file": name, "line": stmt.lineno})
                elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
                    owner = node.func.value
                    owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
                    var = _strings(node.args[0], {})
                    if (owner_name, node.func.attr) in ENV_READERS and var and var.isupper():
                        env.setdefault(var, {"file": name, "line": node.lineno})
                elif isinstance(node, ast.Subscript) and getattr(node.value, "attr", None) == "environ":
                    var = _strings(node.slice, {})
                    if var and var.isupper():
                        env.setdefault(var, {"file": name, "line": node.lineno})
    return {"wheel": wheel.name, "version": version, "converters_not_implemented": not_implemented,
            "messages": messages, "raised": raised, "environment": dict(sorted(env.items()))}


@functools.cache
def load(path: str | None = None) -> dict | None:
    """The learned profile (OPFORGE_NPU_PROFILE, else the cache's), or None where none was learned."""
    p = Path(path or os.environ.get(PROFILE_ENV) or default_path())
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def match(profile: dict, text: str) -> dict | None:
    """A torchair error in `text`: a converter that is not implemented (with the op), or one of the converter
    layer's messages; each with where the wheel raises it."""
    for op, where in profile["converters_not_implemented"].items():
        if f"{op} ge_converter is not implemented" in text:
            return {"id": "ge-converter-not-implemented", "operator": op, "source": where}
    for msg in profile["messages"]:
        m = re.search(msg["pattern"], text)
        if m:
            caught = m.groupdict()
            op = caught.get("target") or caught.get("name") or caught.get("ge_name")
            return {"id": f"torchair-{msg['id'].lower().replace('_', '-')}", "operator": op,
                    "source": {"file": msg["file"], "line": msg["line"]}, "message_id": msg["id"]}
    for msg in profile.get("raised", []):  # any other message the graph modes raise: where, and what kind
        if re.search(msg["pattern"], text, re.S):
            return {"id": "torchair-raised", "operator": None, "source": {"file": msg["file"], "line": msg["line"]},
                    "message_id": None, "text": text}
    return None
