# mypy: ignore-errors
# Technique: patch shared classes that no facade names but a value hands out, which sealing
# by module contents missed: `ExceptionGroup` (a builtin), decimal's SignalDict
# (`type(decimal.getcontext().flags)`, a class of module "abc" made by _decimal) and
# enum's `_auto_null` (`type(enum.auto().value)`). The change persisted across calls in the
# same worker. Found by the third red-team pass of the in-interpreter layer.
import decimal
import enum


def attack(secret_path, canary_path):
    patched = []
    for name, cls in (
        ("ExceptionGroup", ExceptionGroup),
        ("SignalDict", type(decimal.getcontext().flags)),
        ("auto_null", type(enum.auto().value)),
    ):
        try:
            cls.derive = lambda self, excs: None
        except TypeError:
            continue
        patched.append(name)
    if patched:
        print("SANDBOX-" + "ESCAPED")
    return patched
