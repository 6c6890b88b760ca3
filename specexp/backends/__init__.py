"""Backend registry: a name -> a lazily imported module exposing ``run(spec: RunSpec) -> RunResult``.

- ``native``: specexp's own engine (``specexp.backends.native``).
- ``hf``: Hugging Face transformers assisted generation, one request at a time (``specexp.backends.hf``).
- ``vllm``: vLLM (GPU machines, ``pip install specexp[vllm]``; ``specexp.backends.vllm``).

Modules are imported only when a run asks for them, so a missing optional dependency (vllm) or a backend
not written yet costs nothing until it is chosen, and then gives a one-line :class:`ConfigError`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from specexp.errors import ConfigError

BACKENDS: dict[str, str] = {
    "native": "specexp.backends.native",
    "hf": "specexp.backends.hf",
    "vllm": "specexp.backends.vllm",
}


def check_backend_name(name: str) -> None:
    """:class:`ConfigError` unless ``name`` is a registered backend."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend '{name}': choose one of {', '.join(sorted(BACKENDS))}")


def get_backend(name: str) -> ModuleType:
    """Import and return the backend module ``name`` (it has ``run(spec) -> RunResult``)."""
    check_backend_name(name)
    module_name = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        reason = f"{type(e).__name__}: {e}".splitlines()[0]
        raise ConfigError(f"backend '{name}' is not available: importing {module_name} failed ({reason})") from e
    if not callable(getattr(module, "run", None)):
        raise ConfigError(f"backend '{name}' is not available: {module_name} has no run(spec) function")
    return module
