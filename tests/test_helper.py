"""opforge helper: passages cut from real sources, an incremental index, answers that cite file and line, errors
routed to skills, refusals, and the shipped question set answered from the installed torch and opforge."""
import json
import sqlite3
import sys
from pathlib import Path

import pytest
import torch
from registry_data import wheel
from typer.testing import CliRunner

from opforge.cli import app
from opforge.skills.helper import chunks, index
from opforge.skills.helper.ask import _quoted, route, search
from opforge.skills.helper.corpus import folder_files

runner = CliRunner()
QA = Path(__file__).parent / "data" / "helper" / "qa.yaml"
TORCH_ROOT = Path(torch.__file__).resolve().parents[1]


def test_python_passages_carry_their_dotted_name_and_line_span():
    path = "torch/utils/backend_registration.py"
    found = {c.symbol: c for c in chunks.chunk(path, (TORCH_ROOT / path).read_text())}
    c = found["torch.utils.backend_registration.rename_privateuse1_backend"]
    import inspect

    from torch.utils import backend_registration as br
    lines, first = inspect.getsourcelines(br.rename_privateuse1_backend)
    assert (c.line, c.end_line) == (first, first + len(lines) - 1)
    assert c.summary.startswith("Rename the privateuse1 backend")
    settings = {c.symbol: c for c in chunks.chunk("torch/_dynamo/config.py",
                                                  (TORCH_ROOT / "torch/_dynamo/config.py").read_text())}
    assert "fallback to eager" in settings["torch._dynamo.config.suppress_errors"].summary  # the comment above it


def test_yaml_headers_registry_and_markdown_are_cut_by_entry():
    yaml_path = "torchgen/packaged/ATen/native/native_functions.yaml"
    entries = {c.symbol: c for c in chunks.chunk(yaml_path, (TORCH_ROOT / yaml_path).read_text())}
    add = entries["add.Tensor"]
    text = (TORCH_ROOT / yaml_path).read_text().splitlines()
    func = next(i + 1 for i, line in enumerate(text) if line.startswith("- func: add.Tensor("))
    assert add.line <= func <= add.end_line and "dispatch:" in add.text  # the comment above it, then the entry
    registry = chunks.chunk("torch/_dynamo/graph_break_registry.json",
                            (TORCH_ROOT / "torch/_dynamo/graph_break_registry.json").read_text())
    assert registry and all(c.symbol.startswith("GB") and c.summary for c in registry)
    header = "torch/include/c10/core/impl/DeviceGuardImplInterface.h"
    names = {c.symbol for c in chunks.chunk(header, (TORCH_ROOT / header).read_text())}
    assert "DeviceGuardImplInterface" in names
    md = chunks.chunk("x.md", "# Title\n\nIntro line.\n\n## Part\n\nBody here.\n```\n# not a heading\n```\n")
    assert [(c.symbol, c.line, c.summary) for c in md] == [("Title", 1, "Intro line."), ("Part", 5, "Body here.")]


def test_header_passages_carry_their_comment_and_registration_macros():
    header = "torch/include/c10/core/impl/DeviceGuardImplInterface.h"
    found = {c.symbol: c for c in chunks.chunk(header, (TORCH_ROOT / header).read_text())}
    assert found["DeviceGuardImplInterface"].summary.startswith("DeviceGuardImplInterface represents")  # a // comment
    macro = found["C10_REGISTER_GUARD_IMPL"]
    assert macro.kind == "macro" and "DeviceGuardImplRegistrar" in macro.text
    source = ("/**\n * Call this function `init_device(kind)` before any other (it is cheap);\n */\n"
              "void init_device(int kind);\n"
              "inline int twice(int x) {\n  return helper_call(x) * 2;\n}\n"
              "// Registers a kernel for the device.\n"
              "#define REGISTER_KERNEL(name, fn) \\\n  static int name = add(fn);\n")
    cut = [(c.symbol, c.kind, c.line, c.end_line, c.summary) for c in chunks.header("x.h", source)]
    assert cut == [("init_device", "function", 1, 4, "Call this function `init_device(kind)` before any other (it is "
                                                     "cheap);"),
                   ("twice", "function", 5, 7, ""),  # not `helper_call`: a statement of its body
                   ("REGISTER_KERNEL", "macro", 8, 10, "Registers a kernel for the device.")]


