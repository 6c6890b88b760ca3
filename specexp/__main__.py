"""``python -m specexp``: see :mod:`specexp.cli`."""

import sys

from specexp.cli import main

if __name__ == "__main__":
    sys.exit(main())
