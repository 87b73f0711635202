"""Path and content rules, held as data: which area a changed file belongs to, and which device-generic
integration point of PyTorch it touches.

Areas follow the spirit of PyTorch's own labeler and release-notes categories. Each area carries the impact a
change there has on an out-of-tree backend when nothing more specific is found; the first area in AREAS that
matches a path sets that level, every matching area becomes a label. Integration points are the machinery a
PrivateUse1 backend plugs into: a change there is High for a backend that relies on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from opforge.i18n import N_

NATIVE_FUNCTIONS = "aten/src/ATen/native/native_functions.yaml"
DERIVATIVES = "tools/autograd/derivatives.yaml"

LEVELS = ("None", "Low", "Medium", "High")
RANK = {lv: i for i, lv in enumerate(LEVELS)}

# (area, level when nothing more specific is found, globs). `**` spans directories, `*` stays in one.
AREAS: list[tuple[str, str, tuple[str, ...]]] = [
    ("operators", "None", (NATIVE_FUNCTIONS, "aten/src/ATen/native/tags.yaml")),
    ("autograd", "Medium", (DERIVATIVES, "tools/autograd/deprecated.yaml")),
    ("tests", "Low", ("test/**", "torch/testing/**", "**/test_*.py", "**/*_test.cpp")),
    ("docs", "None", ("docs/**", "**/*.md", "**/*.rst", "functorch/docs/**")),
    ("releng", "None", (".github/**", ".ci/**", ".circleci/**", "docker/**", ".devcontainer/**",
                        ".lintrunner.toml", ".flake8", ".clang-format", ".clang-tidy", "mypy*.ini",
                        "pyproject.toml", ".bazelrc", "*.bzl", "BUILD.bazel", "WORKSPACE", "tools/linter/**")),
    ("cuda", "None", ("aten/src/ATen/cuda/**", "aten/src/ATen/native/cuda/**", "aten/src/ATen/native/cudnn/**",
                      "aten/src/ATen/native/transformers/cuda/**", "aten/src/ATen/native/sparse/cuda/**",
                      "aten/src/ATen/native/quantized/cuda/**", "aten/src/ATen/native/nested/cuda/**",
                      "c10/cuda/**", "torch/cuda/**", "torch/csrc/cuda/**", "torch/backends/cuda/**",
                      "torch/backends/cudnn/**", "**/*.cu", "**/*.cuh", "torch/_inductor/codegen/cuda/**",
                      "torch/csrc/distributed/c10d/*NCCL*", "torch/csrc/distributed/c10d/cuda/**",
                      "torch/csrc/distributed/c10d/symm_mem/*CUDA*", "torch/csrc/distributed/c10d/symm_mem/*NVSHMEM*")),
    ("rocm", "None", ("aten/src/ATen/hip/**", "aten/src/ATen/native/hip/**", "aten/src/ATen/native/miopen/**",
                      "c10/hip/**", "torch/utils/hipify/**", "third_party/composable_kernel/**")),
    ("mps", "None", ("aten/src/ATen/mps/**", "aten/src/ATen/native/mps/**", "torch/mps/**", "torch/backends/mps/**",
                     "torch/csrc/mps/**", "**/*.mm", "**/*.metal", "torch/_inductor/codegen/mps*.py")),
    ("xpu", "None", ("aten/src/ATen/xpu/**", "aten/src/ATen/native/mkldnn/xpu/**", "c10/xpu/**", "torch/xpu/**",
                     "torch/csrc/xpu/**", "torch/_inductor/codegen/xpu/**", "third_party/xpu.txt")),
    ("mtia", "None", ("aten/src/ATen/mtia/**", "torch/mtia/**", "torch/csrc/mtia/**")),
    ("cpu", "None", ("aten/src/ATen/native/cpu/**", "aten/src/ATen/cpu/**", "aten/src/ATen/native/mkldnn/**",
                     "aten/src/ATen/native/quantized/cpu/**", "torch/_inductor/codegen/cpp*.py",
                     "torch/backends/mkldnn/**", "third_party/ideep/**", "third_party/sleef/**")),
    ("composability", "Medium", ("torch/_decomp/**", "torch/_refs/**", "torch/_prims/**", "torch/_prims_common/**",
                                 "torch/_meta_registrations.py", "torch/_subclasses/**", "torch/_library/**",
                                 "torch/library.py", "torch/_functorch/_aot_autograd/functional_utils.py",
                                 "aten/src/ATen/FunctionalTensorWrapper.*",
                                 "aten/src/ATen/FunctionalizeFallbackKernel.*",
                                 "torch/_higher_order_ops/**")),
    ("dynamo", "Low", ("torch/_dynamo/**", "test/dynamo/**")),
    ("inductor", "Low", ("torch/_inductor/**", "test/inductor/**")),
    ("distributed", "Low", ("torch/distributed/**", "torch/csrc/distributed/**", "test/distributed/**")),
    ("quantization", "Low", ("torch/ao/**", "aten/src/ATen/native/quantized/**", "torch/quantization/**",
                          "test/quantization/**")),
    ("export", "Low", ("torch/export/**", "torch/_export/**")),
    ("fx", "Low", ("torch/fx/**",)),
    ("onnx", "None", ("torch/onnx/**", "torch/csrc/onnx/**")),
    ("jit", "Low", ("torch/jit/**", "torch/csrc/jit/**")),
    ("autograd", "Low", ("torch/autograd/**", "torch/csrc/autograd/**", "tools/autograd/**")),
    ("codegen", "Low", ("torchgen/**",)),
    ("build", "Low", ("CMakeLists.txt", "**/CMakeLists.txt", "cmake/**", "setup.py", "requirements*.txt",
                      "third_party/**", "version.txt")),
    ("nn", "Low", ("torch/nn/**", "torch/csrc/api/**")),
    ("optim", "Low", ("torch/optim/**",)),
    ("sparse", "Low", ("aten/src/ATen/native/sparse/**", "torch/sparse/**")),
    ("nested", "Low", ("aten/src/ATen/native/nested/**", "torch/nested/**")),
    ("functorch", "Low", ("functorch/**", "torch/_functorch/**")),
    ("tools", "Low", ("tools/**",)),
    ("core", "Low", ("aten/**", "c10/**", "torch/**", "caffe2/**")),
]
# Broad areas: a label only when nothing more specific matched.
FALLBACK_AREAS = {"tools", "core"}

# (id, title, globs, what to do). Checked before AREAS; the first match names the point.
INTEGRATION_POINTS: list[tuple[str, str, tuple[str, ...], str]] = [
    ("dispatch_keys", N_("dispatch keys and device types"),
     ("c10/core/DispatchKey.*", "c10/core/DispatchKeySet.*", "c10/core/Backend.h", "c10/core/DeviceType.*",
      "c10/core/Device.h", "c10/core/Device.cpp", "aten/src/ATen/core/dispatch/**",
      "aten/src/ATen/core/boxing/**", "torchgen/model.py"),
     N_("Check that the backend's dispatch key, device type and backend-component bits still map as before; "
      "rebuild and rerun its registration tests.")),
    ("privateuse1_hooks", N_("PrivateUse1 and accelerator hooks"),
     ("aten/src/ATen/detail/PrivateUse1HooksInterface.*", "aten/src/ATen/detail/AcceleratorHooksInterface.*",
      "aten/src/ATen/DeviceAccelerator.*", "torch/csrc/DeviceAccelerator.*", "torch/accelerator/**",
      "torch/csrc/utils/device_lazy_init.*"),
     N_("Compare the hooks interface with the backend's hooks class: implement new virtual methods, follow "
      "renamed or removed ones.")),
    ("backend_registration", N_("backend registration and codegen of backend stubs"),
     ("torch/utils/backend_registration.py", "aten/src/ATen/native/DispatchStub.*", "torchgen/gen_backend_stubs.py",
      "torchgen/dest/register_dispatch_key.py", "torchgen/dest/native_functions.py"),
     N_("Re-run the backend's registration (rename_privateuse1_backend, generate_methods_for_privateuse1_backend, "
      "gen_backend_stubs) and its registration tests.")),
    ("device_guard", N_("device guards, streams and events"),
     ("c10/core/impl/DeviceGuardImplInterface.*", "c10/core/DeviceGuard.h", "c10/core/impl/InlineDeviceGuard.h",
      "c10/core/impl/InlineStreamGuard.h", "c10/core/impl/InlineEvent.h", "c10/core/impl/VirtualGuardImpl.h",
      "c10/core/StreamGuard.h", "c10/core/Stream.*", "c10/core/Event.h"),
     N_("Update the backend's DeviceGuardImpl: new pure virtual methods must be implemented, changed signatures "
      "followed.")),
    ("allocator", N_("allocators and storage"),
     ("c10/core/Allocator.*", "c10/core/CachingDeviceAllocator.*", "c10/core/StorageImpl.*",
      "c10/core/impl/COW*", "aten/src/ATen/EmptyTensor.*"),
     N_("Check the backend's allocator and empty/storage paths against the changed interface; run its memory tests.")),
    ("c10d", N_("c10d process groups and collectives"),
     ("torch/csrc/distributed/c10d/ProcessGroup.*", "torch/csrc/distributed/c10d/Backend.*",
      "torch/csrc/distributed/c10d/Work.*", "torch/csrc/distributed/c10d/Types.hpp",
      "torch/csrc/distributed/c10d/Ops.cpp", "torch/distributed/distributed_c10d.py"),
     N_("Update the backend's c10d ProcessGroup/Backend subclass (e.g. HCCL) for the changed collective interface.")),
    ("compile_device_interface", N_("Dynamo and Inductor device interfaces"),
     ("torch/_dynamo/device_interface.py", "torch/_inductor/codegen/common.py",
      "torch/_inductor/codegen/device_op_overrides.py"),
     N_("Follow the changed DeviceInterface / register_backend_for_device / DeviceOpOverrides API in the "
      "backend's torch.compile integration.")),
    ("autocast", N_("autocast"),
     ("aten/src/ATen/autocast_mode.*", "torch/amp/autocast_mode.py"),
     N_("Review the backend's autocast op lists and fast dtype against the change.")),
    ("generator", N_("random generators"),
     ("c10/core/GeneratorImpl.*", "aten/src/ATen/core/Generator.*", "aten/src/ATen/core/GeneratorForPrivateuseone.*",
      "aten/src/ATen/core/PhiloxRNGEngine.h"),
     N_("Check the backend's generator class and RNG state handling.")),
    ("device_test_base", N_("the device-generic test base"),
     ("torch/testing/_internal/common_device_type.py",),
     N_("Re-run the backend's instantiated device tests: the test base decides which tests run on the device.")),
]

# Changed lines that name the PrivateUse1 machinery tie a file to it wherever it lives.
CONTENT_RULES: list[tuple[str, re.Pattern]] = [
    ("privateuse1_hooks", re.compile(r"PrivateUse1|privateuse1|privateuseone|_get_privateuse1_backend_name")),
    ("compile_device_interface", re.compile(r"register_backend_for_device|register_interface_for_device"
                                            r"|DeviceOpOverrides")),
]


def _glob_re(glob: str) -> str:
    out = []
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def _compile(globs: tuple[str, ...]) -> re.Pattern:
    return re.compile("^(?:" + "|".join(_glob_re(g) for g in globs) + ")$")


_AREA_RES = [(name, level, _compile(globs)) for name, level, globs in AREAS]
_POINT_RES = [(pid, _compile(globs)) for pid, _title, globs, _s in INTEGRATION_POINTS]
POINT_TITLES = {pid: title for pid, title, _g, _s in INTEGRATION_POINTS}
POINT_SUGGESTIONS = {pid: s for pid, _t, _g, s in INTEGRATION_POINTS}


@dataclass(frozen=True)
class PathInfo:
    areas: tuple[str, ...]
    level: str  # the first matching area's level; "None" when nothing matches
    point: str | None  # integration point id


@lru_cache(maxsize=65536)
def classify_path(path: str) -> PathInfo:
    areas: list[str] = []
    level = None
    for name, lv, rx in _AREA_RES:
        if rx.match(path):
            if level is None:
                level = lv
            if name not in areas and (name not in FALLBACK_AREAS or not areas):
                areas.append(name)
    point = next((pid for pid, rx in _POINT_RES if rx.match(path)), None)
    return PathInfo(tuple(areas) or ("other",), level or "None", point)


def content_points(lines: list[tuple[int, str]]) -> dict[str, tuple[int, str]]:
    """Integration points named by changed lines, with the first line that names each."""
    found: dict[str, tuple[int, str]] = {}
    for ln, text in lines:
        for pid, rx in CONTENT_RULES:
            if pid not in found and rx.search(text):
                found[pid] = (ln, text)
    return found
