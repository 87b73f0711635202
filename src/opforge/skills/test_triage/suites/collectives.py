"""The device-generic collectives suite: torch.distributed's collectives on the device under triage, each test
in WORLD processes (MultiProcessTestCase, as upstream's c10d tests run), every rank's result checked against
what the ranks' inputs make on the CPU.

The group is `init_process_group("cpu:gloo,DEVICE:BACKEND")`, BACKEND being the one the device registered
(`torch.distributed.Backend.register_backend(..., devices=[DEVICE])`); on the CPU alone it is gloo, which makes
the CPU twin of each test. The environment configures it as it does the ops suite (OPFORGE_TRIAGE_DEVICE,
OPFORGE_TRIAGE_IMPORT, OPFORGE_TRIAGE_DTYPES, and OPFORGE_TRIAGE_OPS naming collectives: all_reduce_max,
broadcast); each rank's process imports the backend itself.
"""
import importlib
import os

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

for _name in filter(None, os.environ.get("OPFORGE_TRIAGE_IMPORT", "").split(",")):
    importlib.import_module(_name)

DEVICE = os.environ.get("OPFORGE_TRIAGE_DEVICE", "cpu")
WORLD = 2
DTYPES = [getattr(torch, d) for d in os.environ.get("OPFORGE_TRIAGE_DTYPES", "").split(",") if d] or \
    [torch.float32, torch.int32]
REDUCTIONS = {  # name: (the op, what it makes of the ranks' tensors, in their dtype)
    "sum": (dist.ReduceOp.SUM, lambda xs: torch.stack(xs).sum(0, dtype=xs[0].dtype)),
    "product": (dist.ReduceOp.PRODUCT, lambda xs: torch.stack(xs).prod(0, dtype=xs[0].dtype)),
    "max": (dist.ReduceOp.MAX, lambda xs: torch.stack(xs).amax(0)),
    "min": (dist.ReduceOp.MIN, lambda xs: torch.stack(xs).amin(0)),
}


def rank_input(rank: int, dtype: torch.dtype) -> torch.Tensor:
    """A rank's tensor: different on every rank, and ordered differently, so that max and min differ from the
    last and first rank's."""
    base = torch.tensor([[1, 5, 2], [6, 3, 4]]) + 2 * rank
    return (base if rank % 2 == 0 else base.flip(-1)).to(dtype)


class TestCollectives(MultiProcessTestCase):
    opforge_device = DEVICE

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @property
    def world_size(self):
        return WORLD

    def init_group(self):
        backend = "gloo" if DEVICE == "cpu" else f"cpu:gloo,{DEVICE}:{dist.get_default_backend_for_device(DEVICE)}"
        dist.init_process_group(backend, store=dist.FileStore(self.file_name, WORLD), rank=self.rank,
                                world_size=WORLD)

    def on_device(self, dtype):
        return rank_input(self.rank, dtype).to(DEVICE)

    def check(self, actual, expected):
        self.assertEqual(actual.device.type, DEVICE)
        torch.testing.assert_close(actual.cpu(), expected)


def _test(op, dtype, body):
    def test(self):
        self.init_group()
        body(self, dtype)
    test.opforge_op, test.opforge_dtype = op, str(dtype).removeprefix("torch.")
    return test


def _all_reduce(name):
    reduce_op, expect = REDUCTIONS[name]

    def body(self, dtype):
        t = self.on_device(dtype)
        dist.all_reduce(t, op=reduce_op)
        self.check(t, expect([rank_input(r, dtype) for r in range(WORLD)]))
    return body


def _reduce(self, dtype):
    t = self.on_device(dtype)
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
    if self.rank == 0:
        self.check(t, REDUCTIONS["sum"][1]([rank_input(r, dtype) for r in range(WORLD)]))


def _broadcast(self, dtype):
    t = self.on_device(dtype)
    dist.broadcast(t, src=WORLD - 1)
    self.check(t, rank_input(WORLD - 1, dtype))


def _all_gather(self, dtype):
    outs = [torch.zeros(2, 3, dtype=dtype).to(DEVICE) for _ in range(WORLD)]
    dist.all_gather(outs, self.on_device(dtype))
    for r, out in enumerate(outs):
        self.check(out, rank_input(r, dtype))


def _barrier(self, dtype):
    dist.barrier()


COLLECTIVES = {**{f"all_reduce_{name}": _all_reduce(name) for name in REDUCTIONS},
               "reduce": _reduce, "broadcast": _broadcast, "all_gather": _all_gather}
_WANTED = set(filter(None, os.environ.get("OPFORGE_TRIAGE_OPS", "").split(","))) - {"all"}  # none: every one
for _dtype in DTYPES:
    _dt = str(_dtype).removeprefix("torch.")
    for _op, _body in COLLECTIVES.items():
        if not _WANTED or _op in _WANTED:
            setattr(TestCollectives, f"test_{_op}_{_dt}", _test(_op, _dtype, _body))
if not _WANTED or "barrier" in _WANTED:
    TestCollectives.test_barrier = _test("barrier", DTYPES[0], _barrier)
