"""Write the question set `opforge helper eval` scores the helper with: questions a backend developer types, each
with the passages that answer it (corpus, path, symbol, named the way the helper's index names them).

Every expected citation is computed, never written down: Python objects through inspect (the file that defines
them, their qualified name), graph breaks from torch's registry, operators from native_functions.yaml and the
dispatcher's registrations, opforge's own SKILL.md headings and objects, and torch_npu's sources read from its
wheel as data (the ast module; it is never imported). A question whose answer this torch does not hold is
dropped with a line on stderr, so the set stays true on every torch opforge supports.

Usage: .venv/bin/python scripts/build_helper_qa.py [--out tests/data/helper/qa.yaml]
           [--npu-wheel torch_npu-*.whl --npu-out tests/data/helper/qa_npu.yaml]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import re
import sys
import zipfile
from pathlib import Path

import torch
import yaml

SITE = Path(torch.__file__).resolve().parents[1]  # the torch corpus's root: citations are relative to it

# (topic, question, the object(s) that answer it). A target is a dotted name to import, `config:MODULE:NAME` (a
# module-level setting: cited by its file alone, the index names settings apart from functions), or a tuple of
# targets any of which answers. `params`: arguments the question names, which the signature must still have.
PYTHON = [
    ("privateuse1", "How do I give the PrivateUse1 backend its own device name, so tensors print as 'mydev:0'?",
     "torch.utils.backend_registration.rename_privateuse1_backend"),
    ("privateuse1", "After renaming my backend, how do I get Tensor.mydev(), Tensor.is_mydev and Module.mydev() "
     "generated for me, and what do for_tensor, for_module and for_storage control?",
     "torch.utils.backend_registration.generate_methods_for_privateuse1_backend",
     ("for_tensor", "for_module", "for_storage")),
    ("privateuse1", "How do I make torch.mydev point at my backend's Python module, the way torch.cuda does?",
     "torch._register_device_module"),
    ("privateuse1", "How does torch find functions such as device_count or is_available in my custom device's "
     "module?", "torch.utils.backend_registration._get_custom_mod_func"),
    ("privateuse1", "How do I make the profiler show my device's name instead of PrivateUse1 in its activities?",
     "torch.utils.backend_registration._rename_profiler_activity"),
    ("privateuse1", "Can I prototype a PrivateUse1 backend entirely in Python before writing any C++?",
     "torch.utils.backend_registration._setup_privateuseone_for_python_backend"),
    ("privateuse1", "How do I get the module of a device type by its name, e.g. the one behind 'mydev'?",
     "torch.get_device_module"),
    ("privateuse1", "How do I ask which accelerator is current, whether it is CUDA or my PrivateUse1 device?",
     "torch.accelerator.current_accelerator"),
    ("privateuse1", "How do I let torch.save tag my device's storages and torch.load put them back on the device?",
     "torch.serialization.register_package"),
    ("privateuse1", "How do I tell torch.distributed which process group class serves my device, so "
     "init_process_group works with it?", "torch.distributed.Backend.register_backend", ("devices",)),
    ("privateuse1", "Which collective backend does torch.distributed pick by default for a given device type?",
     "torch.distributed.get_default_backend_for_device"),
    ("library", "How do I register a kernel for an existing aten operator under my device's dispatch key from "
     "Python?", "torch.library.Library.impl"),
    ("library", "How do I declare the schema of a new operator in my own namespace?", "torch.library.Library.define"),
    ("library", "How do I give a custom operator a fake implementation so torch.compile can trace it without "
     "running it?", "torch.library.register_fake"),
    ("library", "How do I make my custom operator differentiable: where do I attach its backward formula?",
     "torch.library.register_autograd"),
    ("library", "Which decorator wraps a Python function as a custom operator, with a schema taken from its type "
     "hints?", "torch.library.custom_op"),
    ("library", "How do I check that my custom op's schema, fake kernel and autograd registration are consistent?",
     "torch.library.opcheck"),
    ("library", "How do I add a kernel for one device type to a custom operator that already exists?",
     "torch.library.register_kernel"),
    ("library", "How do I register a boxed fallback that catches every operator reaching my dispatch key?",
     "torch.library.Library.fallback"),
    ("library", "How do I make a dispatch key fall through for an operator?", "torch.library.fallthrough_kernel"),
    ("library", "Can torch derive an operator's schema string from my function's annotations?",
     "torch.library.infer_schema"),
    ("library", "Is there a decorator that registers a function as an operator's implementation for a dispatch key "
     "without building a Library object first?", ("torch.library.impl", "torch.library.Library.impl")),
    ("library", "How do I give a custom operator a batching rule for vmap?", "torch.library.register_vmap"),
    ("library", "What do the kinds DEF, IMPL and FRAGMENT mean when I create a torch.library.Library?",
     "torch.library.Library", ("kind",)),
    ("device-tests", "How do I turn a generic test class into one test class per device type, my PrivateUse1 "
     "device included?", "torch.testing._internal.common_device_type.instantiate_device_type_tests"),
    ("device-tests", "How do I parametrize a device-generic test over a list of OpInfos and their dtypes?",
     "torch.testing._internal.common_device_type.ops"),
    ("device-tests", "Where is an operator described for the test suite: its sample inputs, supported dtypes, skips "
     "and expected failures?", "torch.testing._internal.opinfo.core.OpInfo"),
    ("device-tests", "How do I mark one OpInfo test as an expected failure only on one device type and dtype?",
     "torch.testing._internal.opinfo.core.DecorateInfo"),
    ("device-tests", "How do I run a test over torch.nn modules and their sample inputs, the way OpInfo tests run "
     "over operators?", "torch.testing._internal.common_modules.modules"),
    ("device-tests", "Where are nn modules described for testing, with how to construct them and what to feed "
     "their forward?", "torch.testing._internal.common_modules.ModuleInfo"),
    ("device-tests", "What base class do the generated per-device test classes share, and where do they get their "
     "device from?", "torch.testing._internal.common_device_type.DeviceTypeTestBase"),
    ("device-tests", "Which test base class does the device-generic machinery use for a PrivateUse1 backend?",
     "torch.testing._internal.common_device_type.PrivateUse1TestBase"),
    ("device-tests", "How does the test suite compare tensors with tolerances that depend on the dtype, and how do I "
     "pass atol and rtol?", "torch.testing._internal.common_utils.TestCase.assertEqual", ("atol", "rtol")),
    ("device-tests", "How do I write a distributed test that spawns one process per rank?",
     "torch.testing._internal.common_distributed.MultiProcessTestCase"),
    ("device-tests", "How do I assert two tensors are close, with default tolerances chosen by dtype, outside a "
     "TestCase?", "torch.testing.assert_close"),
    ("device-tests", "How do I restrict a device-generic test to a few dtypes?",
     "torch.testing._internal.common_device_type.dtypes"),
    ("device-tests", "How do I skip a device test on a device without enough memory for a large tensor?",
     "torch.testing._internal.common_device_type.largeTensorTest"),
    ("compile", "How do I compile a model with a chosen backend and a mode such as max-autotune?", "torch.compile",
     ("backend", "mode")),
    ("compile", "How can I see how many graphs and graph breaks torch.compile makes of a function, and why it "
     "breaks?", "torch._dynamo.explain"),
    ("compile", "How do I clear dynamo's caches and compiled code between two experiments?", "torch._dynamo.reset"),
    ("compile", "How do I tell dynamo a tensor dimension varies, so it stops recompiling for every size?",
     "torch._dynamo.mark_dynamic"),
    ("compile", "How do I turn on the graph-break and recompile logs from Python instead of TORCH_LOGS?",
     "torch._logging.set_logs"),
    ("compile", "How can I find which compiler stage or which graph makes a compiled model compute wrong values?",
     "torch._inductor.compiler_bisector.CompilerBisector"),
    ("compile", "How do I register my own compiler so torch.compile(backend='mine') finds it?",
     "torch._dynamo.register_backend"),
    ("compile", "Which backend names does torch.compile accept?", "torch._dynamo.list_backends"),
    ("compile", "How do I keep one function out of compilation so it runs eagerly?", "torch.compiler.disable"),
    ("compile", "How do I make torch.compile run eagerly, or fail on recompiles, without touching the model?",
     "torch.compiler.set_stance"),
    ("compile", "How do I let dynamo put a function into the graph as it is, without tracing inside it?",
     "torch.compiler.allow_in_graph"),
    ("compile", "How do I compile a model ahead of time and package it into one file?",
     "torch._inductor.aoti_compile_and_package"),
    ("compile", "Which dynamo setting caps how often a function is recompiled before dynamo gives up on it?",
     ("config:torch._dynamo.config:recompile_limit", "config:torch._dynamo.config:cache_size_limit")),
    ("compile", "Which setting lets dynamo capture .item() into the graph instead of breaking?",
     "config:torch._dynamo.config:capture_scalar_outputs"),
    ("compile", "Which inductor setting makes it autotune matmul and convolution templates?",
     "config:torch._inductor.config:max_autotune"),
    ("compile", "Where do I make inductor emit a C++ wrapper instead of Python wrapper code?",
     "config:torch._inductor.config:cpp_wrapper"),
]

# Common operators for the schema and out= questions; the dispatcher chooses the rest.
SCHEMA_OPS = ["add.Tensor", "mm", "index_select", "sum.dim_IntList", "native_layer_norm", "where.self"]
OUT_OPS = ["cat", "mul", "addmm", "topk"]

# (question, targets): `skill:NAME#HEADING` is a section of the SKILL.md named NAME whose heading starts with
# HEADING; anything else is a dotted name under opforge.
OPFORGE = [
    ("How does test-triage tell a flaky failure from one that fails every time?",
     ("skill:test-triage#The core pipeline", "opforge.skills.test_triage.cluster.clusters",
      "opforge.skills.test_triage.cluster.Facts")),
    ("How does test-triage decide that a failure is upstream's, not the backend's?",
     ("skill:test-triage#The core pipeline", "skill:test-triage#Reading a cluster",
      "opforge.skills.test_triage.cluster.clusters")),
    ("What do test-triage's cluster categories such as missing_dispatch and behaviour_mismatch mean?",
     ("skill:test-triage#Reading a cluster",)),
    ("Which rule decides the category of a failed upstream test in test-triage?",
     ("opforge.skills.test_triage.cluster.classify",)),
    ("Can I find why torch.compile breaks from a TORCH_TRACE log alone, without the script?",
     ("skill:graph-diagnose#logs",)),
    ("How does graph-diagnose learn torch_npu's graph-mode errors without importing torch_npu?",
     ("skill:graph-diagnose#torch_npu",)),
    ("How do I turn test-triage's clusters into a branch of fixes?", ("skill:test-triage#From clusters to a branch",)),
]

NONE = [
    "How long should I proof sourdough bread before baking it?",
    "What does torch.quantum.entangle_tensors do, and which devices support it?",
    "How do I configure Kubernetes ingress TLS certificates for a web shop?",
    "What is the best chess opening against the Sicilian defence?",
    "How do I call torch.npu.flux_capacitor_sync to warm up the time-travel cache?",
]


class Missing(Exception):
    """The ground truth of a question is not in this torch (or wheel): the question is dropped."""


def module_name(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def defs(source: str, module: str) -> dict[str, list[tuple[int, int]]]:
    """Symbol -> line spans of every class, function and method, as the index chunks them: module level and class
    bodies only (a closure stays in its function; a def under `if` is no passage of its own). A name has several
    spans when `typing.overload` stubs precede its def."""
    out: dict[str, list[tuple[int, int]]] = {}

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{node.name}"
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                out.setdefault(name, []).append((start, node.end_lineno))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, name)

    visit(ast.parse(source).body, module)
    return out


def settings(source: str) -> set[str]:
    names = set()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def load(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name, None)
            if obj is None:
                raise Missing(f"{dotted}: no attribute {name}")
        return obj
    raise Missing(f"{dotted}: cannot import")


def python_expect(dotted: str, root: Path, corpus: str, params=()) -> dict:
    """Where `dotted` is defined, named as the index names it; the object is followed through re-exports and
    wrappers to the def that holds its code."""
    if dotted.startswith("config:"):
        _, mod, name = dotted.split(":")
        path = Path(inspect.getsourcefile(load(mod)) or "").resolve()
        if not path.is_file() or name not in settings(path.read_text()):
            raise Missing(f"{mod}.{name}: no such setting")
        return {"corpus": corpus, "path": path.relative_to(root).as_posix()}
    obj = load(dotted)
    obj = inspect.unwrap(getattr(obj, "__func__", getattr(obj, "fget", obj)))
    if params:
        try:
            have = inspect.signature(obj).parameters
        except (TypeError, ValueError) as exc:
            raise Missing(f"{dotted}: no signature ({exc})") from exc
        if set(params) - set(have):
            raise Missing(f"{dotted}: no parameter {sorted(set(params) - set(have))}")
    try:
        path = Path(inspect.getsourcefile(obj)).resolve()
        _, line = inspect.getsourcelines(obj)
        rel = path.relative_to(root).as_posix()
    except (TypeError, OSError, ValueError) as exc:  # a builtin, or code outside the corpus
        raise Missing(f"{dotted}: no Python source in the corpus ({exc})") from exc
    symbol = f"{module_name(rel)}.{obj.__qualname__}"
    spans = defs(path.read_text(), module_name(rel)).get(symbol, [])
    if "<locals>" in symbol or not any(s <= line <= e for s, e in spans):
        raise Missing(f"{dotted}: {symbol} is no def or class of {rel} the index can cite")
    return {"corpus": corpus, "path": rel, "symbol": symbol}


def spread(items: list, n: int) -> list:
    """`n` items evenly across a sorted list, so the questions cover all of it rather than its head."""
    if len(items) <= n:
        return list(items)
    step = len(items) / n
    return [items[int(i * step + step / 2)] for i in range(n)]


def graph_breaks() -> list[tuple]:
    path = Path(torch._dynamo.__file__).parent / "graph_break_registry.json"
    if not path.is_file():
        raise Missing("no graph-break registry")
    registry = json.loads(path.read_text())
    rel = path.relative_to(SITE).as_posix()
    first = {gb: entries[0] for gb, entries in registry.items() if isinstance(entries, list) and entries}
    said = {gb: re.split(r"(?<=\.)\s", e.get("Explanation", "").strip())[0] for gb, e in first.items()}
    types = [e.get("Gb_type", "") for e in first.values()]
    # entries that read as prose (no {placeholders}) and that their type and first sentence alone single out, so a
    # question quoting either has one answer
    chosen = sorted(gb for gb, e in first.items() if "{" not in e.get("Gb_type", "{") + said[gb]
                    and 40 <= len(said[gb]) <= 200 and types.count(e.get("Gb_type")) == 1
                    and list(said.values()).count(said[gb]) == 1)
    out = []
    for n, gb in enumerate(spread(chosen, 10)):
        if n % 3 == 0:
            question = f"What does graph break {gb} mean, and how do I get rid of it?"
        elif n % 3 == 1:
            question = f"torch.compile reports a graph break \"{first[gb]['Gb_type']}\". Why, and how can I avoid it?"
        else:
            question = f"Dynamo stopped tracing and says: \"{said[gb]}\" Which graph break is it, what do I change?"
        out.append(("graph-breaks", question, [{"corpus": "torch", "path": rel, "symbol": gb}]))
    return out


def native_ops() -> list[tuple]:
    import torchgen
    from torchgen.model import FunctionSchema

    path = Path(torchgen.__file__).resolve().parent / "packaged/ATen/native/native_functions.yaml"
    rel = path.relative_to(SITE).as_posix()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    entries = yaml.load(path.read_text(), Loader=loader)
    names = {e["func"].split("(")[0].strip(): e["func"] for e in entries}

    def cite(*ops):
        return [{"corpus": "torch", "path": rel, "symbol": op} for op in ops]

    out = []
    for n, op in enumerate(SCHEMA_OPS):
        if op not in names:
            print(f"dropped: aten::{op} is not in native_functions.yaml", file=sys.stderr)
            continue
        base, _, overload = op.partition(".")
        question = (f"Where is the schema of aten::{op} declared?" if n % 2 == 0 else
                    f"What arguments and return type does aten::{base} have in its "
                    f"{overload or 'default'} overload?")
        out.append(("dispatcher", question, cite(op)))
    for base in OUT_OPS:
        outs = sorted(op for op, func in names.items()
                      if op.split(".")[0] == base and FunctionSchema.parse(func).is_out_fn())
        if not outs:
            print(f"dropped: aten::{base} has no out= overload", file=sys.stderr)
            continue
        out.append(("dispatcher", f"Which entry of the operator yaml declares the out= variant of aten::{base}?",
                    cite(*outs)))

    def registered(key):
        try:
            ops = torch._C._dispatch_get_registrations_for_dispatch_key(key)
        except (AttributeError, RuntimeError) as exc:
            raise Missing(f"dispatcher: no registrations for {key} ({exc})") from exc
        return {op.removeprefix("aten::") for op in ops if op.startswith("aten::")}

    def public(op):  # a functional overload of a public op: what a backend developer names
        base, _, overload = op.partition(".")
        return op in names and not base.startswith("_") and not base.endswith("_") and "out" not in overload

    composite = registered("CompositeImplicitAutograd")
    asked = set(SCHEMA_OPS) | {op for _, _, expect in out for op in (e["symbol"] for e in expect)}
    kernels = sorted(op for op in registered("CPU") - composite - registered("CompositeExplicitAutograd") - asked
                     if public(op))
    for n, op in enumerate(spread(kernels, 4)):
        base, _, overload = op.partition(".")
        question = (f"My device fails with \"Could not run 'aten::{op}' with arguments from the 'PrivateUse1' "
                    f"backend\" while the CPU has a kernel; where is the op declared, so I know what to implement?"
                    if n % 2 == 0 else
                    f"The CPU dispatch key has its own kernel for aten::{base} ({overload or 'default'} overload) "
                    f"but my backend has none: where is the declaration I implement against?")
        out.append(("dispatcher", question, cite(op)))
    for op in spread(sorted(op for op in composite if public(op)), 3):
        base, _, overload = op.partition(".")
        out.append(("dispatcher", f"Does my backend need its own kernel for aten::{base} "
                    f"({overload or 'default'} overload), or does it decompose into other ops? Where is it declared?",
                    cite(op)))
    return out


def skill_section(name: str, heading: str, src: Path) -> dict:
    for skill in sorted((src / "opforge" / "skills").glob("*/SKILL.md")):
        text = skill.read_text()
        if not re.search(rf"^name:\s*{re.escape(name)}\s*$", text, re.M):
            continue
        fence = False
        for line in text.splitlines():
            fence ^= line.lstrip().startswith("```")
            title = line.lstrip("#").strip()
            if not fence and re.match(r"#{1,4}\s", line) and title.startswith(heading):
                return {"corpus": "opforge", "path": skill.relative_to(src).as_posix(), "symbol": title}
        raise Missing(f"skill {name}: no section {heading!r}")
    raise Missing(f"no skill named {name}")


def opforge_questions() -> list[tuple]:
    import opforge

    src = Path(opforge.__file__).resolve().parents[1]
    out = []
    for question, targets in OPFORGE:
        expect = []
        for t in targets:
            try:
                expect.append(skill_section(*t[6:].split("#"), src) if t.startswith("skill:")
                              else python_expect(t, src, "opforge"))
            except Missing as exc:
                print(f"dropped expectation: {exc}", file=sys.stderr)
        if expect:
            out.append(("opforge", question, expect))
        else:
            print(f"dropped: {question}", file=sys.stderr)
    return out


def torch_questions() -> list[tuple]:
    out = []
    for topic, question, target, *params in PYTHON:
        try:
            expect = []
            for t in target if isinstance(target, tuple) else (target,):
                try:
                    expect.append(python_expect(t, SITE, "torch", params[0] if params else ()))
                except Missing as exc:
                    if not isinstance(target, tuple):
                        raise
                    print(f"dropped expectation: {exc}", file=sys.stderr)
            if not expect:
                raise Missing(f"none of {target}")
            out.append((topic, question, expect))
        except Missing as exc:
            print(f"dropped: {question} ({exc})", file=sys.stderr)
    for part in (graph_breaks, native_ops):
        try:
            out += part()
        except Missing as exc:
            print(f"dropped: {part.__name__} ({exc})", file=sys.stderr)
    return out


class Wheel:
    """torch_npu's Python and yaml, read from the wheel: importing it needs the Ascend stack."""

    def __init__(self, path: Path):
        with zipfile.ZipFile(path) as z:
            self.files = {i.filename: z.read(i).decode("utf-8", "replace") for i in sorted(z.infolist(),
                          key=lambda i: i.filename) if i.filename.startswith("torch_npu/")
                          and i.filename.endswith((".py", ".yaml"))}

    def defs_holding(self, needle: str, hit) -> list[dict]:
        """The innermost def or class around each node `hit` accepts, in the files that contain `needle`."""
        found = []
        for path, source in self.files.items():
            if not path.endswith(".py") or needle not in source:
                continue
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue
            spans = defs(source, module_name(path))
            for node in ast.walk(tree):
                if hit(node):
                    around = [(e - s, sym) for sym, where in spans.items() for s, e in where if s <= node.lineno <= e]
                    if around:
                        found.append({"corpus": "torch-npu", "path": path, "symbol": min(around)[1]})
        return [dict(t) for t in sorted({tuple(f.items()) for f in found})]

    def files_where(self, hit) -> list[dict]:
        return [{"corpus": "torch-npu", "path": p} for p, s in self.files.items() if hit(p, s)]


