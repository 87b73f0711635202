"""op-apidoc: an adapted operator's API page. Every argument is listed with its type and default exactly as
the schema has them; the description comes from torch's own docstring where there is one; the example is
run on the device and the page shows the output it printed."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from opforge.errors import OpforgeError
from opforge.i18n import LANGUAGES, N_, _, using
from opforge.skills.op_adapt.checklist import Checklist
from opforge.skills.op_adapt.texts import shown

PARAMETERS = N_("## Parameters")
PARAMETERS_HEADER = N_("| name | type | default | description |")
REQUIRED = N_("required")


class ExampleFailed(OpforgeError):
    """The page's example did not run on the device."""


def _docstring(c: Checklist) -> str:
    import torch

    fn = getattr(torch, c.name, None)
    return (getattr(fn, "__doc__", None) or "") if c.kind == "aten" else ""


def description(c: Checklist) -> str:
    """The docstring's first paragraph after its signature line, or the schema when there is none."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", _docstring(c).strip()) if p.strip()]
    body = [p for p in paragraphs[1:] if not p.startswith(("..", "Args:", "Keyword args:", "Example"))]
    return " ".join(body[0].split()) if body else f"`{c.schema}`."


def argument_docs(c: Checklist) -> dict[str, str]:
    """Each argument's description from the docstring's Args section (torch calls `self` `input` there)."""
    docs = {}
    for m in re.finditer(r"^\s+(\w+) \(([^)]*)\): (.+)$", _docstring(c), flags=re.M):
        docs["self" if m.group(1) == "input" else m.group(1)] = m.group(3).strip()
    return docs


def doc_path(c: Checklist) -> str:
    return f"docs/{c.overload_name}.md" if c.kind == "aten" else f"docs/{c.op.replace('::', '.')}.md"


def example_code(c: Checklist) -> str:
    """A small program that calls the overload on opdev with float inputs and prints the result."""
    dtype = next((d for d in c.dtypes if d.startswith("float")), c.dtypes[0])
    lines = ["import torch", "", "import opforge.backend.device  # noqa: F401  (registers opdev)", "",
             "torch.manual_seed(0)"]
    call = []
    for a in c.arguments:
        if a.default is not None or a.kwarg_only:
            continue
        if a.is_tensor:
            if dtype == "bool":
                made = "torch.rand(2, 3) > 0.5"
            elif dtype.startswith(("float", "bfloat")):
                made = f"torch.randn(2, 3, dtype=torch.{dtype})"
            else:
                low = 0 if dtype == "uint8" else -5
                made = f"torch.randint({low}, 6, (2, 3), dtype=torch.{dtype})"
            lines.append(f'{a.name} = ({made}).to("opdev")')
            call.append(a.name)
        elif a.type.startswith(("int", "Scalar")):
            call.append("1")
        elif a.type.startswith("float"):
            call.append("0.5")
        elif a.type.startswith("bool"):
            call.append("False")
    if c.kind == "aten":
        op = f"torch.ops.aten.{c.name}.{c.overload or 'default'}"
    else:
        op = f"torch.ops.{c.op.replace('::', '.')}"
    lines += [f"out = {op}({', '.join(call)})", "print(out.device, out.dtype)", "print(out.cpu())"]
    return "\n".join(lines) + "\n"


def run_example(code: str, root: Path) -> str:
    """Run `code` against the opdev tree `root` (built) and return what it printed."""
    env = {**os.environ, "OPDEV_ROOT": str(root)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExampleFailed(f"the API page's example failed on opdev: {last}")
    return proc.stdout


def pending_output() -> str:
    """What the page shows as the example's output until the operator is built and the example run."""
    return _("(runs after the build)")


def markdown(c: Checklist, code: str, output: str) -> str:
    docs = argument_docs(c)
    lines = [_("# {op} on opdev").format(op=c.op), "", description(c), "", "```", c.schema, "```", "", _(PARAMETERS),
             "", _(PARAMETERS_HEADER), "|---|---|---|---|"]
    for a in c.arguments:
        default = f"`{a.default}`" if a.default is not None else _(REQUIRED)
        lines.append(f"| {a.name} | `{a.type}` | {default} | {docs.get(a.name, '')} |")
    lines += ["", _("Returns `{type}`.").format(type=c.returns), "", _("## Dtypes"), "", ", ".join(c.dtypes), "",
              _("## Constraints"), ""]
    lines += [_("- {rule}; otherwise: `{message}`").format(rule=shown(r.text), message=r.message)
              for r in c.constraints] or [_("none")]
    lines += ["", _("## Example"), "", "```python", code.rstrip(), "```", "", _("Output (run on opdev):"), "", "```",
              output.rstrip(), "```", ""]
    return "\n".join(lines)


@lru_cache(maxsize=None)
def table_words() -> tuple[frozenset, frozenset, tuple]:
    """How a page in any language writes its parameters table: (the first three header cells, lower case; the
    words for a required argument, lower case; the section headings), for `op-adapt check` to read a page written
    in any of them."""
    headers, required, headings = set(), set(), []
    for lang in LANGUAGES:
        with using(lang):
            headers.add(tuple(x.strip().lower() for x in _(PARAMETERS_HEADER).strip().strip("|").split("|"))[:3])
            required.add(_(REQUIRED).lower())
            headings.append(_(PARAMETERS))
    return frozenset(headers), frozenset(required), tuple(dict.fromkeys(headings))
