"""Few long rows: the generated softmax and RMSNorm forward kernels with ROW_SPLIT = 1, 2, 4, 8 programs per
row, at 128 rows of 32000 columns (128 row blocks: under one wave of an H200's 132 SMs) and, for contrast, at
4096 rows. All splits of a shape are timed in one run (CUDA events, L2 flushed, outputs checked against
float64 torch), and each time is given as a ratio to ROW_SPLIT = 1. Needs a CUDA GPU; prints figures, asserts
nothing.

    .venv/bin/python benchmarks/bench_row_split.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from opforge.bench.harness import clock_for, measure
from opforge.codegen.build import generate_impl, plan_request
from opforge.request import load_request
from opforge.workspace import load_module

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SPLITS = (1, 2, 4, 8)
SHAPES = ((128, 32000), (4096, 32000))


def _impl(name: str, tmp: Path):
    req = load_request(EXAMPLES / name)
    path = tmp / f"{name}_split_bench_impl.py"
    path.write_text(generate_impl(req, plan_request(req)))
    return req, load_module(path, path.stem)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_row_split: needs a CUDA GPU (the interpreter's times are not figures)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("softmax", "rms_norm"):
            req, impl = _impl(name, Path(tmp))
            ref, op = req.load_reference(), getattr(impl, name)
            for n, v in SHAPES:
                def make(seed, n=n, v=v):
                    g = torch.Generator(device="cuda").manual_seed(seed)
                    ins = [torch.randn(n, v, device="cuda", generator=g, dtype=torch.bfloat16)]
                    if name == "rms_norm":
                        ins.append(torch.randn(v, device="cuda", generator=g, dtype=torch.bfloat16))
                    return ins

                def golden(ins):
                    return ref(*(t.double() for t in ins), **req.attr_defaults).to(ins[0].dtype)
                base = None
                for split in SPLITS:
                    impl.ROW_SPLIT = split
                    t = measure(lambda ins: op(*ins, **req.attr_defaults), make, clock=clock_for("cuda"),
                                reference=golden).median_ms
                    base = base or t
                    rows.append({"op": name, "rows": n, "cols": v, "row_split": split, "ms": t, "vs_1": base / t})
                    print(f"{name:9s} {n:5d}x{v} ROW_SPLIT={split}: {t:.4f} ms, {base / t:.2f}x of ROW_SPLIT=1")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
