"""The request: a folder with request.yaml and the PyTorch reference it names (DESIGN.md, "Request").

`load_request` validates everything that can be checked without running the reference and raises
`InputError` naming the field (``request.yaml: inputs.weight.dtype``) on the first problem. Each mapping takes
only the keys `FORMAT` lists; docs/request.md documents them.
"""

from __future__ import annotations

import importlib.util
import keyword
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from opforge.errors import InputError

REQUEST_FILE = "request.yaml"
CATEGORIES = ("elementwise", "reduction", "norm", "activation", "matmul", "convolution", "attention", "scan",
              "pooling", "other")
FLOAT_DTYPES = ("bfloat16", "float16", "float32")
# integer inputs: class labels and other indices, quantized weights; never differentiated, read exactly
INDEX_DTYPES = ("int64", "int32", "int8", "bool")  # read exactly, drawn from a range, no gradient
# an attribute's type -> what its default may be; `ints` and `floats` are sequences (kernel sizes, strides, a
# normalized shape), read as tuples. Every type takes `null` (None) too. Float attributes are run-time kernel
# arguments; the others (and a float whose default is None) specialise the build to their value.
ATTR_TYPES = {"float": (int, float), "int": int, "bool": bool, "str": str, "ints": int, "floats": (int, float)}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# a dimension may be a sum of products of symbols and sizes, for sizes tied to each other ("G*32": groups of 32;
# "L+R*2": a fused projection's latent and rotary columns side by side)
_FACTOR = r"\s*([A-Za-z_][A-Za-z0-9_]*|[1-9][0-9]*)\s*"
_TERM = rf"{_FACTOR}(\*{_FACTOR})*"
_PRODUCT = re.compile(rf"^{_TERM}(\+{_TERM})*$")


@dataclass(frozen=True)
class Key:
    """One key of a request.yaml mapping: the YAML types it takes, and whether it must be there."""

    types: type | tuple[type, ...]
    required: bool = False


# The request format as data: each mapping of request.yaml (by its path; <name> and <dtype> stand for keys the user
# picks) and the keys it takes. The validator refuses any other key, and tests/test_request_doc.py holds
# docs/request.md to this table both ways.
FORMAT: dict[str, dict[str, Key]] = {
    "": {"name": Key(str, True), "description": Key(str, True), "category": Key(str, True),
         "inputs": Key(dict, True), "attributes": Key(dict), "outputs": Key(dict), "reference": Key(str, True),
         "backward": Key(bool), "shapes": Key(dict, True), "tolerance": Key(dict), "perf_target": Key(dict),
         "deterministic": Key(bool)},
    "inputs.<name>": {"shape": Key(list, True), "dtype": Key((str, list), True), "requires_grad": Key(bool),
                      "range": Key(list), "edges": Key(list)},
    "attributes.<name>": {"type": Key(str, True), "default": Key((int, float, bool, str, list), True)},
    "outputs.<name>": {"shape": Key(list), "dtype": Key((str, list))},
    "shapes": {"p0": Key(list, True)},
    "tolerance.<dtype>": {"atol": Key((int, float)), "rtol": Key((int, float))},
    "perf_target": {"speedup_vs_eager": Key((int, float))},
}


def format_fields() -> list[str]:
    """Every field the format takes, as a dotted path ('inputs.<name>.dtype'): what docs/request.md documents."""
    return [f"{m}.{k}" if m else k for m, keys in FORMAT.items() for k in keys]


def _bad(path: str, what: str) -> InputError:
    # one prefix for every error about the request file, whichever check finds it
    return InputError(f"{REQUEST_FILE}: {path}" if path else REQUEST_FILE, what)


def _keys(doc: dict, mapping: str, where: str) -> None:
    """Refuse a key the mapping does not take (a typo would otherwise be ignored in silence)."""
    allowed = FORMAT[mapping]
    for k in doc:
        if k not in allowed:
            raise _bad(f"{where}{k}", f"unknown key; allowed: {', '.join(allowed)}")


def dim_symbols(d) -> list[str]:
    """The symbols a shape entry names: [] for a size, ['G'] for 'G*32', ['L', 'R'] for 'L+R*2'."""
    if not isinstance(d, str):
        return []
    return [f.strip() for t in d.split("+") for f in t.split("*") if not f.strip().isdigit()]


def dim_size(d, binding: dict[str, int]) -> int:
    if not isinstance(d, str):
        return int(d)
    return sum(math.prod(int(f) if f.strip().isdigit() else binding[f.strip()] for f in t.split("*"))
               for t in d.split("+"))


