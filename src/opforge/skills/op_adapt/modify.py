"""MODIFY mode: a change to an operator that is adapted already, touching the files that change needs.

  variant    another overload of an adapted operator (aten::ne.Scalar beside ne.Tensor): its registration, its
             function added to the operator's kernel file, its schema, tests, page and CHECKLIST
  bugfix     the kernel (and the tests and page that read the same parameters) written again from the
             CHECKLIST, after it was corrected (checklist.json is the source: edit it, then run this)
  interface  a custom operator's schema changed: every file that holds the schema, written again
  backward   a custom operator gets its backward: the backward's vendor kernel, operator, autograd and
             derivatives entry

The patch holds only the files whose text changes, so the summary names exactly the set the change touched.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from opforge.backend.custom_ops import CUSTOM_YAML, parse_schema
from opforge.errors import InputError
from opforge.skills.op_adapt import reference
from opforge.skills.op_adapt.checklist import Argument, Checklist, Conflict, Constraint, markdown
from opforge.workspace.patch import Patch

CHANGES = ("variant", "bugfix", "interface", "backward")


def load_checklist(root: Path, folder: str) -> Checklist:
    path = root / "adaptations" / folder / "checklist.json"
    try:
        data = json.loads(path.read_text())
    except OSError:
        raise InputError(str(path), "no CHECKLIST for this operator: adapt it first (without --modify)") from None
    except json.JSONDecodeError as exc:
        raise InputError(str(path), f"is not valid JSON: {exc}") from None
    data["arguments"] = [Argument(**a) for a in data["arguments"]]
    data["constraints"] = [Constraint(**r) for r in data["constraints"]]
    data["conflicts"] = [Conflict(**x) for x in data["conflicts"]]
    return Checklist(**data)


def _replace_function(text: str, c: Checklist, function: str, path: str) -> str:
    """`text` with the kernel function of `c` (its marker comment to its closing brace) replaced."""
    marker = f"// {c.op}: from adaptations/{c.overload_name}/CHECKLIST.md"
    start = text.find(marker)
    if start < 0:
        raise InputError(path, f"has no kernel function marked `{marker}`: it was not written by op-adapt")
    end = text.find("\n}\n", start)
    if end < 0:
        raise InputError(path, f"the kernel function of {c.op} does not end with a `}}` line")
    return text[:start] + function.rstrip("\n") + text[end + 2:]


def plan_bugfix(op: str, root: Path):
    from opforge.skills.op_adapt.adapt import Result
    from opforge.skills.op_apidoc import page
    from opforge.skills.op_test.generate import test_source

    name = op.removeprefix("aten::")
    c = load_checklist(root, name)
    patch = Patch(root)
    kernel = reference.kernel_file(c)
    current = patch.current(kernel)
    if current is None:
        raise InputError(str(root / kernel), "is missing: the adaptation is incomplete")
    patch.write(kernel, _replace_function(current, c, reference.kernel_function(c, root), str(root / kernel)))
    test = next(f["path"] for f in c.files if f["class"] == "test (op-test)")
    patch.write(test, test_source(c))
    patch.write(page.doc_path(c), page.markdown(c, page.example_code(c), page.pending_output()))
    patch.write(f"adaptations/{c.overload_name}/CHECKLIST.md", markdown(c))
    return Result(c, [], sorted(patch.changed()), patch.diff()), patch


def plan_variant(op: str, root: Path, confirm=None):
    from opforge.skills.op_adapt.adapt import plan_reference

    name = op.removeprefix("aten::")
    base = name.split(".")[0]
    siblings = [s for s in reference.registered(Patch(root)) if s.split(".")[0] == base]
    if not siblings:
        raise InputError(op, f"no overload of {base} is adapted in {root}: adapt it without --modify")
    return plan_reference(op, root, confirm)


def _without_custom(patch: Patch, c_op: str) -> None:
    """Take the operator (and its backward operator) out of the tree's shared files before it is planned anew."""
    ns, name = c_op.split("::")
    text = patch.current(CUSTOM_YAML) or ""
    kept = [ln for ln in text.splitlines(keepends=True)
            if not re.match(rf"- func: {re.escape(ns)}::{re.escape(name)}(_backward)?\(", ln)]
    patch.write(CUSTOM_YAML, "".join(kept))
    derivs = patch.current("derivatives.yaml")
    if derivs is not None:
        blocks = re.split(r"(?m)^(?=- name: )", derivs)
        patch.write("derivatives.yaml", "".join(b for b in blocks if not b.startswith(f"- name: {name}(")))
    baseline = json.loads(patch.current("schema.json") or "{}")
    for key in (c_op, f"{c_op}_backward"):
        baseline.pop(key, None)
    patch.write("schema.json", json.dumps(dict(sorted(baseline.items())), indent=2) + "\n")


def plan_custom_change(schema: str, reference_spec: str | None, root: Path, change: str):
    from opforge.skills.op_adapt import custom
    from opforge.skills.op_adapt.adapt import Result, _pending_doc
    from opforge.skills.op_test.generate import custom_test_source

    op = parse_schema(schema, "OP")
    qualified = f"{op.namespace}::{op.func.name.name.base}"
    old = load_checklist(root, qualified.replace("::", "."))
    c, fn, ref_path = custom.custom_checklist(schema, reference_spec)
    if change == "backward" and old.backward.get("differentiable"):
        raise InputError(c.op, "has a backward already: use --modify interface or bugfix")
    if change == "backward" and not c.backward["differentiable"]:
        raise InputError("--reference", "the reference gives no gradient to any input: there is no backward to add")
    if change == "interface" and old.schema == c.schema:
        raise InputError("OP", f"{schema} is the schema adapted already: nothing changed")
    patch = Patch(root)
    _without_custom(patch, qualified)
    custom.plan(c, fn, ref_path, patch, custom_test_source(c), _pending_doc(c))
    return Result(c, [], sorted(patch.changed()), patch.diff()), patch
