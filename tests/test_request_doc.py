"""docs/request.md and the validator's table of keys (opforge.request.FORMAT) say the same thing: every key the
validator takes is documented, every documented field is taken, and every example in the page loads."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from opforge.request import FORMAT, dim_symbols, format_fields, load_request

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "request.md"
TEXT = DOC.read_text()
SNIPPETS = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", TEXT, re.S)]
FULL = next(s for s in SNIPPETS if "name" in s and "inputs" in s)
# the mappings whose keys the user names: inputs -> <name>, tolerance -> <dtype>
NAMED = dict(m.split(".", 1) for m in FORMAT if "." in m)
REFERENCE = "import torch\n\n\ndef forward(*tensors, **attrs):\n    return tensors[0]\n"


def documented_fields() -> list[str]:
    """The first column of the Fields table."""
    section = TEXT.split("\n## Fields\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.M)


def paths(doc: dict) -> set[str]:
    """The fields a request uses, in the table's terms (inputs.x.dtype -> inputs.<name>.dtype)."""
    out = set()
    for k, v in doc.items():
        out.add(k)
        if k in NAMED:
            out |= {f"{k}.{NAMED[k]}.{kk}" for entry in (v or {}).values() for kk in (entry or {})}
        elif isinstance(v, dict):
            out |= {f"{k}.{kk}" for kk in v}
    return out


def test_every_allowed_key_is_documented_and_nothing_else():
    doc = documented_fields()
    assert len(doc) == len(set(doc)), "a field is documented twice"
    assert set(format_fields()) - set(doc) == set(), "allowed by the validator, missing from docs/request.md"
    assert set(doc) - set(format_fields()) == set(), "documented, but the validator refuses it"


def test_every_field_has_a_section_with_an_example():
    headings = {name for h in re.findall(r"^#{2,3} (.+)$", TEXT, re.M) for name in h.replace("\\", "").split(", ")}
    for f in format_fields():
        parts = f.split(".")
        # its own section, or its mapping's (attributes.<name>.type is told under attributes)
        assert any(".".join(parts[:i]) in headings for i in range(len(parts), 0, -1)), f"no section for {f}"
        assert any(f in paths(s) for s in SNIPPETS), f"no example uses {f}"


def test_complete_example_uses_every_field_and_loads(tmp_path):
    assert paths(FULL) == set(format_fields())
    (tmp_path / "request.yaml").write_text(yaml.safe_dump(FULL, sort_keys=False))
    (tmp_path / "reference.py").write_text(REFERENCE)
    req = load_request(tmp_path)
    assert req.deterministic and req.perf_target == {"speedup_vs_eager": 2.0}


@pytest.mark.parametrize("k", range(len(SNIPPETS)))
def test_every_example_is_accepted(tmp_path, k):
    """Each snippet, put into a minimal request (shapes bound to its symbols), passes the validator."""
    snippet = SNIPPETS[k]
    doc = {key: FULL[key] for key in ("name", "description", "category", "inputs", "reference")}
    doc.update(copy.deepcopy(snippet))
    if "shapes" in snippet and "inputs" not in snippet:  # a shapes example: inputs that use its symbols
        doc["inputs"] = {"x": {"shape": list(snippet["shapes"]["p0"][0]), "dtype": "float32"}}
    elif "shapes" not in snippet:
        syms = dict.fromkeys(s for spec in doc["inputs"].values() for d in spec["shape"] for s in dim_symbols(d))
        doc["shapes"] = {"p0": [{s: 64 for s in syms}]}
    (tmp_path / "request.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "reference.py").write_text(REFERENCE)
    load_request(tmp_path)


def test_readme_points_to_the_format():
    assert "docs/request.md" in (ROOT / "README.md").read_text()
