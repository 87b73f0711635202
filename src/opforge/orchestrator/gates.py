"""Gates: rules held as data, grouped by what they protect.

Each rule has an id, a severity (S0 blocks, S1 blocks, S2 warns, S3 informs), a dimension (framework,
artifact, separation, test, consistency), the stages it applies to, and a check that returns None when
the rule holds or one line saying what is wrong. A stage completes only when no S0/S1 rule fails.
The checks read the artifacts themselves (ASTs, a subprocess import), never the generator's intent.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import yaml

from opforge.i18n import N_, _
from opforge.verify.cases import level0_bindings
from opforge.verify.kernel_lint import is_jit, lint_source
from opforge.workspace import Workspace
from opforge.workspace.atomic import sha256_file

BLOCKING = ("S0", "S1")
GOLDEN_IMPORT_TIMEOUT_S = 60  # a hang, not a slow machine: importing torch alone takes seconds under load


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    dimension: str
    stages: tuple[int, ...]
    doc: str
    check: Callable[[Workspace, object], str | None]


# ---------------------------------------------------------------- helpers

def _front_matter(ws: Workspace) -> dict:
    text = ws.path("SPEC.md").read_text()
    if not text.startswith("---\n"):
        raise ValueError("SPEC.md has no front matter")
    return yaml.safe_load(text.split("---\n", 2)[1])


def _module_ast(ws: Workspace, rel: str) -> ast.Module:
    return ast.parse(ws.path(rel).read_text(), filename=rel)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _mentions(tree: ast.Module, words: tuple[str, ...]) -> list[str]:
    """Imports, and string literals other than docstrings, that name one of `words`."""
    hits = []
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            names = [node.value]
        for n in names:
            if any(w in n for w in words):
                hits.append(f"line {node.lineno}: {n!r}")
    return hits


# torch calls a launch path may make: allocation, views, copies (contiguous, clone for an output that would
# alias an input, cat of gradients placed side by side), metadata and shape arithmetic (a GEMM prologue's inputs
# broadcast to one shape), and the library machinery
ALLOWED_TORCH = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "tensor", "library", "clone",
                 "cat", "is_grad_enabled", "ops", "cuda", "npu", "device", "Tensor", "Size", "float32", "float16",
                 "bfloat16",
                 "int32", "int64", "bool", "dtype", "Generator", "get_device_module", "broadcast_shapes"}
ALLOWED_METHODS = {"contiguous", "view", "reshape", "numel", "size", "dim", "stride", "data_ptr", "t", "transpose",
                   "permute", "narrow",  # views: a GEMM or attention kernel reads its operands through strides
                   "is_contiguous", "new_empty", "expand", "unsqueeze", "squeeze", "flatten", "storage_offset",
                   "get", "register_fake", "register_autograd", "save_for_backward", "is_available",
                   "element_size", "untyped_storage"}
# Tensor methods that compute: every public Tensor method that torch also has as a function, plus casts
TENSOR_MATH = ({n for n in dir(torch.Tensor) if not n.startswith("_") and hasattr(torch, n)} |
               {"to", "float", "half", "bfloat16", "double", "clone", "copy_", "fill_", "zero_", "cpu",
                "item", "tolist", "numpy"}) - ALLOWED_METHODS


def hot_path_violations(tree: ast.Module) -> list[str]:
    """Torch math outside Triton kernels: torch.<fn>() calls, compute methods, arithmetic on tensors."""
    bad = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and not is_jit(n)]:
        tensors = {a.arg for a in fn.args.args if isinstance(a.annotation, ast.Attribute)
                   and a.annotation.attr == "Tensor"}
        for node in ast.walk(fn):
            # a name whose .contiguous() or .numel() is taken is a tensor
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.attr in ("contiguous", "numel"):
                tensors.add(node.func.value.id)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                f = node.func
                if isinstance(f.value, ast.Name) and f.value.id == "torch":
                    if f.attr not in ALLOWED_TORCH:
                        bad.append(f"{fn.name}, line {node.lineno}: torch.{f.attr}()")
                elif isinstance(f.value, ast.Name) and f.value.id in ("tl", "triton", "os", "math"):
                    continue
                elif f.attr in TENSOR_MATH:
                    bad.append(f"{fn.name}, line {node.lineno}: .{f.attr}()")
            elif isinstance(node, (ast.BinOp, ast.AugAssign)):
                operands = [node.left, node.right] if isinstance(node, ast.BinOp) else [node.target, node.value]
                if any(isinstance(o, ast.Name) and o.id in tensors for o in operands):
                    bad.append(f"{fn.name}, line {node.lineno}: tensor arithmetic in Python")
            elif isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Name) and node.operand.id in tensors:
                bad.append(f"{fn.name}, line {node.lineno}: tensor arithmetic in Python")
    return bad

# What an impl may import and reach, whoever wrote it (template, model, host developer): the modules the
# templates use, with os held to the environment (TRITON_INTERPRET, tuning knobs) and to path strings.
IMPL_MODULES = {"__future__", "math", "functools", "typing", "os", "os.path", "torch", "torch.library", "triton",
                "triton.language"}
IMPL_OS = {"environ", "getenv", "path"}
IMPL_ENVIRON = {"get", "setdefault", "copy", "items", "keys", "values"}
# torch namespaces that compute, load or compile outside a Triton kernel, however they are reached
TORCH_REFUSED = {"nn", "fft", "linalg", "special", "distributions", "func", "hub", "utils", "load", "save",
                 "from_file", "jit", "compile", "export", "_C", "_refs", "_prims", "_decomp"}
REFUSED_BUILTINS = {"__import__", "exec", "eval", "compile", "open", "breakpoint", "globals", "vars",
                    "__builtins__"}


# The vendor library calls a plan may make (codegen/gemm.py's LIBRARY): convolutions through torch, exactly these
LIBRARY_CALLS = {"torch.ops.aten.convolution.default", "torch.ops.aten.convolution_backward.default"}


def _reach_problem(dotted: str) -> str | None:
    """Why `dotted` (a module path with attributes) is out of an impl's reach, or None."""
    parts = dotted.split(".")
    if parts[0] == "os" and len(parts) > 1:
        if parts[1] not in IMPL_OS:
            return f"{'.'.join(parts[:2])} (os is for os.environ, os.getenv and os.path only)"
        if parts[1] == "environ" and len(parts) > 2 and parts[2] not in IMPL_ENVIRON:
            return f"{'.'.join(parts[:3])} (os.environ is read or defaulted only)"
    if parts[0] == "torch" and len(parts) > 1:
        if parts[1] in TORCH_REFUSED:
            return f"torch.{parts[1]} (computes outside Triton)"
        if parts[1] == "ops" and len(parts) > 2 and parts[2] != "opforge" and dotted not in LIBRARY_CALLS:
            return f"torch.ops.{parts[2]} (computes outside Triton)"
    return None


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(attrs)])
    return None