@dataclass
class InputSpec:
    name: str
    shape: list[str | int]
    dtypes: list[str]
    like: str | None = None  # "dtype: like weight": always called with weight's dtype
    requires_grad: bool = False
    range: tuple | None = None  # test inputs drawn uniformly from [low, high]; [low, high) for indices
    edges: list[int] = field(default_factory=list)  # index values the edge cases mix in (an ignore_index)

    @property
    def index(self) -> bool:
        """An integer input (class labels) or a boolean one (a mask): drawn from its range, read exactly, no
        gradient."""
        return self.dtypes[0] in INDEX_DTYPES


@dataclass
class AttrSpec:
    name: str
    type: str
    default: Any


@dataclass
class Request:
    dir: Path
    name: str
    description: str
    category: str
    inputs: list[InputSpec]
    attributes: list[AttrSpec]
    outputs: dict[str, dict] | None
    reference_file: str
    reference_func: str
    backward: bool
    p0: list[dict[str, int]]
    tolerance: dict[str, dict[str, float]] = field(default_factory=dict)
    perf_target: dict[str, float] = field(default_factory=dict)
    deterministic: bool = False

    @property
    def dtypes(self) -> list[str]:
        """The dtypes the operator is delivered for: those of its first tensor input."""
        return list(self.inputs[0].dtypes)

    @property
    def symbols(self) -> list[str]:
        seen: list[str] = []
        for spec in self.inputs:
            for d in spec.shape:
                for sym in dim_symbols(d):
                    if sym not in seen:
                        seen.append(sym)
        return seen

    @property
    def attr_defaults(self) -> dict[str, Any]:
        return {a.name: a.default for a in self.attributes}

    def input_shape(self, spec: InputSpec, binding: dict[str, int]) -> tuple[int, ...]:
        return tuple(dim_size(d, binding) for d in spec.shape)

    def input_range(self, spec: InputSpec, binding: dict[str, int]) -> tuple | None:
        """The declared range under a binding (an index input's bound may be a size such as 'V')."""
        return None if spec.range is None else tuple(dim_size(v, binding) if isinstance(v, str) else v
                                                     for v in spec.range)

    def load_reference(self) -> Callable:
        return load_function(self.dir / self.reference_file, self.reference_func, f"{REQUEST_FILE}: reference")


def load_function(path: Path, func: str, where: str) -> Callable:
    """Import `func` from the Python file at `path` (a fresh module each time, so edits are seen)."""
    if not path.is_file():
        raise InputError(where, f"reference file {path.name} not found")
    mod_name = f"_opforge_ref_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: any error is bad input
        raise InputError(str(path.name), f"importing the reference failed: {type(exc).__name__}: {exc}") from None
    finally:
        sys.modules.pop(mod_name, None)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise InputError(where, f"{path.name} defines no function {func!r}")
    return fn


def _field(doc: dict, mapping: str, key: str, where: str, default=None):
    """doc[key], checked against the key's FORMAT entry; `where` is doc's own path ('inputs.x.')."""
    spec = FORMAT[mapping][key]
    if key not in doc or doc[key] is None:
        if spec.required:
            raise _bad(f"{where}{key}", "missing required field")
        return default
    value = doc[key]
    types = _as_tuple(spec.types)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = "/".join(t.__name__ for t in types)
        raise _bad(f"{where}{key}", f"expected {names}, got {type(value).__name__}")
    return value


def _as_tuple(types):
    return types if isinstance(types, tuple) else (types,)


