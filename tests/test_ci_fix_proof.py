"""The behaviour proof and the place classifier of ci-fix, on hand-made before/after pairs."""

from __future__ import annotations

import pytest

from opforge.skills.ci_fix.edits import Text, apply_blocks, remap_lines
from opforge.skills.ci_fix.proof import prove_c, prove_doc, prove_python
from opforge.skills.ci_fix.regions import c_regions, doc_regions, kind_at, python_regions
from opforge.skills.ci_fix.whitelist import load_whitelist


def test_python_layout_and_quotes_are_proven_equal():
    before = "def f( a ):\n  return {'k':a}\nx = (1 +\n 2)\n"
    after = 'def f(a):\n    return {"k": a}\n\n\nx = 1 + 2\n'
    assert prove_python(before, after) is None


def test_python_import_removal_only_where_allowed():
    before = "import os, sys\nfrom typing import List\nprint(sys)\n"
    after = "import sys\nprint(sys)\n"
    assert prove_python(before, after, removed={(1, 7), (2, 19)}) is None
    why = prove_python(before, after, removed={(1, 7)})
    assert why and "AST changed" in why                      # List went without being allowed to
    assert "not where ruff reported" in prove_python(before, before, removed={(5, 0)})


def test_python_import_order_only_with_sorting():
    before = "import sys\nimport os\n\nx = 1\n"
    after = "import os\nimport sys\n\nx = 1\n"
    assert prove_python(before, after, sort_imports=True) is None
    assert prove_python(before, after) is not None
    # sorting never moves an import across other code
    assert prove_python("import b\nx = 1\nimport a\n", "import a\nimport b\nx = 1\n", sort_imports=True)


def test_python_string_and_code_changes_fail():
    assert "AST changed" in prove_python('x = "recieved"\n', 'x = "received"\n', subs={("recieved", "received")})
    assert "AST changed" in prove_python("if x == None:\n    pass\n", "if x is None:\n    pass\n")
    assert "AST changed" in prove_python('x = f"a"\n', 'x = "a"\n')
    assert "breaks the syntax" in prove_python("x = 1\n", "x = (1\n")


def test_python_docstring_changes_only_by_listed_words_and_whitespace():
    before = 'def f():\n    """We recieve   it.\n\n       Indented.   """\n'
    assert prove_python(before, 'def f():\n    """We receive it.\n\n    Indented."""\n',
                        subs={("recieve", "receive")}) is None
    assert "docstring changed" in prove_python(before, 'def f():\n    """We receive it. Indented."""\n'
                                               .replace("receive", "get"), subs={("recieve", "receive")})
    assert "docstring changed" in prove_python(before, 'def f():\n    """We receive it. Indented."""\n')


def test_empty_block_after_removal_is_a_pass():
    before = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import os\nx = TYPE_CHECKING\n"
    after = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nx = TYPE_CHECKING\n"
    assert prove_python(before, after, removed={(3, 11)}) is None
    before = "if x:\n    y = 1\nelse:\n    import os\n"
    after = "if x:\n    y = 1\nelse:\n    pass\n"
    assert prove_python(before, after, removed={(4, 11)}) is None
    assert prove_python(before, after) is not None


@pytest.mark.parametrize("before, after", [
    ("int f(int a,int b){return a+b;}\n", "int f(int a, int b) { return a + b; }\n"),
    ("#define F(x) \\\n  ((x)+1)\n", "#define F(x) ((x) + 1)\n"),
    ('const char *s = "ab" "cd";\n', 'const char *s = "abcd";\n'),
    ("std::vector<std::vector<int> > v;\n", "std::vector<std::vector<int>> v;\n"),
    ("int x; /* a  comment */\n", "int x; /* a comment */\n// the end\n"),
])
def test_c_whitespace_and_comments_are_equal(before, after):
    assert prove_c(before, after) is None


@pytest.mark.parametrize("before, after", [
    ("int y = a - -b;\n", "int y = a --b;\n"),
    ('const char *s = "recieved";\n', 'const char *s = "received";\n'),
    ("#define F(x) x\n", "#define F (x) x\n"),
    ("#define A 1\nint x;\n", "#define A 1 int x;\n"),
    ("#include <b.h>\n#include <a.h>\n", "#include <a.h>\n#include <b.h>\n"),
    ("unsigned int x;\n", "unsignedint x;\n"),
])
def test_c_behaviour_changes_fail(before, after):
    assert "token stream changed" in prove_c(before, after)


def test_doc_proof():
    assert prove_doc("we recieve it\n", "we receive it\n", {("recieve", "receive")}) is None
    assert prove_doc("we recieve it\n", "we get it\n", {("recieve", "receive")}) is not None


def test_regions_tell_comment_docstring_string_and_code():
    src = '"""Doc recieve."""\nx = "recieve"  # recieve\nrecieve = 1\n'
    regions = python_regions(src)
    assert kind_at(regions, 1, 8, 15, "code") == "docstring"
    assert kind_at(regions, 2, 5, 12, "code") == "string"
    assert kind_at(regions, 2, 17, 24, "code") == "comment"
    assert kind_at(regions, 3, 0, 7, "code") == "code"
    assert python_regions("def (:\n") is None
    c = '// teh\nconst char *s = "teh"; /* teh */\n'
    cr = c_regions(c)
    assert kind_at(cr, 1, 3, 6, "code") == "comment"
    assert kind_at(cr, 2, 17, 20, "code") == "string"
    assert kind_at(cr, 2, 26, 29, "code") == "comment"
    md = "Text `teh` here.\n```\nteh\n```\nteh\n"
    dr = doc_regions(md)
    assert kind_at(dr, 1, 6, 9, "prose") == "code" and kind_at(dr, 3, 0, 3, "prose") == "code"
    assert kind_at(dr, 5, 0, 3, "prose") == "prose"


def test_blocks_apply_and_changed_lines_follow_edits():
    t = Text("import os, sys\nx = 1  \ny = 2")
    blocks = [t.block([(0, 15, "")]), t.block([(20, 22, "")]), t.block([(len(t.text), len(t.text), "\n")])]
    assert apply_blocks(t.text, blocks) == "x = 1\ny = 2\n"
    with pytest.raises(ValueError):
        apply_blocks("other\n", blocks[:1])
    assert remap_lines({2}, "a\nb\nc\n", "new\na\nB\nc\n") == {3}


def test_whitelist_default_and_config(tmp_path):
    wl = load_whitelist()
    assert {"F401", "I001"} <= set(wl.ruff_rules) and "__init__.py" in wl.reexport_files
    assert wl.docstrings and not wl.clang_format_sort_includes
    cfg = tmp_path / "c.yaml"
    cfg.write_text("codespell:\n  docstrings: false\nruff_format: false\n")
    wl = load_whitelist(cfg)
    assert not wl.docstrings and not wl.ruff_format and wl.comments
