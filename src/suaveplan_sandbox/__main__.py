"""`python -m suaveplan_sandbox`: the `suaveplan-sandbox` command line.

The CLI is imported only here, never by `import suaveplan_sandbox`, and only when run as a
script (importing this module, as a tool walking the package would, runs nothing).
"""

if __name__ == "__main__":
    from suaveplan_sandbox.cli import main

    raise SystemExit(main())