def test_the_index_is_incremental_by_file_hash(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text('def alpha_widget():\n    """Spins the alpha widget."""\n')
    (src / "pkg" / "b.py").write_text('def beta_gadget():\n    """Folds the beta gadget."""\n')
    db = index.create(tmp_path / "i.sqlite")
    first = index.build(db, "mine", str(src), folder_files(src))
    assert (first.files, first.changed, first.chunks) == (2, 2, 2)
    again = index.build(db, "mine", str(src), folder_files(src))
    assert (again.changed, again.removed) == (0, 0)
    (src / "pkg" / "a.py").write_text('def alpha_widget():\n    """Polishes the alpha widget."""\n')
    (src / "pkg" / "b.py").unlink()
    third = index.build(db, "mine", str(src), folder_files(src))
    assert (third.changed, third.removed, third.chunks) == (1, 1, 1)
    found = search(db, "what polishes the alpha widget?")
    assert found["supported"] and found["citations"][0]["symbol"] == "pkg.a.alpha_widget"
    assert found["citations"][0]["path"] == "pkg/a.py" and found["citations"][0]["line"] == 1
    assert not search(db, "what folds the gadget?")["supported"]  # gone with its file


def test_quoted_error_text_is_looked_up_around_the_users_own_names():
    assert _quoted("tensor.foo('cuda:0') raises 'Invalid device, must be foo device', doesn't it") == [
        ["Invalid", "device", "must", "be"]]  # the source printed its backend name where the user's stands
    assert _quoted('it says "Expected all tensors to be on the same device" here') == [
        ["Expected", "all", "tensors", "to", "be", "on", "the", "same", "device"]]


def test_errors_are_routed_to_the_skill_that_diagnoses_them():
    missing = route("NotImplementedError: Could not run 'aten::addmm' with arguments from the 'npu' backend.")
    assert missing["skill"] == "test-triage" and "--ops addmm" in missing["command"] and "--device npu" in \
        missing["command"]
    assert route("torch._dynamo.exc.Unsupported: Graph break due to unsupported builtin")["skill"] == "graph-diagnose"
    assert route("TypeError: npu_add() got an unexpected keyword argument 'alpha'")["skill"] == "api-consistency"
    assert route("How do I register a device?") is None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = tmp_path_factory.mktemp("helper") / "index.sqlite"
    result = runner.invoke(app, ["helper", "index", "--corpus", "torch,torch-npu,opforge", "--npu-wheel", str(wheel()),
                                 "--index", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return path, json.loads(result.output)


@pytest.mark.parametrize("questions, top3, refused", [  # floors a little under what was measured
    ("qa.yaml", 0.85, 5),  # built from the tools' ground truth; measured 0.89, 5 of 5 refused
    ("qa_npu.yaml", 0.85, 0),  # torch_npu's registration; measured 0.92
    # written without looking at the helper or its cards; top-3 when first run, then what was measured after
    ("qa_heldout.yaml", 0.88, 4),  # 0.24 before cards; 0.92, 4 of 5 refused
    ("qa_heldout2.yaml", 0.86, 4),  # 0.86 (a first version of the cards); 0.90, 4 of 5
    ("qa_heldout3.yaml", 0.84, 5),  # 0.84; 0.88, 5 of 5
    ("qa_heldout4.yaml", 0.86, 4),  # 0.80, 2 of 5; 0.90, 4 of 5
    ("qa_heldout5.yaml", 0.78, 3),  # 0.78, 3 of 5; 0.82, 3 of 5
    ("qa_heldout6.yaml", 0.8, 3),  # written after every change above: 0.84, 3 of 5
    ("qa_heldout7.yaml", 0.82, 3),  # 0.84, 2 of 5; 0.86, 4 of 5
    ("qa_heldout8.yaml", 0.92, 0),  # 0.96, 0 of 5; 0.98, 0 of 5
    ("qa_heldout9.yaml", 0.8, 3),  # written after every change above but the quoted-text lookup: 0.84, 4 of 5
    ("qa_heldout10.yaml", 0.76, 2),  # written after every change above: 0.80, 2 of 5
])
def test_the_shipped_question_sets_are_answered_with_citations(built, questions, top3, refused):
    path, made = built
    assert {c["corpus"] for c in made["corpora"]} == {"torch", "torch-npu", "opforge"} and made["size_mb"] > 10
    result = runner.invoke(app, ["helper", "eval", str(QA.with_name(questions)), "--index", str(path), "--json"])
    assert result.exit_code == 0, result.output
    scores = json.loads(result.output)
    assert scores["answerable"] >= 10
    assert scores["top3"] >= top3, [r for r in scores["rows"] if r["rank"] is None]  # a floor under the measure
    assert scores["refused_right"] >= refused


def test_an_answer_cites_and_runs_and_a_question_without_support_is_refused(built):
    path, _ = built
    result = runner.invoke(app, ["helper", "ask", "How do I give the PrivateUse1 backend its own device name?",
                                 "--index", str(path), "--run", "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    best = found["citations"][0]
    assert (best["path"], best["symbol"]) == ("torch/utils/backend_registration.py",
                                              "torch.utils.backend_registration.rename_privateuse1_backend")
    assert f"{best['path']}:{best['line']}" in found["answer"]
    assert "signature: (backend_name: str)" in found["run"]["output"]  # what Python printed, not what was indexed
    none = json.loads(runner.invoke(app, ["helper", "ask", "What temperature should sourdough bread bake at?",
                                          "--index", str(path), "--json"]).output)
    assert not none["supported"] and none["citations"] == [] and "sourdough" in none["unheard"]
    assert "No indexed source mentions “sourdough”" in none["answer"]
    unrelated = json.loads(runner.invoke(app, ["helper", "ask", "How do I change the fan curve of an Ascend server "
                                                                "from Python?", "--index", str(path),
                                               "--json"]).output)
    unsure = json.loads(runner.invoke(app, ["helper", "ask", "Which fan speed keeps the server room cool?", "--index",
                                            str(path), "--json"]).output)  # every word is somewhere, in other senses
    assert not unsure["supported"] and "Nothing in the indexed sources" in unsure["answer"]
    assert not unrelated["supported"] and unrelated["backend_lacks"] == ["curve", "fan"]  # torch_npu's never say them
    assert "No torch_npu source mentions “curve”, “fan”" in unrelated["answer"]
    made_up = json.loads(runner.invoke(app, ["helper", "ask", "How do I call torch.library.register_quantum_kernel "
                                                              "for my device?", "--index", str(path), "--json"]).output)
    assert not made_up["supported"] and made_up["unknown"] == ["torch.library.register_quantum_kernel"]
    for question, name in [("Which env var like TORCH_PRIVATEUSE1_WARP_SPEED=1 makes the backend faster?",
                            "TORCH_PRIVATEUSE1_WARP_SPEED"),  # an environment variable no source spells
                           ("How do I read the chip temperature with torch.npu.temperature()?",
                            "torch.npu.temperature")]:  # torch.cuda has one, torch_npu does not
        found = json.loads(runner.invoke(app, ["helper", "ask", question, "--index", str(path), "--json"]).output)
        assert not found["supported"] and found["unknown"] == [name], found
    lacks = json.loads(runner.invoke(app, ["helper", "ask", "Does torch_npu have a GdsFile class like torch.cuda.gds "
                                                            "for GPUDirect storage reads?", "--index", str(path),
                                           "--json"]).output)  # torch has it; torch_npu's sources never say so
    assert not lacks["supported"] and lacks["backend_lacks"] == ["gpudirect", "gdsfile"]
    assert "No torch_npu source mentions “gpudirect”, “gdsfile”" in lacks["answer"]
    private = json.loads(runner.invoke(app, ["helper", "ask", "Tests fail with 'you should register a module by "
                                                              "torch._register_device_module'. Where is that defined?",
                                             "--index", str(path), "--json"]).output)
    assert private["unknown"] == [] and private["supported"]  # a leading underscore is part of the name


def test_the_answer_reads_in_chinese_with_lang_zh_citing_the_same_lines(built):
    path, _ = built
    question = ["helper", "ask", "How do I give the PrivateUse1 backend its own device name?", "--index", str(path)]
    en = runner.invoke(app, [*question, "--lang", "en"]).output
    zh = runner.invoke(app, [*question, "--lang", "zh"]).output
    cited = [line for line in en.splitlines() if line.startswith("  [")]
    assert cited and cited == [line for line in zh.splitlines() if line.startswith("  [")]
    assert "See also" in en and "See also" not in zh and "另见" in zh
    refused = runner.invoke(app, ["helper", "ask", "What temperature should sourdough bread bake at?", "--index",
                                  str(path), "--lang", "zh"]).output
    assert "没有出现 “sourdough”" in refused
    as_json = json.loads(runner.invoke(app, [*question, "--lang", "zh", "--json"]).output)
    assert "See also" in as_json["answer"]  # JSON stays English


@pytest.mark.parametrize("args, where", [
    (["ask", "x", "--index", "{tmp}/none.sqlite"], "none.sqlite"),
    (["ask", "x", "--index", "{tmp}/corrupt.sqlite"], "corrupt.sqlite"),
    (["index", "--corpus", "{tmp}/no/such/folder", "--index", "{tmp}/i.sqlite"], "--corpus"),
    (["eval", "{tmp}/qa.yaml", "--index", "{tmp}/i.sqlite"], "qa.yaml"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, where):
    (tmp_path / "corrupt.sqlite").write_bytes(b"not a database at all" * 100)
    (tmp_path / "qa.yaml").write_text("question: not a list\n")
    result = runner.invoke(app, ["helper", *[a.format(tmp=tmp_path) for a in args]])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and where in lines[0], result.output


def test_a_torch_npu_wheel_is_read_as_data(tmp_path):
    """A wheel is a zip: its Python is cut into passages by path, never imported."""
    import zipfile

    wheel = tmp_path / "torch_npu-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("torch_npu/__init__.py", 'import torch_npu._C  # cannot import here\n\n'
                   'def _apply_patches():\n    """Renames the PrivateUse1 backend to npu."""\n'
                   '    torch.utils.rename_privateuse1_backend("npu")\n')
        z.writestr("torch_npu-2.13.0.dist-info/METADATA", "Name: torch_npu\n")
    path = tmp_path / "i.sqlite"
    result = runner.invoke(app, ["helper", "index", "--corpus", "torch-npu", "--npu-wheel", str(wheel),
                                 "--index", str(path), "--json"])
    assert result.exit_code == 0, result.output
    db = sqlite3.connect(path)
    assert db.execute("SELECT path, symbol FROM chunks").fetchall() == [("torch_npu/__init__.py",
                                                                        "torch_npu._apply_patches")]


def test_a_model_answers_from_the_passages_alone_and_an_ungrounded_answer_is_set_aside(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent))
    from llm_replay import Replay, text

    src = tmp_path / "src"
    (src / "dev").mkdir(parents=True)
    (src / "dev" / "names.py").write_text('def rename_backend(name):\n    """Renames the custom backend device so '
                                          'tensors print with its own name."""\n')
    path = tmp_path / "i.sqlite"
    assert runner.invoke(app, ["helper", "index", "--corpus", str(src), "--index", str(path)]).exit_code == 0
    monkeypatch.setenv("OPFORGE_TEST_HELPER_KEY", "sk-helper")
    config = tmp_path / "llm.yaml"
    question = "How do I rename the custom backend device?"
    script_first = "Call `rename_backend(name)` in dev/names.py:1 [1]."
    script = [text(script_first), text("It is rename_backend [7]."),
              text("NO SUPPORT")]
    with Replay(script, key="sk-helper") as srv:
        config.write_text(f"provider: openai\nbase_url: {srv.url}/v1\nmodel: replay\n"
                          "api_key_env: OPFORGE_TEST_HELPER_KEY\n")
        ask = ["helper", "ask", question, "--index", str(path), "--llm-config", str(config), "--json"]
        grounded = json.loads(runner.invoke(app, ask).output)
        stray = json.loads(runner.invoke(app, ask).output)
        refused = json.loads(runner.invoke(app, ask).output)
        none = runner.invoke(app, ["helper", "ask", "What is the capital of Mongolia?", "--index", str(path),
                                   "--llm-config", str(config), "--json"])
        sent = srv.requests
    assert grounded["answer"] == script_first and grounded["model"]["cited"] == [1]
    assert "Renames the custom backend device" in sent[0]["messages"][1]["content"]  # the passage, numbered [1]
    assert stray["model"]["error"].endswith("[7]") and stray["answer"].startswith("`dev.names.rename_backend`")
    assert refused["model"]["refused"] and "no support" in refused["answer"]
    assert not json.loads(none.output)["supported"] and len(sent) == 3  # nothing retrieved: the model not asked
