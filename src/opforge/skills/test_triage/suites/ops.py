"""The device-generic operator suite: each OpInfo of torch's op_db, on the device under triage, against the CPU.

The checks are those upstream's test_ops.py makes of every backend, written over the same public pieces the
wheel ships (op_db, `@ops`, `instantiate_device_type_tests`): the samples' results (contiguous and not), the
out= variant, fake tensors' metadata, and gradients. Samples are drawn on the CPU and moved, so a device needs
no random-number kernels to be tested.

The run configures it through the environment (the triage plugin has imported the backend by then):
OPFORGE_TRIAGE_DEVICE the device's name, OPFORGE_TRIAGE_OPS a comma list of OpInfo names ("" for those whose
ATen op the device registers, "all" for every one), OPFORGE_TRIAGE_DTYPES an optional comma list.
"""
import os

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase

from opforge.skills.test_triage.suites.layout import strided as _strided

DEVICE = os.environ.get("OPFORGE_TRIAGE_DEVICE", "cpu")
MAX_SAMPLES = 8  # the first samples of each OpInfo: its edge cases come first, its large ones last


def registered_ops(device: str) -> set[str]:
    """The ATen op names with a kernel for the device's dispatch key."""
    key = "PrivateUse1" if device == torch._C._get_privateuse1_backend_name() else device.upper()
    regs = torch._C._dispatch_get_registrations_for_dispatch_key(key)
    return {r.split("::")[1].split(".")[0] for r in regs if r.startswith("aten::")}


def selected():
    wanted = os.environ.get("OPFORGE_TRIAGE_OPS", "")
    if wanted == "all":
        return list(op_db)
    if wanted:
        names = set(wanted.split(","))
        return [o for o in op_db if o.name in names or o.formatted_name in names]
    names = registered_ops(DEVICE)
    return [o for o in op_db if o.name in names or o.aten_name in names]


def dtypes():
    wanted = os.environ.get("OPFORGE_TRIAGE_DTYPES", "")
    return None if not wanted else [getattr(torch, d) for d in wanted.split(",")]


OPS = selected()
DTYPES = dtypes()
if not OPS:
    pytest.skip("no OpInfo selected", allow_module_level=True)


def _samples(op, dtype, requires_grad=False):
    for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=requires_grad)):
        if i == MAX_SAMPLES:
            return
        yield s


def _to(device, sample):
    return sample.transform(lambda t: t.detach().to(device).requires_grad_(t.requires_grad)
                            if isinstance(t, torch.Tensor) else t)


def _cpu(x):
    """A result brought back to the CPU (a tuple of results, each)."""
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (tuple, list)):
        return type(x)(_cpu(y) for y in x)
    return x


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _tensors(y)]
    return []


def _grad_inputs(sample):
    return [t for t in _tensors([sample.input, *sample.args, *sample.kwargs.values()]) if t.requires_grad]


# The classes and tests carry upstream's names (test_ops.py's TestCommon and TestFakeTensor), so that each OpInfo's
# own skips and expected failures, declared against those names, apply here as they do upstream.
class TestCommon(TestCase):
    @ops(OPS, allowed_dtypes=DTYPES)
    def test_compare_cpu(self, device, dtype, op):
        for s in _samples(op, dtype):
            expected = op(s.input, *s.args, **s.kwargs)
            d = _to(device, s)
            actual = op(d.input, *d.args, **d.kwargs)
            self.assertEqual(_cpu(actual), expected, exact_device=False)

    @ops(OPS, allowed_dtypes=DTYPES)
    def test_noncontiguous_samples(self, device, dtype, op):
        for s in _samples(op, dtype):
            expected = op(s.input, *s.args, **s.kwargs)
            d = s.transform(lambda t: _strided(device, t) if isinstance(t, torch.Tensor) else t)
            actual = op(d.input, *d.args, **d.kwargs)
            self.assertEqual(_cpu(actual), expected, exact_device=False)

    @ops([o for o in OPS if o.supports_out], allowed_dtypes=DTYPES)
    def test_out(self, device, dtype, op):
        for s in _samples(op, dtype):
            expected = op(s.input, *s.args, **s.kwargs)
            if not isinstance(expected, torch.Tensor):
                continue  # out= of a tuple result takes a tuple: the single-tensor form is what most ops have
            d = _to(device, s)
            out = torch.empty(0, dtype=expected.dtype, device=device)
            returned = op(d.input, *d.args, out=out, **d.kwargs)
            self.assertIs(returned, out)
            self.assertEqual(out.cpu(), expected)

    @ops([o for o in OPS if o.supports_autograd], allowed_dtypes=DTYPES)
    def test_grad_compare_cpu(self, device, dtype, op):
        if dtype not in op.supported_backward_dtypes(torch.device(device).type):
            self.skipTest(f"{op.name} has no gradient for {dtype}")
        for s in _samples(op, dtype, requires_grad=True):
            inputs = _grad_inputs(s)
            expected = _tensors(op(s.input, *s.args, **s.kwargs))
            if not inputs or not expected or not expected[0].requires_grad:
                continue
            g = torch.randn_like(expected[0])
            want = torch.autograd.grad(expected[0], inputs, g, allow_unused=True)
            d = _to(device, s)
            actual = _tensors(op(d.input, *d.args, **d.kwargs))
            got = torch.autograd.grad(actual[0], _grad_inputs(d), g.to(device), allow_unused=True)
            self.assertEqual(_cpu(list(got)), list(want), exact_device=False)


class TestFakeTensor(TestCase):
    @ops(OPS, allowed_dtypes=DTYPES)
    def test_fake(self, device, dtype, op):
        for s in _samples(op, dtype):
            d = _to(device, s)
            actual = _tensors(op(d.input, *d.args, **d.kwargs))
            with FakeTensorMode() as mode:
                f = d.transform(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t)
                try:
                    fake = _tensors(op(f.input, *f.args, **f.kwargs))
                except DataDependentOutputException:
                    self.skipTest(f"{op.name}'s result depends on its inputs' values: fake tensors have none")
            for i, (f, a) in enumerate(zip(fake, actual, strict=True)):
                if (f.shape, f.dtype, f.device) != (a.shape, a.dtype, a.device):
                    raise AssertionError(f"result {i}: the fake tensor's {tuple(f.shape)} {f.dtype} on {f.device} "
                                         f"differs from the device's {tuple(a.shape)} {a.dtype} on {a.device}")


ONLY_FOR = ("cpu", "privateuse1" if DEVICE != "cpu" else "cpu")
instantiate_device_type_tests(TestCommon, globals(), only_for=ONLY_FOR)
instantiate_device_type_tests(TestFakeTensor, globals(), only_for=ONLY_FOR)
