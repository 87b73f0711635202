"""Compile an impl's kernels for a GPU architecture on a machine that has none, and read what the compiler says.

The impl is called on CPU tensors of a chosen shape, with Triton's launch turned into a warm-up: each kernel it
would launch goes through Triton's own argument binder (the same specialisation a GPU run gets: 16-byte
alignment, ints equal to 1, int64 strides) and the real toolchain (ttir → ttgir → llir → ptx → cubin, with the
ptxas Triton ships). Nothing runs. What comes back is the compiler's: registers per thread, bytes spilled to
local memory, shared memory. A kernel that the interpreter accepts and the compiler rejects fails here, not on
the first GPU run.

It must run in a process of its own (`opforge bench compile` is one): it loads the impl with the interpreter off
and, unless the target is the visible GPU's own, swaps Triton's active driver for one that names the target and
launches nothing.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from opforge.i18n import N_, _
from opforge.workspace import load_module

ARCH_RE = re.compile(r"sm_(\d{2,3})a?$")
RESOURCE_RE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
ACCESS_RE = re.compile(r"\b(ld|st)\.global((?:\.\w+)*)")
WIDTH_RE = re.compile(r"\.(?:v(\d))?\.?[bfsu](\d+)$")


def default_arch() -> str:
    """The visible GPU's architecture; without one, sm_90 (H100/H200), the generation the perf stage targets."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return "sm_90"


def parse_arch(arch: str) -> int:
    m = ARCH_RE.match(arch)
    if not m:
        raise ValueError(f"expected a CUDA architecture such as sm_90, got {arch!r}")
    return int(m.group(1))


class _TargetOnly:
    """What JITFunction.run asks of the active driver before it compiles; a launch would need much more, and
    `compile_only` never lets one happen."""

    def __init__(self, capability: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def _cuobjdump() -> Path | None:
    import triton.backends.nvidia as nvidia

    path = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    return path if path.exists() else None


def resources(cubin: bytes) -> dict:
    """Registers, stack, shared and local (spilled) bytes of a cubin's kernel, as cuobjdump reports them."""
    tool = _cuobjdump()
    if tool is None:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, timeout=60).stdout
    m = RESOURCE_RE.search(out)
    if not m:
        return {}
    reg, stack, _unused, local = map(int, m.groups())
    return {"registers": reg, "stack_bytes": stack, "spill_bytes": local}


# Per-SM limits from NVIDIA's tuning guides: resident warps, 32-bit registers, shared memory (bytes) and
# resident blocks; SM counts of the parts most often benchmarked (A100; H100 SXM and H200).
SM_LIMITS = {80: {"warps": 64, "registers": 65536, "shared": 164 * 1024, "blocks": 32, "sms": 108},
             90: {"warps": 64, "registers": 65536, "shared": 228 * 1024, "blocks": 32, "sms": 132}}


