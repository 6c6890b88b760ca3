"""Backend registry: a name -> a lazily imported module exposing
``run(spec: RunSpec, progress=None) -> RunResult`` and, for measurements of several repeats on one engine,
``open_server(spec, progress=None)``: a server with ``warm_up(prompts)``, ``serve(prompts, progress) ->
RunResult`` (one measured pass) and ``close()`` (:func:`open_server`).

- ``native``: specexp's own engine (``specexp.backends.native``).
- ``hf``: Hugging Face transformers assisted generation, one request at a time (``specexp.backends.hf``).
- ``vllm``: vLLM (GPU machines, ``pip install specexp[vllm]``; ``specexp.backends.vllm``).

Modules are imported only when a run asks for them, so a missing optional dependency (vllm) or a backend
not written yet costs nothing until it is chosen, and then gives a one-line :class:`ConfigError`.

``progress`` is a ``specexp.engine.progress.ProgressCallback`` (the app layer's display) or None; a backend
whose ``run`` takes no ``progress`` still runs, showing none (:func:`run_backend`).
"""

from __future__ import annotations

import importlib
import inspect
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


def run_backend(module: ModuleType, spec, progress=None):
    """``module.run(spec, progress=progress)``; ``module.run(spec)`` when its run takes no ``progress``."""
    try:
        parameters = inspect.signature(module.run).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): call it the plain way
        parameters = ()
    if any(p.name == "progress" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return module.run(spec, progress=progress)
    return module.run(spec)


def open_server(module: ModuleType, spec, progress=None):
    """``module.open_server(spec, progress=progress)``: the backend's models loaded and its engine built once,
    for several measured passes; ``None`` when the backend has no servers (only ``run``). Inside a group of
    sweep points sharing one native engine (:mod:`specexp.backends.reuse`), that engine, retargeted to spec."""
    from specexp.backends import reuse

    if reuse.POOL is not None and module.__name__ == BACKENDS["native"]:  # a group of sweep points on one engine
        return reuse.POOL.open(spec, progress)
    opener = getattr(module, "open_server", None)
    return opener(spec, progress=progress) if callable(opener) else None
