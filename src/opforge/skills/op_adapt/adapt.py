"""Adapt one operator into a backend source tree: CHECKLIST, files, build, API page, in that order.

The patch is computed whole before anything is written. If the build or the API page's example fails, every
file the patch wrote is put back as it was, so a tree never holds half an adaptation.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from opforge.backend import build
from opforge.backend.cpp import functional_overloads
from opforge.errors import InputError
from opforge.skills.op_adapt import reference, texts
from opforge.skills.op_adapt.checklist import Checklist, Conflict, aten_checklist
from opforge.skills.op_apidoc import page
from opforge.skills.op_test.generate import test_source
from opforge.workspace.patch import Patch

PROFILES = ("reference", "op-plugin")


@dataclass
class Result:
    checklist: Checklist
    dependencies: list[Checklist] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    diff: str = ""
    build: dict | None = None

    def to_json(self) -> dict:
        return {"op": self.checklist.op, "files": self.files, "checklist": self.checklist.to_json(),
                "dependencies": [d.op for d in self.dependencies], "build": self.build}


def reference_root(repo: Path | None) -> Path:
    """The opdev tree to adapt into: `repo` (a copy of the shipped tree is made there when it does not
    exist), else the shipped tree itself."""
    if repo is None:
        return build.NATIVE
    repo = repo.resolve()
    if not repo.exists():
        shutil.copytree(build.NATIVE, repo, ignore=shutil.ignore_patterns("__pycache__"))
    elif not (repo / build.BACKEND_YAML).is_file():
        raise InputError(str(repo), f"not an opdev source tree (no {build.BACKEND_YAML})")
    return repo


def plan_reference(op: str, root: Path, confirm: Callable[[Conflict], bool] | None = None) -> tuple[Result, Patch]:
    """The CHECKLIST and the whole patch; the backward's missing operators are adapted alongside when the
    vendor has kernels for them, and listed as conflicts when it does not."""
    patch = Patch(root)
    supported = set(reference.registered(patch))
    c = aten_checklist(op, root, supported)
    # The backward's operators that opdev lacks, and theirs in turn, until every one runs or cannot.
    deps: list[Checklist] = []
    todo = list(c.backward["missing"])
    planned = supported | {c.overload_name}
    while todo:
        missing = functional_overloads().get(todo.pop(0))  # an in-place form comes with its functional one
        if missing is None or missing in planned:
            continue
        planned.add(missing)
        try:
            dep = aten_checklist(missing, root, planned)
        except InputError as exc:
            c.conflicts.append(Conflict("backward", texts.BACKWARD_LACKS.format(op=missing, why=exc.what),
                                        texts.GRADIENTS_FAIL))
            continue
        deps.append(dep)
        todo += dep.backward["missing"]
    for conflict in c.conflicts:
        if confirm is not None and not confirm(conflict):
            raise InputError("--interactive", f"stopped at a conflict ({conflict.field}: {conflict.detail}); "
                                              "nothing was written")
    if deps:
        c.conflicts.append(Conflict("backward", texts.BACKWARD_LACKED.format(ops=", ".join(d.overload_name
                                                                                       for d in deps)),
                                    texts.ALONGSIDE))
    for d in deps:
        reference.plan(d, patch, test_source=test_source(d), doc_source=_pending_doc(d))
    reference.plan(c, patch, test_source=test_source(c), doc_source=_pending_doc(c))
    return Result(c, deps, sorted(patch.files), patch.diff()), patch


def _pending_doc(c: Checklist) -> str:
    # The page's example output exists only once the operator runs: plan() writes the page after the build.
    return page.markdown(c, page.example_code(c), page.pending_output())


def is_custom(op: str) -> bool:
    """A custom operator is given by its whole schema ("ns::name(Tensor x) -> Tensor"), an ATen one by name."""
    return "(" in op


def plan_custom(schema: str, reference: str | None, root: Path) -> tuple[Result, Patch]:
    from opforge.skills.op_adapt import custom
    from opforge.skills.op_test.generate import custom_test_source

    c, fn, ref_path = custom.custom_checklist(schema, reference)
    patch = Patch(root)
    custom.plan(c, fn, ref_path, patch, custom_test_source(c), _pending_doc(c))
    return Result(c, [], sorted(patch.files), patch.diff()), patch


def plan(op: str, root: Path, *, reference: str | None = None, modify: str | None = None,
         confirm: Callable[[Conflict], bool] | None = None) -> tuple[Result, Patch]:
    """The CHECKLIST and patch of one adaptation: a new operator, or with `modify` a change to an adapted one."""
    from opforge.skills.op_adapt import modify as change

    if modify is None:
        return plan_custom(op, reference, root) if is_custom(op) else plan_reference(op, root, confirm)
    if modify not in change.CHANGES:
        raise InputError("--modify", f"must be one of {', '.join(change.CHANGES)}, not {modify!r}")
    if modify in ("interface", "backward"):
        if not is_custom(op):
            raise InputError("--modify", f"{modify} changes a custom operator: give its whole new schema")
        return change.plan_custom_change(op, reference, root, modify)
    if is_custom(op):
        raise InputError("--modify", f"{modify} applies to ATen operators; a custom one changes by interface "
                                     "or backward")
    return change.plan_variant(op, root, confirm) if modify == "variant" else change.plan_bugfix(op, root)


def adapt_reference(op: str, root: Path, *, reference: str | None = None, modify: str | None = None,
                    progress=None, confirm: Callable[[Conflict], bool] | None = None) -> Result:
    return adapt_many([op], root, reference=reference, modify=modify, progress=progress, confirm=confirm)[0]


def adapt_many(ops: list[str], root: Path, *, reference: str | None = None, modify: str | None = None,
               progress=None, confirm: Callable[[Conflict], bool] | None = None) -> list[Result]:
    """Adapt each of `ops` in turn (each sees the ones before it registered), then build once: one patch."""
    results, undo = [], []
    try:
        for op in ops:
            result, patch = plan(op, root, reference=reference, modify=modify, confirm=confirm)
            undo.append(patch.apply())
            results.append(result)
        found = build.build(root, progress=progress)
        docs = Patch(root)
        for c in [c for r in results for c in (*r.dependencies, r.checklist)]:
            code = page.example_code(c)
            docs.write(page.doc_path(c), page.markdown(c, code, page.run_example(code, root)))
        docs.apply()
    except BaseException:
        for applied in reversed(undo):
            applied.revert()
        raise
    for result in results:
        result.build = {"library": str(found.library), "seconds": found.seconds, "cached": found.cached}
    return results
