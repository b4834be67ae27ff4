"""`python -m suaveplan_sandbox.cli`."""

from suaveplan_sandbox.cli._main import main

raise SystemExit(main())
