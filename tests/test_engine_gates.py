"""One gate set for every engine: the deterministic engine's own impl passes the checks a model's or a host
developer's impl gets, and a cheating impl fails, from any engine, at the rule that names its cheat."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import make_request

from opforge.codegen.build import generate_impl, plan_request
from opforge.llm.develop import IMPL_GATES, static_check
from opforge.orchestrator.gates import RULES, impl_reach_problems, run_gates
from opforge.orchestrator.runner import create_workspace, run_stages
from opforge.workspace import Workspace

OP = "qat_symmetric_per_tensor"


@pytest.fixture(scope="module")
def host_ready(tmp_path_factory) -> Path:
    """The demo request (small shapes), stages 1-4 done for the host engine, no impl yet."""
    base = tmp_path_factory.mktemp("engine_gates")
    ws = create_workspace(make_request(base / "request"), base / "ws")
    for k in (1, 2, 3, 4):
        state = run_stages(ws.root, only=k, engine="host")
        assert state.stages[k].status == "completed", state.stages[k].reason
    return ws.root


@pytest.fixture(scope="module")
def template_impl(host_ready) -> str:
    req = Workspace(host_ready, OP).request()
    return generate_impl(req, plan_request(req))


def _with_impl(src: Path, tmp_path: Path, impl: str) -> Workspace:
    dest = tmp_path / "ws"
    shutil.copytree(src, dest)
    (dest / f"{OP}_impl.py").write_text(impl)
    return Workspace(dest, OP)


def _plant(impl: str, body: str, header: str = "") -> str:
    """The impl with the forward launch replaced by `body` and `header` after the module's imports."""
    launch = re.compile(rf"^    _{OP}_forward_kernel\[.*(?:\n     +.*)*$", re.M)  # with continuation lines
    assert len(launch.findall(impl)) == 1
    out = launch.sub(lambda _: body, impl)
    anchor = "import triton.language as tl  # noqa: E402\n"
    assert anchor in out
    return out.replace(anchor, anchor + header, 1)


def test_template_impl_passes_the_host_engines_checks(host_ready, template_impl, tmp_path):
    ws = _with_impl(host_ready, tmp_path, template_impl)
    assert "import os" in template_impl
    assert static_check(ws, None) is None
    impl_rules = {r.id for r in RULES if r.dimension == "separation" and 5 in r.stages and r.id.startswith("G5-IMPL")}
    assert set(IMPL_GATES) == impl_rules  # what the model's impl is held to before it runs is the runner's set
    results = {g["id"]: g for g in run_gates(ws, 5)}
    assert all(results[i]["passed"] for i in IMPL_GATES), [results[i] for i in IMPL_GATES]


@pytest.mark.slow
def test_template_impl_completes_stage_5_through_the_host_engine(host_ready, template_impl, tmp_path):
    ws = _with_impl(host_ready, tmp_path, template_impl)
    state = run_stages(ws.root, only=5, engine="host")
    assert state.stages[5].status == "completed", state.stages[5].reason
    assert json.loads(ws.path("precision.json").read_text())["summary"]["all_passed"]


NUMPY = ("    np.copyto(np.asarray(out), np.rint(np.asarray(weight) / np.asarray(scale)))", "import numpy as np\n")
GOLDEN = (f"    ns = {{}}\n    exec(open(os.path.join(os.path.dirname(__file__), '{OP}_golden.py')).read(), ns)\n"
          "    out = ns['forward'](weight, scale, eps, qmin, qmax)", "")
SYSTEM = ("    os.system('true')", "")
NN = ("    out = F.hardtanh(weight, qmin, qmax)", "F = torch.nn.functional\n")
SUBPROCESS = ("    subprocess.run(['true'])", "import subprocess\n")


