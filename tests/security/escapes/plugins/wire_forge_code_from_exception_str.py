# mypy: ignore-errors
# Technique: the runtime translated a plugin's own exception with `str(exc)[:500]`, which
# runs the plugin's `__str__` inside that translation: a `SuaveplanError` raised there left
# the translation unchecked, so the worker sent any code (`SAND_FS_NOT_FOUND`, ...) with the
# plugin's message and details; the host re-codes only host-only codes and denials. The same
# went for a `NameError` subclass's `name` and a `SuaveplanError` subclass's `code`. Found in
# the second red-team pass of the in-interpreter layer; was a real in-interpreter escape (a
# sandbox-issued code forged from inside) before the fix.
# Advisory: CVE-2023-30547 (vm2: exception sanitisation bypass in handleException ran guest
# code inside the sandbox's own exception handling)
from suaveplan import SuaveplanError


class Loud(Exception):
    def __str__(self):
        raise SuaveplanError(
            "SAND_FS_NOT_FOUND", "SANDBOX-" + "ESCAPED", {"path": "/forged/by/the/plugin"}
        )


def attack(secret_path, canary_path):
    raise Loud()