def _dtype_list(value, where: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise _bad(where, "expected a dtype or a non-empty list of dtypes")
    for d in items:
        if d not in FLOAT_DTYPES:
            raise _bad(where, f"unknown dtype {d!r} (expected one of {', '.join(FLOAT_DTYPES)}, or alone one of "
                              f"{', '.join(INDEX_DTYPES)})")
    return list(items)


def _attr_default(value, atype: str, where: str):
    """An attribute's default checked against its type: a float as float, a sequence as a tuple, None as is."""
    if value is None:
        return None
    items = value if atype in ("ints", "floats") else [value]
    if atype in ("ints", "floats") and not isinstance(value, list):
        raise _bad(where, f"expected a list of {atype[:-1]}s, got {value!r}")
    if any(isinstance(v, bool) != (atype == "bool") or not isinstance(v, ATTR_TYPES[atype]) for v in items):
        raise _bad(where, f"expected {'a list of ' + atype if atype in ('ints', 'floats') else 'a ' + atype}, "
                          f"got {value!r}")
    if atype == "float":
        return float(value)
    return tuple(float(v) if atype == "floats" else v for v in items) if atype in ("ints", "floats") else value


def _shape(shape: list, where: str) -> None:
    for d in shape:
        ok = (isinstance(d, int) and not isinstance(d, bool) and d >= 1) or (
            isinstance(d, str) and _PRODUCT.match(d) and dim_symbols(d))
        if not ok:
            raise _bad(where, f"{d!r} is neither a symbol, a product like 'G*32', a sum like 'L+R*2', "
                                 "nor a positive int")


def _index_range(rng, edges, requires_grad: bool, where: str) -> tuple:
    """An index input's [low, high): ints, or a shape entry for the bound ('V', the number of classes)."""
    if requires_grad:
        raise _bad(f"{where}requires_grad", "an integer input has no gradient")
    if rng is None or len(rng) != 2:
        raise _bad(f"{where}range", "an integer input needs [low, high): e.g. [0, V] for class labels, "
                                    "[-127, 128] for int8 weights")
    for v in rng:
        ok = (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, str) and _PRODUCT.match(v)
                                                                   and dim_symbols(v))
        if not ok:
            raise _bad(f"{where}range", f"{v!r} is neither an int nor a size such as 'V'")
    if all(isinstance(v, int) for v in rng) and not rng[0] < rng[1]:
        raise _bad(f"{where}range", "expected [low, high) with low < high")
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in edges):
        raise _bad(f"{where}edges", "expected a list of ints (e.g. [-100], an ignore_index)")
    return tuple(rng)


