"""Release mode: every operator overload that differs between two torch releases' native_functions.yaml.

A release is named by a native_functions.yaml, a torch wheel, a folder holding an installed torch (a venv or
site-packages), a PyTorch checkout, a git revision of `--repo`, or the installed torch's version.
"""

from __future__ import annotations

import re
import subprocess
import time
import zipfile
from collections import Counter
from pathlib import Path

from opforge.errors import InputError
from opforge.skills.pr_analysis.areas import LEVELS, NATIVE_FUNCTIONS
from opforge.skills.pr_analysis.grade import grade_op
from opforge.skills.pr_analysis.profile import Profile
from opforge.skills.pr_analysis.schema_diff import diff_native, split_native

PACKAGED = "torchgen/packaged/ATen/native/native_functions.yaml"


def installed_yaml() -> Path:
    import torchgen

    return Path(torchgen.__file__).resolve().parent / "packaged" / "ATen" / "native" / "native_functions.yaml"


def _check_text(flag: str, where: str, text: str) -> str:
    if "func:" not in text:
        raise InputError(flag, f"{where} is not a native_functions.yaml (no '- func:' entries)")
    return text


def load_release(flag: str, spec: str, repo: Path | None = None) -> tuple[dict, str]:
    """({label, source, version}, yaml text) of one release."""
    path = Path(spec)
    if path.is_file() and path.suffix == ".whl":
        try:
            with zipfile.ZipFile(path) as z:
                text = z.read(PACKAGED).decode("utf-8")
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise InputError(flag, f"{path} is not a torch wheel with {PACKAGED}: {exc}") from None
        m = re.match(r"torch-([^-]+)-", path.name)
        return {"label": path.name, "source": str(path), "version": m.group(1) if m else None}, \
            _check_text(flag, str(path), text)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(flag, f"cannot read {path}: {exc}") from None
        return {"label": path.name, "source": str(path), "version": None}, _check_text(flag, str(path), text)
    if path.is_dir():
        found = [path / PACKAGED, path / NATIVE_FUNCTIONS] + sorted(path.glob(f"lib/python3*/site-packages/{PACKAGED}"))
        for cand in found:
            if cand.is_file():
                return {"label": str(path), "source": str(cand), "version": None}, \
                    _check_text(flag, str(cand), cand.read_text(encoding="utf-8"))
        raise InputError(flag, f"no native_functions.yaml under {path}")
    import torch

    installed = torch.__version__.split("+")[0]
    if spec in ("installed", torch.__version__, installed):
        p = installed_yaml()
        return {"label": f"torch {torch.__version__} (installed)", "source": str(p), "version": installed}, \
            p.read_text(encoding="utf-8")
    if repo is not None:
        r = subprocess.run(["git", "-C", str(repo), "show", f"{spec}:{NATIVE_FUNCTIONS}"], capture_output=True,
                           text=True, encoding="utf-8", errors="replace")
        if r.returncode == 0:
            return {"label": f"{spec} ({repo})", "source": f"{repo}@{spec}", "version": spec}, \
                _check_text(flag, spec, r.stdout)
    raise InputError(flag, f"{spec!r} is neither a file, a folder, a git revision of --repo, nor the installed "
                           f"torch ({installed})")


def release_diff(a: str, b: str, profile: Profile, repo: Path | None = None) -> dict:
    t0 = time.perf_counter()
    src_a, text_a = load_release("--from-torch", a, repo)
    src_b, text_b = load_release("--to-torch", b, repo)
    changes = diff_native(text_a, text_b)
    ops = []
    for ch in changes:
        level, why, sugg = grade_op(ch, profile)
        d = ch.to_dict()
        d.update(impact=level, why=why, suggestion=sugg, implemented=profile.implements(ch.old_op or ch.op))
        ops.append(d)
    by_change = Counter(o["change"] for o in ops)
    by_kind: Counter = Counter()
    for o in ops:
        by_kind.update(k.split(":")[0] for k in o["kinds"])
    by_impact = Counter(o["impact"] for o in ops)
    return {
        "mode": "release",
        "from": src_a, "to": src_b,
        "profile": profile.to_dict(),
        "summary": {
            "overloads_from": len(split_native(text_a)),
            "overloads_to": len(split_native(text_b)),
            "added": by_change.get("added", 0), "removed": by_change.get("removed", 0),
            "renamed": by_change.get("renamed", 0), "changed": by_change.get("changed", 0),
            "schema_differs": sum(o["schema_differs"] for o in ops),
            "by_kind": dict(by_kind.most_common()),
            "by_impact": {lv: by_impact.get(lv, 0) for lv in reversed(LEVELS)},
            "elapsed_s": round(time.perf_counter() - t0, 3),
        },
        "rows": [],
        "operators": ops,
    }
