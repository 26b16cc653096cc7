"""``python -m collio.bench``: the same as the ``collio-bench`` command."""

import sys

from .cli import main

sys.exit(main())
