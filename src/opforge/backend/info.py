"""What an opdev source tree implements: its registered operators and its vendor kernels."""
from __future__ import annotations

from pathlib import Path

import yaml

from opforge.backend import DEVICE, IMPORT, build, custom_ops, vendor
from opforge.errors import InputError


def backend_yaml(root: Path) -> dict:
    path = Path(root) / build.BACKEND_YAML
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(str(path), f"cannot read the backend yaml: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise InputError(str(path), f"is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or data.get("backend") != "PrivateUse1":
        raise InputError(str(path), "is not a PrivateUse1 backend yaml (needs `backend: PrivateUse1`)")
    return data


def describe(root: Path = build.NATIVE) -> dict:
    root = Path(root).resolve()
    data = backend_yaml(root)
    found = build.cached(root)
    kernels = vendor.load_kernels(root / "vendor" / "kernels.yaml")
    return {
        "device": DEVICE,
        "import": IMPORT,
        "root": str(root),
        "built": found is not None,
        "build_dir": str(build.build_dir(root)),
        "library": str(found.library) if found else None,
        "operators": list(data.get("supported") or []),
        "autograd": list(data.get("autograd") or []),
        "custom_operators": [op.qualified for op in custom_ops.load(root)],
        "vendor_kernels": [{"name": k.name, "aten": k.aten, "dtypes": list(k.dtypes)} for k in kernels.values()],
    }
