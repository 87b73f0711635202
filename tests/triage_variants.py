"""A variant of the reference backend with defects planted in its sources, one an operator, for test-triage's
tests and benchmark: each edit is a real change to the C++ or Python a backend team would make by mistake.

  neg   missing kernel      neg dropped from the backend yaml (and its kernel file)
  abs   wrong for a dtype   float16 results negated after the vendor call
  sub   non-contiguous      a non-contiguous `self` read as if it were contiguous
  sgn   wrong Meta shape    a Meta kernel registered from the backend's Python that drops the last dimension
  add   flaky               the run's first add negates its result, later ones are right: the test that made it
                            fails and passes when rerun (the run is the processes that share OPDEV_FLAKY_MARK, a
                            file the first add creates; without it add is right). A random one-in-twenty failure
                            also failed the reruns of tests that add many times. add, as no other planted op's
                            tests reach it (a flaky mul reached abs's gradient, sgn(x) * grad)

and two in its process group (python/process_group.py), for the collectives suite:

  all_reduce_max  wrong reduction  MAX reduced as MIN
  broadcast       hangs            each rank first waits for a store key that nobody sets
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from opforge.backend import build

PLANTED = {
    "neg": ("missing_dispatch", "missing-kernel"),
    "abs": ("behaviour_mismatch", "wrong-values"),
    "sub": ("behaviour_mismatch", "wrong-values"),
    "sgn": ("behaviour_mismatch", "wrong-metadata"),
    "add": ("behaviour_mismatch", "wrong-values"),
}

PLANTED_COLLECTIVES = {
    "all_reduce_max": ("behaviour_mismatch", "wrong-values"),
    "broadcast": ("behaviour_mismatch", "hang"),
}

_CONTIGUOUS_SELF = """  // a non-contiguous self read as if it were contiguous
  std::vector<int64_t> dense(self.dim(), 1);
  for (int64_t i = self.dim() - 2; i >= 0; --i) dense[i] = dense[i + 1] * std::max<int64_t>(self.size(i + 1), 1);
  at::Tensor flat = self.is_contiguous() ? self : self.as_strided(self.sizes(), dense);
  EXEC_OPDEV_CMD(vkSub, flat, other, alpha, out);"""

_FLAKY = """  EXEC_OPDEV_CMD(vkAdd, self, other, alpha, out);
  const char* mark = std::getenv("OPDEV_FLAKY_MARK");
  int fd = mark ? ::open(mark, O_CREAT | O_EXCL | O_WRONLY, 0644) : -1;  // created once, by one process
  if (fd >= 0) {
    ::close(fd);
    EXEC_OPDEV_CMD(vkNeg, out, out);
  }"""

_WRONG_META = '''"""A Meta kernel for aten::sgn that drops the last dimension."""
import torch

_lib = torch.library.Library("aten", "IMPL")
_lib.impl("sgn", lambda self: self.new_empty(self.shape[:-1] if self.dim() else self.shape), "Meta")
'''


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def planted_backend(dest: Path) -> Path:
    """A copy of the reference backend's sources at `dest` with the five defects planted."""
    shutil.copytree(build.NATIVE, dest)
    yaml_path = dest / build.BACKEND_YAML
    yaml_path.write_text(re.sub(r"^- neg\n", "", yaml_path.read_text(), flags=re.M))
    (dest / "ops" / "NegKernelOpdev.cpp").unlink()
    _edit(dest / "ops" / "AbsKernelOpdev.cpp", "  EXEC_OPDEV_CMD(vkAbs, self, out);\n",
          "  EXEC_OPDEV_CMD(vkAbs, self, out);\n"
          "  if (self.scalar_type() == at::kHalf) EXEC_OPDEV_CMD(vkNeg, out, out);\n")
    _edit(dest / "ops" / "SubKernelOpdev.cpp", "  EXEC_OPDEV_CMD(vkSub, self, other, alpha, out);", _CONTIGUOUS_SELF)
    _edit(dest / "ops" / "AddKernelOpdev.cpp", "  EXEC_OPDEV_CMD(vkAdd, self, other, alpha, out);", _FLAKY)
    _edit(dest / "ops" / "AddKernelOpdev.cpp", '#include "ops/OpApi.h"',
          '#include "ops/OpApi.h"\n\n#include <fcntl.h>\n#include <unistd.h>\n\n#include <cstdlib>')
    (dest / "python" / "wrong_meta.py").write_text(_WRONG_META)
    pg = dest / "python" / "process_group.py"
    _edit(pg, "    def allreduce(self, tensors, opts):\n",
          "    def allreduce(self, tensors, opts):\n"
          "        if opts.reduceOp == dist.ReduceOp.MAX:\n"
          "            opts.reduceOp = dist.ReduceOp.MIN\n")
    _edit(pg, "        super().__init__(rank, size)\n",
          "        super().__init__(rank, size)\n        self._store = store\n")
    _edit(pg, "    def broadcast(self, tensors, opts):\n",
          "    def broadcast(self, tensors, opts):\n"
          "        self._store.wait([f\"{NAME}/broadcast-ready\"])\n")
    return dest
