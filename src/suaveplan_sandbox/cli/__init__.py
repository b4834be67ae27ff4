"""The `suaveplan-sandbox` command line."""

from suaveplan_sandbox.cli._main import main

__all__ = ["main"]
