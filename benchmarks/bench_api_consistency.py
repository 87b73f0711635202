"""Cost of divergence localisation: a program run plain, under the recorder (metadata only, as the first
pass runs it), recording every operator's values (the second pass), and replaying each operator in float64;
then the end-to-end diagnosis of the consistency examples. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_api_consistency.py
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from opforge.skills.api_consistency.case import load_case  # noqa: E402
from opforge.skills.api_consistency.targets import parse_target  # noqa: E402
from opforge.skills.api_consistency.triage import diagnose  # noqa: E402
from opforge.verify import divergence as dv  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "consistency"


def block(x, w1, w2, layers=4):
    for _ in range(layers):
        h = F.layer_norm(x, x.shape[-1:])
        a = F.scaled_dot_product_attention(h, h, h)
        x = x + F.gelu(a @ w1) @ w2
    return x


def timed(fn, reps=5):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 128, 256)
    w1, w2 = torch.randn(256, 512) / 16, torch.randn(512, 256) / 22
    trace = dv.record(block, x, w1, w2)
    n = len(trace.records)
    plain = timed(lambda: block(x, w1, w2))
    meta = timed(lambda: dv.record(block, x, w1, w2, values=False))
    vals = timed(lambda: dv.record(block, x, w1, w2))
    replay = timed(lambda: dv.local_check(trace, stop_at_first=False), reps=3)
    print(f"program: 4 pre-norm attention+MLP layers, float32, {n} ATen operators, "
          f"{torch.get_num_threads()} threads")
    print(f"  plain run                 {plain * 1e3:8.1f} ms")
    print(f"  recorded, metadata only   {meta * 1e3:8.1f} ms  ({(meta - plain) / n * 1e6:6.1f} us per operator)")
    print(f"  recorded with values      {vals * 1e3:8.1f} ms  ({(vals - plain) / n * 1e6:6.1f} us per operator)")
    print(f"  float64 replay of all ops {replay * 1e3:8.1f} ms  ({replay / n * 1e6:6.1f} us per operator)")
    print("end to end (seconds, exit, rule, operator):")
    runs = [("rope_fp16_overflow.py", "half"), ("rope_fp32_positions.py", "half"),
            ("scaled_softmax_promotion.py", "half"), ("row_sum.py", "custom:kernels:row_sum_shuffled"),
            ("scale_shift.py", "custom:kernels:scale_shift_triton_tail_bug"), ("scale_shift.py", "compile")]
    for case_file, target in runs:
        case = load_case(str(EXAMPLES / case_file))
        tgt = parse_target(target, case.path.parent)
        t0 = time.perf_counter()
        dg = diagnose(case, tgt)
        secs = time.perf_counter() - t0
        op = (dg.operator or {}).get("name", "-")
        print(f"  {case_file:30s} {target:45s} {secs:6.2f}  exit {dg.exit}  {dg.rule}  {op}")


if __name__ == "__main__":
    main()