def _mapping(value, where: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise _bad(where, f"expected a mapping {what}")
    return value


def load_request(request_dir: str | Path) -> Request:
    rdir = Path(request_dir)
    path = rdir / REQUEST_FILE
    if not rdir.is_dir():
        raise InputError(str(rdir), "request folder not found")
    if not path.is_file():
        raise InputError(str(rdir), f"no {REQUEST_FILE} in the request folder")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise _bad("", f"not valid YAML{at}") from None
    if not isinstance(doc, dict):
        raise _bad("", "expected a mapping at the top level")
    _keys(doc, "", "")

    name = _field(doc, "", "name", "")
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise _bad("name", f"{name!r} is not a snake_case identifier")
    description = _field(doc, "", "description", "")
    category = _field(doc, "", "category", "")
    if category not in CATEGORIES:
        raise _bad("category", f"{category!r} is not one of {', '.join(CATEGORIES)}")

    raw_inputs = _field(doc, "", "inputs", "")
    if not raw_inputs:
        raise _bad("inputs", "at least one tensor input is required")
    backward = _field(doc, "", "backward", "", default=False)
    inputs: list[InputSpec] = []
    for i, (iname, spec) in enumerate(raw_inputs.items()):
        where = f"inputs.{iname}."
        _mapping(spec, f"inputs.{iname}", "with shape and dtype")
        if not _SYMBOL.match(str(iname)) or keyword.iskeyword(str(iname)):
            raise _bad(f"inputs.{iname}", "not a valid Python identifier")
        _keys(spec, "inputs.<name>", where)
        shape = _field(spec, "inputs.<name>", "shape", where)
        _shape(shape, f"{where}shape")
        dtype = _field(spec, "inputs.<name>", "dtype", where)
        like = None
        if dtype in INDEX_DTYPES:
            if i == 0:
                raise _bad(f"{where}dtype", "the first input sets the operator's dtypes and must be floating; put "
                                            "index inputs after it")
            dtypes = [dtype]
        elif isinstance(dtype, str) and dtype.startswith("like "):
            like = dtype[5:].strip()
            target = next((s for s in inputs if s.name == like), None)
            if target is None:
                raise _bad(f"{where}dtype", f"'like {like}' names no earlier input")
            dtypes = list(target.dtypes)
        else:
            dtypes = _dtype_list(dtype, f"{where}dtype")
        default_grad = backward and dtypes[0] not in INDEX_DTYPES
        rg = _field(spec, "inputs.<name>", "requires_grad", where, default=default_grad)
        rng = _field(spec, "inputs.<name>", "range", where)
        edges = _field(spec, "inputs.<name>", "edges", where, default=[])
        if dtypes[0] == "bool" and rng is None:
            rng = [0, 2]  # False and True
        if dtypes[0] in INDEX_DTYPES:
            rng = _index_range(rng, edges, rg, where)
        elif rng is not None:
            if len(rng) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in rng) \
                    or not rng[0] < rng[1]:
                raise _bad(f"{where}range", "expected [low, high] with low < high")
            rng = (float(rng[0]), float(rng[1]))
        if edges and dtypes[0] not in INDEX_DTYPES:
            raise _bad(f"{where}edges", f"only index inputs ({', '.join(INDEX_DTYPES)}) take edge values")
        inputs.append(InputSpec(str(iname), shape, dtypes, like, rg, rng, list(edges)))
    symbols = {sym for s in inputs for d in s.shape for sym in dim_symbols(d)}
    for s in inputs:
        unknown = [sym for v in (s.range or ()) if isinstance(v, str) for sym in dim_symbols(v) if sym not in symbols]
        if unknown:
            raise _bad(f"inputs.{s.name}.range", f"{unknown[0]!r} names no size of any input")

    attributes: list[AttrSpec] = []
    for aname, spec in (_field(doc, "", "attributes", "", default={})).items():
        where = f"attributes.{aname}."
        _mapping(spec, f"attributes.{aname}", "with type and default")
        _keys(spec, "attributes.<name>", where)
        atype = _field(spec, "attributes.<name>", "type", where)
        if atype not in ATTR_TYPES:
            raise _bad(f"{where}type", f"{atype!r} is not one of {', '.join(ATTR_TYPES)}")
        null = "default" in spec and spec["default"] is None  # None, which _field would take for missing
        default = None if null else _field(spec, "attributes.<name>", "default", where)
        attributes.append(AttrSpec(str(aname), atype, _attr_default(default, atype, f"{where}default")))

    outputs = _field(doc, "", "outputs", "")
    for oname, spec in (outputs or {}).items():
        # names the outputs; shape and dtype are for the reader: both are read off the reference when traced
        where = f"outputs.{oname}."
        if spec is None:
            continue
        _mapping(spec, f"outputs.{oname}", "with shape and dtype")
        _keys(spec, "outputs.<name>", where)
        _shape(_field(spec, "outputs.<name>", "shape", where, default=[]), f"{where}shape")
        odtype = _field(spec, "outputs.<name>", "dtype", where)
        if isinstance(odtype, str) and odtype.startswith("like "):
            if odtype[5:].strip() not in {s.name for s in inputs}:
                raise _bad(f"{where}dtype", f"'{odtype}' names no input")
        elif odtype != "int64" and odtype is not None:  # int64: indices (argmax, max.dim's)
            _dtype_list(odtype, f"{where}dtype")

    reference = _field(doc, "", "reference", "")
    if ":" not in reference:
        raise _bad("reference", "expected 'file.py:function'")
    ref_file, ref_func = reference.rsplit(":", 1)
    if not (rdir / ref_file).is_file():
        raise _bad("reference", f"reference file {ref_file} not found in {rdir}")

    shapes = _field(doc, "", "shapes", "")
    _keys(shapes, "shapes", "shapes.")
    p0 = _field(shapes, "shapes", "p0", "shapes.")
    if not p0:
        raise _bad("shapes.p0", "at least one shape binding is required")
    symbols = [sym for s in inputs for d in s.shape for sym in dim_symbols(d)]
    for k, binding in enumerate(p0):
        where = f"shapes.p0[{k}]"
        _mapping(binding, where, "from shape symbols to sizes")
        for sym in symbols:
            if sym not in binding:
                raise _bad(where, f"shape symbol {sym} is not bound")
        for sym, size in binding.items():
            if sym not in symbols:
                raise _bad(where, f"{sym} is bound but no input shape uses it")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise _bad(where, f"{sym} must be a non-negative int, got {size!r}")

    tolerance = _field(doc, "", "tolerance", "", default={})
    for dt, tol in tolerance.items():
        where = f"tolerance.{dt}"
        if dt not in FLOAT_DTYPES:
            raise _bad(where, f"unknown key; allowed: {', '.join(FLOAT_DTYPES)} (a dtype)")
        if not _mapping(tol, where, "{atol: float, rtol: float}"):  # an empty one is a slip, not the defaults
            raise _bad(where, "expected a mapping {atol: float, rtol: float}")
        _keys(tol, "tolerance.<dtype>", f"{where}.")
        for k in tol:
            v = _field(tol, "tolerance.<dtype>", k, f"{where}.")
            if v is None or v < 0:
                raise _bad(f"{where}.{k}", f"expected a non-negative number, got {v!r}")
        tolerance[dt] = {k: float(v) for k, v in tol.items()}

    perf_target = _field(doc, "", "perf_target", "", default={})
    _keys(perf_target, "perf_target", "perf_target.")
    for k in perf_target:
        v = _field(perf_target, "perf_target", k, "perf_target.")
        if v is None or v <= 0:
            raise _bad(f"perf_target.{k}", f"expected a positive number, got {v!r}")
    deterministic = _field(doc, "", "deterministic", "", default=False)

    return Request(rdir, name, description, category, inputs, attributes, outputs, ref_file, ref_func,
                   backward, [dict(b) for b in p0], tolerance, dict(perf_target), deterministic)
