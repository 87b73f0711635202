"""opdev's collective communication: a c10d backend named "opdevccl", registered for the opdev device through
`torch.distributed.Backend.register_backend`, the way an accelerator registers its own (torch_npu's HCCL).

Its device memory is host memory, so each collective stages the opdev tensors on the host, runs gloo's on a
process group of its own (created over the same store, under its own prefix) and copies the results back when
the work is waited on. `init_process_group("cpu:gloo,opdev:opdevccl")` gives a group that takes both devices.
"""
import datetime

import torch
import torch.distributed as dist

NAME = "opdevccl"


class _Staged(dist._Work):
    """gloo's work on the host copies; waiting for it copies the results back to the device."""

    def __init__(self, work, copy_back):
        super().__init__()
        self._work, self._copy_back, self._done = work, copy_back, False

    def wait(self, timeout=datetime.timedelta(0)):
        if not self._done:
            self._work.wait()
            self._copy_back()
            self._done = True
        return True

    def is_completed(self):
        return self._done

    def get_future(self):
        self.wait()
        future = torch.futures.Future()
        future.set_result(None)
        return future


def _back(pairs):
    def copy():
        for device_tensor, host in pairs:
            device_tensor.copy_(host)
    return copy


class OpdevProcessGroup(dist.ProcessGroup):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._host = dist.ProcessGroupGloo(dist.PrefixStore(f"{NAME}/", store), rank, size, timeout)

    def getBackendName(self):
        return NAME

    def _in_place(self, collective, tensors, opts):
        """A collective that writes its result into its own tensors: run on host copies, copied back."""
        host = [t.cpu() for t in tensors]
        return _Staged(collective(host, opts), _back(zip(tensors, host)))

    def allreduce(self, tensors, opts):
        return self._in_place(self._host.allreduce, tensors, opts)

    def broadcast(self, tensors, opts):
        return self._in_place(self._host.broadcast, tensors, opts)

    def reduce(self, tensors, opts):
        return self._in_place(self._host.reduce, tensors, opts)

    def allgather(self, output_lists, inputs, opts):
        host_out = [[t.cpu() for t in outs] for outs in output_lists]
        work = self._host.allgather(host_out, [t.cpu() for t in inputs], opts)
        return _Staged(work, _back([(d, h) for ds, hs in zip(output_lists, host_out) for d, h in zip(ds, hs)]))

    def barrier(self, opts):
        return _Staged(self._host.barrier(opts), lambda: None)


def _create(store, rank, size, timeout):
    return OpdevProcessGroup(store, rank, size, timeout)


if NAME not in dist.Backend.backend_list:
    dist.Backend.register_backend(NAME, _create, devices=["opdev"])