def impl_reach_problems(source: str) -> list[str]:
    """Imports outside IMPL_MODULES, os beyond the environment and paths, torch's compute namespaces, and the
    builtins that run or read arbitrary code or files; one line each."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"line {exc.lineno}: syntax error: {exc.msg}"]
    bad, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name not in IMPL_MODULES and not a.name.startswith("triton.language."):
                    bad.append(f"line {node.lineno}: import {a.name}")
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            if mod not in IMPL_MODULES and not mod.startswith("triton.language."):
                bad.append(f"line {node.lineno}: from {mod} import {', '.join(a.name for a in node.names)}")
                continue
            for a in node.names:
                aliases[a.asname or a.name] = f"{mod}.{a.name}"
                why = _reach_problem(f"{mod}.{a.name}")
                if why or (mod == "torch" and a.name not in ALLOWED_TORCH):
                    bad.append(f"line {node.lineno}: from {mod} import {a.name}" + (f": {why}" if why else ""))
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in REFUSED_BUILTINS:
            bad.append(f"line {node.lineno}: {node.id} (runs code or opens files beyond the impl)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "setattr", "delattr", "hasattr") and node.args:
            # a constant name is the attribute it names; a computed one on os or torch could be anything
            base = _dotted(node.args[0], aliases)
            if base is None:
                continue
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                why = _reach_problem(f"{base}.{name.value}")
                if why:
                    bad.append(f"line {node.lineno}: {node.func.id}({base}, {name.value!r}): {why}")
            elif base.split(".")[0] in ("os", "torch"):
                bad.append(f"line {node.lineno}: {node.func.id}({base}, <computed name>)")
        elif isinstance(node, (ast.Attribute, ast.Name)) and not isinstance(parents.get(id(node)), ast.Attribute):
            dotted = _dotted(node, aliases)
            if dotted is None:
                continue
            why = _reach_problem(dotted)
            parent = parents.get(id(node))
            as_getattr_arg = isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and \
                parent.func.id in ("getattr", "setattr", "delattr", "hasattr") and parent.args[:1] == [node]
            if why:
                bad.append(f"line {node.lineno}: {why}")
            elif dotted in ("os", "torch", "torch.ops") and isinstance(node, ast.Name) and \
                    isinstance(node.ctx, ast.Load) and not as_getattr_arg:
                bad.append(f"line {node.lineno}: {dotted} passed around as a value")
    return list(dict.fromkeys(bad))


def _literal(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    return None


# ---------------------------------------------------------------- checks

def check_spec(ws, state):
    if not ws.path("SPEC.md").exists():
        return "SPEC.md is missing"
    try:
        fm = _front_matter(ws)
    except (ValueError, yaml.YAMLError) as exc:
        return f"SPEC.md front matter unreadable: {exc}"
    need = ("schema_version", "op_name", "category", "supported_dtypes", "p0_shapes", "tolerance",
            "dynamic_axes", "default_params", "perf_target")
    missing = [k for k in need if k not in (fm or {})]
    return f"SPEC.md front matter lacks {', '.join(missing)}" if missing else None


def check_spec_json(ws, state):
    if not ws.path("spec.json").exists():
        return "spec.json is missing"
    fm, js = _front_matter(ws), json.loads(ws.path("spec.json").read_text())
    diff = [k for k in fm if js.get(k) != fm[k]]
    return f"spec.json disagrees with SPEC.md on {', '.join(diff)}" if diff else None


def check_spec_frozen(ws, state):
    if state is None or not state.spec_hash:
        return "no frozen SPEC hash in the state"
    if not ws.path("SPEC.md").exists() or sha256_file(ws.path("SPEC.md")) != state.spec_hash:
        return "SPEC.md changed after stage 1 froze it (amend it with `opforge op stage DIR 1`)"
    return None


def check_api(ws, state):
    if not ws.path("api_report.json").exists() or not ws.path("API_REPORT.md").exists():
        return "API_REPORT.md or api_report.json is missing"
    rep = json.loads(ws.path("api_report.json").read_text())
    if rep.get("unsupported"):
        return f"unsupported ops: {', '.join(rep['unsupported'])}"
    return None if rep.get("cost") else "api_report.json has no cost model"


def check_golden_import(ws, state):
    path = ws.path(ws.golden).resolve()
    if not path.exists():
        return f"{ws.golden} is missing"
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('g', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "missing = [n for n in ('forward', 'backward', 'make_inputs', 'INPUTS', 'INPUT_NAMES', 'OUTPUT_NAMES', "
            "'GRAD_INPUTS', 'ATTRIBUTES') if not hasattr(m, n)]; "
            "sys.exit('golden lacks ' + ', '.join(missing) if missing else 0)")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                              timeout=GOLDEN_IMPORT_TIMEOUT_S, cwd=ws.root)
    except subprocess.TimeoutExpired:
        return f"{ws.golden} did not import within {GOLDEN_IMPORT_TIMEOUT_S} s"
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return f"{ws.golden} does not import: {err}"
    return None


def check_golden_separate(ws, state):
    if not ws.path(ws.golden).exists():
        return f"{ws.golden} is missing"
    hits = _mentions(_module_ast(ws, ws.golden), ("_impl", "triton"))
    return f"the golden reaches for the kernel: {'; '.join(hits)}" if hits else None


DESIGN_SECTIONS = (N_("Fusion plan"), N_("Tiling and loops"), N_("Memory layout"), N_("Verification matrix"))


def check_design(ws, state):
    if not ws.path("DESIGN.md").exists():
        return "DESIGN.md is missing"
    text = ws.path("DESIGN.md").read_text()
    need = ["## " + _(section) for section in DESIGN_SECTIONS]  # in the workspace's language
    missing = [s for s in need if s not in text]
    return f"DESIGN.md lacks {', '.join(missing)}" if missing else None


def check_impl_separate(ws, state):
    if not ws.path(ws.impl).exists():
        return f"{ws.impl} is missing"
    hits = _mentions(_module_ast(ws, ws.impl), ("golden", "reference"))
    return f"the impl reaches for the golden: {'; '.join(hits)}" if hits else None


def check_impl_triton_only(ws, state):
    if not ws.path(ws.impl).exists():
        return f"{ws.impl} is missing"
    bad = hot_path_violations(_module_ast(ws, ws.impl))
    return f"torch computes outside Triton: {'; '.join(bad[:5])}" if bad else None


def check_impl_imports(ws, state):
    if not ws.path(ws.impl).exists():
        return f"{ws.impl} is missing"
    bad = impl_reach_problems(ws.path(ws.impl).read_text())
    return (f"the impl reaches beyond torch, triton, math, functools, typing and os.environ/getenv/path: "
            f"{'; '.join(bad[:5])}") if bad else None


def check_kernel_lint(ws, state):
    if not ws.path(ws.impl).exists():
        return f"{ws.impl} is missing"
    found = lint_source(ws.path(ws.impl).read_text(), ws.impl)
    if not found:
        return None
    f = found[0]
    return (f"{len(found)} kernel lint finding(s); first: {f['rule']} ({f['protects']}), {f['function']} "
            f"line {f['line']}: {f['message']}")


def check_test_coverage(ws, state):
    if not ws.path(ws.test).exists():
        return f"{ws.test} is missing"
    fm = _front_matter(ws)
    tree = _module_ast(ws, ws.test)
    try:
        dtypes = ast.literal_eval(_literal(tree, "DTYPES"))
        p0 = ast.literal_eval(_literal(tree, "P0_SHAPES"))
        tol = ast.literal_eval(_literal(tree, "TOLERANCE"))
        level0 = ast.literal_eval(_literal(tree, "LEVEL0"))
    except (ValueError, TypeError, SyntaxError):
        return "DTYPES, P0_SHAPES, TOLERANCE and LEVEL0 must be literals in the test file"
    covered = {(c.get("dtype"), json.dumps(c.get("binding"), sort_keys=True)) for c in level0}
    problems = []
    spec = json.loads(ws.path("spec.json").read_text())
    quick = bool(state is not None and state.options.get("quick"))
    for dt in fm["supported_dtypes"]:
        if dt not in dtypes:
            problems.append(f"DTYPES lacks {dt}")
        for b in level0_bindings(spec, quick):  # a quick run's Level 0: the p0 shapes scaled down
            if (dt, json.dumps(b, sort_keys=True)) not in covered:
                problems.append(f"Level 0 lacks {dt} at {b}")
    for b in fm["p0_shapes"]:
        if b not in p0:
            problems.append(f"P0_SHAPES lacks {b}")
    if tol != fm["tolerance"]:
        problems.append("TOLERANCE differs from SPEC.md")
    return "; ".join(problems[:4]) if problems else None


def check_test_imports(ws, state):
    text = ws.path(ws.test).read_text() if ws.path(ws.test).exists() else ""
    miss = [m for m in (f"{ws.op}_impl", f"{ws.op}_golden") if m not in text]
    return f"the test file does not load {', '.join(miss)}" if miss else None


def check_readme(ws, state):
    return None if ws.path("README.md").exists() else "README.md is missing"


def check_precision_record(ws, state):
    if not ws.path("precision.json").exists() or not ws.path("PRECISION.md").exists():
        return "PRECISION.md or precision.json is missing"
    rep = json.loads(ws.path("precision.json").read_text())
    return None if rep.get("summary", {}).get("total", 0) > 0 else "precision.json records no case"


def check_impl_compiles(ws, state):
    path = ws.path("compile.json")
    if not path.exists():
        return "compile.json is missing"
    rep = json.loads(path.read_text())
    bad = [f"{b['kernel']} ({b['dtype']}, {b['binding']}): {b['error']}" for op in rep["ops"] for b in op["builds"]
           if "error" in b]
    if bad:
        return f"{len(bad)} kernel build(s) do not compile for {rep['arch']}; first: {bad[0]}"[:1000]
    return None


def check_precision_passed(ws, state):
    if not ws.path("precision.json").exists():
        return "precision.json is missing"
    s = json.loads(ws.path("precision.json").read_text()).get("summary", {})
    return None if s.get("all_passed") else f"precision has not passed ({s.get('failed')} failing cases)"


def check_perf(ws, state):
    missing = [f for f in ("PERF.md", "perf.json", "perf.png") if not ws.path(f).exists()]
    if missing:
        return f"missing {', '.join(missing)}"
    perf = json.loads(ws.path("perf.json").read_text())
    if perf.get("device") != "cuda" and not perf.get("kernel_timing"):
        return "a CPU perf report must say that kernel timing needs an accelerator"
    return None


def check_artifacts_unchanged(ws, state):
    """Artifacts of completed stages still match the hashes recorded when those stages completed."""
    if state is None:
        return None
    current = state.current_stage
    changed = []
    for k, rec in state.stages.items():
        if k >= current or rec.status != "completed":
            continue
        later = {a for j in range(k + 1, current + 1) for a in ws.stage_artifacts(j)}
        for rel, digest in rec.artifacts.items():
            if rel in later:
                continue
            p = ws.path(rel)
            if not p.exists() or sha256_file(p) != digest:
                changed.append(f"{rel} (stage {k})")
    return f"changed since completion: {', '.join(changed)}" if changed else None


RULES: list[Rule] = [
    Rule("G1-SPEC", "S0", "artifact", (1,), "SPEC.md exists with the front matter fields", check_spec),
    Rule("G1-SPEC-JSON", "S1", "consistency", (1,), "spec.json agrees with SPEC.md", check_spec_json),
    Rule("C-SPEC-FROZEN", "S0", "consistency", (2, 3, 4, 5, 6, 7), "SPEC.md is unchanged since stage 1",
         check_spec_frozen),
    Rule("C-ARTIFACTS", "S1", "consistency", (2, 3, 4, 5, 6, 7),
         "earlier stages' artifacts are unchanged since they completed", check_artifacts_unchanged),
    Rule("G2-API", "S0", "artifact", (2,), "every ATen op is lowered and the cost model is written", check_api),
    Rule("G3-GOLDEN-IMPORT", "S0", "framework", (3,),
         f"the golden imports in a fresh interpreter within {GOLDEN_IMPORT_TIMEOUT_S} s", check_golden_import),
    Rule("G3-GOLDEN-SEPARATE", "S0", "separation", (3, 5, 7), "the golden imports no kernel",
         check_golden_separate),
    Rule("G4-DESIGN", "S1", "artifact", (4,), "DESIGN.md has the fusion plan and the verification matrix",
         check_design),
    Rule("G5-IMPL-SEPARATE", "S0", "separation", (5, 7), "the impl never reads the golden or the reference",
         check_impl_separate),
    Rule("G5-IMPL-TRITON-ONLY", "S0", "separation", (5, 7),
         "only allocation, views and launches are torch calls on the impl's paths", check_impl_triton_only),
    Rule("G5-IMPL-IMPORTS", "S0", "separation", (5, 7),
         "the impl imports only torch, triton, math, functools, typing and os (environment and paths), and "
         "reaches no torch compute namespace, process, file or exec", check_impl_imports),
    Rule("G5-IMPL-COMPILES", "S0", "framework", (5,),
         "every kernel compiles for the GPU target at each P0 shape and dtype (compile.json)", check_impl_compiles),
    Rule("G5-KERNEL-LINT", "S0", "framework", (5, 7),
         "kernels take the last-program ticket after a barrier and make grid-sized offsets in int64",
         check_kernel_lint),
    Rule("G5-TEST-COVERAGE", "S0", "test", (5, 7), "tests cover every SPEC dtype and p0 shape with SPEC tolerances",
         check_test_coverage),
    Rule("G5-TEST-IMPORTS", "S1", "test", (5,), "the test file loads the impl and the golden separately",
         check_test_imports),
    Rule("G5-README", "S2", "artifact", (5,), "README.md exists", check_readme),
    Rule("G5-PRECISION", "S1", "artifact", (5,), "PRECISION.md and precision.json record the cases",
         check_precision_record),
    Rule("G7-PRECISION-FIRST", "S0", "test", (7,), "performance is only measured on a kernel that passed precision",
         check_precision_passed),
    Rule("G7-PERF", "S0", "artifact", (7,), "PERF.md, perf.json and perf.png, honest about the device", check_perf),
]


def run_gates(ws: Workspace, stage: int, state=None) -> list[dict]:
    results = []
    for rule in RULES:
        if stage not in rule.stages:
            continue
        try:
            msg = rule.check(ws, state)
        except Exception as exc:  # a rule that cannot read its artifact fails, with why
            msg = f"check failed: {type(exc).__name__}: {exc}"
        results.append({"id": rule.id, "severity": rule.severity, "dimension": rule.dimension,
                        "passed": msg is None, "message": msg or "", "doc": rule.doc})
    return results


def blocking_failures(results: list[dict]) -> list[dict]:
    return [r for r in results if not r["passed"] and r["severity"] in BLOCKING]
