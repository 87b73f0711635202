"""A PyTorch-shaped git repository with commits whose right impact is known, for tests and benchmarks.

The operator yaml and the derivative formulas are the real ones shipped in the installed torch; every other
file is a small stand-in at its real path. Each scenario edits the tree the way an upstream PR would and records
the impact it must get for an op-plugin-style profile (`implemented`) and for the generic PrivateUse1 profile.
Commits are written with one `git fast-import`, so hundreds take well under a second.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from opforge.skills.pr_analysis.areas import DERIVATIVES, NATIVE_FUNCTIONS
from opforge.skills.pr_analysis.release import installed_yaml
from opforge.skills.pr_analysis.schema_diff import _load, split_derivatives, split_native

BASE_TIME = 1767225600  # 2026-01-01T00:00:00Z
STEP_S = 1800
AUTHORS = [("Ada Byron", "ada@example.com"), ("Ken Ito", "ken@example.com"), ("Mei Chen", "mei@example.com")]

STUBS = {
    "c10/core/DispatchKey.h": "#pragma once\nnamespace c10 {\nenum class DispatchKey : uint16_t {\n  Undefined = 0,\n"
                              "  CPU,\n  CUDA,\n  PrivateUse1,\n};\n}\n",
    "aten/src/ATen/detail/PrivateUse1HooksInterface.h": "#pragma once\nnamespace at {\nstruct PrivateUse1HooksInterface"
                                                        " : AcceleratorHooksInterface {\n  virtual ~PrivateUse1Hooks"
                                                        "Interface() = default;\n};\n}\n",
    "c10/core/impl/DeviceGuardImplInterface.h": "#pragma once\nnamespace c10::impl {\nstruct DeviceGuardImplInterface"
                                                " {\n  virtual DeviceType type() const = 0;\n};\n}\n",
    "torch/csrc/distributed/c10d/ProcessGroup.hpp": "#pragma once\nnamespace c10d {\nclass ProcessGroup {\n public:\n"
                                                    "  virtual ~ProcessGroup();\n};\n}\n",
    "torch/_dynamo/device_interface.py": "class DeviceInterface:\n    @staticmethod\n    def current_device():\n"
                                         "        raise NotImplementedError\n",
    "torch/testing/_internal/common_device_type.py": "class DeviceTypeTestBase:\n"
                                                     "    device_type = 'generic_device_type'\n",
    "torch/_decomp/decompositions.py": "import torch\naten = torch._ops.ops.aten\n",
    "torch/_inductor/lowering.py": "lowerings = {}\n",
    "torch/_tensor.py": "class Tensor:\n    def __reduce_ex__(self, proto):\n        return None\n",
    "aten/src/ATen/native/cuda/Activation.cu": "#include <ATen/native/Activation.h>\n",
    "aten/src/ATen/native/mps/operations/Linear.mm": "#include <ATen/native/mps/OperationUtils.h>\n",
    "test/test_nn.py": "from torch.testing._internal.common_utils import TestCase\n",
    "test/inductor/test_torchinductor.py": "import torch\n",
    "docs/source/notes/extending.rst": "Extending PyTorch\n=================\n",
    ".github/workflows/pull.yml": "name: pull\non: pull_request\n",
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.27)\nproject(Torch CXX C)\n",
    "README.md": "# PyTorch\n",
}


@dataclass
class Scenario:
    name: str
    title: str
    expected: dict[str, str]  # profile kind ("op_plugin", "generic") -> impact
    subject: str | None  # the operator or integration point a High row must name
    pr: int | None
    body: str
    changes: dict[str, str | None]  # path -> new text (None deletes)


class _Tree:
    """The current files plus pickers that never hand out the same operator twice."""

    def __init__(self, implemented: set[str]):
        self.files: dict[str, str] = dict(STUBS)
        self.files[NATIVE_FUNCTIONS] = installed_yaml().read_text(encoding="utf-8")
        self.files[DERIVATIVES] = (installed_yaml().parents[2] / "autograd" / "derivatives.yaml").read_text("utf-8")
        self.implemented = implemented
        self.used: set[str] = set()

    def pick(self, want_impl: bool, ok: Callable[[str, str, dict], bool]) -> tuple[str, str]:
        entries = split_native(self.files[NATIVE_FUNCTIONS])
        # Fresh operators first; a long window may edit one a second time.
        for fresh in (True, False):
            for key in sorted(entries):
                if (key in self.used) == fresh or (key in self.implemented) != want_impl or key.startswith("synth_"):
                    continue
                doc = _load(entries[key])
                if ok(key, str(doc.get("func", "")), doc):
                    self.used.add(key)
                    return key, entries[key].text
        raise RuntimeError("no operator left for a scenario")

    def pick_derivative(self, want_impl: bool) -> tuple[str, str, str]:
        for key, e in sorted(split_derivatives(self.files[DERIVATIVES]).items()):
            if key in self.used or (key in self.implemented) != want_impl:
                continue
            for line in e.text.splitlines():
                if line.startswith("  self: ") and not line[8:].startswith(("'", '"', "non_diff", "not_impl")):
                    self.used.add(key)
                    return key, e.text, line
        raise RuntimeError("no derivative left for a scenario")

    def edit_native(self, old_entry: str, new_entry: str) -> dict[str, str]:
        text = self.files[NATIVE_FUNCTIONS].replace(old_entry, new_entry, 1)
        return {NATIVE_FUNCTIONS: text}


def _functional(key: str, func: str, doc: dict) -> bool:
    return "!" not in func and "(a" not in func and "*" not in func and "->" in func


def _args_end(func_line: str) -> int:
    return func_line.index(") ->")


def _append_line(text: str, line: str) -> str:
    return text.rstrip("\n") + "\n" + line + "\n"


def _entry_add_line(entry: str, line: str) -> str:
    body = entry.rstrip("\n")
    return body + "\n" + line + entry[len(body):]


def _scenarios(t: _Tree, k: int) -> Iterable[tuple[str, str, str, str, str | None, Callable[[], dict]]]:
    """(name, title, level for op-plugin, level for generic, subject, make changes) in commit order."""

    def arg_default(impl: bool):
        key, text = t.pick(impl, _functional)
        first = text.splitlines()[0]
        cut = _args_end(first)
        sep = "" if first[cut - 1] == "(" else ", "
        return key, t.edit_native(text, text.replace(first, first[:cut] + f"{sep}bool synth_flag{k}=False"
                                                     + first[cut:], 1))

    def ret_change():
        key, text = t.pick(True, lambda k_, f, d: _functional(k_, f, d) and f.endswith("-> Tensor"))
        first = text.splitlines()[0]
        return key, t.edit_native(text, text.replace(first, first[: -len("Tensor")] + "(Tensor, Tensor)", 1))

    def remove():
        key, text = t.pick(True, _functional)
        return key, t.edit_native(text, "")

    def rename_overload():
        key, text = t.pick(True, lambda k_, f, d: _functional(k_, f, d) and "." in k_)
        return key, t.edit_native(text, text.replace(key + "(", f"{key}_v{k}(", 1))

    def rename_arg():
        key, text = t.pick(True, lambda k_, f, d: _functional(k_, f, d) and " other" in f)
        first = text.splitlines()[0]
        return key, t.edit_native(text, text.replace(first, first.replace(" other", " other_value", 1), 1))

    def dispatch_add(impl: bool, dkey: str):
        def ok(k_, f, d):
            disp = d.get("dispatch")
            return isinstance(disp, dict) and not any(
                c in str(disp) for c in ("Composite", "MTIA")) and "\n  dispatch:\n" in t_entries_text(k_)
        key, text = t.pick(impl, ok)
        line = f"    {dkey}: synth_{k}_{key.replace('.', '_')}\n"
        return key, t.edit_native(text, text.replace("\n  dispatch:\n", "\n  dispatch:\n" + line, 1))

    def t_entries_text(key):
        return split_native(t.files[NATIVE_FUNCTIONS])[key].text

    def tags_add():
        key, text = t.pick(False, lambda k_, f, d: "tags" not in d)
        return key, t.edit_native(text, _entry_add_line(text, "  tags: pointwise"))

    def comment():
        key, text = t.pick(False, lambda k_, f, d: True)
        return key, t.edit_native(text, f"# synth note {k}: keep in sync with the composite kernel\n" + text)

    def add_op():
        key = f"synth_op_{k}"
        nf = _append_line(t.files[NATIVE_FUNCTIONS], f"\n- func: {key}(Tensor self, *, float scale=1.0) -> Tensor\n"
                                                     "  variants: function\n  dispatch:\n"
                                                     f"    CompositeExplicitAutograd: {key}")
        return key, {NATIVE_FUNCTIONS: nf}

    def derivative(impl: bool):
        key, text, line = t.pick_derivative(impl)
        new = text.replace(line, f"  self: ({line[8:]}).contiguous()", 1)
        return key, {DERIVATIVES: t.files[DERIVATIVES].replace(text, new, 1)}

    def touch(path: str, line: str):
        return {path: _append_line(t.files[path], line)}

    def combine(*parts: dict) -> dict:
        out: dict = {}
        for p in parts:
            out.update(p)
        return out

    S = "synth"
    yield ("arg_default", f"Add synth_flag{k} to {{op}}", "High", "Medium", "op", lambda: arg_default(True))
    yield ("ret_change", f"Return a second tensor from {{op}} ({k})", "High", "Medium", "op", ret_change)
    yield ("remove_overload", f"Remove the deprecated overload {{op}} ({k})", "High", "Medium", "op", remove)
    yield ("rename_overload", f"Rename overload {{op}} ({k})", "High", "Medium", "op", rename_overload)
    yield ("rename_arg", f"Rename argument of {{op}} ({k})", "High", "Medium", "op", rename_arg)
    yield ("dispatch_composite", f"Give {{op}} a composite kernel ({k})", "High", "Medium", "op",
           lambda: dispatch_add(True, "CompositeExplicitAutograd"))
    yield ("derivative_impl", f"Fix the backward of {{op}} ({k})", "High", "Medium", "op", lambda: derivative(True))
    yield ("dispatch_key", f"[c10] reserve a dispatch key bit ({k})", "High", "High", "dispatch_keys",
           lambda: (None, touch("c10/core/DispatchKey.h", f"  Reserved{k},  // reserved bit for a new backend")))
    yield ("pu1_hooks", f"Add isAvailable to the PrivateUse1 hooks ({k})", "High", "High", "privateuse1_hooks",
           lambda: (None, touch("aten/src/ATen/detail/PrivateUse1HooksInterface.h",
                                f"  virtual bool isAvailable{k}() const {{ return false; }}")))
    yield ("device_guard", f"DeviceGuardImpl: add synchronizeDevice ({k})", "High", "High", "device_guard",
           lambda: (None, touch("c10/core/impl/DeviceGuardImplInterface.h",
                                f"  virtual void synchronizeDevice{k}(DeviceIndex) const {{}}")))
    yield ("c10d", f"[c10d] add a shrink() collective to ProcessGroup ({k})", "High", "High", "c10d",
           lambda: (None, touch("torch/csrc/distributed/c10d/ProcessGroup.hpp", f"  virtual void shrink{k}();")))
    yield ("device_interface", f"[dynamo] DeviceInterface.memory_allocated ({k})", "High", "High",
           "compile_device_interface",
           lambda: (None, touch("torch/_dynamo/device_interface.py", f"    memory_allocated_{k} = None")))
    yield ("test_base", f"Device-type tests: skip on low-memory devices ({k})", "High", "High", "device_test_base",
           lambda: (None, touch("torch/testing/_internal/common_device_type.py", f"LOW_MEMORY_SKIP_{k} = True")))
    yield ("pu1_content", f"Pickle tensors of the privateuse1 device ({k})", "High", "High", "privateuse1_hooks",
           lambda: (None, touch("torch/_tensor.py", f"        if self.device.type == "
                                                    f"torch._C._get_privateuse1_backend_name():  # {k}")))
    yield ("comment_dispatch_key", f"[c10] document the backend component bits ({k})", "Low", "Low", None,
           lambda: (None, touch("c10/core/DispatchKey.h", f"// The backend component bits, note {k}.")))
    yield ("reformat_c10d", f"[BE] reformat ProcessGroup.hpp ({k})", "Low", "Low", None,
           lambda: (None, {"torch/csrc/distributed/c10d/ProcessGroup.hpp": t.files[
               "torch/csrc/distributed/c10d/ProcessGroup.hpp"].replace(" public:\n", "  public:\n", 1)
               if k % 2 == 0 else t.files["torch/csrc/distributed/c10d/ProcessGroup.hpp"].replace(
               "  public:\n", " public:\n", 1)}))
    yield ("add_op", "Add the operator {op}", "Medium", "Medium", None, add_op)
    yield ("tags", f"Tag {{op}} pointwise ({k})", "Medium", "Medium", None, tags_add)
    yield ("decomp", f"Decompose aten.addcmul in Python ({k})", "Medium", "Medium", None,
           lambda: (None, touch("torch/_decomp/decompositions.py", f"addcmul_{k} = aten.addcmul.default")))
    yield ("nonimpl_arg", f"Add synth_flag{k} to {{op}} (not in the backend)", "Medium", "Medium", None,
           lambda: arg_default(False))
    yield ("derivative_nonimpl", f"Simplify the backward of {{op}} ({k})", "Medium", "Medium", None,
           lambda: derivative(False))
    yield ("inductor", f"[inductor] lower aten.cumsum ({k})", "Low", "Low", None,
           lambda: (None, touch("torch/_inductor/lowering.py", f'lowerings["cumsum_{k}"] = None')))
    yield ("tests", f"Deflake test_nn ({k})", "Low", "Low", None,
           lambda: (None, touch("test/test_nn.py", f"DEFLAKE_{k} = 3")))
    yield ("cmake", f"[build] bump the minimum CMake ({k})", "Low", "Low", None,
           lambda: (None, touch("CMakeLists.txt", f"set(SYNTH_{k} ON)")))
    yield ("mps_and_test", f"[MPS] fix linear and test it ({k})", "Low", "Low", None,
           lambda: (None, combine(touch("aten/src/ATen/native/mps/operations/Linear.mm", f"static int linear_{k} = 0;"),
                                  touch("test/inductor/test_torchinductor.py", f"LINEAR_{k} = 1"))))
    yield ("dispatch_cuda", f"[CUDA] kernel for {{op}} on MTIA ({k})", "None", "None", None,
           lambda: dispatch_add(True, "MTIA"))
    yield ("nf_comment", f"Comment the composite of {{op}} ({k})", "None", "None", None, comment)
    yield ("docs", f"[docs] PrivateUse1 extension notes ({k})", "None", "None", None,
           lambda: (None, touch("docs/source/notes/extending.rst", f"PrivateUse1 backends register hooks ({k}).")))
    yield ("ci", f"[ci] pin the runner image ({k})", "None", "None", None,
           lambda: (None, touch(".github/workflows/pull.yml", f"env_{k}: pinned")))
    yield ("cuda", f"[CUDA] vectorize gelu ({k})", "None", "None", None,
           lambda: (None, touch("aten/src/ATen/native/cuda/Activation.cu", f"static int gelu_vec_{k} = 4;")))
    yield ("readme", f"Fix a typo in the README ({k})", "None", "None", None,
           lambda: (None, touch("README.md", f"{S} {k}")))


def _message(title: str, pr: int | None, revert_of: int | None) -> str:
    if revert_of is not None:
        return (f"Revert \"{title}\"\n\nThis reverts commit {'ab' * 20}.\n\n"
                f"Reverted https://github.com/pytorch/pytorch/pull/{revert_of} on behalf of "
                "https://github.com/ada due to breaking trunk\n")
    if pr is None:
        return f"{title}\n\nA plain commit without a PR.\n"
    return (f"{title}\n\nLonger description of the change.\n\nPull Request resolved: "
            f"https://github.com/pytorch/pytorch/pull/{pr}\nApproved by: https://github.com/ken\n")


def build_repo(dest: Path, n_commits: int, implemented: Iterable[str], first_pr: int = 160000) -> list[dict]:
    """Create `dest` with one base commit and `n_commits` scenario commits; returns what each must get."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(dest)], check=True)
    tree = _Tree(set(implemented))
    stream: list[bytes] = []
    expected: list[dict] = []

    def data(text: str) -> bytes:
        b = text.encode("utf-8")
        return b"data %d\n" % len(b) + b + b"\n"

    def commit(i: int, msg: str, changes: dict[str, str | None]) -> None:
        name, email = AUTHORS[i % len(AUTHORS)]
        ts = BASE_TIME + i * STEP_S
        who = f"{name} <{email}> {ts} +0000\n".encode()
        parts = [b"commit refs/heads/main\n", b"mark :%d\n" % (i + 1), b"author " + who, b"committer " + who,
                 data(msg)]
        if i:
            parts.append(b"from :%d\n" % i)
        for path, text in changes.items():
            if text is None:
                parts.append(f"D {path}\n".encode())
            else:
                parts.append(f"M 100644 inline {path}\n".encode() + data(text))
        stream.append(b"".join(parts))
        for path, text in changes.items():
            if text is None:
                tree.files.pop(path, None)
            else:
                tree.files[path] = text

    commit(0, "Initial import\n", dict(tree.files))
    i, k = 1, 0
    while i <= n_commits:
        for name, title, lv_plugin, lv_generic, subject, make in _scenarios(tree, k):
            if i > n_commits:
                break
            op, changes = make()
            title = title.format(op=op)
            # Every ninth commit lands without a PR trailer; every 29th is a bot revert of an earlier PR.
            pr = None if i % 9 == 0 else first_pr + i
            revert_of = first_pr + i - 7 if i % 29 == 0 and pr is not None else None
            msg = _message(title, pr, revert_of)
            if revert_of is not None:
                title = f"Revert \"{title}\""
            commit(i, msg, changes)
            expected.append({"name": name, "title": title, "pr": None if revert_of is not None else pr,
                             "revert_of": revert_of, "op": op, "subject": op if subject == "op" else subject,
                             "expected": {"op_plugin": lv_plugin, "generic": lv_generic}})
            i += 1
        k += 1
    subprocess.run(["git", "-C", str(dest), "fast-import", "--quiet"], input=b"".join(stream), check=True)
    subprocess.run(["git", "-C", str(dest), "symbolic-ref", "HEAD", "refs/heads/main"], check=True)
    return expected


if __name__ == "__main__":  # pragma: no cover - manual use: python -m ... DEST N
    import sys

    from opforge.skills.pr_analysis.profile import load_profile

    ops = load_profile(sys.argv[3]).operators if len(sys.argv) > 3 else set()
    print(len(build_repo(Path(sys.argv[1]), int(sys.argv[2]), ops)), "commits")
