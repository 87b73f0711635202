"""The device-generic module suite: each ModuleInfo of torch's module_db, on the device under triage, against
the CPU.

Upstream's test_modules.py checks a device against the CPU in `TestModule.test_cpu_gpu_parity` (forward and
backward, parameters' gradients included) and strides in `test_non_contiguous_tensors`; these are the same two
checks over the pieces the wheel ships (module_db, `@modules`, `instantiate_device_type_tests`), under the same
names, so that each ModuleInfo's own skips apply. A module is built once on the CPU from a fixed seed and a copy
moved to the device, so both hold the same parameters and a device needs no random-number kernels.

The run configures it through the environment (the triage plugin has imported the backend by then):
OPFORGE_TRIAGE_DEVICE the device's name, OPFORGE_TRIAGE_OPS a comma list of module names (`nn.Linear` or
`nn_Linear`; "" or "all" for every one), OPFORGE_TRIAGE_DTYPES an optional comma list.
"""
import copy
import os

import pytest
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_modules import module_db, modules
from torch.testing._internal.common_utils import TestCase, freeze_rng_state
from torch.utils._pytree import tree_map

from opforge.skills.test_triage.suites.layout import strided as _strided

DEVICE = os.environ.get("OPFORGE_TRIAGE_DEVICE", "cpu")
MAX_SAMPLES = 4  # a module's first inputs: the later ones vary constructor arguments the first already cover


def selected():
    wanted = os.environ.get("OPFORGE_TRIAGE_OPS", "")
    if wanted in ("", "all"):
        return list(module_db)
    names = set(wanted.split(","))
    return [m for m in module_db if m.name in names or m.formatted_name in names]


MODULES = selected()
DTYPES = [getattr(torch, d) for d in os.environ.get("OPFORGE_TRIAGE_DTYPES", "").split(",") if d] or None
if not MODULES:
    pytest.skip("no ModuleInfo selected", allow_module_level=True)


def _moved(device, x, strided=False):
    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        return _strided(device, t) if strided else t.detach().to(device).requires_grad_(t.requires_grad)
    return tree_map(move, x)


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return []


def _cpu(ts):
    return [t.cpu() for t in ts]


class TestModule(TestCase):
    def _parity(self, device, dtype, module_info, training, strided):
        inputs = module_info.module_inputs_func(module_info, device="cpu", dtype=dtype, requires_grad=True,
                                                training=training)
        for sample in inputs[:MAX_SAMPLES]:
            if sample.forward_input is None:
                continue
            c_args, c_kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
            with freeze_rng_state():
                torch.manual_seed(0)
                cpu_module = module_info.module_cls(*c_args, **c_kwargs).to(dtype)
            cpu_module.train(training)
            dev_module = copy.deepcopy(cpu_module).to(device)
            args, kwargs = sample.forward_input.args, sample.forward_input.kwargs
            torch.manual_seed(0)  # a module that draws (dropout) draws alike on both, where the device's
            expected = _tensors(cpu_module(*args, **kwargs))  # generator follows torch's seed
            d_args, d_kwargs = _moved(device, (args, kwargs), strided)
            torch.manual_seed(0)
            actual = _tensors(dev_module(*d_args, **d_kwargs))
            self.assertEqual(_cpu(actual), expected, exact_device=False)

            # Backward from the first floating result: the inputs' and the parameters' gradients.
            if not expected or not expected[0].requires_grad:
                continue
            grad = torch.randn_like(expected[0])
            cpu_leaves = [t for t in _tensors((args, kwargs)) if t.requires_grad] + list(cpu_module.parameters())
            dev_leaves = [t for t in _tensors((d_args, d_kwargs)) if t.requires_grad] + list(dev_module.parameters())
            want = torch.autograd.grad(expected[0], cpu_leaves, grad, allow_unused=True)
            got = torch.autograd.grad(actual[0], dev_leaves, grad.to(device), allow_unused=True)
            self.assertEqual([None if g is None else g.cpu() for g in got], list(want), exact_device=False)

    @modules(MODULES, allowed_dtypes=DTYPES)
    def test_cpu_gpu_parity(self, device, dtype, module_info, training):
        self._parity(device, dtype, module_info, training, strided=False)

    @modules(MODULES, allowed_dtypes=DTYPES)
    def test_non_contiguous_tensors(self, device, dtype, module_info, training):
        self._parity(device, dtype, module_info, training, strided=True)


ONLY_FOR = ("cpu", "privateuse1" if DEVICE != "cpu" else "cpu")
instantiate_device_type_tests(TestModule, globals(), only_for=ONLY_FOR)
