"""`python -m fuzz [--seconds N] [--targets a,b] [--json]`."""

import sys

from fuzz._runner import main

sys.exit(main())
