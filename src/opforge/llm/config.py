"""Provider configuration: which endpoint, which model, and the name of the environment variable holding the key.

```yaml
provider: openai                  # openai (any OpenAI-compatible server: vLLM, Ollama, llama.cpp) | anthropic
base_url: http://127.0.0.1:8000/v1 # optional for the hosted APIs
model: qwen2.5-coder-32b
api_key_env: OPENAI_API_KEY       # the key itself never goes in this file
```

Looked up in order: `--llm-config PATH`, `$OPFORGE_LLM_CONFIG`, `./opforge-llm.yaml`, `~/.config/opforge/llm.yaml`.
The key is read from the environment only when a provider is built, and is never written anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml

from opforge.errors import InputError

PROVIDERS = ("openai", "anthropic")
CONFIG_ENV = "OPFORGE_LLM_CONFIG"
LOCAL_NAME = "opforge-llm.yaml"
_LIMITS = {"timeout_s": (1, 3600), "max_tokens": (64, 200_000), "max_turns": (1, 100), "code_timeout_s": (5, 7200)}


@dataclass(frozen=True)
class LlmConfig:
    provider: str
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 120.0
    max_tokens: int = 8192
    temperature: float = 0.0
    max_turns: int = 12  # model replies per attempt, tool calls included
    code_timeout_s: int = 900  # wall-clock limit on a run of model-written code
    source: str = field(default="", compare=False)

    def api_key(self) -> str | None:
        """The key from the named environment variable (None when no variable is named)."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise InputError(f"{self.source}: api_key_env", f"environment variable {self.api_key_env} is not set")
        return key

    def public(self) -> dict:
        """What may be written to events and reports: no key, no credentials in the URL."""
        url = self.base_url
        if url:
            parts = urlsplit(url)
            url = urlunsplit((parts.scheme, parts.hostname + (f":{parts.port}" if parts.port else "")
                              if parts.hostname else parts.netloc, parts.path, "", ""))
        return {"provider": self.provider, "model": self.model, "base_url": url, "api_key_env": self.api_key_env}


def find_config(path: str | os.PathLike | None) -> Path | None:
    if path:
        return Path(path)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    for p in (Path.cwd() / LOCAL_NAME, Path.home() / ".config" / "opforge" / "llm.yaml"):
        if p.is_file():
            return p
    return None


def load_config(path: str | os.PathLike | None, *, required: bool = True) -> LlmConfig | None:
    """The configuration, checked field by field (InputError naming the field); None when none exists and
    none is required."""
    p = find_config(path)
    if p is None:
        if not required:
            return None
        raise InputError("--llm-config", f"no model configured: pass --llm-config FILE, set ${CONFIG_ENV}, or "
                                         f"create ./{LOCAL_NAME} (provider, model, base_url, api_key_env)")
    where = str(p)
    try:
        doc = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise InputError(where, "no such file") from None
    except yaml.YAMLError as exc:
        raise InputError(where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(doc, dict):
        raise InputError(where, "must be a mapping of fields (provider, model, ...)")
    if "api_key" in doc:
        raise InputError(f"{where}: api_key", "keys never go in the config file; name an environment variable "
                                              "in api_key_env instead")
    known = {"provider", "model", "base_url", "api_key_env", "temperature", *_LIMITS}
    extra = sorted(set(doc) - known)
    if extra:
        raise InputError(f"{where}: {extra[0]}", f"unknown field (known: {', '.join(sorted(known))})")
    provider = doc.get("provider")
    if provider not in PROVIDERS:
        raise InputError(f"{where}: provider", f"{provider!r} is not one of {', '.join(PROVIDERS)}")
    model = doc.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InputError(f"{where}: model", "missing or not a string")
    base_url = doc.get("base_url")
    if base_url is not None:
        parts = urlsplit(str(base_url))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InputError(f"{where}: base_url", f"{base_url!r} is not an http(s) URL")
    key_env = doc.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not key_env.replace("_", "").isalnum()):
        raise InputError(f"{where}: api_key_env", "must be the name of an environment variable")
    if key_env is None and base_url is None:
        raise InputError(f"{where}: api_key_env", "a hosted API needs a key: name its environment variable")
    kw = {}
    for k, (lo, hi) in _LIMITS.items():
        if k in doc:
            v = doc[k]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
                raise InputError(f"{where}: {k}", f"must be a number in [{lo}, {hi}]")
            kw[k] = v
    if "temperature" in doc:
        t = doc["temperature"]
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t <= 2:
            raise InputError(f"{where}: temperature", "must be a number in [0, 2]")
        kw["temperature"] = float(t)
    cfg = LlmConfig(provider=provider, model=model.strip(), base_url=str(base_url) if base_url else None,
                    api_key_env=key_env, source=where, **kw)
    cfg.api_key()  # a named variable that is not set is a configuration error, found before any run
    return cfg
