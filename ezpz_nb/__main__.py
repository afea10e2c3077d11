"""``python -m ezpz_nb``: the ``ezpz-nb`` command line (see :mod:`ezpz_nb.cli`)."""

import sys

from ezpz_nb.cli import main

if __name__ == "__main__":
    sys.exit(main())
