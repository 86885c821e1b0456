"""`python -m reconciler.cli ...`: the `fleet` command without its console script (CI, subprocess tests)."""

import sys

from reconciler.cli import main

sys.exit(main())