def _call(name: str, first: str | None = None):
    def hit(node):
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        arg = node.args[0] if node.args else None
        return called == name and (first is None or isinstance(arg, ast.Constant) and arg.value == first)
    return hit


def _meta_kernel(op: str):
    def hit(node):
        return isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Call) and _call("impl")(d) and len(d.args) > 1 and isinstance(d.args[1], ast.Constant)
            and d.args[1].value == op for d in node.decorator_list)
    return hit


def _meta_library(source: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _call("Library")(n.value)
               and [getattr(a, "value", None) for a in n.value.args] == ["npu", "IMPL", "Meta"] for n in tree.body)


def npu_questions(wheel: Wheel) -> list[tuple]:
    def docstring_says(text):
        return lambda n: isinstance(n, (ast.FunctionDef, ast.ClassDef)) and text in (ast.get_docstring(n) or "")

    def imports(module, name):
        return lambda n: isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == name for a in n.names)

    def env_read(var):
        return lambda n: isinstance(n, ast.Constant) and n.value == var

    def yaml_declares(op):
        return lambda p, s: p.endswith(".yaml") and re.search(rf"func:\s*{re.escape(op)}\(", s)

    questions = [
        ("How does torch_npu rename the PrivateUse1 backend to npu?",
         lambda: wheel.defs_holding("rename_privateuse1_backend", _call("rename_privateuse1_backend"))),
        ("Where does torch_npu attach torch.npu as the device module of its backend?",
         lambda: wheel.defs_holding("_register_device_module", _call("_register_device_module"))),
        ("Which dtypes does torch_npu leave out when it generates the .npu() methods of tensors, modules and "
         "storages?", lambda: wheel.defs_holding("generate_methods_for_privateuse1_backend",
                                                 _call("generate_methods_for_privateuse1_backend"))),
        ("How does torch_npu make the profiler's PrivateUse1 activity show up as NPU?",
         lambda: wheel.defs_holding("ProfilerActivity.PrivateUse1", docstring_says("ProfilerActivity.PrivateUse1"))),
        ("How is the HCCL process group registered with torch.distributed for npu devices?",
         lambda: wheel.defs_holding("register_backend", _call("register_backend", "hccl"))),
        ("How does torch_npu register its 'npu' backend for torch.compile?",
         lambda: wheel.defs_holding("register_backend", imports("torch._dynamo", "register_backend"))),
        ("How can I limit how many cube and vector cores torch_npu's inductor uses?",
         lambda: wheel.defs_holding("NPU_DEVICE_LIMIT", env_read("NPU_DEVICE_LIMIT"))),
        ("Which yaml lists the ATen operators torch_npu implements with its own kernels?",
         lambda: wheel.files_where(lambda p, s: p.endswith(".yaml") and re.search(r"^backend:\s*NPU\s*$", s, re.M)
                                   and re.search(r"^supported:", s, re.M))),
        ("Where is torch_npu's custom operator npu_format_cast declared, with its schema?",
         lambda: wheel.files_where(yaml_declares("npu_format_cast"))),
        ("Where does torch_npu register Meta kernels for its custom npu operators?",
         lambda: wheel.files_where(lambda p, s: p.endswith(".py") and "Library(" in s and _meta_library(s))),
        ("What output shape does torch_npu's Meta kernel give npu_rms_norm?",
         lambda: wheel.defs_holding("npu_rms_norm", _meta_kernel("npu_rms_norm"))),
        ("Which function computes the fake result of npu_rotary_mul when torch_npu is traced?",
         lambda: wheel.defs_holding("npu_rotary_mul", _meta_kernel("npu_rotary_mul"))),
        ("What options does the CompilerConfig of torch_npu's graph mode take?",
         lambda: wheel.defs_holding("class CompilerConfig", lambda n: isinstance(n, ast.ClassDef)
                                    and n.name == "CompilerConfig")),
    ]
    out = []
    for question, find in questions:
        expect = find()
        if expect:
            out.append(("npu", question, expect))
        else:
            print(f"dropped: {question} (not in the wheel)", file=sys.stderr)
    return out


