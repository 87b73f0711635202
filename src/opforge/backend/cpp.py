"""An indented buffer for writing C++ source, and the torchgen tables that C++ generators read."""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path


class CppBuffer:
    """Lines of C++ at the current indentation; `block` opens a brace and closes it on exit."""

    def __init__(self, indent: str = "  "):
        self._lines: list[str] = []
        self._depth = 0
        self._indent = indent

    def line(self, text: str = "") -> None:
        self._lines.append(f"{self._indent * self._depth}{text}" if text else "")

    def lines(self, text: str) -> None:
        for ln in text.strip("\n").splitlines():
            self.line(ln)

    @contextlib.contextmanager
    def block(self, opener: str, closer: str = "}", *, indent: bool = True):
        """`opener {` ... `closer`; a namespace's body is not indented (indent=False), as C++ style has it."""
        self.line(f"{opener} {{")
        self._depth += indent
        try:
            yield
        finally:
            self._depth -= indent
            self.line(closer)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def torchgen_root() -> Path:
    import torchgen

    return Path(torchgen.__file__).parent / "packaged" / "ATen"


@functools.lru_cache(maxsize=1)
def native_functions() -> dict:
    """Every ATen overload by name ("add.out"), parsed by torchgen from the installed torch."""
    from torchgen.gen import parse_native_yaml

    root = torchgen_root() / "native"
    parsed = parse_native_yaml(str(root / "native_functions.yaml"), str(root / "tags.yaml"))
    return {str(f.func.name): f for f in parsed.native_functions}


@functools.lru_cache(maxsize=1)
def functional_overloads() -> dict[str, str]:
    """Each in-place or out= ATen overload's functional overload ("sub_.Tensor" -> "sub.Tensor")."""
    from torchgen.gen import get_grouped_native_functions as grouped
    from torchgen.model import NativeFunctionsGroup

    table = {}
    for g in grouped(list(native_functions().values())):
        if isinstance(g, NativeFunctionsGroup):
            for f in g.functions():
                table[str(f.func.name)] = str(g.functional.func.name)
    return table


@functools.lru_cache(maxsize=1)
def out_overloads() -> dict[str, str]:
    """Each functional or in-place ATen overload's out= overload ("add.Tensor" -> "add.out")."""
    from torchgen.gen import get_grouped_native_functions as grouped
    from torchgen.model import NativeFunctionsGroup

    table = {}
    for g in grouped(list(native_functions().values())):
        if isinstance(g, NativeFunctionsGroup):
            out = str(g.out.func.name)
            for f in g.functions():
                table[str(f.func.name)] = out
    return table
