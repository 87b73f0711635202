"""test-triage: OpInfo tests on the reference backend in shards, failures clustered and classified. The planted
variant (tests/triage_variants.py) is built once; each planted defect must come out as its own cluster."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opforge.cli import app
from opforge.skills.test_triage import shards
from opforge.skills.test_triage.cluster import Facts, classify, clusters, normalise, representatives

sys.path.insert(0, str(Path(__file__).parent))
from triage_variants import PLANTED, PLANTED_COLLECTIVES, planted_backend  # noqa: E402

runner = CliRunner()
CRASHES = Path(__file__).parent / "data" / "triage" / "crashes_suite.py"
MISSING = ("Could not run 'aten::neg.out' with arguments from the 'opdev' backend. This could be because the "
           "operator doesn't exist for this backend, or was omitted during the selective/custom build process.")


def failure(test, exception, message, frames=()):
    return {"test": test, "outcome": "failed", "exception": exception, "message": message, "frames": list(frames)}


def info(test, generic, op, dtype):
    return {"test": test, "device": "opdev", "generic": generic, "op": op, "dtype": dtype,
            "twin": test.replace("PRIVATEUSE1", "CPU").replace("_opdev_", "_cpu_")}


def test_signatures_lose_what_varies_between_samples():
    assert normalise("Expected 3 but got 4 at 0x7f3a2c\nmore") == "Expected N but got N at ADDR"
    assert normalise(MISSING) == "Could not run 'aten::neg.out' with arguments from the 'opdev' backend."
    assert normalise("in /a/b/c.py: float16") == "in <file>: float16"


def test_the_rules_name_the_category_and_the_missing_operator():
    f = failure("ops.py::T::test_x", "NotImplementedError", MISSING)
    rule, op = classify(f, {}, cpu_also=False)
    assert (rule.category, rule.id, op) == ("missing_dispatch", "missing-kernel", "aten::neg.out")
    assert classify(f, {}, cpu_also=True)[0].category == "upstream"
    meta = failure("ops.py::T::test_fake_sgn_opdev_float32", "AssertionError", "result 0: the fake tensor's (3,)")
    assert classify(meta, {"generic": "TestFakeTensor.test_fake"}, False)[0].id == "wrong-metadata"
    xpass = failure("ops.py::T::t", "Failed", "Unexpected success")
    assert classify(xpass, {}, False)[0].category == "test_expectation"
    own = failure("my_test.py::test_a", "NameError", "name 'x' is not defined", [["/x/my_test.py", 3, "test_a"]])
    assert classify(own, {}, False)[0].id == "test-code"
    elsewhere = failure("my_test.py::test_a", "TypeError", "bad", [["/x/backend.py", 3, "f"]])
    assert classify(elsewhere, {}, False)[0].category == "behaviour_mismatch"


def test_clusters_join_overloads_and_dtypes_and_take_facts_of_their_representatives():
    tests = [f"ops.py::TestCommonPRIVATEUSE1::test_compare_cpu_{op}_opdev_{dt}"
             for op in ("neg", "mul") for dt in ("float32", "float16")]
    infos = {t: info(t, "TestCommon.test_compare_cpu", t.split("_cpu_")[1].split("_opdev")[0], t.rsplit("_", 1)[1])
             for t in tests}
    fails = [failure(tests[0], "NotImplementedError", MISSING),
             failure(tests[1], "NotImplementedError", MISSING.replace("neg.out", "neg_")),
             failure(tests[2], "AssertionError", "Tensor-likes are not close!\n\nMismatched elements: 3 / 8"),
             failure(tests[3], "AssertionError", "Tensor-likes are not equal!")]
    found = clusters(fails, infos, {tests[2]: Facts(2, 1, "passed"), tests[3]: Facts(2, 0, "passed")})
    by_op = {c["operator"]: c for c in found}
    assert set(by_op) == {"aten::neg", "mul"}
    assert by_op["aten::neg"]["size"] == 2 and by_op["aten::neg"]["category"] == "missing_dispatch"
    assert by_op["mul"]["flaky"] and by_op["mul"]["dtypes"] == ["float16", "float32"]
    upstream = clusters(fails[2:], infos, {tests[2]: Facts(0, 0, "failed"), tests[3]: Facts(0, 0, "error")})
    assert [c["category"] for c in upstream] == ["upstream"]
    mixed = clusters(fails[2:], infos, {tests[2]: Facts(0, 0, "failed"), tests[3]: Facts(0, 0, "passed")})
    assert [c["category"] for c in mixed] == ["behaviour_mismatch"]


def test_representatives_spread_over_the_cluster_and_shards_share_the_tests():
    assert representatives(list("abcdefghij"), 3) == ["a", "e", "j"]
    assert representatives(["a"], 5) == ["a"]
    parts = shards.split([str(i) for i in range(10)], 3)
    assert sorted(t for p in parts for t in p) == sorted(str(i) for i in range(10)) and len(parts) == 3
    assert shards.shard_count(1000, 2) == 4 and shards.shard_count(60, 2) == 1 and shards.shard_count(60, 2, 25) == 3


def test_a_crash_and_a_hang_lose_no_other_result(tmp_path):
    result = runner.invoke(app, ["test-triage", "run", "--device", "cpu", "--suite", str(CRASHES), "--timeout", "5",
                                 "--reruns", "1", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    outcomes = {json.loads(line)["test"].split("::")[-1]: json.loads(line)
                for line in (tmp_path / "results.jsonl").read_text().splitlines()}
    assert {t: r["outcome"] for t, r in outcomes.items()} == {
        "test_before": "passed", "test_kills_its_process": "failed", "test_between": "passed",
        "test_hangs": "failed", "test_own_code_is_wrong": "failed", "test_after": "passed"}
    assert outcomes["test_kills_its_process"]["exception"] == "Crash"
    assert "SIGSEGV" in outcomes["test_kills_its_process"]["message"]
    assert outcomes["test_hangs"]["exception"] == "Timeout"
    triage = json.loads((tmp_path / "triage.json").read_text())
    assert {(c["tests"][0].split("::")[-1], c["category"], c["rule"]) for c in triage["clusters"]} == {
        ("test_kills_its_process", "behaviour_mismatch", "crash"), ("test_hangs", "behaviour_mismatch", "hang"),
        ("test_own_code_is_wrong", "test_expectation", "test-code")}
    assert len(triage["shards"][0]["processes"]) == 3  # the crash, the hang, then the rest
    assert len(list((tmp_path / "junit").glob("*.xml"))) >= 1 and (tmp_path / "summary.xlsx").is_file()


@pytest.mark.parametrize("args, where", [
    (["--device", "nodevice", "--import", "opforge.backend.device"], "--device"),
    (["--device", "opdev", "--import", "no_such_module_here"], "--import"),
    (["--device", "opdev", "--import", "opforge.backend.device", "--ops", "no_such_op"], "--ops"),
    (["--device", "cpu", "--suite", "nofile.py"], "--suite"),
    (["--device", "cpu", "--executor", "cloud"], "--executor"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, where):
    result = runner.invoke(app, ["test-triage", "run", *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {where}: "), result.stderr


def test_a_test_file_that_does_not_import_is_bad_input(tmp_path):
    bad = tmp_path / "broken_suite.py"
    bad.write_text("import no_such_module_anywhere\n\ndef test_a():\n    pass\n")
    result = runner.invoke(app, ["test-triage", "run", "--device", "cpu", "--suite", str(bad), "--out",
                                 str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: {bad}: does not import: ModuleNotFoundError: No module named "
                                     "'no_such_module_anywhere'")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The planted variant's tree, committed in a git repository of its own and built (the build is cached by
    the tree's content)."""
    repo = tmp_path_factory.mktemp("repo")
    root = planted_backend(repo / "native")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    env = {**os.environ, "OPDEV_ROOT": str(root)}
    proc = subprocess.run([sys.executable, "-c", "import opforge.backend.device"], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def triage(out, root, *extra, ops=tuple(PLANTED), dtypes="float32,float16,int32"):
    os.environ["OPDEV_ROOT"] = str(root)
    os.environ["OPDEV_FLAKY_MARK"] = str(out / "flaky-add.mark")  # the run's first add is wrong (triage_variants)
    try:
        result = runner.invoke(app, ["test-triage", "run", "--device", "opdev", "--import", "opforge.backend.device",
                                     "--ops", ",".join(ops), "--dtypes", dtypes, "--out", str(out), *extra])
    finally:
        del os.environ["OPDEV_ROOT"], os.environ["OPDEV_FLAKY_MARK"]
    assert result.exit_code == 1, result.output
    return json.loads((out / "triage.json").read_text())


@pytest.fixture(scope="module")
def triaged(planted, tmp_path_factory):
    out = tmp_path_factory.mktemp("triage")
    return out, triage(out, planted)


def test_each_planted_defect_is_its_own_cluster_with_its_category(triaged):
    found = triaged[1]["clusters"]
    by_op = {}
    for c in found:
        by_op.setdefault(c["operator"].removeprefix("aten::"), []).append(c)
    assert set(by_op) == set(PLANTED), [(c["operator"], c["rule"]) for c in found]
    for op, (category, rule) in PLANTED.items():
        assert [(c["category"], c["rule"]) for c in by_op[op]] == [(category, rule)], op
    assert by_op["abs"][0]["dtypes"] == ["float16"]  # negated for float16 alone
    assert by_op["sub"][0]["generics"] == ["TestCommon.test_noncontiguous_samples"]
    assert by_op["sgn"][0]["generics"] == ["TestFakeTensor.test_fake"]
    assert by_op["sgn"][0]["cpu_twins"] == {"passed": 3}  # the wrong Meta kernel lives in the backend's import
    assert by_op["add"][0]["flaky"] and by_op["add"][0]["passed_on_rerun"] > 0
    assert not any(c["flaky"] for op in ("neg", "abs", "sub", "sgn") for c in by_op[op])


def test_the_summary_links_each_clusters_tests_repro_and_log(triaged):
    from openpyxl import load_workbook

    out, run = triaged
    rows = list(load_workbook(out / "summary.xlsx")["clusters"].iter_rows(values_only=True))
    head = rows[0]
    assert [r[0] for r in rows[1:]] == [c["id"] for c in run["clusters"]]
    for row in rows[1:]:
        for column in ("tests file", "repro", "log"):
            assert (out / row[head.index(column)]).is_file(), (row[0], column)
        assert row[head.index("signature")].split(":")[0] in (out / row[head.index("log")]).read_text()


def test_each_cluster_gets_a_repro_a_verified_commit_and_no_upstream_file_changes(planted, triaged):
    out, run = triaged
    result = runner.invoke(app, ["test-triage", "fix", str(out), "--tree", str(planted), "--reruns", "2", "--json"])
    assert result.exit_code == 0, result.output
    fixed = json.loads((out / "fix.json").read_text())
    by_op = {c["operator"].removeprefix("aten::"): c["id"] for c in run["clusters"]}
    fixes = {f["cluster"]: f for f in fixed["fixes"]}
    assert all(f["verified"] for f in fixed["fixes"]) and len(fixes) == len(PLANTED)
    assert fixes[by_op["neg"]]["kind"] == "kernel" and "ops/NegKernelOpdev.cpp" in fixes[by_op["neg"]]["files"]
    assert fixes[by_op["neg"]]["verification"]["own"] == {"passed": 2 * 16}  # adapted: passing, not skipped
    assert fixes[by_op["abs"]]["files"] == ["ops/AbsKernelOpdev.cpp"]
    assert fixes[by_op["sgn"]]["files"] == ["python/wrong_meta.py"]
    assert fixes[by_op["add"]]["flaky"] and fixes[by_op["add"]]["kind"] == "skip"
    disabled = json.loads((Path(fixed["tree"]) / "disabled_tests.json").read_text())
    assert all(k.startswith("test_") and "(__main__.Test" in k for k in disabled)
    assert {k.split()[0].rsplit("_", 1)[1] for k in disabled if "_abs_" in k} == {"float16"}
    assert all(reason.startswith("test-triage C") and platforms == [] for reason, platforms in disabled.values())
    worktree = Path(fixed["worktree"])
    log = subprocess.run(["git", "log", "--format=%s", f"{fixed['base']}..{fixed['branch']}"], cwd=worktree,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(log) == len(PLANTED)  # one commit a cluster
    changed = subprocess.run(["git", "diff", "--name-only", fixed["base"], fixed["branch"]], cwd=worktree,
                             capture_output=True, text=True, check=True).stdout.split()
    assert changed and all(p.startswith("native/") for p in changed)  # the backend's tree, nothing upstream
    assert "# opdev: 1 kernels adapted" in (out / "PR.md").read_text()
    repro = out / "clusters" / by_op["abs"] / "repro.py"
    env = {**os.environ, "OPDEV_ROOT": str(planted)}
    assert subprocess.run([sys.executable, str(repro)], env=env, capture_output=True, timeout=300).returncode == 1
    env.update(OPDEV_ROOT=fixed["tree"], DISABLED_TESTS_FILE=str(Path(fixed["tree"]) / "disabled_tests.json"))
    assert subprocess.run([sys.executable, str(repro)], env=env, capture_output=True, timeout=300).returncode == 0


def test_the_ray_executor_finds_what_the_local_one_finds(planted, tmp_path):
    # without the flaky operator (whose failures differ from run to run by design) the two runs must agree test
    # for test
    steady = [op for op in PLANTED if op != "add"]
    local = triage(tmp_path / "local", planted, ops=steady, dtypes="float32,float16")
    ray = triage(tmp_path / "ray", planted, "--executor", "ray", ops=steady, dtypes="float32,float16")
    assert ray["executor"] == "ray" and ray["tests"] == local["tests"]
    keep = ("id", "category", "rule", "operator", "tests", "dtypes", "generics", "flaky", "cpu_twins")
    assert [{k: c[k] for k in keep} for c in ray["clusters"]] == [{k: c[k] for k in keep} for c in local["clusters"]]
    assert len(local["clusters"]) == len(steady)


def test_a_wrong_reduction_and_a_hanging_collective_of_the_backends_process_group(planted, tmp_path):
    os.environ["OPDEV_ROOT"] = str(planted)
    try:
        result = runner.invoke(app, ["test-triage", "run", "--device", "opdev", "--import", "opforge.backend.device",
                                     "--suite", "collectives", "--dtypes", "float32", "--timeout", "20",
                                     "--reruns", "1", "--out", str(tmp_path)])
    finally:
        del os.environ["OPDEV_ROOT"]
    assert result.exit_code == 1, result.output
    found = json.loads((tmp_path / "triage.json").read_text())["clusters"]
    assert {c["operator"]: (c["category"], c["rule"]) for c in found} == PLANTED_COLLECTIVES
    assert all(c["cpu_twins"] == {"passed": 1} for c in found)  # gloo on the CPU computes them right
    hang = next(c for c in found if c["rule"] == "hang")
    assert "timed out" in hang["message"]
    fixed = runner.invoke(app, ["test-triage", "fix", str(tmp_path), "--tree", str(planted), "--reruns", "1"])
    assert fixed.exit_code == 0, fixed.output
    fixes = json.loads((tmp_path / "fix.json").read_text())["fixes"]
    assert [(f["kind"], f["files"], f["verified"]) for f in fixes] == \
        [("skip", ["python/process_group.py"], True)] * len(PLANTED_COLLECTIVES)
    repro = tmp_path / "clusters" / next(c["id"] for c in found if c["rule"] == "wrong-values") / "repro.py"
    env = {**os.environ, "OPDEV_ROOT": str(planted)}  # a two-rank test, alone: its ranks import the suite again
    assert subprocess.run([sys.executable, str(repro)], env=env, capture_output=True, timeout=300).returncode == 1


def test_module_tests_cluster_by_the_aten_operator_a_module_reaches(tmp_path):
    result = runner.invoke(app, ["test-triage", "run", "--device", "opdev", "--import", "opforge.backend.device",
                                 "--suite", "modules", "--ops", "nn.ReLU,nn.BatchNorm1d", "--dtypes", "float32",
                                 "--reruns", "0", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    run = json.loads((tmp_path / "triage.json").read_text())
    found = {c["operator"]: c for c in run["clusters"]}
    assert set(found) == {"aten::relu", "aten::native_batch_norm"}, found.keys()
    assert all(c["category"] == "missing_dispatch" and c["cpu_twins"] == {"passed": len(c["tests"])}
               for c in found.values())
    # BatchNorm's train and eval modes are one module: one cluster, both modes' tests in it
    assert len(found["aten::native_batch_norm"]["tests"]) == 4


def test_the_collectives_suite_selects_collectives_by_name():
    suite = Path(__file__).resolve().parents[1] / "src/opforge/skills/test_triage/suites/collectives.py"
    env = {**os.environ, "OPFORGE_TRIAGE_OPS": "broadcast,all_reduce_max", "OPFORGE_TRIAGE_DTYPES": "float32"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                          str(suite)], env=env, capture_output=True, text=True, cwd=suite.parent).stdout
    assert sorted(line.rsplit("::", 1)[1] for line in out.splitlines() if "::" in line) == [
        "test_all_reduce_max_float32", "test_broadcast_float32"]
