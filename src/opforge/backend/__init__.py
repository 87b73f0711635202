"""The reference out-of-tree backend: a PrivateUse1 device named opdev whose memory is host memory.

`native/` holds its C++ (runtime, operator kernels, a vendor kernel library) and the torchgen backend yaml
that registers its operators; `build` compiles a source tree, `device` loads it into torch, `info` says
what it implements. Nothing here imports a skill.
"""

DEVICE = "opdev"
IMPORT = "opforge.backend.device"
