"""The package's shape: source files that fit in one sitting, and an engine that runs on a bare PyTorch install.

`specexp/engine` and `specexp/models` import only torch, safetensors, tokenizers, triton, numpy, the standard
library and specexp (the GPU machine has nothing else), and of specexp only the layers at or below their own:
the engine imports the engine and the models, the models import the models. Every import counts: at the top
of a module, inside a function (a lazy import), and `importlib.import_module("name")` with a literal name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import specexp

PACKAGE = Path(specexp.__file__).parent
MAX_LINES = 500
ALLOWED_THIRD_PARTY = {"torch", "safetensors", "tokenizers", "triton", "numpy"}
SPECEXP_LAYERS = {"engine": ("specexp.engine", "specexp.models"), "models": ("specexp.models",)}


def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, wherever it sits, in line order; relative
    imports are resolved against `package` (the dotted package the source's module is in)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                found.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
            else:
                found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
                   or isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))):
            found.append((node.lineno, node.args[0].value))
    return sorted(found)


def file_imports(path: Path) -> list[tuple[int, str]]:
    """`imported_modules` of the package file at `path`."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    return imported_modules(path.read_text(), package)


def test_no_source_file_is_over_500_lines():
    files = _python_files(PACKAGE)
    assert len(files) > 20
    too_long = {str(p.relative_to(PACKAGE.parent)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not too_long, f"over {MAX_LINES} lines (split them along their seams): {too_long}"


@pytest.mark.parametrize("layer", sorted(SPECEXP_LAYERS))
def test_engine_and_models_import_only_torch_safetensors_tokenizers_triton_numpy_stdlib_and_specexp(layer):
    files = _python_files(PACKAGE / layer)
    assert files
    bad = []
    for path in files:
        for line, module in file_imports(path):
            top = module.split(".")[0]
            if top not in ALLOWED_THIRD_PARTY | {"specexp"} and top not in sys.stdlib_module_names:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer", sorted(SPECEXP_LAYERS))
def test_engine_and_models_import_no_specexp_layer_above_them(layer):
    allowed = SPECEXP_LAYERS[layer]
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
           for path in _python_files(PACKAGE / layer)
           for line, module in file_imports(path)
           if module.split(".")[0] == "specexp" and not any(module == a or module.startswith(a + ".") for a in allowed)]
    assert not bad, "\n".join(bad)


def test_the_import_scan_sees_lazy_relative_and_importlib_imports():
    """The scan is what the tests above rely on: a lazy import, a relative one and import_module all count."""
    source = ("import torch\n"
              "from . import cudagraph\n"
              "from ..models.config import X\n"
              "def f():\n"
              "    import tqdm\n"
              "    import importlib\n"
              "    return importlib.import_module('pandas')\n")
    found = [module for _, module in imported_modules(source, "specexp.engine")]
    assert found == ["torch", "specexp.engine", "specexp.models.config", "tqdm", "importlib", "pandas"]