@pytest.mark.parametrize("cheat,caught", [
    (NUMPY, [("G5-IMPL-IMPORTS", "import numpy")]),
    (GOLDEN, [("G5-IMPL-SEPARATE", f"{OP}_golden.py"), ("G5-IMPL-IMPORTS", "open"), ("G5-IMPL-IMPORTS", "exec")]),
    (SYSTEM, [("G5-IMPL-IMPORTS", "os.system")]),
    (NN, [("G5-IMPL-IMPORTS", "torch.nn")]),
    (SUBPROCESS, [("G5-IMPL-IMPORTS", "import subprocess")]),
], ids=["numpy", "reads-golden", "os.system", "torch.nn.functional", "subprocess"])
def test_a_cheat_fails_for_its_cheat_from_every_engine(host_ready, template_impl, tmp_path, cheat, caught):
    ws = _with_impl(host_ready, tmp_path, _plant(template_impl, *cheat))
    results = {g["id"]: g for g in run_gates(ws, 5)}  # what the runner applies after stage 5, whatever the engine
    verdict = static_check(ws, None)  # what a model's or host developer's impl meets before it runs
    assert verdict is not None and verdict.kind == "gate"
    for rule, needle in caught:
        assert not results[rule]["passed"] and needle in results[rule]["message"], results[rule]
        assert f"gate {rule}: " in verdict.summary and needle in verdict.summary, verdict.summary
    assert "import os" not in verdict.summary


def test_host_engine_refuses_a_planted_os_system_before_running_it(host_ready, template_impl, tmp_path):
    ws = _with_impl(host_ready, tmp_path, _plant(template_impl, *SYSTEM))
    state = run_stages(ws.root, only=5, engine="host")
    assert state.stages[5].status != "completed"
    reason = state.stages[5].reason or ""
    assert "G5-IMPL-IMPORTS" in reason and "os.system" in reason, reason
    assert not ws.path("precision.json").exists()  # refused before any test ran it


@pytest.mark.parametrize("line,needle", [
    ("os.popen('ls')", "os.popen"),
    ("os.execv('/bin/sh', ['sh'])", "os.execv"),
    ("os.spawnl(0, '/bin/sh')", "os.spawnl"),
    ("os.fork()", "os.fork"),
    ("os.kill(1, 9)", "os.kill"),
    ("os.remove('x')", "os.remove"),
    ("os.unlink('x')", "os.unlink"),
    ("os.rmdir('x')", "os.rmdir"),
    ("os.write(1, b'x')", "os.write"),
    ("os.environ.pop('X')", "os.environ.pop"),
    ("import os as o\no.system('ls')", "os.system"),
    ("from os import system", "os.system"),
    ("getattr(os, 'system')('ls')", "os.system"),
    ("getattr(os, 'sys' + 'tem')('ls')", "getattr(os, <computed name>)"),
    ("run = os\nrun.system('ls')", "os passed around as a value"),
    ("from torch import nn", "torch.nn"),
    ("y = torch.ops.aten.add", "torch.ops.aten"),
    ("y = torch.ops.aten.mm.default(a, b)", "torch.ops.aten"),
    ("y = torch.ops.aten.convolution", "torch.ops.aten"),  # the packet, not the overload the library call is
    ("__builtins__['open']", "__builtins__"),
    ("import opforge.verify.cases", "import opforge.verify.cases"),
])
def test_os_and_torch_beyond_the_environment_are_refused_by_name(line, needle):
    base = "import os\nimport torch\n"
    assert impl_reach_problems(base) == []
    bad = impl_reach_problems(base + line + "\n")
    assert bad and any(needle in b for b in bad), bad


def test_the_environment_paths_and_triton_are_in_reach():
    src = ("from __future__ import annotations\nimport math\nimport os\nimport os.path\nimport functools\n"
           "import torch\nimport triton\nimport triton.language as tl\n"
           "from triton.language.extra import libdevice\n"
           "os.environ.setdefault('TRITON_INTERPRET', '1')\nA = os.environ.get('A')\nB = os.environ['B']\n"
           "os.environ['C'] = '1'\nD = os.getenv('D', '0')\nE = os.path.join(os.path.dirname(__file__), 'x')\n"
           "F = getattr(torch, 'npu', None)\nG = torch.ops.opforge\n"
           "H = torch.ops.aten.convolution_backward.default(g, x, w, None, [1], [0], [1], False, [0], 1, [1, 1, 0])\n")
    assert impl_reach_problems(src) == []
