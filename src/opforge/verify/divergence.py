"""Divergence localisation: record every operator a program runs, then find the first one that goes wrong.

`record` runs a callable under a TorchDispatchMode and keeps, for every ATen operator (and every Triton
launch, which the dispatcher never sees), CPU copies of its inputs and outputs, the storages it read and
wrote (the dataflow), and its call site: the innermost frame of the user's code. Fresh uninitialised
allocations are filled with NaN, so elements a kernel forgets to write show as such.

Three questions are then asked of a trace:
- `local_check`: replay each ATen operator on CPU in float64 on exactly the inputs the device under test
  gave it. An output beyond the dtype's tolerance of that replay is that operator's own fault, whatever
  happened upstream: this is "diverges given matching inputs", without having to trust an alignment.
- `run_to_run`: two runs of one program; the first operator whose output values change while its inputs
  are the same (or the same values in another order) is the source of non-determinism.
- `align` / `first_aligned_mismatch`: the traces of the reference and of the device under test matched by
  operator name, for what a replay cannot see (shapes, dtypes, opaque kernels).
"""

from __future__ import annotations

import difflib
import linecache
import math
import os
import sys
import sysconfig
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from opforge.verify.tolerance import tolerance_for

# Outputs with no defined content: never compared, and inputs produced only by them are ignored.
UNINIT_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}
# Reductions whose error bound scales with the sum of absolute terms: replaying them on |inputs| gives it.
LINEAR_REDUCTIONS = {"sum", "mean", "mm", "bmm", "addmm", "matmul", "dot", "mv", "addmv", "baddbmm", "cumsum",
                     "linear", "nansum", "addbmm", "einsum", "_softmax", "softmax"}
# Results that are differences of larger terms: an output near zero keeps the rounding of its inputs.
CANCELLING = {"add", "sub", "rsub", "_log_softmax", "log_softmax", "addcmul", "addcdiv", "lerp", "logsumexp",
              "add_", "sub_", "_log_softmax_backward_data", "_softmax_backward_data", "nll_loss_forward"}
NO_REPLAY = {"_local_scalar_dense", "view.dtype", "set_", "resize_"}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Frames in these folders are never a call site: the user's code is what is left.
_SKIP_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(__file__)) + os.sep,  # opforge itself
    # the stdlib, installed packages and console scripts
    *{sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "purelib", "platlib", "scripts")},
)
try:
    import triton

    _SKIP_DIRS += (os.path.dirname(triton.__file__) + os.sep,)
except ImportError:  # pragma: no cover - triton is a dependency, but the recorder works without it
    triton = None


@dataclass
class CallSite:
    file: str
    line: int
    function: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}: {self.code}"

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}


@dataclass
class OpRecord:
    index: int
    name: str                      # "aten.mul.Tensor", "triton:add_kernel", "mylib.op.default"
    kind: str                      # aten | custom | triton
    func: object = None            # the OpOverload, for replay
    args: tuple = field(default=(), repr=False)  # args/kwargs with tensors replaced by their snapshots
    kwargs: dict = field(default_factory=dict, repr=False)
    inputs: list = field(default_factory=list, repr=False)  # snapshots of the tensor inputs, before the call
    outputs: list = field(default_factory=list, repr=False)  # snapshots of the tensor outputs, after the call
    input_uninit: list = field(default_factory=list)  # per input: only ever written by an UNINIT op
    deps: list = field(default_factory=list)        # indices of records that wrote the storages it read
    site: CallSite | None = None
    stack: list = field(default_factory=list)       # up to 4 user frames, innermost first
    children: list = field(default_factory=list)    # records made while it ran (Triton launches in a custom op)
    uninit: bool = False
    random: bool = False
    view: bool = False             # an alias of an input: exact by construction, never replayed
    kept: bool = True              # False when the byte budget ran out: metadata only

    @property
    def short(self) -> str:
        return self.name.split(".")[1] if self.kind == "aten" else self.name

    def describe(self) -> str:
        return f"#{self.index} {self.name}" + (f" at {self.site}" if self.site else "")

    def meta(self) -> dict:
        def m(ts):
            return [{"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")} for t in ts]
        return {"index": self.index, "op": self.name, "kind": self.kind, "inputs": m(self.inputs),
                "outputs": m(self.outputs), "site": self.site.to_dict() if self.site else None,
                "stack": [s.to_dict() for s in self.stack]}


