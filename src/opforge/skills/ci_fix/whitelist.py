"""The whitelist: which fixes ci-fix may apply. The default lives in whitelist.yaml beside this module."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from opforge.errors import InputError
from opforge.i18n import Msg, data_texts

DEFAULT_FILE = Path(__file__).with_name("whitelist.yaml")
CODESPELL_KEYS = {"comments": bool, "docstrings": bool, "docs": list}
# whitelist.yaml's own reasons are in the catalogs (opforge.i18n.DATA_TEXTS): the report shows them translated; a
# reason of one's own --config is shown as written
DEFAULT_REASONS = frozenset(text for _line, text in data_texts(DEFAULT_FILE, ("ruff_rules",)))


@dataclass
class Whitelist:
    ruff_rules: dict[str, str]
    reexport_files: list[str] = field(default_factory=lambda: ["__init__.py"])
    ruff_format: bool = True
    clang_format: bool = True
    clang_format_sort_includes: bool = False
    comments: bool = True
    docstrings: bool = True
    docs: list[str] = field(default_factory=list)

    def ruff_reason(self, code: str) -> str | None:
        reason = self.ruff_rules.get(code)
        return Msg(reason) if reason in DEFAULT_REASONS else reason

    def to_dict(self) -> dict:
        return {"ruff_rules": dict(self.ruff_rules), "reexport_files": list(self.reexport_files),
                "ruff_format": self.ruff_format, "clang_format": self.clang_format,
                "clang_format_sort_includes": self.clang_format_sort_includes,
                "codespell": {"comments": self.comments, "docstrings": self.docstrings, "docs": list(self.docs)}}


def _read(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(path), "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise InputError(str(path), f"not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(str(path), "must be a mapping of whitelist keys")
    return data


def _check(where: str, value, kind):
    if kind is bool and not isinstance(value, bool):
        raise InputError(where, f"must be true or false, got {value!r}")
    if kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise InputError(where, f"must be a list of strings, got {value!r}")
    return value


def _merge(base: dict, over: dict, source: str) -> dict:
    merged = dict(base)
    simple = {"reexport_files": list, "ruff_format": bool, "clang_format": bool, "clang_format_sort_includes": bool}
    for key, value in over.items():
        where = f"{source}: {key}"
        if key == "ruff_rules":
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in value.items()):
                raise InputError(where, "must map rule codes to the reason their fix is safe")
            merged[key] = {k.strip().upper(): v for k, v in value.items()}
        elif key == "codespell":
            if not isinstance(value, dict):
                raise InputError(where, "must be a mapping with comments, docstrings, docs")
            cs = dict(merged.get("codespell", {}))
            for k, v in value.items():
                if k not in CODESPELL_KEYS:
                    raise InputError(f"{where}.{k}", f"unknown key; expected one of {sorted(CODESPELL_KEYS)}")
                cs[k] = _check(f"{where}.{k}", v, CODESPELL_KEYS[k])
            merged[key] = cs
        elif key in simple:
            merged[key] = _check(where, value, simple[key])
        else:
            raise InputError(where, f"unknown key; expected one of {sorted([*simple, 'ruff_rules', 'codespell'])}")
    return merged


def load_whitelist(config: Path | None = None) -> Whitelist:
    """The default whitelist, with the keys of `config` (when given) replacing the default's."""
    data = _merge({}, _read(DEFAULT_FILE), "whitelist.yaml")
    if config is not None:
        data = _merge(data, _read(Path(config)), str(config))
    cs = data.get("codespell", {})
    docs = [d if d.startswith(".") else "." + d for d in cs.get("docs", [])]
    return Whitelist(ruff_rules=data.get("ruff_rules", {}), reexport_files=data.get("reexport_files", []),
                     ruff_format=data.get("ruff_format", True), clang_format=data.get("clang_format", True),
                     clang_format_sort_includes=data.get("clang_format_sort_includes", False),
                     comments=cs.get("comments", True), docstrings=cs.get("docstrings", True), docs=docs)
