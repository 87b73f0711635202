"""`opforge test-triage fix DIR --tree TREE`: each cluster of a triage taken to a verified change.

  propose   a missing kernel the vendor library has: adapted by op-adapt. Anything else: a skip in torch's
            disabled-tests format (DISABLED_TESTS_FILE) with the reason and the evidence; for a behaviour
            mismatch the backend files that compute the operator are named for whoever fixes it for real.
            Upstream test files are never touched.
  deliver   a git branch from the tree's HEAD, in a worktree under DIR, one commit per cluster; PR.md
  verify    each cluster's tests and its neighbouring parametrisations (the same operators' other tests of
            the run) rerun `reruns` times on the branch's tree: every one passes or is skipped by its entry

A flaky cluster is skipped as flaky, never reported fixed. The tree is an opdev source tree (the reference
backend's layout: OPDEV_ROOT selects it in every test process).
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from opforge.errors import InputError
from opforge.skills.test_triage import shards as sh
from opforge.workspace.atomic import write_json_atomic, write_text_atomic

DISABLED = "disabled_tests.json"  # torch's DISABLED_TESTS_FILE format, at the tree's root


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-c", "user.name=opforge test-triage", "-c", "user.email=test-triage@opforge",
                           *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError("--tree", f"git {' '.join(args[:2])} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout.strip()


def _load(triage_dir: Path) -> tuple[dict, dict[str, dict]]:
    path = triage_dir / "triage.json"
    if not path.is_file():
        raise InputError(str(triage_dir), "holds no triage.json: run `opforge test-triage run --out` first")
    run = json.loads(path.read_text())
    results = {}
    for line in (triage_dir / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        results[r["test"]] = r
    return run, results


def locate(cluster: dict, tree: Path) -> list[str]:
    """The tree's files that compute the cluster's operator: its kernel, or for a Meta problem the Python that
    registers a Meta kernel for it."""
    op = (cluster["operator"] or "").removeprefix("aten::")
    if cluster["generics"] and all(g.startswith("TestCollectives.") for g in cluster["generics"]):
        return sorted(str(p.relative_to(tree)) for p in (tree / "python").glob("*.py")
                      if "register_backend" in p.read_text())
    if not op:
        return []
    if cluster["rule"] == "wrong-metadata":
        pattern = re.compile(rf"""["']{re.escape(op)}(\.\w+)?["']""")
        return sorted(str(p.relative_to(tree)) for p in (tree / "python").glob("*.py") if pattern.search(p.read_text()))
    pattern = re.compile(rf"OpdevNativeFunctions::{re.escape(op)}_?\(")
    return sorted(str(p.relative_to(tree)) for p in (tree / "ops").glob("*.cpp") if pattern.search(p.read_text()))


def skip_entries(tests: list[str], reason: str) -> dict[str, list]:
    """Tests as torch's disabled-tests entries: `name (module.Class)` -> [reason, platforms ([]: all)]."""
    return {f"{t.split('::')[-1]} (__main__.{t.split('::')[-2]})": [reason, []] for t in tests}


def propose(cluster: dict, tree: Path) -> dict:
    """What to change for a cluster: {"kind": "kernel", "op"} or {"kind": "skip", "reason"}, with the files that
    compute the operator."""
    from opforge.skills.op_adapt.adapt import plan

    where = locate(cluster, tree)
    if cluster["rule"] == "missing-kernel" and not cluster["flaky"]:
        op = cluster["operator"].removeprefix("aten::")
        try:
            plan(op, tree)
            return {"kind": "kernel", "op": op, "files": where,
                    "why": f"the vendor library computes {op}: op-adapt adapts it (kernel, yaml, test, doc)"}
        except InputError as exc:
            missing_because = exc.what
        reason = f"no kernel for {cluster['operator']} on the device, and op-adapt cannot adapt it: " \
                 f"{missing_because}"
    elif cluster["flaky"]:
        reason = f"flaky: failed, then passed {cluster['passed_on_rerun']} of {cluster['reruns']} reruns"
    else:
        reason = f"{cluster['category']} ({cluster['rule']}): {cluster['why']}"
    return {"kind": "skip", "reason": f"test-triage {cluster['id']}: {reason}", "files": where,
            "why": "skipped declaratively until " + (f"{', '.join(where)} is fixed" if where else "it is fixed")}


def _neighbours(cluster: dict, results: dict[str, dict]) -> list[str]:
    """The run's tests of the cluster's operators (all their dtypes and checks), the cluster's own first."""
    ops = set(cluster["ops"]) | ({cluster["operator"].removeprefix("aten::")} if cluster["operator"] else set())
    around = [t for t, r in results.items() if r.get("op") in ops and t not in cluster["tests"]]
    return cluster["tests"] + around


def fix(triage_dir: Path, tree: Path, *, reruns: int = 3, workers: int = 2, timeout: float = 120.0,
        progress=None) -> dict:
    from opforge.backend import build
    from opforge.skills.op_adapt.adapt import adapt_reference

    run, results = _load(triage_dir)
    if not (tree / build.BACKEND_YAML).is_file():
        raise InputError("--tree", f"{tree} is not an opdev source tree (no {build.BACKEND_YAML})")
    top = Path(_git(tree, "rev-parse", "--show-toplevel"))
    rel = tree.resolve().relative_to(top.resolve())
    if _git(top, "status", "--porcelain", "--", str(rel)):
        raise InputError("--tree", f"{tree} has uncommitted changes: commit or stash them (the fixes branch "
                                   "from HEAD)")
    start = time.monotonic()
    branch = f"triage-{run['device']}-{time.strftime('%Y%m%d-%H%M%S')}"
    worktree = (triage_dir / "branch").resolve()
    _git(top, "worktree", "add", "-q", "-b", branch, str(worktree), "HEAD")
    fixed_tree = worktree / rel
    fixes = []
    for cluster in run["clusters"]:
        proposal = propose(cluster, fixed_tree)
        if proposal["kind"] == "kernel":
            proposal["files"] = adapt_reference(proposal["op"], fixed_tree).files
            subject = f"Adapt {proposal['op']} (test-triage {cluster['id']}, {cluster['size']} tests)"
        else:
            disabled = fixed_tree / DISABLED
            entries = json.loads(disabled.read_text()) if disabled.is_file() else {}
            # a flaky operator may fail in any of its tests, not only in those that failed this time
            skipped = _neighbours(cluster, results) if cluster["flaky"] else cluster["tests"]
            entries.update(skip_entries(skipped, proposal["reason"]))
            write_json_atomic(disabled, dict(sorted(entries.items())))
            subject = f"Skip {cluster['operator'] or cluster['tests'][0].split('::')[-1]}: {cluster['category']} " \
                      f"(test-triage {cluster['id']}, {cluster['size']} tests)"
        _git(worktree, "add", "-A", "--", str(rel))
        _git(worktree, "commit", "-q", "-m", subject, "-m", proposal["why"] + ".\n\n" + cluster["signature"])
        proposal.update(cluster=cluster["id"], commit=_git(worktree, "rev-parse", "--short", "HEAD"),
                        subject=subject)
        fixes.append(proposal)
        if progress:
            progress(1, len(run["clusters"]), "fixes")

    # verify: each cluster with its neighbours on the branch's tree, `reruns` times
    env = {"OPFORGE_TRIAGE_DEVICE": run["device"], "OPFORGE_TRIAGE_IMPORT": ",".join(run["imports"]),
           "OPFORGE_TRIAGE_OPS": run["ops"], "OPFORGE_TRIAGE_DTYPES": run["dtypes"],
           "OPDEV_ROOT": str(fixed_tree), "DISABLED_TESTS_FILE": str(fixed_tree / DISABLED)}
    targets = {c["id"]: _neighbours(c, results) for c in run["clusters"]}
    every = sorted({t for ts in targets.values() for t in ts})
    batch = [sh.Shard(i, g, run["file"], env, timeout, False)
             for i, g in enumerate([g for _ in range(reruns) for g in sh.split(every, workers)])]
    outcomes: dict[str, list[str]] = {}
    for s in sh.run_local(batch, workers, done=(lambda r: progress(len(r["results"]), len(every) * reruns,
                                                                   "verification")) if progress else None):
        for r in s["results"]:
            outcomes.setdefault(r["test"], []).append(r["outcome"])
    for f, cluster in zip(fixes, run["clusters"]):
        own = {t: outcomes.get(t, []) for t in cluster["tests"]}
        around = {t: outcomes.get(t, []) for t in targets[cluster["id"]] if t not in own}
        # a neighbour that passed in the run and now fails every time is broken by the branch; one that fails
        # some of the time is unstable (another cluster's flaky operator it calls, say) and is reported
        was_fine = [t for t in around if results[t]["outcome"] in ("passed", "skipped")]
        broken = sorted(t for t in was_fine if around[t] and all(x in ("failed", "error") for x in around[t]))
        unstable = sorted(t for t in was_fine if t not in broken and any(x in ("failed", "error") for x in around[t]))
        settled = all(o and all(x in ("passed", "skipped") for x in o) for o in own.values())
        f["verified"] = settled and not broken and len(own) > 0
        f["verification"] = {"tests": len(own), "neighbours": len(around), "reruns": reruns,
                             "own": _tally(own), "neighbours_now": _tally(around), "broken_neighbours": broken,
                             "unstable_neighbours": unstable}
        f["flaky"] = cluster["flaky"]
    base = _git(top, "rev-parse", "--short", "HEAD")
    result = {"branch": branch, "worktree": str(worktree), "tree": str(fixed_tree), "base": base, "reruns": reruns,
              "fixes": fixes, "verified": sum(f["verified"] for f in fixes),
              "wall_s": round(time.monotonic() - start, 1)}
    write_text_atomic(triage_dir / "PR.md", pr_markdown(run, result))
    write_json_atomic(triage_dir / "fix.json", result)
    return result


def _tally(outcomes: dict[str, list[str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes.values():
        for x in o:
            out[x] = out.get(x, 0) + 1
    return out


def pr_markdown(run: dict, result: dict) -> str:
    kernels = [f for f in result["fixes"] if f["kind"] == "kernel"]
    skips = [f for f in result["fixes"] if f["kind"] == "skip"]
    lines = [f"# {run['device']}: {len(kernels)} kernels adapted, {len(skips)} clusters skipped with their reasons",
             "", f"From `opforge test-triage` on {run['tests']} tests of `{Path(run['file']).name}`: "
             f"{run['failed']} failures in {len(run['clusters'])} clusters. One commit a cluster on "
             f"`{result['branch']}`; each verified by rerunning its tests and its operators' other tests "
             f"{result['reruns']} times on this branch. No upstream test file is changed: skips are entries of "
             f"`{DISABLED}` (torch's DISABLED_TESTS_FILE format).", "",
             "| commit | cluster | change | tests | verified | files that compute it |", "|---|---|---|---|---|---|"]
    for f in result["fixes"]:
        v = f["verification"]
        mark = "yes" if f["verified"] else "no"
        if f["flaky"]:
            mark += " (flaky: skipped, not fixed)"
        lines.append(f"| {f['commit']} | {f['cluster']} | {f['subject']} | {v['tests']} + {v['neighbours']} around | "
                     f"{mark} | {', '.join(f'`{x}`' for x in f['files'])} |")
    lines += ["", "Reproduce a cluster alone: `python clusters/CNNN/repro.py` (exit 1 while it fails)."]
    return "\n".join(lines) + "\n"