def write(rows: list[tuple], path: Path, prefix: str, source: str) -> None:
    # alternatives that collapse to one citation (two settings of one file) are listed once
    items = [{"id": f"{prefix}{n:03d}", "topic": topic, "question": q,
              "expect": [dict(t) for t in dict.fromkeys(tuple(e.items()) for e in expect)]}
             for n, (topic, q, expect) in enumerate(rows, 1)]
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f"# The helper's question set, from {source}: rerun scripts/build_helper_qa.py, don't edit.\n"
    path.write_text(head + yaml.safe_dump(items, sort_keys=False, allow_unicode=True, width=120))
    by_topic: dict[str, int] = {}
    for topic, _, _ in rows:
        by_topic[topic] = by_topic.get(topic, 0) + 1
    # a question that quotes its answer's name only tests lexical lookup: report how many do not
    blind = sum(not any(e.get("symbol", "\0").rsplit(".", 1)[-1] in q for e in expect) for _, q, expect in rows)
    print(f"{path}: {len(items)} questions {by_topic}; {blind} without their answer's name", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/data/helper/qa.yaml"))
    ap.add_argument("--npu-wheel", type=Path, help="a torch_npu wheel, read as a zip (never imported)")
    ap.add_argument("--npu-out", type=Path, default=Path("tests/data/helper/qa_npu.yaml"))
    args = ap.parse_args()
    rows = torch_questions() + opforge_questions() + [("none", q, []) for q in NONE]
    write(rows, args.out, "q", f"torch {torch.__version__} and opforge")
    if args.npu_wheel:
        write(npu_questions(Wheel(args.npu_wheel)), args.npu_out, "n", args.npu_wheel.name)


if __name__ == "__main__":
    main()