def occupancy(registers: int, num_warps: int, shared_bytes: int, capability: int) -> dict | None:
    """Theoretical occupancy: resident blocks per SM as registers, warps and shared memory allow, and the
    fraction of the SM's warp slots they fill. Registers are granted per warp in units of 256."""
    lim = SM_LIMITS.get(capability)
    if lim is None or not registers:
        return None
    per_warp = -(-registers * 32 // 256) * 256
    blocks = min(lim["registers"] // (per_warp * num_warps), lim["warps"] // num_warps, lim["blocks"],
                 lim["shared"] // shared_bytes if shared_bytes else lim["blocks"])
    return {"blocks_per_sm": blocks, "occupancy": blocks * num_warps / lim["warps"]}


def access_widths(ptx: str) -> dict:
    """Global load and store instructions in the PTX, and how many move 128 bits (a memory-bound kernel wants
    its bulk traffic in 128-bit accesses; scalar loads of a per-row scale are expected)."""
    out = {"loads": 0, "loads_128": 0, "stores": 0, "stores_128": 0}
    for op, suffix in ACCESS_RE.findall(ptx):
        kind = "loads" if op == "ld" else "stores"
        out[kind] += 1
        m = WIDTH_RE.search(suffix)
        if m and int(m.group(1) or 1) * int(m.group(2)) >= 128:
            out[f"{kind}_128"] += 1
    # bfloat16 stores should round in hardware (cvt.rn.bf16[x2].f32), not with integer arithmetic on the bits
    out["bf16_cvt"] = len(re.findall(r"cvt\.rn\.bf16(?:x2)?\.f32", ptx))
    # matrix products on the tensor cores: Hopper's warpgroup wgmma, or the warp-level mma of earlier chips
    out["wgmma"] = len(re.findall(r"\bwgmma\.mma_async\b", ptx))
    out["mma"] = len(re.findall(r"\bmma\.sync\b", ptx))
    return out


@contextlib.contextmanager
def compile_only(capability: int):
    """Within: every `kernel[grid](...)` compiles for sm_<capability> and launches nothing (an autotuned kernel:
    each of its configs). Yields the list that receives one record per compiled kernel."""
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    builds: list[dict] = []
    run, tune = JITFunction.run, Autotuner.run

    def compile_configs(self, *args, **kwargs):  # an autotuned kernel: every config compiled, none timed
        kwargs.pop("warmup", None)
        self.warmup(*args, **kwargs)

    def compile_instead(self, *args, grid, warmup, **kwargs):
        constexprs = {p.name: kwargs[p.name] for p in self.params if p.is_constexpr and p.name in kwargs}
        # a grid given as a function of the config is not known before the launch
        known = isinstance(grid, (tuple, list))
        rec = {"kernel": self.fn.__name__, "constexprs": {k: v for k, v in constexprs.items()
                                                          if isinstance(v, (int, float, bool, str))},
               "grid": [int(g) for g in grid] if known else None,
               "programs": math.prod(int(g) for g in grid) if known else None}
        start = time.perf_counter()
        try:
            kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
            md = kernel.metadata
            rec.update(num_warps=md.num_warps, num_stages=md.num_stages, shared_bytes=md.shared,
                       **resources(kernel.asm["cubin"]), **access_widths(kernel.asm["ptx"]))
            occ = occupancy(rec.get("registers"), md.num_warps, md.shared, capability)
            if occ and rec["programs"] and occ["blocks_per_sm"]:
                # programs over the device's resident slots: below 1 the launch leaves slots empty
                occ["waves"] = rec["programs"] / (occ["blocks_per_sm"] * SM_LIMITS[capability]["sms"])
            rec.update(occ or {})
        except Exception as exc:  # the compiler's own message is the finding
            rec.update(_failed(rec["kernel"], exc))
        rec["seconds"] = round(time.perf_counter() - start, 3)
        builds.append(rec)

    # the visible GPU's own architecture needs no stand-in driver: Triton's warm-up path compiles for it as is
    swap = not (torch.cuda.is_available() and torch.cuda.get_device_capability() == divmod(capability, 10))
    previous = getattr(driver, "_active", None)
    if swap:
        driver.set_active(_TargetOnly(capability))
    JITFunction.run, Autotuner.run = compile_instead, compile_configs
    try:
        yield builds
    finally:
        JITFunction.run, Autotuner.run = run, tune
        if swap:
            driver._active = previous


def load_for_compile(path: Path, name: str):
    """Import an impl with the interpreter off, so that its kernels are JITFunctions and its launch options
    (num_warps, num_stages) are the GPU ones."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        return load_module(path, name)
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


def _inputs(req, binding: dict, dtype: torch.dtype, grad_names) -> list[torch.Tensor]:
    # values are never read (nothing runs): empty buffers of the right shape, dtype and alignment
    out = []
    for s in req.inputs:
        shape = req.input_shape(s, binding)
        if s.index:
            out.append(torch.zeros(shape, dtype=getattr(torch, s.dtypes[0])))
        else:
            out.append(torch.empty(shape, dtype=dtype).requires_grad_(s.name in grad_names))
    return out


def _failed(what: str, exc: Exception) -> dict:
    # Triton's CompilationError is "at L:C:", the source around it, then the cause: keep the first and last
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = " ".join(lines) if len(lines) <= 2 else f"{lines[0]} {lines[-1]}"
    return {"kernel": what, "error": f"{type(exc).__name__}: {text}"[:600]}


def compile_calls(req, impl, binding: dict, dtype: torch.dtype, grad_names, capability: int) -> list[dict]:
    """Every kernel the op's forward and backward launch at `binding`, compiled for sm_<capability>: one record
    per launch, in launch order."""
    op = getattr(impl, req.name)
    ins = _inputs(req, binding, dtype, grad_names)
    records = []
    if hasattr(impl, "_num_sms"):  # column sums size their grid by the device's SMs: the target's, not this host's
        impl._num_sms = lambda device: SM_LIMITS.get(capability, SM_LIMITS[90])["sms"]
    with compile_only(capability) as builds:
        try:
            outs = op(*ins, **req.attr_defaults)
        except Exception as exc:  # host code around the launches failed: there is no output to go backward from
            builds.append(_failed("(forward host code)", exc))
            outs = None
        records += [{"pass": "forward", **r} for r in builds]
        diff = [o for o in (outs if isinstance(outs, tuple) else (outs,)) if o is not None and o.requires_grad]
        if grad_names and diff:
            start = len(builds)
            try:
                wrt = [t for t in ins if t.requires_grad]
                torch.autograd.grad(diff, wrt, [torch.zeros_like(o) for o in diff], allow_unused=True)
            except Exception as exc:
                builds.append(_failed("(backward host code)", exc))
            records += [{"pass": "backward", **r} for r in builds[start:]]
    return records


def compile_op(req, arch: str = "sm_90", *, impl_path: Path | None = None, bindings=None, dtypes=None) -> dict:
    """Compile an operator's kernels for `arch` at each binding and dtype (default: its P0 shapes, first dtype).
    Without `impl_path` the deterministic engine's impl is generated from the request."""
    from opforge.codegen.trace import trace_request
    from opforge.verify.tolerance import parse_dtype

    capability = parse_arch(arch)
    traced = trace_request(req)
    grad_names = list(traced.grad_inputs) if req.backward else []
    with tempfile.TemporaryDirectory() as tmp:
        if impl_path is None:
            from opforge.codegen.build import generate_impl, plan_request

            impl_path = Path(tmp) / f"{req.name}_impl.py"
            impl_path.write_text(generate_impl(req, plan_request(req, traced)))
        impl = load_for_compile(impl_path, f"opforge_aot_{req.name}_{capability}")
        builds = []
        for binding in bindings or req.p0:
            for dt in dtypes or req.dtypes[:1]:
                for rec in compile_calls(req, impl, binding, parse_dtype(dt), grad_names, capability):
                    builds.append({"binding": binding, "dtype": dt, **rec})
    return {"op": req.name, "arch": arch, "builds": builds, "failed": sum("error" in b for b in builds)}


def toolchain() -> dict:
    """Versions, and why nothing can be compiled here (`unavailable`), if so: Triton without its NVIDIA backend."""
    try:
        import triton
        import triton.backends.nvidia  # noqa: F401
    except ImportError as exc:
        return {"torch": torch.__version__, "triton": None, "unavailable": f"no Triton NVIDIA backend ({exc})"}
    return {"torch": torch.__version__, "triton": triton.__version__, "unavailable": None,
            "register_counts": "cuobjdump" if _cuobjdump() else None}


def shape_label(binding: dict) -> str:
    return "x".join(str(v) for v in binding.values())


FIGURE_COLUMNS = N_("warps | regs | spill B | smem B | 128-bit ld, st | tensor cores | occupancy | programs | waves")


def figure_cells(b: dict) -> str:
    """A compiled kernel's figures as Markdown cells, in FIGURE_COLUMNS order."""
    programs = b["programs"] if b.get("programs") is not None else "—"
    occ = f"{b['occupancy']:.0%}" if "occupancy" in b else "—"
    waves = f"{b['waves']:.2f}" if b.get("waves") is not None else "—"
    vec = f"{b['loads_128']}/{b['loads']}, {b['stores_128']}/{b['stores']}" if "loads" in b else "—"
    tc = next((f"{k} ×{b[k]}" for k in ("wgmma", "mma") if b.get(k)), "—")
    return (f"{b['num_warps']} | {b.get('registers', '—')} | {b.get('spill_bytes', '—')} | {b['shared_bytes']} | "
            f"{vec} | {tc} | {occ} | {programs} | {waves}")


def to_markdown(report: dict) -> str:
    """One row per compiled kernel; the notes under the table say what a figure means and what to look at."""
    tc = report["toolchain"]
    if tc["unavailable"]:
        return (_("# Kernels compiled for {arch}").format(arch=report["arch"]) + "\n\n"
                + _("Not compiled: {reason}.").format(reason=tc["unavailable"]) + "\n")
    lines = [_("# Kernels compiled for {arch} (not run)").format(arch=report["arch"]), "",
             _("torch {torch}, Triton {triton}; {date}. Each kernel was specialised by Triton's binder for the shape "
               "shown and compiled to a cubin with Triton's ptxas. No kernel ran: the figures are the "
               "compiler's.").format(torch=tc["torch"], triton=tc["triton"], date=report["date"]), "",
             _("| op | shape | dtype | pass | kernel | constexprs | stages | {figure_columns} | status |").format(
                 figure_columns=_(FIGURE_COLUMNS)),
             "|" + "---|" * 17]
    notes = []
    for op in report["ops"]:
        for b in op["builds"]:
            short = b["kernel"].removeprefix(f"_{op['op']}_").removesuffix("_kernel")
            head = f"| {op['op']} | {shape_label(b['binding'])} | {b['dtype']} | {b['pass']} | {short} |"
            if "error" in b:
                lines.append(head + " — |" * 11 + " " + _("**failed**") + " |")
                notes.append(f"- **{op['op']} {short}** ({shape_label(b['binding'])}): {b['error']}")
                continue
            cx = ", ".join(f"{k}={v}" for k, v in b["constexprs"].items())
            status = _("spills") if b.get("spill_bytes") else _("ok")
            lines.append(f"{head} {cx} | {b['num_stages']} | {figure_cells(b)} | {status} |")
    lines += ["", _("regs: registers per thread; spill B: bytes per thread spilled to local memory (a memory-bound "
                    "kernel that spills pays for it in bandwidth); smem B: shared memory per program; 128-bit ld, st: "
                    "global load and store instructions in the PTX that move 128 bits, of all; tensor cores: the "
                    "matrix instructions in the PTX (wgmma on sm_90, mma.sync before); occupancy: resident warps per "
                    "SM over the SM's 64 slots, as registers, warps and shared memory allow (theoretical); waves: "
                    "programs over the resident slots of the whole device ({sms} SMs assumed); below 1 the launch "
                    "leaves resident slots empty, and with fewer programs than SMs whole SMs idle.").format(
                        sms=SM_LIMITS.get(parse_arch(report["arch"]), {}).get("sms", "?")), ""]
    if notes:
        lines += [_("## Compile failures"), ""] + notes + [""]
    return "\n".join(lines)
