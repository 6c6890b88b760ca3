"""``python -m specexp``: see :mod:`specexp.cli`.

``python -m`` puts the working directory first on ``sys.path``. Run from the parent of a clone named
``specexp``, that folder (no ``__init__.py``) is imported as a namespace package in place of specexp when
the package was installed through a finder that comes after the path search (setuptools' editable
installs of flat layouts before specexp set ``package-dir``): the submodules still load, but
``specexp.__version__`` and the package's own files are missing. Then the command runs again in a fresh
interpreter with ``-P`` (the working directory left off ``sys.path``), which finds the real package.
"""

import os
import sys

import specexp

if __name__ == "__main__":
    if getattr(specexp, "__file__", None) is None and not sys.flags.safe_path:
        os.execv(sys.executable, [sys.executable, "-P", "-m", "specexp", *sys.argv[1:]])
    from specexp.cli import main

    sys.exit(main())