@dataclass
class Trace:
    records: list
    result: object = None
    outputs: list = field(default_factory=list)       # snapshots of the returned tensors
    output_deps: list = field(default_factory=list)   # per returned tensor: records that wrote it
    error: BaseException | None = None
    failed_op: OpRecord | None = None                 # the operator in flight when `error` was raised
    peak_bytes: int = 0

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.records]


def _user_stack(limit: int = 4) -> list[CallSite]:
    frames, f = [], sys._getframe(1)
    while f is not None and len(frames) < limit:
        fn = f.f_code.co_filename
        if not (fn.startswith(_SKIP_DIRS) or fn.startswith("<")):
            code = linecache.getline(fn, f.f_lineno).strip()
            frames.append(CallSite(fn, f.f_lineno, f.f_code.co_name, code))
        f = f.f_back
    return frames


def _snap(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _poison(t: torch.Tensor) -> None:
    """Fill a fresh uninitialised allocation with NaN (or the largest integer): a kernel that leaves part of
    it unwritten then shows, instead of whatever a freed buffer held (often the reference's own result)."""
    with torch.no_grad():
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(torch.iinfo(t.dtype).max)


def _storage_key(t: torch.Tensor):
    try:
        return (t.device.type, t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return None


def _nbytes(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return 0


class Recorder(TorchDispatchMode):
    """Records operators while active; use through `record`."""

    def __init__(self, *, keep_bytes: int = 512 << 20, values: bool = True):
        super().__init__()
        self.records: list[OpRecord] = []
        self.values = values
        self.budget = keep_bytes
        self.writers: dict = {}      # storage key -> indices of records that wrote it
        self.live: dict = {}         # storage key -> [bytes, tensors alive]
        self.live_bytes = 0
        self.peak_bytes = 0
        self.opaque_depth = 0
        self.failed_op: OpRecord | None = None

    # --- memory: bytes of storages created by recorded operators and still referenced ---
    def _track(self, t: torch.Tensor) -> None:
        key = _storage_key(t)
        if key is None:
            return
        if key not in self.live:
            n = _nbytes(t)
            self.live[key] = [n, 0]
            self.live_bytes += n
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.live[key][1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            self.live_bytes -= entry[0]
            del self.live[key]

    # --- recording ---
    def _keep(self, ts: list) -> bool:
        if not self.values:
            return False
        need = sum(t.numel() * t.element_size() for t in ts)
        if need > self.budget:
            return False
        self.budget -= need
        return True

    def _begin(self, name: str, kind: str, tensors_in: list) -> OpRecord:
        # provisional: launches made while it runs are recorded first, so the index is final in _finish
        rec = OpRecord(index=len(self.records), name=name, kind=kind)
        stack = _user_stack()
        rec.site, rec.stack = (stack[0] if stack else None), stack
        deps, uninit = set(), []
        for t in tensors_in:
            w = self.writers.get(_storage_key(t), [])
            deps.update(w)
            uninit.append(bool(w) and all(self.records[i].uninit for i in w))
        rec.deps, rec.input_uninit = sorted(deps), uninit
        return rec

    def _finish(self, rec: OpRecord, tensors_in: list, tensors_out: list) -> None:
        rec.children = list(range(rec.index, len(self.records)))
        rec.index = len(self.records)
        in_keys = {_storage_key(t) for t in tensors_in}
        for t in tensors_out:
            key = _storage_key(t)
            if key is None:
                continue
            if key not in in_keys and key not in {_storage_key(o) for o in tensors_out if o is not t}:
                self.writers[key] = []  # a fresh allocation: forget what an earlier storage at this address held
            self.writers.setdefault(key, []).append(rec.index)
        self.records.append(rec)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.opaque_depth:
            return func(*args, **kwargs)
        ns = func.namespace
        name = str(func)
        kind = "aten" if ns in ("aten", "prims") else "custom"
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        rec = self._begin(name, kind, flat_in)
        rec.func = func
        rec.uninit = kind == "aten" and name.split(".")[1] in UNINIT_OPS
        rec.random = torch.Tag.nondeterministic_seeded in func.tags
        rec.view = bool(getattr(func, "is_view", False))
        keep = self._keep(flat_in)
        if keep:
            snaps = {id(t): _snap(t) for t in flat_in}
            rec.inputs = [snaps[id(t)] for t in flat_in]
            rec.args, rec.kwargs = tree_map(lambda a: snaps.get(id(a), a) if isinstance(a, torch.Tensor) else a,
                                            (args, kwargs))
        else:
            rec.kept = False
            rec.inputs = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in flat_in]
        try:
            out = func(*args, **kwargs)
        except BaseException:
            self.failed_op = rec
            raise
        flat_out = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if rec.uninit:
            for o in flat_out:
                _poison(o)
        if keep and self._keep(flat_out):
            rec.outputs = [_snap(o) for o in flat_out]
        else:
            rec.kept = False
            rec.outputs = [torch.empty(o.shape, dtype=o.dtype, device="meta") for o in flat_out]
        in_keys = {_storage_key(t) for t in flat_in}
        for o in flat_out:
            if _storage_key(o) not in in_keys:  # views and in-place results allocate nothing
                self._track(o)
        self._finish(rec, flat_in, flat_out)
        return out

    # --- Triton launches: opaque to the dispatcher, so recorded around the launcher ---
    def launch(self, orig, kernel, args, kwargs):
        if self.opaque_depth:
            return orig(kernel, *args, **kwargs)
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        rec = self._begin(f"triton:{getattr(kernel, '__name__', type(kernel).__name__)}", "triton", tensors)
        self.opaque_depth += 1  # the snapshots and the interpreter's own torch calls are not the program's
        try:
            rec.inputs = [_snap(t) for t in tensors]
            try:
                out = orig(kernel, *args, **kwargs)
            except BaseException:
                self.failed_op = rec
                raise
            written = [t for t, b, u in zip(tensors, rec.inputs, rec.input_uninit)
                       if u or not bits_equal(_snap(t), b)]
            rec.outputs = [_snap(t) for t in written]
        finally:
            self.opaque_depth -= 1
        # the buffers it wrote now hold its output; what they held before is among its deps already
        self._finish(rec, [t for t in tensors if not any(t is w for w in written)], written)
        return out


def _patched_launchers(rec: Recorder):
    """(class, attribute, original) for every Triton launcher, patched to report to `rec`."""
    if triton is None:
        return []
    from triton.runtime import jit

    classes = [jit.JITFunction]
    try:
        from triton.runtime import interpreter

        classes.append(interpreter.InterpretedFunction)
    except ImportError:  # pragma: no cover
        pass
    patched = []
    for cls in classes:
        orig = cls.run

        def run(self, *args, __orig=orig, **kwargs):
            return rec.launch(__orig, self, args, kwargs)

        cls.run = run
        patched.append((cls, "run", orig))
    return patched


def record(fn, *args, values: bool = True, keep_bytes: int = 512 << 20, **kwargs) -> Trace:
    """Run fn(*args, **kwargs) recording every operator; an exception is kept in the trace, not raised."""
    rec = Recorder(keep_bytes=keep_bytes, values=values)
    patched = _patched_launchers(rec)
    trace = Trace(records=rec.records)
    try:
        with rec:
            trace.result = fn(*args, **kwargs)
    except Exception as exc:  # the program's failure is a finding, not ours
        trace.error = exc
        trace.failed_op = rec.failed_op
    finally:
        for cls, attr, orig in patched:
            setattr(cls, attr, orig)
    trace.peak_bytes = rec.peak_bytes
    if trace.error is None:
        leaves = [o for o in tree_flatten(trace.result)[0] if isinstance(o, torch.Tensor)]
        trace.outputs = [_snap(o) for o in leaves]
        trace.output_deps = [list(rec.writers.get(_storage_key(o), [])) for o in leaves]
    return trace


# ----------------------------------------------------------------------------------------------- comparison

_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (so NaN equals NaN and -0 differs from +0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool or not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    ia = a.contiguous().reshape(-1).view(_INTS[a.element_size()] if not a.is_complex() else torch.float32)
    ib = b.contiguous().reshape(-1).view(_INTS[b.element_size()] if not b.is_complex() else torch.float32)
    return torch.equal(ia, ib) if not a.is_complex() else torch.equal(torch.view_as_real(a), torch.view_as_real(b))


def same_values_any_order(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex():
        return False
    fa, fb = a.reshape(-1), b.reshape(-1)
    if a.dtype == torch.bool:
        return int(fa.sum()) == int(fb.sum())
    return bits_equal(torch.sort(fa).values, torch.sort(fb).values)


@dataclass
class OpCheck:
    record: OpRecord
    replayed: bool
    passed: bool = True
    reason: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    new_nonfinite: int = 0     # inf/NaN in the device's output where the float64 replay is finite
    bad: int = 0
    numel: int = 0

    def to_dict(self) -> dict:
        return {**self.record.meta(), "replayed": self.replayed, "passed": self.passed, "reason": self.reason,
                "max_abs": self.max_abs, "max_rel": self.max_rel, "new_nonfinite": self.new_nonfinite,
                "mismatches": self.bad, "numel": self.numel}


def _to_ref(x):
    if isinstance(x, torch.Tensor):
        if x.is_floating_point():
            return x.to("cpu", torch.float64, copy=True)
        if x.is_complex():
            return x.to("cpu", torch.complex128, copy=True)
        return x.to("cpu", copy=True)
    if isinstance(x, torch.dtype) and x.is_floating_point:
        return torch.float64
    if isinstance(x, torch.device):
        return torch.device("cpu")
    return x


def _replay(rec: OpRecord, conv):
    args, kwargs = tree_map(conv, (rec.args, rec.kwargs))
    if "device" in kwargs:
        kwargs["device"] = torch.device("cpu")
    with torch.no_grad():
        out = rec.func(*args, **kwargs)
    return [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]


def _replayable(rec: OpRecord) -> str:
    if rec.kind != "aten":
        return f"{rec.kind} operator: no float64 replay"
    if not rec.kept:
        return "values not kept (recording budget)"
    if rec.uninit or rec.random:
        return "uninitialised or random output"
    if rec.view:
        return "a view of its input: exact by construction"
    if rec.name.split(".", 1)[1] in NO_REPLAY or rec.short in NO_REPLAY:
        return "not replayable"
    if not rec.outputs:
        return "no tensor output"
    return ""


def _eps(dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def check_op(rec: OpRecord, *, baseline: bool = False) -> OpCheck:
    """Replay one operator in float64 on the recorded inputs and compare its recorded outputs.

    The bound per element is the output dtype's tolerance around the replay, plus, for reductions, the
    rounding a sum of K terms may accumulate (K from the shapes, scaled by the same op on |inputs|).
    With `baseline` (a device other than the CPU), the CPU's own error at the device's dtype on the same
    inputs is also allowed: a device is not faulted for being as accurate as the CPU.
    """
    why = _replayable(rec)
    if why:
        return OpCheck(rec, replayed=False, reason=why)
    try:
        ref = _replay(rec, _to_ref)
    except Exception as exc:  # an op without a float64 CPU kernel
        return OpCheck(rec, replayed=False, reason=f"float64 replay failed: {type(exc).__name__}")
    cpu = None
    if baseline:
        try:
            cpu = _replay(rec, lambda x: x.to("cpu", copy=True) if isinstance(x, torch.Tensor) else _cpu_device(x))
        except Exception:
            cpu = None
    scale = None
    if rec.short in LINEAR_REDUCTIONS:
        try:
            scale = _replay(rec, lambda x: _to_ref(x).abs() if isinstance(x, torch.Tensor) and
                            (x.is_floating_point()) else _to_ref(x))
        except Exception:
            scale = None
    chk = OpCheck(rec, replayed=True)
    if len(ref) != len(rec.outputs):
        chk.passed, chk.reason = False, f"{len(rec.outputs)} outputs, the replay gives {len(ref)}"
        return chk
    k_in = max((t.numel() for t in rec.inputs), default=1)
    for i, (dut, r) in enumerate(zip(rec.outputs, ref)):
        if tuple(dut.shape) != tuple(r.shape):
            chk.passed, chk.reason = False, f"output {i}: shape {tuple(dut.shape)}, replay {tuple(r.shape)}"
            return chk
        chk.numel += dut.numel()
        if dut.numel() == 0:
            continue
        if dut.is_complex():
            dut, r = torch.view_as_real(dut), torch.view_as_real(r)
        if not dut.is_floating_point():
            bad = int((dut.to(r.dtype) != r).sum()) if not r.is_floating_point() else int(
                (dut.double() != r).sum())
            if bad:
                chk.passed, chk.bad = False, chk.bad + bad
                chk.reason = chk.reason or f"output {i}: {bad} of {dut.numel()} values differ exactly"
            continue
        d, t = dut.double(), r.double()
        tol = tolerance_for(dut.dtype) if dut.dtype in _FLOATS else None
        atol, rtol = (tol.atol, tol.rtol) if tol else (0.0, 4 * _eps(dut.dtype))
        k = max(1, k_in // max(1, dut.numel()))
        allowed = atol + rtol * t.abs()
        if k > 1 or scale is not None:
            s = scale[i].double().abs() if scale is not None and i < len(scale) else t.abs().max()
            allowed = allowed + 4 * max(rtol, _eps(dut.dtype)) * math.sqrt(k) * s
        if rec.short in CANCELLING:
            allowed = allowed + 4 * max(rtol, _eps(dut.dtype)) * _max_abs(rec.inputs)
        if cpu is not None and i < len(cpu) and cpu[i].shape == dut.shape:
            allowed = allowed + 2 * (cpu[i].double() - t).abs().nan_to_num(0.0, 0.0, 0.0)
        fin = torch.isfinite(t)
        new_nf = fin & ~torch.isfinite(d)
        both = fin & torch.isfinite(d)
        err = torch.where(both, (d - t).abs(), torch.zeros_like(d))
        nan_bad = torch.isnan(d) ^ torch.isnan(t)
        inf_bad = torch.isinf(t) & (d != t) & ~torch.isnan(t)
        bad = (both & (err > allowed)) | new_nf | nan_bad | inf_bad
        chk.new_nonfinite += int(new_nf.sum())
        chk.bad += int(bad.sum())
        if both.any():
            chk.max_abs = max(chk.max_abs, float(err.max()))
            rel = err[both] / t[both].abs().clamp_min(torch.finfo(torch.float64).tiny)
            chk.max_rel = max(chk.max_rel, float(torch.where(t[both] == 0, err[both], rel).max()))
        if bad.any() and chk.passed:
            chk.passed = False
            if new_nf.any():
                first = int(new_nf.reshape(-1).nonzero()[0])
                chk.reason = (f"output {i}: {int(new_nf.sum())} inf/NaN where the float64 replay is finite "
                              f"(e.g. flat index {first}: {float(d.reshape(-1)[first])} vs "
                              f"{float(t.reshape(-1)[first]):.6g})")
            else:
                chk.reason = (f"output {i}: {int(bad.sum())} of {dut.numel()} elements beyond tolerance "
                              f"(max abs error {chk.max_abs:.3g})")
    return chk


def _max_abs(ts: list) -> float:
    vals = [t.double().abs()[torch.isfinite(t)].max() for t in ts if t.is_floating_point() and torch.isfinite(t).any()]
    return float(max(vals)) if vals else 0.0


def _cpu_device(x):
    if isinstance(x, torch.device):
        return torch.device("cpu")
    return x


def local_check(trace: Trace, *, baseline: bool = False, stop_at_first: bool = True) -> list[OpCheck]:
    """Replay the trace's operators in order; stops after the first failure unless told otherwise."""
    checks = []
    for rec in trace.records:
        c = check_op(rec, baseline=baseline)
        checks.append(c)
        if stop_at_first and not c.passed:
            break
    return checks


def first_local_divergence(trace: Trace, *, baseline: bool = False) -> OpCheck | None:
    checks = local_check(trace, baseline=baseline)
    return checks[-1] if checks and not checks[-1].passed else None


# --------------------------------------------------------------------------------------------- dataflow

def backward_slice(trace: Trace, output_index: int | None = None) -> list[OpRecord]:
    """Records whose writes reach the returned tensor(s), in program order."""
    roots = trace.output_deps if output_index is None else [trace.output_deps[output_index]]
    seen, stack = set(), [i for deps in roots for i in deps]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        stack.extend(trace.records[i].deps)
    return [trace.records[i] for i in sorted(seen)]


def promotion_point(trace: Trace, output_index: int, expected: torch.dtype) -> OpRecord | None:
    """Where the returned tensor's dtype went wrong: the first operator on its path that turns a tensor of
    the expected dtype into another floating dtype (a mixed-dtype op or a cast)."""
    path = backward_slice(trace, output_index)
    wrong = [r for r in path if any(o.is_floating_point() and o.dtype != expected for o in r.outputs)]
    for r in wrong:
        if any(t.dtype == expected for t in r.inputs):
            return r
    return wrong[0] if wrong else None


# -------------------------------------------------------------------------------------------- alignment

def _key(rec: OpRecord) -> str:
    return rec.name


def align(a: Trace, b: Trace) -> list[tuple[int, int]]:
    """Pairs (i, j) of records matched by operator name, in order (longest common blocks)."""
    sm = difflib.SequenceMatcher(a=[_key(r) for r in a.records], b=[_key(r) for r in b.records], autojunk=False)
    return [(blk.a + k, blk.b + k) for blk in sm.get_matching_blocks() for k in range(blk.size)]


def first_aligned_mismatch(ref: Trace, dut: Trace, what: str = "shape") -> tuple[OpRecord, OpRecord] | None:
    """The first aligned pair whose outputs differ in `what` (shape | dtype); dtypes compare up to the
    reference's float64 when the reference ran in float64."""
    for i, j in align(ref, dut):
        r, d = ref.records[i], dut.records[j]
        if len(r.outputs) != len(d.outputs):
            return r, d
        for ro, do in zip(r.outputs, d.outputs):
            if what == "shape" and tuple(ro.shape) != tuple(do.shape):
                return r, d
            if what == "dtype" and ro.dtype != do.dtype:
                return r, d
    return None


# ---------------------------------------------------------------------------------------- determinism

def _same(a: list, b: list) -> str:
    if len(a) != len(b):
        return "different"
    if all(bits_equal(x, y) for x, y in zip(a, b)):
        return "same"
    if all(same_values_any_order(x, y) for x, y in zip(a, b)):
        return "permuted"
    return "different"


@dataclass
class RunToRun:
    record: OpRecord
    strict: bool          # inputs the same (or permuted): the operator itself is not deterministic
    inputs: str
    outputs: str
    max_abs: float

    def to_dict(self) -> dict:
        return {**self.record.meta(), "strict": self.strict, "inputs": self.inputs, "outputs": self.outputs,
                "max_abs_between_runs": self.max_abs}


def run_to_run(a: Trace, b: Trace) -> RunToRun | None:
    """The first operator whose output values change between two runs of the same program.

    Strict: its inputs were the same, or the same values in another order (an accumulation whose result
    depends on order is the classic source). Operators that only move values around are skipped: their
    output is a permutation too. If no operator qualifies strictly, the first whose values change.
    """
    fallback = None
    for i, j in align(a, b):
        ra, rb = a.records[i], b.records[j]
        if ra.uninit or not (ra.kept and rb.kept):
            continue
        outs = _same(ra.outputs, rb.outputs)
        if outs != "different":
            continue
        ins_a = [t for t, u in zip(ra.inputs, ra.input_uninit) if not u]
        ins_b = [t for t, u in zip(rb.inputs, rb.input_uninit) if not u]
        ins = _same(ins_a, ins_b)
        diffs = [float((x.double() - y.double()).abs().nan_to_num(0.0, 0.0, 0.0).max()) if x.numel() and
                 x.shape == y.shape and x.dtype.is_floating_point else 0.0 for x, y in zip(ra.outputs, rb.outputs)]
        hit = RunToRun(rb, ins != "different", ins, outs, max(diffs, default=0.0))
        if hit.strict:
            return hit
        fallback = fallback or hit
    return fallback


def range_event(ref: Trace, dut: Trace, among: list[OpRecord] | None = None) -> tuple[OpRecord, str] | None:
    """The first operator whose output leaves its dtype's range where the same operator of the reference
    (aligned; typically the program in float64) stays inside: inf where the reference is finite (overflow),
    or exactly zero where the reference is non-zero but below the dtype's smallest normal (underflow).

    Each operator may be right on its own inputs (1/0 is inf): this finds where the range was first lost,
    which a replay cannot see when the loss is a flush to zero that only later becomes inf or NaN.
    """
    keep = None if among is None else {r.index for r in among}
    for i, j in align(ref, dut):
        r, d = ref.records[i], dut.records[j]
        if (keep is not None and d.index not in keep) or not (r.kept and d.kept) or d.uninit:
            continue
        for ro, do in zip(r.outputs, d.outputs):
            if ro.shape != do.shape or not (ro.is_floating_point() and do.is_floating_point()) or not do.numel():
                continue
            rr, dd = ro.double(), do.double()
            over = torch.isfinite(rr) & ~torch.isfinite(dd)
            if over.any():
                k = int(over.reshape(-1).nonzero()[0])
                return d, (f"{int(over.sum())} element(s) overflow to {float(dd.reshape(-1)[k])} where the reference "
                           f"holds {float(rr.reshape(-1)[k]):.6g}")
            tiny = torch.finfo(do.dtype).tiny
            under = (dd == 0) & (rr != 0) & (rr.abs() < tiny) & torch.isfinite(rr)
            if under.any():
                k = int(under.reshape(-1).nonzero()[0])
                return d, (f"{int(under.sum())} element(s) underflow to 0 where the reference holds "
                           f"{float(rr.reshape(-1)[k]):.3g} (below the smallest normal {tiny:.3g})")
    return None
