"""Tests of $op: Level 0 (every SPEC dtype at every p0 shape) and Level 1 (the full matrix of DESIGN.md).

Run with plain `pytest` in this folder. Without a GPU the kernels run in Triton's interpreter on the CPU.
The impl and the golden are imported separately; tolerances and exact outputs come from SPEC.md.
Seeds are drawn when a case runs and printed on failure, so a failure can be replayed.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from opforge.verify.cases import check_case

HERE = Path(__file__).resolve().parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


impl = _load("${op}_impl")
golden = _load("${op}_golden")

# From SPEC.md (the gate G5-TEST-COVERAGE checks that these match it)
DTYPES = $dtypes
P0_SHAPES = $p0
TOLERANCE = $tolerance
EXACT_OUTPUTS = $exact
REDUCED_OUTPUTS = $reduced
SPEC = {"op_name": "$op", "tolerance": TOLERANCE, "exact_outputs": EXACT_OUTPUTS,
        "reduced_outputs": REDUCED_OUTPUTS, "backward": $backward}
LEVEL0 = $level0
LEVEL1 = $level1


def _assert_passed(result):
    failed = [o for o in result["outputs"] if not o["passed"]]
    assert not failed, f"case {result['case']} seed {result['seed']}: " + "; ".join(
        f"{o['name']}: max_abs={o.get('max_abs')} mismatches={o.get('mismatches')} worst={o.get('worst', [])[:2]}"
        for o in failed)


@pytest.mark.parametrize("case", LEVEL0, ids=[c["id"] for c in LEVEL0])
def test_level0(case):
    _assert_passed(check_case(impl, golden, case, SPEC))


@pytest.mark.parametrize("case", LEVEL1, ids=[c["id"] for c in LEVEL1])
def test_level1(case):
    _assert_passed(check_case(impl, golden, case, SPEC))


def _inputs(seed, dtype=torch.float32, binding=None):
    binding = binding or {s: 33 + 4 * i for i, s in enumerate($symbols)}
    return golden.make_inputs(binding, dtype, seed)


def test_different_inputs_give_different_outputs():
    a = impl.$op(*_inputs(1))
    b = impl.$op(*_inputs(2))
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    assert all(not torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.skipif(not $backward, reason="no backward")
def test_deterministic_backward_is_bit_reproducible():
    def grads():
        ins = [t.requires_grad_(n in golden.GRAD_INPUTS) for t, n in zip(_inputs(3), golden.INPUT_NAMES)]
        outs = impl.$op(*ins, deterministic=True)
        outs = outs if isinstance(outs, tuple) else (outs,)
        g = [torch.ones_like(o) for o in outs]
        return torch.autograd.grad(outs, [t for t in ins if t.requires_grad], g)
    assert all(torch.equal(x, y) for x, y in zip(grads(), grads()))


def test_opcheck():
    ins = [t.requires_grad_(n in golden.GRAD_INPUTS) for t, n in zip(_inputs(4), golden.INPUT_NAMES)]
    attrs = [float(golden.ATTRIBUTES[a]) for a in $runtime_attrs]
    torch.library.opcheck(impl._${op}_op, (*ins, *attrs, False))


def test_torch_compile_fullgraph():
    ins = [t.requires_grad_(n in golden.GRAD_INPUTS) for t, n in zip(_inputs(5), golden.INPUT_NAMES)]

    def f(*xs):
        outs = impl.$op(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum(o.float().sum() for o in outs)

    compiled = torch.compile(f, fullgraph=True)
    ref, got = f(*ins), compiled(*ins)
    torch.testing.assert_close(got, ref)
    if $backward:
        wrt = [t for t in ins if t.requires_grad]
        for a, b in zip(torch.autograd.grad(ref, wrt), torch.autograd.grad(got, wrt)):
            torch.testing.assert_close(b, a)
